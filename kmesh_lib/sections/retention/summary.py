"""Section 16 for people: the headline figures, the closing answer, and what the section publishes.

All three are computed from the run's raw records (the same tables ``checks`` compares with
results.json), so a report, the README row and ``public-results.json`` cannot disagree.
"""
from __future__ import annotations

from kmesh_lib.sections.retention.checks import as_run, lookup_kind, measured_lines
from kmesh_lib.sections.retention.report import arm_rows, bytes_agree, has_two_counters, ratio_rows, usable

PUBLIC_ARM_KEYS = ("path", "group_size", "arm", "groups_ok", "groups_excluded", "ttft_a_ms_median", "ttft_a_ms_p25",
                   "ttft_a_ms_p75", "makespan_ms_median", "makespan_ms_p25", "makespan_ms_p75", "disk_mib_prep",
                   "disk_mib_followup", "disk_mib_group", "rereads_per_group", "cross_check")


def _by(rows: list[dict]) -> dict[tuple, dict]:
    return {(r["path"], r["group_size"], r["arm"]): r for r in rows if r["groups_ok"]}


def _pairs_text(rows, key: str, fmt: str) -> dict[str, str]:
    """Per external path: "N=4: <retain> vs <discard>; N=8: ..." for one column of the arms table."""
    by, out = _by(rows), {}
    for path in sorted({p for p, _, _ in by if p != "engine"}):
        parts = [f"N={n}: {fmt.format(by[(path, n, 'retain')][key])} vs {fmt.format(by[(path, n, 'discard')][key])}"
                 for n in sorted({n for p, n, _ in by if p == path})
                 if (path, n, "retain") in by and (path, n, "discard") in by]
        if parts:
            out[path] = "; ".join(parts)
    return out


def headline(run) -> dict[str, str]:
    run = as_run(run)
    groups = run.raw("groups.jsonl")
    rows = arm_rows(groups)
    out = {}
    for path, text in _pairs_text(rows, "disk_mib_group", "{:.0f}").items():
        out[f"{path}: disk MiB per group, retain vs discard"] = text
    for path, text in _pairs_text(rows, "ttft_a_ms_median", "{:.0f}").items():
        out[f"{path}: A's first token, median ms, retain vs discard"] = text
    for path, text in _pairs_text(rows, "makespan_ms_median", "{:.0f}").items():
        out[f"{path}: makespan, median ms, retain vs discard"] = text
    external = [g for g in usable(groups) if g["path"] != "engine"]
    if external:
        agree = sum(has_two_counters(g) and bytes_agree(g) for g in external)
        out["byte counters agree"] = f"in {agree} of {len(external)} groups"
    return out


def answer(run) -> str:
    """The closing paragraph: does retention stop repeat reads here, from this run's own numbers."""
    run = as_run(run)
    groups = run.raw("groups.jsonl")
    rows = arm_rows(groups)
    ratios = ratio_rows(rows)
    if not ratios:
        return ("**No answer from this run:** no path ran both the retain and the discard arm with usable groups, "
                "so there is nothing to compare (see the checks and the not-run rows).")
    parts = []
    for r in ratios:
        path, n = r["path"], r["group_size"]
        gs = [g for g in usable(groups) if g["path"] == path and g["group_size"] == n and g["arm"] == "discard"]
        kind = lookup_kind(gs[0]) if gs else "prefetch"
        reread = r["disk MiB/group: discard"] > r["disk MiB/group: retain"]
        verdict = ("keeping LMCache's copy **stops the repeat reads**" if reread else
                   "**neither arm rereads**, so retention has nothing to stop" + (
                       " (the in-process connector loads only what vLLM lacks, and vLLM holds the context)"
                       if kind == "on_demand" else ""))
        parts.append(f"On the {path} path with groups of {n}, {verdict}: retain reads "
                     f"{r['disk MiB/group: retain']:.0f} MiB per group, discard {r['disk MiB/group: discard']:.0f} MiB. "
                     f"A's first token (median) is {r['ttft_a_ms: retain']:.0f} ms with retention and "
                     f"{r['ttft_a_ms: discard']:.0f} ms without ({r['ttft_a_ms: discard/retain']:.2f}x); the makespan "
                     f"{r['makespan_ms: retain']:.0f} vs {r['makespan_ms: discard']:.0f} ms.")
    by = _by(rows)
    pairs = min(by[k]["groups_ok"] for k in by if k[2] in ("retain", "discard"))
    weak = [f"The medians rest on {pairs} or more measured pairs per arm; where the p25-p75 ranges of the two arms "
            "overlap in the table, the latency difference is within the run's spread."]
    strict = measured_lines(run)
    if strict:
        weak.append("Measured, not assumed: " + "; ".join(strict) + ".")
    return " ".join(parts) + "\n\n" + " ".join(weak)


def _public_key(label: str) -> str:
    """A ratio table's column as a public key (no spaces or slashes): 'ttft_a_ms: discard/retain'
    -> 'ttft_a_ms.discard_to_retain', 'disk MiB/group: retain' -> 'disk_mib_per_group.retain'."""
    return (label.replace("disk MiB/group", "disk_mib_per_group").replace("discard/retain", "discard_to_retain")
            .replace(": ", "."))


def public_results(run) -> dict:
    """The aggregates section 16 publishes: an allow-list of numbers, counts, short labels and hashes."""
    run = as_run(run)
    groups, blocks = run.raw("groups.jsonl"), run.raw("blocks.jsonl")
    rows = arm_rows(groups)
    return {
        "arms": [{k: r[k] for k in PUBLIC_ARM_KEYS if k in r} for r in rows],
        "discard_to_retain": [{_public_key(k): v for k, v in r.items() if isinstance(v, (int, float, str))}
                              for r in ratio_rows(rows)],
        "not_run": [{"path": str(b.get("path")), "group_size": b.get("group_size"), "status": str(b.get("status"))}
                    for b in blocks if b.get("status") != "ok"],
        "groups_recorded": len(groups),
        "engine_runs_ok": sum(b.get("status") == "ok" for b in blocks),
        "raw_sha256": {name: run.raw_sha256(name) for name in run.raw_names()},
    }
