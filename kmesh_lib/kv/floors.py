"""Physical floors of a restore, measured on the machine that runs it, in the same run.

    disk        sequential O_DIRECT reads of a file of N MiB in a given directory (the disk tier's
                file system): the fastest the disk tier can hand over a context of that size
    host->dev   CUDA: a pinned host buffer copied into device memory (``non_blocking`` + synchronize);
                CPU:  a host memcpy between two ordinary buffers, labelled ``host memcpy (no device)``,
                since on the CPU build the engine's KV lives in host memory and there is no device copy
    dev->dev    CUDA: one device buffer copied into another (the GPU buffer tier's restore: its copy is
                already in device memory); CPU: the host memcpy again, labelled as such

A floor is ``bytes / bandwidth``: what moving a context would cost if nothing but the wire mattered.

Invariants:
    - the disk floor reads with O_DIRECT (page-aligned buffer, block-multiple sizes), so the page cache
      never serves it; a file system without O_DIRECT raises ``DiskTierUnfit`` instead of measuring RAM;
    - a context's chunked disk reads keep their queue depth continuously in flight (``_read_chunks``), and the
      saturated disk floor is the fastest of a sweep that includes LMCache's own way of reading and, where the tier
      gives one (``OwnRead``: the GPU buffer's), the tier's own read code on the same kind of file (``saturated_floor``);
    - each way of the sweep names where its reads land (``destination``, DESTINATIONS): ordinary pages, or pinned host
      memory as LMCache's disk tier reads into (its LocalCPUBackend's pool); a pinned way where pinned memory cannot
      be had (no CUDA) is left out of the sweep, named with why in the record's ``not_swept``, never timed into
      ordinary pages under its name;
    - every measurement reports its median and best of ``repeats`` and the label of what it measured;
    - the probe file is removed whatever happens.
"""
from __future__ import annotations

import mmap
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kmesh_lib.kv.disk_tier import DiskTierUnfit, mount_of

MIB = 1 << 20
READ_MIB = 8  # one O_DIRECT read: 8 MiB, a block multiple on every file system


def _summary(label: str, nbytes: int, seconds: list[float], **extra) -> dict:
    med, best = statistics.median(seconds), min(seconds)
    return {"label": label, "bytes": nbytes, "repeats": len(seconds), "median_s": med, "best_s": best,
            "gib_per_s": nbytes / med / (1 << 30), "best_gib_per_s": nbytes / best / (1 << 30), **extra}


def odirect_read_bandwidth(directory: str | Path, size_mib: int = 256, repeats: int = 3) -> dict:
    """Sequential O_DIRECT read bandwidth of a ``size_mib`` file written under ``directory``.

    Raises:
        DiskTierUnfit: the file system refuses O_DIRECT (rereads would come from the page cache).
    """

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f".kmesh-floor-{os.getpid()}"
    step = READ_MIB * MIB
    nbytes = max(1, size_mib // READ_MIB) * step
    buf = mmap.mmap(-1, step)  # page-aligned, as O_DIRECT wants
    buf.write(os.urandom(MIB) * READ_MIB)
    try:
        try:
            fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_DIRECT, 0o600)
        except OSError as e:
            raise DiskTierUnfit(f"O_DIRECT refused at {directory}: {e}") from None
        try:
            for _ in range(nbytes // step):
                os.write(fd, buf)
            os.fsync(fd)
        finally:
            os.close(fd)
        seconds = []
        for _ in range(repeats):
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            try:
                t0, got = time.perf_counter(), 0
                while got < nbytes:
                    n = os.readv(fd, [buf])
                    if n <= 0:
                        break
                    got += n
                seconds.append(time.perf_counter() - t0)
            finally:
                os.close(fd)
            if got != nbytes:
                raise OSError(f"short O_DIRECT read of {path}: {got} of {nbytes} bytes")
        mnt, fstype = mount_of(directory)
        return _summary("disk: sequential O_DIRECT read", nbytes, seconds, read_bytes=step, directory=str(directory),
                        mount=mnt, fs_type=fstype)
    finally:
        path.unlink(missing_ok=True)
        buf.close()


def host_to_device_bandwidth(size_mib: int = 256, device: str = "cuda", repeats: int = 5) -> dict:
    """Pinned host->device copy bandwidth on CUDA; on CPU a host memcpy, labelled as such."""
    import torch

    n = size_mib * MIB
    if device == "cuda" and torch.cuda.is_available():
        src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        src.fill_(7)
        dst = torch.empty(n, dtype=torch.uint8, device="cuda")
        dst.copy_(src, non_blocking=True)  # first touch: not timed
        torch.cuda.synchronize()
        seconds = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - t0)
        del src, dst
        return _summary("host->device: pinned copy (cuda)", n, seconds, device=torch.cuda.get_device_name(0))
    src = torch.full((n,), 7, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch: not timed
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        seconds.append(time.perf_counter() - t0)
    del src, dst
    return _summary("host memcpy (no device)", n, seconds, device="cpu", threads=torch.get_num_threads())


def device_to_device_bandwidth(size_mib: int = 256, device: str = "cuda", repeats: int = 5) -> dict:
    """Device-to-device copy bandwidth on CUDA (``bytes`` moved per second: each is read once and
    written once); on CPU a host memcpy, labelled as such."""
    import torch

    n = size_mib * MIB
    if not (device == "cuda" and torch.cuda.is_available()):
        floor = host_to_device_bandwidth(size_mib, "cpu", repeats)
        return {**floor, "label": "host memcpy (no device)"}
    src = torch.full((n,), 7, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch: not timed
    torch.cuda.synchronize()
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
    del src, dst
    return _summary("device->device: copy (cuda)", n, seconds, device=torch.cuda.get_device_name(0))


def floor_seconds(nbytes: int, floor: dict) -> float:
    """Time to move ``nbytes`` at the floor's median bandwidth."""
    return nbytes / (floor["gib_per_s"] * (1 << 30))


def _odirect_files(directory: Path, sizes: list[int]) -> list[Path]:
    """Files of ``sizes`` bytes (each a multiple of the page size) written with O_DIRECT under ``directory``.

    Invariant: on any failure the files written so far are removed (the caller owns them only once returned)."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = f".kmesh-floor-{os.getpid()}-{time.monotonic_ns()}"
    step = min(max(sizes), READ_MIB * MIB)
    buf = mmap.mmap(-1, step)
    buf.write(os.urandom(step))
    paths: list[Path] = []
    try:
        for k, size in enumerate(sizes):
            path = directory / (stem if len(sizes) == 1 else f"{stem}-{k:05d}")
            paths.append(path)  # before the open: a file system that refuses O_DIRECT may refuse it after creating
            # the file (Linux checks O_DIRECT once the inode exists: tmpfs before 6.6 left an empty file behind)
            try:
                fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_DIRECT, 0o600)
            except OSError as e:
                raise DiskTierUnfit(f"O_DIRECT refused at {directory}: {e}") from None
            try:
                written = 0
                while written < size:
                    n = min(step, size - written)
                    os.write(fd, memoryview(buf)[:n])
                    written += n
                os.fsync(fd)
            finally:
                os.close(fd)
    except BaseException:
        for path in paths:
            path.unlink(missing_ok=True)
        raise
    finally:
        buf.close()
    return paths


def _odirect_file(directory: Path, nbytes: int) -> Path:
    """A file of ``nbytes`` (a multiple of the page size) written with O_DIRECT under ``directory``."""
    return _odirect_files(directory, [nbytes])[0]


# How a context's bytes lie on disk for a floor read: "one_file", the context in one file (opened once, before the
# clock starts); "chunk_files", one file per chunk, each opened, read in one read and closed by the read that needs it
# (LMCache's disk tier: one file per chunk key, ``read_file``'s open + ``readinto``)
LAYOUTS = ("one_file", "chunk_files")


def _layout_files(directory: Path, nbytes: int, chunk_bytes: int, layout: str) -> list[Path]:
    if layout not in LAYOUTS:
        raise ValueError(f"disk floor layout {layout!r}: one of {LAYOUTS}")
    if layout == "one_file":
        return _odirect_files(directory, [nbytes])
    return _odirect_files(directory, [min(chunk_bytes, nbytes - off) for off in range(0, nbytes, chunk_bytes)])


def _read_chunks(paths: Path | list[Path], nbytes: int, chunk_bytes: int, queue_depth: int,
                 lockstep: bool = False, buffers: list[memoryview] | None = None) -> float:
    """Seconds to read ``nbytes`` with O_DIRECT in ``chunk_bytes`` reads, ``queue_depth`` of them in flight.

    ``paths``: one file holding the context (read at offsets; opened once before the clock starts), or one file per
    chunk (``chunk_files``: each read opens, reads and closes its own file, the open inside the clock, as LMCache's).
    ``buffers``: where the reads land, one per worker (at least ``min(queue_depth, chunks)`` page-aligned writable
    buffers of ``chunk_bytes``, already touched; the caller's, never closed here: ``_pinned_buffers``'s); by default
    anonymous mmap pages of this call's own (``pageable``).

    Invariants:
        - continuously in flight (the default): ``queue_depth`` workers each own one buffer and take the next read as
          soon as their last one returns, so up to ``queue_depth`` reads are in the kernel at every moment until the
          last ``queue_depth - 1`` reads drain (LMCache's ``ThreadPoolExecutor.map`` over its chunks); no read waits
          for another worker's;
        - ``lockstep`` (the method of the disk point floors recorded before 6 Dec 2026's sweep, whose records carry
          no ``in_flight``): reads go in batches of ``queue_depth``, each batch waiting for its slowest read, so fewer
          than ``queue_depth`` are in flight while a batch drains; kept to compare the two (benchmarks/);
        - the clock starts once every worker is ready (no thread start inside it) and stops when the last read
          returned; every read must return its whole size, else ``OSError``;
        - a worker's buffer is only ever read into by that worker, so no two reads share memory.
    """
    import itertools
    import threading
    from concurrent.futures import ThreadPoolExecutor

    queue_depth = max(1, queue_depth)
    per_chunk = isinstance(paths, list) and len(paths) > 1
    files = paths if isinstance(paths, list) else [paths]
    offsets = list(range(0, nbytes, chunk_bytes))
    if per_chunk and len(files) != len(offsets):
        raise ValueError(f"{len(files)} chunk files for {len(offsets)} chunks")
    num_workers = min(queue_depth, len(offsets))
    own_buffers = buffers is None
    if own_buffers:
        buffers = [mmap.mmap(-1, chunk_bytes) for _ in range(num_workers)]
        for b in buffers:  # first touch outside the clock: a read lands in resident pages, as in LMCache's pinned pool
            b.write(bytes(chunk_bytes))
    elif len(buffers) < num_workers or any(len(b) < chunk_bytes for b in buffers[:num_workers]):
        raise ValueError(f"{num_workers} buffers of {chunk_bytes:,} bytes wanted, given "
                         f"{[len(b) for b in buffers]}")
    else:
        buffers = buffers[:num_workers]
    fd = None if per_chunk else os.open(files[0], os.O_RDONLY | os.O_DIRECT)
    try:
        def read(i: int, buf) -> None:
            off = offsets[i]
            want = min(chunk_bytes, nbytes - off)
            if per_chunk:
                f = os.open(files[i], os.O_RDONLY | os.O_DIRECT)
                try:
                    got = os.preadv(f, [memoryview(buf)[:want]], 0)
                finally:
                    os.close(f)
            else:
                got = os.preadv(fd, [memoryview(buf)[:want]], off)
            if got != want:
                raise OSError(f"short O_DIRECT read of {files[i if per_chunk else 0]} at {off}: {got} of {want} bytes")

        if len(buffers) == 1:
            t0 = time.perf_counter()
            for i in range(len(offsets)):
                read(i, buffers[0])
            return time.perf_counter() - t0
        ready = threading.Barrier(len(buffers) + 1)
        if lockstep:
            def worker(k: int) -> None:  # the read k of each batch, then the batch's barrier
                ready.wait()
                for start in range(0, len(offsets), len(buffers)):
                    try:
                        if start + k < len(offsets):
                            read(start + k, buffers[k])
                    except BaseException:
                        batch_done.abort()  # the other workers leave the barrier instead of waiting for this one
                        raise
                    batch_done.wait()

            batch_done = threading.Barrier(len(buffers))
        else:
            claim, take = threading.Lock(), itertools.count()

            def worker(k: int) -> None:  # the next unclaimed read, until none is left
                ready.wait()
                while True:
                    with claim:
                        i = next(take)
                    if i >= len(offsets):
                        return
                    read(i, buffers[k])

        with ThreadPoolExecutor(len(buffers)) as pool:
            running = [pool.submit(worker, k) for k in range(len(buffers))]
            try:
                ready.wait(timeout=60)
            except threading.BrokenBarrierError:
                raise RuntimeError("floor read workers did not start") from None
            t0 = time.perf_counter()
            failed = [e for e in (f.exception() for f in running) if e is not None]
            took = time.perf_counter() - t0
        if failed:  # a read's own error, not the broken barrier it left the other lockstep workers with
            raise min(failed, key=lambda e: isinstance(e, threading.BrokenBarrierError))
        return took
    finally:
        if fd is not None:
            os.close(fd)
        if own_buffers:
            for b in buffers:
                b.close()


# LMCache 0.5.3's disk tier reads a context's chunks with this many threads (local_disk_backend.py's
# _DEFAULT_THREAD_COUNT, ``disk_io_threads``, which kmesh leaves at its default), one file per chunk
LMCACHE_DISK_IO_THREADS = 4
# Where a floor way's reads land: "pageable", ordinary anonymous pages (``_read_chunks``'s own mmap buffers, touched
# before the clock); "pinned", page-locked host memory from CUDA's host allocator (``_pinned_buffers``), as LMCache's
# disk tier reads (``read_file``'s ``readinto`` buffers come from its LocalCPUBackend pool, pinned on CUDA). Sweep
# entries recorded before the pinned way (6 Dec 2026) have no ``destination``: they read into ordinary pages
# (``way_destination``)
DESTINATIONS = ("pageable", "pinned")
# The saturated disk floor's sweep, (layout, reads in flight, destination), each continuously in flight: LMCache's own
# way into ordinary pages, then into pinned memory, then the context in one file at deeper queues. The floor is the
# fastest median; every way's figures stay in the record. Four ways, not a grid: each costs FLOOR_REPEATS reads of the
# context before and after every point (this project's CPU box, ext4 on a shared virtual disk, 1.8 GB, 3 repeats, files
# written included: 13.5 s for the three pageable ways, 16.8 s with one file at 4 in flight as a fourth, 5.1 s for the
# one lockstep way they replaced); one file against one per chunk at equal depth is
# benchmarks/bench_disk_floor_inflight.py's question, not every point's.
# The pinned way (from 6 Dec 2026): on three GPU runs LMCache's in-process disk restores read the context faster than
# every pageable way around the same point: the H100's gpu-20261206-125316-0248 (0.5B, 32,512 tokens, 381 MiB), its
# own reads (probe ``disk_read_s``) 169-172 ms in all 8 restores, these reads 174.6-232 ms (every way's median of 3 at
# 198-209 ms); the H200's 458a (the same context) 230 ms against 338-374 ms, and b43a (7B) 1,021 ms against
# 1,361-1,500 ms. Its files, layout and depth are chunk_files at 4's; its destination is not (the GPU buffer's own
# reads into its pinned slots outran ordinary pages the same way: ``OwnRead``). It reads into one pinned buffer per
# worker, where LMCache gives each chunk its own buffer of its pool. Without CUDA it is left out (``not_swept``): run
# into ordinary pages it would be chunk_files at 4 timed twice, the floor the lesser of two noisy medians of one way
SATURATING_DISK_SWEEP: tuple[tuple[str, int, str], ...] = (
    ("chunk_files", LMCACHE_DISK_IO_THREADS, "pageable"), ("chunk_files", LMCACHE_DISK_IO_THREADS, "pinned"),
    ("one_file", 8, "pageable"), ("one_file", 16, "pageable"))


def way_destination(way) -> str:
    """Where a recorded sweep way's reads landed (DESTINATIONS): its ``destination``, else ``pageable`` (every way
    recorded before the key read into ordinary pages)."""
    return way.get("destination", "pageable")


class PinnedUnavailable(RuntimeError):
    """Pinned host memory cannot be had in this process; the message says why."""


def _pinned_buffers(count: int, size: int, device: str) -> list[memoryview]:
    """``count`` writable buffers of ``size`` bytes (a multiple of the page size) in pinned host memory, each on a page
    boundary as O_DIRECT needs: one ``torch.empty(..., pin_memory=True)`` a page longer than they need, cut at its first
    page boundary (so whatever address the allocator returns), seen through numpy (the buffer protocol ``os.preadv``
    writes through) and zeroed before any clock. The memory goes back to torch's pinned host cache once the last view
    is dropped.

    Raises:
        PinnedUnavailable: ``device`` is not CUDA or CUDA is unavailable (pinning is cudaHostAlloc's), the allocation
            failed or came back unpinned, or a buffer would not start on a page boundary.
    """
    import torch

    page = mmap.PAGESIZE
    if size % page:
        raise ValueError(f"pinned floor buffers of {size:,} bytes: a multiple of the page size ({page}) is needed")
    if device != "cuda":
        raise PinnedUnavailable(f"device {device!r}: pinned host memory is CUDA's (cudaHostAlloc), none on this device")
    if not torch.cuda.is_available():
        raise PinnedUnavailable("torch.cuda.is_available() is False: pinned host memory needs a CUDA device")
    try:
        held = torch.empty(count * size + page, dtype=torch.uint8, pin_memory=True)
    except RuntimeError as e:
        raise PinnedUnavailable(f"pin_memory refused {count * size + page:,} bytes: {e}"[:300]) from None
    if not held.is_pinned():
        raise PinnedUnavailable("torch.empty(pin_memory=True) returned memory that is not pinned")
    try:
        return page_cut_buffers(held, count, size)
    except ValueError as e:
        raise PinnedUnavailable(str(e)) from None


def page_cut_buffers(held, count: int, size: int) -> list[memoryview]:
    """``count`` buffers of ``size`` bytes cut from the uint8 tensor ``held`` (at least a page longer than they need)
    at its first page boundary, seen through numpy (the buffer protocol ``os.preadv`` writes through) and zeroed, so
    touched before any clock. The views keep ``held``'s memory alive.

    Raises:
        ValueError: the cut does not start on a page boundary (O_DIRECT would refuse it)."""
    page = mmap.PAGESIZE
    start = -held.data_ptr() % page
    flat = held[start:start + count * size].numpy()  # a view: the tensor's bytes themselves
    flat.fill(0)  # touched before the clock, as _read_chunks's own pages are
    if flat.ctypes.data % page:
        raise ValueError(f"buffer at {flat.ctypes.data:#x}: not on a {page}-byte page boundary")
    whole = memoryview(flat)
    return [whole[k * size:(k + 1) * size] for k in range(count)]


@dataclass(frozen=True)
class OwnRead:
    """A tier's own way of reading a context's file, as a floor way: ``read(path, nbytes)`` reads the first ``nbytes``
    of ``path`` (one file, written with O_DIRECT) exactly as the tier reads its disk copy and returns the seconds its
    reads took; ``chunk_bytes`` and ``queue_depth`` say how it reads and ``destination`` where its reads land
    (DESTINATIONS; recorded beside its seconds), ``name`` whose code it is. The GPU buffer's:
    ``BufferArena.read_seconds`` (its chunks, one read in flight, into its staging slots: pinned on CUDA). On the H100
    of 6 Dec 2026 (run gpu-20261206-060006-9c9b, published failed, then withdrawn for
    b298, which timed this way; 7B, 1,024 tokens) the tier's restores read the context at 1.65-1.94 GB/s, this
    module's reads of the same bytes at one in flight in 16 MiB chunks into ordinary pages at medians of 1.34 and
    1.54 GB/s, and the sweep's fastest median was 1.62-1.71 GB/s."""

    name: str
    read: Callable[[Path, int], float]
    chunk_bytes: int
    queue_depth: int = 1
    destination: str = "pageable"


def saturating_piece(kind: str, nbytes: int, chunk_bytes: int) -> tuple[int, int]:
    """(piece bytes, pieces in flight) of a copy (host->device, device->device) kept busy: one piece, so no per-piece
    launch from Python counts. The disk has no one such piece: ``saturated_floor`` sweeps SATURATING_DISK_SWEEP."""
    if kind == "disk":
        raise ValueError("the saturated disk floor is a sweep (saturated_floor), not one piece")
    return nbytes, 1


def saturated_floor(kind: str, nbytes: int, chunk_bytes: int, repeats: int = 3, device: str = "cpu",
                    directory: str | Path | None = None,
                    sweep: tuple[tuple[str, int, str], ...] = SATURATING_DISK_SWEEP, own: OwnRead | None = None) -> dict:
    """The floor of moving ``nbytes`` with the medium kept busy: a copy in one piece (``chunked_floor`` of
    ``saturating_piece``); the disk, the fastest of ``sweep`` ((layout, reads in flight, destination) in
    ``chunk_bytes`` reads, continuously in flight, into ordinary pages or pinned memory) and, where given, the tier's
    ``own`` read of the context in one file (its own chunks and depth: a floor no faster than the tier's own reads is
    no floor of them), each timed ``repeats`` times, the ways interleaved within each repeat so a drift of the drive
    over the sweep touches every way alike.

    The disk's record has ``chunked_floor``'s keys for the fastest way (``queue_depth``, ``seconds``, ``median_s``;
    ``chunk_bytes`` its reads' size) plus its ``layout``, ``in_flight`` ("continuous"), ``reader`` ("floors": this
    module's reads, else the ``OwnRead``'s name), ``destination`` and ``sweep``: every way timed, its layout, queue
    depth, destination, seconds and median, in the order timed (the own way last, with its ``reader`` and
    ``chunk_bytes``). A pinned way that cannot run here (``_pinned_buffers``: no CUDA, say) is not timed at all and
    goes to ``not_swept`` (layout, queue depth, destination, why), a key present only then. The pinned ways share
    one set of buffers, allocated once before the first repeat. Each layout is written once (``_layout_files``) and
    removed whatever happens.

    Raises:
        DiskTierUnfit: ``disk`` on a file system that refuses O_DIRECT.
        ValueError: an unknown destination, or no way left to time.
    """
    if kind != "disk":
        return chunked_floor(kind, nbytes, *saturating_piece(kind, nbytes, chunk_bytes), repeats, device, directory)
    if directory is None:
        raise ValueError("saturated_floor('disk'): a directory on the disk tier's file system is needed")
    if not sweep:
        raise ValueError("saturated_floor('disk'): an empty sweep")
    unknown = [way for way in sweep if len(way) != 3 or way[2] not in DESTINATIONS]
    if unknown:
        raise ValueError(f"saturated_floor('disk'): ways are (layout, reads in flight, destination), the destination "
                         f"one of {DESTINATIONS}, not {unknown}")
    page = mmap.PAGESIZE
    chunk_bytes = max(page, -(-chunk_bytes // page) * page)
    nbytes = -(-nbytes // page) * page
    num_chunks = -(-nbytes // chunk_bytes)
    pinned: list[memoryview] = []
    not_swept: list[dict] = []
    pinned_depth = max((min(max(1, depth), num_chunks) for _, depth, dest in sweep if dest == "pinned"), default=0)
    if pinned_depth:
        try:
            pinned = _pinned_buffers(pinned_depth, chunk_bytes, device)
        except PinnedUnavailable as e:
            not_swept = [{"layout": layout, "queue_depth": max(1, depth), "destination": dest, "why": str(e)}
                         for layout, depth, dest in sweep if dest == "pinned"]
    timed = [(layout, depth, dest,
              (lambda f, d=depth: _read_chunks(f, nbytes, chunk_bytes, d)) if dest == "pageable"
              else (lambda f, d=depth: _read_chunks(f, nbytes, chunk_bytes, d, buffers=pinned)))
             for layout, depth, dest in sweep if dest == "pageable" or pinned]
    if own is not None:  # one file, as the tier's own file holds a context
        timed.append(("one_file", own.queue_depth, own.destination, lambda f: own.read(f[0], nbytes)))
    if not timed:
        raise ValueError(f"saturated_floor('disk'): no way of the sweep can run here: {not_swept}")
    files: dict[str, list[Path]] = {}
    try:
        for layout in dict.fromkeys(layout for layout, _, _, _ in timed):
            files[layout] = _layout_files(Path(directory), nbytes, chunk_bytes, layout)
        seconds: list[list[float]] = [[] for _ in timed]
        for _ in range(repeats):
            for k, (layout, _, _, read) in enumerate(timed):
                seconds[k].append(read(files[layout]))
    finally:
        for paths in files.values():
            for path in paths:
                path.unlink(missing_ok=True)
        pinned.clear()  # the last views of the pinned buffers (bar the readers' closures, gone with this call)
    ways = [{"layout": layout, "queue_depth": max(1, depth), "destination": dest, "seconds": s,
             "median_s": statistics.median(s)} for (layout, depth, dest, _), s in zip(timed, seconds)]
    if own is not None:
        ways[-1].update(reader=own.name, chunk_bytes=own.chunk_bytes)
    best = min(ways, key=lambda w: w["median_s"])
    return {"kind": "disk", "label": "disk: O_DIRECT reads", "bytes": nbytes,
            "chunk_bytes": best.get("chunk_bytes", chunk_bytes), "queue_depth": best["queue_depth"],
            "seconds": best["seconds"], "median_s": best["median_s"], "layout": best["layout"],
            "in_flight": "continuous", "reader": best.get("reader", "floors"), "destination": best["destination"],
            "sweep": ways, **({"not_swept": not_swept} if not_swept else {})}


def chunked_floor(kind: str, nbytes: int, chunk_bytes: int, queue_depth: int = 1, repeats: int = 3,
                  device: str = "cpu", directory: str | Path | None = None) -> dict:
    """The floor of moving exactly ``nbytes`` (a context) the way a restore moves it: in ``chunk_bytes`` pieces,
    ``queue_depth`` in flight. ``kind``: ``disk`` (O_DIRECT reads of one file under ``directory``, continuously in
    flight, ``_read_chunks``: the record's ``in_flight`` says so; disk records without it, before 6 Dec 2026, read in
    lockstep batches, the same at one in flight), ``copy``
    (host->device from pinned memory; CPU: a host memcpy) or ``device`` (device->device; CPU: a host memcpy).
    Returns every repeat's seconds, their median, and what was measured (the label says a host memcpy on CPU).

    Raises:
        DiskTierUnfit: ``disk`` on a file system that refuses O_DIRECT.
    """
    import torch

    page = mmap.PAGESIZE
    chunk_bytes = max(page, -(-chunk_bytes // page) * page) if kind == "disk" else max(1, chunk_bytes)
    nbytes = -(-nbytes // page) * page if kind == "disk" else nbytes
    queue_depth = max(1, queue_depth)
    seconds: list[float] = []
    extra: dict = {}
    cuda = device == "cuda" and torch.cuda.is_available()
    if kind == "disk":
        if directory is None:
            raise ValueError("chunked_floor('disk'): a directory on the disk tier's file system is needed")
        path = _odirect_file(Path(directory), nbytes)
        try:
            seconds = [_read_chunks(path, nbytes, chunk_bytes, queue_depth) for _ in range(repeats)]
        finally:
            path.unlink(missing_ok=True)
        label = "disk: O_DIRECT reads"
        extra = {"in_flight": "continuous"}
    else:
        src, dst, label = _copy_buffers(kind, nbytes, cuda)
        streams = [torch.cuda.Stream() for _ in range(queue_depth)] if cuda else []

        def once() -> float:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i, off in enumerate(range(0, nbytes, chunk_bytes)):
                end = min(off + chunk_bytes, nbytes)
                if cuda:
                    with torch.cuda.stream(streams[i % queue_depth]):
                        dst[off:end].copy_(src[off:end], non_blocking=True)
                else:
                    dst[off:end].copy_(src[off:end])
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter() - t0

        once()  # first touch: not timed
        seconds = [once() for _ in range(repeats)]
        del src, dst
    return {"kind": kind, "label": label, "bytes": nbytes, "chunk_bytes": chunk_bytes, "queue_depth": queue_depth,
            "seconds": seconds, "median_s": statistics.median(seconds), **extra}


def _copy_buffers(kind: str, nbytes: int, cuda: bool):
    """(source, destination, label) for a copy floor: CUDA ``copy`` from pinned host memory to the device,
    ``device`` from device to device; without CUDA a host memcpy either way."""
    import torch

    if cuda:
        src = (torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) if kind == "copy"
               else torch.empty(nbytes, dtype=torch.uint8, device="cuda"))
        src.fill_(7)
        dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        return src, dst, "host->device: pinned copy (cuda)" if kind == "copy" else "device->device: copy (cuda)"
    src = torch.full((nbytes,), 7, dtype=torch.uint8)
    return src, torch.empty_like(src), "host memcpy (no device)"


class PairFloor:
    """The copy floor of one context's bytes, timed beside each restore of a point (``time_ways`` right before it):
    its buffers are allocated once, and each timing moves the bytes in one piece (the saturated way of
    ``chunked_floor``), so a restore and the floor next to it see the same machine at the same moment (a link busy
    with someone else's copies slows both; a slow restore path alone, only the restore). ``close`` frees them.

    A CUDA host->device floor is timed two ways, each the bytes once: ``memcpy`` (one pinned ``cudaMemcpyAsync``, the
    copy engine) and ``uva_read`` (a kernel whose threads read the pinned buffer through unified virtual addressing,
    vLLM's ``get_accelerator_view_from_cpu_tensor``: the way LMCache's transfer kernel reads host memory). The floor is
    the faster of the two at that moment: the link's best as measured, not one API's (a 7B restore from LMCache's DRAM
    ran at 0.93x a one-piece cudaMemcpy on the H200, gpu-20261205-114511-29e7). Elsewhere (device->device, no
    CUDA) the one way is ``memcpy``. A way that cannot be set up is left out and named in ``errors``."""

    def __init__(self, kind: str, nbytes: int, device: str = "cpu") -> None:
        import torch

        if kind not in ("copy", "device"):
            raise ValueError(f"PairFloor: a copy floor (copy, device), not {kind!r}")
        self.kind, self.nbytes = kind, nbytes
        self.cuda = device == "cuda" and torch.cuda.is_available()
        self.src, self.dst, self.label = _copy_buffers(kind, nbytes, self.cuda)
        self.ways = {"memcpy": lambda: self.dst.copy_(self.src, non_blocking=self.cuda)}
        self.errors: dict[str, str] = {}
        if self.cuda and kind == "copy":
            try:
                self.ways["uva_read"] = _uva_read(self.src, self.dst)
            except Exception as e:  # noqa: BLE001 - a floor way this build lacks is named, the restore still measured
                self.errors["uva_read"] = f"{type(e).__name__}: {e}"
        self.time_ways()  # first touch: not kept

    def time_ways(self) -> dict[str, float]:
        """Seconds per way, each timed alone (synchronized before and after), in a fixed order."""
        return {name: self._time(way) for name, way in self.ways.items()}

    def _time(self, way) -> float:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        way()
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def close(self) -> None:
        self.src = self.dst = None
        self.ways = {}
        if self.cuda:
            import torch

            torch.cuda.empty_cache()


def _uva_read(src, dst):
    """A kernel copy of pinned ``src`` into device ``dst`` that reads host memory from the GPU's threads (UVA), as
    LMCache's transfer kernel does, instead of the copy engine: an element-wise op on 8-byte words (``bitwise_or``
    with 0 keeps every bit) over a device view of the pinned buffer. Bytes past the last whole word go by memcpy."""
    import torch
    import vllm._custom_ops  # noqa: F401 - loads vLLM's compiled ops (torch.ops._C) in a process without an engine
    from vllm.utils.torch_utils import get_accelerator_view_from_cpu_tensor

    words = src.numel() // 8
    view = get_accelerator_view_from_cpu_tensor(src[: 8 * words]).view(torch.int64)
    out = dst[: 8 * words].view(torch.int64)
    tail = (src[8 * words:], dst[8 * words:])

    def copy() -> None:
        torch.bitwise_or(view, 0, out=out)
        if tail[0].numel():
            tail[1].copy_(tail[0], non_blocking=True)

    n = min(4096, 8 * words)
    src[:n] = torch.arange(n, dtype=torch.int32).remainder_(251).to(torch.uint8)  # a pattern no stale byte matches
    copy()
    torch.cuda.synchronize()
    if not torch.equal(dst[:n].cpu(), src[:n]):
        raise RuntimeError("the UVA kernel copy did not reproduce the source bytes")
    return copy
