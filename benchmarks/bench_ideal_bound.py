"""Wall time of the offline ideal bound (MIN) and the LRU reference on a large trace.

Synthetic agent workload: a few shared system prompts, many sessions on top of
them, and each new request extends an earlier request of its session by that
request's prompt + output + a new turn (producer edges with exact prefixes),
sessions interleaved at random. Grows until it has ``--min-reads`` block reads.

    python3 benchmarks/bench_ideal_bound.py [--min-reads 100000] [--block-size 16]
"""

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kmesh_lib.bounds.ideal import (  # noqa: E402
    build_access_trace,
    count_exact_prefix_edges,
    simulate_lru,
    simulate_min,
)


def synthetic_agent_requests(min_reads: int, block_size: int, seed: int = 0,
                             num_system_prompts: int = 4, num_sessions: int = 64,
                             max_prompt_tokens: int = 16384) -> list[dict]:
    """Branching sessions over shared system prompts, until ``min_reads`` block reads."""
    rng = random.Random(seed)
    vocab = 32000

    def new_tokens(low: int, high: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(rng.randint(low, high))]

    system_prompts = [new_tokens(1024, 2048) for _ in range(num_system_prompts)]
    sessions: list[list[dict]] = [[] for _ in range(num_sessions)]
    requests: list[dict] = []
    num_reads = 0
    while num_reads < min_reads:
        session_index = rng.randrange(num_sessions)
        session = sessions[session_index]
        # Extend a recent request of the session (a branch), or start a new task.
        parent = rng.choice(session[-4:]) if session and rng.random() < 0.9 else None
        if parent is not None and (len(parent["prompt_token_ids"])
                                   + len(parent["output_token_ids"]) < max_prompt_tokens):
            prompt = parent["prompt_token_ids"] + parent["output_token_ids"] + new_tokens(16, 400)
            parent_id = parent["invocation_id"]
        else:
            prompt = system_prompts[session_index % num_system_prompts] + new_tokens(200, 800)
            parent_id = None
        request = {"invocation_id": f"r{len(requests)}", "parent_id": parent_id,
                   "prompt_token_ids": prompt, "output_token_ids": new_tokens(20, 300)}
        session.append(request)
        requests.append(request)
        num_reads += (len(prompt) - 1) // block_size
    return requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-reads", type=int, default=100_000)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    requests = synthetic_agent_requests(args.min_reads, args.block_size, args.seed)
    started = time.perf_counter()
    trace = build_access_trace(requests, args.block_size)
    build_s = time.perf_counter() - started
    num_unique_blocks = len(set(trace.block_hash))
    print(f"{trace.num_requests} requests, {trace.num_reads} block reads, "
          f"{trace.num_accesses - trace.num_reads} block writes, "
          f"{trace.num_accesses} block accesses, {num_unique_blocks} distinct blocks; "
          f"{count_exact_prefix_edges(requests)} exact-prefix producer edges")
    print(f"build_access_trace: {build_s:.3f} s "
          f"({sum(trace.num_prompt_tokens)} prompt tokens hashed)")
    print(f"{'num_blocks':>10} {'policy':>6} {'prefill tokens':>15} {'hit rate':>8} "
          f"{'wall s':>7} {'accesses/s':>11}")
    for fraction in (1 / 16, 1 / 4, 1):
        num_blocks = max(int(num_unique_blocks * fraction), 1)
        for policy, simulate in (("ideal", simulate_min), ("lru", simulate_lru)):
            started = time.perf_counter()
            result = simulate(trace, num_blocks)
            wall_s = time.perf_counter() - started
            hit_rate = result.num_read_hits / max(trace.num_reads, 1)
            print(f"{num_blocks:>10} {policy:>6} {result.num_prefill_tokens:>15} "
                  f"{hit_rate:>8.3f} {wall_s:>7.3f} {trace.num_accesses / wall_s:>11,.0f}")


if __name__ == "__main__":
    main()
