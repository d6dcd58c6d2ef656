"""Section 21's parameters: model shapes, context lengths, arms and repeats."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kmesh_lib.base.params import check
from kmesh_lib.engine.config import EngineParams
from kmesh_lib.engine.model_spec import SHAPES, resolve
from kmesh_lib.sections.crossover.arms import ARM_NAMES

MIB = 1 << 20


@dataclass(frozen=True)
class CrossoverParams(EngineParams):
    MODELS: list[str] = field(default_factory=lambda: ["tiny", "kvheavy"])
    CONTEXT_TOKENS_GRID: list[int] = field(default_factory=lambda: [256, 1024, 2048])
    ARMS: list[str] = field(default_factory=lambda: list(ARM_NAMES))
    NUM_REPEATS: int = 6
    WARMUP_REPEATS: int = 1
    SUFFIX_TOKENS: int = 32
    MAX_TOKENS: int = 1
    NUM_FOLLOWUPS: int = 1
    PATH: Literal["auto", "mp", "inproc"] = "auto"
    CHUNK_SIZE: int = 256
    ARENA_MIB: int = 512
    DISK_TIER_MIB: int = 4096
    DISK_TIER_ROOT: str = ""
    FLOOR_DISK_MIB: int = 256
    FLOOR_COPY_MIB: int = 256
    CHILD_TIMEOUT_S: int = 1800

    def __post_init__(self) -> None:
        super().__post_init__()

        check(bool(self.MODELS), "MODELS: name at least one model shape")
        for m in self.MODELS:
            check(m in SHAPES or (Path(m).expanduser() / "config.json").is_file(),
                  f"MODELS: {m!r} is not a shape ({', '.join(SHAPES)}) nor a directory with config.json")
            check(not (m == "qwen2.5-7b" and self.WEIGHTS == "random" and self.DEVICE == "cpu"),
                  "MODELS: qwen2.5-7b with WEIGHTS=random would write a 15 GB checkpoint; use WEIGHTS: dummy")
        check(bool(self.CONTEXT_TOKENS_GRID), "CONTEXT_TOKENS_GRID: name at least one context length")
        check(self.CHUNK_SIZE > 0 and self.CHUNK_SIZE % self.BLOCK_SIZE == 0,
              f"CHUNK_SIZE={self.CHUNK_SIZE}: must be a positive multiple of BLOCK_SIZE={self.BLOCK_SIZE}")
        for n in self.CONTEXT_TOKENS_GRID:
            check(n > 0 and n % self.CHUNK_SIZE == 0,
                  f"CONTEXT_TOKENS_GRID: {n} is not a positive multiple of CHUNK_SIZE={self.CHUNK_SIZE} "
                  "(a restore covers whole chunks)")
            for m in self.MODELS:
                limit = resolve(m).config.get("max_position_embeddings", 1 << 30)
                check(n + self.SUFFIX_TOKENS + 1 <= limit,
                      f"CONTEXT_TOKENS_GRID: {n} + SUFFIX_TOKENS={self.SUFFIX_TOKENS} + 1 exceeds {m}'s "
                      f"{limit} positions; the longest context it takes is "
                      f"{(limit - self.SUFFIX_TOKENS - 1) // self.CHUNK_SIZE * self.CHUNK_SIZE}")
        unknown = sorted(set(self.ARMS) - set(ARM_NAMES))
        check(not unknown and "recompute" in self.ARMS,
              f"ARMS={self.ARMS}: choose from {', '.join(ARM_NAMES)}; recompute (the control) is required")
        check(self.NUM_REPEATS >= 1, f"NUM_REPEATS={self.NUM_REPEATS}: must be >= 1")
        check(self.WARMUP_REPEATS >= 0, f"WARMUP_REPEATS={self.WARMUP_REPEATS}: must be >= 0")
        check(self.SUFFIX_TOKENS >= 1, f"SUFFIX_TOKENS={self.SUFFIX_TOKENS}: must be >= 1")
        check(self.MAX_TOKENS >= 1, f"MAX_TOKENS={self.MAX_TOKENS}: must be >= 1")
        check(self.NUM_FOLLOWUPS >= 1, f"NUM_FOLLOWUPS={self.NUM_FOLLOWUPS}: must be >= 1")
        check(self.ARENA_MIB > 0 and self.DISK_TIER_MIB > 0, "ARENA_MIB and DISK_TIER_MIB must be > 0")
        check(self.PATH != "inproc" or self.DEVICE == "cuda",
              "PATH=inproc: LMCache's in-process connector has no CPU GPU-connector; use mp (or auto) on cpu")
        for m in self.MODELS:
            need = max(self.CONTEXT_TOKENS_GRID) * resolve(m).kv_bytes_per_token(self.DTYPE) / MIB
            check(need * 1.25 <= self.ARENA_MIB,
                  f"ARENA_MIB={self.ARENA_MIB}: {m}'s longest context is {need:.0f} MiB of KV; the arena needs 25 % headroom")

    @property
    def path(self) -> str:
        return self.PATH if self.PATH != "auto" else ("inproc" if self.DEVICE == "cuda" else "mp")


def model_params(cfg: CrossoverParams, model: str) -> CrossoverParams:
    """The engine for ``model``: a pool and model length that fit the longest context's follow-ups."""
    b = cfg.BLOCK_SIZE
    max_len = math.ceil((max(cfg.CONTEXT_TOKENS_GRID) + cfg.SUFFIX_TOKENS + 1) / b) * b + b
    blocks = (max_len // b) * (cfg.NUM_FOLLOWUPS + 1) + 9
    return dataclasses.replace(cfg, MODEL=model, MAX_MODEL_LEN=max_len, NUM_GPU_BLOCKS=blocks,
                               MAX_NUM_BATCHED_TOKENS=max(cfg.MAX_NUM_BATCHED_TOKENS, max_len),
                               MAX_NUM_SEQS=max(cfg.MAX_NUM_SEQS, cfg.NUM_FOLLOWUPS + 1))


def grid_size(cfg: CrossoverParams) -> int:
    return len(cfg.MODELS) * len(cfg.CONTEXT_TOKENS_GRID) * len(cfg.ARMS) * (cfg.WARMUP_REPEATS + cfg.NUM_REPEATS)
