"""Wall time of section 23 on the whole Mooncake conversation trace: the sequential replay through vLLM's
scheduler and KV-cache manager at one pool size, and the offline ideal bound (goals on a 2-core box: the
replay <= 5 min, the ideal <= 30 s).

The replay submits each request alone (its prompt built from its hash ids, its real output length, 16-token
blocks) and steps the replay engine until it finishes, decoding through vLLM's speculative path (15 drafts a
step, all accepted: the same cache as one token a step, ``engine.replay``); ``--num-speculative-tokens 0``
times one token a step. The engine's start (vLLM's imports) is timed apart.
The ideal times building the access trace from the hash ids and Belady's MIN on it, separately.
``--rebuild RUN_DIR`` times instead what ``kmesh verify 23`` spends most of its time on: every table of a
published run built again from its raw captures (``tables.derived``; on cpu-20261204-222724-ab76, the
first 12,031 requests' 18.3M block accesses, 2-core box, median of 3 processes: 16.6 s before the shared block
order, 8.9 s after).

    python3 benchmarks/bench_production_trace.py [--num-requests N] [--pool-gib 16] [--shape qwen2.5-7b] [--skip-replay]
        [--num-speculative-tokens K]
    python3 benchmarks/bench_production_trace.py --rebuild outputs/production_trace/cpu-20261204-222724-ab76 [--repeats 3]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kmesh_lib.base.data import resolve_path  # noqa: E402
from kmesh_lib.base.records import RunFiles  # noqa: E402
from kmesh_lib.bounds.ideal import simulate_min  # noqa: E402
from kmesh_lib.sections.production_trace import replay, sim, tables  # noqa: E402
from kmesh_lib.sections.production_trace.params import ProductionTraceParams, gib_to_blocks  # noqa: E402
from kmesh_lib.sections.production_trace.trace import access_trace, load_trace  # noqa: E402

TRACE = "$KMESH_DATA_ROOT/mooncake-traces/conversation_trace.jsonl"


def time_rebuild(run_dir: str, repeats: int) -> None:
    """Seconds to build a run's tables again from raw/ (``tables._build``: ``derived`` without its per-content
    cache), each repeat from nothing but the files (the trace, the passes, the tables)."""
    run = RunFiles.of(run_dir)
    walls = []
    for _ in range(repeats):
        t0 = time.monotonic()
        parts = tables._build(run)["seconds"]
        walls.append(time.monotonic() - t0)
        print(f"  {walls[-1]:.2f} s (access trace {parts.get('access_trace_s')} s, ideals {sum(parts.get('ideal_s', [])):.2f} s, "
              f"tiers {parts.get('tiers_s')} s, engines {parts.get('engines_s')} s)")
    print(f"table rebuild of {Path(run_dir).name}: {statistics.median(walls):.2f} s (median of {repeats})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-requests", type=int, default=None, help="the first N requests (default: all)")
    parser.add_argument("--pool-gib", type=float, default=16.0, help="GPU pool in GiB of KV (default 16)")
    parser.add_argument("--shape", default="qwen2.5-7b", help="shape whose bytes per token size the pool")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--skip-replay", action="store_true", help="time the ideal only")
    parser.add_argument("--num-speculative-tokens", type=int, default=None,
                        help="replay drafts per decode step (default BLOCK_SIZE - 1; 0: one token a step)")
    parser.add_argument("--rebuild", metavar="RUN_DIR", help="time a published run's table rebuild (verify's) instead")
    parser.add_argument("--repeats", type=int, default=3, help="--rebuild repeats (the median is printed)")
    args = parser.parse_args()
    if args.rebuild:
        time_rebuild(args.rebuild, args.repeats)
        return 0

    t0 = time.monotonic()
    requests = load_trace(resolve_path(TRACE), args.num_requests)
    load_s = time.monotonic() - t0
    num_blocks = gib_to_blocks(args.pool_gib, args.shape, "bfloat16", args.block_size)
    print(f"trace: {len(requests):,} requests, {sum(r.num_prompt_tokens for r in requests):,} prompt tokens, "
          f"{sum(r.num_output_tokens for r in requests):,} output tokens (read in {load_s:.1f} s)")
    print(f"pool: {args.shape} {args.pool_gib:g} GiB = {num_blocks:,} blocks of {args.block_size} tokens")

    t0 = time.monotonic()
    access = access_trace(requests, args.block_size)
    access_s = time.monotonic() - t0
    t0 = time.monotonic()
    ideal = simulate_min(access, num_blocks)
    ideal_s = time.monotonic() - t0
    t0 = time.monotonic()
    lru = sim.two_level(access, num_blocks, 0)[0]
    lru_s = time.monotonic() - t0
    prompt = ideal.num_prompt_tokens
    print(f"access trace: {access.num_accesses:,} block accesses in {access_s:.1f} s")
    print(f"ideal bound: {ideal_s:.1f} s (+ {access_s:.1f} s access trace = {ideal_s + access_s:.1f} s); "
          f"cached share {1 - ideal.num_prefill_tokens / prompt:.4f}")
    print(f"LRU model: {lru_s:.1f} s; cached share {sum(lru) * args.block_size / prompt:.4f}")
    if args.skip_replay:
        return 0

    cfg = ProductionTraceParams(TRACE_FILE=None, ENGINE="replay", BLOCK_SIZE=args.block_size, PROFILE="cpu")
    params = replay.engine_params(cfg, "replay", num_blocks, args.block_size, replay.max_model_len(requests))
    t0 = time.monotonic()
    arm = replay.run_sequential(params, requests, num_speculative_tokens=args.num_speculative_tokens)
    total_s = time.monotonic() - t0
    cached = sum(arm["requests"]["num_cached_tokens"])
    same = sum(c == h * args.block_size for c, h in zip(arm["requests"]["num_cached_tokens"], lru))
    print(f"replay (sequential, vLLM's scheduler): {arm['seconds']:.1f} s for {len(requests):,} requests "
          f"(engine start {arm['engine_start_s']:.1f} s; {total_s:.1f} s in all; {arm['num_steps']:,} steps, "
          f"{arm['num_speculative_tokens']} drafts a step); cached share {cached / prompt:.4f}; "
          f"{same:,} of {len(requests):,} requests equal the LRU model; {arm['drain']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
