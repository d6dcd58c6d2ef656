"""The restore copy as captured CUDA graphs: one host call queues all of it.

On the launch route a restore's copy is the arguments to the device (``RowScatter.prepare``: a transfer
and an event), an event at the copy's start, and a kernel launch and an event per layer group: 5 to 9
CUDA calls, each 8-50 us of host time on a step whose caches the engine's Python has just evicted
(``benchmarks/bench_cuda_host_calls.py``), and the step waits for that host time. Captured once, the
same work is one graph launch; the host first writes the arguments into the graph's own pinned
buffer:

    graph (one per grouping, size bucket and instance)
        args_dev <- args_host            [src_row0, n, block ids...] (``fused_copy``)
        start.record()
        per layer group: scatter_rows over the group's planes, then ends[g].record()

A graph's shapes are fixed when it is captured: the transfer's size and the kernel's grid. So a graph
serves a bucket of row counts (powers of two up to the pool's size; the kernel reads the count and its
programs step over rows), and a restore of n rows replays the smallest bucket that holds n. Groupings:
``"whole"`` (one group, every plane) and ``"layer"`` (the arena's layer groups).

The events are the graph's own (``external``): every replay records the same events again, and a
restore's spans hold them until its timeline is resolved. So each bucket has ``NUM_INSTANCES``
instances; ``replay`` takes one whose last spans are resolved, or whose last copy has ended (it resolves
those spans then, each with its own reference); with none free (several restores of one size in one
step) it returns None and the caller takes the launch route (``RestoreTimeline.copy_launch`` says which).

A graph is launched onto the stream the copy goes to by ``cudaGraphLaunch`` from cuda-python's runtime
bindings (``graph_launcher``), one call with the stream's handle: ``CUDAGraph.replay`` launches onto the
current stream, so a copy on a side stream would switch streams twice around it (``set_stream``, 6-30 us
each on the H200 machine's host, ``benchmarks/bench_cuda_host_calls.py``). Without the bindings, or a
torch without ``raw_cuda_graph_exec``, it is ``replay`` between the switches (``launch_via`` says which).

Invariants: an instance's pinned arguments are rewritten only after its last replay has read them (its
spans are resolved, or its last event has completed; both come after the transfer); capture allocates
nothing (every tensor a graph touches is made before it and lives as long as the graph).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from kmesh_lib.kv.cuda_streams import current_stream, on_stream
from kmesh_lib.kv.fused_copy import NUM_HEADER, RowScatter, write_args
from kmesh_lib.kv.restore_timeline import Span

_ns = time.monotonic_ns

NUM_INSTANCES = 2  # per grouping and bucket: a restore whose predecessor of its size is unresolved still replays


def graph_launcher():
    """(``cudaGraphLaunch``, the runtime module) from cuda-python's bindings, or (None, why)."""
    try:
        from cuda.bindings import runtime
    except ImportError as e:
        return None, f"no cuda.bindings ({e})"
    if not hasattr(torch.cuda.CUDAGraph, "raw_cuda_graph_exec"):
        return None, f"torch {torch.__version__} has no CUDAGraph.raw_cuda_graph_exec"
    return runtime.cudaGraphLaunch, runtime


def size_buckets(max_rows: int) -> list[int]:
    """Powers of two from 1 up to the first that holds ``max_rows``."""
    return [1 << k for k in range(max(0, (max_rows - 1).bit_length()) + 1)]


def bucket_of(num_rows: int, buckets: list[int]) -> int | None:
    """The smallest of ``size_buckets`` that holds ``num_rows`` rows (None: larger than any)."""
    k = max(0, (num_rows - 1).bit_length())
    return buckets[k] if k < len(buckets) else None


@dataclass
class GraphInstance:
    """One captured copy: its graph, its pinned arguments and its events."""

    graph: torch.cuda.CUDAGraph
    args_host: torch.Tensor
    args_dev: torch.Tensor
    args_view: memoryview
    start: torch.cuda.Event
    ends: list[torch.cuda.Event]
    exec_handle: object = None  # the graph's cudaGraphExec_t (cuda-python's), where the launch is direct
    t_ids_written_ns: int = 0  # the last replay had written its arguments (``RestoreTimeline.t_ids_written_ns``)
    pending: list[tuple[Span, tuple]] = field(default_factory=list)  # spans on these events, with their reference

    def free(self) -> bool:
        """Whether a replay may record these events again: the last replay's spans are resolved, or its
        copy has ended (then they are resolved here, before their events move on)."""
        if any(not span.resolved for span, _ in self.pending):
            if not self.ends[-1].query():
                return False
            for span, ref in self.pending:
                span.resolve(ref)
        self.pending.clear()
        return True


class CopyGraphs:
    """Every grouping's graphs, captured from ``scatter``'s compiled kernel.

    Args:
        scatter: the arena's ``RowScatter``, warmed up (its launches are what each graph holds).
        groupings: name -> plane ranges ``[(p0, p1), ...]``, one launch and one end event each.
        max_rows: the most rows a restore copies (default: the pool's size).

    Raises:
        RuntimeError: capture or the check replay failed (the arena keeps the launch route then, and says why).
    """

    def __init__(self, scatter: RowScatter, groupings: dict[str, list[tuple[int, int]]],
                 max_rows: int | None = None) -> None:
        self.scatter = scatter
        self.buckets = size_buckets(max_rows or scatter.max_rows)
        self.groupings = groupings
        self.instances: dict[tuple[str, int], list[GraphInstance]] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self._launch, runtime = graph_launcher()
        if self._launch is None:
            self.launch_via = f"CUDAGraph.replay ({runtime})"
        else:
            self.launch_via = "cudaGraphLaunch (cuda.bindings)"
            self._runtime, self._success = runtime, runtime.cudaError_t.cudaSuccess
        self._stream_handles: dict[int, object] = {}  # a stream's pointer -> its cudaStream_t
        self.capture_stream = torch.cuda.Stream(device=scatter.buffer.device)
        self.capture_stream.wait_stream(current_stream())  # the buffer and the table are written
        for name, groups in groupings.items():
            for bucket in self.buckets:
                self.instances[(name, bucket)] = [self._capture(bucket, groups) for _ in range(NUM_INSTANCES)]
        self.capture_stream.synchronize()
        self._check()

    def _capture(self, bucket: int, groups: list[tuple[int, int]]) -> GraphInstance:
        device = self.scatter.buffer.device
        args_host = torch.zeros(NUM_HEADER + bucket, dtype=torch.int32, pin_memory=True)
        args_dev = torch.zeros(NUM_HEADER + bucket, dtype=torch.int32, device=device)
        start = torch.cuda.Event(enable_timing=True, external=True)
        ends = [torch.cuda.Event(enable_timing=True, external=True) for _ in groups]
        graph = torch.cuda.CUDAGraph()
        stream = self.capture_stream
        with on_stream(stream):
            # thread_local: vLLM's other threads may call CUDA meanwhile; nothing is allocated in here
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                args_dev.copy_(args_host, non_blocking=True)
                start.record(stream)
                for planes, end in zip(groups, ends):
                    self.scatter.launch(args_dev, bucket, planes)
                    end.record(stream)
            finally:
                graph.capture_end()
        exec_handle = None
        if self._launch is not None:
            exec_handle = self._runtime.cudaGraphExec_t(graph.raw_cuda_graph_exec())
        return GraphInstance(graph, args_host, args_dev, memoryview(args_host.numpy()).cast("B"), start, ends,
                             exec_handle)

    def _check(self) -> None:
        """One replay per grouping, of the largest bucket with a single row: buffer row 1 -> vLLM's null
        block (block 0, which no request reads), compared byte for byte."""
        for name in self.groupings:
            inst = self.replay(name, 1, [0], bucket=self.buckets[-1])
            current_stream().synchronize()
            inst.pending.clear()
            if not self.scatter.row_landed(1, 0):
                raise RuntimeError(f"the {name!r} graph's copy into block 0 differs from buffer row 1")

    def replay(self, grouping: str, src_row0: int, block_ids: list[int], stream=None, bucket: int | None = None,
               packed: bytes | None = None) -> GraphInstance | None:
        """Queues the copy of buffer rows ``src_row0 ...`` -> ``block_ids`` on ``stream`` (None: the
        current one): a free instance of the grouping's bucket, its arguments written (``packed``: the ids
        as ``fused_copy.pack_ids`` gives them), launched. None: no instance is free, or the restore is
        larger than every bucket (the caller takes the launch route)."""
        bucket = bucket or bucket_of(len(block_ids), self.buckets)
        for inst in self.instances.get((grouping, bucket), ()):
            if inst.free():
                write_args(inst.args_view, src_row0, block_ids, packed)
                inst.t_ids_written_ns = _ns()
                self.launch_on(inst, stream)
                return inst
        return None

    def launch_on(self, inst: GraphInstance, stream) -> None:
        """Launches ``inst``'s graph onto ``stream`` (None: the current one), its arguments already written."""
        if self._launch is None:
            with on_stream(stream):
                inst.graph.replay()
            return
        stream = stream or current_stream()
        handle = self._stream_handles.get(stream.cuda_stream)
        if handle is None:
            handle = self._stream_handles[stream.cuda_stream] = self._runtime.cudaStream_t(stream.cuda_stream)
        err, = self._launch(inst.exec_handle, handle)
        if err != self._success:
            raise RuntimeError(f"cudaGraphLaunch of a restore copy failed: {err!r}")

    def describe(self) -> dict:
        return {"groupings": {name: len(groups) for name, groups in self.groupings.items()},
                "buckets": [self.buckets[0], self.buckets[-1]], "instances_per_bucket": NUM_INSTANCES,
                "num_graphs": sum(len(v) for v in self.instances.values()), "launch_via": self.launch_via}
