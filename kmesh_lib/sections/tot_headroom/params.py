"""Section 19's parameters, raw file names and the search configuration they give."""
from __future__ import annotations

import socket
from dataclasses import dataclass, field

from kmesh_lib.base.params import check
from kmesh_lib.engine.config import EngineParams
from kmesh_lib.engine.model_spec import resolve
from kmesh_lib.workloads import game24
from kmesh_lib.workloads.tot_search import SearchConfig

CAPTURE = "tot_capture.jsonl"  # raw/: one kmesh.capture/1 record per invocation, appended per group
OUTCOMES = "tot_outcomes.jsonl"  # raw/: one record per puzzle, failures included
CLOCK_DOMAIN = f"time.monotonic_ns@{socket.gethostname()}"


@dataclass(frozen=True)
class TotHeadroomParams(EngineParams):
    PUZZLES_CSV: str = "$KMESH_DATA_ROOT/game24/24.csv"  # the data root's copy (base.data); else relative to the repo
    PUZZLE_INDICES: list[int] = field(default_factory=lambda: [0, 1, 2])  # rows in file order
    BREADTH: int = 2  # states kept per BFS step
    MAX_TOKENS: int = 192  # output tokens per call
    TEMPERATURE: float = 0.7  # call i samples with seed SEED + i
    MAX_CALLS: int = 384
    RUN_CEILING_S: float = 4500.0  # checked at call boundaries
    INVOCATION_BOUND_S: float = 120.0  # a call running longer is aborted (the run is then partial)
    KV_CACHE_MIB: float | None = None  # when set, NUM_GPU_BLOCKS must be the pool it buys, + the null block
    SWEEP_POOL_BLOCKS: list[int] = field(default_factory=lambda: [8, 16, 32, 64, 128, 256, 512, 1024])
    MODEL_MANIFEST: str | None = None  # JSON {file: sha256} the model directory must match (repo-relative)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.PUZZLE_INDICES and len(set(self.PUZZLE_INDICES)) == len(self.PUZZLE_INDICES)
              and min(self.PUZZLE_INDICES) >= 0, f"PUZZLE_INDICES={self.PUZZLE_INDICES}: distinct rows >= 0, at least one")
        csv_path = game24.repo_path(self.PUZZLES_CSV)
        check(csv_path.is_file(), f"PUZZLES_CSV={self.PUZZLES_CSV!r}: no file at {csv_path}")
        num_puzzles = len(game24.load_puzzles(csv_path))
        check(max(self.PUZZLE_INDICES) < num_puzzles,
              f"PUZZLE_INDICES={self.PUZZLE_INDICES}: {csv_path.name} has rows 0..{num_puzzles - 1}")
        check(self.BREADTH >= 1, f"BREADTH={self.BREADTH}: must be >= 1")
        check(self.MAX_TOKENS >= 1, f"MAX_TOKENS={self.MAX_TOKENS}: must be >= 1")
        check(self.TEMPERATURE >= 0, f"TEMPERATURE={self.TEMPERATURE}: must be >= 0")
        check(self.MAX_CALLS >= 1, f"MAX_CALLS={self.MAX_CALLS}: must be >= 1")
        check(self.RUN_CEILING_S > 0 and self.INVOCATION_BOUND_S > 0,
              f"RUN_CEILING_S={self.RUN_CEILING_S}, INVOCATION_BOUND_S={self.INVOCATION_BOUND_S}: must be > 0")
        check(all(n >= 1 for n in self.SWEEP_POOL_BLOCKS), f"SWEEP_POOL_BLOCKS={self.SWEEP_POOL_BLOCKS}: must be >= 1")
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
