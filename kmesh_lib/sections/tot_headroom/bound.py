"""Stock vLLM's observed prefill against the LRU model and the offline ideal bound."""
from __future__ import annotations

from kmesh_lib.bounds.ideal import count_exact_prefix_edges, ideal_prefill_tokens, lru_prefill_tokens, sweep_pool_sizes
from kmesh_lib.sections.tot_headroom.params import TotHeadroomParams


def compare_bound(records: list[dict], block_size: int, num_blocks: int) -> dict:
    """Stock vLLM's observed prefill against the LRU model and the ideal bound at one pool size.

    Args:
        records: capture records in submission order.
        num_blocks: usable blocks (NUM_GPU_BLOCKS - 1).
    """
    ideal = ideal_prefill_tokens(records, block_size, num_blocks)
    lru = lru_prefill_tokens(records, block_size, num_blocks)
    observed = sum(len(r["prompt_token_ids"]) - r["num_cached_tokens"] for r in records)
    return {"num_blocks": num_blocks, "block_size": block_size, "num_invocations": len(records),
            "num_prompt_tokens": ideal.num_prompt_tokens, "observed_prefill_tokens": observed,
            "lru_prefill_tokens": lru.num_prefill_tokens, "ideal_prefill_tokens": ideal.num_prefill_tokens,
            "num_compulsory_tokens": ideal.num_compulsory_tokens, "headroom_tokens": observed - ideal.num_prefill_tokens,
            "num_producer_edges": sum(r["parent_id"] is not None for r in records),
            "num_exact_prefix_edges": count_exact_prefix_edges(records)}


def bound_table(bound: dict) -> list[dict]:
    """The stock-versus-ideal table: prefill tokens and their share of all prompt tokens."""
    total = bound["num_prompt_tokens"] or 1
    rows = [("no reuse (all prompt tokens)", bound["num_prompt_tokens"]),
            ("stock vLLM, observed", bound["observed_prefill_tokens"]),
            ("LRU model of stock", bound["lru_prefill_tokens"]), ("ideal bound (MIN)", bound["ideal_prefill_tokens"]),
            ("compulsory (final fragment of each prompt)", bound["num_compulsory_tokens"])]
    return [{"policy": name, "prefill_tokens": n, "share_of_prompt_tokens": round(n / total, 4)} for name, n in rows]


def sweep(records: list[dict], cfg: TotHeadroomParams, bound: dict) -> list[dict]:
    sizes = sorted(set(cfg.SWEEP_POOL_BLOCKS) | {cfg.NUM_GPU_BLOCKS - 1})
    return sweep_pool_sizes(records, cfg.BLOCK_SIZE, sizes, {bound["num_blocks"]: bound["observed_prefill_tokens"]})
