"""What a restore copy graph's launch costs the host, node kind by node kind, without vLLM (issue 13).

    python3 benchmarks/bench_copy_graph_launch.py [--model qwen2.5-0.5b] [--tokens 16384] [--trials 200] [--out f.json]

In section 21 the GPU buffer's copy graph (``kv.copy_graph``: the arguments' host-to-device transfer, a start
event, per layer group the fused copy kernel and an end event) takes 50-60 us of the engine thread to launch at
0.5B 16k, where a graph of three plain kernels launched in 4-5 us in ``bench_launch_interference.py``: a launch
alone would leave the restore near its floor (``report.launch_free_table``). This captures the same copy, with
the section's own ``RowScatter`` over a ``BufferArena`` of the model's shape, in variants that each drop or change
one kind of node, and launches each onto a side stream with ``cuGraphLaunch`` (``copy_graph.DriverLaunch``):

    engine          the arguments' transfer, a timing start event, per group: the kernel, a timing end event
    plain_events    the same with events that keep no timestamps (``enable_timing=False``)
    ends_only       no start event
    no_events       the transfer and the kernels
    no_transfer     events and kernels; the kernels read arguments already on the device
    kernels         the kernels alone
    mapped          events and kernels; the kernels read the pinned host arguments in place (zero-copy)
    mapped_kernels  the kernels alone, reading the pinned host arguments in place
    whole           the engine's composition with one group (section 21's ``gpubuf_retained`` arm)
    engine_runtime  ``engine`` launched by cuda-python's ``cudaGraphLaunch`` (``copy_graph.RuntimeLaunch``)
    replay_driver   ``CopyGraphs.replay`` itself, the ids written as the connector writes them (``packed``), its
                    launcher libcuda's ``cuGraphLaunch`` through ctypes
    replay_runtime  the same through cuda-python's ``cudaGraphLaunch``

Per trial the variants run in a shuffled order; each launch is timed alone (``perf_counter_ns`` around the one
foreign call), the GPU idle (synchronized before) and the host's caches either as the last launch left them
(``hot``) or scrubbed by a pass over 64 MiB and a walk of 100,000 Python objects first (``cold``: the engine's
step evicts the host's caches before a restore). A second pass times each variant's GPU span behind a spin
(CUDA events outside the graph), so a variant that saves host time by reading its arguments over PCIe shows
what it costs the copy. Every variant's last copy is read back and compared with the buffer's rows.

Prints medians; asserts nothing.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_gpubuf_copy import shaped_arena  # noqa: E402  (the same arena as the copy bench's)

_ns = time.perf_counter_ns
SPIN_CYCLES = 2_000_000  # ~1 ms at H200 clocks: the span pass's launches queue behind it
VARIANTS = {  # name: (where the kernels read the arguments, events, grouping)
    "engine": ("transfer", "timing", "layer"),
    "plain_events": ("transfer", "plain", "layer"),
    "ends_only": ("transfer", "ends", "layer"),
    "no_events": ("transfer", "none", "layer"),
    "no_transfer": ("device", "timing", "layer"),
    "kernels": ("device", "none", "layer"),
    "mapped": ("mapped", "timing", "layer"),
    "mapped_kernels": ("mapped", "none", "layer"),
    "whole": ("transfer", "timing", "whole"),
}
ROUTES = ("engine_runtime", "replay_driver", "replay_runtime")  # the engine's composition, launched other ways


class Variant:
    """One captured copy graph of a composition in ``VARIANTS``."""

    def __init__(self, name: str, scatter, groups: list[tuple[int, int]], num_rows: int, stream, pool) -> None:
        import torch

        from kmesh_lib.kv.fused_copy import NUM_HEADER

        self.name = name
        args_at, events, grouping = VARIANTS[name]
        self.args_host = torch.zeros(NUM_HEADER + num_rows, dtype=torch.int32, pin_memory=True)
        self.args_dev = torch.zeros_like(self.args_host, device=scatter.buffer.device)
        self.view = memoryview(self.args_host.numpy()).cast("B")
        timing = events != "plain"
        start = torch.cuda.Event(enable_timing=timing, external=True) if events in ("timing", "plain") else None
        ends = [torch.cuda.Event(enable_timing=timing, external=True) if events != "none" else None
                for _ in (groups if grouping == "layer" else [None])]
        planes = groups if grouping == "layer" else [(0, scatter.num_planes)]
        kernel_args = self.args_host if args_at == "mapped" else self.args_dev
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            self.graph.capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                if args_at == "transfer":
                    self.args_dev.copy_(self.args_host, non_blocking=True)
                if start is not None:
                    start.record(stream)
                for group, end in zip(planes, ends):
                    scatter.launch(kernel_args, num_rows, group)
                    if end is not None:
                        end.record(stream)
            finally:
                self.graph.capture_end()
        self.args_at = args_at
        self.start, self.ends = start, ends  # the graph records these: they must live as long as it
        # as captured (torch's graph handle is gone after instantiation, so the driver is not asked)
        self.num_nodes = ((args_at == "transfer") + (start is not None) + len(planes)
                          + sum(e is not None for e in ends))
        self.exec_handle = None  # the launchers' handles, resolved once outside the timed call
        self.runtime_handle = None

    def write(self, src_row0: int, block_ids: list[int], packed: bytes) -> None:
        from kmesh_lib.kv.fused_copy import write_args

        write_args(self.view, src_row0, block_ids, packed)
        if self.args_at == "device":  # not a restore's route: the ids reach the device outside the timed launch
            self.args_dev.copy_(self.args_host)


class Scrub:
    """Evicts the host's caches the way an engine step does: a pass over a large array, a walk of many objects."""

    def __init__(self) -> None:
        import numpy as np

        self.array = np.ones(64 << 20, dtype=np.uint8)
        self.objects = [{"i": i} for i in range(100_000)]

    def __call__(self) -> int:
        return int(self.array[::64].sum()) + sum(len(o) for o in self.objects)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--tokens", type=int, default=16_384)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--span-trials", type=int, default=30)
    ap.add_argument("--variants", nargs="+", choices=[*VARIANTS, *ROUTES], default=[*VARIANTS, *ROUTES])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--stuck-s", type=float, default=150.0,
                    help="past this, print every thread's stack and exit (a hung copy names itself)")
    args = ap.parse_args(argv)
    faulthandler.dump_traceback_later(args.stuck_s, exit=True)
    t_begin = time.perf_counter()

    def progress(what: str) -> None:
        print(f"[{time.perf_counter() - t_begin:6.1f} s] {what}", flush=True)

    import torch

    from kmesh_lib.base.records import environment
    from kmesh_lib.kv.copy_graph import DriverLaunch, RuntimeLaunch
    from kmesh_lib.kv.fused_copy import pack_ids

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return {}
    progress(f"building the arena ({args.model}, {args.tokens} tokens) and its copy graphs")
    arena, kv, num_rows, num_gpu_blocks = shaped_arena(args.model, args.tokens, "cuda")
    progress(f"arena built: {arena.graph_route}, {arena.copy_route}, layer groups {arena.layer_groups}")
    if arena.graphs is None:
        print(f"no copy graphs: {arena.graph_route} ({arena.copy_route})")
        return {}
    scatter, graphs = arena.scatter, arena.graphs
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    made, errors = {}, {}
    for name in args.variants:
        if name in ROUTES:
            continue
        try:
            made[name] = Variant(name, scatter, arena.plane_groups, num_rows, side, graphs.pool)
        except Exception as e:  # a composition that cannot be captured is reported, never allowed to end the bench
            errors[name] = f"{type(e).__name__}: {e}"[:300]
    side.synchronize()
    progress(f"captured {', '.join(made)}" + (f"; not captured: {', '.join(errors)}" if errors else ""))
    launch = DriverLaunch()
    stream_handle = launch.stream(side)
    try:
        runtime = RuntimeLaunch()
        runtime_stream = runtime.stream(side)
    except Exception as e:  # no cuda-python: the routes through it are not measured
        runtime = None
        errors.update({n: f"no cuda-python runtime launcher: {type(e).__name__}: {e}"[:300]
                       for n in ("engine_runtime", "replay_runtime")})
    engine_graph = made.get("engine") or Variant("engine", scatter, arena.plane_groups, num_rows, side, graphs.pool)
    side.synchronize()
    pool_ids = list(range(1, num_gpu_blocks))
    rng = random.Random(0)
    scrub = Scrub()

    def graph_of(name: str) -> Variant:
        """The captured graph a launch-route name launches (``engine_runtime``: the engine's composition)."""
        return engine_graph if name == "engine_runtime" else made[name]

    def run_once(name: str, block_ids: list[int], packed: bytes) -> int:
        """Writes the arguments, synchronizes, launches; returns the launch's ns (replay_*: the whole replay's)."""
        if name.startswith("replay_"):
            want = launch if name == "replay_driver" else runtime
            if graphs._launch is not want:  # outside the timed call; every instance's handle is resolved anew
                graphs._use(want)
                graphs._stream_handles[side.cuda_stream] = want.stream(side)
            torch.cuda.synchronize()
            t0 = _ns()
            inst = graphs.replay("layer", 0, block_ids, side, packed=packed)
            took = _ns() - t0
            inst.hold([], None)
            return took
        v = graph_of(name)
        v.write(0, block_ids, packed)
        torch.cuda.synchronize()
        if name == "engine_runtime":
            t0 = _ns()
            err = runtime(v.runtime_handle, runtime_stream)
        else:
            t0 = _ns()
            err = launch(v.exec_handle, stream_handle)
        took = _ns() - t0
        if err:
            raise RuntimeError(f"the graph launch of {name}: {err!r}")
        return took

    names = [n for n in args.variants if (n in made or n in ROUTES) and n not in errors]
    for v in {*made.values(), engine_graph}:
        v.exec_handle = launch.handle(v.graph)
        v.runtime_handle = runtime.handle(v.graph) if runtime is not None else None
    first_ids = rng.sample(pool_ids, num_rows)
    for name in names[:]:  # one launch each, alone, before any timing: a variant that fails or hangs names itself
        progress(f"first launch of {name}")
        try:
            run_once(name, first_ids, pack_ids(first_ids))
            torch.cuda.synchronize()
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {e}"[:300]
            names.remove(name)
    launch_ns = {(n, c): [] for n in names for c in ("hot", "cold")}
    last_ids = {}
    for _ in range(args.trials):
        block_ids = rng.sample(pool_ids, num_rows)
        packed = pack_ids(block_ids)
        for cond in ("hot", "cold"):
            order = names[:]
            rng.shuffle(order)
            for name in order:
                if cond == "cold":
                    scrub()
                try:
                    launch_ns[(name, cond)].append(run_once(name, block_ids, packed))
                    last_ids[name] = block_ids
                except Exception as e:
                    errors[name] = f"{type(e).__name__}: {e}"[:300]
                    names.remove(name)
    torch.cuda.synchronize()
    progress(f"launch pass done ({args.trials} trials)")

    spans = {n: [] for n in names}
    for _ in range(args.span_trials):
        block_ids = rng.sample(pool_ids, num_rows)
        packed = pack_ids(block_ids)
        for name in names:
            if name.startswith("replay_"):
                continue  # the engine's graph: its span is ``engine``'s
            v = graph_of(name)
            v.write(0, block_ids, packed)
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(side):
                torch.cuda._sleep(SPIN_CYCLES)
                a.record(side)
            launch(v.exec_handle, stream_handle)
            b.record(side)
            b.synchronize()
            spans[name].append(a.elapsed_time(b) * 1e3)
            last_ids[name] = block_ids

    progress("span pass done")
    equal = {}
    for name in names:  # the last copy of each variant, read back (the pool is zeroed between)
        for t in kv.values():
            t.zero_()
        ids = last_ids[name]
        if name.startswith("replay_"):
            graphs.replay("layer", 0, ids, side, packed=pack_ids(ids)).hold([], None)
        else:
            v = graph_of(name)
            v.write(0, ids, pack_ids(ids))
            launch(v.exec_handle, stream_handle)
        side.synchronize()
        equal[name] = bool(arena.read_back(ids).equal(arena.extent(0, num_rows)))

    def med_us(xs):
        return round(statistics.median(xs) / 1e3, 2) if xs else None

    rows = []
    for name in names:
        rows.append({"variant": name, "composition": VARIANTS.get(name, VARIANTS["engine"]),
                     "num_nodes": made[name].num_nodes if name in made else None,
                     "hot_us": med_us(launch_ns[(name, "hot")]), "cold_us": med_us(launch_ns[(name, "cold")]),
                     "cold_p90_us": round(float(_quantile(launch_ns[(name, "cold")], 0.9)) / 1e3, 2),
                     "span_us": round(statistics.median(spans[name]), 2) if spans.get(name) else None,
                     "equal": equal.get(name)})
    print(f"{args.model} {args.tokens} tokens ({num_rows} blocks, {len(arena.plane_groups)} layer groups), "
          f"{args.trials} trials, medians; launch = the one launch call (replay_*: the whole replay)")
    print(f"{'variant':15} {'nodes':>5} {'hot us':>8} {'cold us':>8} {'cold p90':>9} {'GPU span us':>12}  equal")
    for r in rows:
        nodes = r["num_nodes"] if r["num_nodes"] is not None else "-"
        print(f"{r['variant']:15} {nodes:>5} {r['hot_us']!s:>8} "
              f"{r['cold_us']!s:>8} {r['cold_p90_us']!s:>9} {r['span_us']!s:>12}  {r['equal']}")
    for name, why in errors.items():
        print(f"{name}: not measured: {why}")
    print(f"took {time.perf_counter() - t_begin:.1f} s", flush=True)
    out = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "rows": rows,
           "errors": errors, "launch_via": graphs.launch_via, "layer_groups": arena.layer_groups,
           "launch_ns": {f"{n}/{c}": xs for (n, c), xs in launch_ns.items()}, "environment": environment()}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))
    faulthandler.cancel_dump_traceback_later()
    return out


def _quantile(xs: list[int], q: float) -> float:
    import numpy as np

    return float(np.quantile(xs, q)) if xs else float("nan")


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown (CUDA context, Triton's cache threads)
