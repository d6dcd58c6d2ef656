"""Trace audit: exact counts on small corpora, hostile inputs, and the real corpus if present."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import tracemalloc
from pathlib import Path

import pytest

from kmesh_lib.traces import audit as trace_audit
from kmesh_lib.traces.audit import audit_tree
from kmesh_lib.traces.scan import iter_lines, parse_line
from kmesh_lib.traces.units import unit_of_number

REAL_CORPUS = Path("/work/shared/data/lmcache-agent-trace")
CANARY = "CANARY-PROMPT-TEXT-7f3a"  # must never reach the public audit


def _line(obj) -> str:
    return json.dumps(obj) + "\n"


@pytest.fixture(autouse=True)
def no_hang():
    """A FIFO or a runaway line must fail the test, not hang the suite."""
    def _timeout(signum, frame):
        raise TimeoutError("audit hung")
    old = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """Two sources, a root file, an empty file, a malformed line, a cross-file duplicate, a blank
    line, an unterminated last line and a directory without JSONL."""
    root = tmp_path / "corpus"
    (root / "alpha").mkdir(parents=True)
    (root / "beta" / "sub").mkdir(parents=True)
    (root / "gamma").mkdir()
    rec1 = {"id": 1, "timestamp": 1_700_000_000_123, "model": "m", "input": CANARY}
    rec2 = {"id": 2, "timestamp": 1_700_000_001_000, "model": None, "input": "b"}
    (root / "alpha" / "one.jsonl").write_text(
        _line(rec1) + _line(rec2) + "\n" + f"{{not json {CANARY}\n")
    (root / "alpha" / "empty.jsonl").write_bytes(b"")
    # rec1 again with other key order and spacing: an exact duplicate under canonical JSON
    (root / "beta" / "two.jsonl").write_text(
        '{"input": "%s",  "model": "m", "timestamp": 1700000000123, "id": 1}\n' % CANARY  # noqa: UP031 (the spacing is the test)
        + _line({"id": 3, "created_at": "2025-01-01T00:00:00Z", "ts_us": 1_700_000_000_000_000})
        + _line({"id": 4, "created_at": "2025-01-01T00:00:01Z"}).rstrip("\n"))
    (root / "beta" / "sub" / "three.ndjson").write_text(_line({"id": 5}) * 3)
    (root / "gamma" / "notes.txt").write_text("not a trace")
    (root / "top.jsonl").write_text(_line({"id": 6, "timestamp": 1_700_000_000.25}))
    return root


def test_counts_every_category_exactly(corpus: Path):
    audit = audit_tree(corpus)
    assert audit.check_invariants() == []
    assert audit.num_files == 5
    assert audit.num_empty_files == 1
    assert audit.num_lines == 4 + 3 + 3 + 1
    assert audit.num_blank_lines == 1
    assert audit.num_records == 2 + 3 + 3 + 1
    assert audit.num_malformed_lines == 1
    assert audit.malformed == {"invalid_json": 1, "invalid_utf8": 0, "oversize": 0, "too_deep": 0}
    assert audit.files_with_malformed == ["alpha/one.jsonl"]
    # rec1 in alpha and beta (one copy), {"id": 5} three times (two copies)
    assert audit.num_duplicate_copies == 3
    assert audit.num_duplicate_groups == 2
    assert audit.num_unique_records == 9 - 3
    assert sorted(g["num_copies"] for g in audit.duplicate_groups) == [2, 3]
    assert audit.sources == [".", "alpha", "beta"]
    rows = {f.relpath: f for f in audit.files}
    assert rows["beta/two.jsonl"].num_duplicate_copies == 1
    assert rows["beta/two.jsonl"].ends_with_newline is False
    assert rows["beta/sub/three.ndjson"].source == "beta"
    assert audit.problems == []


def test_directory_rows_include_dirs_without_jsonl(corpus: Path):
    audit = audit_tree(corpus)
    dirs = {d.relpath: d for d in audit.dirs}
    assert list(dirs) == [".", "alpha", "beta", "beta/sub", "gamma"]
    assert audit.dirs_without_jsonl == ["gamma"]
    assert (dirs["."].num_jsonl_files, dirs["."].num_subdirs) == (1, 3)
    assert (dirs["alpha"].num_jsonl_files, dirs["alpha"].num_records) == (2, 2)
    assert dirs["alpha"].num_malformed_lines == 1
    assert (dirs["beta"].num_subdirs, dirs["beta"].num_records) == (1, 3)
    assert dirs["gamma"].num_other_files == 1


def test_coverage_shares_per_source(corpus: Path):
    audit = audit_tree(corpus)
    cov = {(r["source"], r["field"]): r for r in audit.coverage_rows()}
    assert cov[("alpha", "model")]["share"] == 1.0
    assert cov[("alpha", "model")]["share_non_null"] == 0.5
    assert cov[("beta", "id")]["share"] == 1.0
    assert cov[("beta", "created_at")]["share"] == pytest.approx(2 / 6)
    assert cov[("beta", "ts_us")]["num_records"] == 1
    assert cov[("beta", "model")]["share"] == pytest.approx(1 / 6)
    assert {r["field"] for r in audit.coverage_rows() if r["source"] == "."} == {"id", "timestamp"}


def test_timestamp_units_per_source(corpus: Path):
    units = audit_tree(corpus).timestamp_units
    assert units["alpha"]["unit"] == "ms"
    assert units["alpha"]["fields"]["timestamp"]["resolution_s"] == pytest.approx(1e-3)
    assert units["."]["unit"] == "s"
    assert units["."]["fields"]["timestamp"]["resolution_s"] == pytest.approx(0.01)
    assert units["beta"]["unit"] == "mixed"
    assert units["beta"]["fields"]["created_at"]["unit"] == "iso8601"
    assert units["beta"]["fields"]["ts_us"]["unit"] == "us"
    assert units["beta"]["fields"]["ts_us"]["declared_unit"] == "us"
    assert units["beta"]["fields"]["timestamp"]["unit"] == "ms"  # the duplicate of rec1


@pytest.mark.parametrize("value,unit", [(1.7e9, "s"), (1_700_000_000_000, "ms"),
                                        (1_700_000_000_000_000, "us"),
                                        (1_700_000_000_000_000_000, "ns"), (12.5, "not-epoch")])
def test_unit_of_number(value, unit):
    assert unit_of_number(value) == unit


def test_hashes_match_hashlib(corpus: Path):
    audit = audit_tree(corpus)
    lines = []
    for path in sorted(p for p in corpus.rglob("*") if p.suffix in (".jsonl", ".ndjson")):
        rel = path.relative_to(corpus).as_posix()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert audit.file_hashes[rel] == digest
        lines.append(f"{rel}\0{digest}\n")
    assert audit.set_sha256 == hashlib.sha256("".join(sorted(lines)).encode()).hexdigest()
    assert audit.file_hashes["alpha/empty.jsonl"] == hashlib.sha256(b"").hexdigest()
    assert sum(f.size_bytes for f in audit.files) == sum(
        p.stat().st_size for p in corpus.rglob("*") if p.suffix in (".jsonl", ".ndjson"))


def test_public_audit_has_counts_not_text(corpus: Path):
    public = audit_tree(corpus).to_public()
    text = json.dumps(public)
    assert CANARY not in text
    assert public["summary"]["num_records"] == 9
    assert public["set_sha256"] and len([f for f in public["files"] if f["sha256"]]) == 5
    assert ("alpha", "input") in {(r["source"], r["field"]) for r in public["coverage"]}


def test_public_audit_passes_the_publish_screen(tmp_path: Path):
    from kmesh_lib.app.publish import find_private_keys
    root = tmp_path / "answers"
    (root / "answer_text").mkdir(parents=True)
    (root / "answer_text" / "prompt_text.jsonl").write_text(
        _line({"answer_time": 1_700_000_000, "output_text": "x", "prompt_token_ids": [1]}))
    public = audit_tree(root).to_public()
    assert find_private_keys(public) == []
    assert public["timestamp_units"]["fields"][0]["field"] == "answer_time"


def test_frames(corpus: Path):
    pytest.importorskip("pandas")
    audit = audit_tree(corpus)
    assert len(audit.files_frame()) == 5
    assert len(audit.dirs_frame()) == 5
    assert set(audit.coverage_frame()["source"]) == {".", "alpha", "beta"}
    assert list(audit.sources_frame()["source"]) == [".", "alpha", "beta"]
    assert len(audit.timestamp_frame()) == 5


# -- line-level primitives -----------------------------------------------------------------------

def test_iter_lines_chunk_boundaries_and_byte_accounting():
    import io
    data = b'{"a":1}\n\n' + b"x" * 50 + b"\n" + b'{"b":2}'
    for chunk in (1, 3, 7, 64):
        hasher = hashlib.sha256()
        got = list(iter_lines(io.BytesIO(data), hasher, max_line_bytes=20, chunk_bytes=chunk))
        assert [(n, line, size, ended) for n, line, size, ended in got] == [
            (1, b'{"a":1}', 7, 1), (2, b"", 0, 1), (3, None, 50, 1), (4, b'{"b":2}', 7, 0)]
        assert sum(size + ended for _, _, size, ended in got) == len(data)
        assert hasher.digest() == hashlib.sha256(data).digest()


@pytest.mark.parametrize("line,kind", [
    (b"  \r", "blank"), (b'{"a": 1}\r', "record"), (b"[1, 2]", "record"), (b"NaN", "invalid_json"),
    (b'{"a": Infinity}', "invalid_json"), (b"\x00\x01\x02", "invalid_json"),
    (b'{"a": "\xff"}', "invalid_utf8"), (b'"\\ud800"', "record"), (b"[" * 5000, "too_deep")])
def test_parse_line_kinds(line, kind):
    assert parse_line(line, len(line))[0] == kind


# -- hostile input -------------------------------------------------------------------------------

def _write_big_line(path: Path, num_bytes: int) -> None:
    """A valid JSON object of ``num_bytes`` on one line, written in 1 MiB pieces."""
    piece = b"a" * (1 << 20)
    with open(path, "wb") as fh:
        fh.write(b'{"x": "')
        written = 7
        while written < num_bytes - 3:
            n = min(len(piece), num_bytes - 3 - written)
            fh.write(piece[:n])
            written += n
        fh.write(b'"}\n')
        fh.write(b'{"after": 1}\n')


def test_50mb_line_is_oversize_and_memory_stays_bounded(tmp_path: Path):
    root = tmp_path / "big"
    root.mkdir()
    _write_big_line(root / "big.jsonl", 50 << 20)
    tracemalloc.start()
    try:
        audit = audit_tree(root, max_line_bytes=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert audit.malformed["oversize"] == 1
    assert audit.num_records == 1
    assert audit.malformed_lines[0].num_bytes == (50 << 20) - 1
    assert audit.files[0].size_bytes == (50 << 20) + len(b'{"after": 1}\n')
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB: the audit held the line"


def test_50mb_line_default_cap(tmp_path: Path):
    root = tmp_path / "big"
    root.mkdir()
    _write_big_line(root / "big.jsonl", 50 << 20)
    tracemalloc.start()
    try:
        audit = audit_tree(root)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (audit.malformed["oversize"], audit.num_records) == (1, 1)
    assert peak < 24 << 20  # cap (8 MiB) + one read chunk + slack, far below the 50 MB line


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    root = tmp_path / "hostile"
    src = root / "src"
    src.mkdir(parents=True)
    (src / "garbage.jsonl").write_bytes(
        b"\xff\xfe\x00\x81garbage\n"        # invalid UTF-8
        b"\x00\x01\x02\x03\n"               # valid UTF-8, not JSON
        + bytes(range(11, 256)) + b"\n"     # every byte value but the newline: invalid UTF-8
        + b'{"ok": true}\n')
    (src / "badutf8.jsonl").write_bytes(b'{"a": "caf\xe9"}\n{"a": "caf\xc3\xa9"}\n')
    (src / "deep.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n"
                                    + '{"a":' * 100_000 + "1" + "}" * 100_000 + "\n")
    (src / "scalars.jsonl").write_text("[1, 2]\n3\nNaN\n")
    os.symlink("self.jsonl", src / "self.jsonl")      # a link to itself: ELOOP
    os.symlink("self_dir", src / "self_dir")
    os.symlink("..", src / "up")                      # a directory cycle
    os.symlink("missing.jsonl", src / "dangling.jsonl")
    os.symlink("garbage.jsonl", src / "zz_alias.jsonl")  # the same file twice
    os.mkfifo(src / "pipe.jsonl")                     # opening it for reading would block
    (src / "secret.jsonl").write_text('{"s": 1}\n')
    return root


def test_hostile_inputs_are_counted_never_raised(hostile: Path, monkeypatch):
    real_open = os.open

    def guarded_open(path, flags, *args, **kwargs):
        if str(path).endswith("secret.jsonl"):  # tests run as root: chmod 000 would not block
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", guarded_open)
    audit = audit_tree(hostile)
    assert audit.check_invariants() == []
    assert audit.malformed == {"invalid_json": 2, "invalid_utf8": 3, "oversize": 0, "too_deep": 2}
    # garbage: 1 ok; badutf8: 1 (the UTF-8 spelling); scalars: [1, 2] and 3; up/ is a cycle
    assert audit.num_records == 4
    assert audit.num_non_object_records == 2
    problems = sorted((p.kind, p.relpath) for p in audit.problems)
    assert problems == [
        ("already-visited", "src/up"), ("already-visited", "src/zz_alias.jsonl"),
        ("dangling-symlink", "src/dangling.jsonl"), ("not-regular", "src/pipe.jsonl"),
        ("symlink-loop", "src/self.jsonl"), ("symlink-loop", "src/self_dir"),
        ("unreadable", "src/secret.jsonl")]
    assert audit.num_unreadable_files == 1
    secret = next(f for f in audit.files if f.relpath == "src/secret.jsonl")
    assert (secret.status, secret.sha256) == ("unreadable", None)
    assert "src/secret.jsonl" not in audit.file_hashes
    assert {d.relpath: d.num_problems for d in audit.dirs}["src"] == 7
    assert json.dumps(audit.to_public())  # the public form survives hostile input too


def test_read_error_mid_file_marks_the_file_partial(corpus: Path, monkeypatch):
    real = trace_audit.iter_lines

    def failing(fh, hasher, max_line_bytes):
        for i, item in enumerate(real(fh, hasher, max_line_bytes)):
            if i == 1:
                raise OSError(errno.EIO, "Input/output error")
            yield item

    monkeypatch.setattr(trace_audit, "iter_lines", failing)
    audit = audit_tree(corpus)
    partial = [f for f in audit.files if f.status == "read-error"]
    assert len(partial) == 3  # every file with at least two lines
    assert all(f.sha256 is None and f.num_lines == 1 for f in partial)
    assert [p.kind for p in audit.problems] == ["read-error"] * 3
    assert audit.check_invariants() == []


def test_max_depth_and_missing_root(tmp_path: Path):
    deep = tmp_path / "r" / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "x.jsonl").write_text("{}\n")
    audit = audit_tree(tmp_path / "r", max_depth=2)
    assert [(p.kind, p.relpath) for p in audit.problems] == [("too-deep", "a/b/c")]
    assert audit.num_files == 0
    with pytest.raises(FileNotFoundError):
        audit_tree(tmp_path / "nope")


# -- the real corpus -----------------------------------------------------------------------------

# Counts of the corpus as pinned by this set hash (the published section-17 run).
REAL_SET_SHA256 = "b333a698aa0bcd615550cb6dff9ac8e2fbddef389cb37a6e5da379e80625901b"


@pytest.mark.skipif(not REAL_CORPUS.is_dir(), reason="lmcache-agent-trace corpus not present")
def test_real_corpus_invariants():
    audit = audit_tree(REAL_CORPUS)
    assert audit.check_invariants() == []
    assert audit.problems == []
    assert audit.num_unique_records + audit.num_duplicate_copies == audit.num_records
    assert audit.num_lines == audit.num_records + audit.num_malformed_lines + audit.num_blank_lines
    assert audit.num_bytes == sum(p.stat().st_size for p in REAL_CORPUS.rglob("*.jsonl"))
    assert set(audit.sources) <= {p.name for p in REAL_CORPUS.iterdir()}
    first = audit.files[0]
    assert first.sha256 == hashlib.sha256((REAL_CORPUS / first.relpath).read_bytes()).hexdigest()
    assert audit.lineage is not None and audit.lineage.qualifies is False
    from kmesh_lib.app.publish import find_private_keys
    assert find_private_keys(audit.to_public()) == []
    if audit.set_sha256 == REAL_SET_SHA256:
        assert (audit.num_files, audit.num_empty_files, audit.num_records) == (78, 1, 1917)
        assert (audit.num_malformed_lines, audit.files_with_malformed) == (
            20, ["memgpt/memgpt1.jsonl"])
        assert (audit.num_duplicate_copies, audit.num_unique_records) == (2, 1915)
        assert len(audit.sources) == 8


def test_hostile_names_and_keys_stay_bounded(tmp_path: Path):
    root = tmp_path / "names"
    root.mkdir()
    # a file name that is not UTF-8, records with thousands of distinct and enormous keys
    bad_name = os.fsencode(root) + b"/caf\xe9.jsonl"
    with open(bad_name, "wb") as fh:
        fh.write(b'{"a": 1}\n' * 30)
    keys = {"x" * 10_000: 1} | {f"k{i}": i for i in range(5000)}
    (root / "keys.jsonl").write_text(json.dumps(keys) + "\n")
    audit = audit_tree(root)
    assert audit.num_records == 31 and audit.num_duplicate_copies == 29
    group = audit.duplicate_groups[0]
    assert group["num_copies"] == 30 and len(group["locations"]) == trace_audit.MAX_DUPLICATE_LOCATIONS
    fields = audit.coverage["."]
    assert len(fields) == trace_audit.MAX_FIELDS_PER_SOURCE + 1
    assert fields[trace_audit.OTHER_FIELDS]["present"] == 5001 + 1 - trace_audit.MAX_FIELDS_PER_SOURCE
    assert max(len(name) for name in fields) == trace_audit.MAX_FIELD_NAME_CHARS + 1  # + "…"
    assert len(audit.set_sha256) == 64 and json.dumps(audit.to_public())
    assert audit.check_invariants() == []
