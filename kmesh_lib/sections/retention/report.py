"""Section 16's tables, from group records alone (numpy only: the GPU driver uses them too).

    arm_rows      one row per (path, group size, arm): both stopwatches (median, p25-p75), disk MiB
                  read per phase, in how many groups the byte counters agreed (recomputed from the
                  counts, not the recorded flag), where the data started and how it reached the engine
    ratio_rows    "without retention to with retention": discard / retain per path and group size
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

from kmesh_lib.workloads.context_arms import ARMS

MIB = 1 << 20
ORDER = {"retain": 0, "discard": 1, "floor": 2, "recompute": 3}
COUNTERS = {"device": "device_bytes", "hook": "hook_bytes", "metrics": "metric_bytes"}


def usable(groups: list[dict]) -> list[dict]:
    return [g for g in groups if g["measured"] and g["status"] == "ok"]


def _keys(groups: list[dict]) -> list[tuple]:
    keys = {(g["path"], g["group_size"], g["arm"]) for g in groups}
    return sorted(keys, key=lambda k: (k[0] == "engine", k[0], k[1], ORDER.get(k[2], 9)))


def phase_bytes(reads: dict) -> int:
    """A phase's disk-tier bytes: LMCache's own count (hook) where there is one, else the device's."""
    return reads["hook_bytes"] if reads.get("hook_bytes") is not None else (reads.get("device_bytes") or 0)


def counters(reads: dict) -> dict[str, int]:
    """The independent byte counts a phase recorded (device, hook, metrics), absent ones left out."""
    return {name: reads[key] for name, key in COUNTERS.items() if reads.get(key) is not None}


def has_two_counters(g: dict) -> bool:
    """Agreement needs at least two counts in both phases: one counter agrees with nothing."""
    return all(len(counters(g[phase])) >= 2 for phase in ("prep_reads", "followup_reads"))


def bytes_agree(g: dict) -> bool:
    """Every recorded counter of both phases gives the same bytes, to within half a chunk."""
    for phase in ("prep_reads", "followup_reads"):
        values = list(counters(g[phase]).values())
        if values and max(values) - min(values) > g["chunk_bytes"] // 2:
            return False
    return True


def rereads(g: dict) -> float:
    """How many times the follow-up phase read the whole context from the disk tier."""
    return phase_bytes(g["followup_reads"]) / g["context_bytes"]


def arm_rows(groups: list[dict]) -> list[dict]:
    rows = []
    for path, n, arm in _keys(groups):
        mine = [g for g in groups if (g["path"], g["group_size"], g["arm"]) == (path, n, arm) and g["measured"]]
        if not mine:
            continue
        ok = usable(mine)
        row = {"path": path, "group_size": n, "arm": arm, "data_start": mine[0]["data_start"], "route": mine[0]["route"],
               "groups_ok": len(ok), "groups_excluded": len(mine) - len(ok),
               "excluded_why": sorted({g["status"] for g in mine if g["status"] != "ok"})}
        if ok:
            for key, label in (("ttft_a_s", "ttft_a_ms"), ("makespan_s", "makespan_ms")):
                vals = np.array([g[key] * 1e3 for g in ok])
                row.update({f"{label}_median": round(float(np.median(vals)), 1),
                            f"{label}_p25": round(float(np.quantile(vals, 0.25)), 1),
                            f"{label}_p75": round(float(np.quantile(vals, 0.75)), 1)})
            for phase in ("prep", "followup"):
                row[f"disk_mib_{phase}"] = round(float(np.median([phase_bytes(g[f"{phase}_reads"]) for g in ok])) / MIB, 2)
            row["disk_mib_group"] = round(row["disk_mib_prep"] + row["disk_mib_followup"], 2)
            if ARMS[arm].external:
                names = sorted(counters(ok[0]["followup_reads"]))
                agree = sum(has_two_counters(g) and bytes_agree(g) for g in ok)
                row["cross_check"] = (f"{'='.join(names)} in {agree}/{len(ok)}" if len(names) >= 2 else
                                      f"not checked: fewer than two counters ({'='.join(names) or 'none'})")
            else:
                row["cross_check"] = "none: no LMCache tier"
            if "load_1m" in ok[0]:
                row["load_1m_median"] = round(float(np.median([g["load_1m"] for g in ok])), 2)
            if ARMS[arm].external:
                row["rereads_per_group"] = float(np.median([rereads(g) for g in ok]))
            for key in ("memory_tier_bytes_before", "memory_tier_bytes_after", "disk_tier_bytes_before",
                        "disk_tier_bytes_after"):  # external-cache bytes in use, before and after the group
                row[key.replace("_bytes_", "_mib_")] = round(float(np.median([g[key] for g in ok])) / MIB, 2)
        rows.append(row)
    return rows


def ratio_rows(rows: list[dict]) -> list[dict]:
    """Without retention (discard) to with retention (retain), per path and group size."""
    by = {(r["path"], r["group_size"], r["arm"]): r for r in rows if r["groups_ok"]}
    out = []
    for (path, n, arm), retain in sorted(by.items()):
        discard = by.get((path, n, "discard"))
        if arm != "retain" or discard is None:
            continue
        row = {"path": path, "group_size": n}
        for label in ("ttft_a_ms", "makespan_ms"):
            row[f"{label}: discard"] = discard[f"{label}_median"]
            row[f"{label}: retain"] = retain[f"{label}_median"]
            row[f"{label}: discard/retain"] = round(discard[f"{label}_median"] / retain[f"{label}_median"], 2)
        row["disk MiB/group: discard"] = discard["disk_mib_group"]
        row["disk MiB/group: retain"] = retain["disk_mib_group"]
        floor = by.get(("engine", n, "floor"))
        if floor is not None:
            row["makespan_ms: floor"] = floor["makespan_ms_median"]
        out.append(row)
    return out


def unavailable_rows(blocks: list[dict]) -> list[dict]:
    """What did not run, and why (a path or tier not available, a full disk tier): never a latency."""
    return [{"path": b.get("path"), "group_size": b.get("group_size"), "status": b.get("status"),
             "why": b.get("detail") or b.get("error") or ""} for b in blocks if b.get("status") != "ok"]


def block_rows(blocks: list[dict]) -> list[dict]:
    """One row per engine run: how it ended, its connector, start time, pairs, listeners and cleanup."""
    keys = ("block", "status", "connector", "engine_start_s", "pairs", "retried_pairs", "listeners", "cleanup")
    return [{**{k: b.get(k) for k in keys}, "detail": b.get("detail") or b.get("error") or ""} for b in blocks]


def per_group_rows(groups: list[dict]) -> list[dict]:
    """One row per measured group: bytes per phase (MiB), rereads, the counters, LMCache's lookups."""
    rows = []
    for g in groups:
        if not g["measured"]:
            continue
        fol = g["followup_reads"]
        rows.append({"block": g["block"], "pair": g["pair"], "arm": g["arm"], "status": g["status"],
                     "prep MiB": phase_bytes(g["prep_reads"]) / MIB, "follow-up MiB": phase_bytes(fol) / MIB,
                     "rereads": rereads(g), "counters": "=".join(sorted(counters(fol))),
                     "counts agree": has_two_counters(g) and bytes_agree(g),
                     "L1 hit tok": fol.get("lookup_hit_l1_tokens"), "L2 hit tok": fol.get("lookup_hit_l2_tokens"),
                     "contended chunks": fol.get("contended_chunks"),
                     "memory MiB at follow-ups": g["memory_tier_bytes_at_followups"] / MIB,
                     "A first token ms": round(g["ttft_a_s"] * 1e3, 1), "makespan ms": round(g["makespan_s"] * 1e3, 1)})
    return rows


def rereads_by_block(groups: list[dict]) -> dict[str, list[float]]:
    """Per block, the discard groups' rereads (sorted): how many whole contexts the follow-ups read."""
    out: dict[str, list[float]] = {}
    for g in usable(groups):
        if g["arm"] == "discard":
            out.setdefault(g["block"], []).append(rereads(g))
    return {block: sorted(values) for block, values in sorted(out.items())}
