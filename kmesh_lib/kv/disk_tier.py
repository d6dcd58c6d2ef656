"""Is a directory fit to be the disk tier? (a disk, O_DIRECT, aligned chunks, room for the context)

Rereads only measure the SSD when LMCache reads with O_DIRECT: a buffered reread is served from the
page cache, and a RAM-backed file system (tmpfs) is no disk at all. LMCache silently falls back to
buffered I/O when a chunk is not a multiple of the file system's block size, so that is checked
here too, before any engine starts.
"""
from __future__ import annotations

import mmap
import os
import shutil
from pathlib import Path

MIB = 1 << 20

class DiskTierFull(RuntimeError):
    """The disk tier cannot take the shared context: reported as such, never as a latency."""


class DiskTierUnfit(RuntimeError):
    """The disk tier would not measure disk reads (no O_DIRECT, RAM-backed, or misaligned chunks)."""


def mount_of(path: Path) -> tuple[str, str]:
    """(mount point, file-system type) holding ``path``: the longest matching /proc/mounts entry."""
    best = ("/", "unknown")
    real = str(Path(path).resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        _dev, mnt, fstype = line.split()[:3]
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
            best = (mnt, fstype)
    return best


def odirect_works(path: Path, block_size: int) -> bool:
    """Writes and reads back one aligned block with O_DIRECT under ``path``."""
    probe = Path(path) / ".odirect-probe"
    buf = mmap.mmap(-1, block_size)  # page-aligned, as O_DIRECT wants
    buf.write(b"k" * block_size)
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600)
        try:
            os.write(fd, buf)
        finally:
            os.close(fd)
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECT)
        try:
            return os.readv(fd, [buf]) == block_size
        finally:
            os.close(fd)
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)
        buf.close()


def check_disk_tier(path: Path, chunk_bytes: int, need_bytes: int) -> dict:
    """Checks that the disk tier measures disk reads and has room; returns what it found.

    Raises:
        DiskTierUnfit: RAM-backed file system, no O_DIRECT, or chunks not a multiple of the block
            size (LMCache would then fall back to buffered I/O and the page cache would serve rereads).
        DiskTierFull: less free space than ``need_bytes``.
    """
    mnt, fstype = mount_of(path)
    block = os.statvfs(path).f_bsize
    free = shutil.disk_usage(path).free
    found = {"path": str(path), "mount": mnt, "fs_type": fstype, "block_size": block, "free_bytes": free,
             "odirect": odirect_works(path, block), "chunk_bytes": chunk_bytes}
    if fstype in ("tmpfs", "ramfs"):
        raise DiskTierUnfit(f"disk tier {path} is on {fstype}: RAM, not a disk; set DISK_TIER_ROOT to a disk path")
    if not found["odirect"]:
        raise DiskTierUnfit(f"O_DIRECT does not work on {fstype} at {path}: rereads would come from the page cache")
    if chunk_bytes % block:
        raise DiskTierUnfit(f"a chunk is {chunk_bytes} bytes, not a multiple of the {block}-byte block size of {path}: "
                            "LMCache would fall back to buffered I/O")
    if free < need_bytes:
        raise DiskTierFull(f"{free / MIB:.0f} MiB free at {path}; the shared context needs {need_bytes / MIB:.0f} MiB")
    return found
