"""Section 20's numbers from the group records: lead choice, bootstrap intervals, tables, invariants.

Every comparison is paired: two arms' groups of the same engine run and pair share the suffixes
and ran back to back, so the interval is over per-pair differences ``a - b`` (positive = ``b``
is faster, a saving), resampled with numpy's seeded generator, 95 % percentile interval. Means
and savings are computed from unrounded seconds; rounding happens only in the returned rows.
"""
from __future__ import annotations

import numpy as np

STOPWATCHES = {"wait_a_s": "A first token", "makespan_s": "all done"}
MIB = 1 << 20


def choose_lead(pilot: list[dict], leads_ms: list[float]) -> float:
    """The shortest lead at which every pilot group was ready; the longest lead when none was."""
    for lead in sorted(leads_ms):
        recs = [g for g in pilot if g["lead_ms"] == round(lead, 3)]
        if recs and all(g["ready"] for g in recs):
            return float(lead)
    return float(max(leads_ms))


def bootstrap_mean(diffs, resamples: int = 10000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the mean of ``diffs`` and its percentile bootstrap interval."""
    d = np.asarray(diffs, dtype=float)
    if d.size == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(resamples, d.size))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    return float(d.mean()), float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def usable(groups: list[dict]) -> list[dict]:
    return [g for g in groups if g.get("measured") and g.get("status") == "ok"]


def pairs(groups: list[dict], a: str, b: str) -> list[tuple[dict, dict]]:
    """Measured (a, b) groups of the same engine run and pair."""
    by = {(g["block"], g["pair"], g["arm"]): g for g in usable(groups)}
    return [(g, by[(g["block"], g["pair"], b)]) for (blk, p, arm), g in sorted(by.items(), key=lambda kv: kv[0][:2])
            if arm == a and (blk, p, b) in by]


def cases(groups: list[dict]) -> list[tuple[str, int]]:
    return sorted({(g["path"], g["group_size"]) for g in groups if "group_size" in g})


def _of(groups, path, n):
    return [g for g in groups if g.get("path") == path and g.get("group_size") == n]


def saving_row(groups, path, n, base: str, arm: str, resamples: int, seed: int) -> dict:
    """Mean saving of ``arm`` over ``base`` (base - arm) for both stopwatches, with intervals."""
    ps = pairs(_of(groups, path, n), base, arm)
    row = {"path": path, "group_size": n, "comparison": f"{base} - {arm}", "pairs": len(ps)}
    if ps and ps[0][1].get("lead_ms") is not None and arm != base:
        row["lead_ms"] = ps[0][1]["lead_ms"] if arm.startswith("early") else None
    for key, label in STOPWATCHES.items():
        mean, lo, hi = bootstrap_mean([x[key] - y[key] for x, y in ps], resamples, seed)
        row[f"{label} {base} ms"] = round(1e3 * float(np.mean([x[key] for x, _ in ps])), 2) if ps else None
        row[f"{label} {arm} ms"] = round(1e3 * float(np.mean([y[key] for _, y in ps])), 2) if ps else None
        row[f"{label} saving ms"] = round(mean * 1e3, 2)
        row[f"{label} 95% CI ms"] = [round(lo * 1e3, 2), round(hi * 1e3, 2)]
    early = [y for _, y in ps if y.get("ready") is not None]
    row["ready"] = f"{sum(bool(y['ready']) for y in early)}/{len(early)}" if early else "n/a"
    return row


def all_cases(groups, resamples: int = 10000, seed: int = 0) -> list[dict]:
    """Per path and group size: early and early_fixed against on_arrival, and early against early_fixed."""
    rows = []
    for path, n in cases(groups):
        arms = {g["arm"] for g in usable(_of(groups, path, n))}
        for base, arm in (("on_arrival", "early"), ("on_arrival", "early_fixed"), ("early_fixed", "early")):
            if base in arms and arm in arms:
                rows.append(saving_row(groups, path, n, base, arm, resamples, seed))
    return rows


def example(groups, path: str, n: int = 4) -> dict:
    """The concrete n-request example: means per arm, savings computed before rounding."""
    gs = usable(_of(groups, path, n))
    out = {"path": path, "group_size": n}
    means = {}
    for arm in ("on_arrival", "early", "early_fixed", "dram", "engine"):
        xs = [g for g in gs if g["arm"] == arm]
        if xs:
            means[arm] = {k: float(np.mean([g[k] for g in xs])) for k in STOPWATCHES}
            out[arm] = {"groups": len(xs), **{f"{STOPWATCHES[k]} ms": round(v * 1e3, 2) for k, v in means[arm].items()}}
            if arm.startswith("early"):
                out[arm]["lead_ms"] = xs[0]["lead_ms"]
                out[arm]["ready"] = f"{sum(bool(g['ready']) for g in xs)}/{len(xs)}"
    if "on_arrival" in means and "early" in means:
        out["saving"] = {f"{STOPWATCHES[k]} ms": round((means["on_arrival"][k] - means["early"][k]) * 1e3, 2)
                         for k in STOPWATCHES}
    return out


def pilot_table(groups) -> list[dict]:
    rows = []
    pilot = [g for g in groups if g.get("phase") == "pilot"]
    for path, n in cases(pilot):
        for lead in sorted({g["lead_ms"] for g in _of(pilot, path, n)}):
            gs = [g for g in _of(pilot, path, n) if g["lead_ms"] == lead]
            tok = [g["readiness"]["warmup_token_s"] for g in gs if g["readiness"]["warmup_token_s"] is not None]
            rows.append({"path": path, "group_size": n, "lead_ms": lead, "groups": len(gs),
                         "ready": sum(bool(g["ready"]) for g in gs), "all ready": all(g["ready"] for g in gs),
                         "prep": gs[0]["prep"],
                         "warm-up token vs T ms (median)": round(1e3 * float(np.median(tok)), 1) if tok else None,
                         "A first token ms (mean)": round(1e3 * float(np.mean([g["wait_a_s"] for g in gs])), 2),
                         "not ready because": sorted({g["readiness"]["why_not"].split(" ")[0] + " ..." for g in gs
                                                      if not g["ready"]})})
    return rows


def placement(groups, resamples: int = 10000, seed: int = 0) -> list[dict]:
    """Every arm beside the floor (``engine.vllm_engine.vllm_engine``): means, and the paired gap to the floor with intervals."""
    rows = []
    for path, n in cases(groups):
        gs = usable(_of(groups, path, n))
        for arm in ("on_arrival", "early", "early_fixed", "dram", "engine"):
            xs = [g for g in gs if g["arm"] == arm]
            if not xs:
                continue
            row = {"path": path, "group_size": n, "arm": arm, "groups": len(xs), "prep": xs[0]["prep"],
                   "lead_ms": xs[0]["lead_ms"] if arm.startswith("early") else None,
                   "disk MiB/group": round(float(np.mean([g["disk_bytes"] or 0 for g in xs])) / MIB, 2)}
            ps = pairs(_of(groups, path, n), arm, "engine") if arm != "engine" else []
            for key, label in STOPWATCHES.items():
                row[f"{label} ms"] = round(1e3 * float(np.mean([g[key] for g in xs])), 2)
                if ps:
                    mean, lo, hi = bootstrap_mean([x[key] - y[key] for x, y in ps], resamples, seed)
                    row[f"{label} above floor ms"] = round(mean * 1e3, 2)
                    row[f"{label} above floor 95% CI"] = [round(lo * 1e3, 2), round(hi * 1e3, 2)]
            rows.append(row)
    return rows


def overhead(groups) -> list[dict]:
    """The driver's own share: submission delay at T, stamps and idle polls per group."""
    rows = []
    for path, n in cases(groups):
        for arm in ("on_arrival", "early", "engine"):
            xs = [g for g in usable(_of(groups, path, n)) if g["arm"] == arm]
            if xs:
                rows.append({"path": path, "group_size": n, "arm": arm,
                             "submit delay ms (mean)": round(1e3 * float(np.mean([g["submit_delay_s"] for g in xs])), 3),
                             "submit delay ms (max)": round(1e3 * float(np.max([g["submit_delay_s"] for g in xs])), 3),
                             "stamps/group": round(float(np.mean([g["stamps"] for g in xs])), 1),
                             "idle polls/group": round(float(np.mean([g["idle_waits"] for g in xs])), 1)})
    return rows


def invariants(groups: list[dict]) -> list[tuple[str, bool, str]]:
    """(name, ok, detail) recomputed from the records; ``kmesh verify`` runs these from raw/."""
    measured = [g for g in groups if g.get("measured")]
    early = [g for g in groups if g.get("arm", "").startswith("early")]
    bad = [g for g in measured if g["status"] != "ok"]
    over = [g for g in measured + [g for g in groups if g.get("phase") == "pilot"]
            if (g["arm"] in ("dram", "engine") or g.get("ready")) and (g["disk_bytes"] or 0) > g["context_bytes"] * 1.5]
    uncached = [g for g in measured if g["arm"] != "on_arrival" and min(g["num_cached_tokens"]) < g["context_tokens"] - 32]
    out = [("measured groups recorded", bool(measured), f"{len(measured)}"),
           ("every measured group ok", not bad, f"{len(bad)} not ok: {sorted({g['status'] for g in bad})}"),
           ("every early group has a readiness record", all(g.get("readiness") for g in early), f"{len(early)} early groups"),
           ("every prepared group (ready early, dram, engine) read the context from the disk tier once", not over,
            f"{len(over)} groups read more"),
           ("every follow-up of a prepared group found the shared context cached", not uncached,
            f"{len(uncached)} groups recomputed some")]
    for (path, n) in cases([g for g in groups if g.get("phase") == "pilot"]):
        pilot = [g for g in _of(groups, path, n) if g.get("phase") == "pilot"]
        leads = sorted({g["lead_ms"] for g in pilot})
        chosen = choose_lead(pilot, leads)
        used = {g["lead_ms"] for g in _of(groups, path, n) if g.get("arm") == "early" and g.get("phase") != "pilot"}
        out.append((f"{path} N={n}: confirmation lead is the pilot's shortest all-ready lead", used <= {chosen},
                    f"chosen {chosen} ms, used {sorted(used)}"))
    return out


def disk_reads(groups: list[dict]) -> list[dict]:
    """Measured, not required: how many times each arm's group read the context from the disk tier.

    NOTE: on the MP path the follow-ups of an on-arrival group look up together; each lookup is an
    L2 -> L1 prefetch, and a lookup that lands before the first load is retained rereads it.
    """
    rows = []
    for path, n in cases(groups):
        for arm in ("on_arrival", "early", "early_fixed", "dram", "engine"):
            xs = [g for g in usable(_of(groups, path, n)) if g["arm"] == arm]
            if xs:
                r = [(g["disk_bytes"] or 0) / g["context_bytes"] for g in xs]
                rows.append({"path": path, "group_size": n, "arm": arm, "groups": len(xs),
                             "context reads/group (mean)": round(float(np.mean(r)), 2),
                             "min": round(float(np.min(r)), 2), "max": round(float(np.max(r)), 2),
                             "follow-ups that recomputed the context": sum(
                                 c < g["context_tokens"] - 32 for g in xs for c in g["num_cached_tokens"])})
    return rows
