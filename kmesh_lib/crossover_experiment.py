"""Section 21: when does restoring KV beat recomputing it?

For every model shape in MODELS (one engine each, in its own child process) and every context
length in CONTEXT_LENS, the shared context is computed once and stored on LMCache's disk tier;
then each repeat runs the four standard arms of ``restore_arms`` (recompute, dram, disk, floor) in
rotating order, one follow-up each (context + FOLLOWUP_NEW_TOKENS, OUTPUT_TOKENS out). One row per
(model, context, arm, repeat) goes to ``raw/rows.jsonl`` as it is measured.

    path    where LMCache runs                       default on
    mp      ``lmcache server`` + LMCacheMPConnector   cpu (the in-process connector has no CPU GPU-connector)
    inproc  LMCacheConnectorV1 in the vLLM process    cuda

Why a child per model: LMCache keeps a process-wide engine and config singleton (in-process path)
and leaves non-daemon threads behind, so each model's engine lives and dies in its own process,
which ends with ``os._exit``. The physical floors (``physical_floors``) are measured by the parent.
Tables and plots: ``crossover_report``.
"""
from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .engine_config import EngineParams
from .params import check
from .restore_arms import ARM_NAMES

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20


@dataclass(frozen=True)
class CrossoverParams(EngineParams):
    MODELS: list[str] = field(default_factory=lambda: ["tiny", "kvheavy"])
    CONTEXT_LENS: list[int] = field(default_factory=lambda: [256, 1024, 2048])
    ARMS: list[str] = field(default_factory=lambda: list(ARM_NAMES))
    NUM_REPEATS: int = 6
    WARMUP_REPEATS: int = 1
    FOLLOWUP_NEW_TOKENS: int = 32
    OUTPUT_TOKENS: int = 1
    FOLLOWUPS: int = 1
    PATH: Literal["auto", "mp", "inproc"] = "auto"
    CHUNK_SIZE: int = 256
    ARENA_MIB: int = 512
    DISK_TIER_MIB: int = 4096
    DISK_TIER_ROOT: str = ""
    FLOOR_DISK_MIB: int = 256
    FLOOR_COPY_MIB: int = 256
    CHILD_TIMEOUT_S: int = 1800

    def __post_init__(self) -> None:
        super().__post_init__()
        from .model_spec import SHAPES, resolve

        check(bool(self.MODELS), "MODELS: name at least one model shape")
        for m in self.MODELS:
            check(m in SHAPES or (Path(m).expanduser() / "config.json").is_file(),
                  f"MODELS: {m!r} is not a shape ({', '.join(SHAPES)}) nor a directory with config.json")
            check(not (m == "qwen2.5-7b" and self.WEIGHTS == "random" and self.DEVICE == "cpu"),
                  "MODELS: qwen2.5-7b with WEIGHTS=random would write a 15 GB checkpoint; use WEIGHTS: dummy")
        check(bool(self.CONTEXT_LENS), "CONTEXT_LENS: name at least one context length")
        check(self.CHUNK_SIZE > 0 and self.CHUNK_SIZE % self.BLOCK_SIZE == 0,
              f"CHUNK_SIZE={self.CHUNK_SIZE}: must be a positive multiple of BLOCK_SIZE={self.BLOCK_SIZE}")
        for n in self.CONTEXT_LENS:
            check(n > 0 and n % self.CHUNK_SIZE == 0,
                  f"CONTEXT_LENS: {n} is not a positive multiple of CHUNK_SIZE={self.CHUNK_SIZE} (a restore covers whole chunks)")
            for m in self.MODELS:
                limit = resolve(m).config.get("max_position_embeddings", 1 << 30)
                check(n + self.FOLLOWUP_NEW_TOKENS + 1 <= limit,
                      f"CONTEXT_LENS: {n} + FOLLOWUP_NEW_TOKENS={self.FOLLOWUP_NEW_TOKENS} + 1 exceeds {m}'s "
                      f"{limit} positions; the longest context it takes is {(limit - self.FOLLOWUP_NEW_TOKENS - 1) // self.CHUNK_SIZE * self.CHUNK_SIZE}")
        unknown = sorted(set(self.ARMS) - set(ARM_NAMES))
        check(not unknown and "recompute" in self.ARMS,
              f"ARMS={self.ARMS}: choose from {', '.join(ARM_NAMES)}; recompute (the control) is required")
        check(self.NUM_REPEATS >= 1, f"NUM_REPEATS={self.NUM_REPEATS}: must be >= 1")
        check(self.WARMUP_REPEATS >= 0, f"WARMUP_REPEATS={self.WARMUP_REPEATS}: must be >= 0")
        check(self.FOLLOWUP_NEW_TOKENS >= 1, f"FOLLOWUP_NEW_TOKENS={self.FOLLOWUP_NEW_TOKENS}: must be >= 1")
        check(self.OUTPUT_TOKENS >= 1, f"OUTPUT_TOKENS={self.OUTPUT_TOKENS}: must be >= 1")
        check(self.FOLLOWUPS >= 1, f"FOLLOWUPS={self.FOLLOWUPS}: must be >= 1")
        check(self.ARENA_MIB > 0 and self.DISK_TIER_MIB > 0, "ARENA_MIB and DISK_TIER_MIB must be > 0")
        check(self.PATH != "inproc" or self.DEVICE == "cuda",
              "PATH=inproc: LMCache's in-process connector has no CPU GPU-connector; use mp (or auto) on cpu")
        for m in self.MODELS:
            need = max(self.CONTEXT_LENS) * resolve(m).kv_bytes_per_token(self.DTYPE) / MIB
            check(need * 1.25 <= self.ARENA_MIB,
                  f"ARENA_MIB={self.ARENA_MIB}: {m}'s longest context is {need:.0f} MiB of KV; the arena needs 25 % headroom")

    @property
    def path(self) -> str:
        return self.PATH if self.PATH != "auto" else ("inproc" if self.DEVICE == "cuda" else "mp")


def model_params(cfg: CrossoverParams, model: str) -> CrossoverParams:
    """The engine for ``model``: a pool and model length that fit the longest context's follow-ups."""
    b = cfg.BLOCK_SIZE
    max_len = math.ceil((max(cfg.CONTEXT_LENS) + cfg.FOLLOWUP_NEW_TOKENS + 1) / b) * b + b
    blocks = (max_len // b) * (cfg.FOLLOWUPS + 1) + 9
    return dataclasses.replace(cfg, MODEL=model, MAX_MODEL_LEN=max_len, NUM_GPU_BLOCKS=blocks,
                               MAX_NUM_BATCHED_TOKENS=max(cfg.MAX_NUM_BATCHED_TOKENS, max_len),
                               MAX_NUM_SEQS=max(cfg.MAX_NUM_SEQS, cfg.FOLLOWUPS + 1))


def grid_size(cfg: CrossoverParams) -> int:
    return len(cfg.MODELS) * len(cfg.CONTEXT_LENS) * len(cfg.ARMS) * (cfg.WARMUP_REPEATS + cfg.NUM_REPEATS)


def plan(cfg: CrossoverParams) -> dict:
    from .model_spec import resolve

    rows = grid_size(cfg)
    # rough: an engine start per model, and per row about a prefill of the context (recompute, floor warm-up)
    start_s = 45 if cfg.DEVICE == "cuda" else 40
    per_row = 0.25 if cfg.DEVICE == "cuda" else 1.0
    kv = {m: f"{resolve(m).kv_bytes_per_token(cfg.DTYPE) // 1024} KiB/token" for m in cfg.MODELS}
    return {"path": cfg.path, "models": cfg.MODELS, "kv per token": kv, "context lengths": cfg.CONTEXT_LENS,
            "arms": cfg.ARMS, "repeats": f"{cfg.WARMUP_REPEATS} warm-up + {cfg.NUM_REPEATS} measured",
            "rows": rows, "engine starts": len(cfg.MODELS),
            "estimate": f"~{(len(cfg.MODELS) * start_s + rows * per_row) / 60:.0f} min"}


def arm_order(arms: list[str], repeat: int) -> list[str]:
    """Arms rotated by ``repeat`` so no arm always runs first (or right after a store)."""
    k = repeat % len(arms)
    return list(arms[k:]) + list(arms[:k])


# -- the child: one model --
def run_model(cfg: CrossoverParams, model: str, run_dir: Path) -> int:
    from .disk_tier import check_disk_tier
    from .engine import make_engine
    from .lmcache_connect import InprocTier, MPTier
    from .lmcache_runtime import RUNTIME_ROOT, RuntimeDir
    from .model_spec import resolve
    from .restore_arms import Context, RestoreBench
    from .run_record import RunRecord

    record = RunRecord(run_dir, "crossover")
    mcfg = model_params(cfg, model)
    kvt = resolve(model).kv_bytes_per_token(cfg.DTYPE)
    summary = {"model": model, "path": cfg.path, "kv_bytes_per_token": kvt, "status": "ok"}
    runtime = RuntimeDir.create(f"crossover-{cfg.path}", root=Path(cfg.DISK_TIER_ROOT or RUNTIME_ROOT))
    tier = (InprocTier(cfg.ARENA_MIB, cfg.CHUNK_SIZE, cfg.DISK_TIER_MIB, runtime) if cfg.path == "inproc"
            else MPTier(cfg.ARENA_MIB, cfg.CHUNK_SIZE, runtime))
    engine = None
    try:
        summary["disk_tier"] = check_disk_tier(tier.disk_dir, cfg.CHUNK_SIZE * kvt, sum(cfg.CONTEXT_LENS) * kvt + 64 * MIB)
        tier.start()
        engine = make_engine(mcfg, **tier.llm_kwargs(cfg.DEVICE))
        summary["engine_start_s"] = engine.start_s
        bench = RestoreBench(engine, tier, cfg.FOLLOWUP_NEW_TOKENS, cfg.OUTPUT_TOKENS, cfg.FOLLOWUPS)
        summary["switch"] = bench.switch.describe()
        summary["connector"] = type(bench.switch.connector).__module__ + "." + type(bench.switch.connector).__name__
        for n in cfg.CONTEXT_LENS:
            ctx = Context.random(f"{model}-{n}", n, bench.vocab, cfg.SEED)
            store = bench.store(ctx)
            store.update(model=model, context_tokens=n, context_bytes=n * kvt)
            record.append_jsonl("stores.jsonl", store)
            if store["write_errors"] or store["bytes_written"] < n * kvt:
                summary["status"] = "store_short"
                continue
            for r in range(cfg.WARMUP_REPEATS + cfg.NUM_REPEATS):
                for arm in arm_order(cfg.ARMS, r):
                    row = bench.run(arm, ctx, f"{model}-{n}-r{r}-{arm}")
                    row.update(model=model, path=cfg.path, repeat=r, measured=r >= cfg.WARMUP_REPEATS,
                               kv_bytes_per_token=kvt, context_bytes=n * kvt)
                    record.append_jsonl("rows.jsonl", row)
    except Exception as e:  # noqa: BLE001 - recorded, then re-raised as the child's exit status
        summary.update(status="error", detail=f"{type(e).__name__}: {e}")
        raise
    finally:
        if engine is not None:
            engine.close()
        tier.close()
        record.append_jsonl("models.jsonl", summary)
    return 0


def _child_main(argv: list[str]) -> None:
    import yaml

    from .params import build

    run_dir, model = Path(argv[0]), argv[1]
    cfg = build(CrossoverParams, yaml.safe_load((run_dir / "raw" / "crossover_params.yaml").read_text()))
    status = 1
    try:
        status = run_model(cfg, model, run_dir)
    except Exception:  # noqa: BLE001
        import traceback

        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # LMCache leaves non-daemon threads behind


# -- the parent: every model --
def run_grid(cfg: CrossoverParams, record, log=print) -> list[dict]:
    """Runs one child per model; shows a progress bar over rows; returns the child summaries."""
    import yaml
    from tqdm.auto import tqdm

    from .params import to_dict
    from .verify import read_jsonl

    raw = record.run_dir / "raw"
    (raw / "crossover_params.yaml").write_text(yaml.safe_dump({**to_dict(cfg), "RUN_DIR": str(record.run_dir)}))
    rows_path = raw / "rows.jsonl"
    count = lambda: sum(1 for _ in open(rows_path)) if rows_path.exists() else 0  # noqa: E731
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    bar = tqdm(total=grid_size(cfg), desc="crossover rows", unit="row")
    done0 = count()
    for model in cfg.MODELS:
        t0 = time.monotonic()
        with open(raw / f"child-{model}.log", "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "kmesh_lib.crossover_experiment", str(record.run_dir), model],
                                    stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(REPO), start_new_session=True)
            while proc.poll() is None:
                time.sleep(1.0)
                bar.n = count() - done0
                bar.refresh()
                if time.monotonic() - t0 > cfg.CHILD_TIMEOUT_S:
                    os.killpg(proc.pid, 15)
                    proc.wait()
                    log(f"{model}: killed after CHILD_TIMEOUT_S={cfg.CHILD_TIMEOUT_S}")
        bar.n = count() - done0
        bar.refresh()
        log(f"{model}: exit {proc.returncode} after {time.monotonic() - t0:.0f} s (log: raw/child-{model}.log)")
    bar.close()
    models = read_jsonl(raw / "models.jsonl") if (raw / "models.jsonl").exists() else []
    return [m for m in models if m["model"] in cfg.MODELS]


def verify(run_dir) -> list:
    """Re-checks from ``raw/rows.jsonl``: every measured row hit its expected cached tokens."""
    from .verify import Check, read_jsonl

    path = Path(run_dir) / "raw" / "rows.jsonl"
    if not path.exists():
        return [Check("raw/rows.jsonl exists", False, "no rows were recorded")]
    rows = [r for r in read_jsonl(path) if r.get("measured")]
    bad = [r["tag"] for r in rows if any(c != r["expected_cached_tokens"] for c in r["num_cached_tokens"])]
    arms = sorted({r["arm"] for r in rows})
    return [Check("raw: measured rows recorded", bool(rows), f"{len(rows)} rows, arms {arms}"),
            Check("raw: every follow-up hit its expected cached tokens", not bad, f"misses: {bad[:5]}")]


if __name__ == "__main__":
    _child_main(sys.argv[1:])
