"""Section 18's parameters and the block arithmetic they are checked with."""
from __future__ import annotations

from dataclasses import dataclass, field

from kmesh_lib.base.params import check
from kmesh_lib.engine.config import EngineParams

ARMS = ("stock", "held")


@dataclass(frozen=True)
class FamilyHoldParams(EngineParams):
    PARENT_TOKENS: int = 512  # parent prompt tokens
    NOISE_TOKENS: int = 497  # tokens of each unrelated (competing) prompt
    NUM_NOISE: int = 4  # unrelated prompts per pass
    NUM_PASSES: int = 2  # passes over the unrelated prompts between parent and child
    CHILD_SUFFIX_TOKENS: int = 64  # new tokens the child adds after the parent's input + output
    MAX_TOKENS: int = 8  # greedy output tokens per request
    NUM_SAMPLES: int = 3  # samples per arm (fresh prompts each; the same in both arms)
    MAX_HELD_BLOCKS: int | None = None  # cap on unique held blocks; None = usable minus one noise request
    MAX_FAMILIES: int = 4  # cap on active families
    EXPIRY_S: float = 60.0  # a hold expires this long after it was taken
    LOGPROB_TOLERANCE: float = 0.0  # largest |difference| of a chosen-token logprob between arms; 0 = exact
    REPLAY_BLOCK_SIZE: int = 16  # second run mode: the replay engine's block size (GPU-sized)
    REPLAY_NUM_GPU_BLOCKS: int = 129  # the replay engine's pool, null block included
    SWEEP_NUM_GPU_BLOCKS: list[int] = field(default_factory=lambda: list(range(72, 201, 8)))  # replay pools of the sweep

    def __post_init__(self) -> None:
        if self.BLOCK_SIZE > 0:  # a pool smaller than the parent is the clearer message: check it first
            check_pool(self, self.BLOCK_SIZE, self.NUM_GPU_BLOCKS, "NUM_GPU_BLOCKS")
        super().__post_init__()
        for name in ("PARENT_TOKENS", "NOISE_TOKENS", "NUM_NOISE", "NUM_PASSES", "MAX_TOKENS", "NUM_SAMPLES"):
            check(getattr(self, name) >= 1, f"{name}={getattr(self, name)}: must be >= 1")
        check(self.CHILD_SUFFIX_TOKENS >= 1, f"CHILD_SUFFIX_TOKENS={self.CHILD_SUFFIX_TOKENS}: the child must extend the parent "
              "(its input + output + at least one new token), so CHILD_SUFFIX_TOKENS must be >= 1")
        check(self.MAX_HELD_BLOCKS is None or self.MAX_HELD_BLOCKS >= 1,
              f"MAX_HELD_BLOCKS={self.MAX_HELD_BLOCKS}: a cap of zero holds nothing; use >= 1 (or null for the default)")
        check(self.MAX_FAMILIES >= 1, f"MAX_FAMILIES={self.MAX_FAMILIES}: a cap of zero admits no family; use >= 1")
        check(self.EXPIRY_S > 0, f"EXPIRY_S={self.EXPIRY_S}: must be > 0 seconds")
        check(self.LOGPROB_TOLERANCE >= 0, f"LOGPROB_TOLERANCE={self.LOGPROB_TOLERANCE}: must be >= 0")
        check(self.REPLAY_BLOCK_SIZE > 0, f"REPLAY_BLOCK_SIZE={self.REPLAY_BLOCK_SIZE}: must be > 0")
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
