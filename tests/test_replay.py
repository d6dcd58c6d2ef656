"""The replay engine: vLLM's real scheduler and KV-cache manager, exact accounting, no forward pass."""
import pytest

from kmesh_lib.engine.config import EngineParams
from kmesh_lib.engine.replay import replay_token
from kmesh_lib.engine.requests import RequestSpec, group_makespan_s, run_group
from kmesh_lib.engine.vllm_engine import make_engine
from kmesh_lib.kv.capture import BlockPoolCapture, drain_check
from kmesh_lib.sections.engine_check.experiment import expected_prefix_hit


@pytest.fixture(scope="module")
def engine():
    e = make_engine(EngineParams(ENGINE="replay", BLOCK_SIZE=16, NUM_GPU_BLOCKS=17, MAX_MODEL_LEN=256))
    yield e
    e.close()


def prompt(n, start=10):
    return [start + i for i in range(n)]


def test_prefix_hit_is_block_aligned_and_leaves_the_last_token(engine):
    engine.reset_prefix_cache()
    first, = run_group(engine, [RequestSpec("a", prompt(64), max_tokens=4)])
    # 64 tokens = 4 full blocks, but the last prompt token is recomputed: 3 blocks reused
    second, = run_group(engine, [RequestSpec("b", prompt(64), max_tokens=4)])
    third, = run_group(engine, [RequestSpec("c", prompt(50) + [999], max_tokens=4)])
    assert (first.num_cached_tokens, second.num_cached_tokens, third.num_cached_tokens) == (0, 48, 48)
    assert expected_prefix_hit(64, 64, 16) == 48 and expected_prefix_hit(51, 50, 16) == 48
    assert first.output_token_ids == second.output_token_ids  # same prefix, same replay tokens
    assert drain_check(engine.block_pool).ok


def test_replay_tokens_follow_the_fixed_model(engine):
    r, = run_group(engine, [RequestSpec("d", prompt(20, 100), max_tokens=3)])
    want, prev = [], 119
    for pos in range(20, 23):
        prev = replay_token(prev, pos, engine.vocab_size)
        want.append(prev)
    assert r.output_token_ids == want and r.logprobs == [0.0, 0.0, 0.0]
    assert len(r.t_token_ns) == 3 and r.t_submit_ns <= r.t_token_ns[0] <= r.t_token_ns[-1]


def test_capture_sees_lru_eviction_order(engine):
    """16 usable blocks: a request caches 3 blocks, then a 16-block request evicts them tail first."""
    engine.reset_prefix_cache()
    capture = BlockPoolCapture(engine.block_pool)
    a, = run_group(engine, [RequestSpec("e", prompt(49, 1000), max_tokens=1)], on_step=capture.mark_step)
    a_blocks = [b for ev in capture.events if ev.op == "alloc" for b in ev.block_ids][:4]
    run_group(engine, [RequestSpec("f", prompt(16 * 16 - 1, 5000), max_tokens=1)], on_step=capture.mark_step)
    evicted = capture.evicted_block_ids()
    capture.close()
    # vLLM frees a chain in reverse so the deepest cached block is evicted first
    assert evicted[:3] == a_blocks[:3][::-1]
    counts = capture.counts()
    assert counts["alloc"] + counts["touch"] == counts["free"]  # every reference taken was dropped
    assert drain_check(engine.block_pool).ok


def test_group_makespan_is_the_last_nth_token(engine):
    specs = [RequestSpec(f"g{i}", prompt(30, 2000 + 40 * i), max_tokens=5) for i in range(4)]
    results = run_group(engine, specs)
    t0 = min(r.t_submit_ns for r in results)
    assert group_makespan_s(results, 5) == pytest.approx((max(r.t_token_ns[4] for r in results) - t0) / 1e9)
    with pytest.raises(ValueError, match="produced 5 tokens, not 6"):
        group_makespan_s(results, 6)


def test_sixty_requests_finish_and_drain(engine):
    engine.reset_prefix_cache()
    shared = prompt(32, 3000)
    results = run_group(engine, [RequestSpec(f"q{i}", shared + [7 + i], max_tokens=4) for i in range(60)])
    assert all(len(r.output_token_ids) == 4 for r in results)
    assert sum(r.num_cached_tokens for r in results) >= 59 * 32  # every later request reuses both shared blocks
    assert drain_check(engine.block_pool).ok
