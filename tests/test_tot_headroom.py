"""Section 19 on the replay engine: a scripted run end to end, its checks from raw/, and what
tampering with raw/ or results.json does to them; a partial run; an old run made elsewhere."""
import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from table_contract import assert_table_contract

from kmesh_lib.base.captures import is_header
from kmesh_lib.base.declared import compare_tables
from kmesh_lib.base.public import find_private_keys
from kmesh_lib.base.records import RunFiles, RunRecord
from kmesh_lib.sections import tot_headroom as section
from kmesh_lib.sections.tot_headroom import experiment as tx
from kmesh_lib.sections.tot_headroom.params import CAPTURE, STOCK_SWEEP, TotHeadroomParams

pytestmark = pytest.mark.requires_data("game24")  # every test here builds the section's params, which read the puzzles

SMALL = dict(ENGINE="replay", MODEL="tiny", BLOCK_SIZE=16, NUM_GPU_BLOCKS=129, MAX_MODEL_LEN=2048, PUZZLE_INDICES=[2],
             MAX_TOKENS=96, SWEEP_POOL_BLOCKS=[8, 128, 192], NUM_SCALE_PUZZLES=2, SCRIPT_ERROR_RATES=[0.0, 0.5],
             PROFILE="smoke")
REAL_ENGINE_ONLY = "the replay engine reproduces the engine's prefix hits call for call at the run's pool size"


def make_run(run_dir: Path, **overrides) -> Path:
    cfg = TotHeadroomParams(**{**SMALL, **overrides})
    record = RunRecord.open(section.KEY, cfg, run_dir=str(run_dir))
    tx.run(cfg, record)
    record.save_tables(section.TABLES)
    report = section.checks(record.files())
    record.finish(report)
    return run_dir


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("tot") / "run")


@pytest.fixture
def copy(scripted_run, tmp_path) -> Path:
    return Path(shutil.copytree(scripted_run, tmp_path / "copy"))


def statuses(run_dir) -> dict[str, str]:
    return {c.name: c.status for c in section.checks(RunFiles(run_dir))}


def failed(run_dir) -> list[str]:
    return [name for name, status in statuses(run_dir).items() if status == "failed"]


def edit_jsonl(path: Path, line: int, change) -> None:
    """Edits record ``line`` of the capture (after its schema header, where it has one)."""
    lines = path.read_text().splitlines()
    line += 1 if lines and is_header(json.loads(lines[0])) else 0
    rec = json.loads(lines[line])
    change(rec)
    lines[line] = json.dumps(rec)
    path.write_text("\n".join(lines) + "\n")


def edit_results(run_dir: Path, change) -> None:
    results = json.loads((run_dir / "results.json").read_text())
    change(results)
    (run_dir / "results.json").write_text(json.dumps(results))


def test_a_scripted_run_passes_every_check_that_has_evidence(scripted_run):
    got = statuses(scripted_run)
    assert {name for name, status in got.items() if status != "ok"} == {REAL_ENGINE_ONLY}  # no real engine here
    assert got[REAL_ENGINE_ONLY] == "skipped"
    counts = section.counts(RunFiles(scripted_run))
    assert counts["policy"] == "scripted" and counts["num_value_calls"] > 0 and counts["num_avoided_value_calls"] > 0
    assert counts["num_exact_prefix_edges"] > 0 and counts["num_replay_arms"] == 2 + 2 * 2  # engine 128/192, 2 rates
    assert json.loads((scripted_run / "results.json").read_text())["status"] == "passed"


def test_headline_answer_and_public_results_name_the_policy_and_hold_no_private_content(scripted_run):
    run = RunFiles(scripted_run)
    head = section.headline(run)
    assert head["policy"].startswith("scripted") and 2 <= len(head) <= 6
    assert "scripted" in section.answer(run)
    public = section.public_results(run)
    assert find_private_keys(public) == [] and public["policy"].startswith("scripted")
    assert {r["trace"] for r in public["stock_sweep"]} == {"engine", "scale-e0", "scale-e0.5"}
    text = json.dumps(public)
    assert "prompt_token_ids" not in text and "invocation_id" not in text and "expression" not in text


def test_save_tables_then_verify_compares_every_declared_table(scripted_run, tmp_path):
    stored = assert_table_contract(section.TABLES, section.KEY, scripted_run, tmp_path)
    assert list(stored) == ["policy", "search", "bound", "sweep", "stock_sweep", "scale_searches"]  # arms_s: recorded only
    assert set(stored["search"]) == {"invocation_s", "counts", "block_ops", "num_unattributed_block_events", "outcomes",
                                     "partial", "limit_hit", "engine_start_s", "search_s", "drain_ok"}


def test_without_the_tokenizer_the_search_tables_are_recorded_only(copy, monkeypatch):
    tot_checks = importlib.import_module("kmesh_lib.sections.tot_headroom.checks")  # the package exports checks()
    tot_tables = importlib.import_module("kmesh_lib.sections.tot_headroom.tables")

    def no_tokenizer(spec):
        raise ValueError("no tokenizer files")
    monkeypatch.setattr(tot_checks, "tokenizer_for", no_tokenizer)
    monkeypatch.setattr(tot_tables, "tokenizer_for", no_tokenizer)
    run = RunFiles(copy)
    lines = {line.name: line for line in compare_tables(section.TABLES, run, run.results)}
    assert all(line.ok for line in lines.values()), [line for line in lines.values() if not line.ok]
    assert {n for n, line in lines.items() if "not recomputable" in line.recorded_only} == {
        "search", "stock_sweep", "scale_searches"}


@pytest.mark.parametrize("name, tamper, expect", [
    ("a cached-token count in the capture", lambda d: edit_jsonl(d / "raw" / CAPTURE, 3, lambda r: r.update(
        num_cached_tokens=r["num_cached_tokens"] - 16)), "bound at the run's pool size recomputed from the capture"),
    ("an output token in the capture", lambda d: edit_jsonl(d / "raw" / CAPTURE, 1, lambda r: r.update(
        output_token_ids=[r["output_token_ids"][0] + 1] + r["output_token_ids"][1:])),
     "every output is exactly the script's tokens for its call"),
    ("a prompt token in the capture", lambda d: edit_jsonl(d / "raw" / CAPTURE, 2, lambda r: r.update(
        prompt_token_ids=r["prompt_token_ids"][:-1] + [5])), "search replayed from the capture"),
    ("a cached-token count of a replay arm", lambda d: edit_jsonl(d / "raw" / STOCK_SWEEP, 3, lambda a: a["calls"].update(
        num_cached_tokens=[n + 16 for n in a["calls"]["num_cached_tokens"]])), "stock-versus-ideal tables recomputed"),
    ("an output hash of a scale arm", lambda d: edit_jsonl(d / "raw" / STOCK_SWEEP, 4, lambda a: a["calls"].update(
        output_sha=["0" * 16] + a["calls"]["output_sha"][1:])), "scale traces re-derived from the script"),
    ("the ideal in results.json", lambda d: edit_results(d, lambda r: r["bound"].update(
        ideal_prefill_tokens=r["bound"]["ideal_prefill_tokens"] - 1)), "bound at the run's pool size recomputed"),
    ("a stock figure in results.json", lambda d: edit_results(d, lambda r: r["stock_sweep"][-1].update(
        stock_prefill_tokens=r["stock_sweep"][-1].get("stock_prefill_tokens", 0) + 1)),
     "stock-versus-ideal tables recomputed"),
    ("a search counter in results.json", lambda d: edit_results(d, lambda r: r["search"]["counts"].update(
        num_avoided_value_calls=r["search"]["counts"]["num_avoided_value_calls"] + 1)), "search replayed from the capture"),
])
def test_tampering_fails_the_check_that_covers_it(copy, name, tamper, expect):
    assert failed(copy) == []
    tamper(copy)
    assert any(f.startswith(expect) for f in failed(copy)), (name, failed(copy))


def test_missing_arms_are_skipped_never_ok(copy):
    (copy / "raw" / STOCK_SWEEP).unlink()
    got = statuses(copy)
    assert got["engine-trace arms replayed the engine run's exact calls"] == "skipped"
    assert got["stock-versus-ideal tables recomputed from the arms equal results.json"] == "skipped"
    assert got["every replay arm's pool drained, as observed when it ended"] == "skipped"


def test_a_partial_run_is_marked_partial_and_fails_only_completeness(tmp_path):
    run_dir = make_run(tmp_path / "partial", MAX_CALLS=5, NUM_SCALE_PUZZLES=0)
    got = statuses(run_dir)
    results = json.loads((run_dir / "results.json").read_text())
    assert results["search"]["partial"] and results["search"]["limit_hit"] == "max_calls"
    assert [n for n, s in got.items() if s == "failed"] == ["the run is complete (no limit stopped the search)"]
    assert got["every engine-trace arm ran the whole search"] == "skipped"  # needs a whole search
    assert got["bound at the run's pool size recomputed from the capture equals results.json"] == "ok"
    assert got["search replayed from the capture gives the recorded outcomes and counts"] == "ok"
    assert results["status"] == "failed" and "partial" in section.answer(RunFiles(run_dir))


def test_a_call_over_its_bound_is_aborted_drained_and_makes_the_run_partial(tmp_path):
    run_dir = make_run(tmp_path / "bound", INVOCATION_BOUND_S=1e-9, NUM_SCALE_PUZZLES=0, PUZZLE_INDICES=[2, 0])
    records = RunFiles(run_dir).raw(CAPTURE)
    results = json.loads((run_dir / "results.json").read_text())
    assert results["search"]["limit_hit"] == "invocation_bound" and results["search"]["drain_ok"]
    assert [r["status"] for r in records] == ["timeout"]
    assert [o["status"] for o in RunFiles(run_dir).raw("tot_outcomes.jsonl")] == ["partial", "not_run"]
    # one call, timed out: the run is partial, and it made no value call (both stated, nothing else fails)
    assert failed(run_dir) == ["the run is complete (no limit stopped the search)",
                               "the search made value calls, memo-avoided calls and exact-prefix producer edges"]


def test_a_run_recorded_elsewhere_is_checked_not_crashed(copy, monkeypatch, tmp_path):
    """The GPU machine's puzzle path does not exist here: the params still load, the puzzle file is
    found by its path under the data root, or its check is skipped when the data root lacks it."""
    params = copy / "params.resolved.yaml"
    params.write_text(params.read_text().replace("../shared/data/game24/24.csv", ".device-data/game24/24.csv"))
    assert statuses(copy)["puzzle file matches its recorded hash and holds the run's puzzles"] == "ok"
    monkeypatch.setenv("KMESH_DATA_ROOT", str(tmp_path / "empty"))
    got = statuses(copy)
    assert got["puzzle file matches its recorded hash and holds the run's puzzles"] == "skipped"
    assert [n for n, s in got.items() if s == "failed"] == []


def test_plan_for_the_gpu_profile_gives_a_duration_without_importing_vllm():
    code = ("import sys; from kmesh_lib.app.cli import main; rc = main(['plan', '19', '--profile', 'gpu']); "
            "print('VLLM_IMPORTED', 'vllm' in sys.modules); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "NUM_GPU_BLOCKS 586 = 585 usable" in out.stdout and "512 MiB of KV" in out.stdout
    assert "expected duration: ~" in out.stdout and "scripted" in out.stdout
    assert "VLLM_IMPORTED False" in out.stdout


def test_the_verdict_names_what_its_headroom_is_a_share_of():
    """Headroom is (stock - ideal) / stock prefill: the verdict says so, where it read as a share of prompt tokens."""
    from kmesh_lib.base import paths
    from kmesh_lib.base.records import RunFiles
    from kmesh_lib.sections.tot_headroom.report import verdict

    run = paths.OUTPUTS / "tot_headroom" / "gpu-20261204-190116-fefc"
    if not run.is_dir():
        import pytest

        pytest.skip("the published run is not in this checkout")
    (text,) = verdict(RunFiles(run))
    assert "(0.0% headroom, a share of stock's prefill; 60,824 prompt tokens in all)" in text
    assert "the most headroom is 11.3% of stock's prefill" in text
