"""Section 19: does model-driven branching leave room for better retention?

A Tree-of-Thoughts Game of 24 search (``workloads.tot_search``) runs on the kmesh engine with a capture on
its block pool. Stock vLLM's observed prefill (sum over invocations of prompt tokens minus
``num_cached_tokens``) is compared with the offline ideal bound (``bounds.ideal``: Belady MIN on
block hashes) and the LRU model at the same pool size, then swept over pool sizes.

Only a complete run qualifies for the comparison: a run that hits a limit (calls, the run
ceiling or the per-invocation bound) is marked partial. The consistency checks (``app.verify``)
recompute the bound, regrade every answer and replay the whole search from the raw capture.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from kmesh_lib.base.records import environment, sha256_file
from kmesh_lib.engine.model_spec import ByteTokenizer, materialize, resolve, tokenizer_for
from kmesh_lib.engine.vllm_engine import make_engine
from kmesh_lib.kv.capture import BlockPoolCapture, drain_check
from kmesh_lib.sections.tot_headroom.generator import InvocationBlockLog, capture_record, engine_generator
from kmesh_lib.sections.tot_headroom.params import CAPTURE, CLOCK_DOMAIN, OUTCOMES, TotHeadroomParams, search_config
from kmesh_lib.workloads import game24
from kmesh_lib.workloads.tot_search import COUNT_NAMES, SearchRun, TotSearch, encode


def hash_model_dir(model_dir: Path) -> dict[str, str]:
    """SHA-256 of every file of a model directory (weights, config, tokenizer), by relative path."""
    model_dir = Path(model_dir)
    return {str(p.relative_to(model_dir)): sha256_file(p) for p in sorted(model_dir.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(model_dir).parts)}


def check_model_files(cfg: TotHeadroomParams) -> dict[str, str]:
    """Hashes the files the engine will load; call before the engine allocates anything.

    A real model directory must hold its tokenizer (prompts are its tokens) and, with
    MODEL_MANIFEST, match it file for file. Synthetic shapes are hashed as materialized.
    """

    spec = resolve(cfg.MODEL)
    if spec.is_synthetic:
        weights = "dummy" if cfg.ENGINE == "replay" else cfg.WEIGHTS
        model_dir = materialize(spec, weights, cfg.DTYPE, cfg.SEED)
    else:
        model_dir = spec.path
        if not any((model_dir / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
            raise ValueError(f"MODEL={cfg.MODEL!r}: a real model directory needs its tokenizer files")
    hashes = hash_model_dir(model_dir)
    if cfg.MODEL_MANIFEST:
        want = json.loads(game24.repo_path(cfg.MODEL_MANIFEST).read_text())
        wrong = sorted(f for f in set(want) | set(hashes) if want.get(f) != hashes.get(f))
        if wrong:
            raise ValueError(f"model files differ from MODEL_MANIFEST={cfg.MODEL_MANIFEST!r}: {wrong[:5]}")
    return hashes


@dataclass
class TotRun:
    search: SearchRun
    records: list[dict]
    engine_start_s: float
    search_s: float
    drain_ok: bool
    drain_text: str
    num_unattributed_events: int
    block_ops: dict


def run(cfg: TotHeadroomParams, record) -> TotRun:
    """Hashes the inputs, runs the search on the profile's engine and writes raw/ as it goes."""

    t_start = time.monotonic()  # the run ceiling counts the engine start too
    csv_path = game24.repo_path(cfg.PUZZLES_CSV)
    inputs = {f"puzzles:{csv_path.name}": sha256_file(csv_path)}
    inputs.update({f"model:{name}": digest for name, digest in check_model_files(cfg).items()})
    record.save("inputs", inputs)  # hashed before the engine allocates its first block
    puzzles = game24.load_puzzles(csv_path, cfg.PUZZLE_INDICES)
    engine = make_engine(cfg)
    capture = BlockPoolCapture(engine.block_pool)
    log = InvocationBlockLog(engine, capture)
    engine_info = {"name": "vllm", "version": environment()["packages"].get("vllm", "unknown"), "mode": engine.mode,
                   "device": cfg.DEVICE, "block_size": cfg.BLOCK_SIZE, "num_gpu_blocks": cfg.NUM_GPU_BLOCKS,
                   "model": engine.spec.name}
    records: list[dict] = []

    def on_group(invocations) -> None:
        recs = [capture_record(inv, run_id=record.run_dir.name, engine_info=engine_info, clock_domain=CLOCK_DOMAIN,
                               block_events=log.events_for(inv.call.invocation_id)) for inv in invocations]
        record.append_jsonl(CAPTURE, recs)
        records.extend(recs)

    scfg = search_config(cfg)
    t0 = time.monotonic()
    try:
        search = TotSearch(engine_generator(engine, scfg, on_step=capture.mark_step), tokenizer_for(engine.spec), scfg,
                           on_group=on_group).run(puzzles, started_at=t_start)
    finally:
        search_s = time.monotonic() - t0
        drain = drain_check(engine.block_pool)
        log.close()
        capture.close()
        record.append_jsonl("block_events.jsonl", capture.to_records())
        engine.close()
    record.append_jsonl(OUTCOMES, [o.to_dict() for o in search.outcomes])
    out = TotRun(search, records, engine.start_s, search_s, drain.ok, str(drain), log.num_unattributed, capture.counts())
    record.save("search", summary(out))
    return out


def summary(run: TotRun) -> dict:
    """Aggregates only (no expressions or token ids): what results.json and the public file hold."""
    s = run.search
    seconds = sorted((r["t_finish_ns"] or r["t_submit_ns"]) - r["t_submit_ns"] for r in run.records)
    return {"partial": s.partial, "limit_hit": s.limit_hit, "qualifies": not s.partial,
            "engine_start_s": round(run.engine_start_s, 1), "search_s": round(run.search_s, 1),
            "invocation_s": {"median": round(seconds[len(seconds) // 2] / 1e9, 1) if seconds else None,
                             "max": round(seconds[-1] / 1e9, 1) if seconds else None},
            "counts": {k: s.counts[k] for k in COUNT_NAMES}, "block_ops": run.block_ops,
            "num_unattributed_block_events": run.num_unattributed_events, "drain_ok": run.drain_ok,
            "outcomes": [{k: o.to_dict()[k] for k in ("puzzle_index", "numbers", "status", "reason", "num_calls")}
                         for o in s.outcomes]}


def plan(cfg: TotHeadroomParams) -> dict:
    """What ``kmesh plan 19`` prints; starts no engine."""

    spec = resolve(cfg.MODEL)
    tok = ByteTokenizer(spec.config["vocab_size"]) if spec.is_synthetic else tokenizer_for(spec)
    puzzles = game24.load_puzzles(cfg.PUZZLES_CSV, cfg.PUZZLE_INDICES)
    question = game24.propose_question(game24.root_state(puzzles[0].numbers))
    root = len(encode(tok, game24.FEWSHOT)) + len(encode(tok, question))
    usable = cfg.NUM_GPU_BLOCKS - 1
    kv_mib = spec.kv_bytes_per_token(cfg.DTYPE) * cfg.BLOCK_SIZE * usable / (1 << 20)
    # measured on 2 idle CPU cores: tiny ~0.005 s/token; the 0.5B shape ~5 s prefill + ~0.13 s/token
    # (other jobs on the cores have made it ~8x slower)
    per_call_s = {"tiny": 1 + 0.005 * cfg.MAX_TOKENS, "qwen2.5-0.5b": 5 + 0.13 * cfg.MAX_TOKENS}.get(cfg.MODEL) \
        if cfg.DEVICE == "cpu" else None
    return {
        "puzzles": ", ".join(f"{p.index}: {' '.join(map(str, p.numbers))}" for p in puzzles),
        "search": f"BFS, {cfg.BREADTH} states kept per step, 3 steps; one proposal call per state, one value call per "
                  f"distinct numbers-left (memoized); <= {cfg.MAX_TOKENS} output tokens, temperature {cfg.TEMPERATURE}, "
                  f"seed {cfg.SEED} + call index",
        "limits": f"{cfg.MAX_CALLS} calls, run ceiling {cfg.RUN_CEILING_S / 60:.0f} min (engine start included), "
                  f"{cfg.INVOCATION_BOUND_S:.0f} s per invocation",
        "engine": f"{cfg.ENGINE} vLLM on {cfg.DEVICE}: {spec.name} ({cfg.WEIGHTS} weights, {cfg.DTYPE}), "
                  f"MAX_MODEL_LEN {cfg.MAX_MODEL_LEN}",
        "pool": f"NUM_GPU_BLOCKS {cfg.NUM_GPU_BLOCKS} = {usable} usable + the null block, {cfg.BLOCK_SIZE}-token blocks: "
                f"{usable * cfg.BLOCK_SIZE} tokens, {kv_mib:.0f} MiB of KV",
        "prompts": f"few-shot header + root question {root} tokens; children extend their producer's prompt + output",
        "bound sweep (usable blocks)": sorted(set(cfg.SWEEP_POOL_BLOCKS) | {usable}),
        "expected duration": (f"engine start + about {per_call_s:.0f} s per call" if per_call_s else "not measured")
                             + "; with random or dummy weights nothing parses: one proposal call per puzzle",
    }


