"""Replay arms: one search trace on vLLM's own scheduler and KV-cache manager at one pool size.

The replay engine (``engine.replay``) runs vLLM's real ``Scheduler`` and block pool with no
forward pass, so stock vLLM's cache decisions can be observed at every pool size in seconds.
Each arm forces every call's output, so the search makes the same calls at every size:

* the **engine trace**: the engine run's own calls, outputs forced to the captured ones, at
  every stock pool size; at the run's pool size it must reproduce the engine's cached tokens;
* the **scale traces**: scripted searches over puzzles 0..NUM_SCALE_PUZZLES-1, one per script
  error rate (``SCRIPT_ERROR_RATES``), each at every stock pool size.

One ``raw/stock_sweep.jsonl`` record per arm, appended as it finishes: per call (columns) the
invocation id, SHA-256 prefixes of its prompt and output ids, token counts, the cached tokens,
the tokens the scheduler scheduled and the preemptions; the arm's block-operation counts and the
drain observed at its end. Token ids are not stored: ``checks`` re-derive each trace (the capture,
or the script) and compare the hashes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import time

from kmesh_lib.engine.model_spec import resolve, tokenizer_for
from kmesh_lib.engine.replay import ReplayEngine
from kmesh_lib.kv.capture import BlockPoolCapture, drain_check
from kmesh_lib.sections.tot_headroom.generator import InvocationBlockLog, engine_generator
from kmesh_lib.sections.tot_headroom.params import (
    ENGINE_TRACE,
    STOCK_SWEEP,
    scale_search_config,
    scale_trace_name,
    scripted_policy,
    search_config,
    stock_pool_sizes,
)
from kmesh_lib.workloads import game24
from kmesh_lib.workloads.tot_search import TotSearch

CALL_COLUMNS = ("invocation_id", "parent_id", "prompt_sha", "output_sha", "num_prompt_tokens", "num_output_tokens",
                "num_cached_tokens", "num_scheduled_tokens", "num_preemptions")


def token_sha(token_ids) -> str:
    """A short content hash of token ids (64 bits: enough to tell two traces apart)."""
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:16]


def replay_params(cfg, num_blocks: int):
    """The run's engine parameters on the replay engine with ``num_blocks`` usable blocks."""
    return dataclasses.replace(cfg, ENGINE="replay", NUM_GPU_BLOCKS=num_blocks + 1, KV_CACHE_MIB=None)


def run_arm(cfg, num_blocks: int, scfg, puzzles, outputs, tokenizer) -> tuple[dict, list]:
    """One search on the replay engine with forced outputs; returns (arm record, invocations).

    ``outputs(call)`` returns the call's output ids, or None where the trace has no such call
    (the search then stops there: ``limit_hit == "capture_end"``).
    """
    t0 = time.monotonic()
    engine = ReplayEngine(replay_params(cfg, num_blocks))
    capture = BlockPoolCapture(engine.block_pool)
    log = InvocationBlockLog(engine, capture)
    forced = engine_generator(engine, scfg, on_step=capture.mark_step, outputs=outputs)

    def generate(calls):
        return None if any(outputs(c) is None for c in calls) else forced(calls)

    try:
        search = TotSearch(generate, tokenizer, scfg).run(puzzles)
    finally:
        drain = drain_check(engine.block_pool)
        log.close()
        capture.close()
        engine.close()
    calls = {name: [] for name in CALL_COLUMNS}
    for inv in search.invocations:
        result = inv.result
        row = {"invocation_id": inv.call.invocation_id, "parent_id": inv.call.parent_id,
               "prompt_sha": token_sha(result.prompt_token_ids), "output_sha": token_sha(result.output_token_ids),
               "num_prompt_tokens": len(result.prompt_token_ids), "num_output_tokens": len(result.output_token_ids),
               "num_cached_tokens": result.num_cached_tokens, **log.scheduling_for(inv.call.invocation_id)}
        for name in CALL_COLUMNS:
            calls[name].append(row[name])
    arm = {"num_blocks": num_blocks, "num_puzzles": len(puzzles),
           "puzzles": [[p.index, list(p.numbers)] for p in puzzles], "limit_hit": search.limit_hit,
           "counts": dict(search.counts), "num_solved": sum(o.status == "solved" for o in search.outcomes),
           "calls": calls, "block_ops": capture.counts(), "num_unattributed_block_events": log.num_unattributed,
           "drain_ok": drain.ok, "drain": str(drain), "seconds": round(time.monotonic() - t0, 2)}
    return arm, search.invocations


def run_arms(cfg, record, engine_records: list[dict]) -> None:
    """Every replay arm, each appended to ``raw/stock_sweep.jsonl`` as it finishes (the tables are built
    from that file: ``tables.TABLES``)."""
    tokenizer = tokenizer_for(resolve(cfg.MODEL))
    captured = {r["invocation_id"]: r for r in engine_records}

    def captured_output(call):
        rec = captured.get(call.invocation_id)
        return rec["output_token_ids"] if rec is not None and rec["status"] != "timeout" else None

    puzzles = game24.load_puzzles(cfg.PUZZLES_CSV, cfg.PUZZLE_INDICES)
    for num_blocks in stock_pool_sizes(cfg):
        arm, _ = run_arm(cfg, num_blocks, search_config(cfg), puzzles, captured_output, tokenizer)
        save_arm(record, arm, ENGINE_TRACE, None)

    scale_puzzles = game24.load_puzzles(cfg.PUZZLES_CSV, list(range(cfg.NUM_SCALE_PUZZLES)))
    for error_rate in (cfg.SCRIPT_ERROR_RATES if scale_puzzles else []):
        trace = scale_trace_name(error_rate)
        policy = scripted_policy(cfg, tokenizer, error_rate)
        for num_blocks in stock_pool_sizes(cfg):
            arm, _ = run_arm(cfg, num_blocks, scale_search_config(cfg), scale_puzzles, policy.token_ids, tokenizer)
            save_arm(record, arm, trace, error_rate)


def save_arm(record, arm: dict, trace: str, error_rate: float | None) -> dict:
    arm = {"arm": f"{trace}/pool{arm['num_blocks']}", "trace": trace, "error_rate": error_rate, **arm}
    record.append_jsonl(STOCK_SWEEP, arm)
    return arm
