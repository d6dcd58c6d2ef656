"""Section 22's comparisons between policies: paired differences with bootstrap intervals, and a verdict
stated only where the interval excludes 0.

    makespan     pairs: the same (model, repeat) under two policies; the mean of the differences
                 (a trace is one value per repeat, so NUM_REPEATS pairs: a median of 5 has no spread
                 to resample)
    child_ttft   pairs: the same child (model, repeat, request id) finished under both policies; the
                 median of the differences (first-token times are heavy-tailed)

A row's difference is ``a - b`` in ms, so negative means ``a`` took less time. Its verdict:

    wins                     the 95 % interval lies below 0 (a took less time than b)
    loses                    the interval lies above 0
    no difference measured   the interval contains 0
    not resolved             fewer than 2 pairs (no spread to resample)

Intervals are ``base.intervals`` (scipy's percentile bootstrap, seeded): the table rebuilt from raw/
equals the recorded one. The rows exist only for runs that recorded their drawn policy order
(raw/orders.jsonl); a run in one fixed order confounds a policy with its place in time.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from kmesh_lib.base.intervals import bootstrap_interval, median_of_differences
from kmesh_lib.sections.multi_engine import report
from kmesh_lib.sections.multi_engine.captures import ArmRecord, OrderRecord, RequestRecord

ORDER = ("recompute", "round_robin", "prefix_aware", "shared")
WINS, LOSES, SAME, UNRESOLVED = "wins", "loses", "no difference measured", "not resolved"
LEVEL = 0.95


def verdict(low: float, high: float) -> str:
    if low != low or high != high:  # NaN: fewer than two pairs
        return UNRESOLVED
    return WINS if high < 0 else LOSES if low > 0 else SAME


def pairs_of_policies(present: list[str]) -> list[tuple[str, str]]:
    """(a, b) for every two policies present, ``a`` the later in ORDER (shared against each, first)."""
    ranked = sorted(present, key=lambda p: ORDER.index(p) if p in ORDER else 9, reverse=True)
    return [(a, b) for i, a in enumerate(ranked) for b in ranked[i + 1:]]


def _row(model: str, metric: str, statistic: str, a: str, b: str, xa: list[float], xb: list[float]) -> dict:
    d = np.asarray(xa, dtype=float) - np.asarray(xb, dtype=float)
    if statistic == "mean":
        est = float(d.mean()) if d.size else float("nan")
        low, high = bootstrap_interval((d,), lambda x, axis: np.mean(x, axis=axis), paired=False, level=LEVEL) \
            if d.size else (float("nan"), float("nan"))
    else:
        est, low, high = median_of_differences(d, level=LEVEL)
    fin = lambda x: None if x != x else round(1e3 * x, 2)  # noqa: E731 - seconds to ms; NaN is None in JSON
    return {"model": model, "metric": metric, "a": a, "b": b, "pairs": int(d.size), "statistic": f"{statistic} of a - b",
            "a_median_ms": fin(float(np.median(xa))) if len(xa) else None,
            "b_median_ms": fin(float(np.median(xb))) if len(xb) else None,
            "difference_ms": fin(est), "low_ms": fin(low), "high_ms": fin(high),
            # judged on the interval as the table shows it: one that rounds to touch 0 reads "no difference
            # measured", never "wins" beside a shown [-1.2, 0.0] (a fake-fleet CI run hit exactly that)
            "a_less_in": int((d < 0).sum()),
            "verdict": verdict(*(float("nan") if v is None else v for v in (fin(low), fin(high))))}


def comparison_table(rows: list[RequestRecord]) -> list[dict]:
    """Per model and two policies: makespan (paired by repeat) and the children's first token (paired by request)."""
    spans = report.makespans(rows)
    children = defaultdict(dict)
    for r in rows:
        if r.role == "child" and r.status == "ok" and r.first_token_s is not None:
            children[(r.model, r.policy)][(r.repeat, r.request_id)] = r.ttft_s
    out = []
    for model in dict.fromkeys(r.model for r in rows):
        present = list(dict.fromkeys(r.policy for r in rows if r.model == model))
        for a, b in pairs_of_policies(present):
            reps = sorted({rep for (m, rep, p) in spans if m == model and p == a}
                          & {rep for (m, rep, p) in spans if m == model and p == b})
            out.append(_row(model, "makespan", "mean", a, b, [spans[(model, r, a)] for r in reps],
                            [spans[(model, r, b)] for r in reps]))
            ca, cb = children[(model, a)], children[(model, b)]
            keys = sorted(set(ca) & set(cb))
            out.append(_row(model, "child_ttft", "median", a, b, [ca[k] for k in keys], [cb[k] for k in keys]))
    return out


def order_table(orders: list[OrderRecord], arms: list[ArmRecord]) -> list[dict]:
    """Per trace, in the order it ran: its place in its repeat's drawn order, its fleet, and the host's
    1-minute load average at its start and end."""
    drawn = {(o.model, o.repeat): o.order for o in orders}
    out = []
    for a in arms:
        order = drawn.get((a.model, a.repeat))
        out.append({"model": a.model, "repeat": a.repeat, "policy": a.policy, "fleet": a.fleet,
                    "position": order.index(a.policy) if order and a.policy in order else None,
                    "load_1m_start": (a.load_avg_start or [None])[0],
                    "load_1m_end": (a.load_avg_end or [None])[0]})
    return out


def load_by_policy(table: list[dict]) -> dict[tuple, tuple[float, float]]:
    """(model, policy) -> (lowest, highest) 1-minute load average seen at its traces' starts and ends."""
    seen = defaultdict(list)
    for t in table:
        seen[(t["model"], t["policy"])] += [x for x in (t["load_1m_start"], t["load_1m_end"]) if x is not None]
    return {k: (min(v), max(v)) for k, v in seen.items() if v}


POLICY_WORDS = {"shared": "shared KV", "prefix_aware": "prefix-aware routing", "round_robin": "round-robin routing",
                "recompute": "recomputing"}


def phrase(row: dict) -> str:
    """One comparison in plain words: which policy was faster on what, by how much with its 95% interval, over how
    many pairs (the table's ``a - b``: below 0, ``a`` took less time). A verdict only where the interval excludes 0;
    else "no difference measured", with the interval. E.g. 4910's 0.5B (H100, 6 Dec 2026): "shared KV took longer
    than prefix-aware routing over the whole trace, by 164 ms (mean of 5 paired traces; 95% interval 119 to 231 ms;
    shorter in 0 of 5)"."""
    a, b = POLICY_WORDS.get(row["a"], row["a"]), POLICY_WORDS.get(row["b"], row["b"])
    what = "over the whole trace" if row["metric"] == "makespan" else "to the children's first token"
    unit = "paired traces" if row["metric"] == "makespan" else "paired children"
    statistic = "mean" if row["statistic"].startswith("mean") else "median"
    if row["verdict"] == UNRESOLVED:
        return f"{a} against {b} {what}: not resolved ({row['pairs']} {unit})"
    low, high, d = row["low_ms"], row["high_ms"], row["difference_ms"]
    if row["verdict"] == SAME:
        return (f"{a} against {b} {what}: no difference measured ({statistic} of {row['pairs']} {unit} "
                f"{d:+,.0f} ms; 95% interval {low:+,.0f} to {high:+,.0f} ms)")
    faster = row["verdict"] == WINS
    size, lo, hi = (-d, -high, -low) if faster else (d, low, high)
    return (f"{a} {'was faster than' if faster else 'took longer than'} {b} {what}, by {size:,.0f} ms "
            f"({statistic} of {row['pairs']} {unit}; 95% interval {lo:,.0f} to {hi:,.0f} ms; shorter in "
            f"{row['a_less_in']} of {row['pairs']})")


__all__ = ["LOSES", "POLICY_WORDS", "SAME", "UNRESOLVED", "WINS", "comparison_table", "load_by_policy", "order_table",
           "phrase", "verdict"]
