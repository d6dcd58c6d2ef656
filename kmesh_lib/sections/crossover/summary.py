"""Section 21 for people: headline figures, the closing answer, the public aggregates.

Every figure is recomputed from ``raw/rows.jsonl`` by ``tables.recomputed_tables`` (the declared tables
``kmesh verify`` and ``checks`` compare with results.json); the physical floors are the ones the run recorded.
"""
from __future__ import annotations

import numpy

from kmesh_lib.base.checks import verdict as checks_verdict
from kmesh_lib.base.intervals import white_noise_bound
from kmesh_lib.base.public import MAX_STRING_CHARS, MAX_VERDICT_CHARS
from kmesh_lib.base.records import RunFiles, recorded_packages
from kmesh_lib.sections.crossover import gaps, report
from kmesh_lib.sections.crossover.arms import RESIDENT_OF, RESIDENT_OF_TIER, TIER_OF, control_of, measured_at
from kmesh_lib.sections.crossover.captures import GridRow
from kmesh_lib.sections.crossover.checks import all_followups, checks, copied_whole, uncompared_restores
from kmesh_lib.sections.crossover.tables import recomputed_tables

LABEL = {"dram": "DRAM", "disk": "disk", "gpubuf_retained": "GPU-buffer (retained)",
         "gpubuf_layered": "GPU-buffer (retained, layer waits)",
         "gpubuf_offthread": "GPU-buffer (retained, layer waits, launched off the engine thread)",
         "gpubuf_disk": "GPU-buffer from disk",
         "native_offload": "vLLM CPU-tier", "lmcache_mp": "LMCache server (MP, DRAM)"}
NEAR_FLOOR = 2.0  # a restore within this factor of bytes / floor bandwidth is bound by the medium, not the software


def _span(values) -> str:
    values = list(values)
    lo, hi = min(values), max(values)
    return f"{lo}" if lo == hi else f"{lo}\u2013{hi}"


def _n(tokens: int) -> str:
    return f"{tokens:,}"


def _speedups(row: dict) -> dict[int, float]:
    return {int(k.split("@")[1]): v for k, v in row.items() if k.startswith("speedup@")}


def _has_interval(row: dict, n: int) -> bool:
    """Whether the crossover row holds a speed-up interval at ``n`` tokens (runs of one repeat have none)."""
    return (row.get(f"speedup_ci@{n}") or [None])[0] is not None


def _speedup(row: dict, n: int, digits: int = 2) -> str:
    """The speed-up at ``n`` tokens with its 95% interval where the table has one: ``4.08× [3.95, 4.21]``."""
    interval = ""
    if _has_interval(row, n):
        low, high = row[f"speedup_ci@{n}"]
        interval = f" [{low:.{digits}f}, {high:.{digits}f}]"
    return f"{row[f'speedup@{n}']:.{digits}f}\u00d7{interval}"


def _starts(row: dict, bold: bool = False) -> tuple[str, str]:
    """Where a winning path's crossover lies on the run's grid, and what that grid leaves open: a win at the grid's
    shortest length says nothing of shorter ones (('at 16,384 tokens', 'the only length measured'), ('from 1,024
    tokens', 'the shortest measured'), ('from 4,096 tokens', ''))."""
    lengths, point = sorted(_speedups(row)), row["crossover_tokens"]
    mark = "**" if bold else ""
    if len(lengths) == 1:
        return f"at {mark}{_n(point)} tokens{mark}", "the only length measured"
    return f"from {mark}{_n(point)} tokens{mark}", "the shortest measured" if point == lengths[0] else ""


def _noted(phrase: tuple[str, str]) -> str:
    where, note = phrase
    return f"{where} ({note})" if note else where


def _control_named(row: dict) -> str:
    """Which recompute a crossover row's speed-ups are over, where the path is not on the LMCache engine (whose own
    ``recompute`` is the only one it has): "over its own engine's recompute; " or "over the LMCache engine's
    recompute; ", to open a parenthesis; a row from before the ``control`` column was over the LMCache engine's."""
    if TIER_OF[row["path"]] == "lmcache":
        return ""
    return f"over {'its own' if _own_control(row) else 'the LMCache'} engine's recompute; "


def path_phrase(row: dict) -> str:
    """Where one restore path beats recompute for one model, in the run's own numbers, over which recompute: the
    speed-up at the crossover, at the length below it (with its interval, and why it is no win where its median is
    above 1: the interval reaches 1), at the longest, and any win below the crossover that a later length's loss cut
    off (review finding, 6 Dec 2026: 458a's DRAM read "from 16,384 tokens (1.13x there, 1.06x at 4,096)" with a win
    at 1,024, 1.27x [1.10, 1.77], unsaid, and 1.06x reading as a win; its interval [0.99, 1.44] reaches 1)."""
    speed = _speedups(row)
    lengths = sorted(speed)
    point = row["crossover_tokens"]
    if point is None:
        return (f"{LABEL[row['path']]} restore never does up to {_n(lengths[-1])} tokens "
                f"({_control_named(row)}{speed[lengths[-1]]:.2f}\u00d7 there)")
    before = [n for n in lengths if n < point]
    where, note = _starts(row, bold=True)
    below = ""
    if before:
        n = before[-1]
        below = f", {_speedup(row, n)} at {_n(n)}" + (
            ", whose interval reaches 1" if _has_interval(row, n) and speed[n] > 1.0 else "")
    earlier = [n for n in before[:-1] if report.is_win(row[f"speedup@{n}"], row.get(f"speedup_ci@{n}"))]
    return (f"{LABEL[row['path']]} restore beats recompute {where} ({_control_named(row)}{note + '; ' if note else ''}"
            f"{_speedup(row, point)} there" + below
            + (f", {_speedup(row, lengths[-1])} at {_n(lengths[-1])}" if lengths[-1] != point else "")
            + ("; faster at " + ", ".join(f"{_n(n)} too, {_speedup(row, n)}" for n in earlier) + ", but not at every "
               "length above it" if earlier else "") + ")")


def _savings(tables: dict, model: str, paths: dict[str, dict], rows: list[GridRow] | None = None) -> str:
    """Why each speed-up is the size it is, at the path's crossover (else its longest length): recompute (the row's
    control) is its engine's resident follow-up plus the prefill it redoes, the restore its own engine's resident
    follow-up plus its cost (``floor_table``: restore - resident, and that cost over its transfer floor); the restore
    saves the difference. Review finding, 6 Dec
    2026: 458a's 0.5B DRAM at 1.06-1.13x over 4,096-16,384 tokens said no why; there prefill is 38.2 ms above the
    resident follow-up at 16,384 tokens and DRAM's restore costs 31.3 ms, 8.6x its copy floor. '' where the arms are
    missing. With ``rows``, the cost's ratio to its floor is given only where the cost's interval
    (``report.cost_interval``) lies above 0: a cost the grid's spread hides has no ratio worth reading (89ce's retained
    GPU buffer at 1,024 tokens: 0.5 ms, "70x" a 0.007 ms floor, within the noise of two unpaired medians)."""
    ttft = {(t["context_tokens"], t["arm"]): t["ttft_ms"] for t in tables["arms"] if t["model"] == model}
    floor = {(r["context_tokens"], r["path"]): r for r in tables.get("floor_distance", []) if r["model"] == model}
    parts = []
    for path, row in paths.items():
        n = row["crossover_tokens"] if row["crossover_tokens"] is not None else max(_speedups(row))
        # the row's own control (one per row: arms.control_of), split against its own engine's resident follow-up:
        # where that is another engine, the restore's resident is not the recompute's (a47e's vLLM CPU tier read
        # "recompute 116.8 = 16.8 +100.0", the CPU tier's resident under the LMCache engine's recompute, beside
        # DRAM's "116.8 = 12.3 +104.5" of the same recompute)
        control = _row_control(row)
        rec, rec_resident, resident, restore = (ttft.get((n, a)) for a in (
            control, RESIDENT_OF_TIER[TIER_OF[control]], RESIDENT_OF[path], path))
        if rec is None or resident is None or restore is None:
            continue
        dist = floor.get((n, path))
        resolved = rows is None or report.cost_interval(rows, model, n, path)[1] > 0  # NaN (no interval): not resolved
        # a ratio only where the cost's interval lies wholly above the floor (``floor_table``'s x_floor); at the floor,
        # that verdict; a cost whose interval holds 0 or lies below the floor has no distance to give
        x = (f" ({dist['x_floor']:.1f}\u00d7 its transfer floor)" if dist and (dist.get("x_floor") or 0) > 0 and resolved
             else " (at its transfer floor, by the cost's 95% interval)"
             if dist and dist.get("verdict") == report.AT_THE_FLOOR else "")
        saved = rec - restore
        split = (f"{rec:,.1f} (its resident follow-up not measured) " if rec_resident is None
                 else f"{rec:,.1f} = {rec_resident:,.1f} {rec - rec_resident:+,.1f} ")
        engine = "" if _own_control(row) else "on the LMCache engine "
        parts.append(f"{LABEL[path]} at {_n(n)} tokens, recompute {engine}{split}against the restore {restore:,.1f} = "
                     f"{resident:,.1f} {restore - resident:+,.1f}{x}: {'saves' if saved >= 0 else 'loses'} "
                     f"{abs(saved):,.1f}")
    return (" Why (medians, ms; each first token is the engine's resident follow-up plus what recompute's prefill or "
            "the restore adds to it): " + "; ".join(parts) + ".") if parts else ""


def _by_model(rows: list[dict]) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for r in rows:
        out.setdefault(r["model"], {})[r["path"]] = r
    return out


def _follows(host: bool, clocked: bool, gpu: bool, clock_nil: bool) -> str:
    """What the spread sentence concludes from its rank correlations: what the forward step moves with, never what
    sets it (review finding, 6 Dec 2026: a47e read "the host sets it, not the GPU's clock" with the clock's rho -0.40
    [-0.66, -0.05]); "not measurably with the GPU's clock" only where every clock interval holds 0."""
    if not host or gpu:
        return ""
    said = (": it moves with the host's own time" + (", not measurably with the GPU's clock" if clocked and clock_nil
                                                     else " more than with the GPU's clock" if clocked else ""))
    return said + " (correlations over follow-ups taken as independent, not causes)"


def _rhos(rows: list[dict], key: str) -> str:
    """Each point's rank correlation with its 95% interval where the row has one ("0.90 [0.79, 0.95]"), several
    points joined by "; ", each named by its length (and model); rows recorded before the interval give the rho
    alone."""
    models = len({r["model"] for r in rows}) > 1

    def one(r: dict) -> str:
        ci = r.get(f"{key}_ci") or [None, None]
        return (f"{r[key]:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci[0] is not None else "")
                + (f" at {_n(r['context_tokens'])}" + (f" ({r['model']})" if models else "") if len(rows) > 1 else ""))
    return "; ".join(one(r) for r in rows)


def _headline_part(row: dict) -> str:
    speed = _speedups(row)
    point = row["crossover_tokens"]
    where = f"\u2265 {_n(point)}" if point is not None else "never"
    if point is not None and len(speed) == 1:  # one length: a win there, no crossover (the label says which)
        where = f"at {_n(point)}"
    return f"{LABEL[row['path']]} {where} ({speed[max(speed)]:.2f}\u00d7 at {_n(max(speed))})"


def _measured(rows) -> str:
    """The lengths a model's crossovers stand on, for the headline's label: " (16,384 tokens only)", " (1,024 to
    32,512 tokens)". A crossover at the shortest length says nothing of shorter ones, so the label gives the grid
    (review finding: a47e's "DRAM >= 16,384" read as a crossover at 16,384, its only length; the answer said so,
    the headline did not)."""
    lengths = sorted({n for r in rows for n in _speedups(r)})
    if not lengths:
        return ""
    return f" ({_n(lengths[0])} tokens only)" if len(lengths) == 1 else f" ({_n(lengths[0])} to {_n(lengths[-1])} tokens)"


def headline(run: RunFiles) -> dict[str, str]:
    tables = recomputed_tables(run)
    out = {}
    for model, paths in _by_model(tables["crossover"]).items():
        key, value = f"{model}: restore beats recompute from{_measured(paths.values())}", "; ".join(
            _headline_part(r) for r in paths.values())
        if len(value) <= MAX_STRING_CHARS:
            out[key] = value
            continue
        # a run of many paths (the GPU buffer's five, 6 Dec: 249 characters) says each path on its own line, named
        # by its arm (a public string is at most MAX_STRING_CHARS, a key 96 characters of a few kinds)
        for r in paths.values():
            out[f"{model} {r['path']}: restore beats recompute from{_measured([r])}"] = (
                _headline_part(r).removeprefix(f"{LABEL[r['path']]} "))
    floors = run.results.get("floors") or {}
    if floors:
        out["floors"] = ", ".join(f"{_device_label((f or {}).get('label', k)) if k == 'device' else (f or {}).get('label', k)} "
                                  f"{(f or {}).get('gib_per_s', 0):.2f} GiB/s" for k, f in floors.items())
    resolution = tables.get("restore_resolution") or []
    if resolution:  # runs of the paired design
        at_floor = sum(r["span_verdict"] == "at the floor" for r in resolution)
        below = sum(r["span_verdict"].startswith("below its floor") for r in resolution)
        out["restore spans (paired design)"] = (f"{sum(r['resolved'] for r in resolution)} of {len(resolution)} points "
                                                f"resolved to 10% of the floor; {at_floor} at the floor"
                                                + (f"; {below} below it (a method problem)" if below else ""))
    out["checks"] = checks_verdict(checks(run))
    return out


def answer(run: RunFiles) -> str:
    p = run.params
    tables = recomputed_tables(run)
    per_model = _by_model(tables["crossover"])
    missing = gaps.note(run)  # what the plan has and the rows lack, in the children's own accounts
    if not per_model:
        return ("No measured rows with both a restore and the recompute control: this run cannot answer the question."
                + (f" {missing}" if missing else ""))
    failed = [c for c in checks(run) if c.status == "failed"]
    wins = {path: [m for m, paths in per_model.items() if path in paths and paths[path]["crossover_tokens"] is not None]
            for path in report.RESTORES}
    longest = max(max(_speedups(r)) for paths in per_model.values() for r in paths.values())
    digests = kv_digest_by_path(run)
    wrong = not_as_computed(digests)
    lead = []
    for path in report.RESTORES:
        have = [m for m, paths in per_model.items() if path in paths]
        if not have:
            continue
        if len(wins[path]) == len(have):
            lead.append(f"{LABEL[path]} restore beats recompute " + (
                "for every model, from a length that depends on the model" if len(have) > 1 else
                f"for {have[0]} {_noted(_starts(per_model[have[0]][path]))}"))
        elif not wins[path]:
            lead.append(f"{LABEL[path]} restore never does, up to {_n(longest)} tokens")
        else:
            lead.append(f"{LABEL[path]} restore beats recompute for {', '.join(wins[path])} only")
        if path in wrong:
            lead[-1] += " (its restores left KV other than the computed in vLLM's blocks)"
    kv = kv_digest_sentence(digests, uncompared_restores(all_followups(run)))
    text = ["**" + "; ".join(lead) + ".**" + (f" {kv}" if kv else "")]
    text.append(f"Per model ({p.DTYPE}, {p.BLOCK_SIZE}-token blocks, {p.WEIGHTS} weights on {p.DEVICE}; "
                f"medians of {p.NUM_REPEATS} measured follow-ups per point; each speed-up is recompute's first token "
                "over the restore's, each on its own tier's engine where the run measured that engine's recompute at "
                "every length of the path's row, else the LMCache engine's at every length; the crossover is the "
                "shortest measured context from which the restore is faster at every longer one, faster meaning the "
                "speed-up's 95% interval lies wholly above 1):")
    grid_rows = run.records("rows.jsonl")
    text += [f"- {model}: " + "; ".join(path_phrase(r) for r in paths.values()) + "."
             + _savings(tables, model, paths, grid_rows) for model, paths in per_model.items()]
    arms = {(t["model"], t["context_tokens"], t["arm"]): t for t in tables["arms"]}
    at = [(m, arms.get((m, longest, "recompute")), arms.get((m, longest, "dram"))) for m in per_model]
    if all(rec and dram for _, rec, dram in at):
        text.append(f"At {_n(longest)} tokens recompute takes " + " / ".join(f"{rec['ttft_ms']:,.0f}" for _, rec, _ in at)
                    + " ms to the first token and a DRAM restore " + " / ".join(f"{d['ttft_ms']:,.0f}" for _, _, d in at)
                    + f" ms ({', '.join(per_model)}).")
    floors = run.results.get("floors") or {}
    distance = [r for r in tables.get("floor_distance", []) if r["context_tokens"] == longest and r["path"] == "disk"]
    if floors.get("disk") and floors.get("copy"):
        device = floors.get("device")  # the GPU buffer's floor (runs before it had one record none)
        text.append(f"The floors measured in the same run: {floors['disk']['label']} at {floors['disk']['gib_per_s']:.2f} GiB/s, "
                    f"{floors['copy']['label']} at {floors['copy']['gib_per_s']:.1f} GiB/s"
                    + (f", {_device_label(device['label'])} at {device['gib_per_s']:,.0f} GiB/s" if device else "")
                    + _disk_distance(tables, distance, longest) + ".")
    split_lines = _floor_sentences(tables, longest, run.records("rows.jsonl"), bound=p.DEVICE == "cuda")
    text.append("Where the evidence is weak: " + ("random or dummy weights give each shape's compute time but not a real "
                "model's values; " if p.WEIGHTS in ("dummy", "random") else "")
                + "one machine's disk and memory; a crossover is only as fine as the grid of context lengths"
                + ("; on the CPU build prefill is slow, so restores win early" if p.DEVICE == "cpu" else "") + "."
                + (f" {len(failed)} check(s) failed: " + "; ".join(c.name for c in failed[:3]) + "." if failed else "")
                + (f" {missing}" if missing else ""))
    rows = run.records("rows.jsonl")
    goal_rows = report.goal_table(tables["arms"], tables.get("floor_distance", []), rows)  # each computed once
    critical = report.critical_goal_table(tables.get("splits", []), tables.get("floor_distance", []))
    spans = report.timeline_goal_table(tables.get("splits", []), tables.get("floor_distance", []), p.DEVICE == "cuda")
    goal_lines = _goal_sentences(tables, rows, p.SUFFIX_TOKENS, goal_rows, critical, bound=p.DEVICE == "cuda",
                                 spans=spans)
    goals = ("The restore goals, one reading a line:\n\n" + "\n".join(f"- {line}" for line in goal_lines)
             if goal_lines else "")
    points = goal_points_table(tables, rows, goal_rows, critical)
    if points:
        goals += ("\n\nThe first restore goal point by point (median ms with its 95% bootstrap interval; the floor is "
                  "the path's own, the one its cost was judged against: timed before and after the point where the run "
                  "timed it there, a range, else at the run's start):\n\n" + points)
    span_lines = span_goal_table(tables, spans=spans)
    if span_lines:
        goals += ("\n\nEach timed restore's own span against its floor (the tier's timeline, median ms with its 95% "
                  "bootstrap interval; within: the whole interval at most " + f"{report.GOAL_X}\u00d7 the floor, "
                  "of a range its min):\n\n"
                  + span_lines)
    pooled = forward_pairs_table(tables)
    if pooled:
        goals += ("\n\nThe forward pass " + ("(host stamps on the CPU build)" if p.DEVICE == "cpu" else "on the GPU")
                  + ", paired by repeat and pooled over the points (the median of the "
                  "pairs' differences, its 95% bootstrap interval):\n\n" + pooled)
    resolution = tables.get("restore_resolution") or []
    judged = [r for r in resolution if r["context_tokens"] >= report.RESOLVE_MIN_TOKENS]
    if resolution and not judged:  # a grid of short contexts: its longest, per model
        top = {m: max(r["context_tokens"] for r in resolution if r["model"] == m) for m in {r["model"] for r in resolution}}
        judged = [r for r in resolution if r["context_tokens"] == top[r["model"]]]
    resolution = judged
    if resolution:
        goals += ("\n\n" if goals else "") + (
            "Each restore resolved, from the paired design (restore and resident follow-up back to back on one engine, "
            "the floor measured before and after each point, as a range; an interval holding 0 is no cost measured, "
            "one reaching down to the floor's range is at the floor, one wholly below it is below its floor ("
            + ("a method problem" if p.DEVICE == "cuda" else "on the CPU the floors are timed beside the engine's "
               "threads and bound nothing, so it reads below its timed floor and is not judged")
            + f"); points of {_n(report.RESOLVE_MIN_TOKENS)} tokens "
            "and more, else each model's longest; every point in the restore_resolution table):\n\n"
            + "\n".join(f"- {line}" for line in _resolution_sentences(resolution, pair_plans(run),
                                                                      tables.get("restore_resolution"),
                                                                      p.CHILD_TIMEOUT_S, tables.get("components"))))
        below = _below_pair_floor_sentences(resolution, copied_by_point(run)) if p.DEVICE == "cuda" else []
        if below:
            goals += "\n\n" + " ".join(below)
    body = "\n".join(text[:2]) + "\n\n" + "\n".join(text[2:2 + len(per_model)]) + "\n\n"
    if not split_lines:
        return body + " ".join(text[2 + len(per_model):-1]) + (f"\n\n{goals}\n\n" if goals else " ") + text[-1]
    # the weak-evidence sentence closes the answer, after the paths' timelines
    return (body + " ".join(text[2 + len(per_model):-1]) + "\n\nWhere each timed restore path stands at the longest "
            "context (cost = first token above the same engine's resident follow-up, a difference of two medians "
            "judged by its interval: no cost measured where it holds zero, at the floor where it reaches the floor; "
            "parts from measured timestamps: the tier's own timeline for the "
            "GPU buffer and vLLM's CPU tier, the component probe for LMCache"
            + ("; on the CPU build the GPU buffer is host memory" if p.DEVICE == "cpu" else "") + "):\n\n"
            + "\n".join(f"- {line}" for line in split_lines) + "\n\n" + (f"{goals}\n\n" if goals else "") + text[-1])


def _disk_distance(tables: dict, distance: list[dict], longest: int) -> str:
    """The disk restore's distance to its transfer floor at the longest context (``floor_table``'s rows there, one per
    model): its ratio where every cost's interval lies wholly above the floor, else each verdict (at the floor, no cost
    measured: never a ratio below 1); near the floor or at it, what bounds it (``_disk_bound``). '' without a row."""
    if not distance:
        return ""
    if all(r.get("x_floor") for r in distance):
        return (f"; at {_n(longest)} tokens the disk restore costs {_span(r['x_floor'] for r in distance)}\u00d7 its "
                "transfer floor" + (_disk_bound(tables, longest) if max(r["x_floor"] for r in distance) <= NEAR_FLOOR else ""))
    verdicts = list(dict.fromkeys(r["verdict"] for r in distance if r.get("verdict")))
    if not verdicts:
        return ""
    return (f"; at {_n(longest)} tokens the disk restore's cost, by its 95% interval against its transfer floor, is "
            + " / ".join(verdicts) + (_disk_bound(tables, longest) if report.AT_THE_FLOOR in verdicts else ""))


def _disk_bound(tables: dict, longest: int) -> str:
    """The answer's reading of a disk restore near its once-measured floor: the disk bounds it, unless the paired
    design's floor, measured around the point, puts its restores below that floor (review finding, 6 Dec 2026: 458a
    and b43a read "so the disk itself bounds it" beside disk restores below their per-point floor, a floor method
    problem): then what bounds them is not measured."""
    below = [r for r in tables.get("restore_resolution") or []
             if r["path"] == "disk" and r["context_tokens"] == longest and r["span_verdict"].startswith("below its floor")]
    if below:
        return ("; its restores there fall below the floor measured around the point (a method problem)"
                + _own_read_clause(below[0], tables.get("components"))
                + ", so this run does not say what bounds them")
    return ", so the disk itself bounds it"


def _own_read_clause(r: dict, components: list[dict] | None) -> str:
    """Where LMCache's disk restores fell below their floor: LMCache's own disk read at that point (its probe's
    ``disk_read_ms``, the median over the grid's disk follow-ups, ``report.component_table``) against the floor's
    disk reads of the same bytes (``floor_overlapped_ms``: the slower of its media, the disk). A tier whose own reads
    beat the floor's reads shows the floor's reader, not the disk, is what its restores beat (6 Dec 2026: 0248's
    LMCache read 381 MiB in 168 ms where the floor's reads took 198-199 ms; 458a 230 against 338-374 ms; b43a at 7B
    1,021 against 1,361-1,500 ms)."""
    floor = r.get("floor_overlapped_ms")
    read = next((c.get("disk_read_ms") for c in components or [] if c.get("arm") == "disk"
                 and (c.get("model"), c.get("context_tokens")) == (r["model"], r["context_tokens"])), None)
    if r["path"] != "disk" or not floor or read is None or not r["span_verdict"].startswith("below its floor"):
        return ""
    where = ("faster than" if read < floor[0] else "slower than" if read > floor[1] else "within")
    return (f"; LMCache's own disk read there took {read:,.1f} ms (its probe, median of the grid's disk follow-ups), "
            f"{where} the floor's reads of the same bytes ({floor[0]:,.1f}\u2013{floor[1]:,.1f} ms)"
            + (": the floor's reader, not the disk, is what these restores beat" if read < floor[0] else ""))


# ``lmcache.probes``: the components that bring the context in
LMCACHE_PARTS = ("lookup_wall_ms", "disk_read_ms", "load_ms", "load_wall_ms")


def _longest_part(split: dict | None, component: dict | None) -> tuple[str, float] | None:
    """The longest part of bringing the context in: from the tier's own timeline (GPU buffer, vLLM's
    CPU tier) or from the component probe's stamps (LMCache)."""
    if split and split.get("longest_part"):
        part = split["longest_part"]
        name = {"launch": "launch (the host preparing the copy while the GPU waits)"}.get(part, part.replace("_", " "))
        return name, split[part + "_ms"]
    spans = {k: component[k] for k in LMCACHE_PARTS if component and component.get(k) is not None}
    if not spans:
        return None
    key = max(spans, key=spans.get)
    return {"lookup_wall_ms": "lookup (wall; on the MP path it holds the server's disk-to-memory load)",
            "disk_read_ms": "disk read", "load_ms": "load into vLLM",
            "load_wall_ms": "load into vLLM (submitted to reported done; on CUDA the MP server copies)"}[key], spans[key]


def _floor_sentences(tables: dict, longest: int, rows: list[GridRow] | None = None, bound: bool = True) -> list[str]:
    """Each restore path at the longest context: its distance to its floor and to the engine-resident
    follow-up, and the part of its restore that takes longest (measured timestamps). ``bound``: the floors are
    physical bounds (``report.floor_verdict``)."""
    splits = {(r["model"], r["arm"]): r for r in tables.get("splits", []) if r["context_tokens"] == longest}
    components = {(r["model"], r["arm"]): r for r in tables.get("components", []) if r["context_tokens"] == longest}
    paired = {(r["model"], r["path"]): r for r in tables.get("restore_resolution") or [] if r["context_tokens"] == longest}
    out = []
    for r in tables.get("floor_distance", []):
        if r["context_tokens"] != longest or not r.get("transfer_floor_ms"):  # judged below by its interval
            continue
        part = _longest_part(splits.get((r["model"], r["path"])), components.get((r["model"], r["path"])))
        cost = r["restore_cost_ms"]
        floor = report.judged_floor_ms(r)  # the floor the table's verdict judged: around the point where timed there
        _, low, high = report.cost_interval(rows or [], r["model"], longest, r["path"]) if rows else (0, float("nan"),
                                                                                                     float("nan"))
        verdict = report.floor_verdict(low, high, floor, bound) if low == low else ""
        timed = (f"{floor[0]:,.1f}-{floor[1]:,.1f} ms, timed before and after the point" if r.get("point_floor_ms")
                 else f"{floor[0]:,.1f} ms, timed once at the run's start")
        out.append(f"{r['model']}, {LABEL[r['path']]}: first token {cost:+,.1f} ms against the engine-resident "
                   + (f"follow-up [{low:+,.1f}, {high:+,.1f}] (two unpaired medians of the grid's repeats, 95% bootstrap): "
                      f"{verdict}{_reach(verdict, high, floor)}" if low == low else "follow-up (no interval)")
                   + f" (transfer floor {timed})"
                   + _paired_clause(paired.get((r["model"], r["path"])), tables.get("restore_resolution") or [])
                   + (f"; the longest part of the restore is {part[0]} ({part[1]:,.1f} ms)" if part else "") + ".")
    return out


def _reach(verdict: str, high: float, floor_ms: list[float] | None) -> str:
    """What an "at the floor" verdict leaves open: ``report.floor_verdict`` says it where an interval reaches down into
    the floor's range, however far above the floor its upper end lies; where that end is more than
    ``report.RESOLVE_FRACTION`` above the floor's max, say how far (review finding, 6 Dec 2026: b43a's 7B DRAM span at
    32,512 read **at the floor** from [14.0, 63.6] ms against a 33.7 ms floor)."""
    if verdict != "at the floor" or not floor_ms or high != high or high <= floor_ms[1] * (1 + report.RESOLVE_FRACTION):
        return ""
    return f" (its interval reaches {high / floor_ms[0]:.2f}\u00d7 the floor: not told apart from a cost that far above it)"


def _paired_clause(r: dict | None, every: list[dict] | None = None) -> str:
    """The paired design's first-token difference at the same point (``report.resolution_table``), beside the grid's
    difference of two unpaired medians: the same cost from restores run back to back with their resident follow-up,
    judged against the floor measured around the point (review finding, 6 Dec 2026: 89ce's layered GPU buffer read
    "-3.7 ms [-12.1, +8.6]: no cost measured" from the grid while its 64 pairs measured +0.34 ms [0.28, 0.38], 2.0-2.8x
    its floor); where it lies below its floor, the same pairs' forward passes (``_forward_clause``)."""
    if not r or r.get("ttft_difference_ms") is None:
        return ""
    low, high = r.get("ttft_difference_ci_serial_ms") or r["ttft_difference_ci_ms"]
    interval = f"[{low:+,.3f}, {high:+,.3f}]" if low is not None and high is not None else "(no interval)"
    return (f"; paired ({r['num_pairs']} restores, each beside its resident follow-up): {r['ttft_difference_ms']:+,.3f} ms "
            f"{interval} against the floor measured around the point: {r['ttft_verdict']}"
            f"{_reach(r['ttft_verdict'], high if high is not None else float('nan'), r['floor_ms'])}"
            f"{_forward_clause(r)}{_host_wait_clause(r, every)}")


def _forward_clause(r: dict) -> str:
    """Where a paired first-token difference lies below its floor, what the forward passes of the same pairs did
    (``report.resolution_table``'s ``forward_difference_ms`` and its 95% interval): the first-token difference holds
    the restored follow-up's forward pass less its resident partner's, so an interval wholly below 0 (a faster pass)
    is part of why the restore reads below the copy it made, one wholly above 0 worked the other way, and one holding
    0 rules that out. The grid's ``forward_steps`` come from other follow-ups (its repeats), not the pairs the verdict
    judges (review finding, 6 Dec 2026: b298's 7B GPU buffer at 32,512 tokens read its grid's pass 0.57 ms faster
    beside pairs whose own passes differed by 0.22 ms). The verdict stands as judged; a row whose pairs record no
    forward pass, or no interval of it, adds nothing."""
    if not r["ttft_verdict"].startswith("below its floor") or r.get("forward_difference_ms") is None:
        return ""
    median = r["forward_difference_ms"]
    low, high = r.get("forward_difference_ci_ms") or (None, None)
    if low is None or high is None:
        return ""
    side = _side_of_zero(median, low, high, "faster", "slower")
    if side is None:
        return (f"; in the same pairs the forward passes did not differ measurably ({median:+,.3f} ms "
                f"[{low:+,.3f}, {high:+,.3f}]), so that is not why")
    return (f"; in the same pairs the restored follow-up's forward pass ran {side} than its resident partner's, "
            "which the first-token difference includes")


def _side_of_zero(median: float, low: float, high: float, below: str, above: str) -> str | None:
    """A paired difference whose 95% interval lies wholly off 0, as its size and interval and the word for its side
    (``below`` 0 or ``above``), "0.216 ms [0.185, 0.269] faster"; None where the interval holds 0. To the paired first
    token's own precision: two decimals would print a bound of 0.0016 ms as 0.00, read as 0."""
    if low <= 0 <= high:
        return None
    which, (a, b, c) = (below, (-median, -high, -low)) if high < 0 else (above, (median, low, high))
    return f"{a:,.3f} ms [{b:,.3f}, {c:,.3f}] {which}"


def _host_wait_clause(r: dict, every: list[dict] | None = None, said: dict | None = None) -> str:
    """Where a paired first-token difference lies below its floor, where the host stood when the copy ended
    (``report.resolution_table``'s ``to_forward_ms``: its stamp at the forward pass's first attention layer less the
    copy's end): a copy that ended before the host reached that layer ran beside host work of the step, which a
    resident step does as well, so its first token need not pay the whole copy. ``every``: the run's
    restore_resolution rows, for the same path's gap at every context; a gap that holds while the copy grows says the
    host waited for the copy before that layer (review finding, 6 Dec 2026: b298's 7B GPU buffer, below its floor at
    16,384 and 32,512 tokens, reached the layer 0.49-0.72 ms after the copy's end at every context while the copy grew
    from 0.05 to 1.3 ms; the README had called the event not explained). Where the same pairs record the host's path
    to that layer (``host_path_difference_ms``: from where vLLM starts the step's loads, the restored step's less its
    resident partner's), how much later the restored step's host got there: the part of the wait the resident step
    does not share. Rows without the stamp add nothing. ``said``: a list's record of the (model, path) whose range it
    already gave, by the context it gave it at; a later point of the same path refers to it instead of repeating it."""
    if not r["ttft_verdict"].startswith("below its floor") or r.get("to_forward_ms") is None:
        return ""
    low, high = r["to_forward_ci_ms"]
    text = (f"; in {r['num_ended_before_forward']} of its {r['num_to_forward']} restores the copy had ended before "
            f"the host reached the forward pass's first attention layer ({r['to_forward_ms']:,.3f} ms "
            f"[{low:,.3f}, {high:,.3f}] before, median)")
    same = [x for x in every or [] if (x["model"], x["path"]) == (r["model"], r["path"])
            and x.get("to_forward_ms") is not None and x.get("span_ms") is not None]
    key = (r["model"], r["path"])
    if len(same) > 1 and said is not None and key in said:
        text += f", as at every context of this path (the line for {_n(said[key])} tokens gives the range)"
    elif len(same) > 1:
        if said is not None:
            said[key] = r["context_tokens"]
        gaps = [x["to_forward_ms"] for x in same]
        spans = [x["span_ms"] for x in same]
        shortest = _n(min(x["context_tokens"] for x in same))
        text += (f", and {min(gaps):,.2f}-{max(gaps):,.2f} ms before at every context from {shortest} tokens while "
                 f"the restore grew from {min(spans):,.2f} to {max(spans):,.2f} ms: the host waits for the "
                 "copy before that layer, so the step's host work between the copy's launch and that wait ran beside "
                 "the copy, work a resident step does too")
    else:
        text += ": the copy ran beside host work of the step, which a resident step does too"
    return text + _host_path_clause(r) + "; where the host waits, the records do not show"


def _host_path_clause(r: dict) -> str:
    """The same pairs' host paths to the forward pass's first attention layer (``report.resolution_table``'s
    ``host_path_difference_ms`` and its 95% interval), to the paired first token's precision: an interval wholly
    above 0 says the restored step's host got there later, one wholly below 0 earlier, one holding 0 no measurable
    difference. A row without it, or without its interval, adds nothing."""
    median = r.get("host_path_difference_ms")
    low, high = r.get("host_path_difference_ci_ms") or (None, None)
    if median is None or low is None or high is None:
        return ""
    side = _side_of_zero(median, low, high, "earlier", "later")
    if side is None:
        return (f"; in the same pairs the restored step's host reached that layer with no measurable difference from "
                f"its resident partner's ({median:+,.3f} ms [{low:+,.3f}, {high:+,.3f}])")
    return f"; in the same pairs the restored step's host reached that layer {side} than its resident partner's"


def _resolution_sentences(table: list[dict], plans: dict | None = None, every: list[dict] | None = None,
                          child_timeout_s: int | None = None, components: list[dict] | None = None) -> list[str]:
    """The paired design (``report.resolution_table``), one line per (model, context, path): the restore's own span
    and the paired first-token difference, each with its 95% interval and verdict against the floor's range; where
    that difference lies below its floor, the same pairs' forward passes (``_forward_clause``). ``plans``: the
    run's raw/pair_plans.jsonl by (model, context, path), where it has one: whether a point's pilot was extended
    (``_stage_clause``, with the run's ``child_timeout_s`` where a stage did not fit it); ``components``: the
    component table, for LMCache's own disk read beside a disk floor its restores beat (``_own_read_clause``)."""
    plans, said = plans or {}, {}
    out = []
    def ci(pair: list, wide: list | None = None) -> str:
        low, high = pair
        if low is None:
            return "no interval"
        text = f"[{low:,.3f}, {high:,.3f}]"
        if wide and list(wide) != list(pair):  # the interval the verdict judged (``report.widened``: streaks)
            text += (f", widened for streaks to [{wide[0]:,.3f}, {wide[1]:,.3f}]" if wide[0] is not None
                     else ", unbounded for streaks")
        return text

    for r in table:
        floor = r["floor_ms"]
        out.append(f"{r['model']}, {_n(r['context_tokens'])} tokens, {LABEL.get(r['path'], r['path'])}: span "
                   + (f"{r['span_ms']:,.3f} ms {ci(r['span_ci_ms'], r.get('span_ci_serial_ms'))}"
                      if r["span_ms"] is not None else "not recorded")
                   + " against a floor of " + (f"{floor[0]:,.3f}\u2013{floor[1]:,.3f} ms" if floor else "none")
                   + f": **{r['span_verdict']}**{_reach(r['span_verdict'], _high(r, 'span'), floor)}; first token "
                   + (f"{r['ttft_difference_ms']:+,.3f} ms "
                      f"{ci(r['ttft_difference_ci_ms'], r.get('ttft_difference_ci_serial_ms'))} (paired)"
                      if r["ttft_difference_ms"] is not None else "not paired")
                   + f": {r['ttft_verdict']}{_reach(r['ttft_verdict'], _high(r, 'ttft_difference'), floor)} "
                   f"({r['num_restores']} restores"
                   + _serial_clause(r) + _pair_floor_clause(r) + _overlapped_clause(r)
                   + _own_read_clause(r, components)
                   + _stage_clause(r, plans.get((r["model"], r["context_tokens"], r["path"])), child_timeout_s)
                   + ")" + _forward_clause(r) + _host_wait_clause(r, every, said) + ".")
    return out


def copied_by_point(run: RunFiles) -> dict[tuple, dict]:
    """What the in-process LMCache restores of each point's pairs handed their copy call (``lmcache.probes``'
    ``load_bytes``, recorded from e94b4c9), by (model, context tokens, path): ``num_counted`` restores that recorded
    it, ``num_whole`` of them handed the whole context with no token skipped (``checks.copied_whole``, the check's
    figure), the context's bytes and the median host
    time inside the call (``to_gpu_ms``, which synchronizes its load stream). Empty for runs without the count."""
    if not run.has_raw("pairs.jsonl"):
        return {}
    out: dict[tuple, dict] = {}
    for r in run.records("pairs.jsonl"):
        c = r.components
        if r.role != "restore" or not r.measured or r.status != "ok" or c.load_bytes is None:
            continue
        point = out.setdefault((r.model, r.context_tokens, r.pair_arm),
                               {"num_counted": 0, "num_whole": 0, "context_bytes": r.context_bytes, "to_gpu": []})
        point["num_counted"] += 1
        point["num_whole"] += copied_whole(r)
        if c.to_gpu_s is not None:
            point["to_gpu"].append(1e3 * c.to_gpu_s)
    for point in out.values():
        times = point.pop("to_gpu")
        point["to_gpu_ms"] = float(numpy.median(times)) if times else None
    return out


def kv_digest_by_path(run: RunFiles) -> dict[str, dict]:
    """What the KV digest found after each restore path's restores (``checks.kv_digest_check``'s evidence: grid and
    paired rows whose blocks were compared), by path: ``num_compared``, ``num_differing`` (any block differs),
    ``num_all_differing`` (every block differs), ``num_fresh_equal`` (equal with some block no earlier request of the
    context held: the equal ones that are evidence), ``num_scrubbed`` (restores into KV caches zeroed before them,
    ``KvDigest.scrub``: each equal one is evidence), and, where recorded, the differing blocks all zero
    (``num_zero_blocks``) and holding another place's KV (``num_misplaced_blocks``), summed. Empty for runs before it."""
    out: dict[str, dict] = {}
    for r in all_followups(run):
        if r.kv_digest_equal is None:
            continue
        path = out.setdefault(r.arm, {"num_compared": 0, "num_differing": 0, "num_all_differing": 0,
                                      "num_fresh_equal": 0, "num_scrubbed": 0, "num_zero_blocks": None,
                                      "num_misplaced_blocks": None})
        path["num_compared"] += 1
        path["num_differing"] += not r.kv_digest_equal
        path["num_all_differing"] += r.kv_digest_differing_tokens == r.kv_digest_tokens
        path["num_fresh_equal"] += bool(r.kv_digest_equal and r.kv_digest_reused_tokens < r.kv_digest_tokens)
        path["num_scrubbed"] += bool(r.kv_scrubbed)
        for key, value in (("num_zero_blocks", r.kv_digest_zero_blocks),
                           ("num_misplaced_blocks", r.kv_digest_misplaced_blocks)):
            if value is not None:
                path[key] = (path[key] or 0) + value
    return out


def not_as_computed(by_path: dict[str, dict]) -> list[str]:
    """The restore paths some of whose restores left KV in vLLM's blocks other than the KV computed: their times are
    a copy's, not a restore's."""
    return [path for path, d in by_path.items() if d["num_differing"]]


def differing_of(digest: dict) -> str:
    """A path's digest count as every text says it: "292 of 292" (restores whose KV differed, of those compared)."""
    return f"{digest['num_differing']} of {digest['num_compared']}"


def _paths_named(paths: list[str]) -> str:
    """Restore paths in a sentence: LMCache's in-process ones (DRAM, disk) named as such, joined with 'and'."""
    inproc = [LABEL[p] for p in paths if p in ("dram", "disk")]
    names = ([f"in-process LMCache's {' and '.join(inproc)}"] if inproc else []) + [
        f"the {LABEL.get(p, p)}" for p in paths if p not in ("dram", "disk")]
    return ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1]


def _path_label(path: str) -> str:
    """One restore path as a sentence names it at the start of a clause (``_paths_named`` without its article)."""
    return _paths_named([path]).removeprefix("the ")


def kv_digest_sentence(by_path: dict[str, dict], uncompared: dict[str, int] | None = None) -> str:
    """One plain sentence: per path, how many restores left the KV as computed (``kv_digest_by_path``), and the paths
    whose restores were not compared (``checks.uncompared_restores``: their speed-ups are not checked for content).
    '' without a compared restore."""
    if not by_path:
        return ""
    parts = []
    for path, d in by_path.items():
        label = _path_label(path)
        if d["num_differing"]:
            held = ""
            if d["num_zero_blocks"] is not None:
                held = (f"; of their differing blocks {d['num_zero_blocks']:,} all zero and {d['num_misplaced_blocks']:,} "
                        "holding another place's KV")
            parts.append(f"{label}: {differing_of(d)} restores differ"
                         + (f", {d['num_all_differing']} in every block" if d["num_all_differing"] else "") + held)
        else:
            fresh, num = d["num_fresh_equal"], d["num_compared"]
            # a restore landing wholly where the same KV already was matches whether or not it wrote: say which count
            # is evidence (``checks.kv_digest_check`` leaves those out)
            parts.append(f"{label}: all {num} equal" + (
                ", each into KV caches zeroed before it (so each shows a write)" if d.get("num_scrubbed") == num else
                ", each on fresh blocks" if fresh == num else
                f", {fresh} of them on fresh blocks (the other {num - fresh} landed on blocks that already held the "
                "same KV: equal, but no evidence of a write)"))
    parts += [f"{_path_label(path)}: not compared ({n} restores, no digest recorded)"
              for path, n in (uncompared or {}).items() if path not in by_path]
    bad = not_as_computed(by_path)
    return ("After its restores, each path's KV in vLLM's blocks was digested block by block against the KV the "
            "context was computed into: " + "; ".join(parts) + "."
            + (f" So {_paths_named(bad)} restores did not restore the context: "
               f"{'its' if len(bad) == 1 else 'their'} times are a copy's, not a restore's, and stand as measured."
               if bad else ""))


def _below_pair_floor_sentences(table: list[dict], copied: dict[tuple, dict] | None = None) -> list[str]:
    """One plain sentence per point of ``RESOLVE_MIN_TOKENS`` and more whose restores spanned less than the fastest copy
    of the same bytes timed beside them, one before each restore (``report.below_pair_floor``: ``num_below_pair_floor``
    > 0). A measured line, no verdict. Where every restore of the point recorded what its copy call was handed
    (``copied``: ``copied_by_point``) and it was the whole context, the sentence says so, and the host time inside that
    synchronous call: fewer bytes handed is then ruled out, and what is left is a kernel that reads fewer than it is
    handed or a copy running partly outside the call (6 Dec 2026, 861a: 939,524,096 bytes in 12.5 ms). Without the
    count the records do not tell the two readings apart. The caller says it on CUDA only (on the CPU both are host
    memcpys timed beside the engine's threads, no physical bound)."""
    out = []
    for r in table:
        if r["context_tokens"] < report.RESOLVE_MIN_TOKENS or not r.get("num_below_pair_floor"):
            continue
        said = (f"At {_n(r['context_tokens'])} tokens {r['num_below_pair_floor']} of {r['num_pair_floors']} "
                f"{LABEL.get(r['path'], r['path'])} restores ({r['model']}) spanned less than "
                f"{report.PAIR_FLOOR_TOLERANCE:.0%} of the fastest copy of those bytes timed beside them ("
                + ("median " if r["num_below_pair_floor"] > 1 else "")
                + f"{r['below_pair_floor_span_ms']:,.2f} ms against {r['below_pair_floor_ms']:,.2f} ms)")
        c = (copied or {}).get((r["model"], r["context_tokens"], r["path"]))
        if c and c["num_whole"] < c["num_counted"]:
            said += (f". {c['num_whole']} of the {c['num_counted']} restores that counted their copy call's bytes "
                     "were handed the whole context; the others were handed less.")
        elif c and c["num_counted"] == r["num_restores"]:
            call = (f", which returned after {c['to_gpu_ms']:,.1f} ms (median; it synchronizes its copy before it "
                    "returns)") if c["to_gpu_ms"] is not None else ""
            said += (f". Every one of the {c['num_counted']} restores handed LMCache's copy call the whole context "
                     f"({c['context_bytes']:,} bytes, no token skipped){call}: so fewer bytes handed is ruled out, and "
                     "either the copy reads fewer bytes than it is handed or part of it runs outside the timed call.")
        else:
            said += ": the span misses part of the transfer or fewer bytes moved; the records do not tell which."
        out.append(said)
    return out


def _stage_clause(r: dict, plan=None, child_timeout_s: int | None = None) -> str:
    """Whether the point resolved to 10% of its floor and, where its pilot recorded a plan (``report.pair_plan``,
    raw/pair_plans.jsonl), how its count came about: a point extended says its restores in all and the count its
    pilot estimated; one whose estimate exceeded MAX_RESTORES says it was not run; one whose second stage did not fit
    the child's CHILD_TIMEOUT_S (``child_timeout_s``, the run's; ``experiment.stage_fits``) says so, with the stage's
    estimated seconds. The interval pools the pilot and the second stage; with the count chosen from the pilot's
    spread its coverage is approximately, not exactly, 95%."""
    resolved = "resolved" if r["resolved"] else "not resolved to 10% of the floor"
    if plan is not None and plan.reason == "extended":
        staged = (f"{resolved} after a second stage: {r['num_restores']:,} restores (the pilot's {plan.num_pilot:,} "
                  f"estimated {plan.restores_to_resolve:,})")
        return f"; {staged}" + ("" if r["resolved"] else _to_resolve_clause(r))
    if r["resolved"]:
        return "; resolved to 10% of the floor"
    over = (f" (over MAX_RESTORES={plan.max_restores:,}, not run)" if plan is not None and plan.reason == "over_cap"
            else "")
    if plan is not None and plan.reason == "over_time":
        about = f", about {plan.stage_s:,.0f} s," if plan.stage_s is not None else ""
        limit = f"={child_timeout_s:,}" if child_timeout_s is not None else ""
        over = f" (its second stage{about} did not fit the child's CHILD_TIMEOUT_S{limit}: not run)"
    return "; not resolved to 10% of the floor" + _to_resolve_clause(r, over)


def pair_plans(run: RunFiles) -> dict:
    """The run's raw/pair_plans.jsonl by (model, context, path); empty for runs before the two-stage design."""
    if not run.has_raw("pair_plans.jsonl"):
        return {}
    return {(r.model, r.context_tokens, r.path): r for r in run.records("pair_plans.jsonl")}


def _to_resolve_clause(r: dict, over: str = "") -> str:
    """How many restores the unresolved point would need at the spread (and streaks) it measured
    (``report.resolution_table``'s ``restores_to_resolve``), ``over`` after the count; runs rendered before that
    column say nothing."""
    need = r.get("restores_to_resolve")
    if need is None:
        return ""
    many = need > 10 * max(r["num_restores"], 1)  # the spread, not the count, is what keeps it unresolved
    return (f": about {need:,} restores would reach it at the spread measured{over}"
            + (", so more restores are not the way to resolve it" if many else ""))


def _high(r: dict, what: str) -> float:
    """The upper end of the interval ``r``'s verdict on ``what`` (span, ttft_difference) judged: widened for streaks
    where the row has that (``report.widened``), else the bootstrap's; NaN where there is none."""
    wide = r.get(f"{what}_ci_serial_ms")
    high = wide[1] if wide and wide[0] is not None else (r.get(f"{what}_ci_ms") or [None, None])[1]
    return float("nan") if high is None else high


def _overlapped_clause(r: dict) -> str:
    """Where the strict floor is a sum of two media and the span fell below it: the span against the slower medium
    alone (``report.resolution_table``'s ``floor_overlapped_ms``), which a pipeline that overlaps them would meet."""
    floor = r.get("floor_overlapped_ms")
    if not floor or not r["span_verdict"].startswith("below its floor"):
        return ""
    return (f"; against the slower of its media alone ({floor[0]:,.3f}\u2013{floor[1]:,.3f} ms, as a restore that "
            f"overlaps the disk read with the copy would meet it), {r['span_verdict_overlapped']}")


def _serial_clause(r: dict) -> str:
    """Where the restores' spans ran in streaks (``report.resolution_table``'s serial half-width is the wider): say
    so, and the half-width the resolution was judged by."""
    half, serial = r.get("span_half_width_ms"), r.get("span_half_width_serial_ms", r.get("span_half_width_ms"))
    if half is None or serial == half:
        return ""
    widened = f"±{serial:,.3f} ms" if serial is not None else "unbounded"
    return (f"; they ran in streaks (lag-1 autocorrelation {r['span_lag1']:.2f}), so the interval, which treats them as "
            f"independent, is too narrow: judged by its half-width widened for that, {widened}" + _streak_source(r))


def _streak_source(r: dict) -> str:
    """Whose streaks they are: the engine's where the resident follow-ups, which restore nothing, ran in streaks too
    (lag-1 above white noise's bound) and the spans follow them (their correlation's interval above 0, drawn from the
    effective number of pairs two streaky series give); the numbers either way. Nothing for a run before the row
    carried them."""
    lag, corr = r.get("resident_ttft_lag1"), r.get("span_resident_corr")
    if lag is None or corr is None:
        return ""
    low, high = r["span_resident_corr_ci"]
    n_eff = r.get("span_resident_corr_n_eff")
    drawn = (f", an interval from {n_eff:,.1f} effective pairs of {r['num_pairs']} (both ran in streaks)"
             if n_eff is not None and n_eff < r["num_pairs"] else "")
    numbers = (f"the resident follow-ups beside them, which restore nothing, had lag-1 {lag:.2f}, and each span "
               f"follows its pair's resident first token with r = {corr:.2f} [{low:.2f}, {high:.2f}]{drawn}")
    if lag > white_noise_bound(r["num_pairs"]) and low > 0:
        return f"; {numbers}: the streaks are the engine's, not the tier's alone"
    return f"; {numbers}: the streaks are not shown to be the engine's"


def _pair_floor_clause(r: dict) -> str:
    """Each restore against the copy floor timed right before it, where the run timed one (memory paths)."""
    if r.get("span_x_pair_floor") is None:
        return ""
    low, high = r["span_x_pair_floor_ci"]
    ways = {k[len("pair_floor_"):-len("_ms")]: v for k, v in r.items()
            if k.startswith("pair_floor_") and k.endswith("_ms") and k != "pair_floor_ms" and v is not None}
    how = ("the faster of " + " and ".join(f"{WAY_WORDS.get(w, w)} ({v:,.3f} ms)" for w, v in sorted(ways.items()))
           + ", timed right before each" if len(ways) > 1 else "the copy floor timed right before each")
    return (f"; against {how} ({r['pair_floor_ms']:,.3f} ms, median), "
            f"{r['span_x_pair_floor']:.2f}× [{low:.2f}, {high:.2f}]")


# the ways ``kv.floors.PairFloor`` times a floor, in a reader's words
WAY_WORDS = {"memcpy": "a pinned cudaMemcpy", "uva_read": "a kernel reading pinned memory (UVA)"}


def _handoff_timing(h: dict) -> str:
    """The thread's stamps beside the stalls (``report.handoff_table``), where the run recorded them."""
    out = ""
    if h["num_stalls"] and h["stalled_launch_begin_us"] is not None and h["other_launch_begin_us"] is not None:
        out += (f" The stalled restores' launches began a median {h['stalled_launch_begin_us']:.1f} us after the request, "
                f"the others' {h['other_launch_begin_us']:.1f} us, and a stalled restore's Python ended a median "
                f"{h['stall_resumed_after_launch_us']:.1f} us after the thread's launch returned.")
    if h["to_forward_us"] is not None and h["own_to_forward_us"] is not None:
        out += (f" From the restore's end to the forward pass's first layer the engine thread took {h['to_forward_us']:.1f} us "
                f"against {h['own_to_forward_us']:.1f} us with its own launch (medians): a stall after the restore's "
                "own windows would show there.")
    elif h["num_stalls"]:
        out += (" Whether a launch begun later stalls the engine thread after the restore's own windows, where what the "
                "restore adds does not count it, this run does not measure (it records no to_forward).")
    if h.get("step_difference_ms") is not None:
        low, high = h["step_difference_ci_ms"]
        verdict = ("the hand-off shortens the step" if high < 0 else "the hand-off lengthens the step" if low > 0
                   else "no difference resolved")
        out += (f" Both together (what the restore adds, then its end to the first layer), paired by repeat with the "
                f"engine-launched restore and pooled over the points: {h['step_difference_ms']:+.3f} ms "
                f"[{low:+.3f}, {high:+.3f}] (median, 95% bootstrap, {h['num_pairs']} pairs): {verdict}.")
    return out


def _goal_sentences(tables: dict, rows: list[GridRow] | None = None, suffix_tokens: int | None = None,
                    goals: list[dict] | None = None, critical: list[dict] | None = None, bound: bool = True,
                    spans: list[dict] | None = None) -> list[str]:
    """Issue 13's two goals as measured lines: how many grid points meet each, under each reading;
    the points themselves are in ``goal_points_table``. With ``rows``, the first goal is judged
    again by its cost's interval (``report.goal_verdict``). ``goals``/``critical``: ``report.goal_table``
    and ``report.critical_goal_table`` where the caller has them already (else computed here), ``spans`` the same
    for ``report.timeline_goal_table``. The span, the
    addition to the step and the launch-free addition count a point within ``GOAL_X`` only where its whole 95%
    interval is (``report.goal_reading``), and say how many of the rest their intervals leave at the floor or below
    it; ``bound``: whether the floors are physical bounds (``report.floor_verdict``)."""
    if goals is None:
        goals = report.goal_table(tables["arms"], tables.get("floor_distance", []), rows)
    out = []
    judged = [g for g in goals if "fastest_within" in g]
    if judged:
        # a negative median cost (the restore's first token below its resident follow-up's) is within any bound and
        # resolves nothing (review finding, 6 Dec 2026: 89ce read "met at 2 of 2 points", both negative): not counted
        below = [g for g in judged if g["fastest_within"] and g["fastest_cost_ms"] < 0]
        met = [g for g in judged if g["fastest_within"] and g["fastest_cost_ms"] >= 0]
        verdicts = [g for g in judged if "fastest_goal" in g]
        count = {v: sum(g["fastest_goal"] == v for g in verdicts) for v in ("met", "not met", "unresolved")}
        out.append(f"The fastest restore path within {report.GOAL_X}\u00d7 of its own floor at every point of "
                   f"{_n(report.GOAL_MIN_TOKENS)} tokens and more, by its first token above the resident follow-up's: "
                   f"met at {len(met)} of {len(judged)} points"
                   + (f" (and {len(below)} with a negative cost, not counted: the restore's median first token was "
                      "below its resident follow-up's, so the floor is not resolved there)" if below else "")
                   + (f"; by that cost's 95% bootstrap interval (met: the whole interval above 0, its upper end within "
                      f"{report.GOAL_X}\u00d7 the floor; not met: its lower end above) met at {count['met']}, not met at "
                      f"{count['not met']}, unresolved "
                      f"at {count['unresolved']}" if verdicts else "") + ".")
    if spans is None:
        spans = report.timeline_goal_table(tables.get("splits", []), tables.get("floor_distance", []), bound)
    early = any(r.get("critical_ms") is not None and r.get("launched_at") == "step_start"
                for r in tables.get("splits", []))
    if spans:
        out.append("By each timed restore's own span instead (the tier's timeline: lookup, disk read and staging, the "
                   "copy into vLLM's blocks"
                   + ("; the GPU buffer's restores are queued at the step's start, where a GPU copies while the runner "
                      "prepares the step's inputs, so their span can overlap that preparation and bounds nothing" if early else
                      "; a lower bound on the cost, without what vLLM's scheduler adds")
                   + f"): within {report.GOAL_X}\u00d7 its floor, its whole 95% interval, at "
                   f"{sum(r['within'] for r in spans)} of {len(spans)}{_unresolved(spans)}.")
    if critical is None:
        critical = report.critical_goal_table(tables.get("splits", []), tables.get("floor_distance", []))
    if critical:
        out.append(f"By what the restore adds to its step (the timeline's lookup, the connector's own scheduler-side work "
                   f"for it where stamped, its timing reference, its own host calls, and the forward pass's wait on its "
                   f"copy, from the tier's stamps; vLLM's allocation of the "
                   f"restored blocks is recorded beside it, not in it: a resident follow-up touches its cached blocks "
                   f"there instead, unstamped), the path that adds least is within {report.GOAL_X}\u00d7 its floor, its "
                   f"whole 95% interval, at {sum(r['within'] for r in critical)} of {len(critical)} points"
                   f"{_unresolved(critical)} (what a restore adds is not bounded by the floor: its copy overlaps host "
                   "work, so below the floor breaks nothing).")
        layered = _layered_points(tables, critical)
        if layered:
            out.append(f"A copy waited for layer by layer runs beside the forward pass, which waits only for its stalls; "
                       f"what the copy's share of the GPU's memory bandwidth costs the forward pass's kernels is not in "
                       f"that sum and is at most the copy's own span. Charged in full, the path that adds least is within "
                       f"{report.GOAL_X}\u00d7 its floor, its whole 95% interval, at "
                       f"{sum(r['charged_within'] for r in layered)} of {len(layered)} points"
                       f"{_unresolved(layered, 'charged_')}.")
    free = report.launch_free_table(rows or [], tables.get("floor_distance", []))
    if free:
        short = [r for r in free if not r["within"]]
        out.append(f"Had the copy's launch cost the engine thread nothing (each restore's addition less its copy call's "
                   f"launch part, the copy call less its ids' write), the path that would add least is within "
                   f"{report.GOAL_X}\u00d7 its floor, its whole 95% interval, at {len(free) - len(short)} of {len(free)} "
                   "points"
                   + ("; short of it, " + "; ".join(
                       f"{r['model']} at {_n(r['context_tokens'])} tokens, {LABEL[r['path']]}: {r['launch_free_ms']:.3f} ms "
                       f"{_ci(r.get('launch_free_ci_ms'))}, {r['verdict']} ({_launch_free_parts(r)})"
                       + (": the host work around the copy, not its launch, keeps it above" if r["x_floor"] else "")
                       for r in short) if short else "") + ".")
    for h in report.handoff_table(rows or []):
        out.append(f"The copy's graph launched by a thread of its own ({report.HANDOFF_PAIR[0]}) against the engine "
                   f"thread ({report.HANDOFF_PAIR[1]}), one engine, every point, {h['model']}: the copy call "
                   f"{h['copy_call_ms']:.3f} against {h['own_copy_call_ms']:.3f} ms (medians); in {h['num_stalls']} of "
                   f"{h['num_handed']} off-thread restores the engine thread's Python right after the request "
                   f"(after_copy, no CUDA call in it) took longer than the engine-launched arm's longest "
                   f"({h['own_longest_after_copy_ms']:.3f} ms, of {h['num_own']})"
                   + (f", by a median of {h['stall_excess_ms']:.3f} ms: a stall the hand-off brings, counted in what "
                      "the restore adds" if h["num_stalls"] else "") + "."
                   + _handoff_timing(h))
    steps = [r for r in tables.get("forward_steps", []) if r["context_tokens"] >= report.GOAL_MIN_TOKENS]
    if steps:
        spanning = [r for r in steps if r["difference_ci_ms"][0] <= 0 <= r["difference_ci_ms"][1]]
        widest = max(r["difference_ci_ms"][1] - r["difference_ci_ms"][0] for r in steps)
        out.append("The follow-up's forward pass on the GPU against the resident follow-up's, which decides between "
                   "the two readings (after a whole copy the difference should hold zero; beside a layered copy it "
                   f"holds the stalls and what the copy's memory traffic cost): the 95% interval holds zero at "
                   f"{len(spanning)} of {len(steps)} (path, point) pairs, and the widest is {widest:,.2f} ms wide"
                   + (": at this many repeats the forward pass's own spread hides a cost of the copy's size"
                      if len(spanning) == len(steps) else "") + ".")
    pairs = tables.get("forward_step_pairs") or []
    if pairs:
        control = [r for r in pairs if (r["path"], r["against"]) == report.FORWARD_CONTROL]
        out.append("Pooled over the points and paired by repeat (one repeat runs its arms back to back on one engine; a "
                   "typical cost across shapes, not any one point's), the forward pass's difference is in the table "
                   "after the points"
                   + ("; its control, a whole copy against the resident follow-up, should hold zero: "
                      + ", ".join(f"{r['median_ms']:+,.3f} ms [{r['median_ci_ms'][0]:+,.3f}, {r['median_ci_ms'][1]:+,.3f}] "
                                  f"{_zero_verdict(r)}" + (f" at {_n(r['min_tokens'])} tokens and more" if r["min_tokens"] else
                                                     " over every point") for r in control)
                      + ("; where it does not, the arms' passes differ by that much with no copy beside them, and the "
                         "other rows are read with that margin" if any(_zero_verdict(r) != "holds zero" for r in control)
                         else "")
                      if control else "") + ".")
    scatter = tables.get("scatter_sources") or []
    rhos = [r for r in scatter if r["rho_forward_other"] is not None]
    if rhos:
        def values(key: str) -> list[float]:
            return [r[key] for r in rhos if r[key] is not None]

        def between(key: str, digits: int) -> str:
            return f"{min(values(key)):.{digits}f} to {max(values(key)):.{digits}f}"

        clocked = [r for r in rhos if r["rho_forward_sm_clock"] is not None]
        # judged by the intervals where the rows carry them (runs rebuilt from 6 Dec 2026), else by the rhos alone
        host = min(values("rho_forward_other")) >= report.FOLLOWS_RHO and all(
            (r.get("rho_forward_other_ci") or [1])[0] is None or (r.get("rho_forward_other_ci") or [1])[0] > 0
            for r in rhos)
        gpu = bool(clocked) and max(abs(v) for v in values("rho_forward_sm_clock")) >= report.FOLLOWS_RHO
        clock_ci = [r.get("rho_forward_sm_clock_ci") for r in clocked]
        clock_nil = all(ci and ci[0] is not None and ci[0] <= 0 <= ci[1] for ci in clock_ci)
        step = f"{suffix_tokens}-token " if suffix_tokens else ""
        ns = sorted({r["n"] for r in rhos})
        out.append(f"What the forward step's spread follows: at {_n(report.GOAL_MIN_TOKENS)} tokens and more the same "
                   f"{step}forward step's 10th percentile is {between('forward_p10_ms', 1)} ms and its 90th "
                   f"{between('forward_p90_ms', 1)} ms; its rank correlation (Spearman, over "
                   f"{ns[0] if ns[0] == ns[-1] else f'{ns[0]}-{ns[-1]}'} "
                   f"follow-ups of the memory and resident arms per point) with the same request's host-only time is "
                   + _rhos(rhos, "rho_forward_other")
                   + (f", with the GPU's SM clock read before it {_rhos(clocked, 'rho_forward_sm_clock')} (clock "
                      f"{min(r['sm_mhz_min'] for r in clocked):,}-{max(r['sm_mhz_max'] for r in clocked):,} MHz)"
                      if clocked else "; no SM clock was read")
                   + _follows(host, bool(clocked), gpu, clock_nil) + ".")
    ratios = [g for g in goals if "retained_within" in g]
    if ratios:
        met = [g for g in ratios if g["retained_within"]]
        worst = max(ratios, key=lambda g: g["retained_x_resident"])
        out.append(f"The retained GPU buffer's first token within {report.GOAL_X}\u00d7 of the engine-resident follow-up: "
                   f"met at {len(met)} of {len(ratios)} points (largest {worst['retained_x_resident']:.2f}\u00d7, "
                   f"{worst['model']} at {_n(worst['context_tokens'])} tokens; medians).")
    return out


def _layered_points(tables: dict, critical: list[dict]) -> list[dict]:
    """The critical-goal rows of points where a restore was copied by layer groups (and so charged)."""
    layered = {(s["model"], s["context_tokens"]) for s in tables.get("splits", []) if s.get("wait_at") == "layer"}
    return [r for r in critical if "charged_ms" in r and (r["model"], r["context_tokens"]) in layered]


# a goal point whose restores record no parts of their step (only the GPU buffer's timeline has them:
# report.critical_goal_table; a point without that arm, or a run from before the timeline, 0015); the cell said nothing
UNTIMED_PARTS = "not timed (no restore here recorded its step's parts)"


def goal_points_table(tables: dict, rows: list[GridRow] | None = None, goals: list[dict] | None = None,
                      critical: list[dict] | None = None) -> str:
    """Issue 13's first goal point by point, every reading in one Markdown table (empty: no point of
    ``GOAL_MIN_TOKENS`` and more has a floor): the fastest path by first token, with its cost's interval
    verdict; the path that adds least to its step, with its parts; the same charged its copy's span;
    and each restore's forward pass against the resident follow-up's."""
    if goals is None:
        goals = report.goal_table(tables["arms"], tables.get("floor_distance", []), rows)
    if critical is None:
        critical = report.critical_goal_table(tables.get("splits", []), tables.get("floor_distance", []))
    goals = {(g["model"], g["context_tokens"]): g for g in goals if "fastest_within" in g}
    critical = {(r["model"], r["context_tokens"]): r for r in critical}
    steps: dict[tuple, list[dict]] = {}
    for r in tables.get("forward_steps", []):
        steps.setdefault((r["model"], r["context_tokens"]), []).append(r)
    points = sorted(set(goals) | set(critical))
    if not points:
        return ""
    layered = {(r["model"], r["context_tokens"]) for r in _layered_points(tables, list(critical.values()))}
    x = "\u00d7"
    head = ["model", "tokens", f"fastest by first token (cost {x} floor)", "adds least to its step",
            "charged its copy's span", "forward pass \u2212 resident's, ms [95%]"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for point in points:
        g, c = goals.get(point), critical.get(point)
        fastest = (f"{LABEL[g['fastest_path']]} {_cost_against_floor(g)}"
                   + (f", {g['fastest_goal']}" if "fastest_goal" in g else "")) if g else ""
        least = (f"{LABEL[c['path']]}: {c['critical_ms']:,.3f} ms {_ci(c.get('critical_ci_ms'))} ({_parts(c)}) / "
                 f"{floor_text(c['floor_ms'])}: **{c['verdict']}**"
                 + ("" if c["within"] else " (not met)")) if c else UNTIMED_PARTS
        charged = (f"{LABEL[c['charged_path']]}: {c['charged_ms']:,.3f} ms {_ci(c.get('charged_ci_ms'))}: "
                   f"{c['charged_verdict']}" + ("" if c["charged_within"] else " (not met)")
                   if point in layered else "as it adds (no copy beside the forward pass)" if c else UNTIMED_PARTS)
        forward = "; ".join(f"{LABEL[r['path']]} {r['difference_ms']:+,.2f} [{r['difference_ci_ms'][0]:+,.2f}, "
                            f"{r['difference_ci_ms'][1]:+,.2f}]" for r in steps.get(point, [])) or "not timed"
        lines.append(f"| {point[0]} | {_n(point[1])} | {fastest} | {least} | {charged} | {forward} |")
    return "\n".join(lines)


def floor_text(floor_ms: float | list[float]) -> str:
    """A goal row's floor in ms as the goal readings print it: one number where it was timed once (or its range is
    one value), else the range timed around the point, "min-max"."""
    lo, hi = report.floor_bounds(floor_ms)
    return f"{lo:,.3f}" if lo == hi else f"{lo:,.3f}-{hi:,.3f}"


def _ci(ci: list | None) -> str:
    """A 95% interval in ms as the goal readings print it; "[no interval]" with fewer than two restores."""
    return "[no interval]" if not ci or None in ci else f"[{ci[0]:,.3f}, {ci[1]:,.3f}]"


def _unresolved(rows: list[dict], prefix: str = "") -> str:
    """What the intervals say of the goal rows not within: how many reach down to the floor (the value cannot be told
    from it) and how many lie below it or have no interval; "" where none."""
    verdicts = [r[f"{prefix}verdict"] for r in rows if not r[f"{prefix}within"]]
    counts = {"at the floor": sum(v == report.AT_THE_FLOOR for v in verdicts),
              "below it": sum(v.startswith("below") for v in verdicts),
              "without an interval": sum(v.startswith("unresolved") for v in verdicts)}
    said = [f"{k} at {v}" for k, v in counts.items() if v]
    return f" (of the rest, {', '.join(said)})" if said else ""


def span_goal_table(tables: dict, bound: bool = True, spans: list[dict] | None = None) -> str:
    """``report.timeline_goal_table`` (``spans`` where the caller has it already) as a Markdown table (empty: no timed
    span at a point of ``GOAL_MIN_TOKENS`` and more with a floor): each path's own span with its 95% interval, its
    floor, the verdict and whether the whole interval is within ``GOAL_X``."""
    if spans is None:
        spans = report.timeline_goal_table(tables.get("splits", []), tables.get("floor_distance", []), bound)
    if not spans:
        return ""
    head = ["model", "tokens", "path", "own span, ms [95%]", "floor, ms", "against the floor",
            f"within {report.GOAL_X}\u00d7"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in spans:
        lines.append(f"| {r['model']} | {_n(r['context_tokens'])} | {LABEL[r['path']]} | {r['restore_ms']:,.3f} "
                     f"{_ci(r['restore_ci_ms'])} | {floor_text(r['floor_ms'])} | {r['verdict']} | "
                     f"{'yes' if r['within'] else 'no'} |")
    return "\n".join(lines)


def _cost_against_floor(g: dict) -> str:
    """A goal row's fastest cost against its floor by ``report.floor_verdict`` where its interval was computed (no
    cost measured, at the floor, or a ratio range of at least 1), else its median ratio only where that is at least 1
    (a median below the floor or below zero is no result). The floor table's own verdict where the row carries it
    (``fastest_verdict``: judged with the run's ``bound``, so a CPU run's cost below its timed floor judges nothing)."""
    if g.get("fastest_verdict"):
        return g["fastest_verdict"]
    if g.get("fastest_cost_ci_ms") and g.get("fastest_floor_ms"):
        low, high = g["fastest_cost_ci_ms"]
        return report.floor_verdict(low, high, list(report.floor_bounds(g["fastest_floor_ms"])))
    ratio = g.get("fastest_x_floor")
    return f"{ratio}\u00d7" if ratio is not None and ratio >= 1 else "median at or below its floor (no interval)"


def _device_label(label: str) -> str:
    """The device-to-device floor's label, said to be one where the CPU build's (a host memcpy) does not say it."""
    return label if "device->device" in label else f"{label} (device->device)"


def _parts(c: dict) -> str:
    """A ``critical_goal_table`` row's parts: lookup, scheduling, clock reference, host (its copy call, with
    the ids' write where recorded, or their hand-over where the launch thread packed them, and hooks), wait."""
    host = f"host {c['host_ms']:,.3f}"
    inner = []
    if c.get("copy_call_ms") is not None:
        ids = f" (ids {c['write_ids_ms']:,.3f})" if c.get("write_ids_ms") is not None else ""
        if ids and c.get("ids_packed_by") == "thread":  # the engine thread only handed them over
            packed = f", packed there in {c['thread_pack_ms']:,.3f}" if c.get("thread_pack_ms") is not None else ""
            ids = f" (ids handed to the launch thread {c['write_ids_ms']:,.3f}{packed})"
        inner.append(f"copy call {c['copy_call_ms']:,.3f}{ids}")
    if c.get("hook_ms") is not None:
        inner.append(f"hooks {c['hook_ms']:,.3f}")
    if inner:
        host += f": {', '.join(inner)}"
    parts = [f"lookup {c['lookup_ms']:,.3f}" if c.get("lookup_ms") is not None else None,
             f"schedule {c['schedule_ms']:,.3f}" if c.get("schedule_ms") is not None else None,
             "clock taken before the step" if c.get("reference_at") == "before_step" else
             f"clock taken after the read {c['measure_ms']:,.3f}" if c.get("reference_at") == "after_read"
             and c.get("measure_ms") is not None else
             f"clock {c['measure_ms']:,.3f}" if c.get("measure_ms") is not None else None, host,
             f"wait {c['forward_wait_ms']:,.3f}"]
    return ", ".join(p for p in parts if p)


def _launch_free_parts(r: dict) -> str:
    """A ``launch_free_table`` row's parts (medians, ms), the named ones only."""
    names = {"lookup_ms": "lookup", "schedule_ms": "schedule", "measure_ms": "clock", "before_copy_ms": "before the copy",
             "write_ids_ms": "ids", "after_copy_ms": "after the copy", "hook_ms": "hooks", "forward_wait_ms": "wait"}
    return ", ".join(f"{label} {r[k]:.3f}" for k, label in names.items() if r.get(k))


def _zero_verdict(r: dict) -> str:
    low, high = r["median_ci_ms"]
    return "above zero" if low > 0 else "below zero" if high < 0 else "holds zero"


def forward_pairs_table(tables: dict) -> str:
    """``forward_step_pairs`` as one Markdown table (empty: none): a row per (path, against), a column
    per ``min_tokens``, each cell the median difference, its 95% bootstrap interval, and its pairs."""
    pairs = tables.get("forward_step_pairs") or []
    if not pairs:
        return ""
    cells = {(r["path"], r["against"], r["min_tokens"]): r for r in pairs}
    spans = sorted({r["min_tokens"] for r in pairs})
    head = ["forward pass of", "against"] + ["every point" if n == 0 else f"{_n(n)} tokens and more" for n in spans]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for path, against in dict.fromkeys((r["path"], r["against"]) for r in pairs):
        row = [LABEL[path], LABEL.get(against, "resident")]
        for n in spans:
            r = cells.get((path, against, n))
            row.append(f"{r['median_ms']:+,.3f} ms [{r['median_ci_ms'][0]:+,.3f}, {r['median_ci_ms'][1]:+,.3f}], "
                       f"{_zero_verdict(r)}, {r['n']} pairs" if r else "")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def public_results(run: RunFiles) -> dict:
    """Section 21's aggregates: per-point medians, crossover rows, floors, floor distance, children.
    The check statuses are the public document's own ``checks`` list (names longer than a public key)."""
    tables = recomputed_tables(run)
    floors = run.results.get("floors") or {}
    return {
        "section": "crossover", "run_id": run.results.get("run_id"), "status": run.results.get("status"),
        "arms": [{k: t[k] for k in ("model", "context_tokens", "arm", "n", "context_mib", "ttft_ms", "ttft_min_ms",
                                    "makespan_ms", "disk_read_mib")} for t in tables["arms"]],
        "crossover": [{"model": r["model"], "path": r["path"], "control": r["control"], "crossover_tokens": r["crossover_tokens"],
                       "speedup_by_context_tokens": {str(n): v for n, v in _speedups(r).items()},
                       **({"speedup_ci_by_context_tokens": {k.split("@")[1]: v for k, v in r.items()
                                                            if k.startswith("speedup_ci@")}}
                          if any(k.startswith("speedup_ci@") for k in r) else {})} for r in tables["crossover"]],
        "floors": {k: {x: (f or {}).get(x) for x in ("label", "bytes", "gib_per_s", "best_gib_per_s")}
                   for k, f in floors.items()},
        "floor_distance": [dict(r) for r in tables.get("floor_distance", [])],
        **({"splits": [dict(r) for r in tables["splits"]]} if tables["splits"] else {}),
        **({"restore_resolution": [dict(r) for r in tables["restore_resolution"]]}
           if tables.get("restore_resolution") else {}),
        "models": [{k: getattr(m, k) for k in ("model", "path", "kv_bytes_per_token", "status", "engine_start_s")}
                   for m in run.records("models.jsonl")],
        # per restore path, its restores whose KV was digested and those that left KV other than the computed (runs
        # from afabb7f; absent before, so older public documents read as they were)
        **({"kv_digest": {path: {k: d[k] for k in ("num_compared", "num_differing")} for path, d in digests.items()}}
           if (digests := kv_digest_by_path(run)) else {}),
        # and, in such a run, the restores whose KV was not compared, by arm (vLLM's CPU tier before 7 Dec 2026): what
        # "every restore" in its KV check does not cover
        **({"kv_not_compared": uncompared} if digests and (uncompared := uncompared_restores(all_followups(run)))
           else {}),
    }


def _other_engine(tables: dict, row: dict, tokens: int) -> str:
    """Where a crossover row's restores ran on another engine than its recompute arm (its ``control``: vLLM's CPU
    tier, the GPU buffer, the LMCache server set against the LMCache engine's, one engine per tier), its speed-up sets
    one engine's restore against another's recompute; say so, with each engine's resident follow-up at ``tokens``,
    which shows how far the engines themselves differ (review finding, 6 Dec 2026: a47e's vLLM CPU-tier 3.33x is
    over the LMCache engine's recompute, residents 12.3 ms there and 16.8 ms on its own engine)."""
    path = row["path"]
    if _own_control(row):  # its own engine's recompute (or LMCache's own path)
        return ""
    ttft = _ttft_at(tables, row["model"], tokens)
    there, here = ttft.get(RESIDENT_OF["dram"]), ttft.get(RESIDENT_OF.get(path, ""))
    if there is None or here is None:
        return ", on another engine"
    return f", on another engine: its resident follow-up {there:,.1f} ms, this engine's {here:,.1f} ms"


def _ttft_at(tables: dict, model: str, tokens: int) -> dict[str, float]:
    """Arm -> median first token (ms) of the arms table at (``model``, ``tokens``)."""
    return {t["arm"]: t["ttft_ms"] for t in tables["arms"] if (t["model"], t["context_tokens"]) == (model, tokens)}


def _recompute_ms(tables: dict, row: dict, tokens: int) -> float | None:
    """The first token at ``tokens`` of the recompute arm a crossover row's speed-ups are over (its ``control``)."""
    return _ttft_at(tables, row["model"], tokens).get(_row_control(row))


def _row_control(row: dict) -> str:
    """A crossover row's ``control`` (``report.crossover_table``: one recompute arm for the whole row); a row from
    before the column (or with none) was over the LMCache engine's ``recompute``. Every sentence that names or reads
    a row's control goes through here, so none can name one control beside another's number."""
    return row.get("control") or "recompute"


def _own_control(row: dict) -> bool:
    """Whether a crossover row's speed-ups are over its own engine's recompute (its ``control``: the tier's recompute
    arm, or LMCache's ``recompute`` for LMCache's own paths)."""
    return TIER_OF[_row_control(row)] == TIER_OF[row["path"]]


def _over(row: dict) -> str:
    """Whose recompute a speed-up is over, for the verdict: a run of several engines has one recompute each where it
    measured it, and the speed-ups of one sentence may stand on different ones (review finding, 6 Dec 2026: 458a's
    verdict named vLLM's CPU tier's 3.1x beside DRAM's 1.84x, over 158 and 156 ms of two engines, and said neither)."""
    return "over its own engine's recompute" if _own_control(row) else "over the LMCache engine's recompute (another engine)"


def verdict(run: RunFiles) -> list[str]:
    """One sentence per model: which restores beat recompute, from which context length, and the
    speed-up at the longest context (medians of NUM_REPEATS follow-ups)."""
    run = RunFiles.of(run)
    tables = recomputed_tables(run)
    per_model = _by_model(tables["crossover"])
    if not per_model:  # the children that measured no restore, by their status (the answer gives their accounts)
        children = "; ".join(f"{g['model']} {g['tier']} child: {g['child']}" for g in gaps.unmeasured(run, report.RESTORES))
        return ["No verdict: no measured row has both a restore and the recompute control"
                + (f" ({children})." if children else ".")]
    repeats = run.params.NUM_REPEATS
    out = []
    for model, paths in per_model.items():
        wins = [r for r in paths.values() if r["crossover_tokens"] is not None]
        never = [r for r in paths.values() if r["crossover_tokens"] is None]
        longest = max(max(_speedups(r)) for r in paths.values())
        shortest = min(min(_speedups(r)) for r in paths.values())
        parts = []
        if wins:
            best = max(wins, key=lambda r: _speedups(r).get(longest, 0))
            points = sorted({r["crossover_tokens"] for r in wins})
            # a win at the grid's shortest length says nothing of shorter ones: the sentence says where it starts
            where = {t: (f"at {_n(t)} tokens (the only length measured)" if shortest == longest else
                         f"from {_n(t)} tokens (the shortest measured)" if t == shortest else f"from {_n(t)} tokens")
                     for t in points}
            parts.append(f"{model}: restoring beats recomputing " + " and ".join(
                f"{where[t]} on " + ", ".join(LABEL[r["path"]] for r in wins if r["crossover_tokens"] == t)
                for t in points) + f" (best {_speedup(best, longest, 1)} faster to the "
                         f"first token at {_n(longest)} tokens, {LABEL[best['path']]} "
                         f"{_over(best)}"
                         + (f"; medians of {repeats} repeats" if repeats else "")
                         + ("; 95% interval)" if _has_interval(best, longest) else ")"))
        if never:
            parts.append(("" if wins else f"{model}: ") + ", ".join(LABEL[r["path"]] for r in never)
                         + f" never beat{'s' * (len(never) == 1)} recomputing up to {_n(longest)} tokens"
                         + (" (" + ", ".join(f"{LABEL[r['path']]} {_speedup(r, longest)}" for r in never
                                             if _has_interval(r, longest)) + " there)"
                            if any(_has_interval(r, longest) for r in never) else ""))
        sentence = "; ".join(parts) + "."
        if len(sentence) <= MAX_VERDICT_CHARS or len(parts) == 1:
            out.append(sentence)
        else:  # many paths at one length: what beats recompute and what never does, a sentence each
            out += [parts[0] + ".", f"{model}: {parts[1]}."]
    digests = kv_digest_by_path(run)
    if wrong := not_as_computed(digests):
        out.append(f"But {_paths_named(wrong)} restores left KV other than the computed in vLLM's blocks ("
                   + "; ".join(differing_of(digests[p]) for p in wrong)
                   + "): those speed-ups are a copy's, not a restore's.")
    return out


def findings(run: RunFiles) -> list[dict]:
    """One row per restore path: per model, the context length from which it beats recompute and
    the speed-up (recompute time to first token / restore time) at the longest context, with its 95% interval."""
    run = RunFiles.of(run)
    tables = recomputed_tables(run)
    rows: dict[str, dict] = {}
    digests = kv_digest_by_path(run)
    wrong = not_as_computed(digests)
    for model, paths in _by_model(tables["crossover"]).items():
        for path, r in paths.items():
            kv_note = f"; KV not as computed in {differing_of(digests[path])} restores" if path in wrong else ""
            speed = _speedups(r)
            longest = max(speed)
            point = r["crossover_tokens"]
            rec = _recompute_ms(tables, r, longest)
            recompute = ((f" (its own engine's recompute {rec:,.0f} ms)" if _own_control(r)
                          else f" (recompute {rec:,.0f} ms{_other_engine(tables, r, longest)})") if rec else "")
            if len(speed) == 1:  # one length: no crossover to name, only where it stands there
                rows.setdefault(path, {"restore": LABEL[path]})[model] = (
                    f"{_speedup(r, longest)} at {_n(longest)} tokens, the only length measured{recompute}"
                    + kv_note)
                continue
            rows.setdefault(path, {"restore": LABEL[path]})[model] = (
                (f"from {_n(point)} tokens" if point is not None else "never")
                + f"; {_speedup(r, longest)} at {_n(longest)}" + recompute + kv_note)
    # a planned restore path with no crossover row at all still gets its row: not measured, and its child's status
    # (060001-01f9: the server tier's child finished store_short, and the first screen had no table to say so)
    measured = {(model, path) for model, paths in _by_model(tables["crossover"]).items() for path in paths}
    for g in gaps.unmeasured(run, report.RESTORES):
        for path in g["arms"].split(", "):
            if (g["model"], path) not in measured:
                rows.setdefault(path, {"restore": LABEL.get(path, path)})[g["model"]] = (
                    f"not measured ({g['tier']} child: {g['child']})")
    return list(rows.values())[:10]


def _point_speedups(doc: dict) -> dict[tuple[str, str, int], tuple[float, list | None]]:
    """(model, path, context tokens) -> (speed-up, its 95% interval or None), from a public document's crossover."""
    out = {}
    for r in (doc.get("results") or {}).get("crossover") or []:
        intervals = r.get("speedup_ci_by_context_tokens") or {}
        for n, value in (r.get("speedup_by_context_tokens") or {}).items():
            if value is not None:
                out[(r["model"], r["path"], int(n))] = (value, intervals.get(n))
    return out


def _quoted_point(doc: dict, model: str) -> tuple[str, int] | None:
    """(path, context tokens) of the speed-up ``verdict`` quotes for ``model`` as 'best': the largest at the model's
    longest length among the paths that beat recompute (a crossover); None where none does. Documents from before
    the crossover field: every path."""
    rows = [r for r in (doc.get("results") or {}).get("crossover") or [] if r.get("model") == model]
    speed: dict[str, dict[int, float]] = {r["path"]: {} for r in rows}
    for (m, path, n), (value, _) in _point_speedups(doc).items():
        if m == model:
            speed[path][n] = value
    if not any(speed.values()):
        return None
    longest = max(n for v in speed.values() for n in v)
    wins = [r["path"] for r in rows if r.get("crossover_tokens") is not None or "crossover_tokens" not in r]
    best = max(wins, key=lambda p: speed[p].get(longest, 0), default=None)
    return None if best is None or longest not in speed[best] else (best, longest)


def _setup(doc: dict) -> tuple:
    """What must match for two runs' speed-ups to be the same measurement repeated: the device, the engine stack,
    the dtype and the weights."""
    env, params = doc.get("environment") or {}, doc.get("params") or {}
    packages = recorded_packages(env)
    return (env.get("device"), packages.get("vllm"), packages.get("lmcache"), params.get("DTYPE"), params.get("WEIGHTS"))


def _control_in(doc: dict, model: str, path: str) -> str:
    """The recompute arm a public document's speed-ups of (``model``, ``path``) are over: its crossover row's
    ``control``; a document from before that field, ``arms.control_of`` of the arms its ``results.arms`` measured
    (one decision for the row, as the table makes it; a document without them: the LMCache engine's ``recompute``)."""
    results = doc.get("results") or {}
    row = next((r for r in results.get("crossover") or [] if (r.get("model"), r.get("path")) == (model, path)), {})
    if row.get("control"):
        return row["control"]
    points = [(a.get("model"), a.get("context_tokens"), a.get("arm")) for a in results.get("arms") or []]
    return control_of(path, measured_at(points).get(model, {}))


def replications(standing: dict, others: list[dict]) -> str:
    """The standing run's best speed-up per model (the point its verdict quotes, ``_quoted_point``: the largest at the
    model's longest length among the paths that beat recompute) beside the same point (model, path, context length)
    in the section's other published runs of the same setup (``_setup``: device, vLLM and LMCache versions, dtype,
    weights), each with its own interval and status: a run's interval holds within that run only, and these say how
    far the figure moves between runs. A run whose speed-up there is over another recompute arm (``arms.control_of``:
    its tier's own engine's, or the LMCache engine's) measured another ratio and is left out. '' where no other run
    measured the point. Public documents only."""
    mine = _point_speedups(standing)
    device = (standing.get("environment") or {}).get("device")
    peers = [d for d in others if _setup(d) == _setup(standing)]
    parts = []
    for model in sorted({m for m, _, _ in mine}):
        quoted = _quoted_point(standing, model)
        if quoted is None:
            continue
        path, n = quoted
        value = mine[(model, path, n)][0]
        control = _control_in(standing, model, path)
        seen = []
        for d in sorted(peers, key=lambda d: d["run_id"]):
            point = _point_speedups(d).get((model, path, n))
            if point is None or _control_in(d, model, path) != control:
                continue  # not measured there, or over another engine's recompute: another figure
            ci = f" [{point[1][0]:.2f}, {point[1][1]:.2f}]" if point[1] else ""
            status = "" if d.get("status") == "passed" else f", {d.get('status')}"
            seen.append((point[0], f"{point[0]:.2f}\u00d7{ci} ({d['run_id'][-4:]}{status})"))
        if not seen:
            continue
        values = [value] + [v for v, _ in seen]
        parts.append(f"{model} {LABEL.get(path, path)} at {_n(n)} tokens in {len(seen)} other {device} run"
                     f"{'s' if len(seen) > 1 else ''}: " + ", ".join(text for _, text in seen)
                     + f"; {min(values):.2f}\u2013{max(values):.2f}\u00d7 across the {len(values)} runs")
    text = ("The same point elsewhere (each interval holds within its own run): " + "; ".join(parts) + ".") if parts else ""
    return " ".join(t for t in (text, _copies_elsewhere(standing, others)) if t)


def _copies_elsewhere(standing: dict, others: list[dict]) -> str:
    """Where the path the standing run's verdict quotes left KV other than the computed in vLLM's blocks in another
    published run on the same vLLM and LMCache (any card: the copy is the software's), one sentence that says so, with
    each run's count; '' where no run digested it or every digest was equal."""
    versions = recorded_packages(standing.get("environment") or {})
    stack = (versions.get("vllm"), versions.get("lmcache"))
    paths = {quoted[0] for model in {m for m, _, _ in _point_speedups(standing)}
             if (quoted := _quoted_point(standing, model)) is not None}
    out = []
    for path in sorted(paths):
        seen = []
        for d in sorted(others, key=lambda d: d["run_id"]):
            packages = recorded_packages(d.get("environment") or {})
            digest = ((d.get("results") or {}).get("kv_digest") or {}).get(path)
            if (packages.get("vllm"), packages.get("lmcache")) == stack and digest and digest["num_differing"]:
                seen.append(f"{d['run_id'][-4:]}: {differing_of(digest)}")
        if seen:
            out.append(f"But on the same stack (vLLM {stack[0]}, LMCache {stack[1]}) {_paths_named([path])} restores "
                       f"left KV other than the computed in vLLM's blocks wherever it was digested ({'; '.join(seen)}): "
                       f"that speed-up is a copy's time, not a restore's.")
    return " ".join(out)
