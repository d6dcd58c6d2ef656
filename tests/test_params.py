"""Params: layering order, strict keys, typed values, and errors that name the key."""
import pytest

from kmesh_lib.app import registry as sections
from kmesh_lib.app.cli import main
from kmesh_lib.base import params
from kmesh_lib.base.params import resolve_params
from kmesh_lib.sections.engine_check.experiment import EngineCheckParams


def test_layering_order_is_common_section_engine_profile():
    section = sections.get("00")
    files = params.param_files(section.KEY, "smoke", section.USES_ENGINE)
    assert [f.name for f in files] == ["common.yaml", "engine_check.yaml", "engine.smoke.yaml"]


def test_later_layer_wins(tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text("CONTEXT_TOKENS: 128\n")
    cfg, _, _ = resolve_params(sections.get("00"), "smoke", [str(extra)], ["SUFFIX_TOKENS=3"])
    assert (cfg.CONTEXT_TOKENS, cfg.SUFFIX_TOKENS, cfg.MODEL, cfg.PROFILE) == (128, 3, "tiny", "smoke")


@pytest.mark.parametrize("values, message", [
    ({"BLOKC_SIZE": 32}, "unknown parameter 'BLOKC_SIZE'"),
    ({"NUM_GPU_BLOCKS": -4}, "NUM_GPU_BLOCKS=-4: must be >= 2"),
    ({"BLOCK_SIZE": 16}, "BLOCK_SIZE=16: the CPU attention backend runs only multiples of 32"),
    ({"BLOCK_SIZE": "32"}, "BLOCK_SIZE='32': expected an integer"),
    ({"DEVICE": "tpu"}, "DEVICE='tpu': expected one of 'cpu', 'cuda'"),
    ({"MAX_MODEL_LEN": 4096, "NUM_GPU_BLOCKS": 65}, "MAX_MODEL_LEN=4096: a request of that length needs more"),
    ({"MODEL": "/nonexistent/model"}, "not a shape"),
    ({"ENFORCE_EAGER": 1}, "expected true or false"),
])
def test_bad_values_name_the_key(values, message):
    with pytest.raises(params.ParamError, match=message.replace("(", r"\(").replace(")", r"\)")):
        params.build(EngineCheckParams, values)


def test_replay_engine_accepts_gpu_block_size_on_cpu():
    cfg = params.build(EngineCheckParams, {"ENGINE": "replay", "BLOCK_SIZE": 16})
    assert cfg.BLOCK_SIZE == 16


def test_notebook_namespace_rejects_an_injected_typo():
    namespace = {"BLOCK_SIZE": 32, "CONTEXT_TOKENS": 96, "SUFIX_LEN": 8, "pd": object(), "_": None}
    with pytest.raises(params.ParamError, match="unknown parameter 'SUFIX_LEN'"):
        params.from_namespace(EngineCheckParams, namespace)


def test_cli_fails_before_any_engine_with_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("NUM_GPU_BLOCKS: -1\n")
    assert main(["run", "00", "--profile", "cpu", "--params", str(bad), "--run-dir", str(tmp_path / "run")]) == 2
    assert "NUM_GPU_BLOCKS=-1" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # nothing started, nothing written


def test_plan_prints_without_importing_vllm():
    import subprocess
    import sys

    code = ("import sys; from kmesh_lib.app.cli import main; rc = main(['plan', '00', '--profile', 'gpu']); "
            "print('VLLM_IMPORTED', 'vllm' in sys.modules); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "BLOCK_SIZE=16" in out.stdout and "expected cache hit of the second: 96 tokens" in out.stdout
    assert "VLLM_IMPORTED False" in out.stdout
