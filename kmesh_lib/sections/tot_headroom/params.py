"""Section 19's parameters, raw file names and the search configuration they give."""
from __future__ import annotations

import socket
from typing import Annotated

from pydantic import Field

from kmesh_lib.base.params import (
    MAX_BLOCKS,
    MAX_MIB,
    Count,
    PathText,
    PositiveCount,
    Seconds,
    Tokens,
    check,
    params_dataclass,
)
from kmesh_lib.engine.config import EngineParams
from kmesh_lib.engine.model_spec import resolve
from kmesh_lib.workloads import game24
from kmesh_lib.workloads.tot_search import SearchConfig

CAPTURE = "tot_capture.jsonl"  # raw/: one kmesh.capture/1 record per invocation, appended per group
OUTCOMES = "tot_outcomes.jsonl"  # raw/: one record per puzzle, failures included
CLOCK_DOMAIN = f"time.monotonic_ns@{socket.gethostname()}"


@params_dataclass
class TotHeadroomParams(EngineParams):
    PUZZLES_CSV: PathText = Field(
        "$KMESH_DATA_ROOT/game24/24.csv",
        description="the puzzle file: $KMESH_DATA_ROOT/... (the data root, README 'Data') or relative to the repo root")
    PUZZLE_INDICES: list[Count] = Field(
        default_factory=lambda: [0, 1, 2], min_length=1, description="puzzles by row in file order (distinct)")
    BREADTH: PositiveCount = Field(2, description="states kept per BFS step")
    MAX_TOKENS: Tokens = Field(192, description="output tokens per call")
    # vLLM takes any temperature >= 0; above 2 the samples are already noise, so 10 is no limit
    # to an experiment and catches a typo.
    TEMPERATURE: float = Field(0.7, ge=0, le=10, description="sampling temperature; call i samples with seed SEED + i")
    MAX_CALLS: PositiveCount = Field(
        384, description="call limit; a group that would pass it is not started (the run is then partial)")
    RUN_CEILING_S: Seconds = Field(
        4500.0, description="whole-search ceiling in seconds (75 minutes), checked at call boundaries")
    INVOCATION_BOUND_S: Seconds = Field(120.0, description="a call running longer is aborted (the run is then partial)")
    KV_CACHE_MIB: Annotated[float, Field(gt=0, le=MAX_MIB)] | None = Field(
        None, description="when set, NUM_GPU_BLOCKS must be the blocks this much KV buys + the null block")
    SWEEP_POOL_BLOCKS: list[Annotated[int, Field(ge=1, le=MAX_BLOCKS)]] = Field(
        default_factory=lambda: [8, 16, 32, 64, 128, 256, 512, 1024],
        description="usable pool sizes for the bound sweep (the run's is added)")
    MODEL_MANIFEST: PathText | None = Field(
        None, description="JSON {file: sha256} a real model directory must match before the engine starts (repo-relative)")

    def check_rules(self) -> None:
        super().check_rules()
        check(len(set(self.PUZZLE_INDICES)) == len(self.PUZZLE_INDICES),
              f"PUZZLE_INDICES={self.PUZZLE_INDICES}: name each row once")
        csv_path = game24.repo_path(self.PUZZLES_CSV)
        check(csv_path.is_file(), f"PUZZLES_CSV={self.PUZZLES_CSV!r}: no file at {csv_path}")
        num_puzzles = len(game24.load_puzzles(csv_path))
        check(max(self.PUZZLE_INDICES) < num_puzzles,
              f"PUZZLE_INDICES={self.PUZZLE_INDICES}: {csv_path.name} has rows 0..{num_puzzles - 1}")
        header = len(game24.FEWSHOT.encode()) + 64  # byte-tokenizer size of a root prompt; BPE is smaller
        check(header + self.MAX_TOKENS <= self.MAX_MODEL_LEN,
              f"MAX_TOKENS={self.MAX_TOKENS}: a root prompt (~{header} tokens) + MAX_TOKENS exceeds "
              f"MAX_MODEL_LEN={self.MAX_MODEL_LEN}")
        if self.KV_CACHE_MIB is not None:
            want = pool_blocks(self)
            check(self.NUM_GPU_BLOCKS == want,
                  f"NUM_GPU_BLOCKS={self.NUM_GPU_BLOCKS}: KV_CACHE_MIB={self.KV_CACHE_MIB} of {self.MODEL} at "
                  f"{self.DTYPE} with {self.BLOCK_SIZE}-token blocks buys {want - 1} blocks + the null block = {want}")


def pool_blocks(cfg) -> int:
    """NUM_GPU_BLOCKS that KV_CACHE_MIB buys: whole blocks, plus vLLM's null block."""

    block_bytes = resolve(cfg.MODEL).kv_bytes_per_token(cfg.DTYPE) * cfg.BLOCK_SIZE
    return int(cfg.KV_CACHE_MIB * (1 << 20)) // block_bytes + 1


def search_config(cfg: TotHeadroomParams) -> SearchConfig:
    return SearchConfig(breadth=cfg.BREADTH, max_tokens=cfg.MAX_TOKENS, temperature=cfg.TEMPERATURE, base_seed=cfg.SEED,
                        max_model_len=cfg.MAX_MODEL_LEN, max_calls=cfg.MAX_CALLS, run_ceiling_s=cfg.RUN_CEILING_S,
                        invocation_bound_s=cfg.INVOCATION_BOUND_S)
