"""Typed engine parameters shared by every engine section (the UPPER_CASE notebook parameters)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kmesh_lib.base.params import RunParams, check
from kmesh_lib.engine.model_spec import SHAPES

CPU_BLOCK_MULTIPLE = 32  # vLLM's CPU attention backend runs only block sizes that are multiples of 32


@dataclass(frozen=True)
class EngineParams(RunParams):
    """How to build the engine. NUM_GPU_BLOCKS counts vLLM's null block (block 0)."""

    DEVICE: Literal["cpu", "cuda"] = "cpu"
    ENGINE: Literal["real", "replay"] = "real"
    MODEL: str = "tiny"  # a shape name or a model directory
    WEIGHTS: Literal["random", "dummy"] = "random"  # synthetic shapes only
    DTYPE: Literal["float32", "bfloat16", "float16"] = "float32"
    BLOCK_SIZE: int = 32
    NUM_GPU_BLOCKS: int = 129
    MAX_MODEL_LEN: int = 2048
    MAX_NUM_SEQS: int = 16
    MAX_NUM_BATCHED_TOKENS: int = 8192
    ENFORCE_EAGER: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.BLOCK_SIZE > 0, f"BLOCK_SIZE={self.BLOCK_SIZE}: must be a positive number of tokens")
        if self.ENGINE == "real" and self.DEVICE == "cpu":
            check(self.BLOCK_SIZE % CPU_BLOCK_MULTIPLE == 0,
                  f"BLOCK_SIZE={self.BLOCK_SIZE}: the CPU attention backend runs only multiples of "
                  f"{CPU_BLOCK_MULTIPLE} (32, 64, ...); use ENGINE: replay for exact accounting at other sizes")
        check(self.NUM_GPU_BLOCKS >= 2,
              f"NUM_GPU_BLOCKS={self.NUM_GPU_BLOCKS}: must be >= 2 (it counts the null block, so N-1 are usable)")
        check(self.MAX_MODEL_LEN > 0, f"MAX_MODEL_LEN={self.MAX_MODEL_LEN}: must be > 0")
        usable_tokens = (self.NUM_GPU_BLOCKS - 1) * self.BLOCK_SIZE
        check(self.MAX_MODEL_LEN <= usable_tokens,
              f"MAX_MODEL_LEN={self.MAX_MODEL_LEN}: a request of that length needs more than the "
              f"{self.NUM_GPU_BLOCKS - 1} usable blocks of NUM_GPU_BLOCKS={self.NUM_GPU_BLOCKS} "
              f"({usable_tokens} tokens); raise NUM_GPU_BLOCKS or lower MAX_MODEL_LEN")
        check(self.MAX_NUM_SEQS >= 1, f"MAX_NUM_SEQS={self.MAX_NUM_SEQS}: must be >= 1")
        check(self.MAX_NUM_BATCHED_TOKENS >= self.BLOCK_SIZE,
              f"MAX_NUM_BATCHED_TOKENS={self.MAX_NUM_BATCHED_TOKENS}: must be >= BLOCK_SIZE")
        if self.MODEL in SHAPES:
            check(not (self.WEIGHTS == "random" and self.MODEL == "qwen2.5-7b" and self.DEVICE == "cpu"),
                  "MODEL=qwen2.5-7b with WEIGHTS=random would write a 15 GB checkpoint; use WEIGHTS: dummy")
        else:
            from pathlib import Path

            check((Path(self.MODEL).expanduser() / "config.json").is_file(),
                  f"MODEL={self.MODEL!r}: not a shape ({', '.join(SHAPES)}) and not a directory with config.json")
