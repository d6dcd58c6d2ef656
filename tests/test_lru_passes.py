"""The compiled LRU passes (``bounds.lru``, section 23's ``sim``) against a plain ``OrderedDict`` model.

The model below is the one the passes replaced, written as directly as it reads: per request the leading
run of resident reads, then the writes to most-recently-used (deepest first), then evict down to the
capacity less the request's reserved slots. Random traces with small pools make every path run (hits,
re-writes of resident blocks, evictions of the whole pool, capacity 0, a partial slot on some requests).
"""
from collections import OrderedDict

import pytest

from kmesh_lib.bounds.access import build_access_trace
from kmesh_lib.bounds.lru import lru_hit_blocks
from kmesh_lib.sections.production_trace import sim
from kmesh_lib.sections.production_trace.trace import access_trace, synthetic_trace


class Pool:
    def __init__(self, capacity):
        self.capacity, self.recency = max(capacity, 0), OrderedDict()

    def leading_run(self, blocks, start=0):
        n = 0
        for b in blocks[start:]:
            if b not in self.recency:
                break
            n += 1
        return n

    def write(self, blocks, num_reserved=0):
        for b in reversed(blocks):
            self.recency[b] = None
            self.recency.move_to_end(b)
        while len(self.recency) > self.capacity - num_reserved and self.recency:
            self.recency.popitem(last=False)


def blocks_of(trace, r):
    start, end = trace.access_start[r], trace.access_start[r + 1]
    reads = start + trace.num_read_blocks[r]
    return trace.block_hash[start:reads], trace.block_hash[reads:end]


def model_pool_hits(trace, capacity, reserved=None, start_at=None):
    pool, hits = Pool(capacity), []
    for r in range(trace.num_requests):
        reads, writes = blocks_of(trace, r)
        hits.append(pool.leading_run(reads, start_at[r] if start_at else 0))
        pool.write(writes, reserved[r] if reserved else 0)
    return hits


def model_engines(trace, n, pool_blocks, route, tier_blocks, slack):
    pools, tier, load = [Pool(pool_blocks) for _ in range(n)], Pool(tier_blocks if "tier" in route else 0), [0] * n
    out = {"engine": [], "gpu_hit_blocks": [], "tier_hit_blocks": []}
    for r in range(trace.num_requests):
        reads, writes = blocks_of(trace, r)
        if route == "prefix_aware":
            bound = (1 + slack) * sum(load) / n
            eligible = [e for e in range(n) if load[e] <= bound]
            runs = {e: pools[e].leading_run(reads) for e in eligible}
            engine = max(eligible, key=lambda e: (runs[e], -load[e], -e))
        else:
            engine = r % n
        g = pools[engine].leading_run(reads)
        t = tier.leading_run(reads, g) if tier.capacity else 0
        pools[engine].write(writes, trace.has_partial_block[r])
        if tier.capacity:
            tier.write(writes)
        load[engine] += trace.num_prompt_tokens[r] - (g + t) * trace.block_size
        for key, value in zip(out, (engine, g, t)):
            out[key].append(value)
    return out


@pytest.fixture(scope="module", params=[(3, 120), (11, 200)], ids=["seed3", "seed11"])
def trace(request):
    seed, num_requests = request.param
    return access_trace(synthetic_trace(num_requests, seed=seed), 16)


CAPACITIES = (0, 1, 7, 40, 150, 600, 10**6)


def test_a_pool_pass_is_the_ordered_dict_model(trace):
    partial = [int(p) for p in trace.has_partial_block]
    assert 0 < sum(partial) < trace.num_requests  # both kinds of request
    for capacity in CAPACITIES:
        assert sim.pool_hits(trace, capacity, hold_partial_block=False) == model_pool_hits(trace, capacity), capacity
        assert sim.pool_hits(trace, capacity) == model_pool_hits(trace, capacity, partial), capacity
    assert sim.seen_hits(trace) == model_pool_hits(trace, 10**9)
    assert sum(sim.pool_hits(trace, 40)) > 0  # the small pools reuse something: a pass of zeros would prove little


def test_a_tier_pass_continues_the_pools_run_as_the_model_does(trace):
    for pool in (7, 40):
        gpu = sim.pool_hits(trace, pool)
        for tier in CAPACITIES:
            assert sim.tier_hits(trace, gpu, tier) == model_pool_hits(trace, tier, start_at=gpu), (pool, tier)
        assert sum(sim.tier_hits(trace, gpu, 600)) > 0


@pytest.mark.parametrize("route", sim.ROUTES)
@pytest.mark.parametrize("num_engines", [1, 2, 4])
def test_an_engines_pass_routes_and_reuses_as_the_model_does(trace, route, num_engines):
    for pool, tier, slack in ((7, 0, 0.25), (40, 150, 0.25), (150, 600, 0.0), (40, 10**6, 1.0)):
        got = sim.engines(trace, num_engines, pool, route, tier_blocks=tier, slack=slack)
        assert got == model_engines(trace, num_engines, pool, route, tier, slack), (pool, tier, slack)


def test_bounds_lru_reads_token_level_hashes_of_any_size():
    """``build_access_trace`` names blocks by Python's 64-bit hash; names past int64 take the dict path."""
    requests = [{"prompt_token_ids": list(range(i % 3, 200 + i)), "output_token_ids": [1, 2, 3]} for i in range(30)]
    tokens = build_access_trace(requests, 16)
    wide = build_access_trace(requests, 16)
    wide.block_hash = [h + 2**70 for h in wide.block_hash]
    for capacity in (0, 5, 30, 1000):
        expected = model_pool_hits(tokens, capacity)
        assert lru_hit_blocks(tokens, capacity) == expected == lru_hit_blocks(wide, capacity)
    assert sum(model_pool_hits(tokens, 30)) > 0
