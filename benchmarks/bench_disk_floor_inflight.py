"""The disk floor's reads, two ways of keeping them in flight: the same bytes in the same chunks, read with O_DIRECT
(``kv.floors._read_chunks``) in lockstep batches (the method of section 21's point floors before 6 Dec 2026: each
batch of ``depth`` reads waits for its slowest before the next starts) and continuously in flight (each of ``depth``
workers takes the next read as soon as its last returns, as LMCache's disk tier does with its ``disk_io_threads``),
at several depths, from one file holding the context and from one file per chunk (LMCache's layout: each read
opens its own file). Prints GB/s (10^9 bytes/s) of each way as the median of ``--repeats``, the ways interleaved
in a new order each repeat; then what ``kv.floors.saturated_floor`` (the sweep section 21 records as its saturated disk
floor) takes in all, files written included, beside the saturated floor it replaced. Figures only: no timing is asserted.

Defaults: LMCache's 7B chunk (256 tokens of Qwen2.5-7B's KV, 14 MiB) and the 7B 16,384-token context (896 MiB).

    python3 benchmarks/bench_disk_floor_inflight.py [--dir DIR] [--mib 896] [--chunk-mib 14] [--repeats 3]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kmesh_lib.kv import floors  # noqa: E402
from kmesh_lib.kv.disk_tier import mount_of  # noqa: E402

MIB = 1 << 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="a directory on the disk to test (default: a temp dir under /tmp)")
    ap.add_argument("--mib", type=int, default=896, help="context bytes in MiB")
    ap.add_argument("--chunk-mib", type=int, default=14, help="one read (one chunk) in MiB")
    ap.add_argument("--depths", default="1,4,8,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sweep-mib", type=int, default=1778,
                    help="context bytes of the saturated_floor timing (default: 7B at 32,512 tokens)")
    args = ap.parse_args()
    nbytes, chunk = args.mib * MIB, args.chunk_mib * MIB
    depths = [int(d) for d in args.depths.split(",")]
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        mnt, fstype = mount_of(root)
        print(f"{nbytes:,} bytes in {-(-nbytes // chunk)} reads of {chunk:,} under {root} ({fstype} at {mnt}), "
              f"median of {args.repeats} repeats")
        files = {layout: floors._layout_files(Path(root), nbytes, chunk, layout) for layout in floors.LAYOUTS}
        ways = [(layout, depth, lockstep) for layout in floors.LAYOUTS for depth in depths
                for lockstep in ((False,) if depth == 1 else (True, False))]
        seconds: dict[tuple, list[float]] = {w: [] for w in ways}
        try:
            shuffle = random.Random(0).shuffle
            for _ in range(args.repeats):
                order = list(ways)
                shuffle(order)  # a new order each repeat: no way always runs right after the same other one
                for layout, depth, lockstep in order:
                    seconds[(layout, depth, lockstep)].append(
                        floors._read_chunks(files[layout], nbytes, chunk, depth, lockstep=lockstep))
        finally:
            for paths in files.values():
                for p in paths:
                    p.unlink(missing_ok=True)
        print(f"{'layout':<12} {'depth':>5} {'in flight':<11} {'GB/s':>6}   repeats (GB/s)")
        for (layout, depth, lockstep), s in seconds.items():
            how = "lockstep" if lockstep else ("one" if depth == 1 else "continuous")
            each = " ".join(f"{nbytes / x / 1e9:.2f}" for x in s)
            print(f"{layout:<12} {depth:>5} {how:<11} {nbytes / statistics.median(s) / 1e9:>6.2f}   {each}")
        sweep_bytes = args.sweep_mib * MIB
        t0 = time.perf_counter()  # the saturated disk floor before the sweep: one file, 8 in lockstep batches
        (path,) = floors._layout_files(Path(root), sweep_bytes, chunk, "one_file")
        try:
            before = [floors._read_chunks(path, sweep_bytes, chunk, 8, lockstep=True) for _ in range(args.repeats)]
        finally:
            path.unlink(missing_ok=True)
        took_before = time.perf_counter() - t0
        print(f"before the sweep (one file, 8 in lockstep batches, {args.repeats} repeats, {sweep_bytes:,} bytes): "
              f"{took_before:.1f} s in all (file written included), "
              f"{sweep_bytes / statistics.median(before) / 1e9:.2f} GB/s")
        t0 = time.perf_counter()
        got = floors.saturated_floor("disk", sweep_bytes, chunk, args.repeats, "cpu", root)
        took = time.perf_counter() - t0
        print(f"saturated_floor('disk', {sweep_bytes:,} bytes, {args.repeats} repeats): {took:.1f} s in all "
              f"(files written included); fastest {got['layout']} at depth {got['queue_depth']}, "
              f"{got['bytes'] / got['median_s'] / 1e9:.2f} GB/s; sweep: "
              + ", ".join(f"{w['layout']}@{w['queue_depth']} {floors.way_destination(w)} "
                          f"{got['bytes'] / w['median_s'] / 1e9:.2f}" for w in got["sweep"])
              + "".join(f"; not swept: {w['layout']}@{w['queue_depth']} {w['destination']} ({w['why']})"
                        for w in got.get("not_swept", [])))


if __name__ == "__main__":
    main()
