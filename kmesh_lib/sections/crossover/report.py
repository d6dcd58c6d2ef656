"""Section 21 tables and plots, from ``raw/rows.jsonl`` rows (``app.registry.crossover.arms.RestoreBench.run``).

    arm_table        median first token (and makespan) per (model, context, arm), measured ``ok`` rows
    crossover_table  per (model, restore path): recompute / restore per context, and the crossover:
                     the shortest measured context from which the restore is faster at every longer one;
                     one recompute arm (``control``) for the whole row
    floor_table      how far each restore is from its floor: restore - engine-resident (the cost of
                     bringing the context in, against the resident follow-up of the same engine)
                     against bytes / floor bandwidth (``FLOOR_OF``)
    component_table  median per-component split of each arm (``lmcache.probes``)
    split_table      median timeline split of each GPU-buffer and vLLM-CPU-tier restore (the tier's own
                     timestamps), and the part that takes longest; the goals' medians with their 95% intervals
    timeline_goal_table, critical_goal_table, launch_free_table
                     issue 13's first goal by the restore's own span, by what it adds to its step, and by that
                     less its copy's launch: each median's interval judged against the floor (``goal_reading``)
    scatter_table    what the forward step's spread moves with, per long context: the host's own time in
                     the same request, and the GPU's clock (rows with ``gpu_clocks``)
    handoff_table    the graph's launch made by the launch thread against the engine thread's own: the
                     engine thread's stalls after the request, and where the thread's launch began

Invariant: only measured rows whose follow-ups hit exactly their expected cached tokens enter a table.
"""
from __future__ import annotations

import math
import statistics
import textwrap

import numpy

from kmesh_lib.base.figures import save as save_figure
from kmesh_lib.base.intervals import (
    bootstrap_interval,
    correlation,
    lag1_autocorrelation,
    median_difference,
    median_of_differences,
    rank_correlation_interval,
    serial_inflation,
)
from kmesh_lib.kv.floors import floor_seconds
from kmesh_lib.sections.crossover.arms import (
    GPUBUF_RESTORES,
    RESIDENT_OF,
    RESTORE_ARMS,
    TIER_OF,
    control_of,
    measured_at,
)
from kmesh_lib.sections.crossover.captures import NO_SPLIT, FollowUp, PairRow, PointFloors, RestoreSplit
from kmesh_lib.sections.crossover.params import RESOLVE_MIN_TOKENS, goal_judges

RESTORES = RESTORE_ARMS
# Each path's transfer floor from the floors the run measured: "copy" host->device (a host memcpy on
# CPU), "disk" sequential O_DIRECT reads, "device" a device-to-device copy. LMCache's disk path reads
# the whole context into its memory tier before the copy into vLLM starts, so its floor is the sum;
# the GPU buffer stages chunk by chunk, overlapping the read with the copy, so its floor is the larger.
FLOOR_OF = {"dram": ("sum", ("copy",)), "disk": ("sum", ("disk", "copy")),
            "gpubuf_retained": ("sum", ("device",)), "gpubuf_layered": ("sum", ("device",)),
            "gpubuf_offthread": ("sum", ("device",)),
            "gpubuf_disk": ("max", ("disk", "copy")),
            "native_offload": ("sum", ("copy",)), "lmcache_mp": ("sum", ("copy",))}
SPLIT_PARTS = ("queue_s", "lookup_s", "disk_read_s", "staging_s", "launch_s", "copy_s", "restore_s", "load_time_s",
               "after_restore_s", "after_lookup_s", "allocate_s", "schedule_s", "pack_ids_s", "measure_s", "host_s",
               "hook_s", "before_copy_s", "copy_call_s", "write_ids_s", "after_copy_s", "forward_wait_s", "critical_s",
               "thread_launch_s", "thread_lag_s", "thread_saw_end_s", "thread_pack_s", "to_forward_s")
# the parts that bring the context in; what follows (after_*) is the forward step the resident follow-up also pays
# The parts of bringing the context in. The wait before the scheduler first looks at the request
# (``queue_ms``) is recorded beside them but is not one: a resident follow-up waits the same way.
RESTORE_PARTS = ("lookup_ms", "disk_read_ms", "staging_ms", "launch_ms", "copy_ms", "load_time_ms")
COMPONENTS = ("lookup_s", "lookup_wall_s", "disk_read_s", "load_s", "save_s", "forward_s", "other_s")


def _ms(name: str) -> str:
    """A part's column in milliseconds: ``thread_saw_end_s`` -> ``thread_saw_end_ms`` (only the suffix)."""
    return name.removesuffix("_s") + "_ms"


def usable(rows: list[FollowUp]) -> list[FollowUp]:
    """The measured follow-ups that hit exactly their expected cached tokens: the only ones a table takes."""
    return [r for r in rows if r.measured and r.status == "ok"]


def arm_table(rows: list[FollowUp]) -> list[dict]:
    groups: dict[tuple, list[FollowUp]] = {}
    for r in usable(rows):
        groups.setdefault((r.model, r.context_tokens, r.arm), []).append(r)
    out = []
    for (model, n, arm), rs in sorted(groups.items()):
        out.append({"model": model, "context_tokens": n, "arm": arm, "n": len(rs),
                    "context_mib": rs[0].context_bytes / (1 << 20),
                    "ttft_ms": 1e3 * statistics.median(r.ttft_s for r in rs),
                    "ttft_min_ms": 1e3 * min(r.ttft_s for r in rs),
                    "makespan_ms": 1e3 * statistics.median(r.makespan_s for r in rs),
                    "disk_read_mib": statistics.median(r.disk_read_bytes or 0 for r in rs) / (1 << 20)})
    return out


def _lookup(table: list[dict]) -> dict[tuple, dict]:
    return {(t["model"], t["context_tokens"], t["arm"]): t for t in table}


def crossover_point(lengths: list[int], wins: list[bool]) -> int | None:
    """The shortest length from which every longer measured length is a win (None: no such length)."""
    point = None
    for n, win in sorted(zip(lengths, wins), reverse=True):
        if not win:
            break
        point = n
    return point


def _ratio_of_medians(recompute, restore, axis):
    return numpy.median(recompute, axis=axis) / numpy.median(restore, axis=axis)


def speedup_interval(recompute_s: list[float], restore_s: list[float]) -> list[float | None]:
    """The 95% bootstrap interval of recompute's median first token over the restore's: the two arms' follow-ups
    resampled independently (they ran on different engines, or the same engine at different moments of a repeat, so
    no follow-up has a partner); [None, None] with fewer than two of either."""
    low, high = bootstrap_interval((recompute_s, restore_s), _ratio_of_medians, paired=False)
    return [_round(low, 3), _round(high, 3)]


def _control(t: dict[tuple, dict], model: str, path: str) -> str:
    """``arms.control_of`` of an arm table's ``_lookup``: the recompute arm every speed-up of the (``model``,
    ``path``) row is over, one for all its lengths (the crossover table's ``control``, the heatmap's cells)."""
    return control_of(path, measured_at(t).get(model, {}))


def is_win(speedup: float, interval: list | None) -> bool:
    """A restore faster than recompute at one length: its speed-up's 95% interval wholly above 1 where it has one,
    else its median ratio above 1 (the crossover table's rule, and every sentence that reads a win from a row)."""
    return interval[0] > 1.0 if interval and interval[0] is not None else speedup > 1.0


def crossover_table(table: list[dict], rows: list[FollowUp] = ()) -> list[dict]:
    """Per (model, restore path): ``speedup@N``, recompute's median first token over the restore's at each measured
    length N; with the follow-ups (``rows``), ``speedup_ci@N``, its 95% interval (``speedup_interval``), and a win
    at N is an interval wholly above 1 (without them, or with fewer than two follow-ups of an arm, a median ratio
    above 1). ``crossover_tokens``: the shortest
    length from which every longer one is a win. ``control``: the recompute arm every speed-up of the row is over
    (``arms.control_of``: the tier's own engine's where it was measured at every length of the row, else the LMCache
    engine's ``recompute`` for the whole row); a length where that arm was not measured has no speed-up."""
    t = _lookup(table)
    samples: dict[tuple, list[float]] = {}
    for r in usable(rows):
        samples.setdefault((r.model, r.context_tokens, r.arm), []).append(r.ttft_s)
    models = sorted({r["model"] for r in table}, key=lambda m: [r["model"] for r in table].index(m))
    out = []
    for model in models:
        for path in RESTORES:
            control = _control(t, model, path)
            lengths = sorted(n for (m, n, a) in t if m == model and a == path and (model, n, control) in t)
            if not lengths:
                continue
            speed = {n: t[(model, n, control)]["ttft_ms"] / t[(model, n, path)]["ttft_ms"] for n in lengths}
            ci = ({n: speedup_interval(samples.get((model, n, control), []), samples.get((model, n, path), []))
                   for n in lengths} if samples else {})
            # no interval (fewer than two follow-ups of an arm: nothing to resample): the medians alone, as before
            wins = [is_win(speed[n], ci.get(n)) for n in lengths]
            point = crossover_point(lengths, wins)
            row = {"model": model, "path": path, "control": control, "crossover_tokens": point,
                   "crossover": (f">= {point}" if point is not None else f"none up to {max(lengths)}")}
            row.update({f"speedup@{n}": round(speed[n], 3) for n in lengths})
            row.update({f"speedup_ci@{n}": ci[n] for n in lengths if ci})
            out.append(row)
    return out


def path_floor_s(arm: str, nbytes: float, floors: dict) -> float | None:
    """Seconds to move ``nbytes`` on ``arm``'s route at the measured floors (None: a floor not measured)."""
    how, names = FLOOR_OF[arm]
    if not all(floors.get(f) for f in names):
        return None
    parts = [floor_seconds(nbytes, floors[f]) for f in names]
    return sum(parts) if how == "sum" else max(parts)


def floor_table(table: list[dict], floors: dict, rows: list[FollowUp] = (), bound: bool = True,
                point_floors: list[PointFloors] = ()) -> list[dict]:
    """Restore cost (restore - engine-resident, the arm table's medians) against the transfer floor of the context's
    bytes, judged by its interval as the paired design judges its spans (issue 42).

    ``restore_cost_ci_ms``: the cost's 95% bootstrap interval from the grid's follow-ups (``rows``; ``cost_interval``:
    the two arms resampled on their own, no follow-up has a partner), [None, None] with fewer than two of either;
    ``transfer_floor_ms``: the path's floor from the floors timed once at the run's start (``floors``), kept beside
    the one judged; ``point_floor_ms``: the path's floor as a range over the floors the
    paired design timed before and after this point (``point_floors``: ``floor_range_ms``), None where the run timed
    none there; ``floor_timed``: which of the two the verdict judges against ("around the point" where there is a
    range: the disk drifts over a run, so a snapshot at its start can sit above what the same disk read at the point,
    and a cost read "below its floor" against it where the floors timed around the point find it above; 9c33's GPU
    buffer from disk at 16,384 tokens, 7 Dec 2026; else "at the run's start"); ``verdict``: ``floor_verdict`` of
    the cost's interval against that floor, so an interval holding 0 is "no cost measured" and one reaching down
    into the floor "at the floor" (the goal tables judge against the same floor: ``judged_floor_ms``); ``bound``:
    whether the floors are physical bounds (``floor_verdict``: on the CPU a cost below its timed floor judges nothing).
    Invariant: ``x_floor`` (the medians' cost over the judged floor's max) is a number only where the verdict is a
    ratio range, the interval wholly above the floor, so it is never below 1; elsewhere None. The paired design
    (``resolution_table``) resolves the same cost; this is the grid's reading of it."""

    t = _lookup(table)
    around = floors_by_point(point_floors)
    out = []
    for (model, n, arm), row in sorted(t.items()):
        if arm not in RESTORES or (model, n, RESIDENT_OF[arm]) not in t:
            continue
        nbytes = row["context_mib"] * (1 << 20)
        floor_s = path_floor_s(arm, nbytes, floors)
        if floor_s is None:
            continue
        cost_ms = row["ttft_ms"] - t[(model, n, RESIDENT_OF[arm])]["ttft_ms"]
        floor_ms = 1e3 * floor_s
        at_point = floor_range_ms(arm, around.get((model, n, TIER_OF[arm]), []))
        judged = at_point or [floor_ms, floor_ms]
        _, low, high = cost_interval(rows, model, n, arm)
        verdict = floor_verdict(low, high, judged, bound)
        out.append({"model": model, "context_tokens": n, "path": arm, "context_mib": round(row["context_mib"], 2),
                    "restore_cost_ms": round(cost_ms, 3), "restore_cost_ci_ms": [_round(low, 3), _round(high, 3)],
                    "transfer_floor_ms": round(floor_ms, 3), "point_floor_ms": at_point,
                    "floor_timed": "around the point" if at_point else "at the run's start", "verdict": verdict,
                    "x_floor": x_floor_of(cost_ms, low, judged[1], 1)})
    return out


GOAL_MIN_TOKENS = RESOLVE_MIN_TOKENS  # issue 13's goals: judged at every grid point of this many tokens and more
GOAL_X = 1.2  # ... a restore within this factor of its floor, the retained GPU buffer of the resident follow-up


def x_floor_of(median_ms: float, low_ms: float, floor_ms: float, digits: int) -> float | None:
    """A median over its floor, rounded to ``digits``, only where its interval lies wholly above the floor (the
    interval's low end above it: ``floor_verdict``'s ratio range), so never below 1; None elsewhere (NaN compares
    false: no interval)."""
    return round(median_ms / floor_ms, digits) if floor_ms > 0 and low_ms > floor_ms else None


def floor_bounds(floor_ms: float | list[float]) -> tuple[float, float]:
    """A floor as (min, max) ms: a range timed around a point as it is, one floor (timed once) twice."""
    return (floor_ms[0], floor_ms[1]) if isinstance(floor_ms, (list, tuple)) else (floor_ms, floor_ms)


def within_goal(low_ms: float, high_ms: float, floor_ms: float | list[float], bounded: bool = True) -> bool:
    """An interval within ``GOAL_X`` of its floor: wholly above 0, its upper end at most ``GOAL_X`` x the floor (of a
    range timed around the point, its min: within against every floor timed there) and, for a value the floor bounds,
    not wholly below it (there a method problem). NaN (no interval) is never within."""
    lo, _ = floor_bounds(floor_ms)
    return bool(low_ms > 0 and high_ms <= GOAL_X * lo and (high_ms >= lo or not bounded))


def goal_verdict(low_ms: float, high_ms: float, floor_ms: float | list[float]) -> str:
    """Whether a restore's cost is within ``GOAL_X`` of its floor, by the cost's interval: ``met``
    when its whole interval is above 0 and its upper end within, ``not met`` when its lower end is above,
    ``unresolved`` when the interval spans the bound, reaches 0 or below (no cost measured, or a restore
    below its resident follow-up: a method problem, never met, as ``goal_reading`` has it), lies wholly below the
    floor (``floor_verdict``'s "below its floor", a method problem the same answer names: never met; 861a's 7B DRAM
    at 16,384 tokens, +16.1 ms [15.8, 16.5] against a 16.9 ms floor, had read "met"), or was not
    computed (a difference of medians of a few follow-ups can fall below zero while the copy it contains
    takes a millisecond). Against a floor's range, ``not met`` only where the lower end is above ``GOAL_X`` x its
    max: not within against any floor timed there."""
    # NaN (fewer than two follow-ups on a side) is neither within nor above
    return ("met" if within_goal(low_ms, high_ms, floor_ms) else "not met" if low_ms > GOAL_X * floor_bounds(floor_ms)[1]
            else "unresolved")


def cost_interval(rows: list[FollowUp], model: str, n: int, path: str) -> tuple[float, float, float]:
    """(cost, low, high) in ms: the restore's median first token minus its resident follow-up's, with
    the 95% percentile bootstrap interval of that difference (each arm's follow-ups resampled on their own)."""
    ttft = {}
    for r in usable(rows):
        if r.model == model and r.context_tokens == n:
            ttft.setdefault(r.arm, []).append(1e3 * r.ttft_s)
    return median_difference(ttft.get(path, []), ttft.get(RESIDENT_OF[path], []))


def goal_table(table: list[dict], distance: list[dict], rows: list[FollowUp] | None = None) -> list[dict]:
    """Issue 13's goals per grid point, from the medians and the floor distance.

    At every point of ``GOAL_MIN_TOKENS`` and more: the fastest restore path (lowest median first
    token) and its distance to its own floor (``fastest_verdict``: ``floor_table``'s verdict, ``fastest_x_floor`` its
    ratio where that is a ratio range, else None; ``fastest_within``: the medians' ratio within ``GOAL_X``), and the
    path nearest its floor among those whose cost is at the floor or a ratio range above it (``nearest_verdict``).
    At every point: the retained GPU buffer's first token over its engine's resident follow-up. A goal is met only where
    both of its numbers were measured; a missing one leaves it None, never met. With ``rows`` (the
    run's follow-ups), the fastest path's cost also gets its interval and ``fastest_goal``
    (``goal_verdict``): ``fastest_within`` compares the medians alone."""
    t = _lookup(table)
    by_point: dict[tuple, list[dict]] = {}
    for r in distance:
        by_point.setdefault((r["model"], r["context_tokens"]), []).append(r)
    points = sorted({(m, n) for m, n, _ in t})
    out = []
    for model, n in points:
        row: dict = {"model": model, "context_tokens": n}
        paths = [r for r in by_point.get((model, n), [])  # a measured path with its cost and a floor
                 if r.get("transfer_floor_ms") and r.get("restore_cost_ms") is not None and (model, n, r["path"]) in t]
        if n >= GOAL_MIN_TOKENS and paths:
            best = min(paths, key=lambda r: t[(model, n, r["path"])]["ttft_ms"])
            best_floor = judged_floor_ms(best)  # the floor the floor table's verdict judged
            # the medians' ratio, unrounded, decides ``fastest_within`` (``x_floor`` is None unless the cost's interval
            # lies wholly above the floor, and a negative cost is within any bound: the answer counts it apart)
            row.update(fastest_path=best["path"], fastest_ttft_ms=t[(model, n, best["path"])]["ttft_ms"],
                       fastest_cost_ms=best["restore_cost_ms"], fastest_x_floor=best.get("x_floor"),
                       fastest_within=best["restore_cost_ms"] / best_floor[0] <= GOAL_X)
            if "verdict" in best:
                row["fastest_verdict"] = best["verdict"]
            # nearest its floor: a cost at the floor before any ratio range (each at least 1); a cost whose interval
            # holds 0 or lies below the floor is no distance
            judged = [r for r in paths if r.get("x_floor") is not None or r.get("verdict") == AT_THE_FLOOR]
            if judged:
                near = min(judged, key=lambda r: 1.0 if r.get("x_floor") is None else r["x_floor"])
                row.update(nearest_path=near["path"], nearest_x_floor=near.get("x_floor"),
                           nearest_verdict=near.get("verdict"))
            if rows is not None:
                _, low, high = cost_interval(rows, model, n, best["path"])
                row.update(fastest_cost_ci_ms=[round(low, 3), round(high, 3)],
                           fastest_floor_ms=best_floor, fastest_goal=goal_verdict(low, high, best_floor))
        kept, resident = t.get((model, n, "gpubuf_retained")), t.get((model, n, "gpubuf_resident"))
        if kept and resident:
            ratio = kept["ttft_ms"] / resident["ttft_ms"]
            row.update(retained_x_resident=round(ratio, 3), retained_within=ratio <= GOAL_X)
        if len(row) > 2:
            out.append(row)
    return out


def component_table(rows: list[FollowUp]) -> list[dict]:
    groups: dict[tuple, list[FollowUp]] = {}
    for r in usable(rows):
        groups.setdefault((r.model, r.context_tokens, r.arm), []).append(r)
    out = []
    for (model, n, arm), rs in sorted(groups.items()):
        row = {"model": model, "context_tokens": n, "arm": arm, "ttft_ms": 1e3 * statistics.median(r.ttft_s for r in rs)}
        for c in COMPONENTS:
            vals = [getattr(r.components, c) for r in rs if getattr(r.components, c) is not None]
            row[_ms(c)] = round(1e3 * statistics.median(vals), 3) if vals else None
        walls = [r.components.load_wall_s for r in rs if r.components.load_wall_s is not None]
        if walls:  # only where recorded: the published runs' tables keep their columns
            row[_ms("load_wall_s")] = round(1e3 * statistics.median(walls), 3)
        out.append(row)
    return out


def split_table(rows: list[FollowUp]) -> list[dict]:
    """Median split of the restores that recorded one (``arms.RestoreBench._tier_fields``), with the
    longest part of bringing the context in named (``RESTORE_PARTS``): what keeps a path above its floor.

    Invariant: every median a goal table judges carries its 95% bootstrap interval from the same restores
    (``restore_ci_ms``, ``critical_ci_ms``; ``charged_ci_ms`` where the copy ran beside the forward pass, each
    restore's critical path and copy resampled together); [None, None] with fewer than two restores."""
    groups: dict[tuple, list[FollowUp]] = {}
    for r in usable(rows):
        if r.split is not None:
            groups.setdefault((r.model, r.context_tokens, r.arm), []).append(r)
    out = []
    for (model, n, arm), rs in sorted(groups.items()):
        row = {"model": model, "context_tokens": n, "arm": arm, "n": len(rs),
               "ttft_ms": round(1e3 * statistics.median(r.ttft_s for r in rs), 3)}
        for part in SPLIT_PARTS:
            vals = [getattr(r.split, part) for r in rs if getattr(r.split, part) is not None]
            if vals:
                row[_ms(part)] = round(1e3 * statistics.median(vals), 3)
        # copy_launch: "graph", "handle", "torch", ...; reference_at: "step" (measure > 0) or "before_step"
        for key in ("launched_at", "wait_at", "copy_launch", "launched_by", "settled_by", "ids_packed_by", "reference_at"):
            seen = {getattr(r.split, key) for r in rs} - {None}
            if seen:
                row[key] = "/".join(sorted(seen))
        synced = [r.split.measure_synced for r in rs if r.split.measure_synced is not None]
        if synced:  # how many clock references found the stream busy and waited for it
            row["measure_synced"] = f"{sum(synced)}/{len(synced)}"
        spans = {k: row[k] for k in RESTORE_PARTS if k in row}
        row["longest_part"] = max(spans, key=spans.get).removesuffix("_ms") if spans else None
        # the goals' medians with their 95% intervals, from the same restores (``timeline_goal_table``,
        # ``critical_goal_table``): after every column the table had, so a run's other columns keep their place
        for part in ("restore_s", "critical_s"):
            vals = [getattr(r.split, part) for r in rs if getattr(r.split, part) is not None]
            if vals:
                row[f"{part.removesuffix('_s')}_ci_ms"] = _median_ci_ms(vals)
        if row.get("wait_at") == "layer":  # charged (``charged_ms``): critical plus the copy, each restore's two together
            both = [(r.split.critical_s, r.split.copy_s) for r in rs
                    if r.split.critical_s is not None and r.split.copy_s is not None]
            if both:
                low, high = bootstrap_interval(tuple([1e3 * v for v in side] for side in zip(*both)), _sum_of_medians,
                                               paired=True)
                row["charged_ci_ms"] = [_round(low, 3), _round(high, 3)]
        out.append(row)
    return out


def _median_ci_ms(values_s: list[float]) -> list[float | None]:
    """The 95% bootstrap interval (ms) of the median of per-restore values in seconds (``median_of_differences`` of
    one sample, as ``resolution_table`` has a span's); [None, None] with fewer than two values."""
    _, low, high = median_of_differences([1e3 * v for v in values_s])
    return [_round(low, 3), _round(high, 3)]


def _sum_of_medians(x, y, axis):
    """``charged_ms``' statistic: the median critical path plus the median copy, the restores resampled as pairs."""
    return numpy.median(x, axis=axis) + numpy.median(y, axis=axis)


# (handed to the launch thread, launched by the engine thread): the same layer-wait copy, one engine
HANDOFF_PAIR = ("gpubuf_offthread", "gpubuf_layered")


def handoff_points(rows: list[FollowUp]) -> dict[str, dict[str, list[dict]]]:
    """Per model, per arm of ``HANDOFF_PAIR``: each restore's engine-thread parts around the request, in us.

    ``copy_call_us``, ``after_copy_us`` (the engine thread's Python right after the request, no CUDA call in it) and
    ``to_forward_us`` (from the restore's end to the forward pass's first attention layer, host stamps; None in runs
    recorded before it). For a launch the thread made, on the same clock, from the request (the copy call's end):
    its driver call's ``launch_begin_us`` and ``launch_end_us``, and ``resumed_after_launch_us``, the engine
    thread's end of ``after_copy`` after the launch returned. Where the model has both arms, each off-thread
    restore's ``stalled``: its ``after_copy`` longer than the longest of the engine-launched arm's."""
    out: dict[str, dict[str, list[dict]]] = {}
    for r in usable(rows):
        s = r.split or NO_SPLIT
        if r.arm not in HANDOFF_PAIR or s.after_copy_s is None:
            continue
        p = {"context_tokens": r.context_tokens, "copy_call_us": 1e6 * s.copy_call_s,
             "after_copy_us": 1e6 * s.after_copy_s,
             "to_forward_us": None if s.to_forward_s is None else 1e6 * s.to_forward_s}
        if s.thread_lag_s is not None and s.thread_launch_s is not None and s.write_ids_s is not None:
            # the stamps: ids written, then the request (copy_call's end); the thread's lag runs from the ids written
            request_us = 1e6 * (s.copy_call_s - s.write_ids_s)
            p["launch_end_us"] = 1e6 * s.thread_lag_s - request_us
            p["launch_begin_us"] = p["launch_end_us"] - 1e6 * s.thread_launch_s
            p["resumed_after_launch_us"] = p["after_copy_us"] - p["launch_end_us"]
        out.setdefault(r.model, {}).setdefault(r.arm, []).append(p)
    for arms in out.values():
        own = arms.get(HANDOFF_PAIR[1])
        if own:
            longest = max(p["after_copy_us"] for p in own)
            for p in arms.get(HANDOFF_PAIR[0], []):
                p["stalled"] = p["after_copy_us"] > longest
    return out


def handoff_step_pairs(rows: list[FollowUp]) -> dict[str, dict]:
    """Per model, what the hand-off changes for the step as a whole: each off-thread restore's ``critical +
    to_forward`` (what it adds to its step, then the engine thread's time from its end to the forward pass's first
    layer, where a stall the launch brings after the restore's windows lands) less the engine-launched restore's of
    the same (context, repeat), pooled over the points (one repeat runs both arms back to back on one engine). The
    median of the paired differences and its 95% bootstrap interval, in ms; models without two such pairs are left
    out (runs recorded before ``to_forward`` have none)."""
    steps: dict[tuple, dict[str, float]] = {}
    for r in usable(rows):
        s = r.split or NO_SPLIT
        if r.arm in HANDOFF_PAIR and s.critical_s is not None and s.to_forward_s is not None:
            steps.setdefault((r.model, r.context_tokens, r.repeat), {})[r.arm] = 1e3 * (s.critical_s + s.to_forward_s)
    out = {}
    for model in sorted({k[0] for k in steps}):
        diffs = [v[HANDOFF_PAIR[0]] - v[HANDOFF_PAIR[1]] for k, v in sorted(steps.items())
                 if k[0] == model and len(v) == 2]
        if len(diffs) >= 2:
            median, low, high = median_of_differences(diffs)
            out[model] = {"num_pairs": len(diffs), "step_difference_ms": round(median, 3),
                          "step_difference_ci_ms": [round(low, 3), round(high, 3)]}
    return out


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 1) if values else None


def handoff_table(rows: list[FollowUp]) -> list[dict]:
    """The launch handed to a thread against the engine thread's own, per model over every point (one engine runs
    both arms): the copy call's median in each, and the stalls: the off-thread restores whose ``after_copy`` (the
    engine thread's Python right after the request, with no CUDA call in it) took longer than the longest of the
    engine-launched arm's, how many and by how much (median excess). Beside them, from the thread's stamps
    (``handoff_points``, us from the request): where the stalled restores' launches began and where the others'
    did, and how long after the stalled launch's return the engine thread's Python ended; and, where recorded, the
    engine thread's time from the restore's end to the forward pass's first layer in each arm (a stall after the
    restore's own windows shows there, not in ``after_copy``); and the two together, paired by repeat
    (``handoff_step_pairs``): whether the hand-off shortens the step at all. Empty where a run has not both arms."""
    out = []
    pairs = handoff_step_pairs(rows)
    for model, arms in sorted(handoff_points(rows).items()):
        handed, own = arms.get(HANDOFF_PAIR[0], []), arms.get(HANDOFF_PAIR[1], [])
        if not handed or not own:
            continue
        longest = max(p["after_copy_us"] for p in own)
        stalled = [p for p in handed if p["stalled"]]
        others = [p for p in handed if not p["stalled"]]
        out.append({"model": model, "num_handed": len(handed), "num_own": len(own),
                    "copy_call_ms": round(statistics.median(p["copy_call_us"] for p in handed) / 1e3, 4),
                    "own_copy_call_ms": round(statistics.median(p["copy_call_us"] for p in own) / 1e3, 4),
                    "own_longest_after_copy_ms": round(longest / 1e3, 4), "num_stalls": len(stalled),
                    "stall_excess_ms": (round(statistics.median(p["after_copy_us"] - longest for p in stalled) / 1e3, 4)
                                        if stalled else None),
                    "stalled_launch_begin_us": _median(p.get("launch_begin_us") for p in stalled),
                    "other_launch_begin_us": _median(p.get("launch_begin_us") for p in others),
                    "stall_resumed_after_launch_us": _median(p.get("resumed_after_launch_us") for p in stalled),
                    "to_forward_us": _median(p["to_forward_us"] for p in handed),
                    "own_to_forward_us": _median(p["to_forward_us"] for p in own),
                    **pairs.get(model, {"num_pairs": 0, "step_difference_ms": None, "step_difference_ci_ms": None})})
    return out


def handoff_plot(rows: list[FollowUp], path_out):
    """Per model with both arms of ``HANDOFF_PAIR``: each off-thread restore's ``after_copy`` against where the
    thread's launch began (us from the request), the engine-launched arm's longest ``after_copy`` as a line: a
    stall that follows the launch's timing shows as a band at the left. None (nothing drawn) without both arms."""
    import matplotlib.pyplot as plt

    points = {m: arms for m, arms in handoff_points(rows).items()
              if arms.get(HANDOFF_PAIR[1]) and any("launch_begin_us" in p for p in arms.get(HANDOFF_PAIR[0], []))}
    if not points:
        return None
    fig, axes = plt.subplots(1, len(points), figsize=(4.2 * len(points), 3.0), squeeze=False, sharey=True)
    for ax, (model, arms) in zip(axes[0], sorted(points.items())):
        handed = [p for p in arms[HANDOFF_PAIR[0]] if "launch_begin_us" in p]
        for stalled, color, label in ((True, "C3", "stalled"), (False, "C0", "not stalled")):
            pts = [p for p in handed if p["stalled"] == stalled]
            ax.scatter([p["launch_begin_us"] for p in pts], [p["after_copy_us"] for p in pts], s=14, c=color,
                       label=f"{label} ({len(pts)})")
        ax.axhline(max(p["after_copy_us"] for p in arms[HANDOFF_PAIR[1]]), color="0.4", ls="--", lw=1,
                   label=f"{HANDOFF_PAIR[1]}: longest")
        ax.set(title=model, xlabel="thread's launch began, us after the request")
        ax.legend(fontsize=7, loc="upper right")
    axes[0][0].set_ylabel(f"{HANDOFF_PAIR[0]}: after_copy, us")
    fig.tight_layout()
    save_figure(fig, path_out, bbox_inches="tight")
    return fig


FOLLOWS_RHO = 0.5  # a rank correlation this strong (or stronger) says the forward step follows that quantity


def _rank_correlation(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rho, or None where either side is constant or there are fewer than 4 pairs."""
    from scipy.stats import spearmanr

    if len(xs) < 4 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return round(float(spearmanr(xs, ys).statistic), 3)


def scatter_table(rows: list[FollowUp]) -> list[dict]:
    """What the forward step's spread follows, per (model, context) of ``GOAL_MIN_TOKENS`` and more.

    Over every measured follow-up whose first step is the SUFFIX_TOKENS one (arms of kind memory and
    resident; recompute's is a whole prefill, the disk arms' waits on the disk): the forward step's
    10th, 50th and 90th percentiles (``components.forward_s``), and Spearman's rank correlation of it
    with ``other_s`` -- the same request's time outside the model executor (scheduling, block
    hashing, output handling: host Python only) -- and with the GPU's SM clock read just before the
    follow-up (``gpu_clocks.before``, NVML), each with its 95% interval (``intervals.rank_correlation_interval``,
    the follow-ups taken as independent). A correlation says what the step moves with, not what sets it."""
    from kmesh_lib.sections.crossover.arms import KIND

    groups: dict[tuple, list[FollowUp]] = {}
    for r in usable(rows):
        if r.gpu_clocks and KIND.get(r.arm) in ("memory", "resident") and r.context_tokens >= GOAL_MIN_TOKENS:
            groups.setdefault((r.model, r.context_tokens), []).append(r)
    out = []
    for (model, n), rs in sorted(groups.items()):
        forward = [1e3 * r.components.forward_s for r in rs]
        other = [1e3 * r.components.other_s for r in rs]
        before = [(f, (r.gpu_clocks.get("before") or {}).get("sm_mhz")) for f, r in zip(forward, rs)]
        clocked = [(f, c) for f, c in before if c]
        p10, p50, p90 = (round(float(v), 3) for v in numpy.quantile(forward, [0.1, 0.5, 0.9]))
        rho_other = _rank_correlation(forward, other)
        rho_clock = _rank_correlation([f for f, _ in clocked], [c for _, c in clocked])
        out.append({"model": model, "context_tokens": n, "n": len(rs), "forward_p10_ms": p10, "forward_p50_ms": p50,
                    "forward_p90_ms": p90, "rho_forward_other": rho_other,
                    "rho_forward_other_ci": rank_correlation_interval(rho_other, len(rs)),
                    "rho_forward_sm_clock": rho_clock, "n_clocked": len(clocked),
                    "rho_forward_sm_clock_ci": rank_correlation_interval(rho_clock, len(clocked)),
                    "sm_mhz_min": min((c for _, c in clocked), default=None),
                    "sm_mhz_max": max((c for _, c in clocked), default=None)})
    return out


def _floor_of(distance: list[dict]) -> dict[tuple, list[float]]:
    """The floor ``floor_table``'s verdict judged (``judged_floor_ms``: [min, max] ms, the range timed around the
    point where the run timed one) by (model, context tokens, path): the goal tables judge against the same floor."""
    return {(r["model"], r["context_tokens"], r["path"]): judged_floor_ms(r) for r in distance
            if r.get("transfer_floor_ms")}


# floor_verdict's word for a step's addition wholly below its floor: the restore's copy overlaps host work (or, queued
# at the step's start, the runner's input preparation), so what it adds to the step is no transfer and the floor does
# not bound it
UNBOUNDED_BELOW = "below its floor (the copy overlaps host work: no bound broken)"


def goal_reading(median_ms: float, ci_ms: list | None, floor_ms: float | list[float], bound: bool = True,
                 bounded: bool = True) -> dict:
    """A goal table's median (ms) with its 95% interval ``ci_ms`` against its floor, as ``floor_table`` judges a cost:
    ``floor_ms`` the range timed around the point ([min, max]) where the run timed one, else the run-start floor (one
    number: its range [floor_ms, floor_ms]). ``verdict``: ``floor_verdict`` (``bound``:
    the floors are physical bounds, a device moved the bytes); ``bounded``: whether the floor bounds the value (a
    restore's own span does; what it adds to its step does not: an interval wholly below the floor reads
    ``UNBOUNDED_BELOW`` there, not a method problem). Invariants: ``x_floor``, the median over the floor, is a number
    only where the interval lies wholly above the floor (the verdict a ratio range), so it is never below 1, else None;
    ``within`` is true only where the whole interval is above 0 and at most ``GOAL_X`` x the floor's max and, for a
    bounded value, not wholly below the floor (a method problem, or on the CPU a timed floor that judges nothing). No
    interval (fewer than two restores, [None, None]) is never within."""
    low, high = (float("nan"),) * 2 if not ci_ms or None in ci_ms else ci_ms
    lo, hi = floor_bounds(floor_ms)
    verdict = floor_verdict(low, high, [lo, hi], bound, below=None if bounded else UNBOUNDED_BELOW)
    return {"verdict": verdict, "x_floor": x_floor_of(median_ms, low, hi, 3),
            "within": within_goal(low, high, [lo, hi], bounded)}


def timeline_goal_table(splits: list[dict], distance: list[dict], bound: bool = True) -> list[dict]:
    """The restore's own span against its floor, at every point of ``GOAL_MIN_TOKENS`` and more.

    ``restore_ms`` is the median of the tier's timeline (lookup, disk read and staging where there
    are, the copy into vLLM's blocks; CUDA events on a GPU): it leaves out what vLLM's scheduler adds
    for the restored blocks and any effect on the forward step, so its ratio to the floor is a lower
    bound on the cost's where the restore is queued after the runner's input preparation (``launched_at``
    "forward"); queued at the step's start, its copy overlaps that preparation and the span is no bound
    (``critical_goal_table`` then). Unlike the first-token difference it has the spread of the copy alone.

    The span holds the copy of the context's bytes, so the floor bounds it: ``restore_ci_ms`` (the splits table's 95%
    bootstrap interval of the median) is judged by ``goal_reading`` with the run's ``bound``; a span wholly below its
    floor is a method problem, never within; ``within``: the whole interval at most ``GOAL_X`` x the floor."""
    floor = _floor_of(distance)
    out = []
    for r in splits:
        key = (r["model"], r["context_tokens"], r["arm"])
        if r["context_tokens"] < GOAL_MIN_TOKENS or r.get("restore_ms") is None or not floor.get(key):
            continue
        out.append({"model": r["model"], "context_tokens": r["context_tokens"], "path": r["arm"],
                    "restore_ms": r["restore_ms"], "restore_ci_ms": r.get("restore_ci_ms"),
                    "floor_ms": floor[key],
                    **goal_reading(r["restore_ms"], r.get("restore_ci_ms"), floor[key], bound)})
    return out


def charged_ms(split: dict) -> float | None:
    """What a restore adds to its step with its copy charged in full where the copy runs beside the
    forward pass (``wait_at`` "layer"): ``critical_ms`` counts only the forward pass's stalls on it, not
    how much the copy, sharing the GPU's memory bandwidth, slows the forward pass's kernels; that is at
    most the copy's own span. Elsewhere the forward pass starts after the copy, and this is ``critical_ms``."""
    if split.get("critical_ms") is None:
        return None
    if split.get("wait_at") != "layer":
        return split["critical_ms"]
    return None if split.get("copy_ms") is None else round(split["critical_ms"] + split["copy_ms"], 3)


def charged_ci_ms(split: dict) -> list | None:
    """``charged_ms``' 95% interval: the splits table's ``charged_ci_ms`` where the copy ran beside the forward pass,
    else ``critical_ci_ms`` (the same value)."""
    if split.get("critical_ms") is None:
        return None
    return split.get("charged_ci_ms") if split.get("wait_at") == "layer" else split.get("critical_ci_ms")


def critical_goal_table(splits: list[dict], distance: list[dict]) -> list[dict]:
    """Issue 13's first goal by what each restore adds to its step's critical path, at every point of
    ``GOAL_MIN_TOKENS`` and more: the path with the least median ``critical_ms`` (lookup, the connector's
    scheduling, the timing reference's synchronization, the restore's host calls, the forward pass's wait on its copy:
    ``kv.restore_timeline``) against that path's floor; and the same judged by ``charged_ms`` (the
    strict reading where a copy runs beside the forward pass: ``charged_*``). Only the GPU buffer's
    timeline has the parts; a point without them is absent, never met.

    Each is judged by its 95% interval (the splits table's ``critical_ci_ms`` and ``charged_ci_ms``: ``goal_reading``,
    ``verdict`` and ``charged_verdict``). What a restore adds to its step is not bounded by the floor: its copy overlaps
    the host's work (and queued at the step's start, the runner's input preparation), so it can add less than the
    copy takes with no bound broken, and an interval wholly below the floor reads ``UNBOUNDED_BELOW`` and is within
    the goal (``bounded`` false), never a method problem. ``within``/``charged_within``: the whole interval at most
    ``GOAL_X`` x the floor; ``x_floor``/``charged_x_floor`` a number only where the interval lies wholly above it."""
    floor = _floor_of(distance)
    by_point: dict[tuple, list[dict]] = {}
    for r in splits:
        key = (r["model"], r["context_tokens"], r["arm"])
        if r["context_tokens"] >= GOAL_MIN_TOKENS and r.get("critical_ms") is not None and floor.get(key):
            by_point.setdefault(key[:2], []).append(r)
    out = []
    for (model, n), rs in sorted(by_point.items()):
        best = min(rs, key=lambda r: r["critical_ms"])
        f = floor[(model, n, best["arm"])]
        row = {"model": model, "context_tokens": n, "path": best["arm"], "critical_ms": best["critical_ms"],
               "critical_ci_ms": best.get("critical_ci_ms"),
               "lookup_ms": best.get("lookup_ms"), "schedule_ms": best.get("schedule_ms"),
               "measure_ms": best.get("measure_ms"),
               "reference_at": best.get("reference_at"),
               "host_ms": best.get("host_ms"), "copy_call_ms": best.get("copy_call_ms"),
               "write_ids_ms": best.get("write_ids_ms"), "hook_ms": best.get("hook_ms"),
               "forward_wait_ms": best.get("forward_wait_ms"),
               "allocate_ms": best.get("allocate_ms"), "wait_at": best.get("wait_at"),
               "launched_by": best.get("launched_by"), "thread_lag_ms": best.get("thread_lag_ms"),
               "ids_packed_by": best.get("ids_packed_by"), "thread_pack_ms": best.get("thread_pack_ms"),
               "restore_ms": best.get("restore_ms"), "floor_ms": f,
               **goal_reading(best["critical_ms"], best.get("critical_ci_ms"), f, bounded=False)}
        charged = [(charged_ms(r), r) for r in rs if charged_ms(r) is not None]
        if charged:
            c_ms, c_best = min(charged, key=lambda cr: cr[0])
            c_floor = floor[(model, n, c_best["arm"])]
            c = goal_reading(c_ms, charged_ci_ms(c_best), c_floor, bounded=False)
            row.update(charged_path=c_best["arm"], charged_ms=c_ms, charged_ci_ms=charged_ci_ms(c_best),
                       charged_floor_ms=c_floor, charged_verdict=c["verdict"], charged_x_floor=c["x_floor"],
                       charged_within=c["within"])
        out.append(row)
    return out


LAUNCH_FREE_PARTS = ("lookup_s", "schedule_s", "measure_s", "before_copy_s", "write_ids_s", "after_copy_s", "hook_s",
                     "forward_wait_s")


def launch_free_table(rows: list[FollowUp], distance: list[dict]) -> list[dict]:
    """What each GPU-buffer restore would add to its step had its copy's launch cost the engine thread nothing,
    at every point of ``GOAL_MIN_TOKENS`` and more: per restore, ``critical`` less the launch's part of its copy
    call (``copy_call - write_ids``: the graph's launch, or for a launch handed to the thread its request), the
    median per path, and the least such path against its floor with the medians of the parts left
    (``LAUNCH_FREE_PARTS``). A bound on what any cheaper launch can win, from the same stamps as ``critical``;
    a point without a floor or without the parts is absent, never met.

    ``launch_free_ci_ms``: the 95% bootstrap interval of that median from the same restores, judged as
    ``critical_goal_table`` judges what a restore adds (``goal_reading``, ``bounded`` false: below the floor breaks no
    bound); ``within`` only where the whole interval is at most ``GOAL_X`` x the floor, ``x_floor`` a number only
    where it lies wholly above the floor."""
    floor = _floor_of(distance)
    left: dict[tuple, list[RestoreSplit]] = {}
    for r in usable(rows):
        sp = r.split or NO_SPLIT
        if (r.context_tokens >= GOAL_MIN_TOKENS and r.arm in GPUBUF_RESTORES
                and all(x is not None for x in (sp.critical_s, sp.copy_call_s, sp.write_ids_s))):
            left.setdefault((r.model, r.context_tokens, r.arm), []).append(sp)
    by_point: dict[tuple, list[tuple]] = {}
    for (model, n, arm), sps in left.items():
        if floor.get((model, n, arm)):
            free_s = [sp.critical_s - sp.copy_call_s + sp.write_ids_s for sp in sps]
            by_point.setdefault((model, n), []).append((1e3 * float(numpy.median(free_s)), arm, sps, free_s))
    out = []
    for (model, n), paths in sorted(by_point.items()):
        ms, arm, sps, free_s = min(paths, key=lambda p: p[0])
        f = floor[(model, n, arm)]
        ci = _median_ci_ms(free_s)
        parts = {_ms(k): round(1e3 * float(numpy.median(v)), 3)
                 for k in LAUNCH_FREE_PARTS if (v := [getattr(sp, k) for sp in sps if getattr(sp, k) is not None])}
        out.append({"model": model, "context_tokens": n, "path": arm, "n": len(sps), "launch_free_ms": round(ms, 3),
                    "launch_free_ci_ms": ci, "floor_ms": f, **goal_reading(ms, ci, f, bounded=False),
                    **parts})
    return out


def forward_step_table(rows: list[FollowUp]) -> list[dict]:
    """The follow-up's forward pass on the GPU-buffer engine, its own GPU span (``forward_step_s``: from its
    first attention layer, after a whole copy, to its end; ``kv.gpu_buffer_connector``), per restore path against the resident
    follow-up of the same engine: the median difference and its 95% bootstrap interval. The resident step is the
    control: a whole copy ends before the forward pass starts, so its difference should hold zero; a copy
    waited for layer by layer runs beside the forward pass, and its difference is its stalls plus what its
    memory traffic cost the forward pass's kernels (``charged_ms`` bounds that by the copy's span)."""
    spans: dict[tuple, list[float]] = {}
    for r in usable(rows):
        if r.forward_step_s is not None:
            spans.setdefault((r.model, r.context_tokens, r.arm), []).append(1e3 * r.forward_step_s)
    out = []
    for (model, n, arm), ms in sorted(spans.items()):
        resident = spans.get((model, n, RESIDENT_OF.get(arm, "")))
        if arm not in GPUBUF_RESTORES or not resident:
            continue
        diff, low, high = median_difference(ms, resident)
        out.append({"model": model, "context_tokens": n, "path": arm, "n": len(ms),
                    "forward_ms": round(float(numpy.median(ms)), 3),
                    "resident_forward_ms": round(float(numpy.median(resident)), 3),
                    "difference_ms": round(diff, 3), "difference_ci_ms": [round(low, 3), round(high, 3)]})
    return out


# (path, against): the layered copy against the resident follow-up and against the whole copy; the whole copy
# against the resident follow-up is the control (its copy ends before the forward pass starts)
FORWARD_CONTROL = ("gpubuf_retained", "gpubuf_resident")
FORWARD_PAIRS = (("gpubuf_layered", "gpubuf_resident"), ("gpubuf_layered", "gpubuf_retained"),
                 ("gpubuf_offthread", "gpubuf_resident"), ("gpubuf_offthread", "gpubuf_layered"), FORWARD_CONTROL)


def forward_step_pairs(rows: list[FollowUp]) -> list[dict]:
    """``forward_step_table``'s comparison pooled over the grid's points, paired by repeat: one repeat runs
    its arms back to back on one engine, so each (model, context, repeat) gives one difference of two
    forward passes. One pass's spread (about 1 ms on the H200 machine, set by the host launching it) hides
    a copy's cost at one point; pooled, the interval narrows with the number of pairs. The median of the
    paired differences and its 95% bootstrap interval, over every point (``min_tokens`` 0) and over the
    points of ``GOAL_MIN_TOKENS`` and more. A pooled median is a typical cost across shapes, not any
    one point's."""
    spans: dict[tuple, dict[str, float]] = {}
    for r in usable(rows):
        if r.forward_step_s is not None:
            spans.setdefault((r.model, r.context_tokens, r.repeat), {})[r.arm] = 1e3 * r.forward_step_s
    out = []
    for path, against in FORWARD_PAIRS:
        for least in (0, GOAL_MIN_TOKENS):
            keys = [k for k, v in sorted(spans.items()) if k[1] >= least and path in v and against in v]
            diffs = [spans[k][path] - spans[k][against] for k in keys]
            if len(diffs) < 2:
                continue
            median, low, high = median_of_differences(diffs)
            out.append({"path": path, "against": against, "min_tokens": least, "n": len(diffs),
                        "num_points": len({k[:2] for k in keys}), "median_ms": round(median, 3),
                        "median_ci_ms": [round(low, 3), round(high, 3)]})
    return out


def paths_in(table: list[dict]) -> list[str]:
    """The restore paths a table holds, in ``RESTORES`` order."""
    have = {r.get("arm", r.get("path")) for r in table}
    return [p for p in RESTORES if p in have]


def _short(x: float) -> str:
    """A speed-up bound in a heatmap cell: two decimals below 10, one from 10 (four columns stay apart)."""
    return f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}"


def nothing_measured(path_out, what: str, missing: str = "", title: str = ""):
    """A figure of text alone where a plot has nothing to draw: ``what`` is missing, and ``missing`` (the children's
    accounts, ``gaps.note``) says why; saved as the plot would have been, so the report's figure says so."""
    import matplotlib.pyplot as plt

    why = "\n".join(textwrap.wrap(missing, 100)) if missing else "(the tiers table names each child's status)"
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.16 * why.count("\n")))
    ax.axis("off")
    ax.text(0.5, 0.5, f"{what}\n{why}", ha="center", va="center", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    save_figure(fig, path_out, bbox_inches="tight")
    return fig


def heatmaps(table: list[dict], path_out, title: str = "", crossover: list[dict] | None = None, missing: str = "",
             wrong_kv: dict[str, str] | None = None):
    """One panel per restore path: log2(recompute / restore) over model shape x context length, a model's row of
    cells over one recompute arm (``_control``, the crossover table's), named in the panel's title; each cell
    names its speed-up and, from ``crossover`` (the crossover table), its 95% interval. With no restore path
    measured, a figure that says so and why (``missing``: ``gaps.note`` of the restore paths). ``wrong_kv``: per
    restore path whose restores the KV digest found other than the computed, what it found ("292 of 292"): its
    panel is hatched and its title says the speed-ups are a copy's time (4b9b's in-process panels read as restores
    in the figure while the verdict beside it said they were not, 7 Dec 2026)."""
    import matplotlib.pyplot as plt
    import numpy as np

    t = _lookup(table)
    intervals = {(r["model"], r["path"]): r for r in crossover or []}
    models = list(dict.fromkeys(r["model"] for r in table))
    lengths = sorted({r["context_tokens"] for r in table})
    # constrained layout places the suptitle above the panel titles (a plain suptitle overlapped them)
    paths = paths_in(table)
    if not paths:  # no restore tier measured a row: a figure that says so and why, not a crash
        return nothing_measured(path_out, "no restore path measured", missing, title)
    cols = min(len(paths), 3)
    rows_n = -(-len(paths) // cols)
    # one panel at least 6.4 in wide: at 4.2 its title ran over the colour bar's label and its intervals over the
    # cells' edges (7848's lmcache_mp panel)
    size = (max(4.2 * cols, 6.4), (0.6 * len(models) + 1.6) * rows_n + 0.3)
    fig, axes = plt.subplots(rows_n, cols, figsize=size, squeeze=False, sharey=True,
                             layout="constrained")  # one set of model labels per row of panels
    for ax in axes.flat[len(paths):]:
        ax.set_visible(False)
    for ax, path in zip(axes.flat, paths):
        grid = np.full((len(models), len(lengths)), np.nan)
        controls = {m: _control(t, m, path) for m in models}  # one per row of cells, as the crossover table's
        for i, m in enumerate(models):
            control = controls[m]
            for j, n in enumerate(lengths):
                if (m, n, path) in t and (m, n, control) in t:
                    grid[i, j] = np.log2(t[(m, n, control)]["ttft_ms"] / t[(m, n, path)]["ttft_ms"])
        im = ax.imshow(grid, cmap="RdBu", vmin=-3, vmax=3, aspect="auto")
        for i in range(len(models)):
            for j in range(len(lengths)):
                if not np.isnan(grid[i, j]):
                    ci = intervals.get((models[i], path), {}).get(f"speedup_ci@{lengths[j]}")
                    text = f"{2 ** grid[i, j]:.2f}x" + (f"\n[{_short(ci[0])}, {_short(ci[1])}]" if ci and None not in ci else "")
                    ax.text(j, i, text, ha="center", va="center", fontsize=8,
                            color="white" if abs(grid[i, j]) > 2 else "black")  # legible on the darkest cells
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
        ax.set_yticks(range(len(models)), models)
        # on two lines: "gpubuf_retained restore vs gpubuf_recompute" on one ran into its neighbour's (89ce's redraw)
        panel_title = f"{path} restore\nvs {_controls_named(controls, grid, models)}"
        if path in (wrong_kv or {}):
            # two short lines: on one it ran into the next panel's title
            panel_title += f"\nKV not as computed in {wrong_kv[path]}\n(a copy's time, not a restore's)"
            ax.add_patch(plt.Rectangle((-0.5, -0.5), len(lengths), len(models), fill=False, hatch="//",
                                       edgecolor="0.6", linewidth=0))
        ax.set(xlabel="context tokens", title=panel_title)
    fig.colorbar(im, ax=axes.ravel().tolist(), label="log2 speed-up (blue: restore wins)")
    if title:
        fig.suptitle(title, fontsize=9)
    save_figure(fig, path_out, bbox_inches="tight")
    return fig


def _controls_named(controls: dict[str, str], grid, models: list[str]) -> str:
    """The recompute arms a heatmap panel's cells are over: the controls of the models with a cell (a model without
    the path has a control by ``control_of``'s rule but no cell, and named none: a panel read "native_offload restore
    vs native_recompute / recompute" where only native_recompute was drawn); several, each with its models."""
    import numpy as np

    drawn = {m: controls[m] for i, m in enumerate(models) if not np.isnan(grid[i]).all()}
    names = sorted(set(drawn.values()))
    if len(names) == 1:
        return names[0]
    return " / ".join(f"{c} ({', '.join(m for m in models if drawn.get(m) == c)})" for c in names) or "none"


# the timeline's series in the floor plot: what, marker, line style, its value from a split row (None: not drawn)
# the restore span: the GPU buffer's timeline (restore_ms), vLLM's CPU tier's own load time (load_time_ms, the span
# ``restore_span`` takes for it; its rows have no restore_ms, so the notebook's "for the timed restores (GPU buffer,
# vLLM's CPU tier)" drew none for that tier: review finding, 6 Dec 2026, 458a)
TIMELINE_SERIES = (("restore span", "x", ":",
                    lambda r: r.get("restore_ms") if r.get("restore_ms") is not None else r.get("load_time_ms")),
                   ("added to the step", "+", "-.", lambda r: r.get("critical_ms")),
                   ("added, its copy charged", "1", (0, (3, 1, 1, 1, 1, 1)),
                    lambda r: charged_ms(r) if r.get("wait_at") == "layer" else None))


def label_log_axis(axis) -> None:
    """Plain numbers on a log axis, enough of them to read: 1-2-5 steps over a decade and more; within less than a
    decade, where log ticks would label one or two values ('10^1', '9x10^0'), evenly spaced plain ticks."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter, NullLocator

    low, high = axis.get_view_interval()
    if low > 0 and high / low < 10:
        axis.set_major_locator(MaxNLocator(nbins=5))
        axis.set_minor_locator(NullLocator())
    else:
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_minor_formatter(NullFormatter())
    # 3 significant figures below 1,000; whole numbers from there (".3g" wrote 1,000 as "1e+03": b43a's 7B disk cost)
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if abs(v) >= 1000 else f"{v:,.3g}"))


def floor_plot(floors: list[dict], path_out, splits: list[dict] | None = None, missing: str = ""):
    """Per model: each restore path's cost (first token above its engine's resident follow-up) and
    the transfer floor it was judged against (``judged_floor_ms``: the range timed around each point, a bar, where
    the run has one) against context length, the cost judged by ``floor_table``'s verdict: drawn with its 95%
    interval where that lies wholly above the floor, marked hollow on the floor where it reaches down to it, and
    otherwise (no cost measured, below the floor, no interval) named in a note under the figure, never drawn as a
    distance; with ``splits``, also each timed restore's own span
    (``split_table``'s median ``restore_ms``) and what it adds to its step (``critical_ms``), both free of
    the forward step's spread, and for a copy waited for by layer that sum with the copy charged (``charged_ms``).
    With no floor distance (no restore path measured), a figure that says so and why (``missing``)."""
    import matplotlib.pyplot as plt

    if not floors:  # no restore path measured (subplots of 0 columns raised ValueError: 060001-01f9's report stopped)
        return nothing_measured(path_out, "no restore path's cost against its floor: no restore path measured", missing)
    models = list(dict.fromkeys(r["model"] for r in floors))
    # one shape per GPU run: a panel wide enough to read its 4 lengths and 5 paths, whatever the count
    fig, axes = plt.subplots(1, len(models), figsize=(max(6.0, 3.6 * len(models)), 4), squeeze=False, sharey=True)
    undrawn: list[tuple[str, dict]] = []  # (path, floor_table row) whose cost has no distance to its floor
    for ax, m in zip(axes[0], models):
        drawn: dict[tuple, object] = {}  # a floor series already drawn (its values) -> its line
        for i, path in enumerate(paths_in(floors)):
            marker, color = "osd^v"[i % 5], f"C{i}"
            rs = [r for r in floors if r["model"] == m and r["path"] == path]
            xs = [r["context_tokens"] for r in rs]
            # a cost is drawn where its interval lies wholly above the floor (``floor_table``'s ratio range, x_floor),
            # with that interval; a cost at the floor is marked hollow on the floor; the rest (an interval holding 0,
            # below the floor, none) has no distance to draw and is named under the figure (issue 42)
            costs = [r["restore_cost_ms"] if r.get("x_floor") is not None else float("nan") for r in rs]
            if any(c == c for c in costs):  # no legend entry for a series with nothing drawn (the note names it)
                ax.plot(xs, costs, marker=marker, color=color, label=f"{path}: restore cost")
            above = [r for r in rs if r.get("x_floor") is not None and None not in (r.get("restore_cost_ci_ms") or [None])]
            if above:  # a LineCollection: the legend and the series' lines stay as they were
                ax.vlines([r["context_tokens"] for r in above], [r["restore_cost_ci_ms"][0] for r in above],
                          [r["restore_cost_ci_ms"][1] for r in above], color=color, lw=1)
            at = [r for r in rs if r.get("x_floor") is None and r.get("verdict") == AT_THE_FLOOR]
            if at:
                ax.plot([r["context_tokens"] for r in at], [judged_floor_ms(r)[1] for r in at], marker=marker,
                        ls="none", mfc="none", ms=9, color=color, label=f"{path}: cost at the floor")
            undrawn += [(path, r) for r in rs if r.get("x_floor") is None and r.get("verdict") != AT_THE_FLOOR]
            # the floor each verdict judged against: the range timed around the point where the run has one (a bar
            # from its min to its max, the line at its max), else the one timed at the run's start (issue 42: 9c33's
            # GPU buffer from disk at 16,384 read "below its floor" against the start's, 1.04-1.46x around the point)
            ranges = [judged_floor_ms(r) for r in rs]
            floor = tuple(zip(xs, (tuple(v) for v in ranges)))
            if floor in drawn:  # the same floor (dram and native_offload: both host->device) drawn once, named for both:
                # a second line on the first hid it (review finding, 6 Dec 2026: 458a's legend named a dram floor unseen)
                line = drawn[floor]
                line.set_label(line.get_label().replace(": transfer floor", f", {path}: transfer floor"))
            else:
                [drawn[floor]] = ax.plot(xs, [high for _, high in ranges], marker=marker, ls="--", color=color,
                                         alpha=0.5, label=f"{path}: transfer floor")
                spread = [(x, low, high) for x, (low, high) in zip(xs, ranges) if low < high]
                if spread:  # the range as a bar at each point (a shaded band cost the report a tenth more bytes)
                    ax.vlines(*zip(*spread), color=color, lw=4, alpha=0.35)
            for what, mark, style, value in TIMELINE_SERIES:
                points = sorted((r["context_tokens"], value(r)) for r in splits or []
                                if r["model"] == m and r["arm"] == path and value(r) is not None)
                if points:
                    ax.plot([n for n, _ in points], [v for _, v in points], marker=mark, ls=style, color=color,
                            label=f"{path}: {what} (timeline)")
        # which floors the panel's verdicts judged against, once for the panel (in each legend label they widened
        # the figure by a sixth)
        timed = [bool(r.get("point_floor_ms")) for r in floors if r["model"] == m]
        ax.set(xscale="log", yscale="log", xlabel="context tokens",
               title=f"{m}\nfloors timed " + ("around each point (bar: before to after)" if all(timed) else
                                               "at the run's start" if not any(timed) else
                                               "around each point where barred, else at the run's start"))
        ax.title.set_fontsize(9)
        lengths = sorted({r["context_tokens"] for r in floors if r["model"] == m})
        ax.set_xticks(lengths, [f"{n:,}" for n in lengths], fontsize=8)  # the grid's lengths, not log-scale minor labels
        ax.xaxis.set_minor_locator(plt.NullLocator())
    axes[0][0].set_ylabel("ms")
    label_log_axis(axes[0][0].yaxis)  # shared by the panels
    if undrawn:
        fig.text(0.01, -0.02, _undrawn_note(undrawn, len(models) > 1), fontsize=7, va="top")
    # every panel's series, each label once: a cost drawn in one model's panel alone (its interval above the floor
    # there only) still has its legend entry
    legend = {label: handle for ax in axes[0] for handle, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(list(legend.values()), list(legend), fontsize=8, loc="center left",
               bbox_to_anchor=(1.0, 0.5))  # outside: no line hidden
    fig.tight_layout()
    save_figure(fig, path_out, bbox_inches="tight")
    return fig


def judged_floor_ms(row: dict) -> list[float]:
    """The floor ``floor_table``'s verdict judged ``row`` against, [min, max] ms: the range timed around its point
    where the run timed one (``point_floor_ms``), else the run-start floor twice (``transfer_floor_ms``)."""
    return row.get("point_floor_ms") or [row["transfer_floor_ms"], row["transfer_floor_ms"]]


def _undrawn_note(undrawn: list[tuple[str, dict]], by_model: bool) -> str:
    """The floor plot's note of the costs it does not draw, grouped by their verdict: "costs not drawn (their 95%
    interval against the floor): no cost measured: gpubuf_layered at 1,024, 4,096; ..."."""
    groups: dict[str, dict[str, list[str]]] = {}
    for path, r in undrawn:
        where = f"{r['model']} {path}" if by_model else path
        verdict = r.get("verdict") or "no interval"
        groups.setdefault(verdict, {}).setdefault(where, []).append(f"{r['context_tokens']:,}")
    text = "costs not drawn (their 95% interval against the floor): " + "; ".join(
        f"{verdict}: " + ", ".join(f"{where} at {' / '.join(ns)}" for where, ns in paths.items())
        for verdict, paths in groups.items())
    return "\n".join(textwrap.wrap(text, 100))  # under the panels: at 150 it ran beneath the legend beside them


# -- the paired design (raw/pairs.jsonl, raw/point_floors.jsonl): each restore's own span and its first token against
# the resident follow-up next to it, judged against its floor measured before and after the point --
# the half-width goal judges every point of RESOLVE_MIN_TOKENS and more on RESOLVE_PATHS (params.goal_judges: a second stage runs
# only there) ...
RESOLVE_FRACTION = 0.1  # ... the span's 95% interval no wider than this fraction of the floor on either side
MP_PATHS = ("mp",)  # rows.jsonl's path of LMCache's server (its lookup is the L2 -> L1 load: part of a disk span)


def restore_span(row: FollowUp) -> tuple[float | None, str]:
    """One restore's own span in seconds and where it comes from: the tier's timeline (the GPU buffer: CUDA events
    around its copy into vLLM's blocks, host stamps on the CPU build; vLLM's CPU tier: its own load time), else
    LMCache's worker-side load (``start_load_kv``: CUDA events around it where recorded, ``lmcache.probes``, else its
    host stamps; on the MP path its asynchronous load's span to the report of its end where recorded, ``load_wall_s``,
    and a disk restore's lookup, which holds the server's disk read, is added). None where the row recorded none."""
    split, comp = row.split or NO_SPLIT, row.components
    if row.arm in GPUBUF_RESTORES:
        return split.restore_s, "tier timeline (restore_s)"
    if row.arm == "native_offload":
        return split.load_time_s, "vLLM's load time (load_time_s)"
    gpu = comp.load_gpu_s  # CUDA events around start_load_kv (runs before them have host stamps only)
    load = gpu if gpu is not None else comp.load_s
    how = "CUDA events around start_load_kv (load_gpu_s)" if gpu is not None else "start_load_kv (host stamps, load_s)"
    if (row.path in MP_PATHS or row.tier == "lmcache_mp") and comp.load_wall_s is not None:
        # NOTE: on CUDA the MP connector's load is LMCache-driven (0.5.3 and 0.5.6): start_load_kv only submits the
        # retrieve and the server copies over CUDA IPC on its own stream, so events around start_load_kv time the
        # submission; the load ends where the worker's get_finished reports it (``lmcache.probes``)
        load, how = comp.load_wall_s, "start_load_kv to get_finished reporting the retrieve (host stamps, load_wall_s)"
    if load is None:
        return None, "no load stamped"
    if row.path in MP_PATHS and row.arm == "disk":
        wall = comp.lookup_wall_s
        return (None if wall is None else load + wall), f"lookup_wall_s (host stamps) + {how}"
    return load, how


def floors_by_point(point_floors: list[PointFloors]) -> dict[tuple, list[PointFloors]]:
    """The floors measured around each point, by (model, context tokens, tier): ``floor_range_ms``'s input."""
    out: dict[tuple, list[PointFloors]] = {}
    for f in point_floors:
        out.setdefault((f.model, f.context_tokens, f.tier), []).append(f)
    return out


def floor_range_ms(path: str, point_floors: list[PointFloors], how: str | None = None) -> list[float] | None:
    """[min, max] in ms of ``path``'s floor (``FLOOR_OF``: a sum or the larger of its media; ``how`` overrides which)
    over the floors measured around one point (before and after it: each measurement's median); None where a medium
    was not measured. Each medium's floor is the faster of its two measurements (the tier's chunks at
    FLOOR_QUEUE_DEPTH, and saturated where recorded): the least time this machine was seen to move those bytes."""
    how_of, names = FLOOR_OF[path]
    how = how or how_of
    values = []
    for f in point_floors:
        kinds, saturated = f.floors or {}, f.saturated or {}
        if not all(kinds.get(k) for k in names):
            continue
        parts = [min(m["median_s"] for m in (kinds[k], saturated.get(k)) if m) for k in names]
        values.append(1e3 * (sum(parts) if how == "sum" else max(parts)))
    return [round(min(values), 4), round(max(values), 4)] if values else None


AT_THE_FLOOR = "at the floor"  # floor_verdict's word for an interval that reaches down into the floor's range


def floor_verdict(low: float, high: float, floor_ms: list[float] | None, bound: bool = True,
                  below: str | None = None) -> str:
    """A cost's 95% interval [low, high] (ms) against its floor's range [min, max]: ``no cost measured`` where the
    interval holds 0 (never "faster"); ``below the resident follow-up`` where it lies wholly below 0 (a method problem,
    not a result); ``below its floor`` where it lies wholly below the floor's range (a physical limit broken: a
    method problem, and section 21's strict floor check fails it); ``at the floor`` where it reaches down into the
    floor's range (the cost cannot be told from the floor: never a ratio below 1); else ``x.xx-y.yy x its floor``
    (low over the floor's max, high over its min). ``unresolved`` where there was no interval (fewer than two
    restores) or no floor. Without a device (``bound`` false: on the CPU the floors are a host memcpy and a disk read
    timed beside the engine's threads, no physical bound, and the strict floor check is skipped) a cost below the
    floor says so and judges nothing. ``below``, where given, is the verdict for an interval wholly below the floor's
    range of a quantity the floor does not bound (``UNBOUNDED_BELOW``: what a restore adds to its step, its copy
    overlapping host work), neither a method problem nor unjudged."""
    if low != low or high != high:
        return "unresolved (fewer than two restores)"
    if low <= 0 <= high:
        return "no cost measured"
    if high < 0:
        return "below the resident follow-up (a method problem, not a result)"
    if not floor_ms:
        return "unresolved (no floor measured)"
    if high < floor_ms[0]:
        if below is not None:
            return below
        return ("below its floor (a method problem, not a result)" if bound
                else "below its timed floor (on the CPU no physical bound: not judged)")
    if low <= floor_ms[1]:
        return AT_THE_FLOOR
    return f"{low / floor_ms[1]:.2f}\u2013{high / floor_ms[0]:.2f}\u00d7 its floor"


def pairs_of(pairs: list[PairRow]) -> dict[tuple, dict[int, dict[str, PairRow]]]:
    """Per (model, context tokens, restore path): pair index -> role ("restore", "resident") -> its ok row."""
    out: dict[tuple, dict[int, dict[str, PairRow]]] = {}
    for r in usable(pairs):
        out.setdefault((r.model, r.context_tokens, r.pair_arm), {}).setdefault(r.pair, {})[r.role] = r
    return out


RESOLUTION_KEYS = ("model", "context_tokens", "path")
# restore_resolution's columns as a reader takes them, one table each (46 columns in one table ran wider than a page
# in 0248's report): the verdicts first, then what each verdict rests on
RESOLUTION_VIEWS = {
    "Verdicts: each restore's span and paired first token against the floor's range": (
        "num_restores", "span_ms", "span_ci_ms", "floor_ms", "span_verdict", "ttft_difference_ms",
        "ttft_difference_ci_ms", "ttft_verdict", "half_width_x_floor", "resolved", "restores_to_resolve"),
    "Streaks: the restores' order, and the intervals widened for it": (
        "span_source", "num_pairs", "span_half_width_ms", "span_lag1", "span_half_width_serial_ms", "span_ci_serial_ms",
        "ttft_difference_lag1", "ttft_difference_ci_serial_ms", "resident_ttft_lag1", "span_resident_corr",
        "span_resident_corr_ci", "span_resident_corr_n_eff"),
    "Floors: the measurements around the point, the slower medium alone, the copy timed before each restore": (
        "num_floor_measurements", "floor_overlapped_ms", "span_verdict_overlapped", "num_pair_floors", "pair_floor_ms",
        "pair_floor_lag1", "span_x_pair_floor", "span_x_pair_floor_ci", "num_below_pair_floor", "below_pair_floor_span_ms",
        "below_pair_floor_ms", "pair_floor_memcpy_ms", "pair_floor_uva_read_ms"),
    "The forward pass and the host's path to it, in the same pairs": (
        "forward_difference_ms", "forward_difference_ci_ms", "num_forward_pairs", "host_path_difference_ms",
        "host_path_difference_ci_ms", "num_host_path_pairs", "to_forward_ms", "to_forward_ci_ms", "num_to_forward",
        "num_ended_before_forward"),
}


def resolution_views(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """``rows`` (``resolution_table``) split into ``RESOLUTION_VIEWS``' tables, each led by ``RESOLUTION_KEYS``; a
    table whose columns no row holds is left out, and a column no view names (a later one) goes to a last table of
    its own, so every column of every row is shown once."""
    named = set(RESOLUTION_KEYS).union(*RESOLUTION_VIEWS.values())
    rest = tuple(dict.fromkeys(k for r in rows for k in r if k not in named))
    views = {**RESOLUTION_VIEWS, **({"Other columns": rest} if rest else {})}
    out = []
    for title, columns in views.items():
        held = [c for c in columns if any(r.get(c) is not None for r in rows)]
        if held:
            out.append((title, [{k: r.get(k) for k in (*RESOLUTION_KEYS, *held)} for r in rows]))
    return out


def resolution_table(pairs: list[PairRow], point_floors: list[PointFloors], bound: bool = True) -> list[dict]:
    """Per (model, context, restore path) of the paired design: the restore's own span (``restore_span``) per
    restore, its median and 95% bootstrap interval; the first token's paired difference (the restore less the
    resident follow-up run next to it on the same engine), median and 95% interval; the path's floor as a range over
    its measurements before and after the point; each judged by ``floor_verdict``; and the span's interval half-width
    against the floor (``RESOLVE_FRACTION``: met where the half-width is at most that share of the floor's min).

    The bootstrap treats the restores as independent. ``span_lag1`` is the spans' lag-1 autocorrelation in the order
    the pairs ran; where it is above white noise's bound (a streak of slow restores, then a streak of fast ones),
    ``span_half_width_serial_ms`` is the half-width widened by ``intervals.serial_inflation``, else the same, and
    ``half_width_x_floor`` and ``resolved`` judge that one. The verdicts against the floor judge the intervals widened
    the same way (``widened``: ``span_ci_serial_ms``, and ``ttft_difference_ci_serial_ms`` by the paired
    differences' own ``ttft_difference_lag1``), where they judged the bootstrap's own (review finding, 6 Dec 2026:
    a47e's DRAM span read "1.56-1.61x its floor" from [13.437, 13.749] ms beside the sentence that this interval is
    too narrow; widened, 1.55-1.64x). The strict floor check (``checks.PAIRED_CHECKS``) stays on the bootstrap's own
    interval: a restore below its floor is a method problem, and the narrower interval finds more of them.
    ``bound``: whether the floors are physical bounds (a device moved the bytes; ``floor_verdict``).
    Whether such streaks are the tier's or the whole engine's:
    ``resident_ttft_lag1``, the resident follow-ups' first tokens' lag-1 autocorrelation in the same order (they restore
    nothing), and ``span_resident_corr`` with its 95% interval, Pearson's r of each restore's span with the resident
    follow-up of its pair (on the H200 and the H100, 5 Dec 2026, r 0.4-0.9 where the spans ran in streaks), the
    interval drawn from ``span_resident_corr_n_eff`` pairs, fewer than measured where both series ran in streaks
    (``intervals.correlation``).

    A path whose floor is the sum of two media (LMCache's disk: the read, then the copy into vLLM) also gets that floor
    as a pipeline overlapping them would meet it, the slower medium alone (``floor_overlapped_ms``), and the span's
    verdict against it (``span_verdict_overlapped``): a measured line beside the strict one, which stays the verdict
    and the check's, so a restore below the sum shows whether it overlapped its media or beat the link.

    Where the restores carry the copy floor timed right before each (``pair_floor_s``: memory paths, from 5 Dec 2026),
    the row adds that floor's median and lag-1 autocorrelation and each restore's span over its own floor, median and
    95% interval (``span_x_pair_floor``): a streak the link causes slows both and leaves the ratio where it was; and
    how many restores spanned less than the fastest of those floors (``below_pair_floor``: ``num_below_pair_floor``, None
    where no restore carries that floor). Where
    that floor was timed several ways (runs from 5 Dec 2026, 15:00 UTC: ``memcpy`` and ``uva_read``, the floor their
    fastest), each way's median is ``pair_floor_<way>_ms``.

    Where the pairs record both follow-ups' forward pass (``forward_step_s``: rows of the GPU buffer's engine), the
    row adds that pass's paired difference in the same pairs the first token's difference comes from:
    ``forward_difference_ms``, the median of the restore's less its resident partner's over the ``num_forward_pairs``
    pairs where both record it, and ``forward_difference_ci_ms``, its 95% interval as ``ttft_difference_ci_ms`` has
    its own; a row whose pairs record none (LMCache's paths, vLLM's CPU tier) has none of the three (review finding,
    6 Dec 2026: b298's summary set the grid's ``forward_steps``, -0.57 ms at 32,512 tokens, beside a paired first
    token whose own pairs' forward passes differed by -0.22 ms). Where both follow-ups of a pair also record the
    host's path to that pass's first attention layer (``forward_to_first_layer_s``: from the step's
    ``bind_connector_metadata``, where vLLM starts a step's synchronous loads, a resident step stamped at the same
    point; GPU-buffer rows from 6 Dec 2026), the row adds ``host_path_difference_ms``, the median of the restore's less
    its resident partner's over the ``num_host_path_pairs`` pairs where both record it, and
    ``host_path_difference_ci_ms``, its 95% interval the same way: how much longer the restored step's host took to
    reach the forward pass, which the first token's difference includes; a row whose pairs record none has none of
    the three (6 Dec 2026: b298's 7B GPU buffer reached that layer 0.5-0.7 ms after its copy ended at every context,
    below, while nothing recorded how much of the path the resident step took as well).

    Where the restores stamp where the host stood when their copy ended (``split.to_forward_s``: the host's stamp at
    the forward pass's first attention layer less the copy's end, on the GPU's clock through the step's reference),
    the row adds its median and 95% interval (``to_forward_ms``, ``to_forward_ci_ms``) and how many of the
    ``num_to_forward`` restores had their copy end before the host reached that layer (``num_ended_before_forward``,
    ``to_forward_s`` > 0). A copy that ends before the host reaches the forward pass ran beside host work of the step;
    a gap that stays the same while the copy grows from context to context says the host waited for the copy before
    it reached that layer (6 Dec 2026: b298's 7B GPU buffer, 0.49-0.72 ms at every context while the copy grew from
    0.05 to 1.3 ms, beside first tokens below the copy's floor at 16,384 and 32,512 tokens)."""
    floors = floors_by_point(point_floors)
    out = []
    for (model, n, path), by_pair in sorted(pairs_of(pairs).items()):
        whole = [p for _, p in sorted(by_pair.items()) if "restore" in p and "resident" in p]
        restores = [p["restore"] for _, p in sorted(by_pair.items()) if "restore" in p]
        spans = [restore_span(r) for r in restores]
        span_of = {id(r): s for r, (s, _) in zip(restores, spans)}
        span_ms = [1e3 * s for s, _ in spans if s is not None]
        diffs = [1e3 * (p["restore"].ttft_s - p["resident"].ttft_s) for p in whole]
        floor = floor_range_ms(path, floors.get((model, n, TIER_OF[path]), []))
        s_med, s_low, s_high = median_of_differences(span_ms) if span_ms else (float("nan"),) * 3
        d_med, d_low, d_high = median_of_differences(diffs) if diffs else (float("nan"),) * 3
        half = (s_high - s_low) / 2 if s_high == s_high else None
        lag1 = lag1_autocorrelation(span_ms)  # in the order the pairs ran
        inflation = serial_inflation(lag1, len(span_ms))  # infinite (r >= 1): no half-width bounds the span
        serial_half = half * inflation if half is not None and inflation != float("inf") else None
        # the verdicts against the floor judge the intervals widened for the streaks each series ran in
        s_wide = widened(s_med, s_low, s_high, inflation)
        d_lag1 = lag1_autocorrelation(diffs)
        d_wide = widened(d_med, d_low, d_high, serial_inflation(d_lag1, len(diffs)))
        # the engine's own streaks: the resident follow-ups (which restore nothing) in the order the pairs ran, and how
        # closely each restore's span follows the resident run next to it
        beside_resident = [(1e3 * span_of[id(p["restore"])], 1e3 * p["resident"].ttft_s) for p in whole
                           if span_of[id(p["restore"])] is not None]
        follows = correlation(*zip(*beside_resident)) if beside_resident else None
        row = {"model": model, "context_tokens": n, "path": path, "num_restores": len(restores), "num_pairs": len(whole),
               "span_source": "/".join(sorted({src for s, src in spans if s is not None})) or None,
               "span_ms": _round(s_med), "span_ci_ms": [_round(s_low), _round(s_high)],
               "span_ci_serial_ms": _bounds(s_wide),
               "floor_ms": floor, "num_floor_measurements": len(floors.get((model, n, TIER_OF[path]), [])),
               "span_verdict": _judged(s_wide, floor, bound),
               "ttft_difference_ms": _round(d_med), "ttft_difference_ci_ms": [_round(d_low), _round(d_high)],
               "ttft_difference_lag1": _round(d_lag1, 3), "ttft_difference_ci_serial_ms": _bounds(d_wide),
               "ttft_verdict": _judged(d_wide, floor, bound),
               "span_half_width_ms": _round(half), "span_lag1": _round(lag1, 3),
               "span_half_width_serial_ms": _round(serial_half),
               "resident_ttft_lag1": _round(lag1_autocorrelation([p["resident"].ttft_s for p in whole]), 3),
               "span_resident_corr": _round(follows[0], 3) if follows else None,
               "span_resident_corr_ci": [_round(follows[1], 3), _round(follows[2], 3)] if follows else [None, None],
               "span_resident_corr_n_eff": _round(follows[3], 1) if follows else None,
               "half_width_x_floor": (round(serial_half / floor[0], 4) if serial_half is not None and floor and floor[0] > 0
                                      else None)}
        row["resolved"] = (row["half_width_x_floor"] is not None and row["half_width_x_floor"] <= RESOLVE_FRACTION)
        # an unresolved point: the restores it would need at the spread (and streaks) measured; issue 42: say how many
        row["restores_to_resolve"] = (None if row["resolved"] or not floor else
                                      restores_needed(serial_half, len(span_ms), floor[0]))
        how, media = FLOOR_OF[path]
        if how == "sum" and len(media) > 1:  # the strict floor (no overlap) stays the verdict; beside it, a pipeline's
            overlapped = floor_range_ms(path, floors.get((model, n, TIER_OF[path]), []), how="max")
            row.update(floor_overlapped_ms=overlapped, span_verdict_overlapped=floor_verdict(s_low, s_high, overlapped, bound))
        beside = [(s, r.pair_floor_s) for (s, _), r in zip(spans, restores) if s is not None and r.pair_floor_s]
        row.update(below_pair_floor(beside))
        if beside:  # runs from 5 Dec 2026: each restore over the copy floor timed right before it
            ratios = [s / f for s, f in beside]
            x_med, x_low, x_high = median_of_differences(ratios)
            row.update(num_pair_floors=len(beside), pair_floor_ms=_round(1e3 * float(numpy.median([f for _, f in beside]))),
                       pair_floor_lag1=_round(lag1_autocorrelation([f for _, f in beside]), 3),
                       span_x_pair_floor=_round(x_med), span_x_pair_floor_ci=[_round(x_low), _round(x_high)])
            by_way: dict[str, list[float]] = {}
            for r in restores:  # runs from 5 Dec 2026, 15:00 UTC: each way's median (the floor is the fastest)
                for way, seconds in (r.pair_floor_ways or {}).items():
                    by_way.setdefault(way, []).append(seconds)
            row.update({f"pair_floor_{way}_ms": _round(1e3 * float(numpy.median(v))) for way, v in sorted(by_way.items())})
        # the forward passes of the very pairs whose first tokens the verdict judges (not the grid's repeats), and the
        # host's path from where vLLM starts the step's loads to the same pass's first layer
        row.update(_paired_difference(whole, "forward_step_s", "forward_difference", "num_forward_pairs"))
        row.update(_paired_difference(whole, "forward_to_first_layer_s", "host_path_difference", "num_host_path_pairs"))
        # where the host stood when the copy ended: its stamp at the forward pass's first attention layer less the
        # copy's end on the GPU's clock (``to_forward_s``, GPU-buffer restores since 3 Dec 2026)
        reached = [1e3 * r.split.to_forward_s for r in restores if r.split is not None and r.split.to_forward_s is not None]
        if reached:
            t_med, t_low, t_high = median_of_differences(reached)
            row.update(to_forward_ms=_round(t_med), to_forward_ci_ms=[_round(t_low), _round(t_high)],
                       num_to_forward=len(reached), num_ended_before_forward=sum(1 for t in reached if t > 0))
        out.append(row)
    return out


# A restore's span counts as below the copy floor under this share of the fastest copy of the same bytes timed beside
# the point's restores (``PairRow.pair_floor_s``, one before each): each is one copy timed once, host stamps around two
# synchronizations, so it carries their overhead and a single timing's jitter; a span within 5% of the fastest is not
# told apart from it, one under 95% of it is not that jitter.
PAIR_FLOOR_TOLERANCE = 0.95


def below_pair_floor(beside: list[tuple[float, float]]) -> dict:
    """Of (span, copy floor timed right before it) in seconds, one per restore of one point: ``num_below_pair_floor``,
    how many spans lie under ``PAIR_FLOOR_TOLERANCE`` of the fastest of those floors (the least time this machine was
    seen to copy those bytes beside the point), those restores' median span in ms (``below_pair_floor_span_ms``) and
    that fastest floor in ms (``below_pair_floor_ms``). A span below the fastest copy of the same bytes is no restore of
    them all: either the span misses part of the transfer or fewer bytes moved (6 Dec 2026: bbf8's 7B DRAM at 16,384
    tokens, 939 MB over PCIe, 14 ms against 17.0 ms). The fastest, not each restore's own: a span under one floor timing
    that ran slow is not (bbf8's 7B DRAM at 32,512: 47.8 ms under a 52.0 ms timing, where the point's copies took
    33.9 ms). All None where no restore has such a floor (runs before 5 Dec 2026, disk paths); the median and the floor
    None where none lies below."""
    fastest = min((f for _, f in beside), default=None)
    below = [s for s, _ in beside if s < PAIR_FLOOR_TOLERANCE * fastest] if beside else []
    return {"num_below_pair_floor": len(below) if beside else None,
            "below_pair_floor_span_ms": _round(1e3 * float(numpy.median(below))) if below else None,
            "below_pair_floor_ms": _round(1e3 * fastest) if below else None}


def _paired_difference(whole: list[dict], field: str, name: str, count: str) -> dict:
    """The restore's ``field`` less its resident partner's, in ms, over the pairs where both record it: ``<name>_ms``
    (the median), ``<name>_ci_ms`` (its 95% bootstrap interval) and ``count`` (the pairs); empty where none does."""
    diffs = [1e3 * (getattr(p["restore"], field) - getattr(p["resident"], field)) for p in whole
             if getattr(p["restore"], field) is not None and getattr(p["resident"], field) is not None]
    if not diffs:
        return {}
    median, low, high = median_of_differences(diffs)
    return {f"{name}_ms": _round(median), f"{name}_ci_ms": [_round(low), _round(high)], count: len(diffs)}


def widened(median: float, low: float, high: float, inflation: float) -> tuple[float, float]:
    """A bootstrap interval [low, high] of a median widened by ``inflation`` (``intervals.serial_inflation``) on each
    side of the median, so a skewed interval stays skewed: the interval the floor verdicts judge where the series ran
    in streaks (an interval that treats streaky values as independent is too narrow). (-inf, inf) where the inflation
    is infinite (no half-width bounds it); NaNs stay NaNs (no interval)."""
    if inflation == float("inf"):
        return float("-inf"), float("inf")
    return median - (median - low) * inflation, median + (high - median) * inflation


def _judged(interval: tuple[float, float], floor: list[float] | None, bound: bool) -> str:
    """``floor_verdict`` of a widened interval; one that no half-width bounds judges nothing."""
    low, high = interval
    if low == float("-inf") or high == float("inf"):
        return "unresolved (the values ran in one streak: no interval bounds them)"
    return floor_verdict(low, high, floor, bound)


def _bounds(interval: tuple[float, float]) -> list[float | None]:
    """A widened interval as results.json holds it: rounded, an unbounded end (or no interval) None."""
    return [None if x in (float("inf"), float("-inf")) else _round(x) for x in interval]


def _round(v: float | None, digits: int = 4) -> float | None:
    return None if v is None or v != v else round(float(v), digits)


def restores_needed(half_width_ms: float, n: int, floor_ms: float, fraction: float = RESOLVE_FRACTION) -> int | None:
    """Restores for a span interval half-width of ``fraction`` of ``floor_ms``, from one measured at ``n`` restores:
    a median's interval narrows as 1/sqrt(n), so n (half-width / target)^2, at least 2 (fewer than n where it is
    already met: the least that would have met it)."""
    if not half_width_ms or half_width_ms != half_width_ms or not floor_ms or n < 2:
        return None
    return max(2, math.ceil(n * (half_width_ms / (fraction * floor_ms)) ** 2))


# -- the two-stage design (issue 42): a memory path's pilot of NUM_RESTORES pairs, then, where it leaves the point
# unresolved, the pairs its own spread asks for, up to MAX_RESTORES --
PLAN_REASONS = {"off": "MAX_RESTORES=0: the pilot's count is the point's",
                "resolved": "the pilot resolved the span against the floor measured before the point",
                "extended": "unresolved; the restores the pilot's spread asks for are within MAX_RESTORES: run the rest",
                "over_cap": "unresolved; the restores the pilot's spread asks for exceed MAX_RESTORES: not run",
                "over_time": "unresolved, and the restores the pilot's spread asks for are within MAX_RESTORES, but the "
                             "second stage (at the pilot's seconds per pair) and the rest of the child (at its pace so "
                             "far) would not end within CHILD_TIMEOUT_S, past which the child is killed and every "
                             "figure it measured lost: not run (experiment.stage_fits)",
                "no_estimate": "unresolved, and the pilot gives no count (no floor, fewer than two spans, or one streak)",
                "no_goal": "a point the half-width goal does not judge (under RESOLVE_MIN_TOKENS, or a path outside "
                           "RESOLVE_PATHS): the pilot's count stands, its estimate recorded"}


def pair_plan(pilot: list[PairRow], before: list[PointFloors], num_pilot: int, max_restores: int,
              bound: bool = True) -> dict:
    """How many pairs one (model, context, memory restore path) runs in all, from its pilot: its first ``num_pilot``
    pairs (``pilot``, this point and path only) against the floor measured ``before`` the point, judged by the report's
    own estimator (``resolution_table``: the bootstrap half-width, widened for streaks, against RESOLVE_FRACTION of the
    floor's min). Where the pilot leaves the span unresolved and the restores its spread asks for
    (``restores_to_resolve``, ``restores_needed``) are at most ``max_restores``, the point runs that many in all (a
    second stage of ``num_pairs_planned - num_pilot`` pairs, Stein's two-stage design); otherwise the pilot's
    ``num_pilot`` stand. Only where the goal judges the point (``RESOLVE_MIN_TOKENS`` and more, ``RESOLVE_PATHS``):
    elsewhere a second stage would spend device time on a figure no check asks to resolve (``no_goal``).
    ``reason``: one of ``PLAN_REASONS``.

    Invariant: a function of the pilot's pairs and the floor before the point alone, so ``checks`` recomputes it from
    raw/pairs.jsonl (the first ``num_pilot`` pairs) and raw/point_floors.jsonl ("before").

    Caveat: the report's interval pools both stages. With the count chosen from the pilot's own spread (a pilot that
    happened to scatter little stops early, one that scattered much goes on), the pooled interval's coverage is
    approximately, not exactly, 95%; and the final verdict judges against the floor before and after the point, whose
    min can only be lower, so a point the pilot called resolved can still read unresolved."""
    rows = resolution_table(pilot, before, bound)
    row = rows[0] if len(rows) == 1 else {}
    needed = row.get("restores_to_resolve")
    judged = bool(pilot) and goal_judges(pilot[0].pair_arm, pilot[0].context_tokens)  # params.staged's points too
    if max_restores == 0:
        reason = "off"
    elif not judged:
        reason = "no_goal"
    elif row.get("resolved"):
        reason = "resolved"
    elif needed is None:
        reason = "no_estimate"
    else:
        reason = "extended" if needed <= max_restores else "over_cap"
    return {"num_pilot": num_pilot, "max_restores": max_restores,
            "pilot_half_width_x_floor": row.get("half_width_x_floor"), "pilot_floor_ms": row.get("floor_ms"),
            "restores_to_resolve": needed,
            "num_pairs_planned": max(needed, num_pilot) if reason == "extended" else num_pilot, "reason": reason}
