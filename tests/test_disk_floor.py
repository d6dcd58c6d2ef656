"""The disk floor's reads (``kv.floors._read_chunks``) and the saturated disk floor's sweep (``saturated_floor``):
reads continuously in flight overlap past a slow one (lockstep batches do not), each layout reads what it should,
the sweep records every way and is the fastest of them, and point floors recorded before the sweep still load."""
from __future__ import annotations

import os
import threading

import pytest
from crossover_records import as_point_floors

from kmesh_lib.kv import floors as pf
from kmesh_lib.sections.crossover import report as cr

CHUNK = 64 << 10


class FakeReads:
    """Stands in for ``os.preadv``: returns the bytes asked for without touching the disk, counts the reads in flight,
    and notes which file (inode) and offset each read asked for. The first ``together`` reads wait until all of them
    are in flight at once; then read 0 waits until read ``release_at`` has started, or ``wait_s``: with reads
    continuously in flight the other workers reach it; in lockstep batches no read of a later batch starts before
    read 0 returns."""

    def __init__(self, release_at: int, wait_s: float, together: int = 1) -> None:
        self.release_at, self.wait_s = release_at, wait_s
        self.together = threading.Barrier(together, timeout=10.0)
        self.lock, self.active, self.most = threading.Lock(), 0, 0
        self.started, self.reached = 0, threading.Event()
        self.seen: list[tuple[int, int]] = []
        self.first_waited_for_later: bool | None = None

    def __call__(self, fd: int, buffers, offset: int) -> int:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
            index, self.started = self.started, self.started + 1
            self.seen.append((os.fstat(fd).st_ino, offset))
        if index >= self.release_at:
            self.reached.set()
        if index < self.together.parties:
            self.together.wait()
        if index == 0:
            self.first_waited_for_later = self.reached.wait(self.wait_s)
        with self.lock:
            self.active -= 1
        return sum(len(b) for b in buffers)


@pytest.mark.parametrize("depth", [2, 4, 8])
def test_reads_continuously_in_flight_pass_a_slow_read_and_never_exceed_the_depth(tmp_path, monkeypatch, depth):
    nbytes = 4 * depth * CHUNK
    path = pf._odirect_file(tmp_path, nbytes)
    fake = FakeReads(release_at=2 * depth, wait_s=10.0, together=depth)  # read 0 waits two batches past its own
    monkeypatch.setattr(os, "preadv", fake)
    pf._read_chunks(path, nbytes, CHUNK, depth)
    assert fake.first_waited_for_later is True  # reads of later batches started while read 0 was in flight
    assert fake.most == depth and fake.started == 4 * depth  # all of the depth at once, never more


def test_reads_in_lockstep_batches_wait_for_the_slowest_of_each(tmp_path, monkeypatch):
    """The same instrument on the method of records before 6 Dec 2026: read 0 stalls its whole batch, so the later
    batch's reads never start while it is in flight (it gives up waiting, then the batches go on)."""
    depth, nbytes = 4, 16 * CHUNK
    path = pf._odirect_file(tmp_path, nbytes)
    fake = FakeReads(release_at=depth, wait_s=0.5, together=depth)
    monkeypatch.setattr(os, "preadv", fake)
    pf._read_chunks(path, nbytes, CHUNK, depth, lockstep=True)
    assert fake.first_waited_for_later is False and fake.most == depth and fake.started == 16


def test_one_file_reads_its_offsets_and_chunk_files_one_file_each_at_offset_zero(tmp_path, monkeypatch):
    nbytes = 6 * CHUNK
    fake = FakeReads(release_at=0, wait_s=0.0)
    monkeypatch.setattr(os, "preadv", fake)
    one = pf._layout_files(tmp_path, nbytes, CHUNK, "one_file")
    pf._read_chunks(one, nbytes, CHUNK, 3)
    assert len({ino for ino, _ in fake.seen}) == 1 and sorted(o for _, o in fake.seen) == list(range(0, nbytes, CHUNK))
    fake.seen.clear()
    per_chunk = pf._layout_files(tmp_path, nbytes, CHUNK, "chunk_files")
    assert len(per_chunk) == 6 and all(p.stat().st_size == CHUNK for p in per_chunk)
    pf._read_chunks(per_chunk, nbytes, CHUNK, 3)
    assert len({ino for ino, _ in fake.seen}) == 6 and {o for _, o in fake.seen} == {0}


def test_a_short_read_raises_and_does_not_hang_either_way(tmp_path, monkeypatch):
    nbytes = 8 * CHUNK
    path = pf._odirect_file(tmp_path, nbytes)
    monkeypatch.setattr(os, "preadv", lambda fd, buffers, offset: 0 if offset == 3 * CHUNK else len(buffers[0]))
    for lockstep in (False, True):
        with pytest.raises(OSError, match="short O_DIRECT read"):
            pf._read_chunks(path, nbytes, CHUNK, 4, lockstep=lockstep)


def test_the_sweep_records_every_way_interleaved_and_its_floor_is_the_fastest(tmp_path, monkeypatch):
    sweep = tuple((layout, depth, "pageable") for layout, depth in  # any sweep, not the default
                  (("chunk_files", 4), ("one_file", 4), ("one_file", 8), ("one_file", 16)))
    seconds = {("chunk_files", 4): [0.30, 0.31, 0.29], ("one_file", 4): [0.20, 0.22, 0.21],
               ("one_file", 8): [0.12, 0.10, 0.11], ("one_file", 16): [0.13, 0.09, 0.14]}
    order = []

    def fake_read(paths, nbytes, chunk, depth, lockstep=False):
        way = ("chunk_files" if len(paths) > 1 else "one_file", depth)
        assert not lockstep and all(p.exists() for p in paths)
        order.append(way)
        return seconds[way][sum(w == way for w in order) - 1]

    monkeypatch.setattr(pf, "_read_chunks", fake_read)
    got = pf.saturated_floor("disk", 10 * CHUNK, CHUNK, 3, "cpu", tmp_path, sweep)
    assert order == [way[:2] for way in sweep] * 3  # each repeat times every way once
    assert [(w["layout"], w["queue_depth"], w["seconds"]) for w in got["sweep"]] == [(*k, v) for k, v in seconds.items()]
    assert {w["destination"] for w in got["sweep"]} == {"pageable"} and "not_swept" not in got
    assert (got["layout"], got["queue_depth"], got["median_s"], got["seconds"]) == ("one_file", 8, 0.11, [0.12, 0.10, 0.11])
    assert got["in_flight"] == "continuous" and (got["bytes"], got["chunk_bytes"]) == (10 * CHUNK, CHUNK)
    assert not list(tmp_path.iterdir())  # every layout's files are gone


def test_the_sweep_reads_a_real_file_system_and_leaves_nothing(tmp_path):
    got = pf.saturated_floor("disk", 3 << 20, 256 << 10, 2, "cpu", tmp_path)
    assert [(w["layout"], w["queue_depth"], w["destination"]) for w in got["sweep"]] == [
        way for way in pf.SATURATING_DISK_SWEEP if way[2] == "pageable"]  # on CPU the pinned way is not swept
    assert got["median_s"] == min(w["median_s"] for w in got["sweep"]) > 0
    assert all(len(w["seconds"]) == 2 for w in got["sweep"]) and not list(tmp_path.iterdir())
    copy = pf.saturated_floor("copy", 1 << 20, 64 << 10, 2, "cpu", tmp_path)
    assert (copy["chunk_bytes"], copy["queue_depth"], "sweep" in copy) == (1 << 20, 1, False)  # a copy: one piece


def test_point_floors_recorded_before_the_sweep_still_load_and_judge_by_their_median():
    """A saturated disk record of 6 Dec 2026's H200 run (7B, 16,384 tokens; lockstep, no ``in_flight`` nor ``sweep``)
    beside one with the sweep: both validate, and the floor is each record's fastest median."""
    old = {"model": "m", "context_tokens": 16384, "tier": "lmcache", "when": "before",
           "floors": {"disk": {"kind": "disk", "label": "disk: O_DIRECT reads", "bytes": 939524096,
                               "chunk_bytes": 14680064, "queue_depth": 1, "seconds": [0.93], "median_s": 0.93},
                      "copy": {"median_s": 0.02}},
           "saturated": {"disk": {"kind": "disk", "label": "disk: O_DIRECT reads", "bytes": 939524096,
                                  "chunk_bytes": 14680064, "queue_depth": 8, "seconds": [0.652], "median_s": 0.652}}}
    new = {**old, "when": "after", "saturated": {"disk": {
        **old["saturated"]["disk"], "queue_depth": 4, "layout": "chunk_files", "in_flight": "continuous",
        "median_s": 0.5, "sweep": [{"layout": "chunk_files", "queue_depth": 4, "seconds": [0.5], "median_s": 0.5},
                                   {"layout": "one_file", "queue_depth": 8, "seconds": [0.6], "median_s": 0.6}]}}}
    floors = as_point_floors([old, new])
    assert "sweep" not in floors[0].saturated["disk"] and floors[1].saturated["disk"]["sweep"][0]["median_s"] == 0.5
    assert [pf.way_destination(w) for w in floors[1].saturated["disk"]["sweep"]] == ["pageable"] * 2  # before the key
    assert cr.floor_range_ms("disk", floors) == [520.0, 672.0]  # the read's fastest, plus the copy


def test_a_file_system_that_refuses_o_direct_after_creating_the_file_is_left_clean(tmp_path, monkeypatch):
    """Linux checks O_DIRECT once the inode exists, so an open(O_CREAT | O_DIRECT) that a file system refuses (tmpfs
    before 6.6) may leave an empty file: the floor's files are removed whatever happens, that one too, for each
    layout of the sweep."""
    real_open = os.open

    def refusing_open(path, flags, *mode):
        if flags & os.O_DIRECT and flags & os.O_CREAT:
            os.close(real_open(path, (flags & ~os.O_DIRECT), *mode))  # created, then refused
            raise OSError(22, "Invalid argument")
        return real_open(path, flags, *mode)

    monkeypatch.setattr(pf.os, "open", refusing_open)
    for layout in pf.LAYOUTS:
        with pytest.raises(pf.DiskTierUnfit):
            pf._layout_files(tmp_path, 4 * CHUNK, CHUNK, layout)
        assert list(tmp_path.iterdir()) == [], layout
    with pytest.raises(pf.DiskTierUnfit):
        pf.saturated_floor("disk", 4 * CHUNK, CHUNK, 1, "cpu", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_sweep_times_the_tiers_own_read_last_in_each_repeat_and_takes_it_where_fastest(tmp_path, monkeypatch):
    """A tier that reads its disk copy its own way (the GPU buffer: its chunks, one in flight, into pinned slots) gets
    that read into the sweep (``OwnRead``): on the H100 of 6 Dec 2026 its restores read a 7B context faster than
    every way of this module's sweep, so a floor without it was no floor of them."""
    sweep = (("chunk_files", 4, "pageable"), ("one_file", 8, "pageable"))
    seconds = {("chunk_files", 4): [0.30, 0.31, 0.29], ("one_file", 8): [0.12, 0.10, 0.11]}
    order, own_calls = [], []

    def fake_read(paths, nbytes, chunk, depth, lockstep=False):
        way = ("chunk_files" if len(paths) > 1 else "one_file", depth)
        order.append(way)
        return seconds[way][sum(w == way for w in order) - 1]

    def own_read(path, nbytes):
        assert path.exists() and path.stat().st_size == nbytes  # the context in one file, as the tier keeps it
        order.append("own")
        own_calls.append(path)
        return [0.09, 0.08, 0.095][len(own_calls) - 1]

    monkeypatch.setattr(pf, "_read_chunks", fake_read)
    own = pf.OwnRead("tier", own_read, 3 * CHUNK, 1, "pinned")
    got = pf.saturated_floor("disk", 10 * CHUNK, CHUNK, 3, "cpu", tmp_path, sweep, own=own)
    assert order == [*(way[:2] for way in sweep), "own"] * 3  # each repeat times every way, the tier's own last
    assert len(set(own_calls)) == 1  # one file, written once
    assert got["sweep"][-1] == {"layout": "one_file", "queue_depth": 1, "destination": "pinned",
                                "seconds": [0.09, 0.08, 0.095], "median_s": 0.09, "reader": "tier",
                                "chunk_bytes": 3 * CHUNK}
    assert (got["reader"], got["chunk_bytes"], got["queue_depth"], got["median_s"]) == ("tier", 3 * CHUNK, 1, 0.09)
    assert got["destination"] == "pinned"  # the fastest way's, as its reader's
    assert not list(tmp_path.iterdir())
    order.clear()
    slow = pf.OwnRead("tier", lambda path, nbytes: 0.5, 3 * CHUNK, 1)
    got = pf.saturated_floor("disk", 10 * CHUNK, CHUNK, 3, "cpu", tmp_path, sweep, own=slow)
    assert (got["reader"], got["chunk_bytes"], got["queue_depth"], got["median_s"]) == ("floors", CHUNK, 8, 0.11)
    assert (got["destination"], got["sweep"][-1]["destination"]) == ("pageable", "pageable")  # OwnRead's default


def test_the_gpu_buffers_own_read_on_a_real_file_system_is_a_way_of_the_sweep(tmp_path):
    """The GPU buffer's own read (``BufferArena.read_seconds``) times a floor file as its restores read theirs; it reads
    the file's bytes, and the sweep leaves nothing behind."""
    import torch

    from kmesh_lib.kv.gpu_buffer_arena import BufferArena

    num_blocks = 16
    kv = {f"l{i}": torch.zeros(2, num_blocks, 16, 2, 32, dtype=torch.bfloat16) for i in range(2)}
    arena = BufferArena(kv, num_blocks, 8, tmp_path / "tier", chunk_bytes=3 * 8192 + 100)
    assert (arena.bytes_per_block, arena.chunk_bytes) == (8192, 3 * 8192)  # whole blocks: 3 of them
    own = pf.OwnRead("gpubuf stage", arena.read_seconds, arena.chunk_bytes, 1)
    got = pf.saturated_floor("disk", 10 * 8192, 64 << 10, 2, "cpu", tmp_path / "floors", own=own)
    pageable = [way for way in pf.SATURATING_DISK_SWEEP if way[2] == "pageable"]  # the pinned way: not on CPU
    assert [w.get("reader", "floors") for w in got["sweep"]] == ["floors"] * len(pageable) + ["gpubuf stage"]
    assert got["sweep"][-1]["chunk_bytes"] == 3 * 8192 and len(got["sweep"][-1]["seconds"]) == 2
    assert not list((tmp_path / "floors").iterdir())


def fake_pinned(calls: list, made: list):
    """Stands in for ``_pinned_buffers`` where no CUDA is: page-aligned anonymous pages, kept in ``made`` so a read can
    be told to have landed in them (by the object its buffer views), each call noted in ``calls``."""
    import mmap

    def pinned(count, size, device):
        calls.append((count, size, device))
        mine = [mmap.mmap(-1, size) for _ in range(count)]
        made.extend(mine)
        return [memoryview(m) for m in mine]

    return pinned


def counting_preadv(seen: list):
    """``os.preadv`` as it is, each read's (buffer's object, bytes asked, bytes read) noted in ``seen``."""
    real = os.preadv

    def preadv(fd, buffers, offset):
        got = real(fd, buffers, offset)
        seen.append((buffers[0].obj, len(buffers[0]), got))
        return got

    return preadv


def test_lmcaches_way_into_pinned_memory_is_swept_and_reads_the_context_into_the_pinned_buffers(tmp_path, monkeypatch):
    """The sweep's pinned way: LMCache's files, its disk_io_threads in flight, its reads landing in pinned host memory
    (its LocalCPUBackend pool is pinned on CUDA). On three GPU runs of 6 Dec 2026 (H100 0248; H200 458a, b43a)
    LMCache's own disk reads outran every way of a sweep into ordinary pages. Here its buffers stand in for pinned
    ones: each repeat reads exactly the context into them, once, and the record says ``pinned`` of that way alone."""
    calls, made, seen = [], [], []
    monkeypatch.setattr(pf, "_pinned_buffers", fake_pinned(calls, made))
    monkeypatch.setattr(os, "preadv", counting_preadv(seen))
    nbytes, repeats = 10 * CHUNK, 2
    got = pf.saturated_floor("disk", nbytes, CHUNK, repeats, "cuda", tmp_path)
    assert ("chunk_files", pf.LMCACHE_DISK_IO_THREADS, "pinned") in pf.SATURATING_DISK_SWEEP
    assert [(w["layout"], w["queue_depth"], w["destination"]) for w in got["sweep"]] == list(pf.SATURATING_DISK_SWEEP)
    assert "not_swept" not in got and all(len(w["seconds"]) == repeats for w in got["sweep"])
    assert calls == [(pf.LMCACHE_DISK_IO_THREADS, CHUNK, "cuda")]  # one allocation: its workers' buffers
    into_pinned = [(asked, n) for obj, asked, n in seen if any(obj is m for m in made)]
    assert len(into_pinned) == repeats * 10 and all(asked == n == CHUNK for asked, n in into_pinned)
    assert sum(n for _, n in into_pinned) == repeats * nbytes  # the context, exactly, per repeat
    num_pageable = sum(dest == "pageable" for _, _, dest in pf.SATURATING_DISK_SWEEP)
    assert sum(n for obj, _, n in seen if not any(obj is m for m in made)) == num_pageable * repeats * nbytes
    filled = [m for m in made if any(obj is m for obj, _, _ in seen)]  # a worker may have had no read to take
    assert filled and all(m[:] == filled[0][:] != bytes(CHUNK) for m in filled)  # the files' bytes (each the same)
    assert not list(tmp_path.iterdir())


def test_a_short_read_into_pinned_buffers_raises_and_leaves_nothing(tmp_path, monkeypatch):
    calls, made = [], []
    monkeypatch.setattr(pf, "_pinned_buffers", fake_pinned(calls, made))
    real = os.preadv
    reads = []

    def short(fd, buffers, offset):  # the third read into the pinned buffers comes back a page short
        if any(buffers[0].obj is m for m in made):
            reads.append(offset)
            if len(reads) == 3:
                return real(fd, [buffers[0][:-4096]], offset)
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", short)
    with pytest.raises(OSError, match="short O_DIRECT read"):
        pf.saturated_floor("disk", 8 * CHUNK, CHUNK, 1, "cuda", tmp_path, (("chunk_files", 4, "pinned"),))
    assert len(reads) >= 3 and not list(tmp_path.iterdir())
    path = pf._odirect_file(tmp_path, 8 * CHUNK)
    with pytest.raises(ValueError, match="4 buffers"):  # fewer buffers than workers: refused, never shared
        pf._read_chunks(path, 8 * CHUNK, CHUNK, 4, buffers=[memoryview(bytearray(CHUNK))] * 3)
    path.unlink()


def test_without_cuda_the_pinned_way_is_not_swept_and_says_why(tmp_path, monkeypatch):
    """No pinned memory on the CPU build: the pinned way is left out, named with the reason in ``not_swept``, and no
    read into ordinary pages is recorded under its name (that would time chunk_files at 4 twice and take the
    lesser median of one way); a sweep of pinned ways alone has nothing to time."""
    import torch

    with pytest.raises(pf.PinnedUnavailable, match="device 'cpu'"):
        pf._pinned_buffers(1, 4096, "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(pf.PinnedUnavailable, match="is_available"):
            pf._pinned_buffers(1, 4096, "cuda")
    given = []

    def fake_read(paths, nbytes, chunk, depth, lockstep=False, buffers=None):
        given.append(buffers)
        return 0.1

    monkeypatch.setattr(pf, "_read_chunks", fake_read)
    got = pf.saturated_floor("disk", 10 * CHUNK, CHUNK, 2, "cpu", tmp_path)
    assert given and all(b is None for b in given)  # every read timed went into this module's own pages
    assert [w["destination"] for w in got["sweep"]] == ["pageable"] * (len(pf.SATURATING_DISK_SWEEP) - 1)
    (left,) = got["not_swept"]
    assert (left["layout"], left["queue_depth"], left["destination"]) == ("chunk_files", pf.LMCACHE_DISK_IO_THREADS,
                                                                         "pinned")
    assert "device 'cpu'" in left["why"] and got["destination"] == "pageable"
    with pytest.raises(ValueError, match="no way of the sweep"):
        pf.saturated_floor("disk", 10 * CHUNK, CHUNK, 2, "cpu", tmp_path, (("chunk_files", 4, "pinned"),))
    with pytest.raises(ValueError, match="destination"):
        pf.saturated_floor("disk", 10 * CHUNK, CHUNK, 2, "cpu", tmp_path, (("chunk_files", 4, "mlocked"),))
    with pytest.raises(ValueError, match="destination"):  # a sweep of before the destination: refused, not guessed
        pf.saturated_floor("disk", 10 * CHUNK, CHUNK, 2, "cpu", tmp_path, (("chunk_files", 4),))
    assert not list(tmp_path.iterdir())


@pytest.mark.gpu
def test_pinned_buffers_on_cuda_are_pinned_page_aligned_and_take_the_files_bytes(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import mmap

    import numpy as np

    buffers = pf._pinned_buffers(3, CHUNK, "cuda")
    assert all(np.frombuffer(b, dtype=np.uint8).ctypes.data % mmap.PAGESIZE == 0 for b in buffers)
    assert torch.frombuffer(buffers[0], dtype=torch.uint8).is_pinned()
    path = pf._odirect_file(tmp_path, 3 * CHUNK)
    try:
        pf._read_chunks(path, 3 * CHUNK, CHUNK, 3, buffers=buffers)
        assert b"".join(bytes(b) for b in buffers) == path.read_bytes()
    finally:
        path.unlink()
    got = pf.saturated_floor("disk", 10 * CHUNK, CHUNK, 2, "cuda", tmp_path)
    assert "not_swept" not in got and [w["destination"] for w in got["sweep"]] == [
        dest for _, _, dest in pf.SATURATING_DISK_SWEEP]
