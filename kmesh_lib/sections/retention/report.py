"""Section 16's tables, from group records alone (numpy, and ``base.intervals``' order-statistic interval of a
median, scipy's binomial: the GPU driver builds them too).

Every function reads the typed records of ``raw/groups.jsonl`` and ``raw/blocks.jsonl``
(``sections.retention.captures``: ``RetentionGroup``, ``RetentionEngineRun``). A *combination* is (path, group
size, arrival pattern, singleflight setting); every table row is one combination and arm (``combo``).

    arm_rows      one row per combination and arm: both stopwatches (median, p25-p75), disk MiB read
                  per phase, in how many groups the byte counters agreed (recomputed from the counts,
                  not the recorded flag), where the data started and how it reached the engine
    ratio_rows    "without retention to with retention" per combination: discard / retain of the medians, and
                  discard - retain of each stopwatch paired by pair (``paired_differences``): the median of
                  the pairs' differences with its distribution-free interval (``median_interval``: 95%, or the
                  coverage the pairs reach, recorded beside it), and what the interval says
                  (``difference_verdict``)
    arrival_rows  the arrival-pattern table: per combination and arm, the follow-ups' context reads per
                  group and per follow-up, and the mechanism of every lookup (``lmcache.lookups``)
    restore_rows  the GPU buffer's restores, split: lookup, disk read, staging, copy, first token
    (topology)    ``workloads.context_checks.topology_rows``: the striped row with the machine's NVMe
                  count, block devices, md/RAID and GPU PCIe links; the GPU buffer's route (host-staged or GDS)
    unavailable   rows for what did not run: a path the installed LMCache does not support on the
                  device, an external tier in GPU memory, a block whose disk tier was full or that failed
    per_group     one row per measured group (the notebook's table of disk reads)

A phase's disk-tier bytes are LMCache's own count (the hook) where there is one, else the reading
process's device count (``phase_bytes``). The independent counters of a phase (device, hook,
metrics) agree when they differ by no more than half a chunk (``bytes_agree``): LMCache reads whole
chunks, so a smaller difference can only be another read of the same process.
"""
from __future__ import annotations

import numpy as np

from kmesh_lib.base.intervals import median_interval
from kmesh_lib.lmcache.lookups import MECHANISMS
from kmesh_lib.sections.retention.captures import RetentionEngineRun, RetentionGroup
from kmesh_lib.workloads.context_arms import ARMS
from kmesh_lib.workloads.context_groups import on_off, split_medians

MIB = 1 << 20
ORDER = {"retain": 0, "discard": 1, "resident": 2, "recompute": 3}
COUNTERS = {"device": "device_bytes", "hook": "hook_bytes", "metrics": "metric_bytes"}
STOPWATCHES = {"ttft_a_s": "ttft_a_ms", "makespan_s": "makespan_ms"}  # the group's field -> the tables' label
# what a paired difference's interval says (discard - retain: above 0, the discard arm took longer)
SLOWER, FASTER, SAME, UNRESOLVED = ("slower without retention", "faster without retention", "no difference measured",
                                    "not resolved")


def usable(groups: list[RetentionGroup]) -> list[RetentionGroup]:
    return [g for g in groups if g.measured and g.status == "ok"]


def arrival_of(g: RetentionGroup) -> str:
    return g.arrival


def singleflight_of(g: RetentionGroup) -> str:
    """``on``/``off`` on the MP paths, ``n/a`` elsewhere (the group recorded None)."""
    return on_off(g.singleflight)


def combo(g: RetentionGroup) -> tuple:
    """(path, group size, arrival, singleflight): the groups one table row compares."""
    return g.path, g.group_size, arrival_of(g), singleflight_of(g)


def combo_label(block: str, arrival: str, singleflight: str) -> str:
    return f"{block} [{arrival}" + ("" if singleflight == "n/a" else f", singleflight {singleflight}") + "]"


def _keys(groups: list[RetentionGroup]) -> list[tuple]:
    keys = {(*combo(g), g.arm) for g in groups}
    return sorted(keys, key=lambda k: (k[0] == "engine", k[0], k[1], k[2], k[3], ORDER.get(k[4], 9)))


def phase_bytes(reads: dict) -> int:
    """A phase's disk-tier bytes: LMCache's own count (hook) where there is one, else the device's."""
    return reads["hook_bytes"] if reads.get("hook_bytes") is not None else (reads.get("device_bytes") or 0)


def counters(reads: dict) -> dict[str, int]:
    """The independent byte counts a phase recorded (device, hook, metrics), absent ones left out."""
    return {name: reads[key] for name, key in COUNTERS.items() if reads.get(key) is not None}


def has_two_counters(g: RetentionGroup) -> bool:
    """Agreement needs at least two counts in both phases: one counter agrees with nothing."""
    return all(len(counters(reads)) >= 2 for reads in (g.prep_reads, g.followup_reads))


def tolerance(g: RetentionGroup, reads: dict) -> int:
    """How far the counters of a phase may differ: what the run recorded (0 on the MP path: the server
    reads nothing but the disk tier), never more than half a chunk (LMCache reads whole chunks)."""
    recorded = reads.get("tolerance_bytes")
    half = g.chunk_bytes // 2
    return half if recorded is None else min(int(recorded), half)


def bytes_agree(g: RetentionGroup) -> bool:
    """Every recorded counter of both phases gives the same bytes, to within ``tolerance`` (0 on MP)."""
    for reads in (g.prep_reads, g.followup_reads):
        values = list(counters(reads).values())
        if values and max(values) - min(values) > tolerance(g, reads):
            return False
    return True


def rereads(g: RetentionGroup) -> float:
    """How many times the follow-up phase read the whole context from the disk tier."""
    return phase_bytes(g.followup_reads) / g.context_bytes


def arm_rows(groups: list[RetentionGroup]) -> list[dict]:
    rows = []
    for path, n, arrival, sf, arm in _keys(groups):
        mine = [g for g in groups if (*combo(g), g.arm) == (path, n, arrival, sf, arm) and g.measured]
        if not mine:
            continue
        ok = usable(mine)
        row = {"path": path, "group_size": n, "arrival": arrival, "singleflight": sf, "arm": arm,
               "data_start": mine[0].data_start, "route": mine[0].route,
               "groups_ok": len(ok), "groups_excluded": len(mine) - len(ok),
               "excluded_why": sorted({g.status for g in mine if g.status != "ok"})}
        if ok:
            for key, label in (("ttft_a_s", "ttft_a_ms"), ("makespan_s", "makespan_ms")):
                vals = np.array([getattr(g, key) * 1e3 for g in ok])
                row.update({f"{label}_median": round(float(np.median(vals)), 1),
                            f"{label}_p25": round(float(np.quantile(vals, 0.25)), 1),
                            f"{label}_p75": round(float(np.quantile(vals, 0.75)), 1)})
            for phase in ("prep", "followup"):
                mib = np.median([phase_bytes(getattr(g, f"{phase}_reads")) for g in ok]) / MIB
                row[f"disk_mib_{phase}"] = round(float(mib), 2)
            row["disk_mib_group"] = round(row["disk_mib_prep"] + row["disk_mib_followup"], 2)
            if ARMS[arm].external:
                names = sorted(counters(ok[0].followup_reads))
                agree = sum(has_two_counters(g) and bytes_agree(g) for g in ok)
                row["cross_check"] = (f"{'='.join(names)} in {agree}/{len(ok)}" if len(names) >= 2 else
                                      f"not checked: fewer than two counters ({'='.join(names) or 'none'})")
            else:
                row["cross_check"] = "none: no LMCache tier"
            row["load_1m_median"] = round(float(np.median([g.load_1m for g in ok])), 2)
            if ARMS[arm].external:
                row["rereads_per_group"] = float(np.median([rereads(g) for g in ok]))
            for key in ("memory_tier_bytes_before", "memory_tier_bytes_after", "disk_tier_bytes_before",
                        "disk_tier_bytes_after"):  # external-cache bytes in use, before and after the group
                row[key.replace("_bytes_", "_mib_")] = round(float(np.median([getattr(g, key) for g in ok])) / MIB, 2)
        rows.append(row)
    return rows


def paired_differences(groups: list[RetentionGroup], key: str) -> dict[tuple, list[float]]:
    """Per combination (``combo``): discard - retain of the stopwatch ``key`` (``STOPWATCHES``) in ms, one value
    per measured pair whose two groups are both usable, in the order the pairs ran.

    Paired, not two independent samples: an engine runs a combination's groups as pairs (``Block.run_pairs``), the
    retain and the discard group of a pair back to back on the same engine and server, in alternating order, with
    the same follow-up suffixes (the pair seeds them); so a pair's difference leaves out what drifts between pairs
    (the machine's load, the page cache). A pair with a group that is not ``ok`` is left out whole."""
    by = {(g.engine_run, g.pair, g.arm): g for g in usable(groups)}
    out: dict[tuple, list[float]] = {}
    for (run, pair, arm), keep in sorted(by.items(), key=lambda kv: kv[0][:2]):
        drop = by.get((run, pair, "discard"))
        if arm == "retain" and drop is not None:
            out.setdefault(combo(keep), []).append((getattr(drop, key) - getattr(keep, key)) * 1e3)
    return out


# the least coverage an interval judges with: 2-4 pairs' range covers the median 50%, 75%, 87.5% of the time, too
# seldom to call an arm slower; 5 pairs' range covers 93.75% (``base.intervals.median_interval``)
MIN_COVERAGE = 0.9


def difference_verdict(low: float | None, high: float | None, coverage: float | None = None) -> str:
    """What a discard - retain interval says, judged on the interval as the table shows it (rounded): one that
    touches 0 is "no difference measured", never slower or faster; None (fewer than two pairs), or an interval whose
    coverage is below ``MIN_COVERAGE`` (fewer than five pairs), is "not resolved"."""
    if low is None or high is None or (coverage is not None and coverage < MIN_COVERAGE):
        return UNRESOLVED
    return SLOWER if low > 0 else FASTER if high < 0 else SAME


def _ms_or_none(x: float) -> float | None:
    return None if x != x else round(x, 1)  # NaN (no pair, or one: nothing to resample) is None in JSON


def ratio_rows(rows: list[dict], groups: list[RetentionGroup]) -> list[dict]:
    """Without retention (discard) to with retention (retain), per combination: the arms' medians and their ratio
    from ``rows`` (``arm_rows``), and per stopwatch the median of the paired differences discard - retain
    (``paired_differences``) with its distribution-free 95% interval (``base.intervals.median_interval``: order
    statistics with their exact binomial coverage, recorded as ``CI coverage``; at 5 pairs no interval reaches 95%
    and the range, 93.75%, is given as such, where a percentile bootstrap narrowed to the range and called it 95%) and
    what it says (``difference_verdict``); the resident arm's makespan beside."""
    by = {(r["path"], r["group_size"], r.get("arrival", "together"), r.get("singleflight", "n/a"), r["arm"]): r
          for r in rows if r["groups_ok"]}
    differences = {label: paired_differences(groups, key) for key, label in STOPWATCHES.items()}
    out = []
    for (path, n, arrival, sf, arm), retain in sorted(by.items()):
        discard = by.get((path, n, arrival, sf, "discard"))
        if arm != "retain" or discard is None:
            continue
        row = {"path": path, "group_size": n, "arrival": arrival, "singleflight": sf,
               "pairs": len(differences["ttft_a_ms"].get((path, n, arrival, sf), []))}
        for label in STOPWATCHES.values():
            row[f"{label}: discard"] = discard[f"{label}_median"]
            row[f"{label}: retain"] = retain[f"{label}_median"]
            row[f"{label}: discard/retain"] = round(discard[f"{label}_median"] / retain[f"{label}_median"], 2)
            median, low, high, coverage = median_interval(differences[label].get((path, n, arrival, sf), []))
            median, low, high = (_ms_or_none(x) for x in (median, low, high))
            row[f"{label}: discard - retain"] = median
            row[f"{label}: discard - retain, CI low"] = low
            row[f"{label}: discard - retain, CI high"] = high
            row[f"{label}: discard - retain, CI coverage"] = None if coverage != coverage else round(coverage, 4)
            row[f"{label}: difference"] = difference_verdict(low, high, coverage)
        row["disk MiB/group: discard"] = discard["disk_mib_group"]
        row["disk MiB/group: retain"] = retain["disk_mib_group"]
        resident = by.get(("engine", n, arrival, "n/a", "resident"))
        if resident is not None:
            row["makespan_ms: resident"] = resident["makespan_ms_median"]
        out.append(row)
    return out


NO_TRACE = {"inproc": "no lookup trace: in-process LMCache (a lookup only checks; vLLM holds the context)",
            "gpubuf": "no lookup trace: the GPU buffer (a lookup only checks; vLLM holds the context)",
            "native": "no lookup trace: vLLM's own tiers (vLLM looks up only past its own prefix-cache hit)"}


def mechanism_totals(gs: list[RetentionGroup]) -> dict[str, int] | None:
    """Every follow-up lookup's mechanism, summed over the groups (``MECHANISMS`` order); None where a
    group has no lookup trace."""
    if any(g.followup_lookup_summary is None for g in gs):
        return None
    return {m: sum(g.followup_lookup_summary["by_mechanism"].get(m, 0) for g in gs) for m in MECHANISMS}


def mechanisms_text(gs: list[RetentionGroup]) -> str:
    """``mechanism_totals`` as text: ``first_load 5, contended_in_flight 15``."""
    total = mechanism_totals(gs)
    if total is None:
        return NO_TRACE.get(gs[0].path, "no lookup trace (a stock lmcache server has no kmesh hooks)")
    return ", ".join(f"{m} {v}" for m, v in total.items() if v) or "no lookups"


def reads_per_followup(gs: list[RetentionGroup]) -> str | None:
    """Per follow-up letter, its lookups' disk reads per group (mean): ``A 1, B 0, C 0.4, D 1``."""
    if any(g.followup_disk_reads is None for g in gs):
        return None
    letters = list(gs[0].followup_disk_reads)
    return ", ".join(f"{x} {float(np.mean([g.followup_disk_reads.get(x, 0) for g in gs])):g}" for x in letters)


def arrival_rows(groups: list[RetentionGroup]) -> list[dict]:
    """The arrival-pattern table: what the follow-ups read per group and per follow-up, and why.

    Over the usable measured groups of each combination and external arm. ``context reads per group``
    is the follow-up phase's disk bytes over the context's (the counters' count, every path);
    ``lookup reads per group`` counts the lookups the trace classifies as reads (MP launcher).
    """
    rows = []
    for path, n, arrival, sf, arm in _keys(groups):
        if not ARMS[arm].external:
            continue
        gs = [g for g in usable(groups) if (*combo(g), g.arm) == (path, n, arrival, sf, arm)]
        if not gs:
            continue
        reads = np.array([rereads(g) for g in gs])
        traced = [g.followup_lookup_summary["disk_reads"] for g in gs if g.followup_lookup_summary is not None]
        rows.append({"path": path, "group_size": n, "arrival": arrival, "singleflight": sf, "arm": arm, "groups": len(gs),
                     "context reads per group (median)": float(np.median(reads)), "min": float(reads.min()),
                     "max": float(reads.max()),
                     "lookup reads per group (median)": float(np.median(traced)) if len(traced) == len(gs) else None,
                     "reads per follow-up (mean)": reads_per_followup(gs), "mechanisms (all groups)": mechanisms_text(gs),
                     "A first token ms (median)": round(float(np.median([g.ttft_a_s for g in gs])) * 1e3, 1),
                     "makespan ms (median)": round(float(np.median([g.makespan_s for g in gs])) * 1e3, 1)})
    return rows




def restore_rows(groups: list[RetentionGroup]) -> list[dict]:
    """The GPU buffer's restores, split (``workloads.context_groups.restore_split``): medians in ms per
    combination, arm, phase and source (a restore from the disk tier, or from the buffer's copy)."""
    rows = []
    for path, n, arrival, sf, arm in _keys(groups):
        gs = [g for g in usable(groups) if (*combo(g), g.arm) == (path, n, arrival, sf, arm)]
        for phase in ("prep", "followup"):
            recs = [r for g in gs for r in getattr(g, f"{phase}_restores") or []]
            for source in sorted({r["source"] for r in recs}):
                mine = [r for r in recs if r["source"] == source]
                row = {"path": path, "group_size": n, "arrival": arrival, "arm": arm, "phase": phase, "source": source,
                       "restores": len(mine), "MiB each (median)": round(float(np.median([r["bytes"] for r in mine])) / MIB, 2)}
                rows.append(row | split_medians(mine))
    return rows


def unavailable_rows(blocks: list[RetentionEngineRun]) -> list[dict]:
    """What did not run, and why (a path or tier not available, a full disk tier): never a latency."""
    return [{"path": b.path, "group_size": b.group_size, "status": b.status,
             "why": b.detail or b.error or ""} for b in blocks if b.status != "ok"]


def block_rows(blocks: list[RetentionEngineRun]) -> list[dict]:
    """One row per engine run: how it ended, its connector, start time, pairs, listeners and cleanup."""
    return [{"block": b.engine_run, "status": b.status, "connector": b.connector, "engine_start_s": b.engine_start_s,
             "pairs": b.pairs, "retried_pairs": b.retried_pairs, "listeners": b.listeners, "cleanup": b.cleanup,
             "detail": b.detail or b.error or ""} for b in blocks]


def per_group_rows(groups: list[RetentionGroup]) -> list[dict]:
    """One row per measured group: bytes per phase (MiB), rereads, the counters, LMCache's lookups."""
    rows = []
    for g in groups:
        if not g.measured:
            continue
        fol = g.followup_reads
        rows.append({"block": g.engine_run, "pair": g.pair, "arrival": arrival_of(g), "singleflight": singleflight_of(g),
                     "arm": g.arm, "status": g.status,
                     "prep MiB": phase_bytes(g.prep_reads) / MIB, "follow-up MiB": phase_bytes(fol) / MIB,
                     "rereads": rereads(g), "counters": "=".join(sorted(counters(fol))),
                     "counts agree": has_two_counters(g) and bytes_agree(g),
                     "L1 hit tok": fol.get("lookup_hit_l1_tokens"), "L2 hit tok": fol.get("lookup_hit_l2_tokens"),
                     "contended chunks": fol.get("contended_chunks"),
                     "memory MiB at follow-ups": g.memory_tier_bytes_at_followups / MIB,
                     "A first token ms": round(g.ttft_a_s * 1e3, 1), "makespan ms": round(g.makespan_s * 1e3, 1)})
    return rows


def rereads_by_block(groups: list[RetentionGroup]) -> dict[str, list[float]]:
    """Per block and combination, the discard groups' rereads (sorted): whole contexts the follow-ups read."""
    out: dict[str, list[float]] = {}
    for g in usable(groups):
        if g.arm == "discard":
            out.setdefault(combo_label(g.engine_run, arrival_of(g), singleflight_of(g)), []).append(rereads(g))
    return {label: sorted(values) for label, values in sorted(out.items())}
