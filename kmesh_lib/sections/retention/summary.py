"""Section 16 for people: the headline figures, the closing answer, and what the section publishes.

All three are computed from the run's raw records (the same tables ``checks`` compares with
results.json), so a report, the README row and ``public-results.json`` cannot disagree.
"""
from __future__ import annotations

from kmesh_lib.base.records import RunFiles
from kmesh_lib.lmcache.lookups import READS
from kmesh_lib.sections.retention.captures import RetentionGroup
from kmesh_lib.sections.retention.checks import lookup_kind, measured_lines
from kmesh_lib.sections.retention.report import (
    FASTER,
    SLOWER,
    UNRESOLVED,
    arm_rows,
    arrival_rows,
    bytes_agree,
    combo,
    has_two_counters,
    mechanism_totals,
    ratio_rows,
    restore_rows,
    usable,
)
from kmesh_lib.workloads.context_checks import topology_rows

PUBLIC_ARM_KEYS = ("path", "group_size", "arrival", "singleflight", "arm", "groups_ok", "groups_excluded",
                   "ttft_a_ms_median", "ttft_a_ms_p25", "ttft_a_ms_p75", "makespan_ms_median", "makespan_ms_p25",
                   "makespan_ms_p75", "disk_mib_prep", "disk_mib_followup", "disk_mib_group", "rereads_per_group",
                   "cross_check")


def _by(rows: list[dict]) -> dict[tuple, dict]:
    return {(r["path"], r["group_size"], r.get("arrival", "together"), r.get("singleflight", "n/a"), r["arm"]): r
            for r in rows if r["groups_ok"]}


def _first_combo(by: dict, path: str) -> tuple[str, str] | None:
    """The (arrival, singleflight) a path's headline uses: the first pattern, singleflight off where it ran."""
    combos = sorted({(a, sf) for p, _, a, sf, _ in by if p == path}, key=lambda c: (c[1] == "on", c[0] != "together", c))
    return combos[0] if combos else None


def _pairs_text(rows, key: str, fmt: str, ratios: list[dict] | None = None) -> dict[str, str]:
    """Per external path: "N=4: <retain> vs <discard>; N=8: ... [arrival, singleflight]" for one column; with
    ``ratios`` (``ratio_rows``), each pair of A's first tokens followed by their paired difference and its interval."""
    by, out = _by(rows), {}
    diff = {(r["path"], r["group_size"], r["arrival"], r["singleflight"]): r for r in ratios or []}
    for path in sorted({p for p, *_ in by if p != "engine"}):
        shown = _first_combo(by, path)
        parts = [f"N={n}: {fmt.format(by[(path, n, *shown, 'retain')][key])} vs "
                 f"{fmt.format(by[(path, n, *shown, 'discard')][key])}"
                 + (f" ({_difference(diff[(path, n, *shown)], 'ttft_a_ms', short=True)})" if (path, n, *shown) in diff else "")
                 for n in sorted({n for p, n, *_ in by if p == path})
                 if (path, n, *shown, "retain") in by and (path, n, *shown, "discard") in by]
        if parts:
            out[path] = "; ".join(parts) + f" [{shown[0]}" + ("" if shown[1] == "n/a" else f", singleflight {shown[1]}") + "]"
    return out


def _num(x: float) -> str:
    """A difference in ms as the sentences show it: whole ms, tenths below 10 (so a small interval's end that is not 0
    does not read as 0)."""
    return f"{x:.0f}" if abs(x) >= 10 else f"{x:.1f}"


def _level(coverage: float | None) -> str:
    """An interval's confidence as a sentence gives it: 95% where its exact coverage reaches it, else that coverage
    (the range of 5 pairs: 93.8%)."""
    return "95%" if coverage is None or coverage >= 0.95 else f"{100 * coverage:.1f}%"


def _difference(r: dict, label: str, short: bool = False) -> str:
    """A ``ratio_rows`` row's paired difference discard - retain of ``label`` in words, with its interval and the
    confidence it reaches (``_level``): "64 ms slower without retention (95% CI 58 to 70)", at 5 pairs "(93.8% CI 46
    to 82, ...)"; an interval that contains 0 reads "no difference measured"
    (the median difference beside it); fewer than two pairs (``UNRESOLVED``) has none: "no interval: 1 pair"; 2-4
    pairs' range is too seldom right to judge by (``report.MIN_COVERAGE``): "not resolved: 3 pairs, whose range ...".
    ``short``: "+64 ms, 95% CI 58 to 70"."""
    median, low, high, coverage = (r.get(f"{label}: discard - retain{x}") for x in
                                   ("", ", CI low", ", CI high", ", CI coverage"))
    verdict = r[f"{label}: difference"]
    if verdict == UNRESOLVED:
        if low is None or high is None or coverage is None:
            return f"no interval: {r['pairs']} pair{'s' * (r['pairs'] != 1)}"
        return (f"not resolved: {r['pairs']} pairs, whose range ({_num(low)} to {_num(high)}) covers the median "
                f"difference only {100 * coverage:.1f}% of the time")
    ci = f"{_level(coverage)} CI {_num(low)} to {_num(high)}"
    if short:
        return f"{'+' * (median > 0)}{_num(median)} ms, {ci}"
    if verdict in (SLOWER, FASTER):
        return f"{_num(abs(median))} ms {verdict} ({ci}, median of {r['pairs']} paired differences)"
    return f"no difference measured ({'+' * (median > 0)}{_num(median)} ms, {ci}, median of {r['pairs']} paired differences)"


def _reads_by_arrival(groups: list[RetentionGroup]) -> dict[str, str]:
    """Per MP path: the discard follow-ups' context reads per group (median) by arrival and singleflight."""
    rows = [r for r in arrival_rows(groups) if r["arm"] == "discard" and r["singleflight"] != "n/a"]
    out = {}
    for path in sorted({r["path"] for r in rows}):
        for n in sorted({r["group_size"] for r in rows if r["path"] == path}):
            mine = [r for r in rows if r["path"] == path and r["group_size"] == n]
            by = {(r["arrival"], r["singleflight"]): r["context reads per group (median)"] for r in mine}
            why = {r["arrival"]: _why_reads(mechanism_totals(
                       [g for g in usable(groups) if (*combo(g), g.arm) == (path, n, r["arrival"], "off", "discard")]),
                       r["context reads per group (median)"]) for r in mine if r["singleflight"] == "off"}
            arrivals = sorted({a for a, _ in by}, key=lambda a: (a != "together", a))
            # one line per group size: a sweep of many spacings stays a readable headline
            out[f"{path} N={n}: discard follow-up reads/group by arrival (singleflight off/on) and why"] = ", ".join(
                f"{a} " + "/".join(f"{by[(a, sf)]:g}" for sf in ("off", "on") if (a, sf) in by)
                + (f" ({why[a]})" if why.get(a) else "") for a in arrivals)
    return out


def _why_reads(totals: dict[str, int] | None, reads: float) -> str | None:
    """The mechanism behind a read count (``mechanism_totals``; the arrival table has them all): where
    the group read more than once, the most frequent rereading one; else the most frequent one of the
    lookups besides each group's first load, which read nothing. None without a lookup trace."""
    rest = [(m, k) for m, k in (totals or {}).items() if k and m != "first_load" and (m in READS) == (reads > 1)]
    return max(rest, key=lambda mk: mk[1])[0] if rest else None


def _times(x: float) -> str:
    return "once" if x == 1 else f"{x:g} times"


def headline(run) -> dict[str, str]:
    run = RunFiles.of(run)
    groups = run.records("groups.jsonl")
    rows = arm_rows(groups)
    out = {}
    for path, text in _pairs_text(rows, "disk_mib_group", "{:.0f}").items():
        out[f"{path}: disk MiB per group, retain vs discard"] = text
    for path, text in _pairs_text(rows, "ttft_a_ms_median", "{:.0f}", ratio_rows(rows, groups)).items():
        out[f"{path}: A's first token, median ms, retain vs discard (discard - retain)"] = text
    out.update(_reads_by_arrival(groups))
    external = [g for g in usable(groups) if g.path != "engine"]
    if external:
        agree = sum(has_two_counters(g) and bytes_agree(g) for g in external)
        out["byte counters agree"] = f"in {agree} of {len(external)} groups"
    return dict(list(out.items())[:6])


def answer(run) -> str:
    """The closing paragraph: does retention stop repeat reads here, from this run's own numbers."""
    run = RunFiles.of(run)
    groups = run.records("groups.jsonl")
    rows = arm_rows(groups)
    ratios = ratio_rows(rows, groups)
    if not ratios:
        return ("**No answer from this run:** no path ran both the retain and the discard arm with usable groups, "
                "so there is nothing to compare (see the checks and the not-run rows).")
    by = _by(rows)
    arrivals = {(r["path"], r["group_size"], r["arrival"], r["singleflight"]): r for r in arrival_rows(groups)
                if r["arm"] == "discard"}
    parts = []
    for path in sorted({r["path"] for r in ratios}):
        combo = _first_combo(by, path)
        for r in [r for r in ratios if r["path"] == path and (r["arrival"], r["singleflight"]) == combo]:
            n = r["group_size"]
            gs = [g for g in usable(groups) if g.path == path and g.group_size == n and g.arm == "discard"]
            kind = lookup_kind(gs[0]) if gs else "prefetch"
            reread = r["disk MiB/group: discard"] > r["disk MiB/group: retain"]
            verdict = ("keeping the tier's copy **stops the repeat reads**" if reread else
                       "**neither arm rereads**, so retention has nothing to stop" + (
                           " (the connector loads only what vLLM lacks, and vLLM holds the context)"
                           if kind == "on_demand" else ""))
            text = (f"On the {path} path with groups of {n} ({combo[0]}"
                    + ("" if combo[1] == "n/a" else f", singleflight {combo[1]}") + f"), {verdict}: retain reads "
                    f"{r['disk MiB/group: retain']:.0f} MiB per group, discard {r['disk MiB/group: discard']:.0f} MiB. "
                    f"A's first token (median) is {r['ttft_a_ms: retain']:.0f} ms with retention and "
                    f"{r['ttft_a_ms: discard']:.0f} ms without ({r['ttft_a_ms: discard/retain']:.2f}x), "
                    f"{_difference(r, 'ttft_a_ms')}; the makespan {r['makespan_ms: retain']:.0f} vs "
                    f"{r['makespan_ms: discard']:.0f} ms, {_difference(r, 'makespan_ms')}.")
            mine = {(a, sf): row for (p, m, a, sf), row in arrivals.items() if p == path and m == n}
            reads = {row["context reads per group (median)"] for row in mine.values()}
            if len(mine) > 1 and len(reads) == 1 and "no lookup trace" in next(iter(mine.values()))["mechanisms (all groups)"]:
                text += f" In every arrival pattern the discard follow-ups read the context {_times(reads.pop())} per group."
            elif len(mine) > 1:
                order = sorted(mine, key=lambda c: (c[1] != combo[1], c[1], c[0] != "together", c[0]))
                text += " Without retention the follow-ups read the context " + "; ".join(
                    f"{_times(mine[c]['context reads per group (median)'])} per group {c[0]}"
                    + ("" if c[1] == "n/a" else f" with the singleflight {c[1]}")
                    + f" ({mine[c]['mechanisms (all groups)']})" for c in order) + "."
            split = [x for x in restore_rows(groups) if x["path"] == path and x["group_size"] == n
                     and x["phase"] == "prep" and x["source"] == "disk" and (x["arrival"], "n/a") == combo]
            if split:
                x = split[0]
                text += (f" The warm-up's restore from the disk tier took {x['restore ms']} ms (median; disk read "
                         f"{x['disk_read ms']}, staging {x['staging ms']}, copy into vLLM {x['copy ms']} ms)"
                         + ("" if x["to_first_token ms"] is None else f", then {x['to_first_token ms']} ms to its first token")
                         + ".")
            parts.append(text)
    pairs = min(r["pairs"] for r in ratios)
    weak = [f"A difference is the median of the pairs' differences discard - retain ({pairs} or more pairs per "
            "combination: a pair runs both arms back to back on one engine with the same follow-ups), with its "
            "distribution-free interval from the differences' order statistics, 95% where the pairs reach it, else "
            "the confidence they reach, given with each interval (the range of 5 pairs: 93.8%; fewer pairs judge "
            "nothing); where the interval contains 0, no difference is measured."]
    strict = measured_lines(run)
    if strict:
        weak.append("Measured, not assumed: " + "; ".join(strict) + ".")
    return "\n\n".join(parts) + "\n\n" + " ".join(weak)


def public_results(run) -> dict:
    """The aggregates section 16 publishes: an allow-list of numbers, counts, short labels and hashes."""
    run = RunFiles.of(run)
    groups, blocks = run.records("groups.jsonl"), run.records("blocks.jsonl")
    rows = arm_rows(groups)
    return {
        "arms": [{k: r[k] for k in PUBLIC_ARM_KEYS if k in r} for r in rows],
        "discard_to_retain": [{k: v for k, v in r.items() if v is None or isinstance(v, (int, float, str))}
                              for r in ratio_rows(rows, groups)],
        "arrivals": [{k: v for k, v in r.items() if v is None or isinstance(v, (int, float, str))}
                     for r in arrival_rows(groups)],
        "restore_split": [{k: v for k, v in r.items() if v is None or isinstance(v, (int, float, str))}
                          for r in restore_rows(groups)],
        "not_run": [{"path": str(b.path), "group_size": b.group_size, "status": str(b.status)}
                    for b in blocks if b.status != "ok"],
        "topology": [{"row": str(r["row"]), "status": str(r["status"]), "detail": str(r["detail"])}
                     for r in topology_rows(blocks)],
        "groups_recorded": len(groups),
        "engine_runs_ok": sum(b.status == "ok" for b in blocks),
        "raw_sha256": {name: run.raw_sha256(name) for name in run.raw_names()},
    }


def _main_pairs(run) -> list[tuple[str, int, tuple[str, str], dict, dict, dict]]:
    """Per path and group size, at the path's headline pattern: (path, N, pattern, retain row, discard row, the
    ``ratio_rows`` row with the paired differences)."""
    groups = RunFiles.of(run).records("groups.jsonl")
    rows = arm_rows(groups)
    by = _by(rows)
    ratios = {(r["path"], r["group_size"], r["arrival"], r["singleflight"]): r for r in ratio_rows(rows, groups)}
    out = []
    for path in sorted({p for p, *_ in by if p != "engine"}):
        shown = _first_combo(by, path)
        for n in sorted({n for p, n, *_ in by if p == path}):
            keep, drop = by.get((path, n, *shown, "retain")), by.get((path, n, *shown, "discard"))
            if keep and drop:
                out.append((path, n, shown, keep, drop, ratios[(path, n, *shown)]))
    return out


def verdict(run) -> list[str]:
    """One sentence: on which paths keeping the copy stops repeat reads, with the disk MiB per group and A's first
    token of the path where it matters most: both arms' medians and the paired difference discard - retain with its
    interval and the confidence it reaches (``_level``; "no difference measured" where the interval contains 0)."""
    pairs = _main_pairs(run)
    if not pairs:
        return ["No verdict: no path ran both the retain and the discard arm with usable groups."]
    stops = sorted({p for p, _, _, keep, drop, _ in pairs if drop["disk_mib_group"] > keep["disk_mib_group"]})
    same = sorted({p for p, *_ in pairs} - set(stops))
    parts = []
    if stops:
        path, n, shown, keep, drop, r = max((x for x in pairs if x[0] in stops),
                                            key=lambda x: x[4]["disk_mib_group"] - x[3]["disk_mib_group"])
        parts.append(f"Yes on the {' and '.join(stops)} path{'s' * (len(stops) > 1)}: without retention a group of {n} "
                     f"({_arrival_words(shown)}) reads "
                     f"{drop['disk_mib_group']:.0f} MiB from disk instead of {keep['disk_mib_group']:.0f}, and A's first "
                     f"token takes {drop['ttft_a_ms_median']:.0f} ms instead of {keep['ttft_a_ms_median']:.0f} ms (medians), "
                     + _difference(r, "ttft_a_ms"))
    if same:
        parts.append(f"{'on' if stops else 'No: on'} the {' and '.join(same)} path{'s' * (len(same) > 1)} neither arm "
                     "rereads (the same MiB per group), so retention has nothing to stop")
    return ["; ".join(parts) + "."]


def _arrival_words(shown: tuple[str, str]) -> str:
    """The arrival pattern and singleflight setting a verdict's numbers are of, in words: "follow-ups submitted
    together, singleflight off"; "follow-ups 100ms apart"; "follow-ups 1step apart". The MiB and first tokens of one
    pattern are not another's (6282: a group of 4 reads 96 MiB without retention together, 240 MiB 100 ms apart),
    so the verdict names its own (review finding: it named none)."""
    arrival, singleflight = shown
    words = "follow-ups submitted together" if arrival == "together" else f"follow-ups {arrival} apart"
    return words + ("" if singleflight == "n/a" else f", singleflight {singleflight}")


def findings(run) -> list[dict]:
    """Per path and group size (the path's first arrival pattern): disk MiB per group, A's first token (both arms'
    medians) and the paired difference discard - retain with its interval (the spreads are in the arms table)."""
    return [{"path": path, "group": f"{n} requests, {shown[0]}" + ("" if shown[1] == "n/a" else f", singleflight {shown[1]}"),
             "disk MiB/group retain → discard": f"{keep['disk_mib_group']:.0f} → {drop['disk_mib_group']:.0f}",
             "A's first token retain → discard (medians)": f"{keep['ttft_a_ms_median']:.0f} → {drop['ttft_a_ms_median']:.0f} ms",
             "discard − retain (CI)": _difference(r, "ttft_a_ms", short=True) + (
                 "" if r["ttft_a_ms: difference"] in (SLOWER, FASTER, UNRESOLVED) else ": no difference measured"),
             "pairs": r["pairs"]}
            for path, n, shown, keep, drop, r in _main_pairs(run)][:10]
