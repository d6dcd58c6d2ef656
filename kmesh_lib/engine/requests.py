"""The request API both engines share, and the loop that drives a group of requests.

An engine implements ``submit(spec)``, ``step() -> list[StepOutput]`` and ``has_unfinished()``.
``run_group`` submits a group (each request at its ``submit_after_s`` offset from the group's
start), steps until every request finished and stamps every token with ``time.monotonic_ns()``
when the step that produced it returned, which is when a client could see it. Two stopwatches
follow from the stamps: ``first_token_s(request)`` and ``group_makespan_s(results, nth)``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RequestSpec:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int = 8
    temperature: float = 0.0  # 0 is greedy
    seed: int | None = None  # per-request sampling seed (sampled decoding)
    submit_after_s: float = 0.0  # offset from the group's start
    # the output, when forced (``engine.forcing``): the request generates exactly these ids
    forced_token_ids: tuple[int, ...] | None = None


@dataclass
class StepOutput:
    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[float]
    finished: bool
    finish_reason: str | None = None
    num_cached_tokens: int | None = None


@dataclass
class RequestResult:
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # chosen token's logprob per output token
    num_cached_tokens: int = 0
    t_submit_ns: int = 0
    t_token_ns: list[int] = field(default_factory=list)  # one stamp per output token
    finish_reason: str | None = None

    @property
    def t_first_token_ns(self) -> int | None:
        return self.t_token_ns[0] if self.t_token_ns else None

    @property
    def t_finish_ns(self) -> int | None:
        return self.t_token_ns[-1] if self.t_token_ns else None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def first_token_s(self) -> float:
        """Stopwatch 1: submission to this request's first output token."""
        return (self.t_token_ns[0] - self.t_submit_ns) / 1e9

    def nth_token_ns(self, nth: int) -> int:
        if len(self.t_token_ns) < nth:
            raise ValueError(f"request {self.request_id} produced {len(self.t_token_ns)} tokens, not {nth}")
        return self.t_token_ns[nth - 1]


def group_makespan_s(results: list[RequestResult], nth: int, t0_ns: int | None = None) -> float:
    """Stopwatch 2: from the group's first submission until every request produced its nth token."""
    start = min(r.t_submit_ns for r in results) if t0_ns is None else t0_ns
    return (max(r.nth_token_ns(nth) for r in results) - start) / 1e9


class CacheObjects:
    """The live vLLM objects behind an engine's ``scheduler`` (both engines have one)."""

    @property
    def kv_cache_manager(self):
        return self.scheduler.kv_cache_manager

    @property
    def block_pool(self):
        return self.kv_cache_manager.block_pool


def record_step(results: dict[str, RequestResult], outputs: list[StepOutput], stamp_ns: int,
                unfinished: set[str]) -> None:
    """Adds one step's outputs to ``results`` (requests not in it are skipped), stamping every new
    token with ``stamp_ns``, and drops finished requests from ``unfinished``."""
    for out in outputs:
        res = results.get(out.request_id)
        if res is None:
            continue
        res.output_token_ids.extend(out.new_token_ids)
        res.logprobs.extend(out.new_logprobs)
        res.t_token_ns.extend([stamp_ns] * len(out.new_token_ids))
        if out.num_cached_tokens is not None:
            res.num_cached_tokens = out.num_cached_tokens
        if out.finished:
            res.finish_reason = out.finish_reason
            unfinished.discard(out.request_id)


def run_group(engine, specs: list[RequestSpec], on_step=None) -> list[RequestResult]:
    """Submits ``specs`` at their offsets and steps ``engine.vllm_engine.vllm_engine`` until all of them finished.

    Returns results in the order of ``specs``. ``on_step(step_index)`` runs after each step
    (captures snapshot there). Requests already in the engine keep running and are stepped
    too, but only this group's results are returned.
    """
    ids = [s.request_id for s in specs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate request ids in group: {ids}")
    pending = sorted(specs, key=lambda s: s.submit_after_s)
    results = {s.request_id: RequestResult(s.request_id, list(s.prompt_token_ids)) for s in specs}
    unfinished = set(ids)
    t0 = time.monotonic_ns()
    step_index = 0
    while unfinished:
        now = time.monotonic_ns()
        while pending and t0 + int(pending[0].submit_after_s * 1e9) <= now:
            spec = pending.pop(0)
            results[spec.request_id].t_submit_ns = time.monotonic_ns()
            engine.submit(spec)
        if not engine.has_unfinished():
            if pending:  # nothing to step until the next submission is due
                time.sleep(max(0.0, (t0 + pending[0].submit_after_s * 1e9 - time.monotonic_ns()) / 1e9))
                continue
            raise RuntimeError(f"engine idle with unfinished requests {sorted(unfinished)}")
        outputs = engine.step()
        record_step(results, outputs, time.monotonic_ns(), unfinished)
        if on_step is not None:
            on_step(step_index)
        step_index += 1
    return [results[i] for i in ids]
