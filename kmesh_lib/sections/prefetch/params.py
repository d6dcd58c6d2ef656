"""Section 20's parameters: paths, group sizes, leads, groups per arm, controls, the LMCache tier and its guard."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kmesh_lib.base.params import (
    MAX_COUNT,
    MAX_MS,
    Count,
    Mib,
    Millis,
    PositiveCount,
    Tokens,
    check,
    params_dataclass,
)
from kmesh_lib.lmcache.tier_params import CHUNK_TOKENS, ChunkTokens, DiskTierRoot
from kmesh_lib.workloads.context_groups import blocks_for_group, kv_bytes_per_token
from kmesh_lib.workloads.context_params import MP_PATHS, TIER_PATHS, ContextGroupParams

PATHS = TIER_PATHS
CONTROLS = ("dram", "resident")
MIB = 1 << 20
PAPER = {"MEASURED_GROUPS": 200, "ENGINE_RUNS": 10, "PILOT_GROUPS": 10}  # the paper's sizes; below them a run is scaled


@params_dataclass
class PrefetchParams(ContextGroupParams):
    PATHS: list[str] = Field(
        default_factory=lambda: ["mp"], min_length=1,
        description="mp (LMCacheMPConnector + lmcache server: HTTP prefetch + warm-up), mp-striped (the same on "
                    "STRIPED_STORE_ROOT), inproc (LMCacheConnectorV1: warm-up only), native (vLLM's own CPU tier over its "
                    "filesystem tier, CUDA only: warm-up only), gpubuf (kmesh's GPU buffer: its "
                    "prefetch + warm-up); run in this order")
    GROUP_SIZES: list[PositiveCount] = Field(
        default_factory=lambda: [4, 8], min_length=1, description="follow-ups per group (4: A..D, 8: A..H)")
    CONTEXT_TOKENS: Tokens = Field(
        4096, description="the shared context, a multiple of CHUNK_SIZE (4096 tokens of the 0.5B shape in bf16: 48 MiB of KV)")
    SUFFIX_TOKENS: Tokens = Field(32, description="each follow-up's own tokens after the context")
    MAX_TOKENS: Tokens = Field(8, description="tokens each follow-up generates")
    LEADS_MS: list[Millis] = Field(
        default_factory=lambda: [0.0, 25.0, 100.0, 250.0], min_length=1,
        description="pilot lead times (ms, ascending); the confirmation uses the shortest at which every pilot group "
                    "was ready")
    FIXED_LEAD_MS: Annotated[float, Field(gt=0, le=MAX_MS)] = Field(
        250.0, description="section 16's fixed start (ms); the savings are also given from it")
    PILOT_GROUPS: PositiveCount = Field(
        10, description="pilot groups per lead, path and group size, over PILOT_ENGINE_RUNS engine runs")
    LEAD_RULE: Literal["all_ready", "lower_bound"] = Field(
        "all_ready", description="how the pilot picks the confirmation's lead: all_ready (the shortest lead at which "
                                 "every pilot group was ready: the rule of the runs before issue 42), lower_bound (the "
                                 "shortest lead whose readiness has a one-sided 95 % Clopper-Pearson lower bound of at "
                                 "least 95 %; the pilot then needs PILOT_ENGINE_RUNS of at least 3 and enough groups)")
    PILOT_ENGINE_RUNS: PositiveCount = Field(
        1, description="engine runs the pilot is spread over: 1, the pilot runs first in the first confirmation run "
                       "(all_ready); more, pilot-only engine runs before the confirmation's (lower_bound)")
    ENGINE_RUNS: PositiveCount = Field(
        10, description="fresh engine runs the confirmation is spread over (paired, alternating order)")
    GPUBUF_ENGINE_RUNS: PositiveCount | None = Field(
        None, description="engine runs of the gpubuf path (null: ENGINE_RUNS); each runs MEASURED_GROUPS / ENGINE_RUNS "
                          "pairs, so fewer runs scale the GPU-buffer rows down (results say so)")
    WARM_STORE_GUARD: bool = Field(
        True, description="MP: keep the keys a warm prefetch (POST /cache/prefetches) loads from being handed to the "
                          "store controller as new writes (LMCache 0.5.3 re-stores them and, under skip_l1, drops them "
                          "from L1 before the warm-up's lookup); a no-op on LMCache without PrefetchMode.WARM (0.5.6)")
    CONTRAST_GROUPS: Count = Field(
        10, description="MP: on-arrival groups per further SINGLEFLIGHT setting, in each group size's first engine run")
    WARMUP_PAIRS: Count = Field(1, description="unmeasured pairs at the start of every engine run")
    CONTROLS: list[str] = Field(
        default_factory=lambda: ["dram", "resident"],
        description="placement controls: dram (the tier's memory copy: LMCache's arena; on gpubuf the GPU buffer, arm "
                    "'buffer'), resident (already in vLLM's KV); [] skips")
    BOOTSTRAP_RESAMPLES: int = Field(
        10000, ge=100, le=MAX_COUNT, description="bootstrap resamples for the 95 % percentile intervals (seeded with SEED)")
    DRIVER_POLL_MS: Annotated[float, Field(gt=0, le=MAX_MS)] = Field(
        0.5, description="the driver's idle wait between checks (ms)")
    PREFETCH_POLL_MS: Annotated[float, Field(gt=0, le=MAX_MS)] = Field(
        2.0, description="between GET /cache/prefetches/{id} polls (ms, MP)")
    CHUNK_SIZE: ChunkTokens = CHUNK_TOKENS
    ARENA_MIB: Mib = Field(
        512, description="the tier's memory (MP: L1 DRAM arena; in-process: LocalCPU; gpubuf: the GPU buffer); holds "
                         "the retained copy and a staging copy of the context")
    DISK_TIER_MIB: Mib = Field(2048, description="in-process LocalDiskBackend capacity")
    DISK_TIER_ROOT: DiskTierRoot = ""
    WIDGET_GROUPS: PositiveCount = Field(2, description="pairs per live re-run in the panel")

    def check_rules(self) -> None:
        super().check_rules()
        check(set(self.PATHS) <= set(PATHS) and len(set(self.PATHS)) == len(self.PATHS),
              f"PATHS={self.PATHS}: choose from {', '.join(PATHS)}, each once")
        check(len(self.FOLLOWUP_ARRIVALS) == 1, f"FOLLOWUP_ARRIVALS={self.FOLLOWUP_ARRIVALS}: section 20 gives every "
                                                "group one pattern (the follow-ups' spacing from T)")
        check(not (self.WARM_STORE_GUARD and self.LMCACHE_SERVER == "stock" and set(self.PATHS) & set(MP_PATHS)),
              "WARM_STORE_GUARD=true needs LMCACHE_SERVER=launcher (the guard lives in the launcher's server hooks)")
        check(set(self.CONTROLS) <= set(CONTROLS), f"CONTROLS={self.CONTROLS}: choose from {', '.join(CONTROLS)} (or [])")
        check(list(self.LEADS_MS) == sorted(set(self.LEADS_MS)), f"LEADS_MS={self.LEADS_MS}: ascending, no repeats")
        if self.LEAD_RULE == "lower_bound":
            from kmesh_lib.sections.prefetch.readiness import MIN_PILOT_RUNS, READY_FLOOR, pilot_groups_needed

            need = pilot_groups_needed()
            check(self.PILOT_ENGINE_RUNS >= MIN_PILOT_RUNS,
                  f"PILOT_ENGINE_RUNS={self.PILOT_ENGINE_RUNS}: LEAD_RULE=lower_bound spreads the pilot over at least "
                  f"{MIN_PILOT_RUNS} engine runs")
            check(self.PILOT_GROUPS >= need, f"PILOT_GROUPS={self.PILOT_GROUPS}: with every group ready, {need} groups "
                                             f"are the fewest whose one-sided 95 % lower bound reaches {READY_FLOOR:.0%}")
            check(self.PILOT_GROUPS % self.PILOT_ENGINE_RUNS == 0,
                  f"PILOT_GROUPS={self.PILOT_GROUPS}: a multiple of PILOT_ENGINE_RUNS={self.PILOT_ENGINE_RUNS}")
        else:
            check(self.PILOT_ENGINE_RUNS == 1, f"PILOT_ENGINE_RUNS={self.PILOT_ENGINE_RUNS}: LEAD_RULE=all_ready runs "
                                               "the pilot in the first confirmation run (1)")
        check(self.MEASURED_GROUPS >= self.ENGINE_RUNS,
              f"MEASURED_GROUPS={self.MEASURED_GROUPS}: at least one per engine run (ENGINE_RUNS={self.ENGINE_RUNS})")
        check(self.CHUNK_SIZE % self.BLOCK_SIZE == 0,
              f"CHUNK_SIZE={self.CHUNK_SIZE}: must be a multiple of BLOCK_SIZE={self.BLOCK_SIZE}")
        check(self.CONTEXT_TOKENS >= self.CHUNK_SIZE and self.CONTEXT_TOKENS % self.CHUNK_SIZE == 0,
              f"CONTEXT_TOKENS={self.CONTEXT_TOKENS}: must be a positive multiple of CHUNK_SIZE={self.CHUNK_SIZE}")
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

    @property
    def pilot_only_runs(self) -> int:
        """Engine runs of each path and group size that run the pilot alone, before the confirmation's (lower_bound)."""
        return self.PILOT_ENGINE_RUNS if self.LEAD_RULE == "lower_bound" else 0

    def engine_runs(self, path: str) -> int:
        """Fresh engine runs of ``path``'s confirmation (GPUBUF_ENGINE_RUNS for the GPU buffer, where set)."""
        return self.GPUBUF_ENGINE_RUNS if path == "gpubuf" and self.GPUBUF_ENGINE_RUNS else self.ENGINE_RUNS


def scaled(cfg: PrefetchParams) -> dict[str, int]:
    """The sizes below the paper's (an empty dict at paper scale); the GPU buffer's engine runs too."""
    out = {k: getattr(cfg, k) for k, v in PAPER.items() if getattr(cfg, k) < v}
    if "gpubuf" in cfg.PATHS and cfg.engine_runs("gpubuf") < PAPER["ENGINE_RUNS"]:
        out["GPUBUF_ENGINE_RUNS"] = cfg.engine_runs("gpubuf")
    return out
