"""Section 23's captures (``base.captures``), as ``experiment.run`` writes them:

    raw/trace.jsonl    TraceLine: one per request replayed, in Mooncake's own format and field names
    raw/costs.jsonl    CostRow: section 21's measured TTFTs this run prices with, one per (shape, arm, context)
    raw/replay.jsonl   ReplayArm: one per pool replayed through vLLM's scheduler, its requests as columns
    raw/parity.jsonl   ParityRun: the parity slice, one per engine (real, replay), its requests as columns

The four published runs (cpu-20261204-221647-d17f, cpu-20261204-222724-ab76, cpu-20261204-234703-3db8,
cpu-20261205-001932-4f23) read as version 1 with these classes, every field in every record. None has a
concurrent arm: its fields are what ``replay.run_concurrent`` writes, which tests/test_production_trace.py's run
writes through this class.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from kmesh_lib.base.captures import CaptureRecord
from kmesh_lib.sections.production_trace.params import COSTS, PARITY, REPLAY, TRACE
from kmesh_lib.sections.production_trace.trace import TraceRequest


class _Nested(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class TraceLine(CaptureRecord):
    """A request as the Mooncake trace gives it (``trace.TraceRequest.to_dict``)."""

    SCHEMA = "production_trace.trace"
    VERSION = 1

    timestamp: int  # ms since the trace began
    input_length: int  # prompt tokens
    output_length: int  # output tokens
    hash_ids: list[int]  # one per 512-token block of the prompt, chained

    def request(self) -> TraceRequest:
        return TraceRequest(self.timestamp, self.input_length, self.output_length, tuple(self.hash_ids))


class CostRow(CaptureRecord):
    """One of section 21's measured points (``experiment.crossover_costs``), naming the published run it is from."""

    SCHEMA = "production_trace.costs"
    VERSION = 1

    run_id: str
    status: str  # the cited run's status (the cost check wants passed)
    shape: str
    arm: str  # recompute | dram | disk
    context_tokens: int
    ttft_ms: float
    n: int  # requests the median is over
    device: str


class RequestColumns(_Nested):
    """An engine run's requests as columns, one entry per request in trace order (``replay.REQUEST_COLUMNS``;
    a concurrent arm's also ``replay.CONCURRENT_COLUMNS``)."""

    num_prompt_tokens: list[int]
    num_output_tokens: list[int]
    num_cached_tokens: list[int]  # vLLM's prefix hit when the request was first scheduled
    # concurrent arms only (replay.run_concurrent): absent from a sequential run's columns
    num_scheduled_tokens: list[int] | None = None  # every token scheduled for it, a preemption's recompute included
    num_preemptions: list[int] | None = None
    t_arrival_s: list[float] | None = None  # on the step-time model's clock
    t_first_token_s: list[float] | None = None
    t_finish_s: list[float] | None = None


class _EngineRun(CaptureRecord):
    """What ``replay.run_sequential`` and ``replay.run_concurrent`` both return."""

    engine: Literal["replay", "real"]
    model: str
    block_size: int
    num_blocks: int  # usable blocks of the pool (vLLM's null block not counted)
    num_steps: int | None  # None: the real engine counts no steps
    requests: RequestColumns
    drain_ok: bool  # the pool drained when the run ended (observed live)
    drain: str
    seconds: float  # the requests' wall-clock time, engine start apart
    engine_start_s: float


SEQUENTIAL_FIELDS = ("max_model_len", "max_tokens", "num_speculative_tokens")
CONCURRENT_FIELDS = ("max_num_seqs", "max_num_batched_tokens", "step_base_s", "step_s_per_token", "span_s")
CONCURRENT_COLUMNS = ("num_scheduled_tokens", "num_preemptions", "t_arrival_s", "t_first_token_s", "t_finish_s")


class ReplayArm(_EngineRun):
    """One pool replayed through vLLM's scheduler (``experiment.run``): sequentially (``run_sequential``) or on
    the step-time model's clock (``run_concurrent``); each mode's own fields are absent from the other's arms."""

    SCHEMA = "production_trace.replay"
    VERSION = 1

    arm: str  # "<mode>/<shape>/<GiB>GiB"
    pool_gib: float
    shape: str
    mode: Literal["sequential", "concurrent"]
    # sequential arms only
    max_model_len: int | None = None
    max_tokens: int | None = None  # None: every request to its real output length
    num_speculative_tokens: int | None = None  # the replay engine's drafts per decode step
    # concurrent arms only
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    step_base_s: float | None = None
    step_s_per_token: float | None = None
    span_s: float | None = None  # the modelled clock when the last request finished

    @model_validator(mode="after")
    def _holds_its_mode_fields(self) -> ReplayArm:
        if self.mode == "sequential":
            lacking = [f for f in SEQUENTIAL_FIELDS if not self.holds(f)]
        else:
            lacking = [f for f in CONCURRENT_FIELDS if not self.holds(f)]
            lacking += [f"requests.{f}" for f in CONCURRENT_COLUMNS if f not in self.requests.model_fields_set]
        if lacking:
            raise ValueError(f"a {self.mode} arm records {', '.join(lacking)}")
        return self


class ParityRun(_EngineRun):
    """One engine's run of the parity slice (``replay.run_sequential``, outputs capped at ``max_tokens``)."""

    SCHEMA = "production_trace.parity"
    VERSION = 1

    arm: str  # "parity/<engine>"
    max_model_len: int
    max_tokens: int
    num_speculative_tokens: int  # 0 on the real engine: it decodes plainly


CAPTURES = {TRACE: TraceLine, COSTS: CostRow, REPLAY: ReplayArm, PARITY: ParityRun}

__all__ = ["CAPTURES", "CostRow", "ParityRun", "ReplayArm", "RequestColumns", "TraceLine"]
