"""Section 17's captures (``base.captures``): the audit's rows (``traces.report``), one ``raw/audit_*.jsonl``
per table of ``traces.report.RAW_TABLES``, as ``TraceAudit.rows`` gives them.

The published run (cpu-20261201-060429-0bbb) reads as version 1 with these classes; no field is optional
for it. Nested counts the readers hand on whole stay mappings: a source's ``timestamps`` (``traces.units``)
and ``lineage`` (``traces.lineage.SourceLineage.to_row``, which ``source_verdict`` reads back).

``AuditRows`` holds a run's rows. ``traces.report``'s totals and invariants are shared with the live audit
(``TraceAudit.rows``, plain records), so the section hands them ``AuditRows.as_recorded()``; what the section
itself reads of a row, it reads as an attribute.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from pydantic import BaseModel, ConfigDict

from kmesh_lib.base.captures import CaptureRecord
from kmesh_lib.base.records import RunFiles
from kmesh_lib.traces.lineage import SourceLineage, source_verdict
from kmesh_lib.traces.report import RAW_TABLES

Mapping = dict[str, Any]


class AuditFile(CaptureRecord):
    """One JSONL file of the corpus (``traces.report.FileRow``)."""

    SCHEMA = "trace_audit.audit_files"
    VERSION = 1

    relpath: str
    source: str
    directory: str
    size_bytes: int
    sha256: str | None  # None: the file was not read whole (status unreadable or read-error)
    status: str  # ok | unreadable | read-error
    num_lines: int
    num_blank_lines: int
    num_records: int
    num_object_records: int
    num_malformed_lines: int
    num_duplicate_copies: int
    num_duplicate_groups: int  # groups whose first copy is in this file
    ends_with_newline: bool
    malformed: dict[str, int]  # malformed lines by kind (traces.scan.MALFORMED_KINDS)


class AuditDir(CaptureRecord):
    """One directory, direct children only (``traces.report.DirRow``)."""

    SCHEMA = "trace_audit.audit_dirs"
    VERSION = 1

    relpath: str
    num_jsonl_files: int
    num_other_files: int
    num_subdirs: int
    num_problems: int
    num_records: int
    num_malformed_lines: int
    size_bytes: int


class AuditProblem(CaptureRecord):
    """An entry of the tree the audit did not read (``traces.report.Problem``)."""

    SCHEMA = "trace_audit.audit_problems"
    VERSION = 1

    kind: str  # one of traces.scan.PROBLEM_KINDS
    relpath: str
    detail: str


class AuditMalformedLine(CaptureRecord):
    """A line that is not a JSON record (``traces.report.MalformedLine``): where, what kind, how long."""

    SCHEMA = "trace_audit.audit_malformed"
    VERSION = 1

    relpath: str
    line_no: int  # 1-based
    kind: str
    num_bytes: int
    detail: str  # the parser's message: positions and counts, never line content


class DuplicateLocation(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    relpath: str
    line_no: int


class AuditDuplicateGroup(CaptureRecord):
    """Records with the same bytes: their hash, how many copies, and where each copy is."""

    SCHEMA = "trace_audit.audit_duplicates"
    VERSION = 1

    sha256: str
    num_copies: int
    locations: list[DuplicateLocation]


class AuditSource(CaptureRecord):
    """A source's top-level fields, timestamps and lineage counts (``TraceAudit.source_row``)."""

    SCHEMA = "trace_audit.audit_sources"
    VERSION = 1

    source: str
    num_object_records: int
    fields: dict[str, list[int]]  # name -> [records carrying it, records carrying it non-null]
    num_records_with_untracked_fields: int
    num_untracked_keys: int
    timestamps: Mapping  # traces.units' verdict over the source's time fields; {} for a source without records
    lineage: Mapping | None  # SourceLineage.to_row; None for an audit made without the lineage pass


CAPTURES = {"audit_files.jsonl": AuditFile, "audit_dirs.jsonl": AuditDir, "audit_problems.jsonl": AuditProblem,
            "audit_malformed.jsonl": AuditMalformedLine, "audit_duplicates.jsonl": AuditDuplicateGroup,
            "audit_sources.jsonl": AuditSource}


@dataclass(frozen=True)
class AuditRows:
    """A run's audit rows, one list per capture, in the order of ``traces.report.RAW_TABLES``."""

    files: list[AuditFile]
    dirs: list[AuditDir]
    problems: list[AuditProblem]
    malformed: list[AuditMalformedLine]
    duplicates: list[AuditDuplicateGroup]
    sources: list[AuditSource]

    @classmethod
    def of(cls, run: RunFiles) -> AuditRows:
        """``run``'s rows as their classes (a missing table is an empty list; a refused line a RunFileError)."""
        return cls(*(run.records(f"{table}.jsonl") for table in RAW_TABLES))

    def as_recorded(self) -> dict[str, list[dict]]:
        """The rows as the captures store them, by table name: what ``traces.report``'s totals and invariants
        read (they are shared with the live audit's plain records, ``TraceAudit.rows``), and what a fresh audit
        of the corpus is compared with."""
        return {table: [row.as_recorded() for row in getattr(self, f.name)]
                for table, f in zip(RAW_TABLES, fields(self), strict=True)}

    @property
    def file_hashes(self) -> dict[str, str]:
        """relpath -> SHA-256 of every file the audit read whole."""
        return {f.relpath: f.sha256 for f in self.files if f.sha256}

    @property
    def lineage_verdicts(self) -> dict[str, SourceLineage]:
        """source -> its verdict, for every source with lineage counts (``traces.lineage.source_verdict``)."""
        return {s.source: source_verdict(s.lineage) for s in self.sources if s.lineage}

__all__ = ["AuditDir", "AuditRows", "AuditDuplicateGroup", "AuditFile", "AuditMalformedLine", "AuditProblem", "AuditSource",
           "CAPTURES", "DuplicateLocation"]
