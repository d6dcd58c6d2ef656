"""Section 16's parameters: paths, group sizes, arms, sizes and the disk tier."""
from __future__ import annotations

from pydantic import Field

from kmesh_lib.base.params import (
    Count,
    Mib,
    PositiveCount,
    Seconds,
    Tokens,
    check,
    params_dataclass,
)
from kmesh_lib.lmcache.tier_params import CHUNK_TOKENS, ChunkTokens, DiskTierRoot
from kmesh_lib.workloads.context_arms import CONTROL_ARMS
from kmesh_lib.workloads.context_groups import blocks_for_group, kv_bytes_per_token
from kmesh_lib.workloads.context_params import TIER_PATHS, ContextGroupParams

PATHS = TIER_PATHS
MIB = 1 << 20


@params_dataclass
class RetentionParams(ContextGroupParams):
    PATHS: list[str] = Field(
        default_factory=lambda: ["mp"], min_length=1,
        description="external-tier paths, run in this order: mp (LMCacheMPConnector + lmcache server), mp-striped (the "
                    "same on STRIPED_STORE_ROOT), inproc (LMCacheConnectorV1), gpubuf (kmesh's host-staged GPU buffer), "
                    "native (vLLM's own OffloadingConnector: its CPU tier over its filesystem tier; CUDA only)")
    CONTROL_ARMS: list[str] = Field(
        default_factory=lambda: ["recompute", "resident"],
        description="standard arms on a plain engine per group size; [] skips them")
    GROUP_SIZES: list[PositiveCount] = Field(
        default_factory=lambda: [4, 8], min_length=1, description="follow-ups per group (4: A..D, 8: A..H)")
    CONTEXT_TOKENS: Tokens = Field(
        4096, description="the shared context, a multiple of CHUNK_SIZE (4096 tokens of the 0.5B shape in bf16: 48 MiB of KV)")
    SUFFIX_TOKENS: Tokens = Field(32, description="each follow-up's own tokens after the context")
    MAX_TOKENS: Tokens = Field(8, description="tokens each follow-up generates (the makespan waits for the last)")
    HEAD_START_S: Seconds = Field(
        0.25, description="the warm-up starts this long before the follow-ups and must have finished by then")
    WARMUP_GROUPS: Count = Field(3, description="unmeasured pairs first, per engine (cycling through the combinations)")
    CONTROL_WARMUP_GROUPS: Count = Field(1, description="unmeasured pairs of the recompute/resident arms")
    CONTROL_MEASURED_GROUPS: PositiveCount = Field(3, description="measured pairs of the recompute/resident arms")
    MAX_RETRY_PAIRS: Count = Field(
        5, description="extra pairs that may replace a pair with a group that was not warm or ran out of arena")
    CHUNK_SIZE: ChunkTokens = CHUNK_TOKENS
    ARENA_MIB: Mib = Field(
        512, description="the external tier's memory outside vLLM (MP: L1 DRAM arena; in-process: LocalCPU; gpubuf: the "
                         "GPU buffer; native: vLLM's CPU tier)")
    DISK_TIER_MIB: Mib = Field(2048, description="in-process LocalDiskBackend capacity")
    DISK_TIER_ROOT: DiskTierRoot = ""

    def check_rules(self) -> None:
        super().check_rules()
        check(set(self.PATHS) <= set(PATHS) and len(set(self.PATHS)) == len(self.PATHS),
              f"PATHS={self.PATHS}: choose from {', '.join(PATHS)}, each once")
        check(set(self.CONTROL_ARMS) <= set(CONTROL_ARMS),
              f"CONTROL_ARMS={self.CONTROL_ARMS}: choose from {', '.join(CONTROL_ARMS)} (or [])")
        check(self.CHUNK_SIZE % self.BLOCK_SIZE == 0,
              f"CHUNK_SIZE={self.CHUNK_SIZE}: must be a multiple of BLOCK_SIZE={self.BLOCK_SIZE}")
        check(self.CONTEXT_TOKENS >= self.CHUNK_SIZE and self.CONTEXT_TOKENS % self.CHUNK_SIZE == 0,
              f"CONTEXT_TOKENS={self.CONTEXT_TOKENS}: must be a positive multiple of CHUNK_SIZE={self.CHUNK_SIZE} "
              "(LMCache stores whole chunks only)")
        check(self.SUFFIX_TOKENS + self.MAX_TOKENS < self.CHUNK_SIZE,
              f"SUFFIX_TOKENS + MAX_TOKENS = {self.SUFFIX_TOKENS + self.MAX_TOKENS}: must stay below "
              f"CHUNK_SIZE={self.CHUNK_SIZE}, so no follow-up completes (and stores) a chunk of its own")
        longest = self.CONTEXT_TOKENS + self.SUFFIX_TOKENS + self.MAX_TOKENS
        check(longest <= self.MAX_MODEL_LEN, f"CONTEXT_TOKENS + SUFFIX_TOKENS + MAX_TOKENS = {longest} "
                                             f"exceeds MAX_MODEL_LEN={self.MAX_MODEL_LEN}")
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

