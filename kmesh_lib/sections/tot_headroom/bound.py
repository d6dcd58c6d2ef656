"""Stock vLLM's prefill against the LRU reference and the offline ideal bound, per trace and pool size.

Vocabulary of the tables (token counts over every call of a trace):

    num_prompt_tokens       every prompt token (no reuse at all)
    stock_prefill_tokens    stock vLLM: prompt tokens minus ``num_cached_tokens`` (the prefix hit
                            when the call was first scheduled)
    recomputed_tokens       tokens stock vLLM computed again after preempting a call
                            (scheduled - first prefill - decode steps)
    stock_total_tokens      stock_prefill_tokens + recomputed_tokens: what stock computed
    lru_prefill_tokens      the LRU reference (``bounds.lru``): one call at a time, no pins
    ideal_prefill_tokens    the offline ideal bound (``bounds.ideal``): no exact-prefix cache of
                            that pool computes fewer
    num_compulsory_tokens   each prompt's final fragment, which no cache can serve
    headroom_tokens         stock_prefill_tokens - ideal_prefill_tokens: what a better retention
                            policy could still save. The recompute is kept apart: it comes from
                            the scheduler admitting more calls than the pool holds, and keeping
                            more blocks would not remove it.

Invariants: compulsory <= ideal <= LRU and ideal <= stock_prefill <= stock_total at every size.
"""
from __future__ import annotations

from dataclasses import dataclass

from kmesh_lib.bounds.access import build_access_trace
from kmesh_lib.bounds.ideal import (
    count_exact_prefix_edges,
    ideal_prefill_tokens,
    lru_prefill_tokens,
    simulate_lru,
    simulate_min,
    sweep_pool_sizes,
)
from kmesh_lib.sections.tot_headroom.captures import StockSweepArm, TotInvocation


@dataclass(frozen=True)
class TraceCall:
    """What the bound needs of one call of a search (``tot_search.Invocation``): a captured call's
    (``captures.TotInvocation``) fields of the same names."""

    invocation_id: str
    parent_id: str | None
    prompt_token_ids: list[int]
    output_token_ids: list[int]


Call = TraceCall | TotInvocation


def compare_bound(records: list[TotInvocation], block_size: int, num_blocks: int) -> dict:
    """The engine run's observed prefill against the LRU reference and the ideal bound at one pool size.

    Args:
        records: capture records in submission order.
        num_blocks: usable blocks (NUM_GPU_BLOCKS - 1).
    """
    ideal = ideal_prefill_tokens(records, block_size, num_blocks)
    lru = lru_prefill_tokens(records, block_size, num_blocks)
    observed = sum(len(r.prompt_token_ids) - r.num_cached_tokens for r in records)
    return {"num_blocks": num_blocks, "block_size": block_size, "num_invocations": len(records),
            "num_prompt_tokens": ideal.num_prompt_tokens, "observed_prefill_tokens": observed,
            "lru_prefill_tokens": lru.num_prefill_tokens, "ideal_prefill_tokens": ideal.num_prefill_tokens,
            "num_compulsory_tokens": ideal.num_compulsory_tokens, "headroom_tokens": observed - ideal.num_prefill_tokens,
            "num_producer_edges": sum(r.parent_id is not None for r in records),
            "num_exact_prefix_edges": count_exact_prefix_edges(records)}


def bound_table(bound: dict, outputs: str) -> list[dict]:
    """The stock-versus-ideal table at the run's pool size, with shares of all prompt tokens;
    ``outputs`` ("scripted" or "model") says who wrote the calls' outputs."""
    total = bound["num_prompt_tokens"] or 1
    rows = [("no reuse (all prompt tokens)", bound["num_prompt_tokens"]),
            ("stock vLLM, observed on the engine", bound["observed_prefill_tokens"]),
            ("LRU reference", bound["lru_prefill_tokens"]), ("ideal bound (MIN)", bound["ideal_prefill_tokens"]),
            ("compulsory (final fragment of each prompt)", bound["num_compulsory_tokens"])]
    return [{"outputs": outputs, "cache": name, "prefill_tokens": n, "share_of_prompt_tokens": round(n / total, 4)}
            for name, n in rows]


def sweep(records: list[TotInvocation], block_size: int, pool_sizes: list[int], observed: dict[int, int]) -> list[dict]:
    """LRU and ideal at every pool size on the engine run's trace (stock where observed)."""
    return sweep_pool_sizes(records, block_size, pool_sizes, observed)


def trace_record(inv) -> TraceCall:
    """What the bound needs of one call of a search (``tot_search.Invocation``)."""
    return TraceCall(inv.call.invocation_id, inv.call.parent_id, list(inv.result.prompt_token_ids),
                     list(inv.result.output_token_ids))


def arm_stock(arm: StockSweepArm) -> dict:
    """Stock vLLM's figures on one replay arm, from its per-call columns."""
    calls = arm.calls
    first = [p - c for p, c in zip(calls.num_prompt_tokens, calls.num_cached_tokens)]
    decode = [max(o - 1, 0) for o in calls.num_output_tokens]  # the last sampled token is never fed back
    recomputed = [s - f - d for s, f, d in zip(calls.num_scheduled_tokens, first, decode)]
    return {"stock_prefill_tokens": sum(first), "recomputed_tokens": sum(recomputed),
            "stock_total_tokens": sum(first) + sum(recomputed),
            "num_preempted_calls": sum(n > 0 for n in calls.num_preemptions),
            "num_evicted_blocks": arm.block_ops.evict, "drain_ok": arm.drain_ok}


def trace_rows(trace: str, outputs: str, error_rate: float | None, records: list[Call], arms: list[StockSweepArm],
               pool_sizes: list[int], block_size: int, engine_records: list[TotInvocation] | None = None,
               engine_num_blocks: int | None = None) -> list[dict]:
    """One row per pool size: LRU and ideal on ``records``; stock from the arm at that size, if any;
    for the engine trace at the run's pool size, the engine's own observation too. ``outputs``
    ("scripted" or "model") labels who wrote the trace's outputs."""
    access = build_access_trace(records, block_size)
    by_size = {arm.num_blocks: arm for arm in arms}
    rows = []
    for num_blocks in sorted(set(pool_sizes) | set(by_size)):
        ideal, lru = simulate_min(access, num_blocks), simulate_lru(access, num_blocks)
        row = {"trace": trace, "outputs": outputs, "error_rate": error_rate, "num_blocks": num_blocks, "num_calls": len(records),
               "num_prompt_tokens": ideal.num_prompt_tokens, "num_compulsory_tokens": ideal.num_compulsory_tokens,
               "ideal_prefill_tokens": ideal.num_prefill_tokens, "lru_prefill_tokens": lru.num_prefill_tokens}
        if num_blocks in by_size:
            row.update(arm_stock(by_size[num_blocks]))
            row["headroom_tokens"] = row["stock_prefill_tokens"] - row["ideal_prefill_tokens"]
            row["headroom_share"] = round(row["headroom_tokens"] / max(row["stock_prefill_tokens"], 1), 4)
        if engine_records is not None and num_blocks == engine_num_blocks:
            row["engine_prefill_tokens"] = sum(len(r.prompt_token_ids) - r.num_cached_tokens for r in engine_records)
        rows.append(row)
    return rows


def search_row(trace: str, error_rate: float, arm: StockSweepArm, records: list[Call]) -> dict:
    """What one scale search did (the same at every pool size: its outputs are forced)."""
    return {"trace": trace, "outputs": "scripted", "error_rate": error_rate, "num_puzzles": arm.num_puzzles,
            **{k: arm.counts[k] for k in ("num_calls", "num_value_calls", "num_avoided_value_calls",
                                          "num_valid_proposals", "num_invalid_proposals", "num_unparsed_proposal_lines")},
            "num_solved": arm.num_solved, "num_exact_prefix_edges": count_exact_prefix_edges(records)}
