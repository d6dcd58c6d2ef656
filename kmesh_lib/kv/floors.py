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
    - every measurement reports its median and best of ``repeats`` and the label of what it measured;
    - the probe file is removed whatever happens.
"""
from __future__ import annotations

import mmap
import os
import statistics
import time
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
