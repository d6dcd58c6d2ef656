"""Section 17: can agent traces qualify family retention?

CPU only, no model. The notebook audits a JSONL trace corpus (``traces.audit.audit_tree``), shows
what its records carry next to what a trace-driven retention comparison needs
(``traces.lineage``), contrasts it with a small capture written under the project's own contract
(``kv.capture_contract``), and records a derived public audit plus the SHA-256 of every input file.

This module holds the section's parameters, ``plan`` (no file is read), the tables the notebook
draws, and ``app.verify``, which re-derives from the run directory what it can: input hashes, the set
hash, the audit's accounting and the verdict.
"""
from __future__ import annotations

import hashlib
import math
import os
from datetime import datetime, timezone
from pathlib import Path

from kmesh_lib.sections.trace_audit.params import AUDIT_MB_PER_S, UNIT_SCALE, TraceAuditParams, _n
from kmesh_lib.traces.scan import JSONL_SUFFIXES


def plan(cfg: TraceAuditParams) -> dict:
    """What ``kmesh plan 17`` prints: files and bytes to audit, from directory listings only."""
    root = cfg.trace_root
    by_source: dict[str, list[int]] = {}
    num_other = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = Path(dirpath).relative_to(root)
        source = rel.parts[0] if rel.parts else "."
        for name in sorted(filenames):
            if not name.lower().endswith(JSONL_SUFFIXES):
                num_other += 1
                continue
            try:
                size = os.stat(Path(dirpath) / name).st_size
            except OSError:
                size = 0  # the audit reports it as a problem
            entry = by_source.setdefault(source, [0, 0])
            entry[0] += 1
            entry[1] += size
    num_files = sum(n for n, _ in by_source.values())
    num_bytes = sum(b for _, b in by_source.values())
    seconds = max(1, math.ceil(num_bytes / (AUDIT_MB_PER_S * 1e6)))
    return {
        "corpus": str(root),
        "files to audit": f"{_n(num_files, 'JSONL file')}, {num_bytes / 1e6:.1f} MB, in "
                          f"{_n(len(by_source), 'source')}; {_n(num_other, 'other file')} "
                          "listed, not read",
        "sources": ", ".join(f"{s} ({_n(n, 'file')}, {b / 1e6:.1f} MB)"
                             for s, (n, b) in sorted(by_source.items())),
        "limits": f"lines over {cfg.MAX_LINE_MB:g} MB are oversize; depth <= {cfg.MAX_DEPTH}",
        "expected duration": f"about {seconds} s of auditing (at {AUDIT_MB_PER_S:g} MB/s) plus "
                             "about 20 s of notebook start and plotting, on 1 CPU core",
    }


# -- tables and matrices the notebook shows --------------------------------------------------

def source_labels(audit) -> dict[str, str]:
    """Row labels that carry the record count, so an empty row explains itself."""
    labels = {}
    for row in audit.source_rows():
        n, bad = row["num_records"], row["num_malformed_lines"]
        labels[row["source"]] = (f"{row['source']} ({_n(n, 'record')})" if n or not bad
                                 else f"{row['source']} (0 records, {_n(bad, 'malformed line')})")
    return labels


def coverage_matrix(audit):
    """Sources x top-level fields: the share of a source's records with a non-null value.

    Every source is a row; a source with no parseable record is a row of NaN. Fields are ordered
    by how many sources carry them, then by name.
    """
    import pandas as pd

    frame = audit.coverage_frame()
    labels = source_labels(audit)
    if frame.empty:
        return pd.DataFrame(index=list(labels.values()), dtype=float)
    matrix = frame.pivot(index="source", columns="field", values="share_non_null")
    order = sorted(matrix.columns, key=lambda f: (-matrix[f].notna().sum(), f))
    matrix = matrix.reindex(index=audit.sources, columns=order).fillna(0.0)  # absent field: 0
    empty = [s for s in audit.sources if not audit.num_object_records.get(s)]
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
        row |= {name: req["state"] if src["num_records"] else "no records"
                for name, req in src["requirements"].items()}
        row |= {"lineage edges": src["num_lineage_edges"],
                "groups": ", ".join(f"{k}: {v}" for k, v in src["num_groups"].items()) or "-",
                "weak signals": ", ".join(src["weak_signals"]) or "-",
                "qualifies": src["qualifies"]}
        rows.append(row)
    return pd.DataFrame(rows)


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


# -- invariants of the public audit, shared by the checks cell and verify ---------------------

def set_sha256_of(hashes: dict[str, str]) -> str:
    """The input-set hash from ``{relpath: sha256}`` (the same formula as ``audit_tree``)."""
    lines = sorted(f"{path}\0{digest}\n" for path, digest in hashes.items())
    return hashlib.sha256("".join(lines).encode("utf-8", "surrogateescape")).hexdigest()


