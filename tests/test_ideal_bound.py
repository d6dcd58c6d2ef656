"""Offline ideal bound (section 19): exact values on hand-built traces plus properties."""

import functools
import random
from types import SimpleNamespace

import pytest

from kmesh_lib.bounds.ideal import (
    block_hashes,
    build_access_trace,
    count_exact_prefix_edges,
    ideal_prefill_tokens,
    lru_prefill_tokens,
    next_read_positions,
    simulate_lru,
    simulate_min,
    sweep_pool_sizes,
)


def req(prompt, output=(), invocation_id=None, parent_id=None):
    return {"prompt_token_ids": list(prompt), "output_token_ids": list(output),
            "invocation_id": invocation_id, "parent_id": parent_id}


def hits_per_request(result):
    return [row.num_hit_blocks for row in result.per_request]


# Three one-block contexts (B=2); each request is context + 1 question token, 1 output
# token: P=3 -> R=1 read, W=(3+1-1)//2=1 write, 1 compulsory token.
CONTEXT_A, CONTEXT_B, CONTEXT_C = [1, 2], [3, 4], [5, 6]
CYCLIC = [req(ctx + [9], [7]) for ctx in (CONTEXT_A, CONTEXT_B, CONTEXT_C) * 2]


# --- block naming and trace layout ---------------------------------------------------

def test_block_hashes_chain_the_whole_prefix_and_drop_partial_blocks():
    assert len(block_hashes([1, 2, 3, 4, 5], 2)) == 2
    assert block_hashes([], 2) == []
    # Same block tokens under a different prefix name a different block.
    assert block_hashes([1, 2, 3, 4], 2)[1] != block_hashes([9, 9, 3, 4], 2)[1]
    assert block_hashes([1, 2, 3, 4], 2) == block_hashes([1, 2, 3, 4, 5], 2)


def test_access_trace_puts_reads_then_writes_per_request():
    trace = build_access_trace([req([1, 2, 3, 4, 5], [6, 7]), req([1, 2])], block_size=2)
    # P=5: R=(5-1)//2=2 reads; W=(5+2-1)//2=3 writes. P=2: R=0, W=(2-1)//2=0.
    assert trace.num_read_blocks == [2, 0]
    assert trace.access_start == [0, 5, 5]
    assert trace.is_read == [True, True, False, False, False]
    assert trace.request_index == [0] * 5
    assert trace.block_hash[:2] == trace.block_hash[2:4]
    assert trace.num_accesses == 5 and trace.num_reads == 2 and trace.num_requests == 2


def test_next_read_positions_skip_writes():
    trace = build_access_trace(CYCLIC, block_size=2)
    # Accesses per request: [read, write]; context A is read at 0 and 6.
    never = trace.num_accesses
    assert next_read_positions(trace)[:4] == [6, 6, 8, 8]
    assert next_read_positions(trace)[6:] == [never] * 6


# --- (a) the bound beats LRU ---------------------------------------------------------

def test_cyclic_contexts_thrash_lru_but_min_keeps_two():
    ideal = ideal_prefill_tokens(CYCLIC, block_size=2, num_blocks=2)
    lru = lru_prefill_tokens(CYCLIC, block_size=2, num_blocks=2)
    # LRU: A B C evicts A, then every request misses: 6 requests x 3 tokens.
    assert hits_per_request(lru) == [0, 0, 0, 0, 0, 0]
    assert lru.num_prefill_tokens == 18
    # MIN bypasses C (read last), so the second A and B hit: 18 - 2 blocks x 2.
    assert hits_per_request(ideal) == [0, 0, 0, 1, 1, 0]
    assert ideal.num_prefill_tokens == 14
    assert (ideal.num_read_hits, ideal.num_read_misses) == (2, 4)
    assert ideal.num_compulsory_tokens == lru.num_compulsory_tokens == 6


def test_min_evicts_the_block_read_farthest_in_the_future():
    # A B A C B with one block: MIN keeps A for its re-read, then nothing helps B.
    requests = [req(ctx + [9], [7]) for ctx in (CONTEXT_A, CONTEXT_B, CONTEXT_A,
                                                CONTEXT_C, CONTEXT_B)]
    assert hits_per_request(ideal_prefill_tokens(requests, 2, 1)) == [0, 0, 1, 0, 0]
    # With two blocks MIN holds A and B; C is bypassed; LRU loses B to C.
    assert hits_per_request(ideal_prefill_tokens(requests, 2, 2)) == [0, 0, 1, 0, 1]
    assert hits_per_request(lru_prefill_tokens(requests, 2, 2)) == [0, 0, 1, 0, 0]


def test_lru_evicts_a_requests_deepest_block_first():
    # Request 1 writes [1,2] and [1..4]; request 2's block [7,8] pushes one out.
    # vLLM frees blocks tail-first, so [1..4] goes and request 3 still reuses
    # [1,2]; MIN bypasses [7,8] (never read) and keeps both.
    requests = [req([1, 2, 3, 4, 5], [6]), req([7, 8, 9], [6]), req([1, 2, 3, 4, 5], [6])]
    assert hits_per_request(lru_prefill_tokens(requests, 2, 2)) == [0, 0, 1]
    assert hits_per_request(ideal_prefill_tokens(requests, 2, 2)) == [0, 0, 2]


# --- (b) cases where the bound cannot beat LRU ---------------------------------------

def test_everything_fits_so_ideal_equals_lru():
    ideal = ideal_prefill_tokens(CYCLIC, block_size=2, num_blocks=3)
    lru = lru_prefill_tokens(CYCLIC, block_size=2, num_blocks=3)
    assert ideal.num_prefill_tokens == lru.num_prefill_tokens == 18 - 3 * 2


def test_purely_compulsory_trace_has_nothing_to_reuse():
    # P <= B: R=0, so every prompt token is compulsory whatever the pool size.
    requests = [req([1, 2], [3, 4, 5]), req([1, 2], [3]), req([1], [2])]
    for num_blocks in (0, 1, 100):
        ideal = ideal_prefill_tokens(requests, block_size=2, num_blocks=num_blocks)
        lru = lru_prefill_tokens(requests, block_size=2, num_blocks=num_blocks)
        assert ideal.num_prefill_tokens == lru.num_prefill_tokens == 5
        assert ideal.num_compulsory_tokens == 5


def test_repeated_context_with_one_block_lru_is_already_optimal():
    requests = [req(ctx + [9], [7]) for ctx in (CONTEXT_A, CONTEXT_A, CONTEXT_B, CONTEXT_B)]
    ideal = ideal_prefill_tokens(requests, block_size=2, num_blocks=1)
    lru = lru_prefill_tokens(requests, block_size=2, num_blocks=1)
    assert hits_per_request(ideal) == hits_per_request(lru) == [0, 1, 0, 1]
    assert ideal.num_prefill_tokens == lru.num_prefill_tokens == 12 - 2 * 2


def test_zero_blocks_means_everything_is_prefill():
    assert ideal_prefill_tokens(CYCLIC, 2, 0).num_prefill_tokens == 18
    assert lru_prefill_tokens(CYCLIC, 2, 0).num_prefill_tokens == 18


# --- (c) the final prompt fragment is compulsory -------------------------------------

@pytest.mark.parametrize("prompt_len, expected_per_request, compulsory", [
    (8, [8, 4], 4),    # P = 2B: R = 1, the whole last block is recomputed
    (9, [9, 1], 1),    # P = 2B + 1: R = 2, only the last token is recomputed
    (4, [4, 4], 4),    # P = B: R = 0, nothing is reusable
    (1, [1, 1], 1),
])
def test_final_prompt_fragment_is_compulsory(prompt_len, expected_per_request, compulsory):
    prompt = list(range(100, 100 + prompt_len))
    requests = [req(prompt, [1, 2]), req(prompt, [3])]
    for simulate in (ideal_prefill_tokens, lru_prefill_tokens):
        result = simulate(requests, block_size=4, num_blocks=100)
        assert [row.num_prefill_tokens for row in result.per_request] == expected_per_request
        assert [row.num_compulsory_tokens for row in result.per_request] == [compulsory] * 2
        assert result.num_prefill_tokens == sum(expected_per_request)


# --- (d) generated full blocks enter as writes ---------------------------------------

def test_child_reuses_parent_generated_blocks():
    # Parent P=4, O=3 writes (4+3-1)//2 = 3 blocks: [1,2] [1..4] [1..6], the last
    # one made of generated tokens 5, 6. The child's prompt is parent prompt +
    # output + 1 token: P=8, R=3 reads, all three hit.
    parent = req([1, 2, 3, 4], [5, 6, 7])
    child = req([1, 2, 3, 4, 5, 6, 7, 8], [9])
    for simulate in (ideal_prefill_tokens, lru_prefill_tokens):
        result = simulate([parent, child], block_size=2, num_blocks=100)
        assert hits_per_request(result) == [0, 3]
        assert [row.num_prefill_tokens for row in result.per_request] == [4, 2]


def test_last_sampled_token_never_gets_kv():
    # Parent output [5, 6]: token 6 is sampled but never fed back, so the block
    # [5, 6] is not written and the child reuses only 2 of its 3 read blocks.
    parent = req([1, 2, 3, 4], [5, 6])
    child = req([1, 2, 3, 4, 5, 6, 7, 8], [9])
    result = ideal_prefill_tokens([parent, child], block_size=2, num_blocks=100)
    assert hits_per_request(result) == [0, 2]
    assert result.num_prefill_tokens == 4 + (8 - 2 * 2)


# --- (e) the independence relaxation --------------------------------------------------

def _brute_force_max_hits(trace, num_blocks, exact_prefix):
    """Most read hits over every admit/bypass/evict choice at every write.

    exact_prefix=True counts only the leading run of resident read blocks (vLLM);
    False counts every resident read block (the ideal's independence relaxation).
    """
    @functools.cache
    def best(pos, resident):
        if pos == trace.num_accesses:
            return 0
        request_index = trace.request_index[pos]
        num_reads = trace.num_read_blocks[request_index]
        if pos == trace.access_start[request_index] and num_reads:
            reads = trace.block_hash[pos:pos + num_reads]
            in_cache = [block_hash in resident for block_hash in reads]
            num_hits = (in_cache + [False]).index(False) if exact_prefix else sum(in_cache)
            return num_hits + best(pos + num_reads, resident)
        block_hash = trace.block_hash[pos]
        choices = [resident]
        if block_hash not in resident and num_blocks > 0:
            if len(resident) < num_blocks:
                choices.append(resident | {block_hash})
            else:
                choices += [(resident - {victim}) | {block_hash} for victim in resident]
        return max(best(pos + 1, choice) for choice in choices)
    return best(0, frozenset())


def _random_tree_requests(rng, num_requests, vocab, max_new_tokens):
    """Requests that extend earlier prompts (with or without their outputs)."""
    requests = []
    for _ in range(num_requests):
        if requests and rng.random() < 0.7:
            parent = rng.choice(requests)
            base = parent["prompt_token_ids"] + (
                parent["output_token_ids"] if rng.random() < 0.5 else [])
            base = base[:rng.randint(0, len(base))]
        else:
            base = []
        prompt = base + [rng.randrange(vocab) for _ in range(rng.randint(1, max_new_tokens))]
        output = [rng.randrange(vocab) for _ in range(rng.randint(0, 3))]
        requests.append(req(prompt, output))
    return requests


def test_independence_cannot_help_on_a_shared_two_block_prefix():
    # With one block, the ideal may hold the deep block [1..4] without its parent
    # [1,2]; the second request then hits 1 block, exactly what holding [1,2]
    # gives an exact-prefix cache, so the relaxation gains nothing here.
    requests = [req([1, 2, 3, 4, 5], [6]), req([1, 2, 3, 4, 5], [6])]
    trace = build_access_trace(requests, block_size=2)
    assert simulate_min(trace, 1).num_read_hits == 1
    assert _brute_force_max_hits(trace, 1, exact_prefix=True) == 1
    assert _brute_force_max_hits(trace, 1, exact_prefix=False) == 1


def test_min_is_optimal_and_independence_relaxation_is_tight():
    # MIN equals the brute-force optimum of the relaxed problem, and also of the
    # exact-prefix problem: a child is always read after its parent, so MIN keeps
    # an ancestor-closed cache and the relaxation never lowers the bound.
    for seed in range(250):
        rng = random.Random(seed)
        block_size = rng.choice([1, 2])
        requests = _random_tree_requests(rng, rng.randint(2, 6), vocab=4, max_new_tokens=4)
        trace = build_access_trace(requests, block_size)
        for num_blocks in range(4):
            min_hits = simulate_min(trace, num_blocks).num_read_hits
            assert min_hits == _brute_force_max_hits(trace, num_blocks, exact_prefix=False)
            assert min_hits == _brute_force_max_hits(trace, num_blocks, exact_prefix=True)


# --- (f) properties on random traces --------------------------------------------------

def test_ideal_never_exceeds_lru_and_is_monotone_in_pool_size():
    for seed in range(200):
        rng = random.Random(seed)
        block_size = rng.choice([1, 2, 4])
        requests = _random_tree_requests(rng, rng.randint(1, 25), vocab=5, max_new_tokens=9)
        trace = build_access_trace(requests, block_size)
        previous_ideal = None
        for num_blocks in range(0, 14):
            ideal = simulate_min(trace, num_blocks)
            lru = simulate_lru(trace, num_blocks)
            assert ideal.num_compulsory_tokens <= ideal.num_prefill_tokens <= lru.num_prefill_tokens
            assert lru.num_prefill_tokens <= ideal.num_prompt_tokens
            for result in (ideal, lru):
                assert result.num_read_hits + result.num_read_misses == trace.num_reads
                assert result.num_prefill_tokens == (
                    result.num_prompt_tokens - result.num_read_hits * block_size)
            if previous_ideal is not None:
                assert ideal.num_prefill_tokens <= previous_ideal
            previous_ideal = ideal.num_prefill_tokens


def test_sweep_pool_sizes_rows():
    rows = sweep_pool_sizes(CYCLIC, block_size=2, pool_sizes=[1, 2, 3],
                            observed_prefill_tokens={2: 18})
    assert [row["ideal_prefill_tokens"] for row in rows] == [16, 14, 12]
    assert [row["lru_prefill_tokens"] for row in rows] == [18, 18, 12]
    assert rows[1]["observed_prefill_tokens"] == 18
    assert "observed_prefill_tokens" not in rows[0]
    assert all(row["num_prompt_tokens"] == 18 and row["num_compulsory_tokens"] == 6
               for row in rows)


def test_records_may_be_objects():
    requests = [SimpleNamespace(prompt_token_ids=r["prompt_token_ids"],
                                output_token_ids=r["output_token_ids"]) for r in CYCLIC]
    assert ideal_prefill_tokens(requests, 2, 2).num_prefill_tokens == 14


# --- (g) producer edges ---------------------------------------------------------------

def test_count_exact_prefix_edges_on_a_family_tree():
    #   root ── keeps ── child ── keeps ── grandchild
    #     ├──── rewrites ─ edited        (prompt drops the root's output)
    #     └──── echoes  ── echo          (prompt == root prompt + output exactly)
    #   orphan (parent not captured), stray (no parent)
    root = req([1, 2, 3], [4, 5], invocation_id="root")
    child = req([1, 2, 3, 4, 5, 6], [7], invocation_id="child", parent_id="root")
    grandchild = req([1, 2, 3, 4, 5, 6, 7, 8], [9], invocation_id="grand", parent_id="child")
    edited = req([1, 2, 3, 6], [7], invocation_id="edited", parent_id="root")
    echo = req([1, 2, 3, 4, 5], [], invocation_id="echo", parent_id="root")
    orphan = req([1, 2, 3, 4, 5], [], invocation_id="orphan", parent_id="missing")
    stray = req([1, 2, 3, 4, 5], [])
    family = [root, child, grandchild, edited, echo, orphan, stray]
    assert count_exact_prefix_edges(family) == 3
    assert count_exact_prefix_edges([]) == 0


def test_count_exact_prefix_edges_rejects_ambiguous_parents():
    with pytest.raises(ValueError, match="duplicate invocation_id"):
        count_exact_prefix_edges([req([1], invocation_id="a"), req([2], invocation_id="a")])
