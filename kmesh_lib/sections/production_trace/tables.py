"""Section 23's tables, each a pure function of what ``raw/`` holds (the trace, the replay arms, the costs).

The run computes them once and saves them in ``results.json``; ``checks`` and the declared tables
(``result``) compare it with ``derived(run)``: every table built again from ``raw/`` and the params,
once per content in a process (see there). Within one build a pass over the trace (the LRU model or the
ideal at a pool size) runs once, however many tables use it (``AccessTrace.derived``).

Vocabulary (token counts over every request of the trace):

    num_prompt_tokens       every prompt token (no reuse at all)
    num_compulsory_tokens   each prompt's final fragment (P - R*B), which no cache can serve
    ideal_prefill_tokens    the offline ideal bound (``bounds.ideal``): no exact-prefix cache of that
                            pool computes fewer
    lru_prefill_tokens      the LRU model of vLLM's pool (``sim``: ``bounds.lru`` plus the slot a
                            request's partial last block takes), one request at a time
    stock_prefill_tokens    stock vLLM on the replay engine: prompt tokens minus ``num_cached_tokens``
    headroom_tokens         stock (or LRU) prefill minus the ideal: what better retention could save
    *_cached_share          reused prompt tokens / all prompt tokens
    reuse_share_of_bound    stock's (or LRU's) reused tokens / the ideal's reused tokens
"""
from __future__ import annotations

import time
from dataclasses import asdict

import numpy as np

from kmesh_lib.base.derived import once_per_content
from kmesh_lib.base.records import RunFiles
from kmesh_lib.bounds.ideal import BoundResult, simulate_min
from kmesh_lib.bounds.lru import lru_arrays
from kmesh_lib.sections.production_trace import sim
from kmesh_lib.sections.production_trace.captures import CostRow, ParityRun, ReplayArm, TraceLine
from kmesh_lib.sections.production_trace.params import (
    COSTS,
    REPLAY,
    TRACE,
    gib_to_blocks,
    pool_grid,
    tier_grid,
)
from kmesh_lib.sections.production_trace.trace import TraceRequest, access_trace, consistent


def requests_of(records: list[TraceLine]) -> list[TraceRequest]:
    """The trace as ``raw/trace.jsonl`` holds it; TraceFormatError at a request whose hash ids do not cover its
    prompt."""
    return [consistent(r.request(), f"raw/{TRACE}: request {i}") for i, r in enumerate(records)]


def _pass(access, key: tuple, compute):
    return access.derived(("production_trace",) + key, compute)


def lru_hits(access, num_blocks: int) -> list[int]:
    """``sim.pool_hits``, once per pool size and trace."""
    return _pass(access, ("lru", num_blocks), lambda: sim.pool_hits(access, num_blocks))


def tier_alone_hits(access, tier_blocks: int, num_distinct: int) -> list[int]:
    """An LRU tier's own leading runs (no partial slot), once per size and trace; every size from the
    trace's distinct blocks up never evicts and shares one pass (``sim.seen_hits``)."""
    if tier_blocks >= num_distinct:
        return _pass(access, ("seen",), lambda: sim.seen_hits(access))
    return _pass(access, ("tier", tier_blocks), lambda: sim.pool_hits(access, tier_blocks, hold_partial_block=False))


def ideal(access, num_blocks: int) -> BoundResult:
    """``simulate_min``, once per pool size and trace."""
    return _pass(access, ("ideal", num_blocks), lambda: simulate_min(access, num_blocks))


def _share(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


def stock_columns(arm: ReplayArm) -> dict:
    prompt = sum(arm.requests.num_prompt_tokens)
    cached = sum(arm.requests.num_cached_tokens)
    return {"stock_prefill_tokens": prompt - cached, "stock_cached_share": _share(cached, prompt)}


def pool_table(cfg, access, arms: list[ReplayArm], timings: dict | None = None) -> list[dict]:
    """One row per (shape, pool GiB): LRU and ideal at every size, stock where a replay arm ran at it.

    ``timings``, when given, receives the seconds each ideal took (``ideal_s``, by row)."""
    by_blocks = {arm.num_blocks: arm for arm in arms if arm.mode == "sequential"}
    rows = []
    for pool in pool_grid(cfg):
        t0 = time.monotonic()
        bound = ideal(access, pool.num_blocks)
        if timings is not None:
            timings.setdefault("ideal_s", []).append(round(time.monotonic() - t0, 2))
        prompt = bound.num_prompt_tokens
        lru_prefill = prompt - sum(lru_hits(access, pool.num_blocks)) * cfg.BLOCK_SIZE
        row = {**asdict(pool), "pool_tokens": pool.num_blocks * cfg.BLOCK_SIZE, "num_prompt_tokens": prompt,
               "num_compulsory_tokens": bound.num_compulsory_tokens,
               "ideal_prefill_tokens": bound.num_prefill_tokens, "lru_prefill_tokens": lru_prefill,
               "ideal_cached_share": _share(prompt - bound.num_prefill_tokens, prompt),
               "lru_cached_share": _share(prompt - lru_prefill, prompt)}
        arm = by_blocks.get(pool.num_blocks) if pool.shape == cfg.REPLAY_SHAPE else None
        observed = stock_columns(arm)["stock_prefill_tokens"] if arm else None
        base = observed if observed is not None else lru_prefill
        row.update({"stock": "replayed" if arm else "LRU reference", "stock_prefill_tokens": observed,
                    "headroom_tokens": base - bound.num_prefill_tokens,
                    "headroom_share_of_stock": _share(base - bound.num_prefill_tokens, base),
                    "reuse_share_of_bound": _share(prompt - base, prompt - bound.num_prefill_tokens)})
        rows.append(row)
    return rows


def replay_rows(cfg, access, arms: list[ReplayArm]) -> list[dict]:
    """Each replay arm against the LRU reference and the ideal at its pool, request by request."""
    rows = []
    for arm in arms:
        if arm.mode != "sequential":
            continue
        hits = lru_hits(access, arm.num_blocks)
        cached = arm.requests.num_cached_tokens
        differ = [i for i, (c, h) in enumerate(zip(cached, hits)) if c != h * access.block_size]
        rows.append({"pool_gib": arm.pool_gib, "num_blocks": arm.num_blocks, "num_requests": len(cached),
                     **stock_columns(arm), "lru_prefill_tokens": sum(access.num_prompt_tokens)
                     - sum(hits) * access.block_size,
                     "ideal_prefill_tokens": ideal(access, arm.num_blocks).num_prefill_tokens,
                     "num_requests_differing_from_lru": len(differ), "first_differing_request": differ[0] if differ else None,
                     "seconds": arm.seconds, "drain_ok": arm.drain_ok})
    return rows


def concurrent_rows(cfg, access, arms: list[ReplayArm]) -> list[dict]:
    """Each concurrent arm: stock's prefill when first scheduled, what preemption made it compute again,
    the ideal at its pool, and first-token times on the step-time model's clock (quantiles, seconds)."""
    rows = []
    for arm in arms:
        if arm.mode != "concurrent":
            continue
        cols = arm.requests
        prompt = sum(cols.num_prompt_tokens)
        first = [p - c for p, c in zip(cols.num_prompt_tokens, cols.num_cached_tokens)]
        decode = [max(o - 1, 0) for o in cols.num_output_tokens]
        recomputed = sum(s - f - d for s, f, d in zip(cols.num_scheduled_tokens, first, decode))
        ttft = np.asarray(cols.t_first_token_s) - np.asarray(cols.t_arrival_s)
        rows.append({"pool_gib": arm.pool_gib, "num_blocks": arm.num_blocks, "num_requests": len(first),
                     "max_num_seqs": arm.max_num_seqs, "stock_prefill_tokens": sum(first),
                     "stock_cached_share": _share(prompt - sum(first), prompt), "recomputed_tokens": recomputed,
                     "num_preempted_requests": sum(n > 0 for n in cols.num_preemptions),
                     "ideal_prefill_tokens": ideal(access, arm.num_blocks).num_prefill_tokens,
                     "ttft_s": sim.distribution(ttft), "span_s": arm.span_s, "num_steps": arm.num_steps,
                     "seconds": arm.seconds, "drain_ok": arm.drain_ok})
    return rows


def tier_table(cfg, access, costs: list[CostRow]) -> list[dict]:
    """One row per (shape, tier kind, tier GiB) behind a TIER_POOL_GIB pool: what the tier restores
    (LRU), the ideal of one pool as large as both, and the prefill time the restores save per
    request, priced with section 21's measured TTFTs for that shape (dram or disk arm), with how much of
    the mean saving comes from restores longer than section 21 measured (``sim.past_measured``)."""
    rows = []
    # a pool at least as large as the trace's distinct blocks never evicts: every such size has one ideal
    num_distinct = lru_arrays(access).num_ids  # (the LRU passes' dense ids: one per distinct block)
    for tier in tier_grid(cfg):
        gpu_hits = lru_hits(access, tier.pool_blocks)
        if tier.tier_blocks >= tier.pool_blocks:
            tier_hits = sim.tier_hits_over_pool(gpu_hits, tier_alone_hits(access, tier.tier_blocks, num_distinct))
        else:
            tier_hits = sim.tier_hits(access, gpu_hits, tier.tier_blocks)
        both = min(tier.pool_blocks + tier.tier_blocks, num_distinct)
        both_prefill = ideal(access, both).num_prefill_tokens
        prompt = sum(access.num_prompt_tokens)
        restored = [t * access.block_size for t in tier_hits]
        run_ids = sorted({c.run_id for c in costs if c.shape == tier.shape})
        row = {**asdict(tier), "gpu_reused_tokens": sum(gpu_hits) * access.block_size, "tier_restored_tokens": sum(restored),
               "ideal_reused_tokens": prompt - both_prefill, "num_prompt_tokens": prompt,
               "num_restoring_requests": sum(r > 0 for r in restored),
               "restored_tokens_per_request": sim.distribution(np.asarray(restored)),
               "cost_run": run_ids[0] if run_ids else None}
        row["reused_share"] = _share(row["gpu_reused_tokens"] + row["tier_restored_tokens"], prompt)
        row["ideal_reused_share"] = _share(row["ideal_reused_tokens"], prompt)
        if run_ids:
            saved = sim.saved_ms(costs, tier.shape, tier.tier, restored)
            row["saved_ms_per_request"] = sim.distribution(saved)
            row["saved_ms_per_restoring_request"] = sim.distribution(saved[np.asarray(restored) > 0])
            row["saved_s_total"] = round(float(saved.sum()) / 1e3, 2)
            row.update(sim.past_measured(costs, tier.shape, restored, saved))
        rows.append(row)
    return rows


def engine_table(cfg, access) -> list[dict]:
    """One row per (engine count, route): reused tokens and the busiest engine's prefill over the mean."""
    pool = gib_to_blocks(cfg.ENGINE_POOL_GIB, cfg.REPLAY_SHAPE, cfg.KV_DTYPE, cfg.BLOCK_SIZE)
    tier = gib_to_blocks(cfg.SHARED_TIER_GIB, cfg.REPLAY_SHAPE, cfg.KV_DTYPE, cfg.BLOCK_SIZE)
    prompt = sum(access.num_prompt_tokens)
    rows = []
    for n in cfg.NUM_ENGINES:
        for route in sim.ROUTES:
            result = sim.engines(access, n, pool, route, tier_blocks=tier, slack=cfg.LOAD_SLACK)
            loads = sim.engine_loads(access, result, n)
            gpu = sum(result["gpu_hit_blocks"]) * access.block_size
            restored = sum(result["tier_hit_blocks"]) * access.block_size
            mean = sum(loads) / n
            rows.append({"num_engines": n, "route": route, "pool_blocks": pool,
                         "tier_blocks": tier if route == "round_robin_shared_tier" else 0,
                         "gpu_reused_tokens": gpu, "tier_restored_tokens": restored,
                         "reused_share": _share(gpu + restored, prompt),
                         "max_engine_prefill_tokens": max(loads), "load_imbalance": round(max(loads) / mean, 4) if mean else 0.0,
                         "num_requests_per_engine": [result["engine"].count(e) for e in range(n)]})
    return rows


def parity_table(records: list[ParityRun]) -> list[dict]:
    """Per engine of the parity slice: requests, prompt and cached tokens."""
    return [{"engine": r.engine, "model": r.model, "block_size": r.block_size, "num_blocks": r.num_blocks,
             "num_requests": len(r.requests.num_cached_tokens), "num_prompt_tokens": sum(r.requests.num_prompt_tokens),
             "num_cached_tokens": sum(r.requests.num_cached_tokens), "drain_ok": r.drain_ok}
            for r in records]


# -- the tables again, from a run's files --

def _build(run: RunFiles) -> dict:
    cfg = run.params
    requests = requests_of(run.records(TRACE))
    arms, costs = run.records(REPLAY), run.records(COSTS)
    out = {"replays": [], "concurrent": [], "pools": None, "tiers": None, "engines": None, "lru_alone": {},
           "seconds": {}}
    if not requests:
        return out
    seconds = out["seconds"]
    t0 = time.monotonic()
    access = access_trace(requests, cfg.BLOCK_SIZE)
    seconds["access_trace_s"] = round(time.monotonic() - t0, 2)
    out["pools"] = pool_table(cfg, access, arms, seconds)  # first: each ideal's own time (ideal_s, by row)
    out.update(replays=replay_rows(cfg, access, arms), concurrent=concurrent_rows(cfg, access, arms))
    t0 = time.monotonic()
    out["tiers"] = tier_table(cfg, access, costs)
    seconds["tiers_s"] = round(time.monotonic() - t0, 2)
    t0 = time.monotonic()
    out["engines"] = engine_table(cfg, access)
    seconds["engines_s"] = round(time.monotonic() - t0, 2)
    out["lru_alone"] = {t["pool_blocks"]: sum(lru_hits(access, t["pool_blocks"])) * cfg.BLOCK_SIZE
                        for t in out["tiers"]}
    return out


def derived(run) -> dict:
    """Every table of ``run`` built again from ``raw/`` (trace, replay arms, costs) and its params, the tables
    ``checks`` and the declared tables hold ``results.json`` to: ``replays``, ``concurrent``, ``pools``,
    ``tiers``, ``engines``, and ``lru_alone`` (the pool's LRU reuse, tokens, by pool blocks, for the tier check);
    and ``seconds``, what building them took (the run records it; verify compares none of it).

    Built once per content in a process (``base.derived``: keyed by those three captures and the params as
    recorded, all but RUN_DIR), so one ``kmesh verify`` (the checks, then the declared tables) builds them
    once, and a copy of a run whose files are unchanged (publish's, the tamper suite's) is not built again,
    while any edit to raw/ or the params builds afresh. Nothing recorded is trusted: the key names the
    inputs, never a result.
    """
    run = RunFiles.of(run)
    return once_per_content(run, "production_trace.derived", (TRACE, REPLAY, COSTS), lambda: _build(run))


__all__ = ["access_trace", "concurrent_rows", "derived", "engine_table", "ideal", "lru_hits", "parity_table",
           "pool_table", "replay_rows", "requests_of", "tier_table"]
