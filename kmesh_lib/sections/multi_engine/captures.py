"""Section 22's captures (``base.captures``): what ``experiment.run`` writes to ``raw/``.

    orders.jsonl     OrderRecord     one per (model, repeat): the policy order drawn from SEED
    requests.jsonl   RequestRecord   one per request of a trace (``router.Router.row``)
    arms.jsonl       ArmRecord       one per trace, (model, repeat, policy) (``experiment.run_policy``)
    probes.jsonl     ProbeRecord     one per idle-engine probe child (``probe.probe``)
    fleets.jsonl     FleetRecord     one per fleet start (``fleet.Fleet.close``)
    units.jsonl      UnitRecord      the GPU driver's runs only (``gpu.py``): one per unit (a fleet start) that ended

The nested records the checks and tables read (the server's counters, a pool's state after its reset, a
fleet's engines, server and cleanup, an injected kill) have small classes of their own, as strict as the
captures'; the rest (the disk tier's description, an engine's stop) stay mappings.

The four runs published on 1 Dec read as version 1 with these classes. They were recorded before the orders
were drawn and before the load average was taken at each trace's start and end: they have no
``raw/orders.jsonl``, and their arms lack ``load_avg_start``/``load_avg_end`` (optional, saying so).
"""
from __future__ import annotations

from typing import Any

from kmesh_lib.base.captures import CaptureRecord

Mapping = dict[str, Any]


class Part(CaptureRecord):
    """A record nested in a capture's line: validated as strictly as the line; no file, schema or header of its own
    (``declare`` refuses a class without a SCHEMA as a capture)."""


class ServerCounts(Part):
    """The LMCache server's counters at one moment (``fleet.server_snapshot``: ``lmcache.disk_accounting.Snapshot``
    plus the /metrics sums the section adds)."""

    device_read_bytes: int | None  # /proc/<pid>/io of the server; None where it cannot be read
    device_read_calls: int | None
    hook_read_bytes: int | None  # the O_DIRECT byte hook's reads; None: no hook on this path
    hook_reads: int
    hook_write_bytes: int
    hook_write_errors: int
    retention_decisions: Mapping  # mode -> chunks decided
    metrics: dict[str, float]  # /metrics by name (a counter absent until its first increment is 0 here)
    memory_tier_bytes: int
    disk_tier_bytes: int  # the disk tier's files
    exact: bool
    trace_index: int
    device_write_bytes: int | None = None  # absent from the runs published before Snapshot counted device writes

    def metric(self, name: str) -> float:
        """A /metrics counter, 0 where this snapshot lacks it (the server had not counted it yet)."""
        return self.metrics.get(name, 0)


class PoolState(Part):
    """An engine's pool after its reset before a trace (``EngineProcess.reset``), or a dead engine's line."""

    engine: int
    ok: bool  # the prefix cache was reset; False for a dead engine
    op: str | None = None  # the worker's message ("reset"); absent from a dead engine's line
    free_blocks: int | None = None  # absent from a dead engine's line
    cached_blocks: int | None = None
    dead: bool = False  # the engine was gone before the trace (a fault run); absent (False) on a live engine's


class Kill(Part):
    """The fault test's kill (``router.Router.inject_kill``)."""

    engine: int
    after_dispatched: int
    at_s: float  # from the trace's start
    in_flight: list[str]  # request ids on the engine when it was killed


class OrderRecord(CaptureRecord):
    SCHEMA = "multi_engine.orders"
    VERSION = 1

    model: str
    repeat: int
    seed: str  # ``experiment.order_seed``
    order: list[str]  # the policies in the order drawn


class RequestRecord(CaptureRecord):
    """One request: routing, its stamps from the trace's start, the cached-token split and its outputs."""

    SCHEMA = "multi_engine.requests"
    VERSION = 1

    model: str
    repeat: int
    policy: str
    request_id: str
    role: str  # parent | child | noise
    family: int | None  # None: an unrelated (noise) request
    status: str  # ok | failed
    error: str  # why it failed (engine_died, parent_failed, timeout, no_live_engine); "" when ok
    engine: int | None  # None: never routed
    num_prompt_tokens: int
    prompt_sha: str | None  # None: a child whose parent failed has no prompt
    skip_prefix_cache: bool
    matched_tokens: list[int]  # per engine: the prefix its index held at dispatch
    in_flight: list[int]  # per engine: requests in flight at dispatch
    live: list[bool]  # per engine: alive at dispatch
    arrival_s: float | None  # None: a child whose parent failed never arrived
    dispatch_s: float | None
    submit_s: float | None
    first_token_s: float | None
    finish_s: float | None
    num_output_tokens: int
    output_token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    num_cached_tokens: int | None
    num_local_cached_tokens: int | None  # vLLM's own pool; None where the engine reported no lookup
    num_external_tokens: int | None  # what the server supplied
    unit: str | None = None  # the GPU driver's unit (gpu.py) that recorded it; absent from the notebook's runs

    @property
    def arm(self) -> tuple[str, int, str]:
        return self.model, self.repeat, self.policy

    @property
    def ttft_s(self) -> float:
        """From its arrival to its first token (routing, the pipe and queueing included)."""
        return self.first_token_s - self.arrival_s


class ArmRecord(CaptureRecord):
    """One trace under one policy: the router's summary, the pools before it, the server's counters around it."""

    SCHEMA = "multi_engine.arms"
    VERSION = 1

    model: str
    repeat: int
    policy: str
    num_requests: int
    num_ok: int
    num_failed: int
    makespan_s: float | None  # None: no request finished
    engines_alive: list[bool]
    dead_reasons: list[str | None]
    index_blocks: list[int]
    killed: Kill | None  # the fault test's kill; None in a run without one
    order: int  # its place in its repeat's order
    fleet: str  # local | shared
    router: str
    wall_s: float
    pools_before: list[PoolState]
    server_before: ServerCounts | None  # None: a fleet without a server
    server_after: ServerCounts | None
    server_alive: bool | None
    kv_bytes_per_token: int
    chunk_size: int
    load_avg_start: list[float] | None = None  # the host's 1/5/15-minute load at the trace's start and end;
    load_avg_end: list[float] | None = None  # absent from the runs published before the orders were drawn (1 Dec)
    load_1m: float  # the host's 1-minute load as the trace ended
    unit: str | None = None  # the GPU driver's unit (gpu.py) that recorded it; absent from the notebook's runs

    @property
    def arm(self) -> tuple[str, int, str]:
        return self.model, self.repeat, self.policy


class ProbeRecord(CaptureRecord):
    """One idle-engine probe child: recomputed, from a local hit, or restored from the server."""

    SCHEMA = "multi_engine.probes"
    VERSION = 1

    ttft_s: float  # from its submission (nothing else in the engines)
    e2e_s: float
    output_token_ids: list[int]
    logprobs: list[float]
    num_cached_tokens: int | None
    num_local_cached_tokens: int | None
    num_external_tokens: int | None
    model: str
    fleet: str
    probe: int
    kind: str  # recompute | local | restore
    engine: int
    num_prompt_tokens: int
    prompt_sha: str
    parent_ttft_s: float
    kv_bytes_per_token: int
    server_start: ServerCounts | None  # None: the local fleet
    server_before: ServerCounts | None
    server_after: ServerCounts | None
    unit: str | None = None  # the GPU driver's unit (gpu.py) that recorded it; absent from the notebook's runs


class FleetEngine(Part):
    """An engine of a fleet as it was ready (the worker's ``ready`` message and its placement)."""

    engine: int
    op: str
    pid: int
    start_s: float
    num_gpu_blocks: int
    free_blocks: int
    connector: str | None  # None: the local fleet's engines
    listeners: list[str]
    threads: int | None  # cpu: the engine's threads; None on a GPU
    gpu: str | None  # cuda: its GPU; None on the CPU
    memory_share: float


class FleetServer(Part):
    pid: int
    listeners: list[str]
    start_s: float
    arena_mib: int
    store_policy: str
    chunk_size: int


class FleetCleanup(Part):
    """What was left once the fleet closed; None where the fleet had no such part (a local fleet's server)."""

    engine_groups_gone: bool | None
    server_group_gone: bool | None
    runtime_dir_removed: bool | None
    disk_tier_files_at_close: int | None
    disk_tier_files_left: int | None
    shm_segment_removed: bool | None
    pgids: list[int]


class FleetRecord(CaptureRecord):
    """One fleet from its start to its close (written as it closes, also when its start or a trace raised)."""

    SCHEMA = "multi_engine.fleets"
    VERSION = 1

    model: str
    fleet: str  # local | shared
    status: str  # closed, once it closed
    start_s: float | None = None  # absent: the fleet did not start
    engines: list[FleetEngine] = []  # absent: the fleet did not start
    stops: list[Mapping]  # each engine's stop: pid, exit code, its group gone
    cleanup: FleetCleanup
    disk_tier: Mapping | None = None  # the shared fleet's disk tier, checked before the server started; absent: local
    server: FleetServer | None = None  # absent: the local fleet (no server)
    error: str | None = None  # absent unless the fleet's start or a trace raised
    unit: str | None = None  # the GPU driver's unit (gpu.py) that recorded it; absent from the notebook's runs


class UnitRecord(CaptureRecord):
    """One unit of the GPU driver (``gpu.py``): a fleet start for one model, its traces and (its kind's last start)
    its probes, with the host it ran on (``env``). Only a unit with status ``ok`` counts; the records of any other
    are set aside in ``raw/*.unfinished.jsonl`` and the unit is measured again (``workloads.engine_runs``)."""

    SCHEMA = "multi_engine.units"
    VERSION = 1

    unit: str  # ``experiment.Unit.name``
    model: str
    start: int  # its place in ``experiment.schedule``
    fleet: str  # local | shared
    served: list[Mapping]  # {repeat, policy} per trace, in the order run
    probes: bool
    status: str  # ok | failed
    error: str | None = None  # absent when ok
    seconds: float  # from the child's start to its summary
    env: Mapping  # the host while it ran: started_utc, load_avg_start/end (1/5/15 min), cpus, memory_available_bytes


CAPTURES = {"orders.jsonl": OrderRecord, "requests.jsonl": RequestRecord, "arms.jsonl": ArmRecord,
            "probes.jsonl": ProbeRecord, "fleets.jsonl": FleetRecord, "units.jsonl": UnitRecord}
# a GPU driver's resumed run sets aside what a unit that did not finish recorded (workloads.engine_runs)
CAPTURES.update({name.replace(".jsonl", ".unfinished.jsonl"): cls for name, cls in CAPTURES.items()
                 if name != "orders.jsonl"})

__all__ = ["ArmRecord", "CAPTURES", "FleetCleanup", "FleetEngine", "FleetRecord", "FleetServer", "Kill", "OrderRecord",
           "PoolState", "ProbeRecord", "RequestRecord", "ServerCounts", "UnitRecord"]
