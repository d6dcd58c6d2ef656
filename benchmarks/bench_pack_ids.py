"""Packing a restore's block ids for the copy kernel: each route on the same lists, hot and with the host's
caches scrubbed first (issue 13: section 21's ``pack_ids`` part, 26-44 us at 0.5B 16k-32k on the H200 with
``struct``, f4df).

    python3 benchmarks/bench_pack_ids.py [--ids 1024] [--extra 6] [--trials 300] [--out pack.json]

The ids are ints made once and shuffled (as vLLM's ``KVCacheBlock.block_id`` ints, made when its pool is made),
a restore's ``--ids`` of a request's ``--ids + --extra``. Before each timed call the caches are scrubbed (a walk
over 32 MiB) and then the list is copied, as the connector's ``_follow`` copies the scheduler output's list just
before it packs (``follow``), or the call is made once untimed first (``hot``). Routes:

    struct_slice   the list sliced, the slice packed (``struct``; the connector before 11c0e22)
    struct_whole   the whole list packed, the bytes cut (``fused_copy.pack_ids``; 11c0e22)
    native         ``id_pack.c``'s loop over the wanted ints (``id_pack.pack_ids``), where it could be built
    thread         the list handed to a launch thread that packs it (``LaunchThread.request(..., ids=)``, its
                   launch ``kl_busy_launch`` of 0 ns): the engine thread's time is the request; the thread's
                   packing (from its pack stamp to its launch) is printed beside it as ``thread_pack``
    native_request what the engine thread did before for the same launch: ``native``, the bytes written into the
                   arguments (``fused_copy.write_args``) and a request without ids

Every route's bytes are compared with ``struct_slice``'s (the thread's: the arguments it wrote). Prints medians
(us); asserts no timing.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy  # noqa: E402

from kmesh_lib.kv import fused_copy, id_pack  # noqa: E402
from kmesh_lib.kv.launch_thread import LaunchThread, busy_launch_address  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ids", type=int, default=1024)
    ap.add_argument("--extra", type=int, default=6)
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    n, total = args.ids, args.ids + args.extra
    rng = random.Random(0)
    pool = list(range(1, 50 * total))  # the pool's ints, made once
    rng.shuffle(pool)
    scrub = numpy.zeros(32 * 1024 * 1024 // 8)
    slice_struct = struct.Struct(f"{n}i")
    routes = {"struct_slice": lambda ids: slice_struct.pack(*ids[:n]),
              "struct_whole": lambda ids: fused_copy.pack_ids(ids, 0, n)}
    via = id_pack.pack_via()
    if via.startswith("native"):
        routes["native"] = lambda ids: id_pack.pack_ids(ids, 0, n)
    thread, args_buf = None, None
    if id_pack.pack_into_address() is not None:
        import ctypes

        thread = LaunchThread(busy_launch_address())
        thread.set_pack(id_pack.pack_into_address())
        args_buf = (ctypes.c_int32 * (2 + n))()
        address = ctypes.addressof(args_buf)

        def hand_over(ids):
            return thread.request(0, 0, ids=(ids, 0, n, address, 0))

        view = memoryview(args_buf).cast("B")

        def pack_write_request(ids):
            fused_copy.write_args(view, 0, ids, id_pack.pack_ids(ids, 0, n))
            return thread.request(0, 0)

        routes["thread"], routes["native_request"] = hand_over, pack_write_request
    times = {(r, mode): [] for r in routes for mode in ("hot", "follow")}
    thread_pack = []
    equal = {r: True for r in routes}
    for _ in range(args.trials):
        start = rng.randrange(0, len(pool) - total)
        table = pool[start:start + total]
        want = slice_struct.pack(*table[:n])
        for route, fn in routes.items():
            for mode in ("hot", "follow"):
                scrub[::8] += 1.0
                ids = list(table)  # the connector's copy of the scheduler output's list
                if mode == "hot":
                    fn(ids)
                if thread is not None:
                    thread.wait_for(thread.num_requested)
                t0 = time.perf_counter_ns()
                got = fn(ids)
                times[(route, mode)].append((time.perf_counter_ns() - t0) / 1e3)
                if route in ("thread", "native_request"):  # got: the ticket; the bytes: the arguments written
                    thread.wait_for(got)
                    if route == "thread":
                        thread_pack.append((thread.stamps(got)[0] - thread.packed_at(got)) / 1e3)
                    got = bytes(args_buf)[8:8 + 4 * n]
                equal[route] &= got == want
    out = {"ids": n, "table": total, "trials": args.trials, "pack_via": via, "equal": equal,
           "median_us": {f"{r}/{m}": round(statistics.median(v), 2) for (r, m), v in times.items()}}
    if thread is not None:
        thread.close()
        out["median_us"]["thread_pack"] = round(statistics.median(thread_pack), 2)
    for (route, mode), v in times.items():
        print(f"{route:13s} {mode:6s} median {statistics.median(v):7.2f} us  p90 {numpy.quantile(v, 0.9):7.2f} us"
              f"  bytes equal: {equal[route]}")
    if thread_pack:
        print(f"thread_pack          median {statistics.median(thread_pack):7.2f} us  (on the launch thread)")
    print(f"pack_via: {via}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
