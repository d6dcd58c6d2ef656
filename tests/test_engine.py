"""The real vLLM engine (CPU build) on the tiny random-weight model."""
import pytest

from kmesh_lib.engine.config import EngineParams
from kmesh_lib.engine.requests import RequestSpec, run_group
from kmesh_lib.engine.vllm_engine import make_engine
from kmesh_lib.kv.capture import BlockPoolCapture, drain_check

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def engine():
    e = make_engine(EngineParams(MODEL="tiny", BLOCK_SIZE=32, NUM_GPU_BLOCKS=33, MAX_MODEL_LEN=512))
    yield e
    e.close()


def tokens(n, start):
    return [4 + (start + 7 * i) % 500 for i in range(n)]


def test_warm_up_leaves_a_clean_pool(engine):
    assert engine.start_s > 0
    assert drain_check(engine.block_pool).ok
    assert engine.block_pool.num_gpu_blocks == 33  # the override counts the null block


def test_an_eager_cpu_engine_compiles_nothing(engine):
    """vLLM's sampler rank helper is a torch.compile function; the warm-up asks for logprobs, so a compile would
    have happened by now. With torch.compile off the logprobs still come with their ranks."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    assert torch._dynamo.config.disable and not counters["frames"]["total"]
    ranked, = run_group(engine, [RequestSpec("ranked", tokens(40, 3), max_tokens=2)])  # every request asks for them
    assert len(ranked.logprobs) == 2 and all(lp <= 0 for lp in ranked.logprobs)
    assert not counters["frames"]["total"]


def test_a_cpu_engine_that_is_not_eager_turns_torch_compile_back_on():
    """The switch is the process's: after an eager CPU engine, one that is not eager must compile again."""
    import torch._dynamo

    from kmesh_lib.engine.vllm_engine import compile_nothing

    was = torch._dynamo.config.disable
    try:
        compile_nothing(True)
        assert torch._dynamo.config.disable
        compile_nothing(False)
        assert not torch._dynamo.config.disable
    finally:
        torch._dynamo.config.disable = was


def test_prefix_hit_and_exact_greedy_outputs(engine):
    capture = BlockPoolCapture(engine.block_pool)
    shared = tokens(100, 1)
    a, = run_group(engine, [RequestSpec("a", shared + [9], max_tokens=6)], on_step=capture.mark_step)
    b, = run_group(engine, [RequestSpec("b", shared + [9], max_tokens=6)], on_step=capture.mark_step)
    capture.close()
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, 96)  # floor((101 - 1) / 32) * 32
    assert capture.count("touch") == 3
    # greedy decoding of the same context gives the same tokens whether the KV was cached or not
    assert a.output_token_ids == b.output_token_ids
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert drain_check(engine.block_pool).ok


def test_random_weights_are_not_degenerate(engine):
    x, y = run_group(engine, [RequestSpec("x", tokens(40, 3), max_tokens=8), RequestSpec("y", tokens(40, 11), max_tokens=8)])
    assert x.output_token_ids != y.output_token_ids  # outputs depend on the context
    assert all(lp <= 0 for lp in x.logprobs) and len(set(round(lp, 3) for lp in x.logprobs + y.logprobs)) > 3
    assert min(x.logprobs + y.logprobs) > -6.0  # far from the uniform -ln(512) = -6.24 of dummy weights


def test_seeded_sampling_is_reproducible(engine):
    spec = dict(prompt_token_ids=tokens(20, 5), max_tokens=8, temperature=0.7)
    r1, = run_group(engine, [RequestSpec("s1", seed=3, **spec)])
    r2, = run_group(engine, [RequestSpec("s2", seed=3, **spec)])
    r3, = run_group(engine, [RequestSpec("s3", seed=4, **spec)])
    assert r1.output_token_ids == r2.output_token_ids
    assert r1.output_token_ids != r3.output_token_ids


def test_timestamps_support_both_stopwatches(engine):
    results = run_group(engine, [RequestSpec(f"t{i}", tokens(33, 50 + i), max_tokens=4, submit_after_s=0.01 * i)
                                 for i in range(3)])
    for r in results:
        assert len(r.t_token_ns) == 4 and r.t_submit_ns < r.t_token_ns[0] <= r.t_token_ns[-1]
    assert results[0].t_submit_ns <= results[1].t_submit_ns <= results[2].t_submit_ns
