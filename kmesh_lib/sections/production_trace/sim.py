"""Offline models of a trace's block accesses: an external tier behind the pool, several engines, costs.

All of them read a ``trace.TraceAccesses`` (``trace.access_trace``) one request at a time, as
``bounds.lru`` does: per request the leading run of its read blocks that is resident is reused
(vLLM stops at the first miss), then every block it wrote moves to most-recently-used, deepest
first, and the least recently used blocks are evicted down to the capacity. Unlike ``bounds.lru``,
while a request runs its partial last block (the last ``(P+O-1) % B`` tokens' KV) takes a slot too, so
eviction goes down to one block less for it; vLLM (0.32) frees such a hashless block to the front
of its free queue, so the slot is back before the next request. With that, this model gives
vLLM's replayed ``num_cached_tokens`` request by request (a check of every run). Pins of running
requests are ignored (one request at a time).

* **Tier** (``two_level``): a GPU pool of ``pool_blocks`` in front of an LRU tier of
  ``tier_blocks`` that every written block is stored in (write-through, as LMCache stores each
  request's KV). A request reuses its GPU leading run, then restores from the tier the run that
  continues it. The ideal bound on what any two-level cache could reuse is the offline ideal of
  one pool of ``pool_blocks + tier_blocks`` (``bounds.ideal.simulate_min``).
* **Engines** (``engines``): n engines, each its own LRU pool; requests routed round-robin, or
  prefix-aware (to the engine holding the longest leading run of the request's blocks, among the
  engines whose prefill tokens so far are at most ``(1 + slack) x`` the mean, ties to the least
  loaded), or round-robin with one tier shared behind every engine.
* **Costs** (``saved_ms``): section 21's measured TTFTs of a whole context of k tokens,
  recomputed or restored, interpolated linearly between its grid points (extended along the end
  segments): restoring k tokens instead of recomputing them saves ``recompute(k) - restore(k)``.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from kmesh_lib.bounds.lru import evict, leading_run, lru_arrays, new_pools, pool_hit_blocks, write
from kmesh_lib.sections.production_trace.captures import CostRow
from kmesh_lib.sections.production_trace.trace import TraceAccesses as AccessTrace

ROUTES = ("round_robin", "prefix_aware", "round_robin_shared_tier")


def _reserved(trace: AccessTrace) -> np.ndarray:
    return np.asarray(trace.has_partial_block, dtype=np.int64)


def pool_hits(trace: AccessTrace, pool_blocks: int, hold_partial_block: bool = True) -> list[int]:
    """Per request: blocks reused from an LRU pool of ``pool_blocks`` (the partial block's slot held, unless
    ``hold_partial_block`` is False: a tier's pass)."""
    if not trace.num_requests:
        return []
    reserved = _reserved(trace) if hold_partial_block else None
    return pool_hit_blocks(lru_arrays(trace), pool_blocks, reserved).tolist()


def seen_hits(trace: AccessTrace) -> list[int]:
    """``pool_hits`` of a pool that never evicts (at least as large as the trace's distinct blocks, no
    partial slot): per request, the leading run of its reads written by some earlier request."""
    if not trace.num_requests:
        return []
    arrays = lru_arrays(trace)
    return pool_hit_blocks(arrays, arrays.num_ids).tolist()


def tier_hits(trace: AccessTrace, gpu_hits: list[int], tier_blocks: int) -> list[int]:
    """Per request: blocks restored from a write-through LRU tier of ``tier_blocks``, the run that continues
    the pool's ``gpu_hits``. The tier's contents do not depend on the pool (every write is stored), so
    its pass can follow the pool's."""
    if not trace.num_requests or tier_blocks <= 0:
        return [0] * trace.num_requests
    return pool_hit_blocks(lru_arrays(trace), tier_blocks, start_at=gpu_hits).tolist()


def tier_hits_over_pool(gpu_hits: list[int], tier_alone_hits: list[int]) -> list[int]:
    """``tier_hits`` where the tier is at least as large as the pool, from the tier's hits as if it stood
    alone (``pool_hits(trace, tier_blocks, hold_partial_block=False)``): the tier then holds every block
    the pool holds, so what it restores is its own leading run less the pool's.

    Why it holds every pool block: both see the same writes in the same order, and each, after a request,
    holds a most-recent prefix of the order every write so far makes (a request's writes go to the front;
    the prefix held before, less them, stays a prefix behind them; eviction cuts its end). The pool's
    prefix is at most ``pool_blocks`` long, the tier's is ``tier_blocks`` or all there is."""
    return [t - g for g, t in zip(gpu_hits, tier_alone_hits)]


def two_level(trace: AccessTrace, pool_blocks: int, tier_blocks: int) -> tuple[list[int], list[int]]:
    """Per request: (blocks reused from the GPU pool, blocks restored from the tier)."""
    gpu_hits = pool_hits(trace, pool_blocks)
    return gpu_hits, tier_hits(trace, gpu_hits, tier_blocks)


@njit(cache=True)
def _engines_pass(block_id, access_start, num_read_blocks, num_reserved, num_prompt_tokens, num_ids, num_engines,
                  pool_blocks, prefix_aware, slack, block_size):
    """``engines`` over the dense-id arrays, pool e engine e's. Returns (engine, gpu_hit_blocks) per request."""
    prev, nxt, resident, size = new_pools(num_engines, num_ids)
    load = np.zeros(num_engines, dtype=np.int64)  # prefill tokens computed so far, per engine
    num_requests = len(num_read_blocks)
    engine_of = np.zeros(num_requests, dtype=np.int64)
    gpu_hits = np.zeros(num_requests, dtype=np.int64)
    for r in range(num_requests):
        start, end = access_start[r], access_start[r + 1]
        reads_end = start + num_read_blocks[r]
        if prefix_aware:
            bound = (1 + slack) * load.sum() / num_engines
            engine, best_run = -1, -1
            for e in range(num_engines):  # the longest run; ties to the least loaded, then the lowest index
                if load[e] <= bound:
                    run = leading_run(resident, e, block_id, start, reads_end)
                    if engine < 0 or run > best_run or (run == best_run and load[e] < load[engine]):
                        engine, best_run = e, run
        else:
            engine = r % num_engines
        g = leading_run(resident, engine, block_id, start, reads_end)
        write(prev, nxt, resident, size, engine, block_id, reads_end, end)
        evict(prev, nxt, resident, size, engine, pool_blocks - num_reserved[r])
        load[engine] += num_prompt_tokens[r] - g * block_size
        engine_of[r], gpu_hits[r] = engine, g
    return engine_of, gpu_hits


def _routed(trace: AccessTrace, num_engines: int, pool_blocks: int, prefix_aware: bool, slack: float):
    """``_engines_pass``, once per trace and routing (``round_robin_shared_tier``'s engines are ``round_robin``'s)."""
    arrays = lru_arrays(trace)
    return trace.derived(("sim.engines", num_engines, pool_blocks, prefix_aware, slack if prefix_aware else None),
                         lambda: _engines_pass(
                             arrays.block_id, arrays.access_start, arrays.num_read_blocks, _reserved(trace),
                             np.asarray(trace.num_prompt_tokens, dtype=np.int64), arrays.num_ids, num_engines,
                             pool_blocks, prefix_aware, slack, trace.block_size))


def engines(trace: AccessTrace, num_engines: int, pool_blocks: int, route: str, tier_blocks: int = 0,
            slack: float = 0.25) -> dict[str, list[int]]:
    """Per request: the engine it ran on, the blocks its engine's pool reused, the blocks the shared tier
    restored (``round_robin_shared_tier`` only).

    The shared tier stores every request's writes, whichever engine ran it, so its contents do not depend on
    the engines: it restores what ``tier_hits`` finds after the round-robin engines' hits."""
    if route not in ROUTES:
        raise ValueError(f"route {route!r}: one of {ROUTES}")
    if not trace.num_requests:
        return {"engine": [], "gpu_hit_blocks": [], "tier_hit_blocks": []}
    engine, gpu = _routed(trace, num_engines, max(int(pool_blocks), 0), route == "prefix_aware", float(slack))
    gpu_hits = gpu.tolist()
    restored = (tier_hits(trace, gpu_hits, max(int(tier_blocks), 0)) if route == "round_robin_shared_tier"
                else [0] * trace.num_requests)
    return {"engine": engine.tolist(), "gpu_hit_blocks": gpu_hits, "tier_hit_blocks": restored}


def engine_loads(trace: AccessTrace, result: dict[str, list[int]], num_engines: int) -> list[int]:
    """Prefill tokens each engine computed."""
    load = [0] * num_engines
    for index, engine in enumerate(result["engine"]):
        reused = result["gpu_hit_blocks"][index] + result["tier_hit_blocks"][index]
        load[engine] += trace.num_prompt_tokens[index] - reused * trace.block_size
    return load


# -- costs --

def cost_curve(rows: list[CostRow], shape: str, arm: str) -> tuple[list[int], list[float]]:
    """(context tokens, TTFT ms) of one arm of one shape, sorted by context."""
    points = sorted((r.context_tokens, r.ttft_ms) for r in rows if r.shape == shape and r.arm == arm)
    return [p[0] for p in points], [p[1] for p in points]


def interp_ms(xs: list[int], ys: list[float], k: np.ndarray) -> np.ndarray:
    """Linear through the points, extended along the first and last segments."""
    k = np.asarray(k, dtype=float)
    y = np.interp(k, xs, ys)
    lo = ys[0] + (k - xs[0]) * (ys[1] - ys[0]) / (xs[1] - xs[0])
    hi = ys[-1] + (k - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return np.where(k < xs[0], lo, np.where(k > xs[-1], hi, y))


def saved_ms(rows: list[CostRow], shape: str, arm: str, restored_tokens: list[int]) -> np.ndarray:
    """Per request: estimated prefill time saved by restoring ``restored_tokens`` with ``arm`` (dram or
    disk) instead of recomputing them (0 where nothing is restored; negative where restoring is slower)."""
    k = np.asarray(restored_tokens, dtype=float)
    recompute = interp_ms(*cost_curve(rows, shape, "recompute"), k)
    restore = interp_ms(*cost_curve(rows, shape, arm), k)
    return np.where(k > 0, recompute - restore, 0.0)


def past_measured(rows: list[CostRow], shape: str, restored_tokens, saved: np.ndarray) -> dict:
    """How far a tier's saving rests on ``interp_ms``'s linear extension past section 21's longest measured context
    of ``shape``: that length (``cost_max_tokens``), the restores longer than it (``num_restores_past_measured``),
    and their part of the mean saving per request (``saved_ms_mean_past_measured``: their savings summed over every
    request, so it reads beside ``saved_ms_per_request``'s mean)."""
    xs, _ = cost_curve(rows, shape, "recompute")
    if not xs or not len(saved):
        return {}
    past = np.asarray(restored_tokens, dtype=float) > xs[-1]
    return {"cost_max_tokens": int(xs[-1]), "num_restores_past_measured": int(past.sum()),
            "saved_ms_mean_past_measured": round(float(np.asarray(saved)[past].sum()) / len(saved), 2)}


QUANTILES = (0.5, 0.9, 0.99)


def distribution(values: np.ndarray) -> dict:
    """Mean, quantiles and max of per-request values (rounded to 0.01)."""
    values = np.asarray(values, dtype=float)
    if not len(values):
        return {}
    out = {"mean": round(float(values.mean()), 2)}
    out.update({f"p{round(q * 100)}": round(float(np.quantile(values, q)), 2) for q in QUANTILES})
    out["max"] = round(float(values.max()), 2)
    return out
