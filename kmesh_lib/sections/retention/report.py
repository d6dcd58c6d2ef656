"""Section 16's tables and read invariants, from group records alone (no pandas: the GPU script uses it).

Tables:
    arm_rows      one row per (path, group size, arm): both stopwatches (median, p25-p75), disk MiB
                  read per phase, how many groups the byte counts agreed in, where the data started
                  and how it reached the engine
    ratio_rows    "without retention to with retention": discard / retain per path and group size
    unavailable   rows for what did not run: a path the installed LMCache does not support on the
                  device, an external tier in GPU memory, a block whose disk tier was full

Read invariants (``read_invariants``), over the measured groups that are ``ok``:
    - the preparation reads the shared context exactly once (both arms);
    - retain: the group, preparation included, reads it exactly once (nothing in the follow-ups);
    - discard: LMCache holds no copy when the follow-ups arrive, and then it depends on what a
      lookup does (``lookup_kind``):
        prefetch (MP)       every follow-up lookup rereads the whole context from the disk tier --
                            except one that lands while another follow-up's temporary copy is still
                            in L1 (LMCache counts an L1 hit or an ``l1_contended`` prefetch); that
                            accounting is checked exactly, and how many lookups reread is reported;
        on_demand (inproc)  the follow-ups read nothing: vLLM holds the context after the warm-up
                            and LMCacheConnectorV1 retrieves only the tokens vLLM lacks;
      the strict claim "every follow-up lookup reread the context" is reported as a measurement;
    - every available byte count (device, hook, metrics) agrees, phase by phase.
"""
from __future__ import annotations

import statistics

from kmesh_lib.workloads.context_arms import ARMS

MIB = 1 << 20
ORDER = {"retain": 0, "discard": 1, "floor": 2, "recompute": 3}


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default method)."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (pos - lo)


def usable(groups: list[dict]) -> list[dict]:
    return [g for g in groups if g["measured"] and g["status"] == "ok"]


def _keys(groups: list[dict]) -> list[tuple]:
    keys = {(g["path"], g["group_size"], g["arm"]) for g in groups}
    return sorted(keys, key=lambda k: (k[0] == "engine", k[0], k[1], ORDER.get(k[2], 9)))


def arm_rows(groups: list[dict]) -> list[dict]:
    rows = []
    for path, n, arm in _keys(groups):
        mine = [g for g in groups if (g["path"], g["group_size"], g["arm"]) == (path, n, arm) and g["measured"]]
        ok = usable(mine)
        row = {"path": path, "group_size": n, "arm": arm, "data_start": mine[0]["data_start"], "route": mine[0]["route"],
               "groups_ok": len(ok), "groups_excluded": len(mine) - len(ok),
               "excluded_why": sorted({g["status"] for g in mine if g["status"] != "ok"})}
        if ok:
            for key, label in (("ttft_a_s", "ttft_a_ms"), ("makespan_s", "makespan_ms")):
                vals = [g[key] * 1e3 for g in ok]
                row.update({f"{label}_median": round(statistics.median(vals), 1),
                            f"{label}_p25": round(quantile(vals, 0.25), 1), f"{label}_p75": round(quantile(vals, 0.75), 1)})
            for phase in ("prep", "followup"):
                row[f"disk_mib_{phase}"] = round(statistics.median(_bytes(g[f"{phase}_reads"]) for g in ok) / MIB, 2)
            row["disk_mib_group"] = round(row["disk_mib_prep"] + row["disk_mib_followup"], 2)
            agree = sum(g["prep_reads"]["agree"] and g["followup_reads"]["agree"] for g in ok)
            counts = sorted(k for k, v in (("device", "device_bytes"), ("hook", "hook_bytes"), ("metrics", "metric_bytes"))
                            if ok[0]["followup_reads"][v] is not None)
            row["cross_check"] = f"{'='.join(counts) or 'none'} in {agree}/{len(ok)}"
            if "load_1m" in ok[0]:
                row["load_1m_median"] = round(statistics.median(g["load_1m"] for g in ok), 2)
            if ARMS[arm].external:
                row["rereads_per_group"] = statistics.median(rereads(g) for g in ok)
            for key in ("memory_tier_bytes_before", "memory_tier_bytes_after", "disk_tier_bytes_before",
                        "disk_tier_bytes_after"):  # external-cache bytes in use, before and after the group
                row[key.replace("_bytes_", "_mib_")] = round(statistics.median(g[key] for g in ok) / MIB, 2)
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
    return [{"path": b["path"], "group_size": b.get("group_size"), "status": b["status"], "why": b.get("detail", "")}
            for b in blocks if b.get("status") != "ok"]


def _all(groups, pred) -> tuple[bool, int]:
    bad = [g for g in groups if not pred(g)]
    return not bad and bool(groups), len(bad)


def _bytes(reads: dict) -> int:
    """A phase's disk-tier bytes: LMCache's own count (hook) where there is one, else the device's."""
    return reads["hook_bytes"] if reads["hook_bytes"] is not None else (reads["device_bytes"] or 0)


def rereads(g: dict) -> float:
    """How many times the follow-up phase read the whole context from the disk tier."""
    return _bytes(g["followup_reads"]) / g["context_bytes"]


def read_invariants(groups: list[dict]) -> list[tuple[str, bool, str, bool]]:
    """(name, ok, detail, required) per block and arm, over the usable measured groups.

    ``required`` lines are the section's checks; the others are measurements stated as a claim (the
    strict "every follow-up lookup reread the context": in MP mode a concurrent follow-up can find
    another follow-up's in-flight copy in L1 and read nothing; in-process no follow-up rereads).
    """
    out = []
    for block in sorted({g["block"] for g in groups}):
        for arm in sorted({g["arm"] for g in groups if g["block"] == block}, key=lambda a: ORDER.get(a, 9)):
            gs = usable([g for g in groups if g["block"] == block and g["arm"] == arm])
            name = f"{block} {arm}"
            out.append((f"{name}: measured groups usable", bool(gs), f"{len(gs)} ok", True))
            if not gs:
                continue
            out += _common(name, arm, gs)
            if arm == "discard":
                out += _discard(name, gs)
            elif arm == "retain":
                out += _retain(name, gs)
            elif arm == "recompute":
                ok, bad = _all(gs, lambda g: g["num_cached_tokens"][0] == 0)
                out.append((f"{name}: A found nothing cached", ok, f"{bad} groups hit", True))
    return out


def _common(name: str, arm: str, gs: list[dict]) -> list[tuple]:
    out = []
    ok, bad = _all(gs, lambda g: all(x == g["output_tokens"] for x in g["num_output_tokens"]))
    out.append((f"{name}: every follow-up produced its tokens", ok, f"{bad} groups short", True))
    if arm != "recompute":
        ok, bad = _all(gs, lambda g: min(g["num_cached_tokens"]) >= g["context_tokens"])
        out.append((f"{name}: every follow-up found the context in vLLM", ok, f"{bad} groups missed", True))
    if ARMS[arm].external:
        ok, bad = _all(gs, lambda g: _bytes(g["prep_reads"]) == g["context_bytes"])
        out.append((f"{name}: preparation read the context once", ok, f"{bad} groups differ", True))
        ok, bad = _all(gs, lambda g: g["prep_reads"]["agree"] and g["followup_reads"]["agree"])
        out.append((f"{name}: byte counts agree", ok, f"{bad} groups disagree", True))
    return out


def lookup_kind(g: dict) -> str:
    """``app.registry.prefetch.driver`` (MP: a lookup loads what the arena lacks) or ``on_demand`` (in-process)."""
    return g.get("lookup") or ("prefetch" if g["path"] == "mp" else "on_demand")


def _discard(name: str, gs: list[dict]) -> list[tuple]:
    out = []
    ok, bad = _all(gs, lambda g: g["memory_tier_bytes_at_followups"] == 0 and g["memory_tier_bytes_after"] == 0)
    out.append((f"{name}: LMCache dropped its copy after loading vLLM", ok, f"{bad} groups kept bytes", True))
    per_group = f"rereads per group {sorted(rereads(g) for g in gs)}"
    if lookup_kind(gs[0]) == "on_demand":
        ok = all(_bytes(g["followup_reads"]) == 0 for g in gs)
        out.append((f"{name}: the follow-ups read nothing (vLLM held the context; the connector loads only what "
                    "vLLM lacks)", ok, per_group, True))
    else:
        ok, bad = _all(gs, lambda g: rereads(g) >= 1 and rereads(g) == int(rereads(g)))
        out.append((f"{name}: the follow-ups reread whole contexts from the disk tier", ok, per_group, True))

        def accounted(g):
            f = g["followup_reads"]
            return (f["lookup_hit_l2_tokens"] + f["lookup_hit_l1_tokens"] + f["contended_chunks"] * g["chunk_tokens"]
                    == g["group_size"] * g["context_tokens"]
                    and _bytes(f) * g["context_tokens"] == f["lookup_hit_l2_tokens"] * g["context_bytes"])

        ok, bad = _all(gs, accounted)
        out.append((f"{name}: every follow-up lookup reread the context or found another follow-up's in-flight copy",
                    ok, f"{bad} groups unaccounted", True))
    strict = sum(rereads(g) == g["group_size"] for g in gs)
    out.append((f"{name}: every follow-up lookup reread the context", strict == len(gs), f"in {strict}/{len(gs)} groups",
                False))
    return out


def _retain(name: str, gs: list[dict]) -> list[tuple]:
    out = []
    ok, bad = _all(gs, lambda g: min(g["memory_tier_bytes_at_followups"], g["memory_tier_bytes_after"]) >= g["context_bytes"])
    out.append((f"{name}: LMCache kept its copy", ok, f"{bad} groups lost it", True))
    ok, bad = _all(gs, lambda g: _bytes(g["prep_reads"]) == g["context_bytes"] and _bytes(g["followup_reads"]) == 0)
    out.append((f"{name}: the group read the context exactly once, preparation included", ok,
                f"{bad} groups reread", True))
    mp = [g for g in gs if g["followup_reads"]["lookup_hit_l1_tokens"] is not None]
    if mp:
        ok, bad = _all(mp, lambda g: g["followup_reads"]["lookup_hit_l1_tokens"] == g["group_size"] * g["context_tokens"])
        out.append((f"{name}: every follow-up lookup hit the kept copy", ok, f"{bad} groups missed", True))
    return out
