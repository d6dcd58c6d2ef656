"""Section 19's captures (``base.captures``), as ``experiment.run_engine`` and ``arms.run_arms`` write them:

    raw/tot_capture.jsonl    TotInvocation: kmesh.capture/1, one per call of the engine run, with its block events
    raw/tot_outcomes.jsonl   TotOutcome: one per puzzle of the engine run (``tot_search.PuzzleOutcome``)
    raw/block_events.jsonl   TotBlockEvent: the engine run's whole block-pool capture
    raw/stock_sweep.jsonl    StockSweepArm: one per replay arm (a trace at one pool size), its calls as columns

Both published runs (cpu-20261201-065654-28e5, gpu-20261204-190116-fefc) read as version 1 with these classes;
every field is in every record of both.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict

from kmesh_lib.base.captures import CaptureRecord
from kmesh_lib.kv.capture_records import InvocationRecord, Mapping
from kmesh_lib.sections.tot_headroom.params import BLOCK_EVENTS, CAPTURE, OUTCOMES, STOCK_SWEEP


class _Nested(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class TotCall(_Nested):
    """A call's place in the search (``generator.capture_record``'s ``extra``)."""

    puzzle_index: int
    step: int
    call_index: int
    seed: int  # the call's sampling seed
    state_left: str  # the numbers left in the state the call extends
    state_steps: list[str]
    context_reset: bool
    parsed: Mapping  # what the search read of the output: a proposal's line counts, a value call's judgement;
    # {} where it was never parsed (tot_search.Invocation.parsed)
    policy: str  # model | scripted (the output was forced to the script's text)
    # the scheduler's own counts (generator.InvocationBlockLog.scheduling_for); absent from a record written
    # without the scheduler's log
    num_scheduled_tokens: int | None = None
    num_preemptions: int | None = None


class TotInvocation(InvocationRecord):
    SCHEMA = "tot_headroom.tot_capture"
    VERSION = 1

    extra: TotCall


class TotOutcome(CaptureRecord):
    SCHEMA = "tot_headroom.tot_outcomes"
    VERSION = 1

    puzzle_index: int
    numbers: list[int]
    status: str  # solved | failed | partial | not_run
    reason: str
    expression: str | None  # None: no answer reached the grader
    steps: list[str]
    num_calls: int

    def table_row(self) -> dict:
        """The outcome as the tables show it (its expression and steps stay in raw/)."""
        return {"puzzle_index": self.puzzle_index, "numbers": self.numbers, "status": self.status,
                "reason": self.reason, "num_calls": self.num_calls}


class TotBlockEvent(CaptureRecord):
    SCHEMA = "tot_headroom.block_events"
    VERSION = 1

    step: int
    op: str  # alloc | touch | free | evict
    block_ids: list[int]
    ref_cnts: list[int]  # vLLM's ref_cnt of each block after the operation

    def as_event(self) -> dict:
        """The event as ``kv.capture`` reads a capture."""
        return {"step": self.step, "op": self.op, "block_ids": self.block_ids, "ref_cnts": self.ref_cnts}


class ArmCalls(_Nested):
    """An arm's calls as columns, one entry per call (``arms.CALL_COLUMNS``); token ids only as hashes."""

    invocation_id: list[str]
    parent_id: list[str | None]
    prompt_sha: list[str]  # arms.token_sha of the prompt ids
    output_sha: list[str]
    num_prompt_tokens: list[int]
    num_output_tokens: list[int]
    num_cached_tokens: list[int]
    num_scheduled_tokens: list[int]
    num_preemptions: list[int]


class BlockOps(_Nested):
    """Block-level operations per kind (a touch of 3 blocks counts 3), ``BlockPoolCapture.counts``."""

    alloc: int
    touch: int
    free: int
    evict: int
    hold: int
    release: int


def _pair(value):
    return tuple(value) if isinstance(value, list) else value  # stored as a JSON array: [index, numbers]


Puzzle = Annotated[tuple[int, list[int]], BeforeValidator(_pair)]  # (puzzle index, its four numbers)


class StockSweepArm(CaptureRecord):
    SCHEMA = "tot_headroom.stock_sweep"
    VERSION = 1

    arm: str  # "<trace>/pool<num_blocks>"
    trace: str  # engine, or a scale trace (params.scale_trace_name)
    error_rate: float | None  # the script's error rate of a scale trace; None on the engine trace
    num_blocks: int  # usable blocks of the replay engine's pool
    num_puzzles: int
    puzzles: list[Puzzle]
    limit_hit: str | None  # what stopped the search (capture_end: the trace has no such call); None: it ran whole
    counts: dict[str, int]  # the search's counters (tot_search.COUNT_NAMES)
    num_solved: int
    calls: ArmCalls
    block_ops: BlockOps
    num_unattributed_block_events: int
    drain_ok: bool  # the pool drained when the arm ended (observed live)
    drain: str
    seconds: float


CAPTURES = {CAPTURE: TotInvocation, OUTCOMES: TotOutcome, BLOCK_EVENTS: TotBlockEvent, STOCK_SWEEP: StockSweepArm}

__all__ = ["ArmCalls", "BlockOps", "CAPTURES", "StockSweepArm", "TotBlockEvent", "TotCall",
           "TotInvocation", "TotOutcome"]
