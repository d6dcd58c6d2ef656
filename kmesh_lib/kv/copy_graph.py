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

A graph is launched onto the stream the copy goes to by one foreign call with the stream's handle
(``graph_launchers``): ``cuGraphLaunch`` from libcuda through ctypes, else ``cudaGraphLaunch`` from
cuda-python's runtime bindings. Interleaved on one H200 host, without vLLM, 100 trials each
(``benchmarks/bench_copy_graph_launch.py``, 3 Dec, f59d410): the layered graph's launch alone 17.7 / 51.3 us
(hot / cold host caches) through ctypes against 28.1 / 63.2 through the bindings, and ``replay`` 29.9 / 77.5
against 41.3 / 86.9; in section 21 the layered arm's launch part fell from 0.061 to 0.047 ms at 0.5B 16k (882c,
3c12). Two earlier sessions' benches in a live engine, not interleaved, had the two within their noise.
``CUDAGraph.replay`` launches onto the current stream, so a copy on a side stream would switch streams twice
around it (``set_stream``, 6-30 us each there); it is the route of last resort (``launch_via`` says which was
taken: the first whose check replay landed, ``_check``).

A replay onto a stream the engine thread queues nothing else on (the layer-wait route's side stream) may be
handed to a native launch thread instead (``handoff``; ``kv.launch_thread``): the engine thread writes the
arguments and queues a request, and the thread makes the launch on its own core. Such an instance carries the
request's ``ticket``; nothing reads its events before ``await_launches`` has seen that launch made.

The thread also watches each handed-off copy's last event and counts the copies it has seen end
(``copy_ended``: a counter read), so the forward pass's first layer wait needs no event query of its own
where the copy has ended; ``watch_via`` says whether it does (its check: the thread saw each check copy end).

Where the thread has a packer (``id_pack.pack_into_address``), a handed-off restore whose ids come as an
``IdRange`` (not read yet) has the thread write its arguments too: the engine thread hands over the request's block
table and reads none of its ints (``LaunchThread.request(..., ids=)``).

Invariants: an instance's pinned arguments are rewritten (by the engine thread, or by the launch thread for ids
handed over) only after its last replay has read them (its launch has been made, and its spans are resolved or its
last event has completed; both come after the transfer); no event of a handed-off replay is waited on, queried or
timed before its launch is made (``await_launches``); capture allocates nothing (every tensor a graph touches is
made before it and lives as long as the graph).
"""
from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field

import torch

from kmesh_lib.kv import id_pack
from kmesh_lib.kv.cuda_streams import current_stream, on_stream
from kmesh_lib.kv.fused_copy import NUM_HEADER, RowScatter, write_args
from kmesh_lib.kv.id_pack import IdRange
from kmesh_lib.kv.launch_thread import ARGS_HEADER, LaunchThread, LaunchThreadError
from kmesh_lib.kv.restore_timeline import Span

_ns = time.monotonic_ns

NUM_INSTANCES = 2  # per grouping and bucket: a restore whose predecessor of its size is unresolved still replays
WATCH_CHECK_S = 0.5  # the launch thread must see a check copy end this soon after it ended, or watching is off


class DriverLaunch:
    """``cuGraphLaunch`` from libcuda by ctypes: one foreign call with the two handles as ints, the GIL held
    (a ``PyDLL`` function: the call queues work and returns, and the engine thread keeps the GIL it would
    otherwise hand back and wait for). Runtime and driver handles are the same pointers."""

    label = "cuGraphLaunch (libcuda, ctypes)"

    def __init__(self) -> None:
        fn = ctypes.PyDLL("libcuda.so.1").cuGraphLaunch
        fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_void_p), ctypes.c_int
        self._fn = fn

    def handle(self, graph) -> int:
        return graph.raw_cuda_graph_exec()

    def stream(self, stream) -> int:
        return stream.cuda_stream

    def __call__(self, exec_handle, stream_handle) -> int:
        return self._fn(exec_handle, stream_handle)


class RuntimeLaunch:
    """``cudaGraphLaunch`` from cuda-python's runtime bindings (their handle types; 0 or the error)."""

    label = "cudaGraphLaunch (cuda.bindings)"

    def __init__(self) -> None:
        from cuda.bindings import runtime

        self._runtime, self._fn, self._success = runtime, runtime.cudaGraphLaunch, runtime.cudaError_t.cudaSuccess

    def handle(self, graph):
        return self._runtime.cudaGraphExec_t(graph.raw_cuda_graph_exec())

    def stream(self, stream):
        return self._runtime.cudaStream_t(stream.cuda_stream)

    def __call__(self, exec_handle, stream_handle):
        err, = self._fn(exec_handle, stream_handle)
        return 0 if err == self._success else err


def graph_launchers() -> tuple[list, list[str]]:
    """The direct launchers this process can make, preferred first, and why each other one is missing."""
    if not hasattr(torch.cuda.CUDAGraph, "raw_cuda_graph_exec"):
        return [], [f"torch {torch.__version__} has no CUDAGraph.raw_cuda_graph_exec"]
    made, missing = [], []
    for kind in (DriverLaunch, RuntimeLaunch):
        try:
            made.append(kind())
        except (ImportError, OSError, AttributeError) as e:
            missing.append(f"no {kind.label} ({e})")
    return made, missing


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
    exec_handle: object = None  # the graph's executable as the launcher takes it, where the launch is direct
    exec_ptr: int = 0  # the graph's executable as a pointer, for the launch thread
    args_ptr: int = 0  # the pinned arguments' address, where the launch thread packs handed-over ids
    end_ptr: int = 0  # the last end event as a pointer: the launch thread watches it for the copy's end
    ticket: int = 0  # the launch thread's ticket of the last replay handed to it (0: none)
    t_ids_written_ns: int = 0  # the last replay had written its arguments (``RestoreTimeline.t_ids_written_ns``)
    pending: list[Span] = field(default_factory=list)  # the last replay's spans on these events (``hold``)
    pending_ref: tuple | None = None  # ... and the reference that puts them on the clock

    def hold(self, spans: list[Span], ref: tuple | None) -> None:
        """The last replay's spans (one restore's: its copy first, then its groups' ends) and its reference."""
        self.pending, self.pending_ref = spans, ref

    def free(self) -> bool:
        """Whether a replay may record these events again: the last replay's spans are resolved, or its
        copy has ended (then they are resolved here, before their events move on). The spans are one
        restore's: its copy, first, and its groups' ends, which its timeline resolves together with the copy
        (the step's other restores share those span objects); a group end no timeline took (a group the forward
        pass never waited for) is read by nobody. So the first one stands for all."""
        pending = self.pending
        if pending and not pending[0].resolved:
            if not self.ends[-1].query():
                return False
            for span in pending:
                span.resolve(self.pending_ref)
        self.pending = []
        return True


class CopyGraphs:
    """Every grouping's graphs, captured from ``scatter``'s compiled kernel.

    Args:
        scatter: the arena's ``RowScatter``, warmed up (its launches are what each graph holds).
        groupings: name -> plane ranges ``[(p0, p1), ...]``, one launch and one end event each.
        max_rows: the most rows a restore copies (default: the pool's size).

    The native launch thread for handed-off replays starts on first use (``start_thread``, between steps): an
    engine whose restores are all launched by its own thread keeps every CPU and runs no poller.

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
        self._launch = None  # a direct launcher (``graph_launchers``), once one passed the check
        self._stream_handles: dict[int, object] = {}  # a stream's pointer -> the launcher's handle of it
        self.thread: LaunchThread | None = None  # the native launch thread for handed-off replays
        self.thread_via = "off (not started: no restore was handed off)"
        self.watching = False  # the launch thread watches handed-off copies' ends, and passed its check
        self.watch_via = "off (no launch thread)"
        self.last_ticket = 0  # the last handed-off replay's ticket
        self.capture_stream = torch.cuda.Stream(device=scatter.buffer.device)
        self.capture_stream.wait_stream(current_stream())  # the buffer and the table are written
        for name, groups in groupings.items():
            for bucket in self.buckets:
                self.instances[(name, bucket)] = [self._capture(bucket, groups) for _ in range(NUM_INSTANCES)]
        self.capture_stream.synchronize()
        launchers, missing = graph_launchers()
        for launch in launchers:
            self._use(launch)
            try:
                self._check()
                self.launch_via = launch.label
                break
            except RuntimeError as e:  # the next launcher, and this one's failure in launch_via
                missing.append(f"{launch.label} failed its check ({e})")
        else:
            self._use(None)
            self._check()
            self.launch_via = f"CUDAGraph.replay ({'; '.join(missing)})"
            self.thread_via = "off (no direct launcher: the graph's executable handle is not available)"

    def start_thread(self) -> bool:
        """Starts the launch thread once (later calls answer at once), kept only if a direct launcher passed its
        check and a handed-off replay of every grouping lands (``_check``); ``thread_via`` says whether, or why
        not. Returns whether there is one. Call between steps: the check replays and waits on the GPU."""
        if self.thread is not None or not self.thread_via.startswith("off (not started"):
            return self.thread is not None
        if self._launch is None:
            self.thread_via = "off (no direct launcher: the graph's executable handle is not available)"
            return False
        try:
            self.thread = LaunchThread.for_cuda()
            # the thread writes the header the kernel reads; None (no native packer): the engine thread packs
            self.thread.set_pack(id_pack.pack_into_address() if ARGS_HEADER == NUM_HEADER else None)
            self.watching = True
            self._check(handoff=True)
            if self.watching:
                self.watch_via = "on (the launch thread queries each copy's last event: LaunchThread.copy_ended)"
            packs = "; it packs handed-over block ids" if self.thread.packs_ids else ""
            self.thread_via = (f"on (cuGraphLaunch on a native thread {self.thread.placement()}, kv.launch_thread"
                               f"{packs})")
        except (LaunchThreadError, RuntimeError, OSError) as e:
            self.close()
            self.thread_via = f"off ({e})"
        return self.thread is not None

    def _use(self, launch) -> None:
        self._launch, self._stream_handles = launch, {}
        for instances in self.instances.values():
            for inst in instances:
                inst.exec_handle = None if launch is None else launch.handle(inst.graph)
                inst.exec_ptr = 0 if launch is None else inst.graph.raw_cuda_graph_exec()

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
        # cuda_event: the driver's handle, made at the first record (the capture's)
        return GraphInstance(graph, args_host, args_dev, memoryview(args_host.numpy()).cast("B"), start, ends,
                             end_ptr=ends[-1].cuda_event, args_ptr=args_host.data_ptr())

    def _check(self, handoff: bool = False) -> None:
        """One replay per grouping, of the largest bucket with a single row: buffer row 1 -> vLLM's null
        block (block 0, which no request reads), compared byte for byte; ``handoff``: launched by the thread,
        onto the capture stream (a stream the engine thread queues nothing on meanwhile)."""
        for name in self.groupings:
            self.scatter.unlike_row(1, 0)
            stream = self.capture_stream if handoff else None
            if stream is not None:
                stream.wait_stream(current_stream())  # the block's flipped bytes
            ids = IdRange([0], 0, 1) if handoff and self.thread.packs_ids else [0]  # the thread packs, as it will
            inst = self.replay(name, 1, ids, stream=stream, bucket=self.buckets[-1], handoff=handoff)
            if handoff and not inst.ticket:
                raise RuntimeError(f"the {name!r} graph's check replay was not handed to the launch thread")
            self.await_launches()
            (stream or current_stream()).synchronize()
            inst.hold([], None)
            if not self.scatter.row_landed(1, 0):
                raise RuntimeError(f"the {name!r} graph's copy into block 0 differs from buffer row 1")
            if handoff:
                self._check_watch(inst.ticket)

    def _check_watch(self, ticket: int) -> None:
        """After a handed-off check replay ended: the thread sees its copy end within ``WATCH_CHECK_S``, or
        ``watch_via`` says why not (the engine thread then queries every copy's end itself, as before)."""
        deadline = time.monotonic() + WATCH_CHECK_S
        while not self.thread.copy_ended(ticket) and time.monotonic() < deadline:
            time.sleep(1e-4)
        if self.watching and not self.thread.copy_ended(ticket):
            self.watching = False
            self.watch_via = (f"off (the launch thread did not see a check copy end in {WATCH_CHECK_S} s; "
                              f"watch error {self.thread.watch_error})")

    def replay(self, grouping: str, src_row0: int, block_ids: list[int] | IdRange, stream=None,
               bucket: int | None = None, packed: bytes | None = None, handoff: bool = False) -> GraphInstance | None:
        """Queues the copy of buffer rows ``src_row0 ...`` -> ``block_ids`` on ``stream`` (None: the
        current one): a free instance of the grouping's bucket, its arguments written (``packed``: the ids
        as ``fused_copy.pack_ids`` gives them), launched; ``handoff`` (with a launch thread, onto a side
        ``stream`` only): the launch is requested from the thread (``inst.ticket``), and ids given as an
        ``IdRange`` are packed by the thread into the instance's arguments (``t_ids_written_ns`` then stamps
        the hand-over); elsewhere an ``IdRange`` is read here. None: no instance is free, or the restore is larger
        than every bucket (the caller takes the launch route)."""
        bucket = bucket or bucket_of(len(block_ids), self.buckets)
        thread = self.thread
        for inst in self.instances.get((grouping, bucket), ()):
            if inst.ticket and inst.ticket > thread.num_launched:
                continue  # its last launch is not made yet: its arguments may not have been read
            if inst.free():
                handed = handoff and thread is not None and stream is not None
                if handed and type(block_ids) is IdRange and thread.packs_ids:
                    ids = (block_ids.table, block_ids.first, block_ids.num, inst.args_ptr, src_row0)
                    inst.t_ids_written_ns = _ns()
                    inst.ticket = self.last_ticket = thread.request(inst.exec_ptr, stream.cuda_stream, inst.end_ptr,
                                                                    ids)
                    return inst
                if type(block_ids) is IdRange:  # read here: packed once (the arguments need its length besides)
                    packed = packed or block_ids.packed()
                write_args(inst.args_view, src_row0, block_ids, packed)
                inst.t_ids_written_ns = _ns()
                if handed:
                    inst.ticket = self.last_ticket = thread.request(inst.exec_ptr, stream.cuda_stream, inst.end_ptr)
                else:
                    inst.ticket = 0
                    self.launch_on(inst, stream)
                return inst
        return None

    def await_launches(self) -> None:
        """Returns once every handed-off replay's launch has been made (at once where none is pending): before
        anything waits on, queries or times their events. Raises if the thread's launch failed."""
        if self.last_ticket:
            self.thread.wait_for(self.last_ticket)

    def launch_stamps(self, ticket: int) -> tuple[int, int, int] | None:
        """(begin, end, result) of a handed-off launch (``LaunchThread.stamps``)."""
        return self.thread.stamps(ticket) if self.thread is not None and ticket else None

    def copy_ended(self, ticket: int) -> bool:
        """Whether the launch thread has seen handed-off replay ``ticket``'s copy end (its last event complete:
        ``LaunchThread.copy_ended``, a counter read); False: not seen, not handed off, or watching is off (its
        check failed, ``watch_via``): ask the event."""
        thread = self.thread
        return bool(ticket) and thread is not None and self.watching and thread.copy_ended(ticket)

    def ids_packed_at(self, ticket: int) -> int | None:
        """When the launch thread began packing handed-off replay ``ticket``'s ids (``LaunchThread.packed_at``)."""
        return self.thread.packed_at(ticket) if self.thread is not None and ticket else None

    def copy_seen_ended_at(self, ticket: int) -> int | None:
        """When the launch thread saw handed-off replay ``ticket``'s copy end (``LaunchThread.ended_at``)."""
        return self.thread.ended_at(ticket) if self.thread is not None and ticket else None

    def close(self) -> None:
        """Ends the launch thread (after it has made every queued launch); later replays launch directly."""
        if self.thread is not None:
            self.thread.close()
            self.thread, self.last_ticket, self.watching = None, 0, False
            self.watch_via = "off (no launch thread)"
            for instances in self.instances.values():
                for inst in instances:
                    inst.ticket = 0

    def launch_on(self, inst: GraphInstance, stream) -> None:
        """Launches ``inst``'s graph onto ``stream`` (None: the current one), its arguments already written."""
        if self._launch is None:
            with on_stream(stream):
                inst.graph.replay()
            return
        stream = stream or current_stream()
        handle = self._stream_handles.get(stream.cuda_stream)
        if handle is None:
            handle = self._stream_handles[stream.cuda_stream] = self._launch.stream(stream)
        err = self._launch(inst.exec_handle, handle)
        if err:
            raise RuntimeError(f"{self._launch.label} of a restore copy failed: {err!r}")

    def describe(self) -> dict:
        return {"groupings": {name: len(groups) for name, groups in self.groupings.items()},
                "buckets": [self.buckets[0], self.buckets[-1]], "instances_per_bucket": NUM_INSTANCES,
                "num_graphs": sum(len(v) for v in self.instances.values()), "launch_via": self.launch_via,
                "launch_thread": self.thread_via, "copy_end_watch": self.watch_via}
