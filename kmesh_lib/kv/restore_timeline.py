"""Where one restore's time goes, from stamps taken while it ran.

    lookup      scheduler side: first ``get_num_new_matched_tokens`` call for the request to the call
                that answered (a lookup that answered "later" is retried on a later step)
    allocate    scheduler side: the lookup's answer to ``update_state_after_alloc``, which vLLM calls
                right after allocating the request's blocks: vLLM's own allocation of the restored
                blocks (a resident follow-up touches its cached blocks there instead; not a tier part)
    schedule    scheduler side: the connector's own work for the restore after that allocation (recording
                the load in ``update_state_after_alloc``; taking its block ids from the scheduler's output
                in ``build_connector_meta``)
    disk_read   O_DIRECT reads of the entry's file into pinned host memory (CPU stamps per chunk)
    staging     host -> buffer copies of those chunks (GPU events; CPU stamps on the CPU build)
    launch      from the restore's start (a disk restore: its last staging copy's end) to the copy's
                start: the host preparing the copy (the block ids to the device) while the GPU waits
    copy        buffer -> vLLM's blocks, device to device (GPU events from the kernel's launch; before
                commit 879de9e the events also held the ids' preparation, and there was no ``launch``)
    forward     the first forward step after the copy: measured by the section, from its own
                first-token stamp (``t_first_token_ns - t_copy_end_ns``)

What a restore adds to its step, as opposed to how long it runs: a restore queued at the step's start
(``launched_at == "step_start"``, ``kv.gpu_buffer_connector``) copies on the GPU while the runner
prepares the step on the host, so its span overlaps work a resident step does too. The engine thread
is serial, so the step is longer by the restore's own host time, plus however long the forward pass,
once queued, waits on the GPU for the copy:

    schedule      as above: the connector's scheduler-side work for this restore (before 2 Dec 2026 it was
                  not stamped, and it read vLLM's blocks for their ids, a walk over the context's blocks);
                  ``pack_ids`` is its part that takes the block ids from the scheduler output and packs them
    measure       taking the reference that puts this restore's events on the clock (``ref``; one per step,
                  so every restore of a step carries the same): a stream synchronization when the stream
                  had work left (``measure_synced``), else a non-blocking query. 0 where the reference was
                  taken before the step, the engine idle (``reference_at`` "before_step":
                  ``GpuBufferTier.take_reference``; checked against one taken after the request). A disk
                  restore on CUDA (from 6 Dec 2026) goes on the clock by a reference of its own, taken in the step
                  right after its last read, before that chunk's copy and the copy into vLLM (``reference_at``
                  "after_read": ``BufferArena.stage``), so that the reference is milliseconds, not a second's read,
                  from the events set against host stamps (the copy into vLLM, the forward pass reached, the layer
                  waits; the host's clock and the GPU's drift ~6 us a second apart); the earlier staging copies'
                  events, spread over the read, count by their differences, which no reference moves. Its host time
                  (``reference_after_read``) counts here, not in ``host``
    host          from the worker taking up the step's restores (``_queue_loads``) to this restore's copy
                  queued: staging reads, the block ids to the device, the launch, and
                  with layer waits the forward pass's calls to ``wait_for_layer_load`` that waited
                  (``hook``, also recorded on its own). Its parts before the hooks: ``before_copy``
                  (the restore's stamps, staging; its timeline is built when read, but from disk before
                  staging), ``copy_call`` (the copy queued: ``BufferArena.copy_into_vllm`` up to its graph
                  launch or last launch returning; ``write_ids``, its first part on the
                  graph route, writes the block ids into the graph's pinned arguments) and ``after_copy``
                  (its spans, the bookkeeping). Where the graph's launch was handed to the launch thread
                  (``launched_by`` "thread": ``kv.launch_thread``), ``copy_call`` ends at the request, and the
                  launch itself runs on another core (``thread_launch``; ``thread_lag``: from the arguments
                  written, just before the request, to the launch made); where the thread also packs the block
                  ids (``ids_packed_by`` "thread": the engine thread handed over the request's block table,
                  ``write_ids`` ends at that hand-over), ``thread_pack`` is its packing, before the launch and
                  inside ``thread_lag``; the engine thread's wait for it, if
                  the forward pass got there first, is in ``hook``. The first layer wait learns that the
                  copy has ended from the launch thread's watch of its last event where it can (``settled_by``
                  "thread"; ``thread_saw_end``: the copy's end to the thread seeing it), else by a query
    forward_wait  the forward pass queued (``start_load_kv``) to the GPU reaching it (an event
                  recorded there), 0 when the copy had ended by then: the copy's part on the step's
                  critical path, plus the event's own latency of a few microseconds. A restore copied
                  by layer groups (``wait_at == "layer"``) is waited on layer by layer instead: the sum,
                  over its groups, of how long the GPU stood at the group's first layer (an event
                  recorded where the forward pass reached it) before the group's copy ended; each
                  stall delays everything after it, so the sum is what the waits added
    critical      lookup + schedule + measure + host + forward_wait: the restore's own time on the step's critical
                  path, the event's latency counted as cost. Not in it: ``allocate``, vLLM's scheduler
                  allocating the restored blocks where a resident follow-up touches its cached ones (both a
                  walk over the context's blocks, the resident's unstamped); the first-token difference
                  holds the difference, with its spread
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

_ns = time.monotonic_ns


class Span:
    """Start and end of one part on the monotonic clock, from CPU stamps or a pair of CUDA events."""

    __slots__ = ("t0_ns", "t1_ns", "_events")

    def __init__(self, t0_ns: int | None = None, t1_ns: int | None = None, events: tuple | None = None) -> None:
        """``Span(t0_ns, t1_ns)`` from CPU stamps, ``Span(None, None, (start_event, end_event))`` from events."""
        self.t0_ns, self.t1_ns, self._events = t0_ns, t1_ns, events

    def cpu(self, t0_ns: int, t1_ns: int) -> Span:
        self.t0_ns, self.t1_ns = t0_ns, t1_ns
        return self

    def gpu(self, start_event, end_event) -> Span:
        self._events = (start_event, end_event)
        return self

    @classmethod
    def between(cls, start, end) -> Span:
        """From two marks: CUDA events, or CPU stamps (ints, on the monotonic clock)."""
        return cls(start, end) if isinstance(start, int) else cls(None, None, (start, end))

    @classmethod
    def at(cls, mark) -> Span:
        """A point: a CUDA event, or a CPU stamp."""
        return cls.between(mark, mark)

    @property
    def resolved(self) -> bool:
        """Its times are on the clock (its events, if any, have been read)."""
        return self._events is None

    @property
    def end_event(self):
        """The CUDA event at its end, until resolved (None for CPU stamps)."""
        return self._events[1] if self._events is not None else None

    def resolve(self, ref) -> None:
        if self._events is not None and ref is not None:
            t_ref_ns, ref_event = ref[:2]
            start, end = self._events
            end.synchronize()
            self.t0_ns = t_ref_ns + int(ref_event.elapsed_time(start) * 1e6)
            self.t1_ns = t_ref_ns + int(ref_event.elapsed_time(end) * 1e6)
            self._events = None

    @property
    def seconds(self) -> float | None:
        return None if self.t0_ns is None else (self.t1_ns - self.t0_ns) / 1e9


def span_of(spans: list[Span]) -> tuple[int | None, int | None]:
    """First start and last end over ``spans`` (resolved)."""
    done = [s for s in spans if s.t0_ns is not None]
    if not done:
        return None, None
    return min(s.t0_ns for s in done), max(s.t1_ns for s in done)


@dataclass
class RestoreTimeline:
    """Stamps of one restore (``LoadOp``) or one prefetch; ``record()`` gives the flat split."""

    kind: str  # "restore" or "prefetch"
    req_id: str | None
    entry_id: int
    source: str  # "buffer" or "disk"
    num_blocks: int
    nbytes: int
    device: str
    t_lookup_first_ns: int | None = None
    t_lookup_end_ns: int | None = None
    num_lookup_calls: int = 0
    t_allocated_ns: int | None = None
    schedule_ns: int = 0  # the connector's scheduler-side work for it after vLLM's allocation (``LoadOp.schedule_ns``)
    pack_ns: int = 0  # ... of which taking its block ids from the scheduler output and packing them (``LoadOp.pack_ns``)
    t_start_ns: int = 0  # the worker took up this restore (start_load_kv) or the prefetch began
    t_launched_ns: int | None = None  # every copy of it was queued (CPU)
    t_copy_call_ns: int | None = None  # the copy into vLLM's blocks was called (``BufferArena.copy_into_vllm``)
    t_ids_written_ns: int | None = None  # ... had written the block ids into a graph's arguments (graph route)
    t_copy_queued_ns: int | None = None  # ... and had queued its copy (a graph launch or the last launch returned)
    disk_bytes: int = 0
    disk_reads: list[Span] = field(default_factory=list)
    staging: list[Span] = field(default_factory=list)
    copy: Span | None = None
    ref: tuple | None = None  # (t_ref_ns, CUDA event, synced) on CUDA (``BufferArena.reference``)
    launched_at: str = "forward"  # "step_start" or "forward" (``GpuBufferConfig.launch_at``)
    measure_ns: int = 0  # taking the reference (one per step, shared by its restores)
    measure_synced: bool | None = None  # the reference waited for the stream (None on CPU: no reference)
    reference_at: str | None = None  # "step" (taken in the step: ``measure``), "before_step", "after_read"; None on CPU
    reference_after_read_ns: int = 0  # host time of a disk restore's own reference after its read (``reference_at``
    # "after_read"): inside ``t_start_ns .. t_launched_ns``, and counted as ``measure``, not ``host``
    t_reference_ns: int | None = None  # the reference's host stamp
    reference_window_ns: int | None = None  # its record call's host time (``cuda_streams.stream_reference``)
    t_forward_queued_ns: int | None = None  # start_load_kv: the forward pass is queued next
    forward_ready: Span | None = None  # the GPU reaching the forward pass (an event; a point: t0 == t1)
    wait_at: str = "forward"  # "forward" or "layer" (``GpuBufferConfig.wait_at``)
    num_copy_groups: int = 1  # launches of the copy (one per layer group with layer waits)
    layer_waits: list[tuple[Span, Span]] = field(default_factory=list)  # (GPU reached the group, its copy ended)
    hook_ns: int = 0  # host time in the forward pass's ``wait_for_layer_load`` calls for this restore
    copy_launch: str | None = None  # how the copy was queued: "graph", "handle" or "jit" (Triton), "torch"
    launch_ticket: int = 0  # the launch thread's ticket where it made the graph's launch (0: the engine thread did)
    t_thread_launch_begin_ns: int | None = None  # ... the thread's driver call, begun
    t_thread_launch_end_ns: int | None = None  # ... and returned
    t_thread_saw_end_ns: int | None = None  # ... and saw the copy's last event complete (its watch)
    t_thread_packed_ns: int | None = None  # ... and began packing its block ids (None: the engine thread packed them)
    settled_by: str | None = None  # the first layer wait found every group ended: "thread", "query", "cpu"
    resolved: bool = False

    def forward_queued(self, t_ns: int, event) -> None:
        """Stamps ``start_load_kv``: the host queues the forward pass after ``t_ns``; ``event``, recorded
        then on the same stream, completes when the GPU reaches it (None on CPU: copies are done by then)."""
        self.t_forward_queued_ns = t_ns
        if event is not None:
            self.forward_ready = Span().gpu(event, event)

    def layer_waited(self, reached, ready: Span) -> None:
        """The forward pass, at the first layer of a copy group, waits for the group: ``reached`` (an
        event recorded there, or a CPU stamp) and ``ready`` (the group's end, a point ``Span`` the copy
        made; the step's restores share it, as they share the reference that resolves it)."""
        self.layer_waits.append((Span.at(reached), ready))

    def resolve(self) -> RestoreTimeline:
        if not self.resolved:
            waits = [s for pair in self.layer_waits for s in pair]
            for s in self.staging + waits + [s for s in (self.copy, self.forward_ready) if s is not None]:
                s.resolve(self.ref)
            self.ref, self.resolved = None, True
        return self

    def record(self) -> dict:
        self.resolve()
        read0, read1 = span_of(self.disk_reads)
        stage0, stage1 = span_of(self.staging)
        copy0, copy1 = (self.copy.t0_ns, self.copy.t1_ns) if self.copy else (None, None)
        sec = lambda a, b: None if a is None or b is None else (b - a) / 1e9  # noqa: E731
        ends = [t for t in (read1, stage1, copy1, self.t_launched_ns) if t is not None]
        measure = (self.measure_ns + self.reference_after_read_ns) / 1e9
        schedule = self.schedule_ns / 1e9
        host = sec(self.t_start_ns, self.t_launched_ns)
        if host is not None:
            host += (self.hook_ns - self.reference_after_read_ns) / 1e9
        wait = None
        if self.wait_at == "layer" and len(self.layer_waits) < self.num_copy_groups:
            pass  # a group the forward pass never waited for: its wait is unknown (and the copy unordered)
        elif self.layer_waits:
            wait = sum(max(0.0, sec(reached.t0_ns, ready.t0_ns)) for reached, ready in self.layer_waits)
        elif self.t_forward_queued_ns is not None:
            ready = self.forward_ready.t0_ns if self.forward_ready is not None else None
            wait = max(0.0, sec(self.t_forward_queued_ns, ready)) if ready is not None else 0.0
        lookup = sec(self.t_lookup_first_ns, self.t_lookup_end_ns)
        queued = self.t_copy_queued_ns
        critical = None if host is None or wait is None else (lookup or 0.0) + schedule + measure + host + wait
        return {
            "kind": self.kind, "req_id": self.req_id, "entry_id": self.entry_id, "source": self.source,
            "num_blocks": self.num_blocks, "bytes": self.nbytes, "disk_bytes": self.disk_bytes, "device": self.device,
            "num_lookup_calls": self.num_lookup_calls,
            "lookup_s": lookup,
            "allocate_s": sec(self.t_lookup_end_ns, self.t_allocated_ns),
            "disk_read_s": sec(read0, read1), "disk_read_busy_s": sum(s.seconds for s in self.disk_reads) or None,
            "staging_s": sec(stage0, stage1),
            "staging_busy_s": sum(s.seconds for s in self.staging if s.seconds is not None) or None,
            "launch_s": sec(stage1 if stage1 is not None else self.t_start_ns, copy0),
            "copy_s": sec(copy0, copy1),
            "restore_s": sec(self.t_start_ns, max(ends)) if ends else None,
            "launched_at": self.launched_at, "wait_at": self.wait_at, "num_copy_groups": self.num_copy_groups,
            "num_layer_waits": len(self.layer_waits), "copy_launch": self.copy_launch,
            "launched_by": "thread" if self.launch_ticket else "engine",
            "thread_launch_s": sec(self.t_thread_launch_begin_ns, self.t_thread_launch_end_ns),
            "thread_lag_s": sec(self.t_ids_written_ns, self.t_thread_launch_end_ns),
            "settled_by": self.settled_by, "thread_saw_end_s": sec(copy1, self.t_thread_saw_end_ns),
            "ids_packed_by": "thread" if self.t_thread_packed_ns else "engine",
            "thread_pack_s": sec(self.t_thread_packed_ns, self.t_thread_launch_begin_ns),
            "schedule_s": schedule, "pack_ids_s": self.pack_ns / 1e9 if self.pack_ns else None,
            "measure_s": measure, "measure_synced": self.measure_synced,
            "host_s": host, "hook_s": self.hook_ns / 1e9, "forward_wait_s": wait,
            "before_copy_s": sec(self.t_start_ns, self.t_copy_call_ns), "copy_call_s": sec(self.t_copy_call_ns, queued),
            "write_ids_s": sec(self.t_copy_call_ns, self.t_ids_written_ns),
            "after_copy_s": sec(queued, self.t_launched_ns), "reference_at": self.reference_at,
            "reference_age_s": sec(self.t_reference_ns, self.t_start_ns) if self.reference_at == "before_step" else None,
            "reference_after_start_s": (sec(self.t_start_ns, self.t_reference_ns) if self.reference_at == "after_read"
                                        else None),
            "reference_window_s": None if self.reference_window_ns is None else self.reference_window_ns / 1e9,
            "critical_s": critical, "t_forward_queued_ns": self.t_forward_queued_ns,
            "t_lookup_first_ns": self.t_lookup_first_ns, "t_lookup_end_ns": self.t_lookup_end_ns,
            "t_allocated_ns": self.t_allocated_ns,
            "t_start_ns": self.t_start_ns, "t_launched_ns": self.t_launched_ns,
            "t_disk_read_start_ns": read0, "t_disk_read_end_ns": read1,
            "t_staging_start_ns": stage0, "t_staging_end_ns": stage1,
            "t_copy_start_ns": copy0, "t_copy_end_ns": copy1,
            "t_ready_ns": max(ends) if ends else None,
        }


def request_split(timeline: dict, t_submit_ns: int, t_first_token_ns: int) -> dict:
    """One follow-up's time by part, from its first restore's ``RestoreTimeline.record()``: queued
    before the first lookup, the restore's own parts, and what is left to the first token."""
    queued = timeline["t_lookup_first_ns"]
    return {"queue_s": (queued - t_submit_ns) / 1e9 if queued else None,
            "lookup_s": timeline["lookup_s"], "disk_read_s": timeline["disk_read_s"], "staging_s": timeline["staging_s"],
            "launch_s": timeline.get("launch_s"), "copy_s": timeline["copy_s"], "restore_s": timeline["restore_s"],
            "allocate_s": timeline.get("allocate_s"), "schedule_s": timeline.get("schedule_s"),
            "pack_ids_s": timeline.get("pack_ids_s"),
            "measure_s": timeline.get("measure_s"), "measure_synced": timeline.get("measure_synced"),
            "reference_at": timeline.get("reference_at"), "reference_age_s": timeline.get("reference_age_s"),
            "reference_after_start_s": timeline.get("reference_after_start_s"),
            "reference_window_s": timeline.get("reference_window_s"),
            "host_s": timeline.get("host_s"), "hook_s": timeline.get("hook_s"),
            "before_copy_s": timeline.get("before_copy_s"), "copy_call_s": timeline.get("copy_call_s"),
            "write_ids_s": timeline.get("write_ids_s"),
            "after_copy_s": timeline.get("after_copy_s"),
            "forward_wait_s": timeline.get("forward_wait_s"),
            "critical_s": timeline.get("critical_s"), "launched_at": timeline.get("launched_at"),
            "wait_at": timeline.get("wait_at"), "num_copy_groups": timeline.get("num_copy_groups"),
            "copy_launch": timeline.get("copy_launch"), "launched_by": timeline.get("launched_by"),
            "thread_launch_s": timeline.get("thread_launch_s"), "thread_lag_s": timeline.get("thread_lag_s"),
            "settled_by": timeline.get("settled_by"), "thread_saw_end_s": timeline.get("thread_saw_end_s"),
            "ids_packed_by": timeline.get("ids_packed_by"), "thread_pack_s": timeline.get("thread_pack_s"),
            "num_layer_waits": timeline.get("num_layer_waits"),
            "after_restore_s": (t_first_token_ns - timeline["t_ready_ns"]) / 1e9}


class StepClock:
    """Stamps every model-executor call (``execute_model`` and ``sample_tokens``) of a live engine.

    ``calls`` holds ``(t0_ns, t1_ns)`` pairs on the monotonic clock; a section reads the first
    forward step of a restored request as the executor call that ends at its first token.
    """

    def __init__(self, engine) -> None:
        self.calls: list[tuple[int, int]] = []
        executor = engine._engine.engine_core.engine_core.model_executor
        for name in ("execute_model", "sample_tokens"):
            if hasattr(executor, name):
                self._wrap(executor, name)

    def _wrap(self, obj, name: str) -> None:
        original = getattr(obj, name)

        def stamped(*args, **kwargs):
            t0 = _ns()
            try:
                return original(*args, **kwargs)
            finally:
                self.calls.append((t0, _ns()))

        setattr(obj, name, stamped)

    def between(self, t0_ns: int, t1_ns: int) -> list[tuple[int, int]]:
        return [c for c in self.calls if c[0] >= t0_ns and c[1] <= t1_ns]

    def clear(self) -> None:
        self.calls.clear()
