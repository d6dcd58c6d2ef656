"""Section 20's captures (``base.captures``): ``raw/blocks.jsonl`` (one record per engine run) and
``raw/groups.jsonl`` (one per group of the pilot, the contrast and the confirmation).

Fields a record lacks in the runs published before them are optional, each saying so; those runs read as
version 1 with these classes (no published capture needed another path).
"""
from __future__ import annotations

from kmesh_lib.base.captures import as_stored, renamed_values
from kmesh_lib.base.declared import json_default
from kmesh_lib.base.params import ENGINE_NOW_RESIDENT
from kmesh_lib.workloads.context_records import EngineRunRecord, GroupIdentity, Mapping


class PrefetchEngineRun(EngineRunRecord):
    SCHEMA = "prefetch.blocks"
    VERSION = 1

    run_index: int | None = None  # the repeat of (path, group size); absent on rows that could not run
    lead_ms: float | None = None  # the lead the pilot chose (None: a pilot-only run, or none chosen)
    pilot_only: bool | None = None  # the run measured the pilot only


class PrefetchGroup(GroupIdentity):
    SCHEMA = "prefetch.groups"
    VERSION = 1

    # the arm whose context is already in vLLM's KV was "engine" in the captures published before issue 41
    _arm_renamed = renamed_values("arm", renamed=ENGINE_NOW_RESIDENT)

    run_index: int
    lead_ms: float  # how long before the follow-ups (T) the preparation starts
    phase: str  # pilot | contrast | confirm
    lookup: str
    prep: str  # what the preparation does (an HTTP prefetch, a warm-up, placed untimed, none)
    ready: bool | None  # the context was in place at T (early arms); None otherwise
    readiness: Mapping | None
    prefetch: Mapping | None  # the prefetch's own timing (early arms with a prefetch)
    warmup_cached_tokens: int | None = None  # placement arms: the warm-up's cached tokens (absent elsewhere)
    memory_tier_bytes_at_arrival: int | None = None  # placement arms: the memory tier at T
    wait_a_s: float  # follow-up A's first token, from T
    submit_delay_s: float
    expected_cached_tokens: int
    loop_iterations: int
    idle_waits: int
    stamps: int
    disk_bytes: int | None  # the phase's disk reads (the hook's count, else the device's)
    disk_write_bytes: int | None = None  # absent from groups of runs published before writes were measured
    warm_store_guard: bool | None = None  # MP paths' guard against a store racing the warm-up; absent likewise
    reads: Mapping  # lmcache.disk_accounting.PhaseReads of the group
    placement_lookup_summary: Mapping | None = None  # MP paths with the server's lookup trace
    lookups: list[Mapping] | None = None
    lookup_summary: Mapping | None = None
    store_events: Mapping | None = None  # the server's stores in the group (runs recorded after it was traced)
    placement_restores: list[Mapping] | None = None  # gpubuf: every restore, split
    restores: list[Mapping] | None = None


# a GPU driver's resumed run sets aside what an engine run that did not finish recorded (workloads.engine_runs)
CAPTURES = {"blocks.jsonl": PrefetchEngineRun, "groups.jsonl": PrefetchGroup,
            "blocks.unfinished.jsonl": PrefetchEngineRun, "groups.unfinished.jsonl": PrefetchGroup}


def as_groups(records: list[dict]) -> list[PrefetchGroup]:
    """Group records a live measurement holds in memory, as the capture stores and reads them."""
    return [PrefetchGroup.model_validate(as_stored(g, json_default)) for g in records]


def as_engine_runs(records: list[dict]) -> list[PrefetchEngineRun]:
    return [PrefetchEngineRun.model_validate(as_stored(b, json_default)) for b in records]


__all__ = ["CAPTURES", "PrefetchEngineRun", "PrefetchGroup", "as_engine_runs", "as_groups"]
