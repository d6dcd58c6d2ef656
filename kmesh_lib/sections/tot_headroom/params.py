"""Section 19's parameters, raw file names, and the search, policy and arms they give."""
from __future__ import annotations

import dataclasses
import json
import math
import re
import socket
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from kmesh_lib.base.data import DATA_ROOT_PREFIX, data_root
from kmesh_lib.base.params import (
    MAX_BLOCKS,
    MAX_MIB,
    Count,
    ParamError,
    PathText,
    PositiveCount,
    Seconds,
    Tokens,
    check,
    check_path,
    params_dataclass,
    read_bounded,
)
from kmesh_lib.engine.config import EngineParams
from kmesh_lib.engine.model_spec import resolve
from kmesh_lib.workloads import game24
from kmesh_lib.workloads.tot_script import ScriptedPolicy
from kmesh_lib.workloads.tot_search import SearchConfig

CAPTURE = "tot_capture.jsonl"  # raw/: one kmesh.capture/1 record per invocation of the engine run, per group
OUTCOMES = "tot_outcomes.jsonl"  # raw/: one record per puzzle of the engine run, failures included
BLOCK_EVENTS = "block_events.jsonl"  # raw/: the engine run's whole block-pool capture
STOCK_SWEEP = "stock_sweep.jsonl"  # raw/: one record per replay arm (a trace at one pool size), per arm
CLOCK_DOMAIN = f"time.monotonic_ns@{socket.gethostname()}"
ENGINE_TRACE = "engine"  # the engine run's trace, replayed at other pool sizes
Share = Annotated[float, Field(ge=0, le=1)]


@params_dataclass
class TotHeadroomParams(EngineParams):
    # what runs recorded before a parameter existed ran with (``base.params.recorded``): the model's own policy
    predating_values: ClassVar[dict[str, str]] = {"POLICY": "model"}

    PUZZLES_CSV: PathText = Field(
        "$KMESH_DATA_ROOT/game24/24.csv",
        description="the puzzle file: $KMESH_DATA_ROOT/... (the data root, README 'Data') or relative to the repo root")
    PUZZLE_INDICES: list[Count] = Field(
        default_factory=lambda: [0, 1, 2], min_length=1, description="the engine run's puzzles by row in file order")
    POLICY: Literal["scripted", "model"] = Field(
        "scripted", description="scripted: outputs forced to a seeded weak-model script; model: the model writes them")
    SCRIPT_ERROR_RATE: Share = Field(0.25, description="share of scripted proposal lines that are wrong")
    SCRIPT_UNPARSED_SHARE: Share = Field(
        0.5, description="of the wrong lines, the share that do not parse (the rest parse but are invalid)")
    SCRIPT_VALUE_ACCURACY: Share = Field(0.8, description="share of scripted judgements that agree with the solver")
    BREADTH: PositiveCount = Field(2, description="states kept per BFS step")
    MAX_TOKENS: Tokens = Field(192, description="output tokens per call (scripted lengths are capped here)")
    # vLLM takes any temperature >= 0; above 2 the samples are already noise, so 10 is no limit
    # to an experiment and catches a typo.
    TEMPERATURE: float = Field(0.7, ge=0, le=10, description="sampling temperature; call i samples with seed SEED + i")
    MAX_CALLS: PositiveCount = Field(
        384, description="the engine run's call limit; a group that would pass it is not started (the run is partial)")
    RUN_CEILING_S: Seconds = Field(
        4500.0, description="whole-search ceiling in seconds (75 minutes), checked at call boundaries")
    INVOCATION_BOUND_S: Seconds = Field(120.0, description="a call running longer is aborted (the run is then partial)")
    KV_CACHE_MIB: Annotated[float, Field(gt=0, le=MAX_MIB)] | None = Field(
        None, description="when set, NUM_GPU_BLOCKS must be the blocks this much KV buys + the null block")
    SWEEP_POOL_BLOCKS: list[Annotated[int, Field(ge=1, le=MAX_BLOCKS)]] = Field(
        default_factory=lambda: [8, 16, 32, 64, 128, 256, 512, 1024], min_length=1,
        description="usable pool sizes for the stock, LRU and ideal sweep (the run's is added)")
    NUM_SCALE_PUZZLES: Count = Field(
        50, description="the scale traces: puzzles 0..N-1, scripted, replayed on vLLM's scheduler (0: none)")
    SCRIPT_ERROR_RATES: list[Share] = Field(
        default_factory=lambda: [0.0, 0.1, 0.25, 0.5, 0.75], description="the scale sweep's proposal error rates")
    MODEL_MANIFEST: PathText | None = Field(
        None, description="JSON {file: sha256} a real model directory must match before the engine starts (repo-relative)")

    def check_rules(self) -> None:
        super().check_rules()
        check(len(set(self.PUZZLE_INDICES)) == len(self.PUZZLE_INDICES),
              f"PUZZLE_INDICES={self.PUZZLE_INDICES}: name each row once")
        try:
            csv_path = game24.repo_path(self.PUZZLES_CSV)
            missing = not csv_path.exists()
        except (OSError, RuntimeError):  # a symlink loop: check_path below names it
            missing = False
        if missing and self.PUZZLES_CSV.startswith(DATA_ROOT_PREFIX):
            raise ParamError(f"PUZZLES_CSV={self.PUZZLES_CSV[:60]!r}: no file at {csv_path}; "
                             "`kmesh data fetch game24` gets it")
        csv_path = check_path("PUZZLES_CSV", self.PUZZLES_CSV, "file")
        try:
            num_puzzles = len(game24.load_puzzles(csv_path))
        except ValueError as e:
            raise ParamError(f"PUZZLES_CSV={self.PUZZLES_CSV[:60]!r}: {e}") from None
        if self.MODEL_MANIFEST is not None:
            read_manifest(self.MODEL_MANIFEST)
        check(max(self.PUZZLE_INDICES) < num_puzzles,
              f"PUZZLE_INDICES={self.PUZZLE_INDICES}: {csv_path.name} has rows 0..{num_puzzles - 1}")
        check(self.NUM_SCALE_PUZZLES <= num_puzzles,
              f"NUM_SCALE_PUZZLES={self.NUM_SCALE_PUZZLES}: 0 (no scale traces) .. {num_puzzles} ({csv_path.name})")
        check(bool(self.SCRIPT_ERROR_RATES) or self.NUM_SCALE_PUZZLES == 0,
              f"SCRIPT_ERROR_RATES=[]: the scale traces (NUM_SCALE_PUZZLES={self.NUM_SCALE_PUZZLES}) need a rate; "
              "NUM_SCALE_PUZZLES=0 runs none")
        check(len(set(self.SCRIPT_ERROR_RATES)) == len(self.SCRIPT_ERROR_RATES),
              f"SCRIPT_ERROR_RATES={self.SCRIPT_ERROR_RATES}: name each rate once")
        header = len(game24.FEWSHOT.encode()) + 64  # byte-tokenizer size of a root prompt; BPE is smaller
        check(header + self.MAX_TOKENS <= self.MAX_MODEL_LEN,
              f"MAX_TOKENS={self.MAX_TOKENS}: a root prompt (~{header} tokens) + MAX_TOKENS exceeds "
              f"MAX_MODEL_LEN={self.MAX_MODEL_LEN}")
        if self.KV_CACHE_MIB is not None:
            want = pool_blocks(self)
            check(self.NUM_GPU_BLOCKS == want,
                  f"NUM_GPU_BLOCKS={self.NUM_GPU_BLOCKS}: KV_CACHE_MIB={self.KV_CACHE_MIB} of {self.MODEL} at "
                  f"{self.DTYPE} with {self.BLOCK_SIZE}-token blocks buys {want - 1} blocks + the null block = {want}")


MAX_MANIFEST_BYTES = 1 << 20


def read_manifest(value: str) -> dict[str, str]:
    """MODEL_MANIFEST: a regular file holding a JSON object {file name: SHA-256 hex}; ParamError otherwise."""
    path = check_path("MODEL_MANIFEST", value, "file")
    shown = f"MODEL_MANIFEST={value[:60]!r}"
    try:
        manifest = json.loads(read_bounded(path, MAX_MANIFEST_BYTES, "model manifest").decode("utf-8"))
    except (ValueError, RecursionError):
        raise ParamError(f"{shown}: not JSON") from None
    check(isinstance(manifest, dict) and manifest and all(
        isinstance(k, str) and isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) for k, v in manifest.items()),
          f"{shown}: not a JSON object of file name -> SHA-256 (64 hex digits)")
    return manifest


def pool_blocks(cfg) -> int:
    """NUM_GPU_BLOCKS that KV_CACHE_MIB buys: whole blocks, plus vLLM's null block."""

    block_bytes = resolve(cfg.MODEL).kv_bytes_per_token(cfg.DTYPE) * cfg.BLOCK_SIZE
    return int(cfg.KV_CACHE_MIB * (1 << 20)) // block_bytes + 1



def search_config(cfg) -> SearchConfig:
    return SearchConfig(breadth=cfg.BREADTH, max_tokens=cfg.MAX_TOKENS, temperature=cfg.TEMPERATURE, base_seed=cfg.SEED,
                        max_model_len=cfg.MAX_MODEL_LEN, max_calls=cfg.MAX_CALLS, run_ceiling_s=cfg.RUN_CEILING_S,
                        invocation_bound_s=cfg.INVOCATION_BOUND_S)


def scale_search_config(cfg) -> SearchConfig:
    """The scale traces run to the end: replayed outputs take no model time, so no call or time limit."""
    return dataclasses.replace(search_config(cfg), max_calls=math.inf, run_ceiling_s=math.inf)


def scripted_policy(cfg, tokenizer, error_rate: float | None = None) -> ScriptedPolicy:
    return ScriptedPolicy(tokenizer, seed=cfg.SEED,
                          error_rate=cfg.SCRIPT_ERROR_RATE if error_rate is None else error_rate,
                          unparsed_share=cfg.SCRIPT_UNPARSED_SHARE, value_accuracy=cfg.SCRIPT_VALUE_ACCURACY,
                          max_tokens=cfg.MAX_TOKENS)


def policy_label(cfg) -> str:
    """How every table and plot names the policy: "scripted (...)" or the model's name."""
    if cfg.POLICY == "scripted":
        return (f"scripted (proposal error rate {cfg.SCRIPT_ERROR_RATE:g}, {cfg.SCRIPT_UNPARSED_SHARE:g} of errors "
                f"unparseable; value accuracy {cfg.SCRIPT_VALUE_ACCURACY:g})")
    return f"model {resolve(cfg.MODEL).name} ({'its weights' if not resolve(cfg.MODEL).is_synthetic else cfg.WEIGHTS})"


def stock_pool_sizes(cfg) -> list[int]:
    """Usable pool sizes at which stock vLLM is observed: the sweep's sizes that hold one request
    of MAX_MODEL_LEN tokens (vLLM refuses a smaller pool), plus the run's own pool."""
    fits = [n for n in cfg.SWEEP_POOL_BLOCKS if n * cfg.BLOCK_SIZE >= cfg.MAX_MODEL_LEN]
    return sorted(set(fits) | {cfg.NUM_GPU_BLOCKS - 1})


def bound_pool_sizes(cfg) -> list[int]:
    """Usable pool sizes for the LRU reference and the ideal bound (any size): the sweep's and the run's."""
    return sorted(set(cfg.SWEEP_POOL_BLOCKS) | {cfg.NUM_GPU_BLOCKS - 1})


def scale_trace_name(error_rate: float) -> str:
    return f"scale-e{error_rate:g}"


def data_relative(path: Path) -> str:
    """``path`` relative to the data root when it is inside it (runs record inputs this way, by content
    hash, so a run made on another machine names the same file); otherwise its file name."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(data_root().resolve()))
    except ValueError:
        return path.name
