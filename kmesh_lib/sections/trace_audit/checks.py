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

from kmesh_lib.base.checks import Check, check, differences
from kmesh_lib.base.records import RunFiles, sha256_file
from kmesh_lib.kv.capture_contract import validate_capture
from kmesh_lib.sections.trace_audit.captures import AuditRows
from kmesh_lib.sections.trace_audit.experiment import CONTRAST_CAPTURE
from kmesh_lib.sections.trace_audit.params import TraceAuditParams
from kmesh_lib.traces.audit import MAX_FIELDS_PER_SOURCE, audit_tree, set_sha256_of
from kmesh_lib.traces.names import safe_relpath
from kmesh_lib.traces.report import RAW_TABLES, invariant_failures, summary_from_rows
from kmesh_lib.traces.scan import hash_tree

# -- the declared tables (``tables.TABLES``), each from raw/ and the params --

LIVE_AUDIT = ("elapsed_s",)  # the audit's wall-clock time: recorded, not rebuilt


def audit_table(run: RunFiles) -> dict:
    """The corpus's name, the audit's totals, the set hash and the limits (``elapsed_s`` is live)."""
    cfg, rows = run.params, AuditRows.of(run)
    return {"root_name": cfg.root_name, "summary": summary_from_rows(rows.as_recorded()),
            "set_sha256": set_sha256_of(rows.file_hashes),
            "limits": cfg.limits}


def lineage_table(run: RunFiles) -> dict:
    """The lineage verdict of every source with lineage counts in raw/ (``traces.lineage.source_verdict``)."""
    verdicts = AuditRows.of(run).lineage_verdicts
    return {"qualifies": any(v.qualifies for v in verdicts.values()),
            "num_lineage_edges": sum(v.num_lineage_edges for v in verdicts.values()),
            "sources": [{"source": src, "qualifies": v.qualifies} for src, v in verdicts.items()]}


def contrast_table(run: RunFiles) -> dict:
    """The contract capture in raw/: its path, hash and the verdict of auditing it as its own tree."""
    path = run.run_dir / "raw" / CONTRAST_CAPTURE
    lineage = audit_tree(path.parent.parent).lineage
    return {"path": f"raw/{CONTRAST_CAPTURE}", "sha256": sha256_file(path), "qualifies": lineage.qualifies,
            "num_lineage_edges": lineage.num_lineage_edges}


def checks(run: RunFiles) -> list[Check]:
    """Section 17's statements about ``run``, each recomputed from ``raw/`` and the params."""
    run = RunFiles.of(run)
    results = run.results
    rows = AuditRows.of(run)
    as_recorded = rows.as_recorded()
    files, sources = rows.files, rows.sources
    audit = results.get("audit") or {}
    missing_tables = [t for t in RAW_TABLES if not run.has_raw(f"{t}.jsonl")]
    out = [Check("raw/ holds every audit table", not missing_tables,
                 f"missing: {', '.join(missing_tables)}" if missing_tables else f"{len(RAW_TABLES)} tables")]
    no_files = "the audit recorded no input file"

    failures = invariant_failures(as_recorded)
    out.append(check("raw/ rows balance (lines, kinds, duplicates, directories, sources)", not failures,
                     "; ".join(failures[:3]) or f"{len(files)} files, {len(rows.dirs)} directories",
                     evidence=files, missing=no_files))

    found = differences(summary_from_rows(as_recorded), audit.get("summary"), "summary")
    out.append(check("results.json totals recompute from raw/", not found,
                     "; ".join(found[:3]) or "every total equal", evidence=files, missing=no_files))

    hashes = rows.file_hashes
    found = differences(set_sha256_of(hashes), audit.get("set_sha256"), "set_sha256")
    out.append(check("set hash recomputes from raw/ file hashes", not found,
                     f"{set_sha256_of(hashes)[:16]} from {len(hashes)} files, recorded "
                     f"{str(audit.get('set_sha256'))[:16]}", evidence=hashes, missing="no file was read whole"))
    found = differences(hashes, results.get("inputs"), "inputs")
    out.append(check("results inputs are the audited files' hashes", not found,
                     f"{len(results.get('inputs') or {})} inputs, {len(hashes)} hashed files"
                     + (f": {'; '.join(found[:2])}" if found else ""), evidence=hashes, missing="no file was read whole"))

    shares = [(src.source, src.num_object_records, counts) for src in sources for counts in src.fields.values()]
    out.append(check("coverage shares lie in [0, 1]",
                     all(0 <= non_null <= present <= n for _, n, (present, non_null) in shares)
                     and all(0 <= s.num_records_with_untracked_fields <= s.num_object_records for s in sources),
                     f"largest share {max((p / n for _, n, (p, _) in shares if n), default=0):.3g} over "
                     f"{len(shares)} (source, field) rows", evidence=shares, missing="no object record"))

    out.append(_verdict_check(run, results))
    cfg = run.params
    out.append(_rehash_check(cfg.trace_root, cfg.MAX_DEPTH, hashes))
    out.append(_reaudit_check(cfg, as_recorded))
    out.append(_contrast_check(run, results))
    return out


def _verdict_check(run: RunFiles, results: dict) -> Check:
    name = "lineage verdict recomputes from raw/ counts"
    recomputed = lineage_table(run)
    found = differences(recomputed, results.get("lineage"), "lineage")
    detail = (f"{sum(s['qualifies'] for s in recomputed['sources'])} of {len(recomputed['sources'])} sources qualify, "
              f"{recomputed['num_lineage_edges']} edges; recorded qualifies={(results.get('lineage') or {}).get('qualifies')}"
              + (f"; {'; '.join(found[:2])}" if found else ""))
    return check(name, not found, detail, evidence=recomputed["sources"], missing="no source has lineage counts in raw/")


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


def _reaudit_check(cfg: TraceAuditParams, recorded: dict[str, list[dict]]) -> Check:
    name = "a fresh audit of the corpus reproduces raw/"
    root = cfg.trace_root
    if not root.is_dir():
        return Check(name, "skipped", f"the corpus is not on this machine ({root})",
                     outside_input=f"the corpus {root.name}/ (`kmesh data fetch`)")
    fresh = audit_tree(root, max_line_bytes=cfg.max_line_bytes, max_depth=cfg.MAX_DEPTH,
                       max_json_depth=cfg.MAX_JSON_DEPTH, max_fields_per_source=MAX_FIELDS_PER_SOURCE).rows()
    differing = [table for table in RAW_TABLES if _normalized(fresh[table]) != _normalized(recorded[table])]
    return Check(name, not differing, f"differs in {', '.join(differing)}" if differing
                 else f"{len(RAW_TABLES)} tables equal, {len(recorded['audit_files'])} files")


def _normalized(table: list[dict]) -> list:
    return [json.loads(json.dumps(row, sort_keys=True)) for row in table]  # tuples -> lists, as on disk


def _contrast_check(run: RunFiles, results: dict) -> Check:
    name = "contract capture is unchanged, valid and qualifies"
    path = run.run_dir / "raw" / CONTRAST_CAPTURE
    if not path.is_file():
        return Check(name, False, f"raw/{CONTRAST_CAPTURE} is missing")
    recomputed = contrast_table(run)
    found = differences(recomputed, results.get("contrast"), "contrast")
    report = validate_capture(path)
    ok = not found and report.ok and recomputed["qualifies"]
    return Check(name, ok, f"{report.num_records} invocations, {recomputed['num_lineage_edges']} edges, "
                           f"sha256 {'differs' if any('sha256' in f for f in found) else 'matches'}"
                 + (f"; {'; '.join(found[:2])}" if found else ""))


__all__ = ["LIVE_AUDIT", "audit_table", "checks", "contrast_table", "lineage_table"]
