"""Section 18's parameters and the block arithmetic they are checked with."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from kmesh_lib.base.params import (
    MAX_BLOCKS,
    BlockSize,
    NumBlocks,
    PositiveCount,
    Seconds,
    Tokens,
    check,
    params_dataclass,
)
from kmesh_lib.engine.config import EngineParams

ARMS = ("stock", "held")


@params_dataclass
class FamilyHoldParams(EngineParams):
    """Per arm-sample: a parent, NUM_PASSES passes over NUM_NOISE unrelated prompts, then a child =
    parent input + parent output + CHILD_SUFFIX_TOKENS tokens; the stock and held arms alternate."""

    PARENT_TOKENS: Tokens = Field(512, description="parent prompt tokens")
    NOISE_TOKENS: Tokens = Field(497, description="tokens of each unrelated (competing) prompt")
    NUM_NOISE: PositiveCount = Field(4, description="unrelated prompts per pass")
    NUM_PASSES: PositiveCount = Field(2, description="passes over the unrelated prompts between parent and child")
    CHILD_SUFFIX_TOKENS: Tokens = Field(
        64, description="tokens the child adds after the parent's input + output; at least 1, so the child extends the parent")
    MAX_TOKENS: Tokens = Field(8, description="greedy output tokens per request")
    NUM_SAMPLES: PositiveCount = Field(3, description="samples per arm; fresh prompts per sample, the same in both arms")
    MAX_HELD_BLOCKS: Annotated[int, Field(ge=1, le=MAX_BLOCKS)] | None = Field(
        None, description="cap on unique held blocks; None: the usable blocks one unrelated request leaves")
    MAX_FAMILIES: PositiveCount = Field(4, description="cap on active families")
    EXPIRY_S: Seconds = Field(60.0, description="a hold expires this long after it was taken")
    # A chosen-token logprob that differs by 10 nats means the arms disagree; a larger tolerance
    # would make the arms' equality check vacuous.
    LOGPROB_TOLERANCE: float = Field(
        0.0, ge=0, le=10, description="largest absolute difference of a chosen-token logprob between arms; 0: exact")
    REPLAY_BLOCK_SIZE: BlockSize = Field(16, description="second run mode: the replay engine's block size (GPU-sized)")
    REPLAY_NUM_GPU_BLOCKS: NumBlocks = Field(129, description="the replay engine's pool, null block included")
    SWEEP_NUM_GPU_BLOCKS: list[NumBlocks] = Field(
        default_factory=lambda: list(range(72, 201, 8)), min_length=1,
        description="replay pools of the parent-share sweep (the parent's 32 blocks are 16%-45% of them)")

    def check_rules(self) -> None:
        # A pool smaller than the parent is the clearer message: check it before the engine's rules.
        check_pool(self, self.BLOCK_SIZE, self.NUM_GPU_BLOCKS, "NUM_GPU_BLOCKS")
        super().check_rules()
        check(self.child_len + self.MAX_TOKENS <= self.MAX_MODEL_LEN,
              f"the child needs {self.child_len} prompt + {self.MAX_TOKENS} output tokens, more than "
              f"MAX_MODEL_LEN={self.MAX_MODEL_LEN}")
        check_pool(self, self.REPLAY_BLOCK_SIZE, self.REPLAY_NUM_GPU_BLOCKS, "REPLAY_NUM_GPU_BLOCKS")
        for n in self.SWEEP_NUM_GPU_BLOCKS:
            check_pool(self, self.REPLAY_BLOCK_SIZE, n, "SWEEP_NUM_GPU_BLOCKS", sweep=True)

    @property
    def child_len(self) -> int:
        return self.PARENT_TOKENS + self.MAX_TOKENS + self.CHILD_SUFFIX_TOKENS


def kv_blocks(prompt_len: int, max_tokens: int, block_size: int) -> int:
    """Blocks a request occupies: its last output token's KV is never written."""
    return -(-(prompt_len + max_tokens - 1) // block_size)


def hashed_blocks(prompt_len: int, max_tokens: int, block_size: int) -> int:
    """Full, hashed blocks a finished request leaves: floor((P + O - 1) / B)."""
    return (prompt_len + max_tokens - 1) // block_size


def held_cap(cfg: FamilyHoldParams, block_size: int, num_gpu_blocks: int) -> int:
    """The cap on held blocks: MAX_HELD_BLOCKS, never more than a noise request leaves free."""
    room = num_gpu_blocks - 1 - kv_blocks(cfg.NOISE_TOKENS, cfg.MAX_TOKENS, block_size)
    return room if cfg.MAX_HELD_BLOCKS is None else min(cfg.MAX_HELD_BLOCKS, room)


def check_pool(cfg: FamilyHoldParams, block_size: int, num_gpu_blocks: int, name: str, sweep: bool = False) -> None:
    usable = num_gpu_blocks - 1
    where = f"{name}={num_gpu_blocks} ({usable} usable blocks of {block_size} tokens)"
    parent = kv_blocks(cfg.PARENT_TOKENS, cfg.MAX_TOKENS, block_size)
    check(parent <= usable, f"{where} is smaller than the parent: PARENT_TOKENS={cfg.PARENT_TOKENS} + MAX_TOKENS="
          f"{cfg.MAX_TOKENS} needs {parent} blocks")
    child = kv_blocks(cfg.child_len, cfg.MAX_TOKENS, block_size)
    check(child <= usable, f"{where} cannot hold the child: {cfg.child_len} prompt tokens need {child} blocks")
    noise = kv_blocks(cfg.NOISE_TOKENS, cfg.MAX_TOKENS, block_size)
    check(noise < usable, f"{where} leaves no block to hold beside one {cfg.NOISE_TOKENS}-token request ({noise} blocks)")
    if cfg.MAX_HELD_BLOCKS is not None and not sweep:
        check(cfg.MAX_HELD_BLOCKS <= usable - noise,
              f"MAX_HELD_BLOCKS={cfg.MAX_HELD_BLOCKS}: in {where} a hold that large leaves fewer than the {noise} "
              f"blocks a noise request needs, so it could never be scheduled")


# -- workload --
