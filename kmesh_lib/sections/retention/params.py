"""Section 16's parameters: paths, group sizes, arms, sizes and the disk tier."""
from __future__ import annotations

from dataclasses import dataclass, field

from kmesh_lib.base.params import check
from kmesh_lib.engine.config import EngineParams
from kmesh_lib.workloads.context_arms import CONTROL_ARMS
from kmesh_lib.workloads.context_groups import blocks_for_group, kv_bytes_per_token

PATHS = ("mp", "inproc")
MIB = 1 << 20


@dataclass(frozen=True)
class RetentionParams(EngineParams):
    PATHS: list[str] = field(default_factory=lambda: ["mp"])  # external-tier paths: mp, inproc
    CONTROL_ARMS: list[str] = field(default_factory=lambda: ["recompute", "floor"])  # [] skips the plain engine
    GROUP_SIZES: list[int] = field(default_factory=lambda: [4, 8])  # follow-ups per group
    CONTEXT_TOKENS: int = 4096  # the shared context (a multiple of CHUNK_SIZE)
    SUFFIX_TOKENS: int = 32  # each follow-up's own tokens after the context
    MAX_TOKENS: int = 8  # tokens each follow-up generates (the makespan waits for the last)
    HEAD_START_S: float = 0.25  # the warm-up's lead over the follow-ups; it must finish within it
    WARMUP_GROUPS: int = 3  # unmeasured pairs first
    MEASURED_GROUPS: int = 5  # measured pairs (one group per arm each, alternating order)
    CONTROL_WARMUP_GROUPS: int = 1  # the same for the recompute/floor pairs
    CONTROL_MEASURED_GROUPS: int = 3
    MAX_RETRY_PAIRS: int = 5  # extra pairs allowed to replace pairs with a group that was not ok
    CHUNK_SIZE: int = 256  # LMCache chunk, tokens
    ARENA_MIB: int = 512  # LMCache's memory tier outside vLLM (MP: L1 DRAM arena; in-process: LocalCPU)
    DISK_TIER_MIB: int = 2048  # in-process LocalDiskBackend capacity
    DISK_TIER_ROOT: str = ""  # where run-scoped disk tiers go ("" = $KMESH_LMCACHE_RUNTIME or /tmp/kmesh-lmcache)
    SOURCE_RUN: str | None = None  # a finished run dir (e.g. the GPU run) to analyse instead of measuring

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.PATHS and set(self.PATHS) <= set(PATHS), f"PATHS={self.PATHS}: choose from {', '.join(PATHS)}")
        check(set(self.CONTROL_ARMS) <= set(CONTROL_ARMS),
              f"CONTROL_ARMS={self.CONTROL_ARMS}: choose from {', '.join(CONTROL_ARMS)} (or [])")
        check(self.GROUP_SIZES and all(n >= 1 for n in self.GROUP_SIZES), f"GROUP_SIZES={self.GROUP_SIZES}: each >= 1")
        check(self.CHUNK_SIZE > 0 and self.CHUNK_SIZE % self.BLOCK_SIZE == 0,
              f"CHUNK_SIZE={self.CHUNK_SIZE}: must be a multiple of BLOCK_SIZE={self.BLOCK_SIZE}")
        check(self.CONTEXT_TOKENS >= self.CHUNK_SIZE and self.CONTEXT_TOKENS % self.CHUNK_SIZE == 0,
              f"CONTEXT_TOKENS={self.CONTEXT_TOKENS}: must be a positive multiple of CHUNK_SIZE={self.CHUNK_SIZE} "
              "(LMCache stores whole chunks only)")
        check(self.SUFFIX_TOKENS >= 1 and self.MAX_TOKENS >= 1, "SUFFIX_TOKENS and MAX_TOKENS must be >= 1")
        check(self.SUFFIX_TOKENS + self.MAX_TOKENS < self.CHUNK_SIZE,
              f"SUFFIX_TOKENS + MAX_TOKENS = {self.SUFFIX_TOKENS + self.MAX_TOKENS}: must stay below "
              f"CHUNK_SIZE={self.CHUNK_SIZE}, so no follow-up completes (and stores) a chunk of its own")
        longest = self.CONTEXT_TOKENS + self.SUFFIX_TOKENS + self.MAX_TOKENS
        check(longest <= self.MAX_MODEL_LEN, f"CONTEXT_TOKENS + SUFFIX_TOKENS + MAX_TOKENS = {longest} "
                                             f"exceeds MAX_MODEL_LEN={self.MAX_MODEL_LEN}")
        check(self.HEAD_START_S > 0, f"HEAD_START_S={self.HEAD_START_S}: must be > 0")
        check(self.WARMUP_GROUPS >= 0 and self.CONTROL_WARMUP_GROUPS >= 0 and self.MAX_RETRY_PAIRS >= 0,
              "WARMUP_GROUPS, CONTROL_WARMUP_GROUPS and MAX_RETRY_PAIRS must be >= 0")
        check(self.MEASURED_GROUPS >= 1 and self.CONTROL_MEASURED_GROUPS >= 1,
              "MEASURED_GROUPS and CONTROL_MEASURED_GROUPS must be >= 1")
        need = blocks_for_group(self, max(self.GROUP_SIZES))
        check(need <= self.NUM_GPU_BLOCKS - 1,
              f"NUM_GPU_BLOCKS={self.NUM_GPU_BLOCKS}: a group of {max(self.GROUP_SIZES)} sharing the context needs "
              f"{need} blocks (+1 null block)")
        ctx_mib = self.CONTEXT_TOKENS * kv_bytes_per_token(self) / MIB
        check(self.ARENA_MIB >= ctx_mib,
              f"ARENA_MIB={self.ARENA_MIB}: the arena is too small for the shared context ({ctx_mib:.1f} MiB of KV)")
        if "inproc" in self.PATHS:
            check(self.DISK_TIER_MIB >= ctx_mib, f"DISK_TIER_MIB={self.DISK_TIER_MIB}: smaller than the shared "
                                                 f"context ({ctx_mib:.1f} MiB)")
