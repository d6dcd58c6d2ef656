"""Section 00's parameters."""
from __future__ import annotations

from pydantic import Field

from kmesh_lib.base.params import BlockSize, NumBlocks, Tokens, check, params_dataclass
from kmesh_lib.engine.config import EngineParams


@params_dataclass
class EngineCheckParams(EngineParams):
    CONTEXT_TOKENS: Tokens = Field(96, description="tokens the two requests share")
    SUFFIX_TOKENS: Tokens = Field(16, description="tokens each request adds after the shared context")
    MAX_TOKENS: Tokens = Field(8, description="output tokens per request (greedy)")
    REPLAY_BLOCK_SIZE: BlockSize = Field(16, description="the replay engine's block size (GPU experiments use 16)")
    REPLAY_NUM_GPU_BLOCKS: NumBlocks = Field(129, description="the replay engine's pool, null block included")

    def check_rules(self) -> None:
        super().check_rules()
        check(self.CONTEXT_TOKENS >= self.BLOCK_SIZE,
              f"CONTEXT_TOKENS={self.CONTEXT_TOKENS}: must cover at least one block (BLOCK_SIZE={self.BLOCK_SIZE})")
        check(self.CONTEXT_TOKENS + self.SUFFIX_TOKENS + self.MAX_TOKENS <= self.MAX_MODEL_LEN,
              f"CONTEXT_TOKENS + SUFFIX_TOKENS + MAX_TOKENS = {self.CONTEXT_TOKENS + self.SUFFIX_TOKENS + self.MAX_TOKENS}"
              f" exceeds MAX_MODEL_LEN={self.MAX_MODEL_LEN}")
        request = self.CONTEXT_TOKENS + self.SUFFIX_TOKENS + self.MAX_TOKENS - 1  # the last token's KV is never written
        need = -(-request // self.REPLAY_BLOCK_SIZE)
        check(need <= self.REPLAY_NUM_GPU_BLOCKS - 1,
              f"REPLAY_NUM_GPU_BLOCKS={self.REPLAY_NUM_GPU_BLOCKS}: a request (CONTEXT_TOKENS + SUFFIX_TOKENS + "
              f"MAX_TOKENS) needs {need} blocks of REPLAY_BLOCK_SIZE={self.REPLAY_BLOCK_SIZE}, more than the pool's "
              f"{self.REPLAY_NUM_GPU_BLOCKS - 1} usable blocks")
