"""Section 00's parameters."""
from __future__ import annotations

from dataclasses import dataclass

from kmesh_lib.base.params import check
from kmesh_lib.engine.config import EngineParams


@dataclass(frozen=True)
class EngineCheckParams(EngineParams):
    CONTEXT_TOKENS: int = 96  # tokens the two requests share
    SUFFIX_TOKENS: int = 16  # tokens each request adds after the prefix
    MAX_TOKENS: int = 8  # output tokens per request (greedy)
    REPLAY_BLOCK_SIZE: int = 16  # the replay engine's block size (GPU experiments use 16)
    REPLAY_NUM_GPU_BLOCKS: int = 129  # the replay engine's pool, null block included

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.CONTEXT_TOKENS >= self.BLOCK_SIZE,
              f"CONTEXT_TOKENS={self.CONTEXT_TOKENS}: must cover at least one block (BLOCK_SIZE={self.BLOCK_SIZE})")
        check(self.SUFFIX_TOKENS >= 1, f"SUFFIX_TOKENS={self.SUFFIX_TOKENS}: must be >= 1")
        check(self.MAX_TOKENS >= 1, f"MAX_TOKENS={self.MAX_TOKENS}: must be >= 1")
        check(self.CONTEXT_TOKENS + self.SUFFIX_TOKENS + self.MAX_TOKENS <= self.MAX_MODEL_LEN,
              f"CONTEXT_TOKENS + SUFFIX_TOKENS + MAX_TOKENS = {self.CONTEXT_TOKENS + self.SUFFIX_TOKENS + self.MAX_TOKENS}"
              f" exceeds MAX_MODEL_LEN={self.MAX_MODEL_LEN}")
        check(self.REPLAY_BLOCK_SIZE > 0, f"REPLAY_BLOCK_SIZE={self.REPLAY_BLOCK_SIZE}: must be > 0")
        check(self.REPLAY_NUM_GPU_BLOCKS >= 2, f"REPLAY_NUM_GPU_BLOCKS={self.REPLAY_NUM_GPU_BLOCKS}: must be >= 2")
