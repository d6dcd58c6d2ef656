"""Section 17's counts, headline, closing answer and public results, read from a run's files.

Everything here is computed from ``raw/`` (the audit's rows) and ``results.json``, never from a
notebook's memory, so ``kmesh list``, ``kmesh publish`` and the notebook say the same thing.

``public_results`` is an allow-list built field by field: numbers, counts, states and units from
the audit's own vocabularies, SHA-256 digests, and names from the corpus only in the safe form of
``traces.names`` (re-applied here, so even an edited raw row cannot put a long or odd name into the
public file). It holds no record text, no field value and no token id, and it is bounded whatever
the corpus: at most ``MAX_PUBLIC_ROWS`` rows per list and ``MAX_PUBLIC_FIELDS`` fields per source.
"""
from __future__ import annotations

from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections.trace_audit.captures import AuditRows, AuditSource
from kmesh_lib.traces.audit import set_sha256_of
from kmesh_lib.traces.lineage import GROUPING_FIELDS, REQUIREMENTS, WEAK_SIGNALS
from kmesh_lib.traces.names import MAX_PATH_PART_CHARS, safe_name, safe_relpath
from kmesh_lib.traces.report import coverage_rows, source_rows, summary_from_rows
from kmesh_lib.traces.scan import MALFORMED_KINDS, PROBLEM_KINDS

PUBLIC_SCHEMA = "kmesh.trace_audit.public/2"
MAX_PUBLIC_ROWS = 200  # files, problems, duplicate groups, malformed files
MAX_PUBLIC_FIELDS = 32  # coverage and timestamp fields per source, most carried first
_UNITS = ("s", "ms", "us", "ns", "not-epoch", "iso8601", "unparsed-string", "non-scalar", "mixed")
_STATES = ("met", "partial", "absent")


def counts(run: RunFiles) -> dict[str, int | str]:
    """Deterministic facts of the run, recomputed from ``raw/`` (the smoke golden pins them)."""
    run = RunFiles.of(run)
    rows = AuditRows.of(run)
    summary = summary_from_rows(rows.as_recorded())
    verdicts = rows.lineage_verdicts
    keys = ("num_files", "num_empty_files", "num_bytes", "num_lines", "num_records", "num_unique_records",
            "num_duplicate_copies", "num_malformed_lines", "num_problems", "num_sources")
    return {key: summary[key] for key in keys} | {
        "num_qualifying_sources": sum(v.qualifies for v in verdicts.values()),
        "num_lineage_edges": sum(v.num_lineage_edges for v in verdicts.values()),
        "set_sha256": set_sha256_of(rows.file_hashes)}


def headline(run: RunFiles) -> dict[str, str]:
    run = RunFiles.of(run)
    rows = AuditRows.of(run)
    s = summary_from_rows(rows.as_recorded())
    verdicts = rows.lineage_verdicts
    audit = run.results.get("audit") or {}
    return {
        "corpus": f"{safe_name(audit.get('root_name', '?'), MAX_PATH_PART_CHARS)} "
                  f"(set {set_sha256_of(rows.file_hashes)[:8]}…)",
        "files": f"{s['num_files']:,} ({s['num_bytes'] / 1e6:.1f} MB, {s['num_empty_files']} empty)",
        "records": f"{s['num_records']:,} ({s['num_unique_records']:,} unique)",
        "malformed lines": f"{s['num_malformed_lines']:,} in {s['num_files_with_malformed']} file(s)",
        "qualifying sources": f"{sum(v.qualifies for v in verdicts.values())} of {len(verdicts)}",
        "lineage edges": f"{sum(v.num_lineage_edges for v in verdicts.values()):,}",
    }


def answer(run: RunFiles) -> str:
    """The closing paragraph: the verdict from the run's own numbers, and where it is weak."""
    run = RunFiles.of(run)
    rows = AuditRows.of(run)
    s = summary_from_rows(rows.as_recorded())
    verdicts = rows.lineage_verdicts
    name = safe_name((run.results.get("audit") or {}).get("root_name", "the corpus"), MAX_PATH_PART_CHARS)
    judged = {src: v for src, v in verdicts.items() if v.num_records}
    unread = sorted(src for src, v in verdicts.items() if not v.num_records)
    qualifying = sorted(src for src, v in judged.items() if v.qualifies)
    edges = sum(v.num_lineage_edges for v in verdicts.values())
    lacking = {req: sum(not v.requirements[req].met for v in judged.values()) for req in REQUIREMENTS}
    scope = (f"`{name}` ({s['num_files']:,} files, {s['num_records']:,} records in {len(verdicts)} sources, "
             f"set SHA-256 `{set_sha256_of(rows.file_hashes)[:12]}…`)")
    if qualifying:
        text = (f"**Yes, for {len(qualifying)} of {len(verdicts)} sources** of {scope}: "
                f"{', '.join(f'`{q}`' for q in qualifying)} carry parent links, start and completion times, "
                f"engine identity and physical cache events, and resolve {edges:,} lineage edges. ")
    else:
        by_count: dict[int, list[str]] = {}
        for req, n in lacking.items():
            if n:
                by_count.setdefault(n, []).append(req.replace("_", " "))
        missing = "; ".join(f"{'all ' if n == len(judged) else ''}{n} of the {len(judged)} sources with records lack "
                            f"{_join(reqs)}" for n, reqs in sorted(by_count.items(), reverse=True))
        text = (f"**No.** None of the {len(verdicts)} sources of {scope} can drive a family-retention comparison: "
                f"{missing or 'every requirement is met, but no parent link resolves'}; the corpus resolves "
                f"{edges:,} lineage edges. ")
    groups = sorted({g for v in judged.values() for g in v.num_groups})
    weak = sorted({w for v in judged.values() for w in v.weak_signals})
    if groups or weak:
        text += (f"What the records carry instead is {_join([f'`{g}`' for g in groups + weak])}: fields that group "
                 "calls, name a model or stamp a single time, none of which says which call extends which or "
                 "which blocks were resident. ")
    caveats = []
    if s["num_malformed_lines"]:
        caveats.append(f"{s['num_malformed_lines']:,} malformed lines were not read"
                       + (f", and {', '.join(f'`{u}`' for u in unread)} has no parseable record at all, so the "
                          "verdict says nothing about it" if unread else ""))
    if s["num_problems"]:
        caveats.append(f"{s['num_problems']} entries of the tree were not read (links, unreadable or too deep "
                       "files; section 1.2)")
    caveats.append("only explicit fields count: a corpus that encodes lineage in prompt text or timing is judged "
                   "absent by design (section 3), and the contract capture of section 4 shows the same code says "
                   "yes when the fields are there")
    return text + "The evidence is weak where " + "; ".join(caveats) + "."


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def public_results(run: RunFiles) -> dict:
    """The section's public aggregates (see the module docstring for what may appear)."""
    run = RunFiles.of(run)
    rows = AuditRows.of(run)
    recorded = rows.as_recorded()
    results = run.results
    audit = results.get("audit") or {}
    files = rows.files
    hashes = {safe_relpath(f.relpath): str(f.sha256) for f in files if f.sha256}
    verdicts = rows.lineage_verdicts
    contrast = results.get("contrast") or {}
    limits = audit.get("limits") or {}
    return {
        "schema": PUBLIC_SCHEMA,
        "corpus": {"root_name": safe_name(str(audit.get("root_name", "")), MAX_PATH_PART_CHARS),
                   "set_sha256": set_sha256_of(hashes)},
        "limits": {k: int(limits[k]) for k in ("max_line_bytes", "max_depth", "max_json_depth",
                                               "max_fields_per_source") if k in limits},
        "summary": _public_summary(summary_from_rows(recorded)),
        "sources": [_public_source(r) for r in source_rows(recorded)][:MAX_PUBLIC_ROWS],
        "coverage": _public_coverage(recorded["audit_sources"]),
        "timestamp_units": _public_timestamps(rows.sources),
        "lineage": {"qualifies": any(v.qualifies for v in verdicts.values()),
                    "num_lineage_edges": sum(v.num_lineage_edges for v in verdicts.values()),
                    "sources": [_public_verdict(v) for v in verdicts.values()][:MAX_PUBLIC_ROWS]},
        "contrast": {"qualifies": bool(contrast.get("qualifies")),
                     "num_lineage_edges": int(contrast.get("num_lineage_edges") or 0),
                     "sha256": _hex(contrast.get("sha256"))},
        "input_files": [{"relpath": safe_relpath(f.relpath), "sha256": _hex(f.sha256), "size_bytes": int(f.size_bytes),
                         "status": _label(f.status, ("ok", "unreadable", "read-error"))}
                        for f in files[:MAX_PUBLIC_ROWS]],
        "num_input_files": len(files),
        "problems": [{"kind": _label(p.kind, tuple(PROBLEM_KINDS)), "relpath": safe_relpath(p.relpath)}
                     for p in rows.problems[:MAX_PUBLIC_ROWS]],
        "malformed_files": [{"relpath": safe_relpath(f.relpath),
                             "malformed": {k: int(f.malformed.get(k, 0)) for k in MALFORMED_KINDS}}
                            for f in files if f.num_malformed_lines][:MAX_PUBLIC_ROWS],
        "duplicate_groups": [{"num_copies": int(g.num_copies),
                              "locations": [f"{safe_relpath(loc.relpath)}:{int(loc.line_no)}" for loc in g.locations]}
                             for g in rows.duplicates[:MAX_PUBLIC_ROWS]],
    }


def _hex(value) -> str | None:
    return value if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value) else None


def _label(value, allowed: tuple[str, ...]) -> str:
    return value if value in allowed else "other"


def _public_summary(summary: dict) -> dict:
    out = {k: int(v) for k, v in summary.items() if isinstance(v, int)}
    out["malformed"] = {k: int(summary["malformed"].get(k, 0)) for k in MALFORMED_KINDS}
    out["problems"] = {k: int(summary["problems"].get(k, 0)) for k in PROBLEM_KINDS if summary["problems"].get(k)}
    return out


def _public_source(row: dict) -> dict:
    out = {"source": safe_relpath(row["source"])}
    out |= {k: int(v) for k, v in row.items() if k.startswith("num_") or k == "size_bytes"}
    out["timestamp_unit"] = _label(row.get("timestamp_unit"), _UNITS) if row.get("timestamp_unit") else None
    return out


def _public_coverage(source_rows_: list[dict]) -> list[dict]:
    out = []
    by_source: dict[str, list[dict]] = {}
    for row in coverage_rows(source_rows_):
        by_source.setdefault(row["source"], []).append(row)
    for source, rows in by_source.items():
        for row in sorted(rows, key=lambda r: (-r["num_records"], r["field"]))[:MAX_PUBLIC_FIELDS]:
            out.append({"source": safe_relpath(source), "field": safe_name(row["field"]),
                        "share": float(row["share"]),
                        "share_non_null": None if row["share_non_null"] is None else float(row["share_non_null"])})
    return out


def _public_timestamps(sources: list[AuditSource]) -> list[dict]:
    out = []
    for src in sources:
        fields = src.timestamps.get("fields", {})  # {} for a source without records
        for name, info in sorted(fields.items(), key=lambda kv: -kv[1]["num_values"])[:MAX_PUBLIC_FIELDS]:
            out.append({"source": safe_relpath(src.source), "field": safe_name(name),
                        "unit": _label(info["unit"], _UNITS) if info["unit"] else None,
                        "num_values": int(info["num_values"]),
                        "resolution_s": None if info["resolution_s"] is None else float(info["resolution_s"]),
                        "declared_unit": _label(info["declared_unit"], _UNITS) if info["declared_unit"] else None})
    return out


def _public_verdict(v) -> dict:
    return {"source": safe_relpath(v.source), "num_records": int(v.num_records), "qualifies": bool(v.qualifies),
            "num_lineage_edges": int(v.num_lineage_edges), "num_dangling_parent_refs": int(v.num_dangling_parent_refs),
            "requirements": {req: _label(r.state, _STATES) for req, r in v.requirements.items()},
            "num_groups": {g: int(n) for g, n in v.num_groups.items() if g in GROUPING_FIELDS},
            "weak_signals": [w for w in v.weak_signals if w in WEAK_SIGNALS]}


def verdict(run: RunFiles) -> list[str]:
    """One sentence: how many of the corpus's sources qualify, and what the others lack (counts: no interval)."""
    run = RunFiles.of(run)
    verdicts = AuditRows.of(run).lineage_verdicts
    judged = {src: v for src, v in verdicts.items() if v.num_records}
    qualifying = sorted(src for src, v in judged.items() if v.qualifies)
    edges = sum(v.num_lineage_edges for v in verdicts.values())
    if qualifying:
        return [f"Yes for {len(qualifying)} of {len(verdicts)} sources ({', '.join(qualifying)}): they carry what a "
                f"family-retention comparison needs and resolve {edges:,} lineage edges."]
    lacking = {req: sum(not v.requirements[req].met for v in judged.values()) for req in REQUIREMENTS}
    worst = max(lacking.values(), default=0)
    reqs = [r.replace("_", " ") for r, n in lacking.items() if n == worst and n]
    return [f"No: none of the {len(verdicts)} sources qualifies ({len(judged)} with records; {worst} of them lack "
            f"{_join(reqs) if reqs else 'nothing'}), and the corpus resolves {edges:,} lineage edges."]


def findings(run: RunFiles) -> list[dict]:
    """The audit's counts, one row each (the headline figures), then what the judged sources lack."""
    run = RunFiles.of(run)
    out = [{"what": k, "figure": v} for k, v in headline(run).items()]
    verdicts = AuditRows.of(run).lineage_verdicts
    judged = [v for v in verdicts.values() if v.num_records]
    for req in REQUIREMENTS:
        n = sum(not v.requirements[req].met for v in judged)
        if n and len(out) < 10:
            out.append({"what": f"sources lacking {req.replace('_', ' ')}", "figure": f"{n} of {len(judged)}"})
    return out
