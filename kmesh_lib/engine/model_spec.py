"""Model specs: a real model directory used as is, or a synthetic checkpoint for a named shape.

Synthetic shapes get seeded random, non-degenerate weights (``weights="random"``) written as
safetensors, so greedy outputs depend on the context and output comparisons mean something.
vLLM's ``load_format="dummy"`` fills weights with tiny uniform noise: logits come out uniform on
CPU, so use it (``weights="dummy"``) only where cache accounting or timing is all that matters
and the real checkpoint would be too large (the 7B shape).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kmesh_lib.base.params import ParamError, read_bounded
from kmesh_lib.base.paths import CACHE_DIR

# Qwen2 configs. Shapes copy the published Qwen2.5 Instruct configs; "tiny" is for tests, "kvheavy" for
# disk-tier experiments on CPU.
SHAPES: dict[str, dict] = {
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, vocab_size=512, tie_word_embeddings=True),
    # KV-heavy, for disk-tier work on CPU: 32 KiB of KV per token in float32 (Qwen2.5-0.5B has 24 KiB)
    # at about 1/20 of Qwen2.5-0.5B's compute per token, so a 256-token LMCache chunk is an 8 MiB
    # disk read while prefill stays cheap on 2 cores.
    "kvheavy": dict(hidden_size=1024, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                    num_key_value_heads=8, head_dim=128, vocab_size=4096, tie_word_embeddings=True),
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, head_dim=64, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, head_dim=128, vocab_size=152064, tie_word_embeddings=False),
}
RESIDUAL_GAIN = 12.0
LOGIT_SCALE = 6.0
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelSpec:
    """What the engine loads. ``path`` is set for a real model directory."""

    name: str
    config: dict
    path: Path | None = None

    @property
    def is_synthetic(self) -> bool:
        return self.path is None

    @property
    def num_layers(self) -> int:
        return self.config["num_hidden_layers"]

    def kv_bytes_per_token(self, dtype: str) -> int:
        head_dim = self.config.get("head_dim") or self.config["hidden_size"] // self.config["num_attention_heads"]
        return 2 * self.num_layers * self.config["num_key_value_heads"] * head_dim * DTYPE_BYTES[dtype]


# What kmesh reads from a model directory's config.json: the KV shape and the vocabulary
REQUIRED_CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")
MAX_CONFIG_BYTES = 1 << 20  # a model's config.json is a few KB
MAX_CONFIG_VALUE = 1 << 24


def read_config(model: str, key: str = "MODEL") -> tuple[Path, dict]:
    """A model directory and its config.json, checked: a regular file of at most ``MAX_CONFIG_BYTES``,
    a JSON object whose ``REQUIRED_CONFIG_KEYS`` are positive integers. ParamError (a ValueError)
    names ``key`` and what is wrong, never the file's text."""
    shown = f"{key}: {model[:60]!r}"
    try:
        path = Path(model).expanduser().resolve()
        found = (path / "config.json").is_file()
    except (OSError, RuntimeError, ValueError):
        found = False
    if not found:
        raise ParamError(f"{shown} is not a shape ({', '.join(SHAPES)}) nor a directory with config.json")
    data = read_bounded(path / "config.json", MAX_CONFIG_BYTES, "model config.json")
    try:
        config = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        raise ParamError(f"{shown}: config.json is not JSON") from None
    if not isinstance(config, dict):
        raise ParamError(f"{shown}: config.json is not a JSON object")
    if config.get("num_key_value_heads") is None and "num_attention_heads" in config:
        # multi-head attention, as transformers reads a config without it or with null (Llama 1 and 2's, GPT-NeoX's):
        # LlamaConfig and its kin set num_key_value_heads = num_attention_heads when it is None
        config["num_key_value_heads"] = config["num_attention_heads"]
    bad = [k for k in REQUIRED_CONFIG_KEYS if not (isinstance(config.get(k), int) and not isinstance(config.get(k), bool)
                                                  and 0 < config[k] <= MAX_CONFIG_VALUE)]
    if bad:
        raise ParamError(f"{shown}: config.json lacks a positive integer {', '.join(bad)} (needs "
                         f"{', '.join(REQUIRED_CONFIG_KEYS)})")
    head_dim = config.get("head_dim")
    if head_dim is not None and not (isinstance(head_dim, int) and 0 < head_dim <= MAX_CONFIG_VALUE):
        raise ParamError(f"{shown}: config.json's head_dim is not a positive integer")
    return path, config


WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")  # what vLLM's default loader reads from a model directory


def check_loadable(spec: ModelSpec, key: str = "MODEL") -> None:
    """A model directory real vLLM can load (a shape always is): config.json names its ``model_type`` (transformers
    refuses the directory without it, after the engine has begun), its heads divide as attention needs, and the
    directory holds weights. ParamError naming ``key`` otherwise; the replay engine needs none of this."""
    if spec.is_synthetic:
        return
    shown, config = f"{key}: {str(spec.path)[:60]!r}", spec.config
    model_type = config.get("model_type")
    if not (isinstance(model_type, str) and model_type.strip()):
        raise ParamError(f"{shown}: config.json names no model_type, which vLLM needs to load it")
    if config["num_attention_heads"] % config["num_key_value_heads"]:
        raise ParamError(f"{shown}: config.json's num_attention_heads ({config['num_attention_heads']}) is not a "
                         f"multiple of num_key_value_heads ({config['num_key_value_heads']})")
    if config.get("head_dim") is None and config["hidden_size"] % config["num_attention_heads"]:
        raise ParamError(f"{shown}: config.json's hidden_size ({config['hidden_size']}) is not a multiple of "
                         f"num_attention_heads ({config['num_attention_heads']}) and no head_dim is given")
    if not any(next(spec.path.glob(pattern), None) for pattern in WEIGHT_FILES):
        raise ParamError(f"{shown}: no weights there ({', '.join(WEIGHT_FILES)}); WEIGHTS applies to shapes only")


def resolve(model: str, key: str = "MODEL") -> ModelSpec:
    """``model`` is a shape name from SHAPES or a directory holding config.json (and weights);
    ParamError (a ValueError) for anything else (``read_config``)."""
    if model in SHAPES:
        return ModelSpec(model, qwen2_config(SHAPES[model]))
    path, config = read_config(model, key)
    return ModelSpec(path.name, config, path=path)


def qwen2_config(shape: dict, dtype: str = "bfloat16", max_positions: int = 32768) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
        "max_position_embeddings": max_positions, "max_window_layers": shape["num_hidden_layers"],
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "sliding_window": None, "use_sliding_window": False,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": dtype, **shape,
    }


def materialize(spec: ModelSpec, weights: str, dtype: str, seed: int) -> Path:
    """Returns a directory vLLM can load. Real models are returned as is.

    For synthetic shapes, ``weights="random"`` writes a seeded safetensors checkpoint once per
    (shape, dtype, seed) under CACHE_DIR; ``weights="dummy"`` writes only config.json.
    """
    if not spec.is_synthetic:
        return spec.path
    out = CACHE_DIR / "models" / (f"{spec.name}-{weights}-{dtype}-s{seed}" if weights == "random" else f"{spec.name}-dummy")
    done = out / ".complete"
    if done.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({**spec.config, "torch_dtype": dtype}, indent=1))
    if weights == "random":
        _write_random_weights(out / "model.safetensors", spec.config, dtype, seed)
    done.touch()
    return out


def _write_random_weights(path: Path, cfg: dict, dtype: str, seed: int) -> None:
    """Seeded Gaussian weights, scaled so activations and logits stay O(1) through the layers."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    n_heads, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // n_heads
    tdtype = getattr(torch, dtype)

    def rand(*shape: int, fan_in: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) / fan_in ** 0.5).to(tdtype)

    # NOTE: with tied embeddings the last token's own embedding dominates the residual stream and
    # greedy decoding just echoes it. Output projections scaled by RESIDUAL_GAIN let attention and
    # MLP outputs outweigh the embedding; the final norm scale keeps logits near unit spread.
    tensors = {"model.embed_tokens.weight": rand(vocab, h, fan_in=1),
               "model.norm.weight": torch.full((h,), LOGIT_SCALE / h ** 0.5, dtype=tdtype)}
    if not cfg.get("tie_word_embeddings", True):
        tensors["lm_head.weight"] = rand(vocab, h, fan_in=h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": torch.ones(h, dtype=tdtype),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=tdtype),
            p + "self_attn.q_proj.weight": rand(n_heads * hd, h, fan_in=h),
            p + "self_attn.q_proj.bias": rand(n_heads * hd, fan_in=h),
            p + "self_attn.k_proj.weight": rand(n_kv * hd, h, fan_in=h),
            p + "self_attn.k_proj.bias": rand(n_kv * hd, fan_in=h),
            p + "self_attn.v_proj.weight": rand(n_kv * hd, h, fan_in=h),
            p + "self_attn.v_proj.bias": rand(n_kv * hd, fan_in=h),
            p + "self_attn.o_proj.weight": rand(h, n_heads * hd, fan_in=n_heads * hd) * RESIDUAL_GAIN,
            p + "mlp.gate_proj.weight": rand(inter, h, fan_in=h),
            p + "mlp.up_proj.weight": rand(inter, h, fan_in=h),
            p + "mlp.down_proj.weight": rand(h, inter, fan_in=inter) * RESIDUAL_GAIN,
        })
    save_file(tensors, str(path))


class ByteTokenizer:
    """Offline tokenizer: one token per UTF-8 byte, shifted past the special ids 0-3."""

    OFFSET = 4

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 256 + self.OFFSET:
            raise ValueError(f"vocab_size {vocab_size} too small for a byte tokenizer (needs >= 260)")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [b + self.OFFSET for b in text.encode("utf-8")]

    def decode(self, token_ids: list[int]) -> str:
        data = bytes(t - self.OFFSET for t in token_ids if self.OFFSET <= t < 256 + self.OFFSET)
        return data.decode("utf-8", errors="replace")


def tokenizer_for(spec: ModelSpec):
    """A real model's own tokenizer when its directory has one, else the byte tokenizer."""
    if spec.path is not None and any((spec.path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(spec.path), local_files_only=True)
    return ByteTokenizer(spec.config["vocab_size"])
