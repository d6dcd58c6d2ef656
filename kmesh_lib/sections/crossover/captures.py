"""Section 21's captures (``base.captures``): what ``experiment.run_model`` (one child per model and tier) writes.

    models.jsonl        ChildSummary    one per (model, tier) child, as it ends
    stores.jsonl        StoreRecord     one per context stored on a tier's disk tier (``RestoreBench.store``)
    rows.jsonl          GridRow         one per (model, context, arm, repeat) follow-up (``RestoreBench.run``)
    pairs.jsonl         PairRow         one per follow-up of the paired design (``RestoreBench.run_pairs``)
    point_floors.jsonl  PointFloors     the floors of one point, before and after its pairs (``point_floors``)
    pair_plans.jsonl    PairPlan        one per (model, context, memory restore path): its pairs, from its pilot

A follow-up's fields depend on its tier: the GPU buffer's rows add its restores, their split and the forward pass's
span; vLLM's CPU tier's its external hits and lookups; a CUDA row the GPU's clocks. Those fields are optional, each
saying which rows have them. A restore's timeline split, which the checks and tables read part by part, has its own
class (``RestoreSplit``, every part optional), and so do the components of the first token (``Components``); the other
nested records (the GPU's clocks, the reference clock, vLLM's statistics, a tier's description) stay mappings.

Every published run reads as version 1 with these classes. What the runs published before a field lack:

- the 1 Dec GPU runs (gpu-20261201-*) were recorded before the Williams order: no ``arm_position`` and
  ``previous_arm``; before the GPU buffer timed its forward passes and its reference clock: no ``forward_step_s``
  and ``reference_clock``; and before ``grid_s`` and ``launch_thread_cpu_s`` were taken;
- every run published up to 6 Dec 2026 (gpu-20261206-085915-4eef the last) was recorded before the GPU buffer timed
  the host's queueing of its forward passes: no ``forward_queue_s``; and before it timed the host's path to their
  first attention layer: no ``forward_to_first_layer_s``;
- no published run has ``raw/pairs.jsonl`` or ``raw/point_floors.jsonl`` (recorded before the paired design).
"""
from __future__ import annotations

from kmesh_lib.base.captures import CaptureRecord, renamed_values
from kmesh_lib.base.params import FLOOR_NOW_RESIDENT
from kmesh_lib.workloads.context_records import Mapping


class ChildSummary(CaptureRecord):
    """One (model, tier) child: its engine, its tier and how it ended."""

    SCHEMA = "crossover.models"
    VERSION = 1

    model: str
    tier: str  # lmcache | gpubuf | native | lmcache_mp
    path: str  # where LMCache runs (mp, inproc), else the tier's name
    kv_bytes_per_token: int
    status: str  # ok | store_short | error
    detail: str | None = None  # an error's exception (status error only)
    disk_tier: Mapping | None = None  # the disk tier checked before storing; absent: vLLM's CPU tier has none
    engine_start_s: float | None = None  # absent: the child failed before its engine started
    switch: Mapping | None = None  # the external switch (``ExternalSwitch.describe``); absent likewise
    connector: str | None = None  # the KV connector's class; absent likewise
    tier_route: Mapping | None = None  # the GPU buffer's and vLLM's CPU tier's description; absent: LMCache's tier
    gpu_clocks: str | None = None  # cuda: "nvml", or why the clocks cannot be read; absent on the CPU
    grid_s: float | None = None  # the grid's seconds; absent from runs before it was taken (1 Dec) or a failed child
    launch_thread_cpu_s: float | None = None  # the GPU buffer's launch thread's CPU seconds; absent elsewhere and
    # from runs recorded before the thread was metered
    seconds: float | None = None  # the child's tier and engine from start to close; absent from runs recorded before
    # 6 Dec 2026 (the GPU driver scales its estimates of the children left by it)
    copy_hook: str | None = None  # what the component probe's copy hook wraps (``ComponentProbe.copy_hook``: the
    # in-process engine's GPU connector and method) or why it wraps nothing; absent from runs published before it
    # (gpu-20261206-155000-bbf8 the last) and where the child failed before its engine started
    kv_digest: str | None = None  # how the bench digests vLLM's KV of a context's blocks (``lmcache.probes.KvDigest``:
    # the KV tensors and the ids it reads) or why it cannot; absent from runs published before it
    # (gpu-20261206-190103-861a the last) and where the child failed before its engine started


class StoreRecord(CaptureRecord):
    """A context computed once and written to its tier's disk tier."""

    SCHEMA = "crossover.stores"
    VERSION = 1

    context: str
    tier: str
    bytes_written: int  # the byte hook's write count
    write_errors: int
    seconds: float
    model: str
    context_tokens: int
    context_bytes: int  # context_tokens x the model's KV bytes per token
    # What tells a short store's causes apart (``RestoreBench.store``); absent from runs recorded before 6 Dec 2026:
    num_cached_tokens: int | None = None  # the store request's cached tokens: what its lookup claimed (not stored)
    reached_disk: bool | None = None  # the MP server: every chunk the store put in L1 reached the disk tier before
    # the memory copy was dropped (``MPTier.wait_for_store``); absent for other tiers
    l1_bytes_before: int | None = None  # the MP server's L1 arena in use before the store, once it settled, after
    l1_bytes_settled: int | None = None  # its memory copy was dropped; absent for other tiers
    l1_bytes_after: int | None = None
    arena_bytes: int | None = None  # the arena's size
    store_metrics: Mapping | None = None  # LMCache's counters over the store (chunks; None: never counted)
    store_reservations: Mapping | None = None  # the store path's L1 reservations (``lookups.store_reservations``)
    store_events: Mapping | None = None  # the store controller's steps (``lookups.store_events``)
    shm_free_bytes: int | None = None  # free bytes of /dev/shm after the store (None: none there)


class RestoreSplit(CaptureRecord):
    """One restore's timeline by part, in seconds unless named otherwise: the GPU buffer's
    (``kv.restore_timeline.request_split``, with ``to_forward_s`` from ``RestoreBench``) or vLLM's CPU tier's
    (``kv.offloading.request_split``). Nested in a row: no file, schema or header of its own. Every part is
    optional: each tier records its own parts, and the GPU buffer's grew run by run (a part a run's splits lack is
    absent and reads None; ``holds`` tells the two apart)."""

    queue_s: float | None = None  # submission to the first lookup (or the restore's queueing)
    lookup_s: float | None = None
    disk_read_s: float | None = None  # None: the context was in memory
    staging_s: float | None = None
    launch_s: float | None = None
    copy_s: float | None = None
    restore_s: float | None = None  # the restore's own span
    allocate_s: float | None = None
    schedule_s: float | None = None  # the connector's scheduler-side work (since 2 Dec)
    pack_ids_s: float | None = None
    measure_s: float | None = None  # the timing reference's synchronization
    measure_synced: bool | None = None  # the reference found the stream busy and waited
    reference_at: str | None = None  # step | before_step | after_read (a disk restore's own, from 6 Dec 2026)
    reference_age_s: float | None = None
    reference_after_start_s: float | None = None  # after_read: the restore's start to its reference (its read)
    reference_window_s: float | None = None
    host_s: float | None = None
    hook_s: float | None = None
    before_copy_s: float | None = None
    copy_call_s: float | None = None
    write_ids_s: float | None = None
    after_copy_s: float | None = None  # the engine thread's Python right after the copy's request
    forward_wait_s: float | None = None
    critical_s: float | None = None  # what the restore adds to its step
    launched_at: str | None = None  # where the restore was queued (step_start | forward)
    wait_at: str | None = None  # what the forward pass waited for (forward | layer)
    num_copy_groups: int | None = None
    copy_launch: str | None = None  # graph | handle | torch
    launched_by: str | None = None  # engine | thread
    thread_launch_s: float | None = None
    thread_lag_s: float | None = None
    settled_by: str | None = None
    thread_saw_end_s: float | None = None
    ids_packed_by: str | None = None
    thread_pack_s: float | None = None
    num_layer_waits: int | None = None
    after_restore_s: float | None = None  # the restore's end to the first token
    to_forward_s: float | None = None  # the restore's end to its forward pass's first layer (host stamps)
    load_time_s: float | None = None  # vLLM's CPU tier: its own load time
    after_lookup_s: float | None = None  # vLLM's CPU tier: the last lookup to the first token


NO_SPLIT = RestoreSplit()  # a row without a timeline: every part None, none held


class Components(CaptureRecord):
    """Where a follow-up's first token went, from LMCache's and vLLM's hooks (``lmcache.probes.ComponentProbe``),
    in seconds. Nested in a row: no file, schema or header of its own."""

    lookup_s: float
    lookup_calls: int
    lookup_wall_s: float | None  # the first lookup to the first answered one (on the MP path it holds the
    # server's disk-to-memory load); None: no lookup answered
    disk_read_s: float | None  # None: the tier has no disk reads to hook
    disk_reads: int | None
    load_s: float | None  # ``start_load_kv`` (host stamps); None: no worker-side connector
    save_s: float | None
    load_gpu_s: float | None = None  # CUDA events around ``start_load_kv``; absent from every published run (recorded
    # after them)
    load_wall_s: float | None = None  # an asynchronous load from its ``start_load_kv`` to the ``get_finished`` that reported
    # it (the MP path; on CUDA the server copies after start_load_kv returned); None: none reported; absent from every
    # published run (recorded after them)
    # The in-process LMCache engine's copy into vLLM's blocks (its GPU connector's ``batched_to_gpu``, hooked from 6 Dec
    # 2026: absent from every run published before, gpu-20261206-155000-bbf8 the last): the bytes, memory objects
    # (chunks) and tokens it was handed; 0 where the follow-up called no copy; None where no copy is hooked (the MP
    # path, whose server copies; the GPU buffer and vLLM's CPU tier; why in raw/models.jsonl's ``copy_hook``)
    load_bytes: int | None = None
    load_chunks: int | None = None
    load_tokens: int | None = None
    load_skipped_tokens: int | None = None  # of those, the tokens vLLM held, which the copy does not write
    # where the first memory object of each of those calls lived (``lmcache.probes.placed``): its tensor's device type
    # (cpu | cuda | mixed) and, in host memory, whether it was pinned; None as load_bytes, or where one could not be
    # read; absent from every run published before them (gpu-20261206-190103-861a the last)
    load_device: str | None = None
    load_pinned: bool | None = None
    to_gpu_s: float | None = None  # the host's time inside those calls (their copies' span: they synchronize)
    to_gpu_in_load: bool | None = None  # each ran inside a ``start_load_kv`` (None: none ran, or none hooked)
    forward_s: float  # the model's forward pass: execute less load and save
    exec_s: float
    exec_calls: int
    other_s: float  # outside the model executor: scheduling, hashing, output handling


class FollowUp(CaptureRecord):
    """One follow-up of one arm (``RestoreBench.measure``) and the run's identification of it; a grid row and a
    paired row add their place."""

    arm: str
    tier: str
    context: str
    context_tokens: int
    tag: str
    status: str  # ok | cache_miss (a follow-up did not hit exactly the expected cached tokens)
    ttft_s: float  # from the follow-up's submission to its first token
    makespan_s: float  # to the group's MAX_TOKENS-th token
    num_cached_tokens: list[int]  # per follow-up
    expected_cached_tokens: int
    disk_read_bytes: int  # the byte hook's reads (0 on vLLM's CPU tier, which has no disk tier)
    device_read_bytes: int | None  # /proc/<pid>/io; None where it cannot be read, or no disk tier
    prep_s: float  # the arm's preparation (not timed into the follow-up)
    warm_cached_tokens: int | None = None  # the warm-up's cached tokens: memory and resident arms (absent elsewhere)
    memory_tier_bytes: int | None  # the tier's memory copy when the follow-up was submitted; None: vLLM's CPU tier where its
    # manager hides its block counts
    components: Components  # where the first token's time went
    num_restores: int | None = None  # GPU buffer rows: its restores in the follow-up (absent on other tiers)
    memory_tier_bytes_after: int | None = None  # GPU buffer rows: its memory copy after the follow-up
    forward_step_s: float | None = None  # GPU buffer rows: the first token's forward pass (None: none seen); absent
    # from other tiers and from the runs of 1 Dec, recorded before the tier timed it
    forward_queue_s: float | None = None  # GPU buffer rows: the host's time to queue the forward pass from its first
    # attention layer (to ``wait_for_save``); where it is as long as forward_step_s the GPU pass was waiting on the
    # host (launch-bound); None as forward_step_s; absent from runs before this (6 Dec 2026)
    forward_to_first_layer_s: float | None = None  # GPU buffer rows: the host's time from the step's
    # ``bind_connector_metadata`` (where vLLM starts a step's synchronous loads; a resident step is stamped at the same
    # point) to the same forward pass's first attention layer: a restore's less its resident partner's is how much
    # longer the restored step's host path is; None as forward_step_s, or where the step bound no metadata of its own
    # before the pass; absent from runs before this (6 Dec 2026, after forward_queue_s)
    split: RestoreSplit | None = None  # a restore's timeline: GPU buffer rows with a restore, vLLM's CPU tier's rows
    # with external hits (absent elsewhere)
    external_hit_tokens: int | None = None  # vLLM's CPU tier's rows: its statistics' external hits
    num_lookup_calls: int | None = None  # vLLM's CPU tier's rows
    vllm_stats: Mapping | None = None  # vLLM's CPU tier's rows: its connector statistics over the follow-up
    gpu_clocks: Mapping | None = None  # cuda rows: the GPU's clocks before and after (absent on the CPU)
    reference_clock: Mapping | None = None  # GPU buffer rows with a reference clock; absent from runs before it
    # A restore's content check (``arms.RestoreBench._kv_check``, ``lmcache.probes.compare_kv``), restore arms (memory,
    # disk) of a tier that stores the context: vLLM's blocks of the context after the follow-up digest as the blocks
    # ``store`` computed it into; the tokens compared; of those, the tokens of blocks whose digest differs; and of
    # blocks that held the same place in an earlier request of the context (an equal digest there may be the earlier
    # KV). None where a digest could not be taken (the child's ``kv_digest`` says why); absent from other arms and from
    # every run published before them (gpu-20261206-190103-861a the last)
    kv_digest_equal: bool | None = None
    kv_digest_tokens: int | None = None
    kv_digest_differing_tokens: int | None = None
    kv_digest_reused_tokens: int | None = None
    # where a restore's blocks differ: per layer, its differing blocks; the runs of differing blocks ([first, last]
    # block index of the context); absent from every run published before them (the 7B DRAM run of 6 Dec 2026, 21:38,
    # whose 64 restores all differed, the last)
    kv_digest_differing_by_layer: list[int] | None = None
    kv_digest_differing_spans: list[list[int]] | None = None
    # of the differing blocks: those all zero in every layer, and those holding the KV computed into another block of
    # the context (``lmcache.probes.compare_kv``); absent as the two above
    kv_digest_zero_blocks: int | None = None
    kv_digest_misplaced_blocks: int | None = None
    # restore arms: vLLM's KV caches were zeroed before the follow-up (``lmcache.probes.KvDigest.scrub``), so no block
    # holds an earlier request's KV and each equal digest shows a write; absent from runs before it (7 Dec 2026, e7c8
    # the last), False where the caches could not be reached
    kv_scrubbed: bool | None = None
    model: str
    path: str
    measured: bool  # False: a warm-up repeat
    kv_bytes_per_token: int
    context_bytes: int

    # the LMCache tier's resident arm (the context already in vLLM's KV) was "floor" in the captures published
    # before issue 41; "floor" names a physical transfer floor only (``point_floors.jsonl``, results' ``floors``)
    _arm_renamed = renamed_values("arm", renamed=FLOOR_NOW_RESIDENT)


class GridRow(FollowUp):
    """One (model, context, arm, repeat) of the grid."""

    SCHEMA = "crossover.rows"
    VERSION = 1

    repeat: int
    arm_position: int | None = None  # its place in the repeat's Williams order; absent from the 1 Dec GPU runs
    previous_arm: str | None = None  # the arm before it (None: first); absent from the 1 Dec GPU runs

    _previous_arm_renamed = renamed_values("previous_arm", renamed=FLOOR_NOW_RESIDENT)


class PairRow(FollowUp):
    """One follow-up of the paired design: a restore or its engine's resident follow-up."""

    SCHEMA = "crossover.pairs"
    VERSION = 1

    pair: int
    role: str  # restore | resident
    pair_arm: str  # the restore arm of the pair
    pair_position: int  # 0: first in its pair
    # restore rows of a memory path (from 5 Dec 2026): one copy of the context's bytes timed right before the restore
    # (``kv.floors.PairFloor``), and the engine thread's CPU and the load then (``arms.host_state``); from commit ecc5309
    # ``host`` on every pair row, both roles, with the host's steal time, the process's CPU time, involuntary context
    # switches and CPU clock beside them
    pair_floor_s: float | None = None
    host: Mapping | None = None
    # from 5 Dec 2026, 15:00 UTC: each way's seconds (``memcpy``; on CUDA also ``uva_read``), pair_floor_s their
    # minimum; and a way that could not be set up -> why
    pair_floor_ways: Mapping | None = None
    pair_floor_errors: Mapping | None = None


class PointFloors(CaptureRecord):
    """The floors of one point's context, in the tier's chunks, measured in the engine's process."""

    SCHEMA = "crossover.point_floors"
    VERSION = 1

    model: str
    tier: str
    context_tokens: int
    context_bytes: int
    when: str  # before | after the point's pairs
    floors: Mapping  # kind -> ``kv.floors.chunked_floor``'s measurement in the tier's chunks at FLOOR_QUEUE_DEPTH
    # kind -> the same with the medium kept busy (``kv.floors.saturated_floor``); absent before 5 Dec 2026. A disk
    # record with ``in_flight`` (from 6 Dec 2026) is a sweep's fastest way, every way in its ``sweep``; one without
    # read 8 chunks of one file in lockstep batches (each batch waiting for its slowest read). A sweep way's
    # ``destination`` (pageable | pinned, where its reads landed) and the record's ``not_swept`` (a pinned way this
    # process could not run, with why) came later the same day: a way without it read into ordinary pages
    saturated: Mapping | None = None
    errors: Mapping | None = None  # kind, or "kind (saturated)" -> why that way could not be measured; absent where none failed


class PairPlan(CaptureRecord):
    """One (model, context, memory restore path)'s count of pairs, decided from its pilot (``report.pair_plan``) and
    written before a second stage runs: the pairs raw/pairs.jsonl must then hold for the point. Absent from runs
    recorded before the two-stage design (6 Dec 2026) and for disk paths (NUM_DISK_RESTORES fixed)."""

    SCHEMA = "crossover.pair_plans"
    VERSION = 1

    model: str
    tier: str
    context_tokens: int
    path: str  # the restore arm
    num_pilot: int  # the pilot's pairs (NUM_RESTORES)
    max_restores: int  # MAX_RESTORES (0: off)
    pilot_half_width_x_floor: float | None  # the pilot's span half-width (widened for streaks) over the floor's min
    pilot_floor_ms: list[float] | None  # the floor measured before the point, as ``report.floor_range_ms`` gives it
    restores_to_resolve: int | None  # what the pilot's spread asks for (``report.restores_needed``); None: resolved
    # or no estimate
    num_pairs_planned: int  # the pairs the point runs in all: the pilot's, plus a second stage where ``extended``
    reason: str  # ``report.PLAN_REASONS``: off | no_goal | resolved | extended | over_cap | no_estimate | over_time
    # the time guard (``experiment.stage_fits``), where the pilot asked for a second stage: its estimated seconds and
    # the seconds CHILD_TIMEOUT_S left it after the rest of the child's estimate (``over_time`` where they are fewer);
    # absent from plans recorded before the guard (6 Dec 2026) and from every other reason
    stage_s: float | None = None
    time_left_s: float | None = None


CAPTURES = {"models.jsonl": ChildSummary, "stores.jsonl": StoreRecord, "rows.jsonl": GridRow, "pairs.jsonl": PairRow,
            "point_floors.jsonl": PointFloors, "pair_plans.jsonl": PairPlan}

__all__ = ["CAPTURES", "ChildSummary", "Components", "FollowUp", "GridRow", "NO_SPLIT", "PairPlan", "PairRow", "PointFloors",
           "RestoreSplit", "StoreRecord"]
