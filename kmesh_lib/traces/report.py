"""What a trace audit found, and how it is shown: rows, totals, invariants, public form, frames.

``traces.audit.audit_tree`` fills a ``TraceAudit``; this module only holds and presents it.

Accounting invariants (``TraceAudit.check_invariants`` verifies them):

* per file: ``num_lines == num_blank_lines + num_records + num_malformed_lines``;
* ``num_unique_records + num_duplicate_copies == num_records``: a record is a duplicate copy when
  its canonical JSON hashes like an earlier record's (walk order, across all files);
* every duplicate group of ``k`` copies contributes ``k - 1`` duplicate copies;
* the malformed kinds sum to the malformed lines; directory rows sum to the records;
* totals are properties over the file rows, so they cannot drift from them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kmesh_lib.traces.lineage import LineageReport
from kmesh_lib.traces.scan import MALFORMED_KINDS

MAX_MALFORMED_DETAILS = 1000  # details kept for the notebook; the counts are always exact
PUBLIC_SCHEMA = "kmesh.trace_audit/1"


@dataclass
class FileRow:
    """One JSONL file. ``status`` is "ok", "unreadable" (never opened) or "read-error" (partial:
    counts cover what was read before the error, ``sha256`` is None)."""

    relpath: str
    source: str
    directory: str
    size_bytes: int = 0
    sha256: str | None = None
    status: str = "ok"
    num_lines: int = 0
    num_blank_lines: int = 0
    num_records: int = 0
    num_malformed_lines: int = 0
    num_duplicate_copies: int = 0
    ends_with_newline: bool = True
    malformed: dict[str, int] = field(default_factory=dict)


@dataclass
class DirRow:
    """One directory, direct children only (directories holding no JSONL are rows too)."""

    relpath: str
    num_jsonl_files: int = 0
    num_other_files: int = 0
    num_subdirs: int = 0
    num_problems: int = 0  # entries it lists that became problems (loops, FIFOs, ...)
    num_records: int = 0
    num_malformed_lines: int = 0
    size_bytes: int = 0


@dataclass
class Problem:
    kind: str  # symlink-loop, dangling-symlink, already-visited, not-regular, unreadable,
    #            read-error (partial file), too-deep (beyond max_depth)
    relpath: str
    detail: str


@dataclass
class MalformedLine:
    relpath: str
    line_no: int  # 1-based
    kind: str
    num_bytes: int
    detail: str  # parser message: positions and at most one byte value, never line content


@dataclass
class TraceAudit:
    root: str
    max_line_bytes: int
    files: list[FileRow] = field(default_factory=list)
    dirs: list[DirRow] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    malformed_lines: list[MalformedLine] = field(default_factory=list)
    malformed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MALFORMED_KINDS, 0))
    num_non_object_records: int = 0
    num_unique_records: int = 0
    duplicate_groups: list[dict] = field(default_factory=list)  # sha256, num_copies, locations
    coverage: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    num_object_records: dict[str, int] = field(default_factory=dict)
    timestamp_units: dict[str, dict] = field(default_factory=dict)
    set_sha256: str = ""
    elapsed_s: float = 0.0
    lineage: LineageReport | None = None

    # -- totals, derived from the rows so they cannot drift from them --
    num_files = property(lambda self: len(self.files))
    num_empty_files = property(lambda self: sum(f.status == "ok" and f.size_bytes == 0
                                                for f in self.files))
    num_unreadable_files = property(lambda self: sum(f.status != "ok" for f in self.files))
    num_bytes = property(lambda self: sum(f.size_bytes for f in self.files))
    num_lines = property(lambda self: sum(f.num_lines for f in self.files))
    num_blank_lines = property(lambda self: sum(f.num_blank_lines for f in self.files))
    num_records = property(lambda self: sum(f.num_records for f in self.files))
    num_malformed_lines = property(lambda self: sum(f.num_malformed_lines for f in self.files))
    num_duplicate_copies = property(lambda self: sum(f.num_duplicate_copies for f in self.files))
    num_duplicate_groups = property(lambda self: len(self.duplicate_groups))
    num_dirs = property(lambda self: len(self.dirs))
    files_with_malformed = property(lambda self: [f.relpath for f in self.files
                                                  if f.num_malformed_lines])
    dirs_without_jsonl = property(lambda self: [d.relpath for d in self.dirs
                                                if not d.num_jsonl_files])
    sources = property(lambda self: sorted({f.source for f in self.files}))
    file_hashes = property(lambda self: {f.relpath: f.sha256 for f in self.files if f.sha256})

    def check_invariants(self) -> list[str]:
        """Return violated accounting invariants (empty when the books balance)."""
        bad = [f"{f.relpath}: lines {f.num_lines} != blank+records+malformed"
               for f in self.files
               if f.num_lines != f.num_blank_lines + f.num_records + f.num_malformed_lines]
        if self.num_unique_records + self.num_duplicate_copies != self.num_records:
            bad.append("unique + duplicate copies != records")
        if sum(g["num_copies"] - 1 for g in self.duplicate_groups) != self.num_duplicate_copies:
            bad.append("duplicate groups do not sum to duplicate copies")
        if sum(self.malformed.values()) != self.num_malformed_lines:
            bad.append("malformed kinds do not sum to malformed lines")
        if sum(d.num_records for d in self.dirs) != self.num_records:
            bad.append("directory rows do not sum to records")
        return bad

    def summary(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in _SUMMARY_FIELDS}
        out["malformed"] = dict(self.malformed)
        out["num_problems"] = len(self.problems)
        return out

    def source_rows(self) -> list[dict[str, Any]]:
        """One row per source: files, bytes, records and malformed lines, timestamp unit."""
        rows = {}
        for f in self.files:
            row = rows.setdefault(f.source, {"source": f.source} | dict.fromkeys(
                ("num_files", "num_empty_files", "size_bytes", "num_records",
                 "num_malformed_lines", "num_duplicate_copies"), 0))
            row["num_files"] += 1
            row["num_empty_files"] += f.status == "ok" and f.size_bytes == 0
            for key in ("size_bytes", "num_records", "num_malformed_lines", "num_duplicate_copies"):
                row[key] += getattr(f, key)
        for src, row in rows.items():
            row["timestamp_unit"] = self.timestamp_units.get(src, {}).get("unit")
        return [rows[src] for src in sorted(rows)]

    def coverage_rows(self) -> list[dict[str, Any]]:
        """One row per (source, top-level field): the share of the source's object records that
        carry the field, and the share where it is non-null."""
        return [{"source": src, "field": name, "num_records": c["present"],
                 "share": c["present"] / self.num_object_records[src],
                 "share_non_null": c["non_null"] / self.num_object_records[src]}
                for src, fields in sorted(self.coverage.items())
                for name, c in sorted(fields.items())]

    def timestamp_rows(self) -> list[dict[str, Any]]:
        return [{"source": src, "field": name} | info
                for src, d in sorted(self.timestamp_units.items())
                for name, info in sorted(d["fields"].items())]

    def to_public(self) -> dict[str, Any]:
        """Derived, publishable audit: counts, coverage shares, field names, timestamp units,
        hashes, problems and the lineage verdict. No prompts, answers or any record text.

        Names taken from the corpus (paths, field names) appear only as values, never as keys, so
        ``app.publish``'s private-key screen cannot be tripped by a file or field called "answer".
        Per-file hashes are in ``files``; ``file_hashes`` is the same as a dict for
        ``results["inputs"]``.
        """
        return {
            "schema": PUBLIC_SCHEMA, "root_name": Path(self.root).name,
            "max_line_bytes": self.max_line_bytes, "summary": self.summary(),
            "sources": self.source_rows(), "files": [asdict(f) for f in self.files],
            "dirs": [asdict(d) for d in self.dirs], "coverage": self.coverage_rows(),
            "timestamp_units": {"sources": [{"source": src, "unit": d["unit"], "units": d["units"]}
                                            for src, d in self.timestamp_units.items()],
                                "fields": self.timestamp_rows()},
            "duplicate_groups": self.duplicate_groups,
            "problems": [asdict(p) for p in self.problems],
            "malformed_lines": [asdict(m) for m in self.malformed_lines],
            "set_sha256": self.set_sha256,
            "lineage": self.lineage.to_public() if self.lineage else None,
        }

    # -- pandas helpers for the notebook (pandas imported lazily: the audit is stdlib only) --
    def files_frame(self):
        return _frame([{k: v for k, v in asdict(f).items() if k != "malformed"}
                       | {f"malformed_{k}": f.malformed.get(k, 0) for k in MALFORMED_KINDS}
                       for f in self.files])

    def dirs_frame(self):
        return _frame([asdict(d) for d in self.dirs])

    def sources_frame(self):
        return _frame(self.source_rows())

    def coverage_frame(self):
        return _frame(self.coverage_rows())

    def timestamp_frame(self):
        return _frame(self.timestamp_rows())


_SUMMARY_FIELDS = (
    "num_files", "num_empty_files", "num_unreadable_files", "num_bytes", "num_lines",
    "num_blank_lines", "num_records", "num_non_object_records", "num_malformed_lines",
    "files_with_malformed", "num_unique_records", "num_duplicate_copies", "num_duplicate_groups",
    "num_dirs", "dirs_without_jsonl", "sources")


def _frame(rows: list[dict]):
    import pandas as pd
    return pd.DataFrame(rows)
