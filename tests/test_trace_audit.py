"""Trace audit: exact counts on small corpora, hostile inputs, bounded memory and names, and the
real corpus when the data root holds it (skipped with the reason otherwise)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import tracemalloc
from pathlib import Path

import pytest

from kmesh_lib.base.data import DATA_SETS, missing_reason
from kmesh_lib.traces import audit as trace_audit
from kmesh_lib.traces import scan
from kmesh_lib.traces.audit import audit_tree
from kmesh_lib.traces.names import OTHER_FIELDS, is_safe, safe_name
from kmesh_lib.traces.scan import iter_lines, parse_line
from kmesh_lib.traces.units import unit_of_number

CORPUS = "lmcache-agent-trace"
CANARY = "CANARY-PROMPT-TEXT-7f3a"  # must never reach an audit row


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
    assert audit.invariant_failures() == []
    s = audit.summary()
    assert audit.num_files == 5
    assert audit.num_empty_files == 1
    assert s["num_lines"] == 4 + 3 + 3 + 1
    assert s["num_blank_lines"] == 1
    assert audit.num_records == 2 + 3 + 3 + 1
    assert audit.num_malformed_lines == 1
    assert audit.malformed == {"invalid_json": 1, "invalid_utf8": 0, "oversize": 0, "too_deep": 0, "too_dense": 0}
    assert audit.files_with_malformed == ["alpha/one.jsonl"]
    # rec1 in alpha and beta (one copy), {"id": 5} three times (two copies)
    assert audit.num_duplicate_copies == 3
    assert s["num_duplicate_groups"] == 2
    assert audit.num_unique_records == 9 - 3
    assert sorted(g["num_copies"] for g in audit.duplicate_groups) == [2, 3]
    assert audit.summary()["num_duplicate_groups"] == 2
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


def test_rows_hold_counts_not_text(corpus: Path):
    rows = audit_tree(corpus).rows()
    assert CANARY not in json.dumps(rows)
    assert ("alpha", "input") in {(r["source"], r["field"]) for r in audit_tree(corpus).coverage_rows()}


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
        assert [(n, None if line is None else bytes(line), size, ended) for n, line, size, ended in got] == [
            (1, b'{"a":1}', 7, 1), (2, b"", 0, 1), (3, None, 50, 1), (4, b'{"b":2}', 7, 0)]
        assert sum(size + ended for _, _, size, ended in got) == len(data)
        assert hasher.digest() == hashlib.sha256(data).digest()


@pytest.mark.parametrize("line,kind", [
    (b"  \r", "blank"), (b'{"a": 1}\r', "record"), (b"[1, 2]", "record"), (b"NaN", "invalid_json"),
    (b'{"a": Infinity}', "invalid_json"), (b"\x00\x01\x02", "invalid_json"),
    (b'{"a": "\xff"}', "invalid_utf8"), (b'"\\ud800"', "record"), (b"[" * 5000, "too_deep"),
    (b"[" * 64 + b"]" * 64, "record"), (b"[" * 65 + b"]" * 65, "too_deep"),
    (b'["' + b"[" * 500 + b'"]', "record"),  # brackets inside a string are text, not nesting
    (b"[" + b",".join([b"{}"] * 400_000) + b"]", "too_dense"), (bytearray(b'{"a": 1}'), "record")])
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
    assert audit.invariant_failures() == []
    assert audit.malformed == {"invalid_json": 2, "invalid_utf8": 3, "oversize": 0, "too_deep": 2, "too_dense": 0}
    # garbage: 1 ok; badutf8: 1 (the UTF-8 spelling); scalars: [1, 2] and 3; up/ is a cycle
    assert audit.num_records == 4
    assert audit.summary()["num_non_object_records"] == 2
    problems = sorted((p.kind, p.relpath) for p in audit.problems)
    assert problems == [  # no link is followed: "up" and "zz_alias" point inside the root
        ("dangling-symlink", "src/dangling.jsonl"), ("not-regular", "src/pipe.jsonl"),
        ("symlink", "src/up"), ("symlink", "src/zz_alias.jsonl"),
        ("symlink-loop", "src/self.jsonl"), ("symlink-loop", "src/self_dir"),
        ("unreadable", "src/secret.jsonl")]
    assert audit.num_files == 5  # garbage, badutf8, deep, scalars, secret: each once
    assert audit.summary()["num_unreadable_files"] == 1
    secret = next(f for f in audit.files if f.relpath == "src/secret.jsonl")
    assert (secret.status, secret.sha256) == ("unreadable", None)
    assert "src/secret.jsonl" not in audit.file_hashes
    assert {d.relpath: d.num_problems for d in audit.dirs}["src"] == 7
    assert json.dumps(audit.rows())  # the rows survive hostile input too


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
    assert audit.invariant_failures() == []


def test_max_depth_and_missing_root(tmp_path: Path):
    deep = tmp_path / "r" / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "x.jsonl").write_text("{}\n")
    audit = audit_tree(tmp_path / "r", max_depth=2)
    assert [(p.kind, p.relpath) for p in audit.problems] == [("too-deep", "a/b/c")]
    assert audit.num_files == 0
    with pytest.raises(FileNotFoundError):
        audit_tree(tmp_path / "nope")


# -- staying inside the root ---------------------------------------------------------------------

def test_a_link_to_the_filesystem_root_is_reported_not_walked(tmp_path: Path):
    root = tmp_path / "r"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.jsonl").write_text(_line({"id": 1}))
    os.symlink("/", root / "rootlink")
    os.symlink("/etc/hostname", root / "src" / "outside.jsonl")
    audit = audit_tree(root)
    assert [(p.kind, p.relpath) for p in audit.problems] == [
        ("symlink-outside-root", "rootlink"), ("symlink-outside-root", "src/outside.jsonl")]
    assert [d.relpath for d in audit.dirs] == [".", "src"]
    assert audit.num_files == 1 and audit.num_records == 1


def test_a_loop_and_a_hard_link_count_once(tmp_path: Path):
    root = tmp_path / "r"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "t.jsonl").write_text(_line({"id": 1}) * 3)
    os.symlink("../..", root / "a" / "b" / "loop")  # a -> b -> loop -> root -> a ...
    os.link(root / "a" / "b" / "t.jsonl", root / "a" / "hard.jsonl")
    audit = audit_tree(root)
    assert sorted((p.kind, p.relpath) for p in audit.problems) == [
        ("already-visited", "a/hard.jsonl"), ("symlink", "a/b/loop")]
    assert (audit.num_files, audit.num_records, len(audit.dirs)) == (1, 3, 3)


def test_directory_depth_is_an_explicit_counter(tmp_path: Path):
    """1,200 nested directories: deeper than the interpreter's recursion limit, walked anyway."""
    root = tmp_path / "r"
    chain = [root]
    for _ in range(1200):  # one level at a time: pathlib's mkdir(parents=True) recurses
        chain.append(chain[-1] / "d")
    try:
        for path in chain:
            path.mkdir()
        (chain[-1] / "x.jsonl").write_text(_line({"id": 1}))
        assert audit_tree(root, max_depth=1200).num_records == 1
        audit = audit_tree(root, max_depth=1199)
        assert audit.num_records == 0 and [p.kind for p in audit.problems] == ["too-deep"]
    finally:  # bottom-up: pytest's own cleanup (shutil.rmtree) recurses and would fail here
        (chain[-1] / "x.jsonl").unlink(missing_ok=True)
        for path in reversed(chain):
            if path.is_dir():
                path.rmdir()


def test_json_depth_does_not_depend_on_the_callers_stack():
    """The notebook and the library ran the same line at different stack depths and disagreed;
    the cutoff is now an explicit counter, so any caller gets the same answer."""
    lines = [b"[" * n + b"]" * n for n in (10, 64, 65, 300, 990, 5000)]
    top = [parse_line(line, len(line))[0] for line in lines]

    def nested(depth: int):
        return nested(depth - 1) if depth else [parse_line(line, len(line))[0] for line in lines]

    assert top == ["record", "record", "too_deep", "too_deep", "too_deep", "too_deep"]
    assert nested(900) == top  # 900 frames deep: within a hair of the recursion limit


# -- bounded memory and names ------------------------------------------------------------------

def _measured_peak(line: bytes) -> tuple[str, int]:
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        kind = parse_line(line, len(line))[0]
        return kind, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


_N = 1 << 19
DENSE_SHAPES = {
    "dicts": b"[" + b",".join([b"{}"] * (_N // 3)) + b"]",
    "lists": b"[" + b",".join([b"[]"] * (_N // 3)) + b"]",
    "ints": b"[" + b",".join([b"1234"] * (_N // 5)) + b"]",
    "floats": b"[" + b",".join([b"1e5"] * (_N // 4)) + b"]",
    "keys": json.dumps({f"k{j:07d}_at": j for j in range(_N // 20)}, separators=(",", ":")).encode(),
    "nested": json.dumps([{"a": [{}]} for _ in range(_N // 14)], separators=(",", ":")).encode(),
    "wide strings": ("[" + ",".join(f'"é{j}"' for j in range(_N // 9)) + "]").encode(),
    "astral strings": ("[" + ",".join(f'"😀{j}"' for j in range(_N // 12)) + "]").encode(),
}
TEXT_SHAPES = {
    "ascii text": json.dumps({"input": "lorem ipsum, dolor " * (_N // 19), "output": "x"}).encode(),
    "text with one astral char": json.dumps({"input": "lorem, ipsum " * (_N // 13) + "😀"}, ensure_ascii=False).encode(),
    "cjk text": json.dumps({"input": "漢字かな" * (_N // 12)}, ensure_ascii=False).encode(),
}


@pytest.mark.parametrize("name", list(DENSE_SHAPES) + list(TEXT_SHAPES))
def test_parse_cost_estimate_bounds_the_measured_cost(name: str, monkeypatch):
    """Every shape parsed with the cap lifted: the estimate is above what parsing allocates."""
    line = {**DENSE_SHAPES, **TEXT_SHAPES}[name]
    monkeypatch.setattr(scan, "PARSE_COST_MULTIPLE", 10**6)
    kind, peak = _measured_peak(line)
    num_values, _ = scan._structure(line)
    assert kind == "record"
    assert peak <= scan.parse_cost(line, num_values), f"{peak / len(line):.1f}x measured"


@pytest.mark.parametrize("name", list(DENSE_SHAPES) + list(TEXT_SHAPES))
def test_a_parsed_line_costs_at_most_the_documented_multiple(name: str):
    """Within 16x its size + 2 MiB, or left unparsed as too_dense at a small cost."""
    line = {**DENSE_SHAPES, **TEXT_SHAPES}[name]
    kind, peak = _measured_peak(line)
    expected = {"dicts": "too_dense", "lists": "too_dense", "ints": "too_dense", "nested": "too_dense",
                "keys": "record"} | dict.fromkeys(TEXT_SHAPES, "record")
    assert kind == expected.get(name, kind)
    assert peak <= scan.parse_budget(len(line)), f"{peak / len(line):.1f}x measured"
    if kind == "too_dense":
        assert peak <= 2 * len(line) + (1 << 16)  # judged from the bytes: a copy of one gap at most


def test_canonical_digest_is_json_dumps_hashed(monkeypatch):
    monkeypatch.setattr(scan, "HASH_CHARS", 8)  # slices everywhere
    rng = __import__("random").Random(1)

    def value(depth=0):
        r = rng.random()
        if depth > 3 or r < 0.35:
            return rng.choice([None, True, False, 0, -7, 2**70, 1.5, 1e300, -0.0, "", "x\"\\\n" * 40,
                               "é\ud800😀\x01" * 9])
        if r < 0.7:
            return [value(depth + 1) for _ in range(rng.randint(0, 5))]
        return {rng.choice(["b", "a", "é", "😀", "k\n" * 30]) + str(i): value(depth + 1) for i in range(rng.randint(0, 5))}

    for _ in range(500):
        obj = value()
        want = hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                              .encode("utf-8", "surrogatepass")).digest()
        assert scan.canonical_digest(obj) == want


def test_distinct_keys_are_capped_and_shares_stay_in_0_1(tmp_path: Path):
    """22 records of 2,000 fresh keys each (the shape that once gave a share of 45,268.5)."""
    root = tmp_path / "k"
    root.mkdir()
    with open(root / "keys.jsonl", "w") as f:
        for r in range(22):
            f.write(json.dumps({f"k{r * 2000 + j}_at": 1_700_000_000 for j in range(2000)}) + "\n")
    audit = audit_tree(root, max_fields_per_source=100)
    fields = audit.source_fields["."]
    assert len(fields.fields) == 100
    assert fields.num_records_with_untracked_fields == 22 and fields.num_untracked_keys == 22 * 2000 - 100
    shares = [r["share"] for r in audit.coverage_rows()]
    assert max(shares) == 1.0 and min(shares) > 0 and all(0 <= s <= 1 for s in shares)
    assert [r for r in audit.coverage_rows() if r["field"] == OTHER_FIELDS][0]["share"] == 1.0
    assert len(audit.timestamp_units["."]["fields"]) == 64  # time-like names: capped too
    assert audit.timestamp_units["."]["num_untracked_values"] == 100 - 64  # only tracked fields are timed
    assert len(json.dumps(audit.rows())) < 50_000
    assert audit.invariant_failures() == []


def test_names_from_the_corpus_are_kept_short_and_safe(tmp_path: Path):
    secret = "sk-live-" + "9" * 40
    root = tmp_path / "n"
    (root / f"dir {secret}").mkdir(parents=True)
    long_key = "x" * 430 + secret + "y" * 430  # 900 characters
    records = [{long_key: 1, "session_id": "s", "ok_field": 2, "a key with spaces": 3,
                "meta": {"parent_id": 1, secret + "_id": 2}, "id": 1}]
    (root / f"dir {secret}" / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with open(os.fsencode(root) + b"/caf\xe9.jsonl", "wb") as fh:  # a file name that is not UTF-8
        fh.write(b'{"a": 1}\n')
    audit = audit_tree(root)
    text = json.dumps(audit.rows())
    assert secret not in text and "x" * 41 not in text
    names = [r["field"] for r in audit.coverage_rows()] + [f.relpath for f in audit.files]
    assert all(is_safe(part, 64) for name in names for part in name.split("/"))
    assert safe_name(long_key) in names and "ok_field" in names and safe_name("a key with spaces") in names
    assert {f.relpath for f in audit.files} == {safe_name(f"dir {secret}", 64) + "/t.jsonl",
                                                safe_name("caf\udce9.jsonl", 64)}
    assert safe_name("caf\udce9.jsonl", 64).endswith(".jsonl")
    assert audit.invariant_failures() == []


def test_hostile_names_and_keys_stay_bounded(tmp_path: Path):
    root = tmp_path / "names"
    root.mkdir()
    with open(root / "dups.jsonl", "wb") as fh:
        fh.write(b'{"a": 1}\n' * 30)
    keys = {"x" * 10_000: 1} | {f"k{i}": i for i in range(5000)}
    (root / "keys.jsonl").write_text(json.dumps(keys) + "\n")
    audit = audit_tree(root)
    assert audit.num_records == 31 and audit.num_duplicate_copies == 29
    group = audit.duplicate_groups[0]
    assert group["num_copies"] == 30 and len(group["locations"]) == trace_audit.MAX_DUPLICATE_LOCATIONS
    fields = audit.source_fields["."]
    assert len(fields.fields) == trace_audit.MAX_FIELDS_PER_SOURCE
    assert fields.num_untracked_keys == 5002 - trace_audit.MAX_FIELDS_PER_SOURCE
    assert max(len(name) for name in fields.fields) <= 40
    assert len(audit.set_sha256) == 64 and json.dumps(audit.rows())
    assert audit.invariant_failures() == []


# -- the real corpus ---------------------------------------------------------------------------

# Counts of the corpus as pinned by data/lmcache-agent-trace.sha256 (this set hash).
REAL_SET_SHA256 = "b333a698aa0bcd615550cb6dff9ac8e2fbddef389cb37a6e5da379e80625901b"


@pytest.mark.requires_data(CORPUS)
def test_real_corpus_invariants():
    corpus = DATA_SETS[CORPUS].path()
    audit = audit_tree(corpus)
    assert audit.invariant_failures() == []
    assert audit.problems == []
    assert audit.num_bytes == sum(p.stat().st_size for p in corpus.rglob("*.jsonl"))
    assert set(audit.sources) <= {p.name for p in corpus.iterdir()}
    assert audit.file_hashes == DATA_SETS[CORPUS].manifest()
    assert audit.lineage is not None and audit.lineage.qualifies is False
    assert audit.set_sha256 == REAL_SET_SHA256
    s = audit.summary()
    assert (s["num_files"], s["num_empty_files"], s["num_records"]) == (78, 1, 1917)
    assert (s["num_malformed_lines"], audit.files_with_malformed) == (20, ["memgpt/memgpt1.jsonl"])
    assert (s["num_duplicate_copies"], s["num_unique_records"], s["num_duplicate_groups"]) == (2, 1915, 2)
    assert s["malformed"] == {"invalid_json": 20, "invalid_utf8": 0, "oversize": 0, "too_deep": 0, "too_dense": 0}
    assert len(audit.sources) == 8


def test_real_corpus_skip_reason_names_the_data_root(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("KMESH_DATA_ROOT", str(tmp_path))
    reason = missing_reason(CORPUS)
    assert reason and str(tmp_path) in reason and "kmesh data fetch" in reason
