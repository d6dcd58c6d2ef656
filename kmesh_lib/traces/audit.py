"""Audit a directory tree of JSONL trace files without trusting a byte of it.

``audit_tree(root)`` walks the tree (``traces.scan.walk_tree``: sorted, so audits are
reproducible), streams every ``*.jsonl``/``*.ndjson`` file in binary chunks and counts what it
finds: records, blank lines, malformed lines by kind, exact duplicates, field coverage and
timestamp units per source, lineage fields (``traces.lineage``), and the SHA-256 of every file
and of the whole input set. Hostile input is counted or reported, never raised: lines over
``max_line_bytes`` are skipped unparsed and never held whole, invalid UTF-8 and JSON nested past
the interpreter's recursion limit are malformed lines, and symlink loops, non-regular files (a
FIFO would block ``open``) and unreadable files are ``problems``.

Duplicates are exact under canonical JSON (sorted keys, compact, UTF-8); only 32-byte digests
are kept, never records. ``set_sha256`` is sha256 over the sorted ``"relpath\\0filehash\\n"``
lines of the files read whole. The accounting invariants are listed in ``traces.report``.

"Source" is the first directory below the root; files at the root belong to source ".".
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from kmesh_lib.traces.lineage import LineageCollector
from kmesh_lib.traces.report import MAX_MALFORMED_DETAILS, DirRow, FileRow, MalformedLine, Problem, TraceAudit
from kmesh_lib.traces.scan import JSONL_SUFFIXES, MALFORMED_KINDS, Entry, iter_lines, os_reason, parse_line, walk_tree
from kmesh_lib.traces.units import TimestampUnits

MAX_DUPLICATE_LOCATIONS = 20   # per duplicate group; num_copies stays exact
MAX_FIELDS_PER_SOURCE = 4096   # coverage rows per source; further field names pool in OTHER_FIELDS
MAX_FIELD_NAME_CHARS = 128     # field names are published; a key may be text in disguise
OTHER_FIELDS = "<other fields>"


class _Auditor:
    """Mutable state of one audit pass; ``audit_tree`` is the public entry point."""

    def __init__(self, root: Path, max_line_bytes: int, progress: bool):
        self.progress = progress
        self.audit = TraceAudit(root=str(root), max_line_bytes=max_line_bytes)
        self.dirs: dict[str, DirRow] = {}
        self.first_seen: dict[bytes, tuple[str, int]] = {}  # digest -> first location
        self.num_later_copies: Counter[bytes] = Counter()  # digest -> copies after the first
        self.dup_locations: dict[bytes, list[tuple[str, int]]] = {}  # the first few copies
        self.coverage = defaultdict(lambda: defaultdict(Counter))
        self.num_object_records: Counter[str] = Counter()
        self.timestamps: dict[str, TimestampUnits] = defaultdict(TimestampUnits)
        self.lineage = LineageCollector()

    def consume(self, entry: Entry) -> None:
        if entry.kind == "dir":
            self.dirs[entry.relpath] = row = DirRow(entry.relpath)
            self.audit.dirs.append(row)
            if entry.relpath != ".":
                self.dirs[entry.parent].num_subdirs += 1
            return
        dir_row = self.dirs.get(entry.parent)
        if entry.kind == "other":
            dir_row.num_other_files += 1
            return
        if entry.problem:
            self.audit.problems.append(Problem(entry.problem, entry.relpath, entry.detail))
            if dir_row is not None:
                dir_row.num_problems += 1
        if entry.kind not in ("file", "unreadable"):
            return
        source = entry.relpath.split("/", 1)[0] if "/" in entry.relpath else "."
        row = FileRow(entry.relpath, source, entry.parent)
        self.audit.files.append(row)
        dir_row.num_jsonl_files += 1
        if entry.kind == "unreadable":
            row.status = "unreadable"  # still an input file: it gets a row, but no hash
            return
        self.stream(entry.fh, row)
        dir_row.num_records += row.num_records
        dir_row.num_malformed_lines += row.num_malformed_lines
        dir_row.size_bytes += row.size_bytes
        if self.progress:
            print(f"audited {row.relpath}: {row.num_records} records", file=sys.stderr)

    def stream(self, fh, row: FileRow) -> None:
        hasher = hashlib.sha256()
        malformed = Counter()
        try:
            for line_no, line, num_bytes, ended in iter_lines(fh, hasher, self.audit.max_line_bytes):
                row.num_lines += 1
                row.size_bytes += num_bytes + ended
                row.ends_with_newline = bool(ended)
                kind, value, detail = parse_line(line, num_bytes)
                if kind == "blank":
                    row.num_blank_lines += 1
                elif kind == "record":
                    self.count_record(row, line_no, value)
                else:
                    malformed[kind] += 1
                    if len(self.audit.malformed_lines) < MAX_MALFORMED_DETAILS:
                        self.audit.malformed_lines.append(
                            MalformedLine(row.relpath, line_no, kind, num_bytes, detail))
        except OSError as exc:
            row.status = "read-error"
            self.audit.problems.append(Problem("read-error", row.relpath, os_reason(exc)))
            self.dirs[row.directory].num_problems += 1
        else:
            row.sha256 = hasher.hexdigest()
        row.malformed = dict(malformed)
        row.num_malformed_lines = sum(malformed.values())
        for kind, n in malformed.items():
            self.audit.malformed[kind] += n

    def count_record(self, row: FileRow, line_no: int, value: tuple[Any, bytes]) -> None:
        rec, digest = value
        row.num_records += 1
        if digest in self.first_seen:
            row.num_duplicate_copies += 1
            self.num_later_copies[digest] += 1
            locations = self.dup_locations.setdefault(digest, [self.first_seen[digest]])
            if len(locations) < MAX_DUPLICATE_LOCATIONS:
                locations.append((row.relpath, line_no))
        else:
            self.first_seen[digest] = (row.relpath, line_no)
        if not isinstance(rec, dict):
            self.audit.num_non_object_records += 1
            return
        self.num_object_records[row.source] += 1
        fields = self.coverage[row.source]
        for key, val in rec.items():
            if key not in fields:  # hostile records may carry endless or enormous keys
                key = key if len(key) <= MAX_FIELD_NAME_CHARS else key[:MAX_FIELD_NAME_CHARS] + "…"
                key = key if len(fields) < MAX_FIELDS_PER_SOURCE else OTHER_FIELDS
            fields[key]["present"] += 1
            fields[key]["non_null"] += val is not None
        self.timestamps[row.source].observe(rec)
        self.lineage.observe(row.source, rec)

    def finish(self, started: float) -> TraceAudit:
        audit = self.audit
        audit.num_unique_records = len(self.first_seen)
        audit.duplicate_groups = [
            {"sha256": digest.hex(), "num_copies": 1 + self.num_later_copies[digest],
             "locations": [{"relpath": p, "line_no": n} for p, n in locs]}
            for digest, locs in self.dup_locations.items()]
        audit.coverage = {src: {k: dict(c) for k, c in f.items()}
                          for src, f in sorted(self.coverage.items())}
        audit.num_object_records = dict(self.num_object_records)
        audit.timestamp_units = {src: t.report() for src, t in sorted(self.timestamps.items())}
        lines = sorted(f"{f.relpath}\0{f.sha256}\n" for f in audit.files if f.sha256)
        # surrogateescape: a file name that is not UTF-8 must not crash the hash
        payload = "".join(lines).encode("utf-8", "surrogateescape")
        audit.set_sha256 = hashlib.sha256(payload).hexdigest()
        audit.lineage = self.lineage.finish(audit.sources)
        audit.elapsed_s = time.perf_counter() - started
        return audit


def audit_tree(root: str | Path, *, max_line_bytes: int = 8 << 20, max_depth: int = 64,
               progress: bool = False) -> TraceAudit:
    """Audit every JSONL file under ``root`` (see the module docstring for what is counted).

    ``max_line_bytes``: longer lines are counted malformed ("oversize") unparsed; memory stays
    about ``2 * max_line_bytes`` plus one 1 MiB read chunk. ``max_depth``: deeper directories
    are problems. ``progress``: print one line per file to stderr. Never raises for anything
    found inside the tree; a missing root raises FileNotFoundError.
    """
    started = time.perf_counter()
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"audit root is not a directory: {root}")
    auditor = _Auditor(root, max_line_bytes, progress)
    for entry in walk_tree(root, max_depth):
        auditor.consume(entry)
    return auditor.finish(started)


__all__ = ["audit_tree", "TraceAudit", "FileRow", "DirRow", "Problem", "MalformedLine",
           "JSONL_SUFFIXES", "MALFORMED_KINDS"]
