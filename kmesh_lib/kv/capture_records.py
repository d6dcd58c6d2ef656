"""Typed records of the block-pool and invocation captures the engine sections write (``base.captures``).

- ``BlockEventRecord``: one operation of vLLM's block pool as ``kv.capture.BlockPoolCapture`` logs it
  (``step``, ``op``, ``block_ids``, the ``ref_cnts`` after it); a section's ``raw/block_events.jsonl`` line
  is one of these (with the section's own label, where it has one), and so is each event inside a
  ``kmesh.capture/1`` record or a sweep's request.
- ``InvocationRecord``: one ``kmesh.capture/1`` record (``kv.capture_contract.CAPTURE_SCHEMA``). The
  contract's own validator (``validate_capture``) still states the rules across fields and records (lineage,
  clocks, one engine per file); the class types each field. A section subclasses it to name its capture
  (``SCHEMA``); the capture keeps its per-record ``schema`` field, which the class calls ``schema_id``
  (``schema`` is a pydantic name).

kmesh's captures always log ``ref_cnts`` (the contract leaves it optional for other writers), so the event
class requires them: ``kv.capture.replay_references`` reads them.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kmesh_lib.base.captures import CaptureRecord

Mapping = dict[str, Any]


class BlockEventRecord(BaseModel):
    """One block-pool operation: what ``kv.capture`` logs and replays."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    step: int  # the engine step it happened in
    op: str  # alloc | touch | free | evict | hold | release
    block_ids: list[int]
    ref_cnts: list[int]  # vLLM's ref_cnt of each block after the operation

    def as_event(self) -> dict:
        """The event as ``kv.capture``'s replay reads it."""
        return {"step": self.step, "op": self.op, "block_ids": self.block_ids, "ref_cnts": self.ref_cnts}


class EngineIdentity(BaseModel):
    """The engine a ``kmesh.capture/1`` file names (one per file)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str  # vllm
    version: str
    mode: str  # real | replay
    device: str
    block_size: int
    num_gpu_blocks: int  # vLLM's pool, null block included
    model: str | None = None  # the contract's optional field; every kmesh capture records it


class InvocationRecord(CaptureRecord):
    """One invocation of a ``kmesh.capture/1`` file (subclasses set ``SCHEMA``)."""

    schema_id: str = Field(alias="schema")  # always "kmesh.capture/1"
    run_id: str
    invocation_id: str
    family_id: str | None
    parent_id: str | None  # the invocation_id it extends
    kind: str  # parent, child, noise, proposal, value, ...
    engine: EngineIdentity
    clock_domain: str
    t_submit_ns: int
    t_first_token_ns: int | None
    t_finish_ns: int | None
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    num_cached_tokens: int
    status: str
    block_events: list[BlockEventRecord] | None = None  # the contract's optional physical events
    extra: Mapping | None = None  # free-form (the contract never validates it); each section says what it holds


__all__ = ["BlockEventRecord", "EngineIdentity", "InvocationRecord", "Mapping"]
