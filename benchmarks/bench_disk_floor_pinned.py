"""LMCache's way of reading a context for the disk floor (``kv.floors``: one O_DIRECT file per chunk, its
``disk_io_threads`` continuously in flight) with its reads landing in ordinary pages against pinned host memory, as
LMCache's own reads land (its LocalCPUBackend pool). Prints GB/s (10^9 bytes/s) of each way, the median of
``--repeats``, the ways interleaved within each repeat (``saturated_floor`` with a sweep of those two ways).

Where pinned memory cannot be had (no CUDA: the CPU build), the pinned way is not swept and the reason is printed;
what this machine can time instead is the same reads into buffers the caller gives (``_read_chunks``'s ``buffers``,
the pinned way's path) cut from an unpinned torch tensor, against this module's own mmap pages: the path, not pinning.
Figures only: no timing is asserted.

Defaults: LMCache's 0.5B chunk (256 tokens of Qwen2.5-0.5B's KV, 3 MiB) and the 0.5B 32,512-token context (381 MiB).

    python3 benchmarks/bench_disk_floor_pinned.py [--dir DIR] [--mib 381] [--chunk-mib 3] [--repeats 5] [--device cuda]
"""
from __future__ import annotations

import argparse
import mmap
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kmesh_lib.kv import floors  # noqa: E402
from kmesh_lib.kv.disk_tier import mount_of  # noqa: E402

MIB = 1 << 20


def unpinned_buffers(count: int, size: int) -> list[memoryview]:
    """``_pinned_buffers``'s buffers without the pinning: the same cut (``floors.page_cut_buffers``) of an unpinned
    torch tensor a page longer."""
    import torch

    return floors.page_cut_buffers(torch.empty(count * size + mmap.PAGESIZE, dtype=torch.uint8), count, size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="a directory on the disk to test (default: a temp dir under /tmp)")
    ap.add_argument("--mib", type=int, default=381, help="context bytes in MiB")
    ap.add_argument("--chunk-mib", type=int, default=3, help="one read (one chunk file) in MiB")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda", help="cuda: pinned where CUDA is available; cpu: never pinned")
    args = ap.parse_args()
    nbytes, chunk, depth = args.mib * MIB, args.chunk_mib * MIB, floors.LMCACHE_DISK_IO_THREADS
    sweep = (("chunk_files", depth, "pageable"), ("chunk_files", depth, "pinned"))
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        mnt, fstype = mount_of(root)
        print(f"{nbytes:,} bytes in {-(-nbytes // chunk)} chunk files of {chunk:,}, {depth} in flight, under {root} "
              f"({fstype} at {mnt}), median of {args.repeats} repeats")
        got = floors.saturated_floor("disk", nbytes, chunk, args.repeats, args.device, root, sweep)
        for w in got["sweep"]:
            each = " ".join(f"{got['bytes'] / x / 1e9:.2f}" for x in w["seconds"])
            print(f"  {w['destination']:<9} {got['bytes'] / w['median_s'] / 1e9:6.2f} GB/s   repeats: {each}")
        for w in got.get("not_swept", []):
            print(f"  {w['destination']:<9} not swept: {w['why']}")
        if not got.get("not_swept"):
            return
        files = floors._layout_files(Path(root), nbytes, chunk, "chunk_files")
        given = unpinned_buffers(depth, chunk)
        seconds: dict[str, list[float]] = {"mmap pages (default)": [], "given buffers (unpinned torch)": []}
        try:
            for _ in range(args.repeats):
                seconds["mmap pages (default)"].append(floors._read_chunks(files, nbytes, chunk, depth))
                seconds["given buffers (unpinned torch)"].append(
                    floors._read_chunks(files, nbytes, chunk, depth, buffers=given))
        finally:
            for p in files:
                p.unlink(missing_ok=True)
        print("the pinned way's path without pinning (this machine has none):")
        for name, s in seconds.items():
            each = " ".join(f"{nbytes / x / 1e9:.2f}" for x in s)
            print(f"  {name:<31} {nbytes / statistics.median(s) / 1e9:6.2f} GB/s   repeats: {each}")


if __name__ == "__main__":
    main()
