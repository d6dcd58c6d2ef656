"""Section 20: params, the bootstrap, readiness and the driver on a fake clock, and a tiny real run."""
from __future__ import annotations

import json

import numpy as np
import pytest

from kmesh_lib.app import registry as sections
from kmesh_lib.app.cli import main as kmesh_main
from kmesh_lib.base.params import ParamError, resolve_params
from kmesh_lib.engine.requests import RequestResult, RequestSpec, StepOutput
from kmesh_lib.sections.prefetch.driver import PrefetchCall, drive, readiness
from kmesh_lib.sections.prefetch.stats import all_cases, bootstrap_mean, choose_lead, example, invariants


@pytest.mark.parametrize("override, message", [
    ("LEADS_MS=[100, 25]", "ascending"),
    ("LEADS_MS=[]", "LEADS_MS"),
    ("PATHS=[gpu]", "PATHS"),
    ("CONTROLS=[recompute]", "CONTROLS"),
    ("MEASURED_GROUPS=1", "MEASURED_GROUPS"),
    ("ARENA_MIB=1", "ARENA_MIB"),
    ("CONTEXT_TOKENS=1000", "CONTEXT_TOKENS"),
    ("BOOTSTRAP_RESAMPLES=10", "BOOTSTRAP_RESAMPLES"),
    ("LEAD_MS=5", "unknown parameter"),
])
def test_bad_params_fail_with_the_key(override, message):
    with pytest.raises(ParamError, match=message):
        resolve_params(sections.get("20"), "cpu", [], [override])


def test_profiles_validate_and_kmesh_plan_reports_a_bad_override():
    for profile in ("smoke", "cpu", "gpu"):
        resolve_params(sections.get("20"), profile, [], [])
    assert kmesh_main(["plan", "20", "--profile", "cpu", "--set", "FIXED_LEAD_MS=0"]) == 2


def test_bootstrap_on_known_data():
    mean, lo, hi = bootstrap_mean([5.0] * 20, resamples=500, seed=1)
    assert (mean, lo, hi) == (5.0, 5.0, 5.0)  # no spread, no interval
    rng = np.random.default_rng(0)
    d = rng.normal(10.0, 2.0, size=400)
    mean, lo, hi = bootstrap_mean(d, resamples=4000, seed=0)
    se = d.std(ddof=1) / np.sqrt(d.size)
    assert mean == pytest.approx(d.mean())
    assert lo < mean < hi
    assert (hi - lo) == pytest.approx(2 * 1.96 * se, rel=0.1)  # the normal interval's width
    assert bootstrap_mean(d, 4000, 0) == (mean, lo, hi)  # seeded: reproducible


def _warmup(submit_ns, token_ns, cached):
    r = RequestResult("w", [1], num_cached_tokens=cached, t_submit_ns=submit_ns)
    r.t_token_ns = [token_ns] if token_ns else []
    return r


def test_readiness_on_a_fake_clock():
    T, ms = 1_000_000_000, 1_000_000
    done = PrefetchCall(submit_ns=T - 100 * ms, done_ns=T - 60 * ms, status="completed", found_keys=4, total_keys=4)
    r = readiness(0.1, T, 1024, done, _warmup(T - 60 * ms, T - 10 * ms, 1024), "http_prefetch+warmup")
    assert r.ready and r.warmup_token_s == pytest.approx(-0.01) and r.prefetch_done_s == pytest.approx(-0.06)
    late = readiness(0.1, T, 1024, done, _warmup(T - 60 * ms, T + 5 * ms, 1024), "http_prefetch+warmup")
    assert not late.ready and "after T" in late.why_not
    assert readiness(0.1, T, 1024, done, _warmup(T - 60 * ms, T - 1, 992), "x").why_not.startswith("warm-up found 992")
    partial = PrefetchCall(done_ns=T - 60 * ms, status="completed", found_keys=3, total_keys=4)
    assert "3 of 4" in readiness(0.1, T, 1024, partial, _warmup(T - 50 * ms, T - ms, 1024), "x").why_not
    pending = PrefetchCall(status="pending")
    assert not readiness(0.1, T, 1024, pending, None, "x").ready
    assert readiness(0.25, T, 1024, None, _warmup(T - 250 * ms, T, 1024), "warmup_only").ready  # at T counts


class FakeClock:
    def __init__(self):
        self.ns = 0

    def __call__(self):
        return self.ns

    def sleep(self, s):
        self.ns += int(s * 1e9)


class FakeEngine:
    """Each step takes ``step_ms`` on the fake clock and gives every running request one token."""

    def __init__(self, clock, step_ms=10):
        self.clock, self.step_ms, self.running, self.log = clock, step_ms, {}, []

    def submit(self, spec):
        self.running[spec.request_id] = spec.max_tokens
        self.log.append((spec.request_id, self.clock.ns))

    def has_unfinished(self):
        return bool(self.running)

    def step(self):
        self.clock.ns += self.step_ms * 1_000_000
        out = []
        for rid in list(self.running):
            self.running[rid] -= 1
            out.append(StepOutput(rid, [7], [0.0], self.running[rid] == 0, num_cached_tokens=64))
            if self.running[rid] == 0:
                del self.running[rid]
        return out


def test_driver_submits_at_T_and_measures_from_T():
    clock = FakeClock()
    engine = FakeEngine(clock, step_ms=10)
    follow = [RequestSpec(f"f{i}", [1, 2], max_tokens=2) for i in range(2)]
    t = drive(engine, follow, lead_s=0.1, warmup=RequestSpec("w", [1], max_tokens=1), clock=clock, sleep=clock.sleep)
    assert engine.log[0] == ("w", 0)  # preparation at T - lead (no prefetcher: the warm-up at once)
    assert [ns for rid, ns in engine.log[1:]] == [100_000_000] * 2  # follow-ups exactly at T
    assert t.warmup.t_first_token_ns == 10_000_000  # ready 90 ms before T
    assert t.submit_delay_s() == 0.0 and t.wait_a_s() == pytest.approx(0.01) and t.makespan_s(2) == pytest.approx(0.02)


def test_a_step_in_progress_at_T_delays_the_submission_and_counts_against_the_wait():
    clock = FakeClock()
    engine = FakeEngine(clock, step_ms=30)
    follow = [RequestSpec("f0", [1], max_tokens=1)]
    t = drive(engine, follow, lead_s=0.05, warmup=RequestSpec("w", [1], max_tokens=3), clock=clock, sleep=clock.sleep)
    assert t.submit_delay_s() == pytest.approx(0.01)  # T = 50 ms falls inside the 30-60 ms step
    assert t.wait_a_s() == pytest.approx(0.04)  # from T, not from the late submission
    assert t.warmup.t_first_token_ns < t.t_arrival_ns  # the first warm-up token did come before T


def _g(block, pair, arm, wait, makespan, ready=None, phase="confirm", lead=0.0):
    return {"block": block, "path": "mp", "group_size": 4, "pair": pair, "arm": arm, "measured": phase == "confirm",
            "phase": phase, "status": "ok", "wait_a_s": wait, "makespan_s": makespan, "ready": ready, "lead_ms": lead,
            "readiness": {"why_not": ""} if arm.startswith("early") else None, "disk_bytes": 100,
            "context_bytes": 100, "context_tokens": 64, "num_cached_tokens": [64]}


def test_choose_lead_tables_and_invariants():
    pilot = [_g("b", 0, "early", 0.1, 0.2, r, "pilot", lead) for lead, r in ((0.0, False), (25.0, True), (25.0, False),
                                                                            (100.0, True), (100.0, True))]
    assert choose_lead(pilot, [0.0, 25.0, 100.0]) == 100.0
    assert choose_lead([_g("b", 0, "early", 0.1, 0.2, False, "pilot", 0.0)], [0.0, 25.0]) == 25.0  # none ready: longest
    groups = pilot + [_g("b", p, "on_arrival", 0.3 + 0.001 * p, 0.5) for p in range(10)] + \
        [_g("b", p, "early", 0.1, 0.4, True, lead=100.0) for p in range(10)]
    ex = example(groups, "mp", 4)
    assert ex["saving"]["A first token ms"] == pytest.approx(204.5)  # unrounded means: 304.5 - 100
    row = all_cases(groups, 1000, 0)[0]
    assert row["pairs"] == 10 and row["ready"] == "10/10" and row["all done saving ms"] == pytest.approx(100.0)
    assert all(ok for _, ok, _ in invariants(groups))
    bad = groups + [_g("b", 1, "early", 0.1, 0.4, True, lead=25.0)]
    assert not dict((n, ok) for n, ok, _ in invariants(bad))["mp N=4: confirmation lead is the pilot's shortest all-ready lead"]


@pytest.mark.cpu
def test_smoke_profile_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    assert kmesh_main(["run", "20", "--profile", "smoke", "--run-dir", str(run_dir)]) == 0
    public = json.loads((run_dir / "public-results.json").read_text())
    assert public["results"]["example_4"]["early"]["ready"].endswith("/4")
    assert all(c["ok"] for c in public["checks"].values())


def test_device_resume_keeps_only_finished_engine_runs(tmp_path):
    """A rerun of the GPU driver skips finished engine runs and sets aside a crashed run's groups."""
    from kmesh_lib.sections.prefetch.gpu import finished_blocks

    raw = tmp_path / "raw"
    raw.mkdir()
    blocks = [{"block": "inproc-N4-r0", "status": "ok"}, {"block": "inproc-N4-r1", "status": "error"}]
    groups = [{"block": "inproc-N4-r0", "pair": 1}, {"block": "inproc-N4-r1", "pair": 1},
              {"block": "inproc-N4-r2", "pair": 1}]  # r2 crashed before its summary was written
    (raw / "blocks.jsonl").write_text("".join(json.dumps(b) + "\n" for b in blocks))
    (raw / "groups.jsonl").write_text("".join(json.dumps(g) + "\n" for g in groups))

    assert finished_blocks(tmp_path) == {"inproc-N4-r0"}
    kept = [json.loads(line) for line in (raw / "groups.jsonl").read_text().splitlines()]
    aside = [json.loads(line) for line in (raw / "groups.unfinished.jsonl").read_text().splitlines()]
    assert [g["block"] for g in kept] == ["inproc-N4-r0"]
    assert sorted(g["block"] for g in aside) == ["inproc-N4-r1", "inproc-N4-r2"]
    assert [json.loads(line)["block"] for line in (raw / "blocks.jsonl").read_text().splitlines()] == ["inproc-N4-r0"]
    assert finished_blocks(tmp_path) == {"inproc-N4-r0"}  # idempotent: nothing more moves
    assert len((raw / "groups.unfinished.jsonl").read_text().splitlines()) == 2
