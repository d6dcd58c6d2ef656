"""Section 21: when does restoring KV beat recomputing it?

For every model shape in MODELS and every external tier the ARMS need (``arms.ARMS_OF_TIER``: LMCache,
the host-staged GPU buffer, vLLM's own CPU tier), one engine in its own child process; for every
context length in CONTEXT_TOKENS_GRID the shared context is computed once and stored on the tier's
disk tier (LMCache, GPU buffer), then each repeat runs the tier's arms in the order of a Williams
design (``arm_order``: each arm in each position, and after each other arm, equally often), one
follow-up each (context + SUFFIX_TOKENS, MAX_TOKENS out). One row per (model, context, arm, repeat)
goes to ``raw/rows.jsonl`` as it is measured.

Then the paired design, per point: the floors the tier's restores are judged by (``point_floors``: the context's
bytes moved in the tier's chunks, in the engine's process) are measured, every restore arm runs NUM_RESTORES
(disk arms NUM_DISK_RESTORES) pairs of a restore and its engine's resident follow-up back to back
(``RestoreBench.run_pairs``: the order alternating pair by pair), and the floors are measured again:
``raw/point_floors.jsonl`` (before, after) and ``raw/pairs.jsonl`` (one row per follow-up, with its pair and role).
The differences of two medians of a few follow-ups could not resolve a copy of a millisecond against a first token
that scatters by several; each restore's own span can, and the paired first tokens cancel the engine's drift.

A memory path's NUM_RESTORES pairs are a pilot where MAX_RESTORES is set (issue 42, Stein's two-stage design): the
report's own estimator (``report.pair_plan``: ``resolution_table`` on the pilot's pairs against the floor measured
before the point) decides, and where the span is unresolved and the restores its spread asks for are at most
MAX_RESTORES, the point runs the rest right after, on the same engine, continuing the pair numbers and the
alternation (on the H100, 6 Dec 2026, the LMCache server's restores of 0.5B at 32,512 tokens were unresolved at 64,
half-width 10.3% of the floor, ~68 needed). A second stage runs only where it and the rest of the child's grid fit
CHILD_TIMEOUT_S (``stage_fits``: past it the parent kills the child, and a killed unit loses everything it measured);
else the pilot's count stands (``over_time``). Each decision goes to ``raw/pair_plans.jsonl`` before its second stage;
the report's interval then pools both stages, its coverage approximately 95% (the count was chosen from the spread).

    path    where LMCache runs                       default on
    mp      ``lmcache server`` + LMCacheMPConnector   cpu (the in-process connector has no CPU GPU-connector)
    inproc  LMCacheConnectorV1 in the vLLM process    cuda

Why a child per (tier, model): LMCache keeps a process-wide engine and config singleton (in-process path)
and leaves non-daemon threads behind, so each model's engine lives and dies in its own process,
which ends with ``os._exit``. The physical floors (``kv.floors``) are measured by the parent.
Tables and plots: ``app.registry.crossover.report``.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kmesh_lib.base.captures import as_stored, validate_record
from kmesh_lib.base.declared import json_default
from kmesh_lib.base.params import build, to_dict
from kmesh_lib.base.paths import REPO_ROOT
from kmesh_lib.base.processes import RuntimeDir, runtime_root
from kmesh_lib.base.records import RunRecord, read_jsonl
from kmesh_lib.engine import costs
from kmesh_lib.engine.model_spec import resolve
from kmesh_lib.engine.vllm_engine import make_engine
from kmesh_lib.kv.disk_tier import check_disk_tier
from kmesh_lib.kv.floors import SATURATING_DISK_SWEEP
from kmesh_lib.lmcache.connect import InprocTier, MPTier, keep_engine_rendezvous_local
from kmesh_lib.sections.crossover.arms import KIND, Context, RestoreBench
from kmesh_lib.sections.crossover.captures import PairRow, PointFloors
from kmesh_lib.sections.crossover.params import (
    MIB,
    RESOLVE_MIN_TOKENS,
    CrossoverParams,
    arms_of,
    grid_size,
    max_pairs,
    model_params,
    num_pairs,
    pair_rows,
    tiers,
)
from kmesh_lib.sections.crossover.report import FLOOR_OF, pair_plan
from kmesh_lib.workloads.engine_runs import GPU_PHASE

REPO = REPO_ROOT
# a follow-up's preparation inside a pair, a prefix-cache reset and a drain: cuda from 0248's 3,200 pair rows (H100,
# 6 Dec: their preparation 0-4 ms, medians per tier, and about 14 ms per follow-up besides its first token)
PAIR_PREP_S = {"cpu": costs.Span(0.02, 0.1), "cuda": costs.Span(0.005, 0.03)}


def unit_duration(cfg: CrossoverParams, model: str, tier_name: str, most: bool = False) -> tuple[costs.Span, list[str]]:
    """One (model, tier) child: its engine and tier's start, then per context a store and, per repeat, the tier's
    arms: recompute and the resident arm's warm-up prefill the context, dram and disk move its bytes; then the
    paired design's restores, between two measurements of the point's floors. The pairs are the pilot's
    (``num_pairs``: the likely figure); ``most``: every memory point's second stage run to MAX_RESTORES
    (``max_pairs``: the bound, at the points a second stage may run)."""
    device = "cuda" if cfg.DEVICE == "cuda" else "cpu"
    total, notes = costs.LMCACHE_CHILD_S[device], []
    if not cfg.ENFORCE_EAGER:
        total += costs.COMPILE_S[device]
    repeats = cfg.WARMUP_REPEATS + cfg.NUM_REPEATS
    arms = arms_of(cfg, tier_name)
    kvt = resolve(model).kv_bytes_per_token(cfg.DTYPE)
    for n in cfg.CONTEXT_TOKENS_GRID:
        prefill, note = costs.prefill_s(device, model, n)
        step, _ = costs.decode_s(device, model, cfg.MAX_TOKENS * cfg.NUM_FOLLOWUPS)
        moved = costs.DISK_S_PER_BYTE * (n * kvt)
        kind = {"recompute": prefill + step, "resident": prefill + 2 * step, "memory": moved + 2 * step,
                "disk": moved + step}
        total += prefill + moved + repeats * sum((kind[KIND[a]] + costs.ROW_PREP_S[device] for a in arms), costs.Span(0, 0))
        # the paired design: a row's light preparation (a reset and a drain), a disk restore's read; its first
        # pair's full preparation; the floors before and after (a disk floor writes its file, then reads it)
        for a in arms:
            pairs = max_pairs(cfg, a, n) if most else num_pairs(cfg, a)
            if pairs:
                follow = (moved if KIND[a] == "disk" else costs.Span(0, 0)) + 2 * step + 2 * PAIR_PREP_S[device]
                total += pairs * follow + kind[KIND[a]] + costs.ROW_PREP_S[device]
        if any(num_pairs(cfg, a) for a in arms):
            total += 2 * (cfg.FLOOR_REPEATS + 1) * moved
            if tier_name == "gpubuf" and any(KIND[a] == "disk" for a in arms):  # its own reads in the disk floor's sweep
                total += 2 * cfg.FLOOR_REPEATS * moved
            if device == "cuda" and any(KIND[a] == "disk" for a in arms):  # the sweep's pinned ways (none run on CPU)
                total += 2 * cfg.FLOOR_REPEATS * sum(dest == "pinned" for _, _, dest in SATURATING_DISK_SWEEP) * moved
        if note and note not in notes:
            notes.append(note)
    return total, notes


CHILD = [sys.executable, "-m", "kmesh_lib.sections.crossover.experiment"]  # a (model, tier) child's command
CHILD_PARAMS = "crossover_params.yaml"  # raw/<this>: the params every child of a run reads (``write_child_params``)


@dataclass(frozen=True)
class Unit:
    """One (model, tier) child: an engine of ``model`` with ``tier`` as its external tier, its grid and pairs.
    Every record it writes (raw/models.jsonl, rows, pairs, point_floors, stores) names both."""

    model: str
    tier: str

    @property
    def name(self) -> str:
        """Its log's name (``child-<name>.log``, ``logs/<name>.log``) and the GPU driver's key for it: the model and,
        beside LMCache's tier, the tier. A model directory is named by its last part and a digest of the path as given,
        so two directories with the same last part (``/a/qwen``, ``/b/qwen``) keep their logs and units apart."""
        model = Path(self.model).name
        if model != self.model:
            model += "-" + hashlib.sha1(self.model.encode()).hexdigest()[:6]
        return model if self.tier == "lmcache" else f"{model}-{self.tier}"

    def command(self, run_dir: Path, child: list[str] | None = None) -> list[str]:
        """The child's command line: ``child`` (default ``CHILD``), the run folder, the model and the tier."""
        return [*(child or CHILD), str(run_dir), self.model, self.tier]


def units(cfg: CrossoverParams) -> list[Unit]:
    """The children of a run, in the order they run: per model of MODELS, per tier (``tiers``)."""
    return [Unit(m, t) for m in cfg.MODELS for t in tiers(cfg)]


def write_child_params(cfg: CrossoverParams, run_dir: Path) -> None:
    """raw/crossover_params.yaml: the params the children build again (``_child_main``)."""
    import yaml

    (Path(run_dir) / "raw" / CHILD_PARAMS).write_text(yaml.safe_dump({**to_dict(cfg), "RUN_DIR": str(run_dir)}))


def measure_floors(cfg: CrossoverParams) -> dict:
    """The physical floors, in this process: the disk's O_DIRECT reads on the disk tier's file system, the
    host->device copy and, with the GPU buffer's arms, the device->device copy (``kv.floors``)."""
    from kmesh_lib.base import processes
    from kmesh_lib.kv import floors as pf

    disk_root = Path(cfg.DISK_TIER_ROOT or processes.RUNTIME_ROOT)
    measured = {"disk": pf.odirect_read_bandwidth(disk_root, cfg.FLOOR_DISK_MIB),
                "copy": pf.host_to_device_bandwidth(cfg.FLOOR_COPY_MIB, cfg.DEVICE)}
    if "gpubuf" in tiers(cfg):
        measured["device"] = pf.device_to_device_bandwidth(cfg.FLOOR_COPY_MIB, cfg.DEVICE)
    return measured


def expected_duration(cfg: CrossoverParams, most: bool = False) -> tuple[costs.Span, list[str]]:
    """The floors cell, then one child per (model, tier) (``unit_duration``, ``most`` as there), one after another."""
    total, notes = costs.NOTEBOOK_S + costs.Span(0.5, 4.0), []  # the floors cell
    for unit in units(cfg):
        span, more = unit_duration(cfg, unit.model, unit.tier, most)
        total += span
        notes += [note for note in more if note not in notes]
    return total, notes


def recorded(record: RunRecord) -> tuple[dict, float]:
    """A run measured elsewhere (``SOURCE_RUN``): its floors and grid time as it recorded them (both measured live,
    so only results.json holds them: ``tables.TABLES`` declares them recorded only); starts nothing."""
    r = record.results
    return r["floors"], r["grid_seconds"]


def plan(cfg: CrossoverParams) -> dict:

    duration, notes = expected_duration(cfg)
    kv = {m: f"{resolve(m).kv_bytes_per_token(cfg.DTYPE) // 1024} KiB/token" for m in cfg.MODELS}
    # a second stage runs only where a pilot leaves a point the goal judges unresolved: the pilot's count is the
    # likely figure, every such point extended to MAX_RESTORES the bound
    staged = pair_rows(cfg, most=True) > pair_rows(cfg)
    most = expected_duration(cfg, most=True)[0] if staged else duration
    return {"path": cfg.path, "models": cfg.MODELS, "kv per token": kv, "context lengths": cfg.CONTEXT_TOKENS_GRID,
            "arms": cfg.ARMS, "repeats": f"{cfg.WARMUP_REPEATS} warm-up + {cfg.NUM_REPEATS} measured",
            "rows": grid_size(cfg),
            "restore pairs": (f"{cfg.NUM_RESTORES} per memory restore path"
                              + (f" (a pilot: up to {cfg.MAX_RESTORES} where it leaves a point of {RESOLVE_MIN_TOKENS:,} tokens "
                                    "or more unresolved)" if staged
                                 else "")
                              + f", {cfg.NUM_DISK_RESTORES} per disk path: {pair_rows(cfg)} rows in all"
                              + (f", at most {pair_rows(cfg, most=True)}" if staged else "")
                              if pair_rows(cfg) else "none (NUM_RESTORES=0)"),
            "tiers": tiers(cfg), "engine starts": len(cfg.MODELS) * len(tiers(cfg)),
            "children": children_plan(cfg),
            "expected duration": f"{duration}" + (f"; at most {most} with every second stage run to "
                                                  f"MAX_RESTORES={cfg.MAX_RESTORES}" if staged else "")
                                 + (f"; {'; '.join(notes)}" if notes else ""),
            costs.GPU_TIME: costs.gpu_time(cfg.DEVICE, duration),
            **({f"{costs.GPU_TIME} at most (every second stage to MAX_RESTORES={cfg.MAX_RESTORES})":
                costs.gpu_time(cfg.DEVICE, most)} if staged else {})}


def children_plan(cfg: CrossoverParams) -> str:
    """Each (model, tier) child's expected seconds (``unit_duration``): the GPU driver's units, which it starts only
    where one can end within a call's budget."""
    spans = [(u.name, unit_duration(cfg, u.model, u.tier)[0]) for u in units(cfg)]
    return (f"{len(spans)}, one after another (the GPU driver's units, kmesh_lib.sections.crossover.gpu): "
            + ", ".join(f"{name} {span.low:.0f}-{span.high:.0f} s" for name, span in spans))


def arm_order(arms: list[str], repeat: int) -> list[str]:
    """Row ``repeat`` of a Williams design over ``arms``: over every ``len(arms)`` repeats (twice that
    for an odd count) each arm runs once in each position and right after each other arm equally
    often, so neither what runs first (or right after a store) nor what an arm follows is tied to one
    arm. A plain rotation balances positions only: each arm would always follow the same one.

    Rows: ``base = [0, 1, n-1, 2, n-2, ...]``, row i is ``base + i`` (mod n); an odd n adds each row
    reversed."""
    n = len(arms)
    base, low, high = [0], 1, n - 1
    while len(base) < n:
        base.append(low)
        low += 1
        if len(base) < n:
            base.append(high)
            high -= 1
    rows = [[(b + i) % n for b in base] for i in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return [arms[k] for k in rows[repeat % len(rows)]]


# -- the child: one tier, one model --
def make_tier(cfg: CrossoverParams, tier_name: str, runtime: RuntimeDir, kvt: int, num_buffer_tokens: int | None = None,
              server_log: Path | None = None):
    """The external tier of one engine: LMCache (``cfg.path``), the GPU buffer or vLLM's CPU tier.
    The GPU buffer and vLLM's CPU tier hold one copy of the longest context (and headroom), or
    ``num_buffer_tokens`` of KV where given. An LMCache server's log is kept at ``server_log`` when it stops."""
    longest = (num_buffer_tokens or max(cfg.CONTEXT_TOKENS_GRID)) * kvt
    if tier_name == "gpubuf":
        from kmesh_lib.kv.gpu_buffer import GpuBufferTier

        return GpuBufferTier(-(-longest // MIB) + 16, runtime.subdir("gpubuf"), retain=True, saving=False,
                             layer_group_growth=cfg.LAYER_GROUP_GROWTH, copy_graphs=cfg.COPY_GRAPHS)
    if tier_name == "native":
        from kmesh_lib.kv.offloading import NativeOffloadTier

        return NativeOffloadTier(-(-2 * longest * 4 // (1 << 30)) / 4 + 0.25)
    if tier_name == "lmcache_mp":  # LMCache's server on either device (in-process mode is being retired)
        return MPTier(cfg.ARENA_MIB, cfg.CHUNK_SIZE, runtime, device=cfg.DEVICE, server_log=server_log)
    return (InprocTier(cfg.ARENA_MIB, cfg.CHUNK_SIZE, cfg.DISK_TIER_MIB, runtime) if cfg.path == "inproc"
            else MPTier(cfg.ARENA_MIB, cfg.CHUNK_SIZE, runtime, server_log=server_log))


@contextmanager
def gpubuf_bench(cfg: CrossoverParams, model: str, name: str, num_buffer_tokens: int):
    """A ``RestoreBench`` on one engine of ``model`` with a GPU-buffer tier holding ``num_buffer_tokens`` of its KV
    (``make_tier``), in a runtime folder ``name`` of its own; engine, tier and folder closed on exit, whatever
    happened. The benchmarks' harness (``benchmarks/gpu_concurrent_restores.py``, ``bench_gpubuf_restore_parts.py``)."""
    runtime = RuntimeDir.create(name, root=runtime_root(cfg.DISK_TIER_ROOT))
    tier = engine = None
    try:  # the folder is closed even where the tier could not be made
        tier = make_tier(cfg, "gpubuf", runtime, resolve(model).kv_bytes_per_token(cfg.DTYPE), num_buffer_tokens)
        if cfg.DEVICE == "cuda":
            keep_engine_rendezvous_local()
        engine = make_engine(model_params(cfg, model), **tier.llm_kwargs(cfg.DEVICE))
        yield RestoreBench(engine, tier, cfg.SUFFIX_TOKENS, 1, 1, "gpubuf")
    finally:
        if engine is not None:
            engine.close()
        if tier is not None:
            tier.close()
        runtime.close()


def floor_chunk_bytes(cfg: CrossoverParams, tier, tier_name: str, kind: str, kvt: int, nbytes: int) -> int:
    """The piece a restore of ``tier_name`` moves ``kind`` in: LMCache reads and copies whole chunks (CHUNK_SIZE
    tokens); the GPU buffer reads and stages its own chunks (whole blocks: ``BufferArena.chunk_bytes``, 18 blocks,
    15.75 MiB, of the 7B for its configured 16 MiB; the configured size before its KV is registered) and copies the
    context into vLLM's blocks at once; vLLM's CPU tier copies block by block."""
    if tier_name == "gpubuf":
        if kind == "device":
            return nbytes
        arena = own_arena(tier)
        return arena.chunk_bytes if arena is not None else tier.config.chunk_bytes
    if tier_name == "native":
        return cfg.BLOCK_SIZE * kvt
    return cfg.CHUNK_SIZE * kvt


def own_arena(tier):
    """The GPU buffer's worker-side arena where this process holds it (an in-process engine with its KV registered),
    else None."""
    worker = getattr(getattr(tier, "shared", None), "worker", None)
    return getattr(worker, "arena", None)


def own_disk_read(tier, tier_name: str):
    """The tier's own read of a context's file, as a disk floor way (``kv.floors.OwnRead``), where the sweep lacks it:
    the GPU buffer's (``BufferArena.read_seconds``: its chunks, one in flight, into its staging slots, pinned on CUDA:
    its ``destination``). None elsewhere: LMCache's own way is in the sweep already (one file per chunk, its
    disk_io_threads in flight, into ordinary pages and, on CUDA, into pinned memory as its own reads land), and
    vLLM's CPU tier has no disk."""
    from kmesh_lib.kv.floors import OwnRead

    arena = own_arena(tier) if tier_name == "gpubuf" else None
    if arena is None:
        return None
    return OwnRead("gpubuf stage (BufferArena.read_seconds)", arena.read_seconds, arena.chunk_bytes, 1,
                   "pinned" if arena.is_cuda else "pageable")


def as_read(cls, records: list[dict]) -> list:
    """``records`` as ``cls`` reads them back from their capture (``RunFiles.records``): a JSON line's values, so a
    decision taken on them here is the one ``checks`` recomputes from raw/."""
    return [validate_record(cls, as_stored(r, json_default)) for r in records]


def point_floors(cfg: CrossoverParams, tier, tier_name: str, runtime: RuntimeDir, kinds: list[str], model: str,
                 n: int, kvt: int, when: str) -> dict:
    """The floors of one point's context, measured in the engine's process ``when`` ("before", "after") its pairs,
    two ways (the disk floor on the tier's disk tier's file system): ``floors``, its bytes in the tier's chunks at
    FLOOR_QUEUE_DEPTH (``kv.floors.chunked_floor``); ``saturated``, the medium kept busy (``kv.floors.saturated_floor``:
    a copy in one piece; the disk, the fastest of a sweep of reads in the tier's chunks continuously in flight,
    LMCache's own way, one file per chunk with its ``disk_io_threads``, into ordinary pages and (CUDA: from 6 Dec 2026)
    into pinned memory, and one file at deeper queues, every way's figures in the record's ``sweep``, a way that could
    not run in its ``not_swept``; ``kv.floors.SATURATING_DISK_SWEEP``, the same for every tier). A restore is judged
    by the faster (``report.floor_range_ms``): on the H200 (5 Dec, 1.5B, 16,384 tokens) vLLM's CPU tier restored the
    context in 12.7 ms against 21-34 ms for its blocks copied one at a time from Python, and LMCache's disk tier read
    it in 281 ms against 416-424 ms for its chunks read one at a time, so the one-at-a-time measurement alone is no
    floor. Saturated disk records without ``in_flight``
    (before 6 Dec 2026) read 8 chunks in lockstep batches from one file: on the H200 (6 Dec, 7B, 16,384 tokens)
    LMCache's disk restores ran at 1.69 GB/s against that floor's 1.2-1.44 GB/s, so that floor was none either.
    The GPU buffer's disk floor's sweep also times the tier's own reads (``own_disk_read``; from 6 Dec 2026): on the
    H100 (7B, 1,024 tokens) its restores read the context at one read in flight in 30.2-35.5 ms, where the same bytes
    read by ``kv.floors`` took medians of 38.0-43.9 ms at one in flight and 34.4-36.2 ms at the sweep's best, so its
    restores' spans lay below that floor. LMCache's in-process disk restores lay below the pageable ways alone on
    three GPU runs of 6 Dec 2026 (H100 0248: its reads 169-172 ms, the sweep's reads 174.6-232 ms; H200 458a and b43a):
    its reads land in pinned memory, hence the pinned way."""
    from kmesh_lib.kv.floors import chunked_floor, saturated_floor

    nbytes = n * kvt
    directory = getattr(tier, "disk_dir", None) or runtime.subdir("floors")
    measured, saturated, errors = {}, {}, {}
    for kind in kinds:
        chunk = floor_chunk_bytes(cfg, tier, tier_name, kind, kvt, nbytes)
        own = own_disk_read(tier, tier_name) if kind == "disk" else None
        # a floor that cannot be measured here (memory, O_DIRECT) is recorded as such; the restores still run. Each
        # way is its own attempt, so a saturated measurement that raises leaves the chunked one standing (the verdicts
        # then use it alone); any error fails the "floors measured before and after" check all the same
        for way, into, floor, depth, extra in (("chunked", measured, chunked_floor, (cfg.FLOOR_QUEUE_DEPTH,), {}),
                                               ("saturated", saturated, saturated_floor, (),
                                                {"own": own} if own is not None else {})):
            try:
                into[kind] = floor(kind, nbytes, chunk, *depth, cfg.FLOOR_REPEATS, cfg.DEVICE, directory, **extra)
            except Exception as e:  # noqa: BLE001 - recorded; the verdicts say "no floor measured" for its paths
                errors[kind if way == "chunked" else f"{kind} ({way})"] = f"{type(e).__name__}: {e}"[:300]
    if cfg.DEVICE == "cuda":
        import torch

        torch.cuda.empty_cache()  # the floors' buffers back to the device before the engine's next step
    return {"model": model, "tier": tier_name, "context_tokens": n, "context_bytes": nbytes, "when": when,
            "floors": measured, "saturated": saturated, **({"errors": errors} if errors else {})}


@dataclass(frozen=True)
class ChildPace:
    """What a second stage's time guard (``stage_fits``) reads at one point's memory path. The parent kills a child
    after CHILD_TIMEOUT_S (``run_grid``; the GPU driver at its --run-timeout, CHILD_TIMEOUT_S by default) and a killed
    unit loses everything it measured (``gpu.finished_units`` sets it aside and the next call runs it again, where the
    same stage can kill it again), so a stage runs only where it and the rest of the child fit.

    ``started``: ``clock()`` at the child's start (``run_model``'s t_start; the child's imports before it are not
    counted: seconds, as vLLM and torch are imported after it, by ``make_engine``; 5.5 s on the 2-core CPU machine,
    loaded). ``tokens_begun``: the context tokens of the grid's points begun, this one included; ``tokens_to_come``:
    those of the points still to come, plus this point's share still to run (its paired arms after this one over all
    its paired arms, times its tokens)."""

    timeout_s: float  # CHILD_TIMEOUT_S
    started: float
    tokens_begun: int
    tokens_to_come: float
    clock: Callable[[], float] = time.monotonic

    def elapsed(self) -> float:
        return self.clock() - self.started

    @classmethod
    def at(cls, timeout_s: float, started: float, grid: list[int], point: int, arm: int, num_arms: int) -> ChildPace:
        """The pace at the ``arm``-th of ``num_arms`` paired arms of ``grid``'s ``point``-th point."""
        return cls(timeout_s, started, sum(grid[:point + 1]),
                   sum(grid[point + 1:]) + grid[point] * (num_arms - 1 - arm) / num_arms)


def stage_fits(plan: dict, pilot_s: float, pace: ChildPace) -> dict:
    """``plan`` (``report.pair_plan``) with its time guard: where an ``extended`` plan's second stage and the rest of
    the child would not end within CHILD_TIMEOUT_S, the pilot's count stands (reason ``over_time``). A plan of any
    other reason runs no stage and comes back as it is.

    Rule (simple, and conservative where it errs):

    - the stage's seconds, ``stage_s`` = its extra pairs x the pilot's own seconds per pair (``pilot_s``: its
      ``run_pairs`` call over its pairs; the first pair's full preparation makes that figure high);
    - the rest of the child = its pace so far per context token (seconds elapsed / ``tokens_begun``: the engine's
      start is in those seconds, which makes the pace high) x ``tokens_to_come`` (this point's later paired arms as
      a share of its tokens: an overcount, as its grid rows are done; its floors after the pairs are not counted
      apart);
    - ``time_left_s`` = CHILD_TIMEOUT_S - elapsed - the rest, negative where the rest alone would not fit: the stage
      runs only where ``stage_s <= time_left_s``.

    A later stage of the same child is not foreseen: each is held to the same rule when its own pilot ends, with
    every stage before it in the elapsed seconds. Both figures go to the plan (rounded to ms, as the decision used
    them) wherever the guard judged one."""
    if plan["reason"] != "extended":
        return plan
    elapsed = pace.elapsed()
    num_pilot = plan["num_pilot"]
    stage_s = round((plan["num_pairs_planned"] - num_pilot) * pilot_s / num_pilot, 3)
    rest_s = elapsed / pace.tokens_begun * pace.tokens_to_come
    left = round(pace.timeout_s - elapsed - rest_s, 3)
    cut = {} if stage_s <= left else {"reason": "over_time", "num_pairs_planned": num_pilot}
    return {**plan, **cut, "stage_s": stage_s, "time_left_s": left}


def run_arm_pairs(cfg: CrossoverParams, bench: RestoreBench, record: RunRecord, arm: str, ctx: Context, model: str,
                  path: str, kvt: int, before: dict, pace: ChildPace | None = None) -> dict | None:
    """One point's pairs of restore ``arm`` (``RestoreBench.run_pairs``), each row appended to raw/pairs.jsonl as it
    ends. A disk path runs NUM_DISK_RESTORES. A memory path runs NUM_RESTORES, a pilot: its decision
    (``report.pair_plan`` of those pairs against the floor measured ``before`` the point, then, given the child's
    ``pace``, ``stage_fits``: the stage must fit CHILD_TIMEOUT_S) goes to raw/pair_plans.jsonl, then, where it says
    ``extended``, the rest of its pairs run on the same engine, numbered on from the pilot's (``first_pair``), so the
    alternation continues and nothing is prepared in full again. Without ``pace`` no time guard applies. Returns the
    plan (None for a disk path)."""
    n = len(ctx.tokens)
    media = FLOOR_OF[arm][1]  # a memory path's one copy medium gets its floor timed beside each restore
    floor_kind = media[0] if len(media) == 1 and media[0] != "disk" else None
    tag = f"{model}-{n}-{arm}"

    def run(num: int, first_pair: int = 0) -> list[dict]:
        rows = bench.run_pairs(arm, ctx, tag, num, floor_kind, n * kvt, first_pair=first_pair)
        for row in rows:
            row.update(model=model, path=path, measured=True, kv_bytes_per_token=kvt, context_bytes=n * kvt)
            record.append_jsonl("pairs.jsonl", row)
        return rows

    pilot = num_pairs(cfg, arm)
    clock = pace.clock if pace is not None else time.monotonic
    t_pilot = clock()
    rows = run(pilot)
    pilot_s = clock() - t_pilot  # the pace a second stage would keep (``stage_fits``)
    if KIND[arm] != "memory":  # a disk path keeps NUM_DISK_RESTORES
        return None
    plan = {"model": model, "tier": bench.tier_name, "context_tokens": n, "path": arm,
            **pair_plan(as_read(PairRow, rows), as_read(PointFloors, [before]), pilot, cfg.MAX_RESTORES,
                        bound=cfg.DEVICE == "cuda")}
    if pace is not None:
        plan = stage_fits(plan, pilot_s, pace)
    record.append_jsonl("pair_plans.jsonl", plan)  # before the second stage: the pairs the point must hold
    if plan["num_pairs_planned"] > pilot:  # the second stage: the same engine, the numbering and alternation go on
        run(plan["num_pairs_planned"] - pilot, first_pair=pilot)
    return plan


def run_model(cfg: CrossoverParams, model: str, run_dir: Path, tier_name: str = "lmcache") -> int:

    record = RunRecord(run_dir, "crossover")
    mcfg = model_params(cfg, model)
    kvt = resolve(model).kv_bytes_per_token(cfg.DTYPE)
    path = cfg.path if tier_name == "lmcache" else tier_name
    summary = {"model": model, "tier": tier_name, "path": path, "kv_bytes_per_token": kvt, "status": "ok"}
    t_start = time.monotonic()
    runtime = RuntimeDir.create(f"crossover-{path}", root=runtime_root(cfg.DISK_TIER_ROOT))
    tier = engine = bench = None
    try:
        # an LMCache server's log outlives its runtime folder: logs/lmcache-server-<the unit's name>.log
        tier = make_tier(cfg, tier_name, runtime, kvt,
                         server_log=Path(run_dir) / "logs" / f"lmcache-server-{Unit(model, tier_name).name}.log")
        if getattr(tier, "disk_dir", None) is not None:  # vLLM's CPU tier alone has none
            summary["disk_tier"] = check_disk_tier(tier.disk_dir, cfg.CHUNK_SIZE * kvt,
                                                   sum(cfg.CONTEXT_TOKENS_GRID) * kvt + 64 * MIB)
        if hasattr(tier, "start"):
            tier.start()
        if cfg.DEVICE == "cuda":
            keep_engine_rendezvous_local()
        engine = make_engine(mcfg, **tier.llm_kwargs(cfg.DEVICE))
        if hasattr(tier, "attach"):
            tier.attach(engine)
        summary["engine_start_s"] = engine.start_s
        bench = RestoreBench(engine, tier, cfg.SUFFIX_TOKENS, cfg.MAX_TOKENS, cfg.NUM_FOLLOWUPS, tier_name)
        if bench.clocks is not None:
            summary["gpu_clocks"] = bench.clocks.why or "nvml"  # rows carry them only where NVML answered
        summary["switch"] = bench.switch.describe()
        summary["connector"] = type(bench.switch.connector).__module__ + "." + type(bench.switch.connector).__name__
        if hasattr(tier, "describe") and tier_name != "lmcache":
            summary["tier_route"] = tier.describe()
        arms = arms_of(cfg, tier_name)
        t_grid = time.monotonic()
        grid = cfg.CONTEXT_TOKENS_GRID
        for point, n in enumerate(grid):
            ctx = Context.random(f"{model}-{n}", n, bench.vocab, cfg.SEED)
            if bench.has_disk_tier:
                store = bench.store(ctx, expected_bytes=n * kvt)
                store.update(model=model, context_tokens=n, context_bytes=n * kvt)
                record.append_jsonl("stores.jsonl", store)
                if store["write_errors"] or store["bytes_written"] < n * kvt:
                    summary["status"] = "store_short"
                    continue
            else:  # no store step: the blocks earlier contexts' requests held cannot hold this one's KV
                bench.kv_digest.forget_held()
            for r in range(cfg.WARMUP_REPEATS + cfg.NUM_REPEATS):
                order = arm_order(arms, r)
                for i, arm in enumerate(order):
                    row = bench.run(arm, ctx, f"{model}-{n}-r{r}-{arm}")
                    row.update(model=model, path=path, repeat=r, measured=r >= cfg.WARMUP_REPEATS,
                               kv_bytes_per_token=kvt, context_bytes=n * kvt, arm_position=i,
                               previous_arm=order[i - 1] if i else None)
                    record.append_jsonl("rows.jsonl", row)
            paired = [a for a in arms if num_pairs(cfg, a)]
            if paired:  # the paired design, between two measurements of the floors its restores are judged by
                kinds = sorted({k for a in paired for k in FLOOR_OF[a][1]})
                before = point_floors(cfg, tier, tier_name, runtime, kinds, model, n, kvt, "before")
                record.append_jsonl("point_floors.jsonl", before)
                for j, arm in enumerate(paired):
                    # a second stage must leave the rest of the child inside CHILD_TIMEOUT_S (``stage_fits``)
                    pace = ChildPace.at(cfg.CHILD_TIMEOUT_S, t_start, grid, point, j, len(paired))
                    run_arm_pairs(cfg, bench, record, arm, ctx, model, path, kvt, before, pace)
                record.append_jsonl("point_floors.jsonl", point_floors(cfg, tier, tier_name, runtime, kinds, model, n,
                                                                      kvt, "after"))
        summary["grid_s"] = time.monotonic() - t_grid  # beside launch_thread_cpu_s: the share of a core it took
    except Exception as e:  # noqa: BLE001 - recorded, then re-raised as the child's exit status
        summary.update(status="error", detail=f"{type(e).__name__}: {e}")
        raise
    finally:
        if bench is not None:  # once per child, as the probe ended it: why the rows' load_bytes are None, where they are
            summary["copy_hook"] = bench.probe.copy_hook
            summary["kv_digest"] = bench.kv_digest.how
        if getattr(tier, "has_launch_thread", False):  # what its polling cost a core over the engine's life
            summary["launch_thread_cpu_s"] = tier.launch_thread_cpu_s()
        if engine is not None:
            engine.close()
        if tier is not None and hasattr(tier, "close"):
            tier.close()
        summary["seconds"] = time.monotonic() - t_start  # what the GPU driver's estimates of later children scale by
        record.append_jsonl("models.jsonl", summary)
        print("SUMMARY " + json.dumps({k: summary.get(k) for k in ("model", "tier", "status", "seconds", "engine_start_s",
                                                                   "grid_s", "detail")}), flush=True)  # the driver's log
    return 0


def _child_main(argv: list[str]) -> None:
    import yaml


    run_dir, model, tier_name = Path(argv[0]), argv[1], (argv[2] if len(argv) > 2 else "lmcache")
    cfg = build(CrossoverParams, yaml.safe_load((run_dir / "raw" / CHILD_PARAMS).read_text()))
    status = 1
    print(GPU_PHASE, flush=True)  # children run one at a time: this one's measured phase starts (a GPU driver's timer)
    try:
        status = run_model(cfg, model, run_dir, tier_name)
    except Exception:  # noqa: BLE001
        import traceback

        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # LMCache leaves non-daemon threads behind


# -- the parent: every model --
def run_grid(cfg: CrossoverParams, record, log=print) -> list[dict]:
    """Runs ``units(cfg)``, one child after another (``Unit.command``, as the GPU driver ``crossover.gpu`` runs
    them); shows a progress bar over rows; returns the child summaries."""
    from tqdm.auto import tqdm

    raw = record.run_dir / "raw"
    write_child_params(cfg, record.run_dir)
    rows_path = raw / "rows.jsonl"
    count = lambda: sum(1 for _ in open(rows_path)) if rows_path.exists() else 0  # noqa: E731
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    bar = tqdm(total=grid_size(cfg), desc="crossover rows", unit="row")
    done0 = count()
    for unit in units(cfg):
        t0 = time.monotonic()
        name = unit.name
        with open(raw / f"child-{name}.log", "ab") as out:
            proc = subprocess.Popen(unit.command(record.run_dir), stdout=out, stderr=subprocess.STDOUT, env=env,
                                    cwd=str(REPO), start_new_session=True)
            while proc.poll() is None:
                time.sleep(1.0)
                bar.n = count() - done0
                bar.refresh()
                if time.monotonic() - t0 > cfg.CHILD_TIMEOUT_S:
                    os.killpg(proc.pid, 15)
                    proc.wait()
                    log(f"{name}: killed after CHILD_TIMEOUT_S={cfg.CHILD_TIMEOUT_S}")
        bar.n = count() - done0
        bar.refresh()
        log(f"{name}: exit {proc.returncode} after {time.monotonic() - t0:.0f} s (log: raw/child-{name}.log)")
    bar.close()
    models = read_jsonl(raw / "models.jsonl") if (raw / "models.jsonl").exists() else []
    return [m for m in models if m["model"] in cfg.MODELS]


if __name__ == "__main__":
    _child_main(sys.argv[1:])
