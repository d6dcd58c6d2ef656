"""Section 18's captures (``base.captures``), as ``report.record_mode`` and ``report.record_sweep`` write them:

    raw/requests.jsonl        FamilyHoldRequest: one per request of each run mode
    raw/block_events.jsonl    FamilyHoldBlockEvent: the block-pool capture of every arm-sample
    raw/capture.<mode>.jsonl  FamilyHoldInvocation: kmesh.capture/1, one per request with its block events
    raw/sweep.jsonl           FamilySweepArm: one per sweep arm-sample, its requests as token counts

Both published runs (cpu-20261201-060851-7382, gpu-20261204-191008-18a7) read as version 1 with these classes;
every field is in every record of both. The ``kmesh.capture/1`` files are written by the contract's own writer
(``kv.capture_contract.write_capture``), which puts no schema header in them: they read as version 1.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from kmesh_lib.base.captures import CaptureRecord
from kmesh_lib.kv.capture_records import BlockEventRecord, InvocationRecord


class FamilyHoldRequest(CaptureRecord):
    SCHEMA = "family_hold.requests"
    VERSION = 1

    mode: str  # real | replay | replay_at_real
    arm: str  # stock | held
    sample: int
    role: str  # parent, noise<i>/pass<p>, child
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    logprobs: list[float]  # the chosen token's logprob per output token
    num_cached_tokens: int  # vLLM's: prompt tokens found in the prefix cache
    finish_reason: str

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)


class FamilyHoldBlockEvent(CaptureRecord):
    SCHEMA = "family_hold.block_events"
    VERSION = 1

    arm: str  # the arm-sample: "<mode>/<arm>/s<sample>"
    step: int
    op: str  # alloc | touch | free | evict | hold | release
    block_ids: list[int]
    ref_cnts: list[int]  # vLLM's ref_cnt of each block after the operation

    @property
    def event(self) -> BlockEventRecord:
        """The event without its arm-sample label, as the capture records hold it."""
        return BlockEventRecord(step=self.step, op=self.op, block_ids=self.block_ids, ref_cnts=self.ref_cnts)


class FamilyHoldInvocation(InvocationRecord):
    """``extra`` holds the request's arm, sample and role."""

    SCHEMA = "family_hold.capture"
    VERSION = 1


class ControllerCounters(BaseModel):
    """The family-hold controller's counters after a held arm-sample (``kv.family_hold.FamilyHoldController.stats``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    num_families_admitted: int
    num_holds: int
    num_released: int
    num_stale_releases: int
    num_expired: int
    num_cancelled: int
    num_closed: int
    num_parents_aborted: int
    num_refused_families_cap: int
    num_refused_blocks_cap: int  # holds refused because the parent's blocks exceed the cap on held blocks
    num_refused_blocks: int
    peak_held_blocks: int
    num_held_blocks: int  # still held when the counters were read
    num_families: int


class SweepRequest(BaseModel):
    """One request of a sweep arm-sample: token counts, not token ids."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    role: str
    request_id: str
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    finish_reason: str
    block_events: list[BlockEventRecord]


class FamilySweepArm(CaptureRecord):
    SCHEMA = "family_hold.sweep"
    VERSION = 1

    num_gpu_blocks: int  # the replay engine's pool, null block included
    block_size: int
    arm: str  # stock | held
    sample: int
    controller: ControllerCounters | None  # the held arm's; None on the stock arm
    live_drain_ok: bool  # the live pool drained and reset after the arm-sample
    requests: list[SweepRequest]


# capture.<mode>.jsonl: real, replay and (where the replay engine's sizes differ) replay_at_real
CAPTURES = {"requests.jsonl": FamilyHoldRequest, "block_events.jsonl": FamilyHoldBlockEvent,
            "capture.*.jsonl": FamilyHoldInvocation, "sweep.jsonl": FamilySweepArm}

__all__ = ["CAPTURES", "ControllerCounters", "FamilyHoldBlockEvent", "FamilyHoldInvocation", "FamilyHoldRequest",
           "FamilySweepArm", "SweepRequest"]
