"""Section 16's captures (``base.captures``): ``raw/blocks.jsonl`` (one record per engine run) and
``raw/groups.jsonl`` (one per group), each a class the notebook writes through and ``kmesh verify`` reads by.

Fields a record lacks in the runs published before them are optional, each saying so; those runs read as
version 1 with these classes (no published capture needed another path).
"""
from __future__ import annotations

from kmesh_lib.base.captures import as_stored, renamed_values
from kmesh_lib.base.declared import json_default
from kmesh_lib.base.params import FLOOR_NOW_RESIDENT
from kmesh_lib.workloads.context_records import EngineRunRecord, GroupIdentity, Mapping


class RetentionEngineRun(EngineRunRecord):
    SCHEMA = "retention.blocks"
    VERSION = 1

    pairs: int | None = None  # measured pairs run (warm-ups included), on a run that reached its groups
    retried_pairs: int | None = None  # pairs replaced because a group was not ok
    combinations: int | None = None  # arrival patterns x singleflight settings


class RetentionGroup(GroupIdentity):
    SCHEMA = "retention.groups"
    VERSION = 1

    # the arm whose context is already in vLLM's KV was "floor" in the captures published before issue 41
    _arm_renamed = renamed_values("arm", renamed=FLOOR_NOW_RESIDENT)

    data_start: str  # where the context's copy starts (the tier's, or the arm's own)
    route: str  # how it reaches vLLM's blocks
    lookup: str | None  # the tier's lookup mechanism (external arms); None on recompute/resident
    chunk_tokens: int
    prep_s: float  # the warm-up (preparation phase)
    warmup_cached_tokens: int | None  # None: the arm has no warm-up
    ttft_a_s: float  # follow-up A's first token, from the follow-ups' submission
    last_token_s: list[float]  # each follow-up's MAX_TOKENS-th token
    output_tokens: int  # MAX_TOKENS
    prep_reads: Mapping  # the disk reads of the preparation phase (lmcache.disk_accounting.PhaseReads)
    followup_reads: Mapping  # and of the follow-up phase
    prep_lookups: list[Mapping] | None = None  # MP paths with the server's lookup trace: every lookup, classified
    prep_lookup_summary: Mapping | None = None
    followup_lookups: list[Mapping] | None = None
    followup_lookup_summary: Mapping | None = None
    memory_tier_bytes_before: int
    memory_tier_bytes_at_followups: int
    memory_tier_bytes_after: int
    memory_tier_drop_wait_s: float | None = None  # the wait for the memory tier to drop the context (discard);
    # absent from the groups of runs published before it was recorded (cpu-20261201-062854-c0b9)
    disk_tier_bytes_before: int
    disk_tier_bytes_after: int
    load_1m: float  # the machine's run queue as the group ended
    prep_restores: list[Mapping] | None = None  # gpubuf: every restore of the preparation phase, split
    followup_restores: list[Mapping] | None = None


# a GPU driver's resumed run sets aside what an engine run that did not finish recorded (workloads.engine_runs)
CAPTURES = {"blocks.jsonl": RetentionEngineRun, "groups.jsonl": RetentionGroup,
            "blocks.unfinished.jsonl": RetentionEngineRun, "groups.unfinished.jsonl": RetentionGroup}

def as_groups(records: list[dict]) -> list[RetentionGroup]:
    """Group records held in memory (a block run in this process), as the capture stores and reads them."""
    return [RetentionGroup.model_validate(as_stored(g, json_default)) for g in records]


def as_engine_runs(records: list[dict]) -> list[RetentionEngineRun]:
    return [RetentionEngineRun.model_validate(as_stored(b, json_default)) for b in records]


__all__ = ["CAPTURES", "RetentionEngineRun", "RetentionGroup", "as_engine_runs", "as_groups"]
