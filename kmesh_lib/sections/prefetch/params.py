"""Section 20's parameters: paths, group sizes, leads, groups per arm, controls and the LMCache tier."""
from __future__ import annotations

from dataclasses import dataclass, field

from kmesh_lib.base.params import check
from kmesh_lib.engine.config import EngineParams
from kmesh_lib.workloads.context_groups import blocks_for_group, kv_bytes_per_token

PATHS = ("mp", "inproc")
CONTROLS = ("dram", "engine")
MIB = 1 << 20


@dataclass(frozen=True)
class PrefetchParams(EngineParams):
    PATHS: list[str] = field(default_factory=lambda: ["mp"])  # mp (LMCacheMPConnector + server), inproc (LMCacheConnectorV1)
    GROUP_SIZES: list[int] = field(default_factory=lambda: [4, 8])  # follow-ups per group
    CONTEXT_TOKENS: int = 4096  # the shared context (a multiple of CHUNK_SIZE)
    SUFFIX_TOKENS: int = 32  # each follow-up's own tokens
    MAX_TOKENS: int = 8  # tokens each follow-up generates
    LEADS_MS: list[float] = field(default_factory=lambda: [0.0, 25.0, 100.0, 250.0])  # pilot lead times
    FIXED_LEAD_MS: float = 250.0  # section 16's fixed start: the savings are also given from it
    PILOT_GROUPS: int = 10  # pilot groups per lead, path and group size
    MEASURED_GROUPS: int = 200  # confirmation groups per arm, path and group size (over ENGINE_RUNS)
    ENGINE_RUNS: int = 10  # fresh engine runs the confirmation is spread over
    WARMUP_PAIRS: int = 1  # unmeasured pairs at the start of each engine run
    CONTROLS: list[str] = field(default_factory=lambda: ["dram", "engine"])  # placement controls; [] skips
    BOOTSTRAP_RESAMPLES: int = 10000  # 95 % percentile intervals, numpy, seeded with SEED
    DRIVER_POLL_MS: float = 0.5  # the driver's idle wait between checks
    PREFETCH_POLL_MS: float = 2.0  # between GET /cache/prefetches/{id} polls (MP)
    CHUNK_SIZE: int = 256  # LMCache chunk, tokens
    ARENA_MIB: int = 512  # LMCache's memory tier
    DISK_TIER_MIB: int = 2048  # in-process LocalDiskBackend capacity
    DISK_TIER_ROOT: str = ""  # "" = $KMESH_LMCACHE_RUNTIME or /tmp/kmesh-lmcache
    WIDGET_GROUPS: int = 2  # groups per lead in the panel's live re-run
    SOURCE_RUN: str | None = None  # a finished run dir (the GPU run) to analyse instead of measuring

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.PATHS and set(self.PATHS) <= set(PATHS), f"PATHS={self.PATHS}: choose from {', '.join(PATHS)}")
        check(set(self.CONTROLS) <= set(CONTROLS), f"CONTROLS={self.CONTROLS}: choose from {', '.join(CONTROLS)} (or [])")
        check(self.GROUP_SIZES and all(n >= 1 for n in self.GROUP_SIZES), f"GROUP_SIZES={self.GROUP_SIZES}: each >= 1")
        check(self.LEADS_MS and all(x >= 0 for x in self.LEADS_MS), f"LEADS_MS={self.LEADS_MS}: non-empty, each >= 0")
        check(list(self.LEADS_MS) == sorted(set(self.LEADS_MS)), f"LEADS_MS={self.LEADS_MS}: ascending, no repeats")
        check(self.FIXED_LEAD_MS > 0, f"FIXED_LEAD_MS={self.FIXED_LEAD_MS}: must be > 0")
        check(self.PILOT_GROUPS >= 1, f"PILOT_GROUPS={self.PILOT_GROUPS}: must be >= 1")
        check(self.ENGINE_RUNS >= 1, f"ENGINE_RUNS={self.ENGINE_RUNS}: must be >= 1")
        check(self.MEASURED_GROUPS >= self.ENGINE_RUNS,
              f"MEASURED_GROUPS={self.MEASURED_GROUPS}: at least one per engine run (ENGINE_RUNS={self.ENGINE_RUNS})")
        check(self.WARMUP_PAIRS >= 0, f"WARMUP_PAIRS={self.WARMUP_PAIRS}: must be >= 0")
        check(self.BOOTSTRAP_RESAMPLES >= 100, f"BOOTSTRAP_RESAMPLES={self.BOOTSTRAP_RESAMPLES}: must be >= 100")
        check(self.DRIVER_POLL_MS > 0 and self.PREFETCH_POLL_MS > 0, "DRIVER_POLL_MS and PREFETCH_POLL_MS must be > 0")
        check(self.CHUNK_SIZE > 0 and self.CHUNK_SIZE % self.BLOCK_SIZE == 0,
              f"CHUNK_SIZE={self.CHUNK_SIZE}: must be a multiple of BLOCK_SIZE={self.BLOCK_SIZE}")
        check(self.CONTEXT_TOKENS >= self.CHUNK_SIZE and self.CONTEXT_TOKENS % self.CHUNK_SIZE == 0,
              f"CONTEXT_TOKENS={self.CONTEXT_TOKENS}: must be a positive multiple of CHUNK_SIZE={self.CHUNK_SIZE}")
        check(self.SUFFIX_TOKENS >= 1 and self.MAX_TOKENS >= 1, "SUFFIX_TOKENS and MAX_TOKENS must be >= 1")
        check(self.SUFFIX_TOKENS + self.MAX_TOKENS < self.CHUNK_SIZE,
              f"SUFFIX_TOKENS + MAX_TOKENS must stay below CHUNK_SIZE={self.CHUNK_SIZE} (no follow-up stores a chunk)")
        longest = self.CONTEXT_TOKENS + self.SUFFIX_TOKENS + self.MAX_TOKENS
        check(longest <= self.MAX_MODEL_LEN, f"context + suffix + output = {longest} exceeds MAX_MODEL_LEN={self.MAX_MODEL_LEN}")

        need = blocks_for_group(self, max(self.GROUP_SIZES) + 1)  # + the warm-up
        check(need <= self.NUM_GPU_BLOCKS - 1, f"NUM_GPU_BLOCKS={self.NUM_GPU_BLOCKS}: a group of "
                                               f"{max(self.GROUP_SIZES)} and the warm-up need {need} blocks (+1 null)")
        ctx_mib = self.CONTEXT_TOKENS * kv_bytes_per_token(self) / MIB
        check(self.ARENA_MIB >= 2 * ctx_mib, f"ARENA_MIB={self.ARENA_MIB}: needs room for twice the context "
                                             f"({ctx_mib:.1f} MiB each: the retained copy and a staging copy)")

    @property
    def pairs_per_run(self) -> int:
        return -(-self.MEASURED_GROUPS // self.ENGINE_RUNS)
