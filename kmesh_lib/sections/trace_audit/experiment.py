"""Section 17: can agent traces qualify family retention?

CPU only, no model. ``audit_run`` audits a JSONL trace corpus (``traces.audit.audit_tree``), records
every row of the audit under ``raw/`` and its totals, input hashes and verdict in ``results.json``,
and writes a small capture under the project's own contract (``kv.capture_contract``) to contrast
with. ``checks``, ``counts``, ``headline``, ``answer`` and ``public_results`` (``sections.trace_audit
.results``) read those files back. This module also holds ``plan`` (no file is read) and the tables
the notebook draws.
"""
from __future__ import annotations

import json
import math
import os
import stat
from datetime import datetime, timezone
from pathlib import Path

from kmesh_lib.base.captures import CaptureError, CaptureRecord, as_stored, validate_record
from kmesh_lib.base.declared import json_default
from kmesh_lib.base.records import RunRecord
from kmesh_lib.kv.capture_contract import write_capture
from kmesh_lib.sections.trace_audit.captures import CAPTURES
from kmesh_lib.sections.trace_audit.params import AUDIT_MB_PER_S, UNIT_SCALE, TraceAuditParams, _n
from kmesh_lib.traces.audit import TraceAudit, audit_tree
from kmesh_lib.traces.names import safe_name
from kmesh_lib.traces.scan import JSONL_SUFFIXES

CONTRAST_CAPTURE = "contrast/kmesh-capture/capture.jsonl"  # under raw/; audited as its own tree


def plan(cfg: TraceAuditParams) -> dict:
    """What ``kmesh plan 17`` prints: files and bytes to audit, from directory listings only.

    Like the audit, it never follows a symbolic link and stops at ``MAX_DEPTH``; the corpus must be on
    this machine (``check_runnable``)."""
    cfg.check_runnable()
    root = cfg.trace_root
    by_source: dict[str, list[int]] = {}
    num_other = num_links = 0
    for dirpath, dirnames, filenames in os.walk(root):  # followlinks=False: linked dirs not entered
        rel = Path(dirpath).relative_to(root)
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        num_links += len(links)
        dirnames[:] = sorted(d for d in dirnames if d not in links) if len(rel.parts) < cfg.MAX_DEPTH else []
        source = safe_name(rel.parts[0], 64) if rel.parts else "."
        for name in sorted(filenames):
            try:
                st = os.lstat(Path(dirpath) / name)
            except OSError:
                continue  # the audit reports it as a problem
            if stat.S_ISLNK(st.st_mode):
                num_links += 1
            elif not name.lower().endswith(JSONL_SUFFIXES):
                num_other += 1
            else:
                entry = by_source.setdefault(source, [0, 0])
                entry[0] += 1
                entry[1] += st.st_size
    num_files = sum(n for n, _ in by_source.values())
    num_bytes = sum(b for _, b in by_source.values())
    seconds = max(1, math.ceil(num_bytes / (AUDIT_MB_PER_S * 1e6)))
    return {
        "corpus": f"{cfg.TRACE_ROOT} = {root}",
        "files to audit": f"{_n(num_files, 'JSONL file')}, {num_bytes / 1e6:.1f} MB, in "
                          f"{_n(len(by_source), 'source')}; {_n(num_other, 'other file')} listed, not read"
                          + (f"; {_n(num_links, 'symbolic link')} reported, not followed" if num_links else ""),
        "sources": ", ".join(f"{s} ({_n(n, 'file')}, {b / 1e6:.1f} MB)" for s, (n, b) in sorted(by_source.items())),
        "limits": f"lines over {cfg.MAX_LINE_MB:g} MB are oversize; JSON deeper than {cfg.MAX_JSON_DEPTH} levels "
                  f"is too deep; directories deeper than {cfg.MAX_DEPTH} are not walked",
        "expected duration": f"about {seconds} s of auditing (at {AUDIT_MB_PER_S:g} MB/s), the same again for the "
                             "checks' fresh audit, plus about 20 s of notebook start and plotting, on 1 CPU core",
    }


def audit_run(record: RunRecord, cfg: TraceAuditParams) -> tuple[TraceAudit, TraceAudit]:
    """Audits the corpus and writes the contrast capture, and records both in the run folder.

    ``raw/audit_*.jsonl`` get every row of the audit (``TraceAudit.rows``), ``raw/contrast/`` the
    capture; ``results.json`` gets the input hashes (a run field) and the audit's wall-clock time (the
    ``audit`` table's live field). The tables themselves are ``record.save_tables(section.TABLES)``'s,
    built from these files. Returns ``(audit, contrast)`` for the notebook's tables.
    """
    audit = audit_tree(cfg.trace_root, max_line_bytes=cfg.max_line_bytes, max_depth=cfg.MAX_DEPTH,
                       max_json_depth=cfg.MAX_JSON_DEPTH)
    for table, rows in audit.rows().items():
        write_table(record.run_dir / "raw" / f"{table}.jsonl", rows, CAPTURES[f"{table}.jsonl"])
    capture = record.run_dir / "raw" / CONTRAST_CAPTURE
    if capture.exists():  # the notebook run again in the same folder
        capture.unlink()
    write_capture(capture, contract_example(record.run_dir.name))  # raises on any breach of the contract
    contrast = audit_tree(capture.parent.parent)
    record.save("audit", {"elapsed_s": round(audit.elapsed_s, 3)})
    record.save("inputs", audit.file_hashes)
    return audit, contrast


def write_table(path: Path, rows: list[dict], cls: type[CaptureRecord]) -> None:
    """Writes ``rows`` as JSONL after ``cls``'s schema header, whole, through a temporary name (a re-run replaces,
    never appends).

    Raises:
        CaptureError: a row ``cls`` refuses (naming the capture, the row and the field); nothing is written.
    """
    lines = [json.dumps(cls.header())]
    for number, row in enumerate(rows):
        stored = as_stored(row, json_default)
        try:
            validate_record(cls, stored)
        except CaptureError as e:
            raise CaptureError(f"raw/{path.name}: row {number} is not a {cls.__name__} ({e})") from None
        lines.append(json.dumps(stored, sort_keys=True))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        for line in lines:
            f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# -- tables and matrices the notebook shows --------------------------------------------------

def source_labels(audit) -> dict[str, str]:
    """Row labels that carry the record count, so an empty row explains itself."""
    labels = {}
    for row in audit.source_rows():
        n, bad = row["num_records"], row["num_malformed_lines"]
        labels[row["source"]] = (f"{row['source']} ({_n(n, 'record')})" if n or not bad
                                 else f"{row['source']} (0 records, {_n(bad, 'malformed line')})")
    return labels


def coverage_matrix(audit, max_fields: int = 40):
    """Sources x top-level fields: the share of a source's records with a non-null value.

    Every source is a row; a source with no parseable record is a row of NaN. Fields are ordered
    by how many sources carry them, then by name; past ``max_fields`` columns the rest are left
    out of the picture (the tables and raw/ keep them). Untracked fields are the column ``#other``
    (the share of records with any of them, null or not).
    """
    import pandas as pd

    frame = audit.coverage_frame()
    labels = source_labels(audit)
    if frame.empty:
        return pd.DataFrame(index=list(labels.values()), dtype=float)
    frame["share_non_null"] = frame["share_non_null"].fillna(frame["share"])
    matrix = frame.pivot(index="source", columns="field", values="share_non_null")
    order = sorted(matrix.columns, key=lambda f: (-matrix[f].notna().sum(), f))[:max_fields]
    matrix = matrix.reindex(index=audit.sources, columns=order).fillna(0.0)  # absent field: 0
    empty = [s for s in audit.sources if s not in audit.source_fields or not audit.source_fields[s].num_object_records]
    matrix.loc[empty] = float("nan")  # no record to take a share of
    return matrix.rename(index=labels)


def requirement_matrix(lineage, labels: dict[str, str] | None = None):
    """Sources x lineage requirements: the share of records carrying any field that meets it."""
    frame = lineage.frame()
    matrix = frame.pivot(index="source", columns="requirement", values="share_with_key")
    order = list(dict.fromkeys(frame["requirement"]))
    matrix = matrix.reindex(index=list(lineage.sources), columns=order)
    empty = [name for name, s in lineage.sources.items() if not s.num_records]
    matrix.loc[empty] = float("nan")
    return matrix.rename(index=labels or {})


def verdict_table(lineage):
    """One row per source: requirement states, edges, groups, weak signals and the verdict."""
    import pandas as pd

    rows = []
    for src in lineage.to_public()["sources"]:
        row = {"source": src["source"], "records": src["num_records"]}
        row |= {name: state if src["num_records"] else "no records" for name, state in src["requirements"].items()}
        row |= {"lineage edges": src["num_lineage_edges"],
                "groups": ", ".join(f"{k}: {v}" for k, v in src["num_groups"].items()) or "-",
                "weak signals": ", ".join(src["weak_signals"]) or "-",
                "qualifies": src["qualifies"]}
        rows.append(row)
    return pd.DataFrame(rows)


def reasons_table(lineage):
    """Each reason a source fails, with the sources it applies to."""
    import pandas as pd

    by_reason: dict[str, list[str]] = {}
    for name, src in lineage.sources.items():
        for reason in src.reasons:
            by_reason.setdefault(reason, []).append(name)
    return pd.DataFrame([{"reason": r, "sources": ", ".join(s)} for r, s in by_reason.items()],
                        columns=["reason", "sources"])


def timestamp_table(audit):
    """Timestamp fields per source with their inferred unit and the first/last time in UTC."""
    frame = audit.timestamp_frame()
    if frame.empty:
        return frame

    def utc(value, unit):
        if value is None or unit not in UNIT_SCALE or not math.isfinite(value):
            return None
        return datetime.fromtimestamp(value / UNIT_SCALE[unit], timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S")

    frame["first_utc"] = [utc(v, u) for v, u in zip(frame["min"], frame["unit"])]
    frame["last_utc"] = [utc(v, u) for v, u in zip(frame["max"], frame["unit"])]
    return frame[["source", "field", "unit", "num_values", "first_utc", "last_utc",
                  "resolution_s", "declared_unit"]]


def contract_example(run_id: str) -> list[dict]:
    """A tiny synthetic capture in the ``kmesh.capture/1`` shape: two families of a parent and
    a child, one unrelated call, block events on the parents. Token ids are made up."""
    engine = {"name": "vllm", "version": "synthetic", "mode": "replay", "device": "cpu",
              "block_size": 16, "num_gpu_blocks": 129}
    shared = list(range(100, 148))  # 3 blocks both calls of a family start with
    records, t = [], 1_000_000
    for fam in ("f0", "f1"):
        for kind, parent in (("parent", None), ("child", f"{fam}-parent")):
            prompt = shared + ([7, 8, 9] if kind == "parent" else [7, 8, 9, 10, 11])
            rec = {"schema": "kmesh.capture/1", "run_id": run_id,
                   "invocation_id": f"{fam}-{kind}", "family_id": fam, "parent_id": parent,
                   "kind": kind, "engine": engine, "clock_domain": "synthetic-monotonic",
                   "t_submit_ns": t, "t_first_token_ns": t + 2_000, "t_finish_ns": t + 9_000,
                   "prompt_token_ids": prompt, "output_token_ids": [3, 4],
                   "num_cached_tokens": 48 if kind == "child" else 0, "status": "stop"}
            if kind == "parent":
                rec["block_events"] = [{"step": 0, "op": "alloc", "block_ids": [1, 2, 3]},
                                       {"step": 3, "op": "free", "block_ids": [1, 2, 3]}]
            records.append(rec)
            t += 10_000
    records.append(records[0] | {"invocation_id": "noise-0", "family_id": None, "kind": "noise",
                                 "t_submit_ns": t, "t_first_token_ns": t + 2_000,
                                 "t_finish_ns": t + 9_000, "prompt_token_ids": [5, 6, 7]})
    records[-1].pop("block_events")
    return records


