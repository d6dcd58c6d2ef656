"""Audit a directory tree of JSONL trace files without trusting a byte of it.

``audit_tree(root)`` walks the tree (``traces.scan.walk_tree``: sorted, so audits are
reproducible, and never outside ``root``), streams every ``*.jsonl``/``*.ndjson`` file in binary
chunks and counts what it finds: records, blank lines, malformed lines by kind, exact duplicates,
field coverage and timestamp units per source, lineage fields (``traces.lineage``), and the SHA-256
of every file and of the whole input set. Hostile input is counted or reported, never raised, and
never costs memory or output in proportion to what it invents:

* lines over ``max_line_bytes`` are skipped unparsed and never held whole; lines nested deeper
  than ``max_json_depth`` or too dense to parse within ``scan.PARSE_COST_MULTIPLE`` times their
  size are malformed lines, judged from their bytes (``traces.scan.parse_line``);
* at most ``max_fields_per_source`` distinct field names are tracked per source, the rest are
  counted as "other"; timestamp fields and lineage field paths are capped the same way;
* every name kept (paths, sources, fields) is in the safe form of ``traces.names``, so a field
  name that is a secret or a page of text never reaches a row, a result or a report;
* symbolic links, FIFOs and unreadable files are ``problems``.

What still grows with the input: one row per file and directory, and per unique record a 32-byte
digest and its first location (about 150 bytes in all), plus 64-bit digests of lineage ids.

Duplicates are exact under canonical JSON (sorted keys, compact, UTF-8). ``set_sha256`` is sha256
over the sorted ``"relpath\\0filehash\\n"`` lines of the files read whole (``set_sha256_of``). The
accounting invariants are listed in ``traces.report``.

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
from kmesh_lib.traces.names import safe_name, safe_relpath
from kmesh_lib.traces.report import (
    MAX_DUPLICATE_GROUPS,
    MAX_MALFORMED_DETAILS,
    DirRow,
    FileRow,
    MalformedLine,
    Problem,
    SourceFields,
    TraceAudit,
)
from kmesh_lib.traces.scan import (
    DEFAULT_MAX_JSON_DEPTH,
    JSONL_SUFFIXES,
    MALFORMED_KINDS,
    Entry,
    iter_lines,
    os_reason,
    parse_line,
    walk_tree,
)
from kmesh_lib.traces.units import TimestampUnits

MAX_DUPLICATE_LOCATIONS = 20   # per duplicate group; num_copies stays exact
MAX_FIELDS_PER_SOURCE = 4096   # distinct top-level field names tracked per source
_MAX_CACHED_NAMES = 1 << 14
_LINE_BITS = 40                # a first location is packed as file_index << 40 | line_no


def set_sha256_of(hashes: dict[str, str]) -> str:
    """The input-set hash from ``{relpath: sha256}``."""
    lines = sorted(f"{path}\0{digest}\n" for path, digest in hashes.items())
    # surrogateescape: a name that is not UTF-8 must not crash the hash (safe names never are)
    return hashlib.sha256("".join(lines).encode("utf-8", "surrogateescape")).hexdigest()


class _Auditor:
    """Mutable state of one audit pass; ``audit_tree`` is the public entry point."""

    def __init__(self, audit: TraceAudit, progress: bool):
        self.progress = progress
        self.audit = audit
        self.dirs: dict[str, DirRow] = {}
        self.first_seen: dict[bytes, int] = {}  # digest -> packed first location
        self.num_later_copies: Counter[bytes] = Counter()  # digest -> copies after the first
        self.dup_locations: dict[bytes, list[tuple[str, int]]] = {}  # the first few copies
        self.fields: dict[str, SourceFields] = defaultdict(SourceFields)
        self.timestamps: dict[str, TimestampUnits] = defaultdict(TimestampUnits)
        self.lineage = LineageCollector()
        self.names: dict[str, str] = {}  # key -> safe name, for the first _MAX_CACHED_NAMES keys

    def consume(self, entry: Entry) -> None:
        relpath, parent = safe_relpath(entry.relpath), safe_relpath(entry.parent)
        if entry.kind == "dir":
            self.dirs[relpath] = row = DirRow(relpath)
            self.audit.dirs.append(row)
            if relpath != ".":
                self.dirs[parent].num_subdirs += 1
            return
        dir_row = self.dirs[parent]
        if entry.kind == "other":
            dir_row.num_other_files += 1
            return
        if entry.problem:
            self.audit.problems.append(Problem(entry.problem, relpath, entry.detail))
            dir_row.num_problems += 1
        if entry.kind not in ("file", "unreadable"):
            return
        source = relpath.split("/", 1)[0] if "/" in relpath else "."
        row = FileRow(relpath, source, parent)
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
        file_index = len(self.audit.files) - 1
        try:
            for line_no, line, num_bytes, ended in iter_lines(fh, hasher, self.audit.max_line_bytes):
                row.num_lines += 1
                row.size_bytes += num_bytes + ended
                row.ends_with_newline = bool(ended)
                kind, value, detail = parse_line(line, num_bytes, self.audit.max_json_depth)
                del line
                if kind == "blank":
                    row.num_blank_lines += 1
                elif kind == "record":
                    self.count_record(row, file_index, line_no, value)
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

    def count_record(self, row: FileRow, file_index: int, line_no: int, value: tuple[Any, bytes]) -> None:
        rec, digest = value
        row.num_records += 1
        here = file_index << _LINE_BITS | line_no
        first = self.first_seen.setdefault(digest, here)
        if first != here:
            row.num_duplicate_copies += 1
            self.num_later_copies[digest] += 1
            self._locate_copy(digest, first, row.relpath, line_no)
        self._fields(row, rec)

    def _locate_copy(self, digest: bytes, first: int, relpath: str, line_no: int) -> None:
        """Keeps the first ``MAX_DUPLICATE_LOCATIONS`` locations of the first
        ``MAX_DUPLICATE_GROUPS`` groups; the counts stay exact past both caps."""
        locations = self.dup_locations.get(digest)
        if locations is None:
            if len(self.dup_locations) >= MAX_DUPLICATE_GROUPS:
                return
            first_file = self.audit.files[first >> _LINE_BITS].relpath
            locations = self.dup_locations[digest] = [(first_file, first & ((1 << _LINE_BITS) - 1))]
        if len(locations) < MAX_DUPLICATE_LOCATIONS:
            locations.append((relpath, line_no))

    def _fields(self, row: FileRow, rec: Any) -> None:
        if not isinstance(rec, dict):
            return
        row.num_object_records += 1
        source = self.fields[row.source]
        source.num_object_records += 1
        tracked = source.fields
        seen: set[str] = set()
        untracked = 0
        timestamps = self.timestamps[row.source]
        names = self.names
        for key, val in rec.items():
            name = names.get(key)
            if name is None:
                name = safe_name(key)
                if len(names) < _MAX_CACHED_NAMES and len(key) <= 64:
                    names[key] = name
            if name in seen:  # two keys with one safe form count once per record
                continue
            seen.add(name)
            counts = tracked.get(name)
            if counts is None:
                if len(tracked) >= self.audit.max_fields_per_source:
                    untracked += 1
                    continue
                counts = tracked[name] = [0, 0]
            counts[0] += 1
            counts[1] += val is not None
            timestamps.observe(name, key, val)
        if untracked:
            source.num_records_with_untracked_fields += 1
            source.num_untracked_keys += untracked
        self.lineage.observe(row.source, rec)

    def finish(self, started: float) -> TraceAudit:
        audit = self.audit
        for digest in self.num_later_copies:
            audit.files[self.first_seen[digest] >> _LINE_BITS].num_duplicate_groups += 1
        audit.duplicate_groups = [
            {"sha256": digest.hex(), "num_copies": 1 + self.num_later_copies[digest],
             "locations": [{"relpath": p, "line_no": n} for p, n in locs]}
            for digest, locs in self.dup_locations.items()]
        audit.source_fields = dict(sorted(self.fields.items()))
        audit.timestamp_units = {src: t.report() for src, t in sorted(self.timestamps.items())}
        audit.set_sha256 = set_sha256_of(audit.file_hashes)
        audit.lineage = self.lineage.finish(audit.sources)
        audit.elapsed_s = time.perf_counter() - started
        return audit


def audit_tree(root: str | Path, *, max_line_bytes: int = 8 << 20, max_depth: int = 64,
               max_json_depth: int = DEFAULT_MAX_JSON_DEPTH, max_fields_per_source: int = MAX_FIELDS_PER_SOURCE,
               progress: bool = False) -> TraceAudit:
    """Audit every JSONL file under ``root`` (see the module docstring for what is counted).

    ``max_line_bytes``: longer lines are counted malformed ("oversize") unparsed; holding a line
    costs its size plus one 1 MiB read chunk, parsing it at most ``scan.PARSE_COST_MULTIPLE``
    times its size plus ``scan.PARSE_COST_SLACK``. ``max_depth``: deeper directories are
    problems. ``max_json_depth``: deeper JSON is malformed ("too_deep"). ``progress``: print one
    line per file to stderr. Never raises for anything found inside the tree; a missing root
    raises FileNotFoundError.
    """
    started = time.perf_counter()
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"audit root is not a directory: {root}")
    audit = TraceAudit(root_name=safe_name(root.resolve().name, 64), max_line_bytes=max_line_bytes,
                       max_depth=max_depth, max_json_depth=max_json_depth,
                       max_fields_per_source=max_fields_per_source)
    auditor = _Auditor(audit, progress)
    for entry in walk_tree(root, max_depth):
        auditor.consume(entry)
    return auditor.finish(started)


__all__ = ["audit_tree", "set_sha256_of", "TraceAudit", "FileRow", "DirRow", "Problem", "MalformedLine",
           "JSONL_SUFFIXES", "MALFORMED_KINDS"]
