"""Readiness at T as a proportion with an exact interval: how the pilot picks the lead (LEAD_RULE=lower_bound).

A lead is chosen only when the pilot says it is ready often enough to trust: the one-sided 95 % Clopper-Pearson
lower bound of its ready fraction (``scipy.stats.binomtest(...).proportion_ci``, exact) must reach READY_FLOOR.
With every group ready that needs ``pilot_groups_needed()`` groups (59 at 95 % / 95 %: 0.05 ** (1 / 59) = 0.9505);
10 of 10 ready bounds the rate only from 74 %, so at the 12.5 % miss rate of the paper-scale run a 10-group pilot
passes a lead about a quarter of the time (0.875 ** 10 = 0.26).
"""
from __future__ import annotations

READY_FLOOR = 0.95  # the readiness a chosen lead must be shown to have, at least
LEVEL = 0.95  # one-sided confidence of that lower bound
MIN_PILOT_RUNS = 3  # the pilot is spread over at least this many fresh engine runs


def lower_bound(ready: int, groups: int, level: float = LEVEL) -> float:
    """One-sided ``level`` Clopper-Pearson lower bound of a ready fraction (0 for no groups)."""
    if groups == 0:
        return 0.0
    from scipy.stats import binomtest

    return float(binomtest(ready, groups, alternative="greater").proportion_ci(confidence_level=level, method="exact").low)


def interval(ready: int, groups: int, level: float = 0.95) -> tuple[float | None, float | None]:
    """Two-sided ``level`` Clopper-Pearson interval of a ready fraction ((None, None) for no groups)."""
    if groups == 0:
        return None, None
    from scipy.stats import binomtest

    ci = binomtest(ready, groups).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


def pilot_groups_needed(floor: float = READY_FLOOR, level: float = LEVEL, most: int = 100_000) -> int:
    """The fewest groups whose lower bound, all of them ready, reaches ``floor``."""
    for n in range(1, most):
        if lower_bound(n, n, level) >= floor:
            return n
    raise ValueError(f"no pilot of at most {most} groups bounds readiness from {floor}")


def choose(pilot: list, leads_ms: list[float], floor: float = READY_FLOOR, level: float = LEVEL) -> float:
    """The shortest lead whose pilot readiness has a lower bound of at least ``floor``; the longest lead when none has."""
    for lead in sorted(leads_ms):
        recs = [g for g in pilot if g.lead_ms == round(lead, 3)]
        if recs and lower_bound(sum(bool(g.ready) for g in recs), len(recs), level) >= floor:
            return float(lead)
    return float(max(leads_ms))


__all__ = ["LEVEL", "MIN_PILOT_RUNS", "READY_FLOOR", "choose", "interval", "lower_bound", "pilot_groups_needed"]
