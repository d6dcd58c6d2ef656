"""Reading hostile trace trees safely: the tree walk, bounded line streaming, strict parsing.

Kept apart from ``traces.audit`` (which keeps the books) so each piece can be tested on its own.
Nothing here raises for what it finds in the tree, follows a directory or file twice, opens
anything but a regular file, or holds more than one capped line of input at a time.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

CHUNK_BYTES = 1 << 20
MALFORMED_KINDS = ("invalid_json", "invalid_utf8", "oversize", "too_deep")
JSONL_SUFFIXES = (".jsonl", ".ndjson")


@dataclass
class Entry:
    """One thing the walk met.

    ``kind``: "dir" (entered), "file" (a regular JSONL file, open as ``fh`` until the consumer
    asks for the next entry), "unreadable" (a regular JSONL file that could not be opened),
    "other" (a file that is not JSONL), or "problem" (``problem`` names it: symlink-loop,
    dangling-symlink, already-visited, not-regular, unreadable, too-deep). ``parent`` is the
    relpath of the directory that listed it ("." for the root itself).
    """

    kind: str
    relpath: str
    parent: str
    problem: str = ""
    detail: str = ""
    fh: BinaryIO | None = None


def os_reason(exc: OSError) -> str:
    """The error without the absolute path (audits are published; paths are relative)."""
    return exc.strerror or type(exc).__name__


def _error_kind(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "symlink-loop"
    return "dangling-symlink" if exc.errno == errno.ENOENT else "unreadable"


def walk_tree(root: Path, max_depth: int) -> Iterator[Entry]:
    """Depth-first, name-sorted walk of ``root`` that follows symlinks at most once each.

    Directories and files are keyed by (st_dev, st_ino), so a symlink cycle, a second link to a
    directory, or a hard link to an audited file is reported as "already-visited" instead of being
    walked or counted again. Non-regular files (FIFOs, sockets, devices) are never opened for
    reading: a FIFO would block until a writer appears.
    """
    yield from _walk(root, ".", ".", 0, max_depth, set(), set())


def _walk(path: Path, relpath: str, parent: str, depth: int, max_depth: int,
          seen_dirs: set, seen_files: set) -> Iterator[Entry]:
    try:
        st = os.stat(path)
    except OSError as exc:
        yield Entry("problem", relpath, parent, _error_kind(exc), os_reason(exc))
        return
    if (st.st_dev, st.st_ino) in seen_dirs:
        yield Entry("problem", relpath, parent, "already-visited", "directory reached twice")
        return
    if depth > max_depth:
        yield Entry("problem", relpath, parent, "too-deep", f"deeper than max_depth={max_depth}")
        return
    seen_dirs.add((st.st_dev, st.st_ino))
    yield Entry("dir", relpath, parent)
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        yield Entry("problem", relpath, relpath, "unreadable", os_reason(exc))
        return
    for name in names:
        child, child_rel = path / name, name if relpath == "." else f"{relpath}/{name}"
        try:
            mode = os.stat(child).st_mode  # follows links: ELOOP for a loop, ENOENT if dangling
        except OSError as exc:
            yield Entry("problem", child_rel, relpath, _error_kind(exc), os_reason(exc))
            continue
        if stat.S_ISDIR(mode):
            yield from _walk(child, child_rel, relpath, depth + 1, max_depth, seen_dirs, seen_files)
        elif not name.lower().endswith(JSONL_SUFFIXES):
            yield Entry("other", child_rel, relpath)
        elif not stat.S_ISREG(mode):
            yield Entry("problem", child_rel, relpath, "not-regular", "not a regular file; unread")
        else:
            yield from _open_file(child, child_rel, relpath, seen_files)


def _open_file(path: Path, relpath: str, parent: str, seen_files: set) -> Iterator[Entry]:
    try:
        # O_NONBLOCK: if the entry was swapped for a FIFO since stat, open must still not wait.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        yield Entry("unreadable", relpath, parent, "unreadable", os_reason(exc))
        return
    with os.fdopen(fd, "rb", buffering=0) as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            yield Entry("problem", relpath, parent, "not-regular", "not a regular file; unread")
        elif (st.st_dev, st.st_ino) in seen_files:
            yield Entry("problem", relpath, parent, "already-visited", "file reached twice")
        else:
            seen_files.add((st.st_dev, st.st_ino))
            yield Entry("file", relpath, parent, fh=fh)


def iter_lines(fh: BinaryIO, hasher: Any, max_line_bytes: int,
               chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[int, bytes | None, int, int]]:
    """Yield ``(line_no, line, num_bytes, ended)`` for every line of a binary stream.

    ``line`` excludes the newline and is None when ``num_bytes > max_line_bytes``: an oversize
    line's bytes are dropped as they stream past, so memory stays about
    ``max_line_bytes + chunk_bytes`` whatever the line length. ``ended`` is 1 when a newline
    closed the line, 0 for a final unterminated line. Every byte read goes through ``hasher``,
    so the hash covers the file even where lines are skipped.

    Invariant: ``sum(num_bytes + ended) ==`` bytes read.
    """
    buf = bytearray()
    pending = 0  # bytes of the current unterminated line, held in buf unless oversize
    oversize = False
    line_no = 0
    while chunk := fh.read(chunk_bytes):
        hasher.update(chunk)
        start = 0
        while (nl := chunk.find(b"\n", start)) >= 0:
            line_no += 1
            num_bytes = pending + nl - start
            if oversize or num_bytes > max_line_bytes:
                yield line_no, None, num_bytes, 1
            elif pending:
                buf += chunk[start:nl]
                yield line_no, bytes(buf), num_bytes, 1
            else:
                yield line_no, chunk[start:nl], num_bytes, 1
            buf.clear()
            pending, oversize, start = 0, False, nl + 1
        if start < len(chunk):
            pending += len(chunk) - start
            if oversize or pending > max_line_bytes:
                oversize = True
                buf.clear()
            else:
                buf += memoryview(chunk)[start:]
    if pending:
        yield line_no + 1, None if oversize else bytes(buf), pending, 0


def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN/Infinity; JSON does not, and canonical forms would disagree.
    raise ValueError(f"non-JSON constant {name}")


def parse_line(line: bytes | None, num_bytes: int) -> tuple[str, Any, str]:
    """Classify one line: ``("blank", None, "")``, ``("record", (obj, sha256_digest), "")`` or
    ``(malformed_kind, None, detail)`` with ``malformed_kind`` in ``MALFORMED_KINDS``.

    The digest is over canonical JSON (sorted keys, compact separators, UTF-8), so records that
    differ only in key order or whitespace are exact duplicates. ``detail`` carries parser
    positions only, never line content.
    """
    if line is None:
        return "oversize", None, f"{num_bytes} bytes"
    if not line.strip():
        return "blank", None, ""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "invalid_utf8", None, f"{exc.reason} at byte {exc.start}"
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
        canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except RecursionError:
        return "too_deep", None, "nesting deeper than the interpreter's recursion limit"
    except json.JSONDecodeError as exc:
        return "invalid_json", None, f"{exc.msg} at char {exc.pos}"
    except ValueError as exc:
        return "invalid_json", None, str(exc)
    # surrogatepass: JSON may escape a lone surrogate ("\ud800"), which strict UTF-8 refuses.
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).digest()
    return "record", (obj, digest), ""
