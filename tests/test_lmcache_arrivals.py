"""Arrival patterns of the shared-context group and the group parameters (fake engine, fake clock)."""
from __future__ import annotations

import pytest

from kmesh_lib.base.params import ParamError, build
from kmesh_lib.engine.requests import RequestSpec, StepOutput
from kmesh_lib.sections.retention.params import RetentionParams
from kmesh_lib.workloads.context_groups import Block, run_arrivals
from kmesh_lib.workloads.context_params import ArrivalPattern, ContextGroupParams


@pytest.mark.parametrize("text, ms, steps, label", [
    ("together", 0.0, 0, "together"), ("2ms", 2.0, 0, "2ms"), ("0.5 ms", 0.5, 0, "0.5ms"), ("0ms", 0.0, 0, "together"),
    ("1step", 0.0, 1, "1step"), ("3steps", 0.0, 3, "3step")])
def test_patterns_parse(text, ms, steps, label):
    p = ArrivalPattern.parse(text)
    assert (p.spacing_ms, p.spacing_steps, p.label) == (ms, steps, label)
    assert ArrivalPattern.parse(p.label) == p


@pytest.mark.parametrize("text", ["fast", "0step", "-1ms", "2 s", ""])
def test_bad_patterns_name_the_text_and_the_syntax(text):
    with pytest.raises(ValueError, match=f"follow-up arrival {text!r}: expected 'together'"):
        ArrivalPattern.parse(text)


def test_group_params_fail_with_the_key_before_any_engine():
    with pytest.raises(ParamError, match="FOLLOWUP_ARRIVALS: follow-up arrival 'soon'"):
        build(ContextGroupParams, {"FOLLOWUP_ARRIVALS": ["together", "soon"]})
    with pytest.raises(ParamError, match="FOLLOWUP_ARRIVALS=\\[\\]"):
        build(ContextGroupParams, {"FOLLOWUP_ARRIVALS": []})
    with pytest.raises(ParamError, match="SINGLEFLIGHT=\\[true\\] needs LMCACHE_SERVER=launcher"):
        build(ContextGroupParams, {"SINGLEFLIGHT": [False, True], "LMCACHE_SERVER": "stock"})
    with pytest.raises(ParamError, match="SINGLEFLIGHT"):  # a list of settings, not one flag
        build(ContextGroupParams, {"SINGLEFLIGHT": True})
    with pytest.raises(ParamError, match="SINGLEFLIGHT=\\[True, True\\]: a setting is given twice"):
        build(ContextGroupParams, {"SINGLEFLIGHT": [True, True]})
    with pytest.raises(ParamError, match="a pattern is given twice"):
        build(ContextGroupParams, {"FOLLOWUP_ARRIVALS": ["together", "0ms"]})
    with pytest.raises(ParamError, match="LMCACHE_SERVER"):
        build(ContextGroupParams, {"LMCACHE_SERVER": "plugin"})
    ok = build(ContextGroupParams, {"FOLLOWUP_ARRIVALS": ["together", "2ms", "1step"], "SINGLEFLIGHT": [True, False]})
    assert ok.FOLLOWUP_ARRIVALS == ["together", "2ms", "1step"] and ok.SINGLEFLIGHT == [True, False]
    assert [a.label for a in ok.arrivals] == ["together", "2ms", "1step"]


def test_a_block_runs_every_arrival_pattern_and_mp_singleflight_setting():
    cfg = build(ContextGroupParams, {"FOLLOWUP_ARRIVALS": ["together", "1step"], "SINGLEFLIGHT": [False, True]})
    mp = Block(cfg, "mp", 4).combos()
    assert [(sf, p.label) for sf, p in mp] == [(False, "together"), (False, "1step"), (True, "together"), (True, "1step")]
    assert [(sf, p.label) for sf, p in Block(cfg, "gpubuf", 4).combos()] == [(None, "together"), (None, "1step")]
    controls = build(RetentionParams, {"FOLLOWUP_ARRIVALS": ["together", "1step"], "SINGLEFLIGHT": [False, True],
                                       "CONTEXT_TOKENS": 1024, "ARENA_MIB": 32})
    assert [sf for sf, _ in Block(controls, "engine", 4).combos()] == [None, None]  # no tier: no singleflight


class Clock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns

    def sleep(self, s: float) -> None:
        self.ns += int(s * 1e9)


class FakeEngine:
    """Each step takes ``step_ms`` on the fake clock; a request yields one token per step after ``wait_steps``."""

    def __init__(self, clock: Clock, step_ms: float, tokens: int = 2, wait_steps: int = 0) -> None:
        self.clock, self.step_ms, self.tokens, self.wait_steps = clock, step_ms, tokens, wait_steps
        self.live: dict[str, list[int]] = {}  # request id -> [steps seen, tokens made]
        self.submitted: list[tuple[str, int]] = []

    def submit(self, spec: RequestSpec) -> None:
        self.live[spec.request_id] = [0, 0]
        self.submitted.append((spec.request_id, self.clock()))

    def has_unfinished(self) -> bool:
        return bool(self.live)

    def step(self) -> list[StepOutput]:
        self.clock.ns += int(self.step_ms * 1e6)
        out = []
        for rid, state in list(self.live.items()):
            state[0] += 1
            if state[0] > self.wait_steps:
                state[1] += 1
                done = state[1] == self.tokens
                out.append(StepOutput(rid, [7], [-0.1], done, "length" if done else None, 0))
                if done:
                    del self.live[rid]
        return out


def specs(n: int) -> list[RequestSpec]:
    return [RequestSpec(f"g-{c}", [1, 2, 3], max_tokens=2) for c in "ABCD"[:n]]


def test_together_submits_every_follow_up_before_the_first_step():
    clock = Clock()
    eng = FakeEngine(clock, step_ms=5)
    res = run_arrivals(eng, specs(4), ArrivalPattern.parse("together"), clock=clock, sleep=clock.sleep)
    assert [t for _, t in eng.submitted] == [0, 0, 0, 0]
    assert all(len(r.output_token_ids) == 2 and r.t_token_ns == [5_000_000, 10_000_000] for r in res)


def test_millisecond_spacing_lands_between_steps_or_after_a_sleep():
    clock = Clock()
    eng = FakeEngine(clock, step_ms=1, tokens=20)
    run_arrivals(eng, specs(4), ArrivalPattern.parse("2.5ms"), clock=clock, sleep=clock.sleep)
    assert [t / 1e6 for _, t in eng.submitted] == [0, 3, 5, 8]  # due at 2.5, 5, 7.5 ms; steps end on whole ms
    clock = Clock()
    idle = FakeEngine(clock, step_ms=1, tokens=1)  # A finishes at 1 ms: the engine idles until B is due
    run_arrivals(idle, specs(2), ArrivalPattern.parse("10ms"), clock=clock, sleep=clock.sleep)
    assert [t / 1e6 for _, t in idle.submitted] == [0, 10]


def test_step_spacing_counts_only_steps_that_produced_tokens():
    clock = Clock()
    eng = FakeEngine(clock, step_ms=4, tokens=10, wait_steps=2)  # two token-less steps first (a pending lookup)
    run_arrivals(eng, specs(3), ArrivalPattern.parse("1step"), clock=clock, sleep=clock.sleep)
    # A at 0; its first token at step 3 (12 ms): B; B's first token comes from step 4 on, but A's tokens count: C at 16 ms
    assert [t / 1e6 for _, t in eng.submitted] == [0, 12, 16]


def test_a_stock_server_block_runs_one_external_arm():
    cfg = build(ContextGroupParams, {"LMCACHE_SERVER": "stock"})
    with pytest.raises(ValueError, match="LMCACHE_SERVER=stock fixes one retention policy per server"):
        Block(cfg, "mp", 4)
    blk = Block(cfg, "mp", 4, arms=("discard",), arrival="1step")
    assert blk.arms == ("discard",) and blk.arrival == ArrivalPattern(spacing_steps=1)
    assert Block(build(ContextGroupParams, {"FOLLOWUP_ARRIVALS": ["2ms", "together"]}), "mp", 4).arrival.label == "2ms"
