"""What each CUDA call a GPU-buffer restore makes costs the host, hot and between steps (issue 13).

    python3 benchmarks/bench_cuda_host_calls.py [--out calls.json] [--repeats 400]   (PYTHONPATH at the repo root)

A restore's ``host`` and ``measure`` parts (``kv.restore_timeline``) are Python calls into torch's CUDA
bindings on the engine thread: finding the current stream, querying it, recording and waiting on events,
switching streams. On the H200 machine section 21 recorded 30-70 us for ``measure`` alone (the current
stream and one ``query``; the stream idle in every restore) and 90-200 us for three layer waits. This
times each call on its own, two ways, ``--repeats`` times each:

    hot      back to back (the call's cost with warm caches)
    step     after about 1 ms of Python that walks 4 MiB of objects, as vLLM's scheduler does between a
             restore's calls (the cost a call pays with the host's caches cold)

and prints the median and 90th percentile in microseconds. Every call is on an idle stream (events
already done), as in a restore. Then a whole restore copy of 1,024 blocks of the Qwen2.5-0.5B shape
(``BufferArena.copy_into_vllm``, whole and by 3 layer groups), on the launch route and as one launch
of a captured graph (``kv.copy_graph``: ``cudaGraphLaunch`` onto the copy's stream where cuda-python's
bindings are, else ``replay``), the stream synchronized before each (untimed). Prints
figures; asserts nothing. Without CUDA it says so and exits.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy
import torch

_ns = time.perf_counter_ns


def _calls() -> dict:
    from kmesh_lib.kv.cuda_streams import current_stream, on_stream

    side = torch.cuda.Stream()
    done = torch.cuda.Event(enable_timing=True)
    done.record(current_stream())
    torch.cuda.synchronize()
    stream = current_stream()

    def event_record_current():
        torch.cuda.Event(enable_timing=True).record(current_stream())

    def stream_ctx():
        with torch.cuda.stream(side):
            pass

    def on_side():
        with on_stream(side):
            pass

    return {
        "torch.cuda.current_stream()": torch.cuda.current_stream,
        "vllm current_stream()": current_stream,
        "stream.query() (idle)": stream.query,
        "Event(enable_timing) + record(None)": lambda: torch.cuda.Event(enable_timing=True).record(),
        "Event(enable_timing) + record(current_stream())": event_record_current,
        "event.query() (done)": done.query,
        "event.synchronize() (done)": done.synchronize,
        "stream.wait_event(done)": lambda: stream.wait_event(done),
        "side.wait_stream(current)": lambda: side.wait_stream(stream),
        "with torch.cuda.stream(side)": stream_ctx,
        "with on_stream(side) (set_stream twice)": on_side,
        "time.monotonic_ns()": time.monotonic_ns,
    }


def _restore_copies(tmp: str) -> dict:
    """name -> (call, before): one restore copy per call, ``before`` (untimed) empties the stream."""
    from kmesh_lib.kv.gpu_buffer_arena import BufferArena
    from kmesh_lib.kv.restore_timeline import RestoreTimeline

    num_blocks, num_rows = 2049, 1024  # Qwen2.5-0.5B: 24 layers, 2 KV heads of 64, bf16, 16-token blocks
    kv = {f"l{i}": torch.zeros(2, num_blocks, 16, 2, 64, dtype=torch.bfloat16, device="cuda") for i in range(24)}
    arena = BufferArena(kv, num_blocks, num_rows + 8, tmp)
    graphs = arena.graphs
    block_ids = list(range(num_blocks - 1, num_blocks - 1 - num_rows, -1))
    out = {}
    if graphs is not None:
        out.update(_graph_parts(arena, block_ids))
    for route, use in (("launches", None), ("one graph launch", graphs)):
        for name, by_layer in (("whole", False), (f"{len(arena.plane_groups)} layer groups", True)):
            def call(use=use, by_layer=by_layer):
                arena.graphs = use
                arena.copy_into_vllm(0, 0, block_ids, RestoreTimeline("restore", "r", 0, "buffer", num_rows, 0, "cuda"),
                                     by_layer=by_layer)
            out[f"restore copy, {route} ({name}, {num_rows:,} blocks)"] = (call, torch.cuda.synchronize)
    return out


def _graph_parts(arena, block_ids: list[int]) -> dict:
    """The graph route's parts one by one, and graphs of one kind of node each (what a node costs a replay)."""
    from kmesh_lib.kv.copy_graph import bucket_of, graph_launchers
    from kmesh_lib.kv.cuda_streams import current_stream, on_stream
    from kmesh_lib.kv.fused_copy import pack_ids, write_args

    graphs, n = arena.graphs, len(block_ids)
    packed = pack_ids(block_ids)
    bucket = bucket_of(n, graphs.buckets)
    whole, layer = graphs.instances[("whole", bucket)][0], graphs.instances[("layer", bucket)][0]
    side = torch.cuda.Stream()
    made = torch.cuda.Event(enable_timing=True)
    made.record(current_stream())

    def single(kind: str):
        g = torch.cuda.CUDAGraph()
        events = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(4)]
        stream = graphs.capture_stream
        with on_stream(stream):
            g.capture_begin(pool=graphs.pool, capture_error_mode="thread_local")
            if kind == "memcpy":
                whole.args_dev.copy_(whole.args_host, non_blocking=True)
            elif kind == "kernel":
                graphs.scatter.launch(whole.args_dev, bucket)
            else:
                for e in events:
                    e.record(stream)
            g.capture_end()
        return g, events

    def replay_on_side():
        with on_stream(side):
            layer.graph.replay()

    out = {"Event made once, record(current_stream())": (lambda: made.record(current_stream()), None),
           f"copy graph part: write_args ({n:,} ids)": (lambda: write_args(whole.args_view, 0, block_ids), None),
           f"copy graph part: write_args, ids packed ahead ({n:,} ids)":
               (lambda: write_args(whole.args_view, 0, block_ids, packed), None),
           f"pack_ids ({n:,} ids; the connector's scheduler side)": (lambda: pack_ids(block_ids), None),
           "copy graph part: instance free() (nothing pending)": (whole.free, None),
           "copy graph part: replay() (whole: memcpy, 2 events, 1 kernel)": (whole.graph.replay, torch.cuda.synchronize),
           f"copy graph part: replay() ({len(layer.ends)} groups: memcpy, {len(layer.ends) + 1} events, "
           f"{len(layer.ends)} kernels)": (layer.graph.replay, torch.cuda.synchronize),
           "copy graph part: on_stream(side) + replay() (groups)": (replay_on_side, torch.cuda.synchronize)}
    for launch in graph_launchers()[0]:  # each direct launcher this process has (the arena uses the first)
        handle, stream = launch.handle(layer.graph), launch.stream(side)
        out[f"copy graph part: launch onto side ({launch.label}) (groups)"] = (
            lambda launch=launch, handle=handle, stream=stream: launch(handle, stream), torch.cuda.synchronize)
    for kind in ("memcpy", "kernel", "4 events"):
        g, events = single(kind)
        # the events a graph records must live as long as it does: the call holds them
        out[f"graph of one kind: replay() ({kind})"] = (lambda g=g, events=events: g.replay(), torch.cuda.synchronize)
    return out


def _evict(objects: list) -> int:
    """About 1 ms of Python touching every object (the scheduler's work between two restore calls)."""
    total = 0
    for o in objects:
        total += o[0]
    return total


def measure(repeats: int) -> list[dict]:
    import tempfile

    objects = [[i, str(i)] for i in range(40_000)]  # ~4 MiB of small objects
    rows = []
    calls = {name: (call, None) for name, call in _calls().items()}
    tmp = tempfile.TemporaryDirectory()
    calls.update(_restore_copies(tmp.name))
    for name, (call, before) in calls.items():
        for _ in range(20):
            call()
        hot, step = [], []
        for _ in range(repeats):
            if before:
                before()
            t0 = _ns()
            call()
            hot.append((_ns() - t0) / 1e3)
        for _ in range(repeats):
            if before:
                before()
            _evict(objects)
            t0 = _ns()
            call()
            step.append((_ns() - t0) / 1e3)
        torch.cuda.synchronize()
        rows.append({"call": name, "hot_p50_us": float(numpy.quantile(hot, 0.5)),
                     "hot_p90_us": float(numpy.quantile(hot, 0.9)), "step_p50_us": float(numpy.quantile(step, 0.5)),
                     "step_p90_us": float(numpy.quantile(step, 0.9))})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeats", type=int, default=400)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to time")
        return
    rows = measure(args.repeats)
    print(f"{'call':58s} {'hot p50':>8s} {'p90':>8s} {'step p50':>9s} {'p90':>8s}  (us)")
    for r in rows:
        print(f"{r['call']:58s} {r['hot_p50_us']:8.1f} {r['hot_p90_us']:8.1f} {r['step_p50_us']:9.1f} {r['step_p90_us']:8.1f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
    os._exit(0)
