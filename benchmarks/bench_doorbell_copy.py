"""A restore's copy queued ahead, behind a doorbell: what it costs the engine thread, and what it must never meet.

    python3 benchmarks/bench_doorbell_copy.py [--trials 200] [--mib 192] [--out f.json]   (CUDA; PYTHONPATH at the root)

At 0.5B 16k the GPU buffer's least-adding restore costs its step about 0.06 ms for the copy graph's launch on
the engine thread, and handing the launch to another thread moves that cost instead of removing it
(docs/notes/gpu-restore-paths.md, 3 Dec). A launch made *before* the restore, between steps, would leave the
engine thread only a store: the copy's graph is queued on a stream of its own behind ``cuStreamWaitValue32`` on a
word of mapped pinned host memory (the doorbell); the restore writes the graph's arguments and then the word,
and the GPU's front end, polling it, runs the copy. This measures, on a copy of ``--mib`` (192 MiB: 0.5B 16k)
in a captured graph shaped like section 21's (the arguments' transfer, a start event, the copy, an end event):

- the engine thread's cost of the restore: ``launch`` (arguments written, ``cuGraphLaunch``) against ``doorbell``
  (arguments written, one store); and the arming's own cost (the wait and the launch, made between steps);
- how long after that the copy ends (host wall time to the end event's completion, less the copy's own GPU span:
  the queueing delay, the doorbell's polling included);
- what an armed stream blocks, each under a watchdog that rings the doorbell after ``--watchdog-s``: work and a
  stream synchronize on the default stream, a ``.cpu()`` copy, work on a new stream, a query of the armed end event,
  and a device-wide ``torch.cuda.synchronize()`` (which must wait for the armed stream: any such call while armed
  would hang); ``--armed`` says what waits behind the doorbell: the copy's graph, nothing, or one plain kernel
  (on the H200, 3 Dec, with the graph behind it, the other streams' kernels waited too).

Prints the medians and the blocking table; asserts nothing.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_ns = time.monotonic_ns
CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_DEVICEMAP = 0x01, 0x02
CU_STREAM_WAIT_VALUE_GEQ = 0x0


class Doorbell:
    """One word of mapped pinned host memory the GPU waits on (``cuStreamWaitValue32``, GEQ) and the host rings."""

    def __init__(self) -> None:
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.host = ctypes.c_void_p()
        self._check(self.cuda.cuMemHostAlloc(ctypes.byref(self.host), ctypes.c_size_t(4096),
                                             ctypes.c_uint(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP)),
                    "cuMemHostAlloc")
        self.dev = ctypes.c_uint64()
        self._check(self.cuda.cuMemHostGetDevicePointer_v2(ctypes.byref(self.dev), self.host, ctypes.c_uint(0)),
                    "cuMemHostGetDevicePointer")
        self.word = ctypes.c_uint32.from_address(self.host.value)
        self.word.value = 0
        wait = getattr(self.cuda, "cuStreamWaitValue32_v2", None) or self.cuda.cuStreamWaitValue32
        wait.argtypes, wait.restype = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint), ctypes.c_int
        self._wait = wait
        self.seq = 0

    @staticmethod
    def _check(err: int, what: str) -> None:
        if err:
            raise RuntimeError(f"{what} failed: CUresult {err}")

    def arm(self, stream) -> int:
        """Queues a wait for the next ring on ``stream``; returns the value that will release it."""
        self.seq += 1
        self._check(self._wait(stream.cuda_stream, self.dev.value, self.seq, CU_STREAM_WAIT_VALUE_GEQ),
                    "cuStreamWaitValue32")
        return self.seq

    def ring(self, value: int) -> None:
        self.word.value = value


def stream_flags(stream) -> int | None:
    cuda = ctypes.CDLL("libcuda.so.1")
    flags = ctypes.c_uint()
    return flags.value if cuda.cuStreamGetFlags(ctypes.c_void_p(stream.cuda_stream), ctypes.byref(flags)) == 0 else None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--mib", type=int, default=192)
    ap.add_argument("--idle-ms", type=float, default=2.0, help="between arming and the ring (the GPU waits)")
    ap.add_argument("--watchdog-s", type=float, default=1.0)
    ap.add_argument("--armed", nargs="+", choices=("graph", "wait", "kernel"), default=["graph", "wait", "kernel"],
                    help="what waits behind the doorbell in the blocking probes")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    import torch

    from kmesh_lib.base.records import environment
    from kmesh_lib.kv.copy_graph import DriverLaunch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return {}
    dev = torch.device("cuda")
    n = args.mib << 20
    src = torch.empty(n, dtype=torch.uint8, device=dev).random_(0, 255)
    dst = torch.empty_like(src)
    args_host = torch.zeros(2 + 1024, dtype=torch.int32, pin_memory=True)
    args_dev = torch.zeros_like(args_host, device=dev)
    start, end = (torch.cuda.Event(enable_timing=True, external=True) for _ in range(2))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        graph.capture_begin(capture_error_mode="thread_local")
        args_dev.copy_(args_host, non_blocking=True)
        start.record(side)
        dst.copy_(src)
        end.record(side)
        graph.capture_end()
    side.synchronize()
    launch = DriverLaunch()
    exec_handle, stream_handle = launch.handle(graph), launch.stream(side)
    bell = Doorbell()
    view = args_host.numpy()
    ids = list(range(1024))

    def write_args(k: int) -> None:
        view[0], view[1] = k, len(ids)
        view[2:] = ids

    side_work = torch.ones(1 << 20, device=dev)

    def arm(kind: str) -> int:
        """What is queued on the side stream: the wait and the copy's graph (``graph``), the wait alone
        (``wait``), or the wait and one plain kernel launched onto the stream (``kernel``)."""
        value = bell.arm(side)
        if kind == "graph":
            launch(exec_handle, stream_handle)
        elif kind == "kernel":
            with torch.cuda.stream(side):
                side_work.mul_(1.0)
        return value

    rows = {"launch": [], "doorbell": []}
    arm_ns = []
    for k in range(args.trials):
        for route in (("launch", "doorbell") if k % 2 else ("doorbell", "launch")):
            if route == "doorbell":
                t = _ns()
                value = arm("graph")
                arm_ns.append(_ns() - t)
            time.sleep(args.idle_ms / 1e3)
            t0 = _ns()
            write_args(k)
            if route == "launch":
                launch(exec_handle, stream_handle)
            else:
                bell.ring(value)
            t1 = _ns()
            end.synchronize()
            t2 = _ns()
            span_ms = start.elapsed_time(end)
            rows[route].append({"engine_us": (t1 - t0) / 1e3, "to_end_us": (t2 - t1) / 1e3, "copy_us": 1e3 * span_ms})

    def med(route, key):
        return round(statistics.median(r[key] for r in rows[route]), 2)

    summary = {route: {"engine_us": med(route, "engine_us"), "to_end_us": med(route, "to_end_us"),
                       "copy_us": med(route, "copy_us"),
                       "queue_us": round(statistics.median(r["to_end_us"] - r["copy_us"] for r in rows[route]), 2)}
               for route in rows}
    summary["arm_us"] = round(statistics.median(arm_ns) / 1e3, 2)
    print(f"copy of {args.mib} MiB, {args.trials} trials per route, medians (us):")
    print("route     engine thread   ring/launch -> end   copy's own span   queueing (the difference)")
    for route in rows:
        s = summary[route]
        print(f"{route:9} {s['engine_us']:13.2f}   {s['to_end_us']:18.2f}   {s['copy_us']:15.2f}   {s['queue_us']:10.2f}")
    print(f"arming (cuStreamWaitValue32 + cuGraphLaunch, between steps): {summary['arm_us']:.2f} us")

    def blocked(what: str, fn, kind: str) -> dict:
        value = arm(kind)
        time.sleep(0.005)
        timer = threading.Timer(args.watchdog_s, bell.ring, (value,))
        timer.start()
        t = _ns()
        result = fn()
        took = (_ns() - t) / 1e9
        timer.cancel()
        bell.ring(value)
        side.synchronize()
        out = {"armed": kind, "what": what, "took_s": round(took, 4), "blocked": took >= 0.9 * args.watchdog_s}
        if result is not None:
            out["result"] = result
        return out

    small = torch.ones(1 << 20, device=dev)
    probes = [("default stream: a kernel, then that stream's synchronize",
               lambda: (small.mul_(1.0), torch.cuda.current_stream().synchronize()) and None),
              ("default stream: .cpu() of a device tensor", lambda: small[:4].cpu().tolist()),
              ("a new stream's work and synchronize", lambda: _other_stream(small)),
              ("torch.cuda.synchronize() (device-wide)", lambda: torch.cuda.synchronize())]
    cases = []
    for kind in args.armed:
        cases += [blocked(what, fn, kind) for what, fn in probes]
        if kind == "graph":
            cases.append(blocked("the armed end event's query", lambda: end.query(), kind))
    print("while the side stream waits on the doorbell (watchdog rings after", args.watchdog_s, "s):")
    for c in cases:
        print(f"  {c['armed']:6} {'BLOCKED' if c['blocked'] else 'free   '} {c['took_s']:8.4f} s  {c['what']}"
              + (f" -> {c['result']}" if "result" in c else ""))
    out = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
           "summary": summary, "blocking": cases,
           "side_stream_flags": stream_flags(side), "default_stream_flags": stream_flags(torch.cuda.current_stream()),
           "rows": rows, "environment": environment()}
    print(f"side stream flags {out['side_stream_flags']} (1: non-blocking), default stream {out['default_stream_flags']}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    return out


def _other_stream(t):
    import torch

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t.add_(0.0)
    s.synchronize()


if __name__ == "__main__":
    import os

    main()
    sys.stdout.flush()
    os._exit(0)
