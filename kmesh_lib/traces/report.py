"""What a trace audit found: rows, totals, invariants and frames.

``traces.audit.audit_tree`` fills a ``TraceAudit``; this module only holds and presents it. Every
name in it (paths, sources, fields) is in the safe form of ``traces.names``.

``rows()`` is the audit as plain records (section 17 writes them to ``raw/``), and the totals are
computed from such records by ``summary_from_rows``, so a recorded run's totals can be recomputed
from its raw rows. Accounting invariants (``invariant_failures`` lists the broken ones):

* per file: ``num_lines == num_blank_lines + num_records + num_malformed_lines``, the malformed
  kinds sum to the malformed lines, ``num_object_records <= num_records``;
* every listed duplicate group of ``k`` copies contributes ``k - 1`` duplicate copies, and when
  every group is listed (the files' ``num_duplicate_groups`` sum to the groups listed) they sum to
  the files' duplicate copies;
* directory rows sum to the file rows (records, malformed lines, bytes);
* per source: the object records of its files are the records its coverage and lineage counted,
  and every count of records carrying a field is at most that: shares lie in [0, 1].
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from kmesh_lib.traces.lineage import LineageReport
from kmesh_lib.traces.names import OTHER_FIELDS
from kmesh_lib.traces.scan import MALFORMED_KINDS

MAX_MALFORMED_DETAILS = 1000  # details kept; the counts are always exact
MAX_DUPLICATE_GROUPS = 1000  # groups listed; num_duplicate_groups is always exact
RAW_TABLES = ("audit_files", "audit_dirs", "audit_problems", "audit_malformed", "audit_duplicates",
              "audit_sources")


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
    num_object_records: int = 0
    num_malformed_lines: int = 0
    num_duplicate_copies: int = 0
    num_duplicate_groups: int = 0  # groups whose first copy is in this file
    ends_with_newline: bool = True
    malformed: dict[str, int] = field(default_factory=dict)


@dataclass
class DirRow:
    """One directory, direct children only (directories holding no JSONL are rows too)."""

    relpath: str
    num_jsonl_files: int = 0
    num_other_files: int = 0
    num_subdirs: int = 0
    num_problems: int = 0  # entries it lists that became problems (links, FIFOs, ...)
    num_records: int = 0
    num_malformed_lines: int = 0
    size_bytes: int = 0


@dataclass
class Problem:
    kind: str  # one of traces.scan.PROBLEM_KINDS
    relpath: str
    detail: str


@dataclass
class MalformedLine:
    relpath: str
    line_no: int  # 1-based
    kind: str
    num_bytes: int
    detail: str  # parser message: positions and counts, never line content


@dataclass
class SourceFields:
    """Top-level fields of one source's object records.

    ``fields[name] = [num_records_with_it, num_records_with_it_non_null]`` for at most
    ``max_fields`` names; ``num_records_with_untracked_fields`` counts the records carrying any
    name past that cap (``num_untracked_keys`` the keys themselves). Counted once per record, so
    every count is at most ``num_object_records``.
    """

    num_object_records: int = 0
    fields: dict[str, list[int]] = field(default_factory=dict)
    num_records_with_untracked_fields: int = 0
    num_untracked_keys: int = 0


@dataclass
class TraceAudit:
    root_name: str
    max_line_bytes: int
    max_depth: int
    max_json_depth: int
    max_fields_per_source: int
    files: list[FileRow] = field(default_factory=list)
    dirs: list[DirRow] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    malformed_lines: list[MalformedLine] = field(default_factory=list)
    duplicate_groups: list[dict] = field(default_factory=list)  # sha256, num_copies, locations
    source_fields: dict[str, SourceFields] = field(default_factory=dict)
    timestamp_units: dict[str, dict] = field(default_factory=dict)
    set_sha256: str = ""
    elapsed_s: float = 0.0
    lineage: LineageReport | None = None

    def rows(self) -> dict[str, list[dict]]:
        """The whole audit as plain records, one list per ``RAW_TABLES`` name."""
        return {
            "audit_files": [asdict(f) for f in self.files],
            "audit_dirs": [asdict(d) for d in self.dirs],
            "audit_problems": [asdict(p) for p in self.problems],
            "audit_malformed": [asdict(m) for m in self.malformed_lines],
            "audit_duplicates": self.duplicate_groups,
            "audit_sources": [self.source_row(src) for src in self.sources],
        }

    def source_row(self, source: str) -> dict[str, Any]:
        fields = self.source_fields.get(source, SourceFields())
        return {"source": source, **asdict(fields), "timestamps": self.timestamp_units.get(source, {}),
                "lineage": self.lineage.sources[source].to_row() if self.lineage else None}

    def summary(self) -> dict[str, Any]:
        return summary_from_rows(self.rows())

    def invariant_failures(self) -> list[str]:
        return invariant_failures(self.rows())

    # -- conveniences over the rows --
    sources = property(lambda self: sorted({f.source for f in self.files}))
    file_hashes = property(lambda self: {f.relpath: f.sha256 for f in self.files if f.sha256})
    num_files = property(lambda self: len(self.files))
    num_records = property(lambda self: sum(f.num_records for f in self.files))
    num_bytes = property(lambda self: sum(f.size_bytes for f in self.files))
    num_empty_files = property(lambda self: sum(f.status == "ok" and f.size_bytes == 0 for f in self.files))
    num_malformed_lines = property(lambda self: sum(f.num_malformed_lines for f in self.files))
    num_duplicate_copies = property(lambda self: sum(f.num_duplicate_copies for f in self.files))
    num_unique_records = property(lambda self: self.num_records - self.num_duplicate_copies)
    num_duplicate_groups = property(lambda self: sum(f.num_duplicate_groups for f in self.files))
    files_with_malformed = property(lambda self: [f.relpath for f in self.files if f.num_malformed_lines])
    dirs_without_jsonl = property(lambda self: [d.relpath for d in self.dirs if not d.num_jsonl_files])
    malformed = property(lambda self: {k: sum(f.malformed.get(k, 0) for f in self.files) for k in MALFORMED_KINDS})

    def coverage_rows(self) -> list[dict[str, Any]]:
        """One row per (source, tracked top-level field) plus one for the untracked fields: the
        share of the source's object records that carry the field, and the share where it is
        non-null. Shares lie in [0, 1] (each record counts once per field)."""
        return coverage_rows(self.rows()["audit_sources"])

    def timestamp_rows(self) -> list[dict[str, Any]]:
        return [{"source": src, "field": name} | info
                for src, d in sorted(self.timestamp_units.items())
                for name, info in sorted(d["fields"].items())]

    def source_rows(self) -> list[dict[str, Any]]:
        return source_rows(self.rows())

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


def coverage_rows(source_rows: list[dict]) -> list[dict[str, Any]]:
    rows = []
    for src in source_rows:
        n = src["num_object_records"]
        if not n:
            continue
        for name, (present, non_null) in sorted(src["fields"].items()):
            rows.append({"source": src["source"], "field": name, "num_records": present,
                         "share": present / n, "share_non_null": non_null / n})
        if src["num_records_with_untracked_fields"]:
            rows.append({"source": src["source"], "field": OTHER_FIELDS,
                         "num_records": src["num_records_with_untracked_fields"],
                         "share": src["num_records_with_untracked_fields"] / n, "share_non_null": None})
    return rows


def source_rows(rows: dict[str, list[dict]]) -> list[dict[str, Any]]:
    """One row per source: files, bytes, records and malformed lines, timestamp unit, fields."""
    out: dict[str, dict] = {}
    for f in rows["audit_files"]:
        row = out.setdefault(f["source"], {"source": f["source"]} | dict.fromkeys(
            ("num_files", "num_empty_files", "size_bytes", "num_records", "num_object_records",
             "num_malformed_lines", "num_duplicate_copies"), 0))
        row["num_files"] += 1
        row["num_empty_files"] += f["status"] == "ok" and f["size_bytes"] == 0
        for key in ("size_bytes", "num_records", "num_object_records", "num_malformed_lines",
                    "num_duplicate_copies"):
            row[key] += f[key]
    for src in rows["audit_sources"]:
        row = out.get(src["source"])
        if row is not None:
            row["timestamp_unit"] = (src.get("timestamps") or {}).get("unit")
            row["num_fields"] = len(src["fields"])
            row["num_untracked_keys"] = src["num_untracked_keys"]
    return [out[src] for src in sorted(out)]


def summary_from_rows(rows: dict[str, list[dict]]) -> dict[str, Any]:
    """The audit's totals, computed from its rows (``TraceAudit.rows`` or a run's ``raw/``)."""
    files, dirs, problems = rows["audit_files"], rows["audit_dirs"], rows["audit_problems"]
    total = lambda key: sum(f[key] for f in files)  # noqa: E731
    malformed = Counter()
    for f in files:
        malformed.update(f["malformed"])
    return {
        "num_files": len(files),
        "num_empty_files": sum(f["status"] == "ok" and f["size_bytes"] == 0 for f in files),
        "num_unreadable_files": sum(f["status"] != "ok" for f in files),
        "num_bytes": total("size_bytes"),
        "num_lines": total("num_lines"),
        "num_blank_lines": total("num_blank_lines"),
        "num_records": total("num_records"),
        "num_object_records": total("num_object_records"),
        "num_non_object_records": total("num_records") - total("num_object_records"),
        "num_unique_records": total("num_records") - total("num_duplicate_copies"),
        "num_duplicate_copies": total("num_duplicate_copies"),
        "num_duplicate_groups": total("num_duplicate_groups"),
        "num_malformed_lines": total("num_malformed_lines"),
        "malformed": {kind: malformed.get(kind, 0) for kind in MALFORMED_KINDS},
        "num_files_with_malformed": sum(f["num_malformed_lines"] > 0 for f in files),
        "num_dirs": len(dirs),
        "num_dirs_without_jsonl": sum(d["num_jsonl_files"] == 0 for d in dirs),
        "num_problems": len(problems),
        "problems": dict(sorted(Counter(p["kind"] for p in problems).items())),
        "num_sources": len({f["source"] for f in files}),
    }


def invariant_failures(rows: dict[str, list[dict]]) -> list[str]:
    """The accounting invariants of the module docstring that ``rows`` break (empty: balanced)."""
    files, dirs = rows["audit_files"], rows["audit_dirs"]
    bad = []
    for f in files:
        if f["num_lines"] != f["num_blank_lines"] + f["num_records"] + f["num_malformed_lines"]:
            bad.append(f"{f['relpath']}: lines != blank + records + malformed")
        if sum(f["malformed"].values()) != f["num_malformed_lines"]:
            bad.append(f"{f['relpath']}: malformed kinds do not sum to its malformed lines")
        if not 0 <= f["num_object_records"] <= f["num_records"]:
            bad.append(f"{f['relpath']}: object records outside 0..records")
    groups = rows["audit_duplicates"]
    num_duplicate_groups = sum(f["num_duplicate_groups"] for f in files)
    listed = sum(g["num_copies"] - 1 for g in groups)
    copies = sum(f["num_duplicate_copies"] for f in files)
    if len(groups) > num_duplicate_groups or listed > copies or (
            len(groups) == num_duplicate_groups and listed != copies):
        bad.append(f"duplicate groups ({len(groups)} of {num_duplicate_groups} listed, {listed} copies) "
                   f"do not match the files' {copies} duplicate copies")
    for key in ("num_records", "num_malformed_lines", "size_bytes"):
        if sum(d[key] for d in dirs) != sum(f[key] for f in files):
            bad.append(f"directory rows do not sum to the file rows ({key})")
    object_records = Counter()
    for f in files:
        object_records[f["source"]] += f["num_object_records"]
    sources = {s["source"]: s for s in rows["audit_sources"]}
    if set(sources) != set(object_records):
        bad.append("source rows do not name the files' sources")
    for name, src in sources.items():
        n = src["num_object_records"]
        if n != object_records.get(name, 0) or (src.get("lineage") and src["lineage"]["num_records"] != n):
            bad.append(f"{name}: object records differ between files, coverage and lineage")
        over = [f for f, (present, non_null) in src["fields"].items() if not 0 <= non_null <= present <= n]
        if over or not 0 <= src["num_records_with_untracked_fields"] <= n:
            bad.append(f"{name}: field counts outside 0..{n} object records ({len(over)} fields)")
    return bad


def _frame(rows: list[dict]):
    import pandas as pd
    return pd.DataFrame(rows)
