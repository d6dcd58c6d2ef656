"""Section 23's parameters, raw file names, and the pool, tier and cost sizes they give."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from kmesh_lib.base.data import resolve_path
from kmesh_lib.base.params import (
    MAX_BLOCKS,
    MAX_COUNT,
    MAX_TOKENS_BOUND,
    Count,
    ParamError,
    PathText,
    PositiveCount,
    Tokens,
    check,
    check_path,
    params_dataclass,
    read_bounded,
)
from kmesh_lib.engine.config import EngineParams
from kmesh_lib.engine.model_spec import SHAPES, check_loadable, resolve
from kmesh_lib.sections.production_trace.trace import TraceFormatError, chained, load_trace

TRACE = "trace.jsonl"  # raw/: the requests replayed, as read (Mooncake's format), one per line
REPLAY = "replay.jsonl"  # raw/: one record per replay arm (one pool size): per-request columns, block ops, drain
PARITY = "parity.jsonl"  # raw/: the parity slice, one record per request per engine (real, replay)
COSTS = "costs.jsonl"  # raw/: section 21's measured TTFTs this run prices with, one row per (shape, arm, context)
GIB = 1 << 30
Gib = Annotated[float, Field(gt=0, le=1 << 20)]  # up to 1 PiB: a disk tier, not a typo
Share = Annotated[float, Field(ge=0, le=10)]
ShapeName = Literal["tiny", "kvheavy", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"]
# an H200 has 141 GB (131 GiB); after a 7B's weights (15 GiB) and activations at
# gpu_memory_utilization 0.9 about 104 GiB is left for KV: the largest pool of the sweep
H200_KV_GIB = 104.0


@params_dataclass
class ProductionTraceParams(EngineParams):
    TRACE_FILE: PathText | None = Field(
        "$KMESH_DATA_ROOT/mooncake-traces/conversation_trace.jsonl",
        description="a Mooncake trace ($KMESH_DATA_ROOT/... or repo-relative); null: a seeded synthetic trace")
    NUM_REQUESTS: PositiveCount | None = Field(None, description="replay the first N requests of the trace (null: all)")
    NUM_SYNTHETIC_REQUESTS: PositiveCount = Field(
        48, description="requests of the seeded synthetic trace (TRACE_FILE null), generated from SEED")
    SHAPES: list[ShapeName] = Field(
        default_factory=lambda: ["qwen2.5-0.5b", "qwen2.5-7b"], min_length=1,
        description="model shapes whose KV bytes per token turn POOL_GIB into blocks")
    KV_DTYPE: Literal["bfloat16", "float16", "float32"] = Field("bfloat16", description="KV dtype of the pool sizes")
    POOL_GIB: list[Gib] = Field(
        default_factory=lambda: [4.0, 16.0, 64.0, H200_KV_GIB], min_length=1,
        description="GPU pool sizes in GiB of KV for the LRU and ideal sweep (104: an H200 after a 7B's weights)")
    REPLAY_SHAPE: ShapeName = Field("qwen2.5-7b", description="the shape of the stock-vLLM replays and the engine sweep")
    REPLAY_POOL_GIB: list[Gib] = Field(
        default_factory=lambda: [16.0], description="pool sizes (GiB, REPLAY_SHAPE) replayed through vLLM's scheduler")
    CONCURRENT_POOL_GIB: list[Gib] = Field(
        default_factory=list, description="pools (GiB, REPLAY_SHAPE) replayed concurrently: arrivals at the trace's "
                                          "timestamps on the step-time model's clock")
    STEP_BASE_S: Annotated[float, Field(ge=0, le=10)] = Field(
        0.03, description="step-time model: seconds per engine step (section 19's 7B decode step on the H200)")
    STEP_S_PER_TOKEN: Annotated[float, Field(ge=0, le=1)] = Field(
        31e-6, description="step-time model: seconds per scheduled token (section 21's 7B recompute, 32k tokens in 1 s)")
    TIER_POOL_GIB: Gib = Field(16.0, description="the GPU pool in front of the external tier (GiB, each shape)")
    DRAM_TIER_GIB: list[Gib] = Field(
        default_factory=lambda: [256.0, 1024.0], description="DRAM-sized tiers (GiB), priced with section 21's DRAM restore")
    DISK_TIER_GIB: list[Gib] = Field(
        default_factory=lambda: [4096.0, 16384.0], description="disk-sized tiers (GiB), priced with section 21's disk restore")
    CROSSOVER_RUNS: list[PathText] = Field(
        default_factory=lambda: ["outputs/crossover/gpu-20261201-224722-442e",
                                 "outputs/crossover/gpu-20261201-224734-5ff8"],
        description="published section 21 runs (repo-relative) whose measured TTFTs price restore vs recompute")
    NUM_ENGINES: list[Annotated[int, Field(ge=2, le=64)]] = Field(
        default_factory=lambda: [2, 4, 8], description="engine counts of the several-engine sweep")
    ENGINE_POOL_GIB: Gib = Field(16.0, description="each engine's GPU pool (GiB, REPLAY_SHAPE)")
    SHARED_TIER_GIB: Gib = Field(1024.0, description="the external tier shared by round-robin engines (GiB)")
    LOAD_SLACK: Share = Field(
        0.25, description="prefix-aware routing: an engine is eligible while its prefill tokens are at most "
                          "1 + slack times the mean")
    PARITY_NUM_REQUESTS: Count = Field(
        8, description="the parity slice: the first N requests, on the real engine and the replay engine (0: none)")
    PARITY_BLOCK_SIZE: Tokens = Field(32, description="block size of the parity slice (the CPU backend needs 32s)")
    PARITY_MAX_TOKENS: Tokens = Field(16, description="output tokens per request in the parity slice (capped)")

    def check_rules(self) -> None:
        super().check_rules()
        for name in ("POOL_GIB", "REPLAY_POOL_GIB", "CONCURRENT_POOL_GIB", "DRAM_TIER_GIB", "DISK_TIER_GIB", "SHAPES",
                     "NUM_ENGINES"):
            values = getattr(self, name)
            check(len(set(values)) == len(values), f"{name}={values}: name each value once")
        for name in ("REPLAY_POOL_GIB", "DRAM_TIER_GIB", "DISK_TIER_GIB", "CROSSOVER_RUNS", "NUM_ENGINES"):
            check(len(getattr(self, name)) > 0, f"{name}=[]: name at least one (an empty sweep has no rows to compare)")
        check(512 % self.BLOCK_SIZE == 0, f"BLOCK_SIZE={self.BLOCK_SIZE}: must divide Mooncake's 512-token blocks")
        check(512 % self.PARITY_BLOCK_SIZE == 0,
              f"PARITY_BLOCK_SIZE={self.PARITY_BLOCK_SIZE}: must divide Mooncake's 512-token blocks")
        longest = 0
        if self.TRACE_FILE is not None:
            path = resolve_path(self.TRACE_FILE)
            check(path.is_file(), f"TRACE_FILE={self.TRACE_FILE!r}: no file at {path} (`kmesh data fetch "
                                  f"mooncake-traces`, or TRACE_FILE: null for the synthetic trace)")
            path = check_path("TRACE_FILE", self.TRACE_FILE, "file")  # outside /proc, /sys, /dev and /etc
            try:  # the requests the run replays, read as it reads them: a bad line is named before anything starts
                requests = load_trace(path, self.NUM_REQUESTS)
            except TraceFormatError as e:
                raise ParamError(f"TRACE_FILE={self.TRACE_FILE[:60]!r}: {e}") from None
            ok, where = chained(requests)  # the block model names a block by its id: an id must name one prefix
            check(ok, f"TRACE_FILE={self.TRACE_FILE[:60]!r}: hash ids are not chained ({where}); each id names one prefix")
            longest = max(r.num_prompt_tokens + r.num_output_tokens for r in requests)
        check(self.NUM_SYNTHETIC_REQUESTS <= MAX_COUNT, "NUM_SYNTHETIC_REQUESTS too large")
        for shape in (*self.SHAPES, self.REPLAY_SHAPE):
            check(shape in SHAPES, f"{shape!r}: not a shape ({', '.join(SHAPES)})")
        check(longest <= MAX_TOKENS_BOUND - 1024,  # replay.max_model_len rounds the longest up to 1024
              f"TRACE_FILE={str(self.TRACE_FILE)[:60]!r}: a request of {longest:,} tokens; vLLM's model length here "
              f"is at most {MAX_TOKENS_BOUND - 1024:,}")
        for name in ("REPLAY_POOL_GIB", "CONCURRENT_POOL_GIB"):
            for gib in getattr(self, name):
                blocks = gib_to_blocks(gib, self.REPLAY_SHAPE, self.KV_DTYPE, self.BLOCK_SIZE)
                check(blocks + 1 <= MAX_BLOCKS,
                      f"{name}: {gib:g} GiB of {self.REPLAY_SHAPE} is {blocks:,} blocks of {self.BLOCK_SIZE} tokens; the "
                      f"replay engine's pool is at most {MAX_BLOCKS - 1:,}")
        for run in self.CROSSOVER_RUNS:
            check_crossover_run(run)
        if self.PARITY_NUM_REQUESTS:  # the parity slice runs real vLLM on MODEL, whatever ENGINE says
            check_loadable(resolve(self.MODEL))


def check_crossover_run(run: str) -> None:
    """``run`` (a CROSSOVER_RUNS entry) is a folder whose public-results.json is section 21's, with its arms."""
    folder = check_path("CROSSOVER_RUNS", run, "dir")
    shown = f"CROSSOVER_RUNS: {run[:60]!r}"
    try:
        public = json.loads(read_bounded(folder / "public-results.json", 1 << 26, "public-results.json"))
    except ParamError as e:
        raise ParamError(f"{shown}: {e} (a published section 21 run: outputs/crossover/RUN_ID)") from None
    except (ValueError, RecursionError):
        raise ParamError(f"{shown}: its public-results.json is not JSON") from None
    section = public.get("section") if isinstance(public, dict) else None
    check(section == "crossover", f"{shown}: a run of {section or 'no section'}, not of crossover (section 21)")
    arms = (public.get("results") or {}).get("arms") if isinstance(public.get("results"), dict) else None
    check(isinstance(arms, list) and all(isinstance(a, dict) and {"model", "arm", "context_tokens", "ttft_ms", "n"} <=
                                         set(a) for a in arms),
          f"{shown}: its public-results.json has no results.arms rows (model, arm, context_tokens, ttft_ms, n)")



def bytes_per_token(shape: str, dtype: str) -> int:
    return resolve(shape).kv_bytes_per_token(dtype)


def gib_to_blocks(gib: float, shape: str, dtype: str, block_size: int) -> int:
    """Usable blocks that ``gib`` GiB of KV buys for ``shape`` (whole blocks; vLLM's null block not counted)."""
    return int(gib * GIB) // (bytes_per_token(shape, dtype) * block_size)


@dataclass(frozen=True)
class Pool:
    """A GPU pool of the sweep: ``num_blocks`` usable blocks of ``shape`` in ``pool_gib`` GiB of KV."""

    shape: str
    pool_gib: float
    num_blocks: int


@dataclass(frozen=True)
class ReplayPool(Pool):
    """A pool replayed through vLLM's scheduler, one request at a time or on the step-time model's clock."""

    mode: Literal["sequential", "concurrent"]


@dataclass(frozen=True)
class Tier:
    """An external tier of ``tier_blocks`` (``tier_gib``) behind a GPU pool of ``pool_blocks``."""

    shape: str
    tier: Literal["dram", "disk"]
    tier_gib: float
    pool_blocks: int
    tier_blocks: int


def pool_grid(cfg) -> list[Pool]:
    """The sweep's GPU pools: one per (shape, GiB) with its usable blocks; POOL_GIB for every shape,
    and the replayed pools (REPLAY_POOL_GIB, REPLAY_SHAPE)."""
    sizes = {(shape, gib) for shape in cfg.SHAPES for gib in cfg.POOL_GIB}
    sizes |= {(cfg.REPLAY_SHAPE, gib) for gib in cfg.REPLAY_POOL_GIB}
    order = {shape: i for i, shape in enumerate(dict.fromkeys([*cfg.SHAPES, cfg.REPLAY_SHAPE]))}
    return [Pool(shape, gib, gib_to_blocks(gib, shape, cfg.KV_DTYPE, cfg.BLOCK_SIZE))
            for shape, gib in sorted(sizes, key=lambda x: (order[x[0]], x[1]))]


def replay_pools(cfg) -> list[ReplayPool]:
    """The pools replayed through vLLM's scheduler (REPLAY_SHAPE): sequentially, then concurrently."""
    return [ReplayPool(cfg.REPLAY_SHAPE, gib, gib_to_blocks(gib, cfg.REPLAY_SHAPE, cfg.KV_DTYPE, cfg.BLOCK_SIZE), mode)
            for mode, sizes in (("sequential", cfg.REPLAY_POOL_GIB), ("concurrent", cfg.CONCURRENT_POOL_GIB))
            for gib in sizes]


def tier_grid(cfg) -> list[Tier]:
    """The external tiers: one per (shape, kind, GiB) behind a TIER_POOL_GIB pool."""
    return [Tier(shape, kind, gib, gib_to_blocks(cfg.TIER_POOL_GIB, shape, cfg.KV_DTYPE, cfg.BLOCK_SIZE),
                 gib_to_blocks(gib, shape, cfg.KV_DTYPE, cfg.BLOCK_SIZE))
            for shape in cfg.SHAPES for kind, sizes in (("dram", cfg.DRAM_TIER_GIB), ("disk", cfg.DISK_TIER_GIB))
            for gib in sizes]
