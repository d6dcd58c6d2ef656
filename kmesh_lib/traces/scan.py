"""Reading hostile trace trees safely: the tree walk, bounded line streaming, strict parsing.

Kept apart from ``traces.audit`` (which keeps the books) so each piece can be tested on its own.
Nothing here raises for what it finds in the tree, leaves the tree, reads a directory or file
twice, opens anything but a regular file, or holds more than one capped line of input at a time.

Memory, per line (``tests/test_trace_audit.py`` measures it with tracemalloc): holding a line costs
its size plus one read chunk (``CHUNK_BYTES``); parsing it costs at most ``PARSE_COST_MULTIPLE`` (16)
times its size plus ``PARSE_COST_SLACK`` (2 MiB) more. ``parse_line`` estimates the cost from the
bytes before it decodes anything (``parse_cost``) and leaves a line whose estimate is over that
bound unparsed, as "too_dense". Measured beyond the line itself: text-heavy records cost 2 times
their size (ASCII), 3 (CJK) or 8 (one character above U+FFFF makes every character of the str 4
bytes); dense JSON costs 7 to 77 bytes a value, so ``[{},{},...]`` would cost 27 times its size and
is refused.
"""

from __future__ import annotations

import errno
import hashlib
import json
import json.encoder
import os
import re
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any, BinaryIO

CHUNK_BYTES = 1 << 20
MALFORMED_KINDS = ("invalid_json", "invalid_utf8", "oversize", "too_deep", "too_dense")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
DEFAULT_MAX_JSON_DEPTH = 64
MAX_JSON_DEPTH_LIMIT = 256  # far below the interpreter's recursion limit in any caller
PARSE_COST_MULTIPLE = 16
PARSE_COST_SLACK = 2 << 20  # the budget's fixed part: a small line may be dense
PARSE_COST_FIXED = 8 * (1 << 16)  # the cost's fixed part: hashing slices (HASH_CHARS at 4 bytes, twice)
# Upper bound on what one JSON value costs beyond its text once parsed and hashed: the object (an
# empty dict is 64 bytes), its slot in the parent (8, or a dict entry's hash, key and value). Measured
# at 7 to 77 bytes a value across the densest shapes (lists of {}, [], ints, floats, short and wide
# strings, objects of many keys); tests/test_trace_audit.py holds the estimate above the measurement.
VALUE_BYTES = 128
HASH_CHARS = 1 << 16  # canonical JSON is hashed in slices, so it is never encoded whole
_encode_str = json.encoder.encode_basestring  # json.dumps's own quoting (ensure_ascii=False)

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_NOT_TOKENS = bytes(b for b in range(256) if b not in b"[]{},:")
_BRACKET_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 / -1 as signed bytes
_BELOW_C4 = bytes(range(0xC4))
_BELOW_F0 = bytes(range(0xF0))


@dataclass
class Entry:
    """One thing the walk met.

    ``kind``: "dir" (entered), "file" (a regular JSONL file, open as ``fh`` until the consumer
    asks for the next entry), "unreadable" (a regular JSONL file that could not be opened),
    "other" (a file that is not JSONL), or "problem" (``problem`` names it, one of
    ``PROBLEM_KINDS``). ``parent`` is the relpath of the directory that listed it ("." for the
    root itself).
    """

    kind: str
    relpath: str
    parent: str
    problem: str = ""
    detail: str = ""
    fh: BinaryIO | None = None


PROBLEM_KINDS = {
    "symlink": "a symbolic link to a target inside the root: not followed (the walk reaches the target "
               "by its own path)",
    "symlink-outside-root": "a symbolic link to a target outside the root: not followed",
    "symlink-loop": "a symbolic link that resolves to itself: not followed",
    "dangling-symlink": "a symbolic link to nothing",
    "other-filesystem": "a directory on another file system (a mount point): not walked",
    "already-visited": "a directory or file reached a second time (a hard link or bind mount): counted once",
    "too-deep": "a directory deeper than max_depth: not walked",
    "not-regular": "a FIFO, socket or device named like JSONL: never opened",
    "unreadable": "a file or directory that could not be opened or listed",
    "read-error": "a file that failed mid-read: its counts are partial and it has no hash",
}


def os_reason(exc: OSError) -> str:
    """The error without the absolute path (audits are published; paths are relative)."""
    return exc.strerror or type(exc).__name__


def _symlink_problem(path: Path, real_root: str) -> tuple[str, str]:
    """Classifies a symbolic link without walking or opening its target."""
    try:
        os.stat(path)  # follows the link: ELOOP for a loop, ENOENT if dangling; reads nothing
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symlink-loop", "not followed"
        if exc.errno == errno.ENOENT:
            return "dangling-symlink", "not followed"
        return "unreadable", os_reason(exc)
    target = os.path.realpath(path)
    if target == real_root or target.startswith(real_root.rstrip(os.sep) + os.sep):
        return "symlink", "not followed: its target is inside the root"
    return "symlink-outside-root", "not followed: its target is outside the root"


def walk_tree(root: Path, max_depth: int) -> Iterator[Entry]:
    """Depth-first, name-sorted walk of ``root`` that never leaves it.

    Symbolic links below the root are reported (``PROBLEM_KINDS``) and never followed, so a link
    to ``/`` costs one problem row, and a link to a file or directory of the tree does not count
    it twice: the walk reaches the target by its own path. Directories on another file system
    are not entered. Directories and files are keyed by (st_dev, st_ino), so a hard link or a
    bind mount is "already-visited" instead of walked or counted again. Files are opened with
    O_NOFOLLOW | O_NONBLOCK and checked with fstat, so a link or FIFO swapped in after the listing
    is refused rather than followed or waited on.

    Depth is an explicit counter on an explicit stack (not recursion), so any ``max_depth``
    walks the same way in every caller. The root itself may be a symbolic link: naming it is the
    caller's choice.
    """
    root = Path(root)
    root_st = os.stat(root)
    real_root = os.path.realpath(root)
    seen_dirs = {(root_st.st_dev, root_st.st_ino)}
    seen_files: set[tuple[int, int]] = set()
    yield Entry("dir", ".", ".")
    stack: list[tuple[Path, str, int, Iterator[str]]] = []
    listing = _list(root, ".")
    if isinstance(listing, Entry):
        yield listing
    else:
        stack.append((root, ".", 0, listing))
    while stack:
        path, relpath, depth, names = stack[-1]
        name = next(names, None)
        if name is None:
            stack.pop()
            continue
        child, child_rel = path / name, name if relpath == "." else f"{relpath}/{name}"
        try:
            st = os.lstat(child)
        except OSError as exc:
            yield Entry("problem", child_rel, relpath, "unreadable", os_reason(exc))
            continue
        if stat.S_ISLNK(st.st_mode):
            yield Entry("problem", child_rel, relpath, *_symlink_problem(child, real_root))
        elif stat.S_ISDIR(st.st_mode):
            if st.st_dev != root_st.st_dev:
                yield Entry("problem", child_rel, relpath, "other-filesystem", "not walked")
            elif (st.st_dev, st.st_ino) in seen_dirs:
                yield Entry("problem", child_rel, relpath, "already-visited", "directory reached twice")
            elif depth + 1 > max_depth:
                yield Entry("problem", child_rel, relpath, "too-deep", f"deeper than max_depth={max_depth}")
            else:
                seen_dirs.add((st.st_dev, st.st_ino))
                yield Entry("dir", child_rel, relpath)
                listing = _list(child, child_rel)
                if isinstance(listing, Entry):
                    yield listing
                else:
                    stack.append((child, child_rel, depth + 1, listing))
        elif not name.lower().endswith(JSONL_SUFFIXES):
            yield Entry("other", child_rel, relpath)
        elif not stat.S_ISREG(st.st_mode):
            yield Entry("problem", child_rel, relpath, "not-regular", "not a regular file; unread")
        else:
            yield from _open_file(child, child_rel, relpath, seen_files)


def _list(path: Path, relpath: str) -> Iterator[str] | Entry:
    try:
        return iter(sorted(os.listdir(path)))
    except OSError as exc:
        return Entry("problem", relpath, relpath, "unreadable", os_reason(exc))


def _open_file(path: Path, relpath: str, parent: str, seen_files: set) -> Iterator[Entry]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # swapped for a link since the listing
            yield Entry("problem", relpath, parent, "symlink", "became a link during the walk; not followed")
        else:
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
               chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[int, bytes | bytearray | None, int, int]]:
    """Yield ``(line_no, line, num_bytes, ended)`` for every line of a binary stream.

    ``line`` excludes the newline and is None when ``num_bytes > max_line_bytes``: an oversize
    line's bytes are dropped as they stream past, so memory stays about
    ``max_line_bytes + chunk_bytes`` whatever the line length. A line that spans chunks is
    yielded as the bytearray it was gathered in (no second copy). ``ended`` is 1 when a newline
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
                buf += memoryview(chunk)[start:nl]
                yield line_no, buf, num_bytes, 1
                buf = bytearray()
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
        yield line_no + 1, None if oversize else buf, pending, 0


def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN/Infinity; JSON does not, and canonical forms would disagree.
    raise ValueError(f"non-JSON constant {name}")


def _structure(line: bytes | bytearray) -> tuple[int, int]:
    """``(num_values, depth)`` of a JSON line, counted outside string literals: an upper bound on
    the values it holds (one per ``[ { , :`` plus one) and its deepest bracket nesting.

    Explicit counters over the bytes, so the answer never depends on the caller's stack. When the
    line holds at most one quote per 32 bytes, the strings are cut out in one C pass (``re.sub``
    keeps one piece per gap between strings, a few dozen bytes each, so under the line's size); a
    line denser in strings is walked string by string, counting each gap in place. Either way the
    scan costs a small part of what parsing would.
    """
    if line.count(b'"') * 32 <= len(line):
        bare = _STRING.sub(b"", line)
        return _gap(bare, 0, len(bare), 1, 0, 0)[0::2]
    num_values, depth, deepest, pos = 1, 0, 0, 0
    for match in _STRING.finditer(line):
        num_values, depth, deepest = _gap(line, pos, match.start(), num_values, depth, deepest)
        pos = match.end()
    num_values, depth, deepest = _gap(line, pos, len(line), num_values, depth, deepest)
    return num_values, deepest


def _gap(line, start: int, end: int, num_values: int, depth: int, deepest: int) -> tuple[int, int, int]:
    if start >= end:
        return num_values, depth, deepest
    num_open = line.count(b"[", start, end) + line.count(b"{", start, end)
    num_values += num_open + line.count(b",", start, end) + line.count(b":", start, end)
    if num_open or line.count(b"]", start, end) or line.count(b"}", start, end):
        steps = memoryview(line[start:end].translate(_BRACKET_STEPS, _NOT_BRACKETS)).cast("b")
        deepest = max(deepest, max(accumulate(steps, initial=depth)))
        depth += sum(steps)
    return num_values, depth, deepest


def string_width(line: bytes | bytearray) -> int:
    """Bytes per character of the str that decoding ``line`` gives (CPython stores a str at 1, 2
    or 4 bytes a character, by its widest character), judged from UTF-8 lead bytes: 0xF0 and up
    start a character above U+FFFF, 0xC4 and up one above U+00FF."""
    if line.isascii():
        return 1
    wide = line.translate(None, _BELOW_C4)  # lead bytes of characters above U+00FF only
    if not wide:
        return 1
    return 4 if wide.translate(None, _BELOW_F0) else 2


def parse_cost(line: bytes | bytearray, num_values: int, width: int | None = None) -> int:
    """Upper bound on the bytes ``parse_line`` allocates for ``line`` with ``num_values`` values:
    the decoded text (freed before hashing), the parsed strings, ``VALUE_BYTES`` per value, and
    ``PARSE_COST_FIXED`` for the hashing slices."""
    return 2 * (width or string_width(line)) * len(line) + VALUE_BYTES * num_values + PARSE_COST_FIXED


def parse_budget(num_bytes: int) -> int:
    """What a line of ``num_bytes`` may cost to parse: ``PARSE_COST_MULTIPLE`` times its size plus
    ``PARSE_COST_SLACK``."""
    return PARSE_COST_MULTIPLE * num_bytes + PARSE_COST_SLACK


def parse_line(line: bytes | bytearray | None, num_bytes: int,
               max_json_depth: int = DEFAULT_MAX_JSON_DEPTH) -> tuple[str, Any, str]:
    """Classify one line: ``("blank", None, "")``, ``("record", (obj, sha256_digest), "")`` or
    ``(malformed_kind, None, detail)`` with ``malformed_kind`` in ``MALFORMED_KINDS``.

    Checked in this order, each from the bytes before anything is decoded: "oversize" (over the
    caller's line cap), "too_deep" (brackets nested deeper than ``max_json_depth``, outside
    strings), "too_dense" (``parse_cost`` over ``parse_budget``), then "invalid_utf8" and
    "invalid_json" (strict UTF-8; JSON without NaN or Infinity).

    The digest is over canonical JSON (sorted keys, compact separators, UTF-8), so records that
    differ only in key order or whitespace are exact duplicates. ``detail`` carries parser
    positions and counts only, never line content.
    """
    if line is None:
        return "oversize", None, f"{num_bytes} bytes"
    if not line or line.isspace():
        return "blank", None, ""
    tokens = line.translate(None, _NOT_TOKENS)  # every [ ] { } , : byte, strings included
    num_open = tokens.count(b"[") + tokens.count(b"{")
    num_values = len(tokens) - tokens.count(b"]") - tokens.count(b"}") + 1  # an upper bound
    del tokens
    budget = parse_budget(len(line))
    width = string_width(line)
    if num_open > max_json_depth or parse_cost(line, num_values, width) > budget:
        num_values, depth = _structure(line)  # exact: structure outside strings only
        if depth > max_json_depth:
            return "too_deep", None, f"nesting deeper than {max_json_depth} levels"
        if (cost := parse_cost(line, num_values, width)) > budget:
            return "too_dense", None, (f"{num_values} values in {len(line)} bytes: parsing would cost "
                                       f"about {cost / len(line):.0f}x its size (limit {PARSE_COST_MULTIPLE}x)")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "invalid_utf8", None, f"{exc.reason} at byte {exc.start}"
    try:
        obj = _with_stack_headroom(json.loads, text, parse_constant=_reject_constant)
        del text  # the parsed values and the canonical form are never held next to the text
        digest = _with_stack_headroom(canonical_digest, obj)
    except json.JSONDecodeError as exc:
        return "invalid_json", None, f"{exc.msg} at char {exc.pos}"
    except ValueError as exc:
        return "invalid_json", None, str(exc)
    return "record", (obj, digest), ""


def _with_stack_headroom(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, run again with the recursion limit raised if the caller's stack was
    too deep for it. The line's nesting is already known to be at most ``MAX_JSON_DEPTH_LIMIT``
    (``_structure``), so the interpreter's limit never decides how a line is counted: a notebook
    kernel 100 frames deep and a test 900 frames deep get the same answer."""
    try:
        return fn(*args, **kwargs)
    except RecursionError:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(limit + 4 * MAX_JSON_DEPTH_LIMIT)
        try:
            return fn(*args, **kwargs)
        finally:
            sys.setrecursionlimit(limit)


def canonical_digest(obj: Any) -> bytes:
    """SHA-256 of ``obj`` as canonical JSON: ``json.dumps(obj, sort_keys=True, separators=(",", ":"),
    ensure_ascii=False)`` encoded as UTF-8 with lone surrogates passed through (JSON may escape a
    lone surrogate, "\\ud800", which strict UTF-8 refuses).

    Small objects go through ``json.dumps``. Large ones are hashed piece by piece
    (``_canonical_pieces``), because ``json.dumps`` holds every piece and then their join, twice the
    canonical text next to the object; the two paths give the same bytes (a test holds them to it).
    """
    hasher = hashlib.sha256()
    if _small(obj):
        hasher.update(json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                      .encode("utf-8", "surrogatepass"))
        return hasher.digest()
    pending: list[str] = []
    num_pending = 0
    for piece in _canonical_pieces(obj):
        pending.append(piece)
        num_pending += len(piece)
        if num_pending >= HASH_CHARS:
            hasher.update("".join(pending).encode("utf-8", "surrogatepass"))
            pending, num_pending = [], 0
    hasher.update("".join(pending).encode("utf-8", "surrogatepass"))
    return hasher.digest()


def _small(obj: Any, budget: int = 256) -> bool:
    """True when ``obj`` is small enough for ``json.dumps``: few values, short strings."""
    stack = [obj]
    while stack:
        value = stack.pop()
        budget -= 1
        if budget < 0 or (isinstance(value, str) and len(value) > HASH_CHARS // 64):
            return False
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return True


_END = object()


def _string_pieces(text: str) -> Iterator[str]:
    """``json.dumps(text)`` (ensure_ascii=False) in pieces of at most about ``HASH_CHARS``
    characters: JSON escapes each character on its own, so escaping slices and joining them
    equals escaping the whole, and no copy of a long string is ever made."""
    if len(text) <= HASH_CHARS:
        yield _encode_str(text)
        return
    yield '"'
    for start in range(0, len(text), HASH_CHARS):
        yield _encode_str(text[start:start + HASH_CHARS])[1:-1]
    yield '"'


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


def _canonical_pieces(obj: Any) -> Iterator[str]:
    """The canonical JSON of ``obj`` in pieces, walked with an explicit stack (no recursion)."""
    stack: list[list] = []  # [closing bracket, iterator, is first, is dict]
    value = obj
    while True:
        if isinstance(value, dict):
            yield "{"
            stack.append(["}", iter(sorted(value.items(), key=lambda kv: kv[0])), True, True])
        elif isinstance(value, list):
            yield "["
            stack.append(["]", iter(value), True, False])
        elif isinstance(value, str):
            yield from _string_pieces(value)
        else:
            yield _scalar(value)
        while stack:
            top = stack[-1]
            item = next(top[1], _END)
            if item is _END:
                stack.pop()
                yield top[0]
                continue
            if not top[2]:
                yield ","
            top[2] = False
            if top[3]:
                yield from _string_pieces(item[0])
                yield ":"
                value = item[1]
            else:
                value = item
            break
        else:
            return


def hash_tree(root: Path, max_depth: int) -> dict[str, str]:
    """``{relpath: sha256}`` of every JSONL file ``walk_tree`` reads, without parsing a line
    (relpaths as the walk gives them; ``traces.audit`` records them in their safe form)."""
    hashes = {}
    for entry in walk_tree(root, max_depth):
        if entry.kind == "file":
            hasher = hashlib.sha256()
            try:
                while chunk := entry.fh.read(CHUNK_BYTES):
                    hasher.update(chunk)
            except OSError:
                continue
            hashes[entry.relpath] = hasher.hexdigest()
    return hashes
