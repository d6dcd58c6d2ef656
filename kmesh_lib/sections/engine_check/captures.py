"""Section 00's captures (``base.captures``): ``raw/requests.jsonl`` (one record per request of each arm) and
``raw/block_events.jsonl`` (the arm's block-pool capture, ``kv.capture.BlockEvent`` with its arm). Both
published runs read as version 1 with these classes.
"""
from __future__ import annotations

from kmesh_lib.base.captures import CaptureRecord


class EngineCheckRequest(CaptureRecord):
    SCHEMA = "engine_check.requests"
    VERSION = 1

    arm: str  # "<engine>-B<block size>"
    request_id: str  # first | second
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    logprobs: list[float]  # the chosen token's logprob per output token
    num_cached_tokens: int  # vLLM's: prompt tokens found in the prefix cache
    t_submit_ns: int  # monotonic
    t_token_ns: list[int]  # each output token's arrival, monotonic
    finish_reason: str


class EngineCheckBlockEvent(CaptureRecord):
    SCHEMA = "engine_check.block_events"
    VERSION = 1

    arm: str
    step: int
    op: str  # alloc | touch | free | evict
    block_ids: list[int]
    ref_cnts: list[int]  # vLLM's ref_cnt of each block after the operation

    def as_event(self) -> dict:
        """The event as ``kv.capture`` reads a capture."""
        return {"step": self.step, "op": self.op, "block_ids": self.block_ids, "ref_cnts": self.ref_cnts}


CAPTURES = {"requests.jsonl": EngineCheckRequest, "block_events.jsonl": EngineCheckBlockEvent}

__all__ = ["CAPTURES", "EngineCheckBlockEvent", "EngineCheckRequest"]
