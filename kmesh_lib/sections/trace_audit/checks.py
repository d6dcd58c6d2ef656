"""Section 17's checks: every statement the section makes about a run, computed from its files.

The audit's rows are in ``raw/audit_*.jsonl``; ``results.json`` states the totals, the set hash,
the input hashes and the verdict. Each check recomputes a statement from ``raw/`` and compares it
with ``results.json``, so an edited results figure and an edited raw row both fail. Two checks go
back to the corpus itself (a re-hash of every input and a fresh audit); where the corpus is not on
this machine they are ``skipped`` with the reason, never ok.
"""
from __future__ import annotations

import json
from pathlib import Path

from kmesh_lib.base.checks import Check, check
from kmesh_lib.base.records import RunFiles, sha256_file
from kmesh_lib.kv.capture_contract import validate_capture
from kmesh_lib.sections.trace_audit.experiment import CONTRAST_CAPTURE
from kmesh_lib.sections.trace_audit.params import DEFAULT_TRACE_ROOT, TraceAuditParams, resolve_root
from kmesh_lib.traces.audit import MAX_FIELDS_PER_SOURCE, audit_tree, set_sha256_of
from kmesh_lib.traces.lineage import source_verdict
from kmesh_lib.traces.names import safe_relpath
from kmesh_lib.traces.report import RAW_TABLES, invariant_failures, summary_from_rows
from kmesh_lib.traces.scan import DEFAULT_MAX_JSON_DEPTH, hash_tree


def raw_rows(run: RunFiles) -> dict[str, list[dict]]:
    """The audit's rows as recorded, one list per table (missing tables are empty lists)."""
    return {table: run.raw(f"{table}.jsonl") for table in RAW_TABLES}


def recomputed_summary(run: RunFiles) -> dict:
    return summary_from_rows(raw_rows(run))


def _limits(run: RunFiles) -> dict:
    params = run.params
    defaults = TraceAuditParams.__dataclass_fields__
    return {"root": resolve_root(params.get("TRACE_ROOT", DEFAULT_TRACE_ROOT)),
            "max_line_bytes": int(params.get("MAX_LINE_MB", defaults["MAX_LINE_MB"].default) * (1 << 20)),
            "max_depth": params.get("MAX_DEPTH", defaults["MAX_DEPTH"].default),
            "max_json_depth": params.get("MAX_JSON_DEPTH", DEFAULT_MAX_JSON_DEPTH)}


def _differences(recorded: dict, recomputed: dict) -> list[str]:
    return [f"{key}: recorded {recorded.get(key)!r}, raw/ gives {value!r}"
            for key, value in recomputed.items() if recorded.get(key) != value] + \
           [f"{key}: recorded but not recomputable" for key in recorded if key not in recomputed]


def checks(run: RunFiles) -> list[Check]:
    """Section 17's statements about ``run``, each recomputed from ``raw/`` and the params."""
    run = RunFiles.of(run)
    results = run.results
    rows = raw_rows(run)
    files = rows["audit_files"]
    audit = results.get("audit") or {}
    missing_tables = [t for t in RAW_TABLES if not run.has_raw(f"{t}.jsonl")]
    out = [Check("raw/ holds every audit table", not missing_tables,
                 f"missing: {', '.join(missing_tables)}" if missing_tables else f"{len(RAW_TABLES)} tables")]
    no_files = "the audit recorded no input file"

    failures = invariant_failures(rows)
    out.append(check("raw/ rows balance (lines, kinds, duplicates, directories, sources)", not failures,
                     "; ".join(failures[:3]) or f"{len(files)} files, {len(rows['audit_dirs'])} directories",
                     evidence=files, missing=no_files))

    differences = _differences(audit.get("summary") or {}, summary_from_rows(rows))
    out.append(check("results.json totals recompute from raw/", not differences,
                     "; ".join(differences[:3]) or "every total equal", evidence=files, missing=no_files))

    hashes = {f["relpath"]: f["sha256"] for f in files if f["sha256"]}
    out.append(check("set hash recomputes from raw/ file hashes", set_sha256_of(hashes) == audit.get("set_sha256"),
                     f"{set_sha256_of(hashes)[:16]} from {len(hashes)} files, recorded "
                     f"{str(audit.get('set_sha256'))[:16]}", evidence=hashes, missing="no file was read whole"))
    out.append(check("results inputs are the audited files' hashes", results.get("inputs") == hashes,
                     f"{len(results.get('inputs') or {})} inputs, {len(hashes)} hashed files",
                     evidence=hashes, missing="no file was read whole"))

    shares = [(src["source"], src["num_object_records"], counts)
              for src in rows["audit_sources"] for counts in src["fields"].values()]
    out.append(check("coverage shares lie in [0, 1]",
                     all(0 <= non_null <= present <= n for _, n, (present, non_null) in shares)
                     and all(0 <= s["num_records_with_untracked_fields"] <= s["num_object_records"]
                             for s in rows["audit_sources"]),
                     f"largest share {max((p / n for _, n, (p, _) in shares if n), default=0):.3g} over "
                     f"{len(shares)} (source, field) rows", evidence=shares, missing="no object record"))

    out.append(_verdict_check(results, rows))
    limits = _limits(run)
    out.append(_rehash_check(limits["root"], limits["max_depth"], hashes))
    out.append(_reaudit_check(limits["root"], limits, rows))
    out.append(_contrast_check(run, results))
    return out


def _verdict_check(results: dict, rows: dict[str, list[dict]]) -> Check:
    name = "lineage verdict recomputes from raw/ counts"
    recorded = results.get("lineage") or {}
    sources = [s for s in rows["audit_sources"] if s.get("lineage")]
    verdicts = {s["source"]: source_verdict(s["lineage"]) for s in sources}
    recomputed = [{"source": src, "qualifies": v.qualifies} for src, v in verdicts.items()]
    edges = sum(v.num_lineage_edges for v in verdicts.values())
    ok = (recorded.get("sources") == recomputed and recorded.get("qualifies") == any(v.qualifies for v in verdicts.values())
          and recorded.get("num_lineage_edges") == edges)
    detail = (f"{sum(v.qualifies for v in verdicts.values())} of {len(verdicts)} sources qualify, {edges} edges; "
              f"recorded qualifies={recorded.get('qualifies')}")
    return check(name, ok, detail, evidence=sources, missing="no source has lineage counts in raw/")


def _rehash_check(root: Path, max_depth: int, hashes: dict[str, str]) -> Check:
    name = "input files re-hash to the recorded sha256"
    if not root.is_dir():
        return Check(name, "skipped", f"the corpus is not on this machine ({root}); `kmesh data fetch` gets it",
                     outside_input=f"the corpus {root.name}/ (`kmesh data fetch`)")
    if not hashes:
        return Check(name, "skipped", "no file was read whole")
    now = {safe_relpath(p): d for p, d in hash_tree(root, max_depth).items()}
    changed = sorted(p for p in hashes if p in now and now[p] != hashes[p])
    missing = sorted(p for p in hashes if p not in now)
    new = sorted(p for p in now if p not in hashes)
    detail = (f"{len(hashes) - len(changed) - len(missing)} of {len(hashes)} unchanged, {len(changed)} changed, "
              f"{len(missing)} missing, {len(new)} new" + (f": {(changed + missing + new)[:3]}" if changed or missing or new
                                                           else ""))
    return Check(name, not (changed or missing or new), detail)


def _reaudit_check(root: Path, limits: dict, rows: dict[str, list[dict]]) -> Check:
    name = "a fresh audit of the corpus reproduces raw/"
    if not root.is_dir():
        return Check(name, "skipped", f"the corpus is not on this machine ({root})",
                     outside_input=f"the corpus {root.name}/ (`kmesh data fetch`)")
    fresh = audit_tree(root, max_line_bytes=limits["max_line_bytes"], max_depth=limits["max_depth"],
                       max_json_depth=limits["max_json_depth"], max_fields_per_source=MAX_FIELDS_PER_SOURCE).rows()
    differing = [table for table in RAW_TABLES if _normalized(fresh[table]) != _normalized(rows[table])]
    return Check(name, not differing, f"differs in {', '.join(differing)}" if differing
                 else f"{len(RAW_TABLES)} tables equal, {len(rows['audit_files'])} files")


def _normalized(table: list[dict]) -> list:
    return [json.loads(json.dumps(row, sort_keys=True)) for row in table]  # tuples -> lists, as on disk


def _contrast_check(run: RunFiles, results: dict) -> Check:
    name = "contract capture is unchanged, valid and qualifies"
    path = run.run_dir / "raw" / CONTRAST_CAPTURE
    if not path.is_file():
        return Check(name, False, f"raw/{CONTRAST_CAPTURE} is missing")
    recorded = results.get("contrast") or {}
    report = validate_capture(path)
    lineage = audit_tree(path.parent.parent).lineage
    ok = sha256_file(path) == recorded.get("sha256") and report.ok and lineage.qualifies
    return Check(name, ok, f"{report.num_records} invocations, {lineage.num_lineage_edges} edges, "
                           f"sha256 {'matches' if sha256_file(path) == recorded.get('sha256') else 'differs'}")


__all__ = ["checks", "raw_rows", "recomputed_summary"]
