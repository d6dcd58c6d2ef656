"""Section 20's numbers from the group records: group status, lead choice, paired intervals, tables.

A group's status is what the protocol recorded (``ok``, ``tier_error``, ``not_placed``) or
``recomputed``: a follow-up found less of the shared context cached than the context's full blocks
(``num_cached_tokens`` below ``expected_cached_tokens``), so it recomputed what the arm was meant to
have prepared. Such a group leaves the paired tables -- with its partner, since a pair is compared
as a whole -- and the savings are published both ways (``all_cases`` with and without it), so a
reader sees what it would have changed. Runs recorded before this status existed are classified
from their raw counts (``classify``).

Every comparison is paired: two arms' groups of the same engine run and pair share the suffixes and
ran back to back, so the statistic is the mean difference ``a - b`` over the pairs (positive = ``b`` is
faster, a saving), with a ``scipy.stats.bootstrap`` interval (percentile, 95 %, seeded with SEED). The
pairs of one engine run share its state (its start, its cache, the host while it ran), so where the
pairs come from ``MIN_CLUSTERS`` engine runs or more the engine runs are resampled whole (a cluster
bootstrap: each resample's mean over the pairs of the runs it drew), and the interval is the wider of that
and the pairs' own; with fewer, the pairs are resampled.
Means and savings are computed from unrounded seconds; rounding happens only in the rows.
"""
from __future__ import annotations

import numpy as np

from kmesh_lib.base.intervals import bootstrap_interval
from kmesh_lib.lmcache.lookups import READS
from kmesh_lib.sections.prefetch import readiness
from kmesh_lib.sections.prefetch.captures import PrefetchGroup
from kmesh_lib.workloads.context_groups import split_medians

STOPWATCHES = {"wait_a_s": "A first token", "makespan_s": "all done"}
ARMS = ("on_arrival", "early", "early_fixed", "dram", "buffer", "resident")
MIB = 1 << 20
BOOTSTRAP = ("scipy.stats.bootstrap, percentile, 95 %: engine runs resampled whole where 5 or more (never narrower "
             "than the pairs resampled), else pairs")
# the fewest engine runs whose pairs are resampled run by run: resampling 2-4 runs gives a handful of distinct means
MIN_CLUSTERS = 5


def placement_arm(path: str, control: str) -> str:
    """The arm a placement control runs as: ``dram`` (the tier's memory copy) is ``buffer`` on the GPU
    buffer, whose memory is GPU memory -- never labelled DRAM."""
    return "buffer" if control == "dram" and path == "gpubuf" else control


def expected_cached(g: PrefetchGroup) -> int:
    """Context tokens a follow-up finds cached when the whole context is: every full block of it (recorded)."""
    return g.expected_cached_tokens


def recomputed(g: PrefetchGroup) -> bool:
    """A follow-up of this group found less than the shared context cached (and recomputed the rest)."""
    return min(g.num_cached_tokens) < expected_cached(g)


def classify(groups: list[PrefetchGroup]) -> list[PrefetchGroup]:
    """The groups with ``recomputed`` as their status where a follow-up recomputed the context.

    New runs record that status themselves (``protocol``); for runs recorded before it, an ``ok``
    group whose counts show a recomputing follow-up is reclassified here (a copy; raw/ is not edited).
    """
    return [g.model_copy(update={"status": "recomputed"}) if g.status == "ok" and recomputed(g) else g
            for g in groups]


def choose_lead(pilot: list[PrefetchGroup], leads_ms: list[float], rule: str = "all_ready") -> float:
    """``rule`` all_ready: the shortest lead at which every pilot group was ready; lower_bound: the shortest whose
    readiness has a one-sided 95 % lower bound of at least 95 % (``readiness.choose``); the longest lead when none."""
    if rule == "lower_bound":
        return readiness.choose(pilot, leads_ms)
    for lead in sorted(leads_ms):
        recs = [g for g in pilot if g.lead_ms == round(lead, 3)]
        if recs and all(g.ready for g in recs):
            return float(lead)
    return float(max(leads_ms))


def _mean_of_runs(sums, counts, axis):
    """The mean difference over the pairs of the engine runs a resample drew (their sums over their pair counts)."""
    return np.sum(sums, axis=axis) / np.sum(counts, axis=axis)


def paired_saving(a, b, resamples: int = 10000, seed: int = 0, level: float = 0.95,
                  runs=None) -> tuple[float, float, float]:
    """(mean, low, high) of ``a - b`` over pairs, with its percentile bootstrap interval: with ``runs`` (each pair's
    engine run) naming ``MIN_CLUSTERS`` or more, the engine runs resampled whole, each with all its pairs, the
    interval never narrower than the pairs' own (ten runs can by chance look more alike than their pairs; review
    finding, 6 Dec 2026: resampling 200 pairs as independent left out how engine runs differ: in 7f94's GPU buffer
    at N=4 the runs' mean savings differ (one-way ANOVA p < 0.001) and the pairs' differences run in streaks, lag-1
    0.32 against white noise's 0.14); else the pairs, resampled as pairs."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size == 0:
        return float("nan"), float("nan"), float("nan")
    diff = a - b
    mean = float(np.mean(diff))
    names = sorted(set(runs)) if runs is not None else []
    if len(names) >= MIN_CLUSTERS:
        of = np.asarray(runs)
        sums = np.array([diff[of == name].sum() for name in names])
        counts = np.array([float((of == name).sum()) for name in names])
        by_run = bootstrap_interval((sums, counts), _mean_of_runs, paired=True, resamples=resamples, seed=seed,
                                    level=level)
    by_pair = bootstrap_interval((a, b), _mean_difference, paired=True, resamples=resamples, seed=seed, level=level)
    if len(names) < MIN_CLUSTERS:
        return mean, *by_pair
    # a handful of runs can by chance look alike: never narrower than the pairs' own interval
    return mean, min(by_run[0], by_pair[0]), max(by_run[1], by_pair[1])


def _mean_difference(x, y, axis):
    return np.mean(x - y, axis=axis)


def usable(groups: list[PrefetchGroup], with_recomputed: bool = False) -> list[PrefetchGroup]:
    keep = ("ok", "recomputed") if with_recomputed else ("ok",)
    return [g for g in groups if g.measured and g.status in keep]


def pairs(groups: list[PrefetchGroup], a: str, b: str,
          with_recomputed: bool = False) -> list[tuple[PrefetchGroup, PrefetchGroup]]:
    """Measured (a, b) groups of the same engine run and pair, both usable."""
    by = {(g.engine_run, g.pair, g.arm): g for g in usable(groups, with_recomputed)}
    return [(g, by[(g.engine_run, g.pair, b)]) for (blk, p, arm), g in sorted(by.items(), key=lambda kv: kv[0][:2])
            if arm == a and (blk, p, b) in by]


def cases(groups: list[PrefetchGroup]) -> list[tuple[str, int]]:
    return sorted({(g.path, g.group_size) for g in groups})


def _of(groups, path, n):
    return [g for g in groups if g.path == path and g.group_size == n]


def _ms(x: float) -> float:
    return round(x * 1e3, 2)


def saving_row(groups, path, n, base: str, arm: str, resamples: int, seed: int, with_recomputed: bool = False) -> dict:
    """Mean saving of ``arm`` over ``base`` (base - arm) for both stopwatches, with intervals."""
    ps = pairs(_of(groups, path, n), base, arm, with_recomputed)
    row = {"path": path, "group_size": n, "comparison": f"{base} - {arm}", "pairs": len(ps),
           "engine_runs": len({x.engine_run for x, _ in ps})}
    if ps and arm.startswith("early"):
        row["lead_ms"] = ps[0][1].lead_ms
    for key, label in STOPWATCHES.items():
        mean, lo, hi = paired_saving([getattr(x, key) for x, _ in ps], [getattr(y, key) for _, y in ps], resamples, seed,
                                     runs=[x.engine_run for x, _ in ps])
        row[f"{label} {base} ms"] = _ms(float(np.mean([getattr(x, key) for x, _ in ps]))) if ps else None
        row[f"{label} {arm} ms"] = _ms(float(np.mean([getattr(y, key) for _, y in ps]))) if ps else None
        row[f"{label} saving ms"] = _ms(mean)
        row[f"{label} 95% CI ms"] = [_ms(lo), _ms(hi)]
    early = [y for _, y in ps if y.ready is not None]
    row["ready"] = f"{sum(bool(y.ready) for y in early)}/{len(early)}" if early else "n/a"
    return row


def all_cases(groups, resamples: int = 10000, seed: int = 0, with_recomputed: bool = False) -> list[dict]:
    """Per path and group size: early and early_fixed against on_arrival, and early against early_fixed."""
    rows = []
    for path, n in cases(groups):
        arms = {g.arm for g in usable(_of(groups, path, n), with_recomputed)}
        for base, arm in (("on_arrival", "early"), ("on_arrival", "early_fixed"), ("early_fixed", "early")):
            if base in arms and arm in arms:
                rows.append(saving_row(groups, path, n, base, arm, resamples, seed, with_recomputed))
    return rows


def both_ways(without: list[dict], with_: list[dict]) -> list[dict]:
    """The savings with and without the groups in which a follow-up recomputed the context, side by side."""
    by = {(r["path"], r["group_size"], r["comparison"]): r for r in with_}
    rows = []
    for r in without:
        w = by.get((r["path"], r["group_size"], r["comparison"]), {})
        for label in STOPWATCHES.values():
            rows.append({"path": r["path"], "group_size": r["group_size"], "comparison": r["comparison"],
                         "stopwatch": label, "pairs": r["pairs"], "saving ms": r[f"{label} saving ms"],
                         "95% CI ms": r[f"{label} 95% CI ms"], "pairs with recomputed": w.get("pairs"),
                         "saving with recomputed ms": w.get(f"{label} saving ms"),
                         "95% CI with recomputed ms": w.get(f"{label} 95% CI ms")})
    return rows


def example(groups, path: str, n: int = 4) -> dict:
    """The concrete n-request example: means per arm, savings computed before rounding."""
    gs = usable(_of(groups, path, n))
    out = {"path": path, "group_size": n}
    means = {}
    for arm in ARMS:
        xs = [g for g in gs if g.arm == arm]
        if xs:
            means[arm] = {k: float(np.mean([getattr(g, k) for g in xs])) for k in STOPWATCHES}
            out[arm] = {"groups": len(xs), **{f"{STOPWATCHES[k]} ms": _ms(v) for k, v in means[arm].items()}}
            if arm.startswith("early"):
                out[arm]["lead_ms"] = xs[0].lead_ms
                out[arm]["ready"] = f"{sum(bool(g.ready) for g in xs)}/{len(xs)}"
    if "on_arrival" in means and "early" in means:
        out["saving"] = {f"{STOPWATCHES[k]} ms": _ms(means["on_arrival"][k] - means["early"][k]) for k in STOPWATCHES}
    return out


def pilot_table(groups) -> list[dict]:
    rows = []
    pilot = [g for g in groups if g.phase == "pilot"]
    for path, n in cases(pilot):
        for lead in sorted({g.lead_ms for g in _of(pilot, path, n)}):
            gs = [g for g in _of(pilot, path, n) if g.lead_ms == lead]
            tok = [g.readiness["warmup_token_s"] for g in gs if g.readiness["warmup_token_s"] is not None]
            rows.append({"path": path, "group_size": n, "lead_ms": lead, "groups": len(gs),
                         "ready": sum(bool(g.ready) for g in gs), "all ready": all(g.ready for g in gs),
                         "recomputed": sum(g.status == "recomputed" for g in gs), "prep": gs[0].prep,
                         "warm-up token vs T ms (median)": round(1e3 * float(np.median(tok)), 1) if tok else None,
                         "A first token ms (mean)": _ms(float(np.mean([g.wait_a_s for g in gs]))),
                         "not ready because": sorted({g.readiness["why_not"].split(" ")[0] + " ..." for g in gs
                                                      if not g.ready})})
    return rows


def placement(groups, resamples: int = 10000, seed: int = 0) -> list[dict]:
    """Every arm beside ``resident`` (the context already in vLLM's KV): means, and the paired gap above it with intervals."""
    rows = []
    for path, n in cases(groups):
        gs = usable(_of(groups, path, n))
        for arm in ARMS:
            xs = [g for g in gs if g.arm == arm]
            if not xs:
                continue
            row = {"path": path, "group_size": n, "arm": arm, "groups": len(xs), "prep": xs[0].prep,
                   "lead_ms": xs[0].lead_ms if arm.startswith("early") else None,
                   "disk MiB/group": round(float(np.mean([g.disk_bytes or 0 for g in xs])) / MIB, 2)}
            ps = pairs(_of(groups, path, n), arm, "resident") if arm != "resident" else []
            for key, label in STOPWATCHES.items():
                row[f"{label} ms"] = _ms(float(np.mean([getattr(g, key) for g in xs])))
                if ps:
                    mean, lo, hi = paired_saving([getattr(x, key) for x, _ in ps], [getattr(y, key) for _, y in ps],
                                                 resamples, seed, runs=[x.engine_run for x, _ in ps])
                    row[f"{label} above resident ms"] = _ms(mean)
                    row[f"{label} above resident 95% CI"] = [_ms(lo), _ms(hi)]
            rows.append(row)
    return rows


def overhead(groups) -> list[dict]:
    """The driver's own share: submission delay at T, stamps and idle polls per group."""
    rows = []
    for path, n in cases(groups):
        for arm in ("on_arrival", "early", "resident"):
            xs = [g for g in usable(_of(groups, path, n)) if g.arm == arm]
            if xs:
                delays = [g.submit_delay_s for g in xs]
                rows.append({"path": path, "group_size": n, "arm": arm,
                             "submit delay ms (mean)": round(1e3 * float(np.mean(delays)), 3),
                             "submit delay ms (max)": round(1e3 * float(np.max(delays)), 3),
                             "stamps/group": round(float(np.mean([g.stamps for g in xs])), 1),
                             "idle polls/group": round(float(np.mean([g.idle_waits for g in xs])), 1)})
    return rows


def disk_reads(groups: list[PrefetchGroup]) -> list[dict]:
    """Measured, not required: how many times each arm's group read the context from the disk tier,
    what it wrote there, and (MP launcher servers) what every lookup of the arm's groups did.

    Over every measured group that ran cleanly, recomputing ones included (they read too).
    NOTE: on the MP path the follow-ups of an on-arrival group look up together; each lookup is an
    L2 -> L1 prefetch, and a lookup that lands before the first load is retained rereads it (LMCache
    0.5.6) or finds it reserved and recomputes (0.5.3), unless the singleflight holds it back. In the
    early arm, 0.5.3 hands the warm prefetch's keys to its store controller, which (skip_l1) drops
    them from L1 before a late warm-up's lookup (``reread_after_store_drop``), unless the warm-store
    guard holds them back. Groups recorded before a column existed leave it out.
    """
    rows = []
    for path, n in cases(groups):
        for arm in ARMS:
            xs = [g for g in usable(_of(groups, path, n), with_recomputed=True) if g.arm == arm]
            if xs:
                r = [(g.disk_bytes or 0) / g.context_bytes for g in xs]
                row = {"path": path, "group_size": n, "arm": arm, "groups": len(xs),
                       "singleflight": _sf(xs[0]),
                       "context reads/group (mean)": round(float(np.mean(r)), 2),
                       "min": round(float(np.min(r)), 2), "max": round(float(np.max(r)), 2),
                       "disk MiB/group (mean)": round(float(np.mean([g.disk_bytes or 0 for g in xs])) / MIB, 2),
                       "follow-ups that recomputed the context": sum(
                           c < expected_cached(g) for g in xs for c in g.num_cached_tokens),
                       "groups recomputed": sum(g.status == "recomputed" for g in xs)}
                if all(g.holds("warm_store_guard") for g in xs):  # groups recorded before the guard lack it
                    row["warm_store_guard"] = _on_off(xs[0].warm_store_guard)
                written = [g.disk_write_bytes for g in xs]
                if all(w is not None for w in written):
                    row["disk written MiB/group (mean)"] = round(float(np.mean(written)) / MIB, 2)
                row["lookups"] = mechanisms(xs) or "no lookup trace"
                row["reads by lookup"] = reads_by_role(xs) or "no lookup trace"
                if all(g.store_events is not None for g in xs):  # chunks per group: the guard at work, or the drop it prevents
                    for op, name in (("warm_store_skipped", "warm chunks kept from the store/group"),
                                     ("warm_handoff", "warm chunks handed to the store/group"),
                                     ("l1_delete", "L1 chunks the store deleted/group")):
                        row[name] = round(float(np.mean([g.store_events[op] for g in xs])), 2)
                rows.append(row)
    return rows


def _on_off(flag: bool | None) -> str:
    return "n/a" if flag is None else ("on" if flag else "off")


def _sf(g: PrefetchGroup) -> str:
    return _on_off(g.singleflight)


def mechanisms(gs: list[PrefetchGroup]) -> str | None:
    """The group lookups' mechanisms summed over ``gs`` (MP launcher: ``lookup_summary``), else None."""
    if not gs or any(g.lookup_summary is None for g in gs):
        return None
    total: dict[str, int] = {}
    for g in gs:
        for m, k in g.lookup_summary["by_mechanism"].items():
            total[m] = total.get(m, 0) + k
    return ", ".join(f"{m} {k}" for m, k in sorted(total.items(), key=lambda kv: -kv[1]))


def reads_by_role(gs: list[PrefetchGroup]) -> str | None:
    """Which lookups of ``gs`` read the disk tier, and why: ``<role> <mechanism> <count>`` summed over the
    groups' classified lookups (roles: http_prefetch, warmup, follow-up), else None (no lookup trace)."""
    if not gs or any(g.lookups is None for g in gs):
        return None
    total: dict[str, int] = {}
    for g in gs:
        for lk in g.lookups:
            if lk.get("mechanism") in READS:
                role = lk.get("role") if lk.get("role") in ("http_prefetch", "warmup") else "follow-up"
                key = f"{role} {lk['mechanism']}"
                total[key] = total.get(key, 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(total.items(), key=lambda kv: -kv[1])) or "none"


def singleflight_table(groups: list[PrefetchGroup]) -> list[dict]:
    """On-arrival groups by singleflight setting (the confirmation's and the contrast's): what each
    setting does to the reads, the lookups and the follow-ups that recomputed the context."""
    rows = []
    for path, n in cases(groups):
        xs = [g for g in _of(groups, path, n) if g.arm == "on_arrival" and g.status in ("ok", "recomputed")
              and (g.measured or g.phase == "contrast")]
        for sf in sorted({_sf(g) for g in xs}):
            gs = [g for g in xs if _sf(g) == sf]
            reads = [(g.disk_bytes or 0) / g.context_bytes for g in gs]
            rows.append({"path": path, "group_size": n, "singleflight": sf, "phase": "/".join(sorted({g.phase for g in gs})),
                         "groups": len(gs), "context reads/group (mean)": round(float(np.mean(reads)), 2),
                         "max": round(float(np.max(reads)), 2),
                         "groups in which a follow-up recomputed": sum(g.status == "recomputed" for g in gs),
                         "follow-ups that recomputed": sum(c < expected_cached(g) for g in gs for c in g.num_cached_tokens),
                         "mechanisms": mechanisms(gs) or "no lookup trace",
                         "A first token ms (mean)": _ms(float(np.mean([g.wait_a_s for g in gs]))),
                         "all done ms (mean)": _ms(float(np.mean([g.makespan_s for g in gs])))})
    return rows




def restore_rows(groups: list[PrefetchGroup]) -> list[dict]:
    """The GPU buffer: every arm's restores (and prefetches) from T, split into lookup, disk read,
    staging, copy into vLLM and the rest to the request's first token; medians in ms."""
    rows = []
    for path, n in cases(groups):
        gs = [g for g in usable(_of(groups, path, n), with_recomputed=True) if g.restores is not None]
        for arm in ARMS:
            recs = [r for g in gs if g.arm == arm for r in g.restores]
            for kind, source in sorted({(r["kind"], r["source"]) for r in recs}):
                mine = [r for r in recs if (r["kind"], r["source"]) == (kind, source)]
                row = {"path": path, "group_size": n, "arm": arm, "kind": kind, "source": source, "count": len(mine),
                       "per group": round(len(mine) / sum(g.arm == arm for g in gs), 2)}
                rows.append(row | split_medians(mine))
    return rows


def recomputed_groups(groups: list[PrefetchGroup]) -> list[dict]:
    """Every group (all arms and phases) in which a follow-up recomputed the context, as a row."""
    return [{"block": g.engine_run, "pair": g.pair, "arm": g.arm, "phase": g.phase,
             "lead_ms": g.lead_ms, "fewest cached tokens": min(g.num_cached_tokens),
             "expected cached tokens": expected_cached(g), "follow-ups recomputing": sum(
                 c < expected_cached(g) for c in g.num_cached_tokens),
             "A first token ms": _ms(g.wait_a_s)} for g in groups if g.status == "recomputed"]


def lead_sweep(groups: list[PrefetchGroup]) -> list[dict]:
    """A's wait and readiness per lead and group size: the pilot's leads, on arrival (lead 0) and
    every confirmation lead, from the recorded groups (the live panel re-plots from these)."""
    rows = []
    for path, n in cases(groups):
        gs = [g for g in _of(groups, path, n) if g.status in ("ok", "recomputed")
              and (g.phase == "pilot" or g.measured) and g.arm in ("on_arrival", "early", "early_fixed")]
        for arm, lead in sorted({(g.arm if g.arm == "on_arrival" else "early", g.lead_ms) for g in gs},
                                key=lambda x: (x[0] != "on_arrival", x[1])):
            xs = [g for g in gs if g.lead_ms == lead and (g.arm == "on_arrival") == (arm == "on_arrival")]
            waits = np.array([g.wait_a_s * 1e3 for g in xs])
            rows.append({"path": path, "group_size": n, "arm": arm, "lead_ms": lead, "groups": len(xs),
                         "ready": None if arm == "on_arrival" else sum(bool(g.ready) for g in xs),
                         "A first token ms (median)": round(float(np.median(waits)), 2),
                         "p25": round(float(np.quantile(waits, 0.25)), 2), "p75": round(float(np.quantile(waits, 0.75)), 2)})
    return rows


def resident_wait(groups: list[PrefetchGroup]) -> dict[tuple[str, int], tuple[float, float, float]]:
    """Per path and group size: the resident arm's A-first-token wait (median, p25, p75), ms."""
    out = {}
    for path, n in cases(groups):
        waits = [g.wait_a_s * 1e3 for g in usable(_of(groups, path, n)) if g.arm == "resident"]
        if waits:
            out[(path, n)] = (float(np.median(waits)), float(np.quantile(waits, 0.25)), float(np.quantile(waits, 0.75)))
    return out


def lead_choice(groups: list[PrefetchGroup], leads_ms: list[float], rule: str) -> list[dict]:
    """Per path and group size, per pilot lead: ready x/n, its one-sided 95 % lower bound, whether the rule takes it;
    on the chosen lead's row, the confirmation's early groups ready at T with their two-sided 95 % interval."""
    rows = []
    pilot = [g for g in groups if g.phase == "pilot"]
    for path, n in cases(pilot):
        mine = _of(pilot, path, n)
        chosen = choose_lead(mine, leads_ms, rule)
        early = [g for g in _of(groups, path, n) if g.measured and g.arm == "early"]
        for lead in sorted(leads_ms):
            gs = [g for g in mine if g.lead_ms == round(lead, 3)]
            ready = sum(bool(g.ready) for g in gs)
            bound = readiness.lower_bound(ready, len(gs))
            row = {"path": path, "group_size": n, "lead_ms": float(lead), "rule": rule,
                   "pilot_engine_runs": len({g.engine_run for g in gs}), "pilot_groups": len(gs), "pilot_ready": ready,
                   "ready_lower_bound": round(bound, 4),
                   "qualifies": (ready == len(gs) > 0) if rule == "all_ready" else bound >= readiness.READY_FLOOR,
                   "chosen": float(lead) == chosen, "confirm_groups": None, "confirm_ready": None,
                   "confirm_ready_low": None, "confirm_ready_high": None}
            if float(lead) == chosen:
                done = [g for g in early if g.lead_ms == round(lead, 3)]
                k = sum(bool(g.ready) for g in done)
                low, high = readiness.interval(k, len(done))
                row.update(confirm_groups=len(done), confirm_ready=k,
                           confirm_ready_low=None if low is None else round(low, 4),
                           confirm_ready_high=None if high is None else round(high, 4))
            rows.append(row)
    return rows
