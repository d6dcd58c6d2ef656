"""Section 19: does model-driven branching leave room for better retention?

A Tree-of-Thoughts Game of 24 search (``workloads.tot_search``) runs on the kmesh engine with a capture
on its block pool. With ``POLICY: scripted`` every call's output is forced (``engine.forcing``) to
the text a seeded weak-model script writes (``workloads.tot_script``); the engine still prefills
and decodes every call. Then (``arms``) the same trace is replayed on vLLM's own scheduler and
KV-cache manager (the replay engine) at every pool size, and larger scripted searches are run
there at several script error rates. Stock vLLM's prefill is compared with the LRU reference and
the offline ideal bound (``bounds.ideal``) at each size.

A run that hits a limit (calls, the run ceiling or the per-invocation bound) is partial; its
``checks`` say so (``run is complete`` fails) and skip what needs a whole search.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from kmesh_lib.base.records import environment, sha256_file
from kmesh_lib.engine import costs
from kmesh_lib.engine.model_spec import ByteTokenizer, materialize, resolve, tokenizer_for
from kmesh_lib.engine.vllm_engine import make_engine
from kmesh_lib.kv.capture import BlockPoolCapture, drain_check
from kmesh_lib.sections.tot_headroom import arms
from kmesh_lib.sections.tot_headroom.generator import InvocationBlockLog, capture_record, engine_generator
from kmesh_lib.sections.tot_headroom.params import (
    BLOCK_EVENTS,
    CAPTURE,
    CLOCK_DOMAIN,
    OUTCOMES,
    TotHeadroomParams,
    bound_pool_sizes,
    data_relative,
    policy_label,
    read_manifest,
    scripted_policy,
    search_config,
    stock_pool_sizes,
)
from kmesh_lib.workloads import game24
from kmesh_lib.workloads.tot_search import SearchRun, TotSearch, encode


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
        want = read_manifest(cfg.MODEL_MANIFEST)
        wrong = sorted(f for f in set(want) | set(hashes) if want.get(f) != hashes.get(f))
        if wrong:
            raise ValueError(f"model files differ from MODEL_MANIFEST={cfg.MODEL_MANIFEST!r}: {wrong[:5]}")
    return hashes


def input_hashes(cfg: TotHeadroomParams) -> dict[str, str]:
    """Every input by content hash; the puzzle file under its path relative to the data root."""
    csv_path = game24.repo_path(cfg.PUZZLES_CSV)
    inputs = {f"puzzles:{data_relative(csv_path)}": sha256_file(csv_path)}
    inputs.update({f"model:{name}": digest for name, digest in check_model_files(cfg).items()})
    return inputs


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
    """The engine run, then the replay arms; ``raw/`` is written as each group and arm finishes.

    results.json gets only what the live run alone knew (the arms' wall-clock seconds, the search's
    ``tables.LIVE_SEARCH`` fields) and the input hashes; every table is ``record.save_tables(section.TABLES)``'s,
    built from raw/."""

    engine_run = run_engine(cfg, record)
    t0 = time.monotonic()
    arms.run_arms(cfg, record, engine_run.records)
    record.save("arms_s", round(time.monotonic() - t0, 1))
    return engine_run


def run_engine(cfg: TotHeadroomParams, record) -> TotRun:
    """Hashes the inputs, runs the search on the profile's engine and writes raw/ as it goes."""

    t_start = time.monotonic()  # the run ceiling counts the engine start too
    record.save("inputs", input_hashes(cfg))  # hashed before the engine allocates its first block
    puzzles = game24.load_puzzles(cfg.PUZZLES_CSV, cfg.PUZZLE_INDICES)
    scripted = cfg.POLICY == "scripted"
    engine = make_engine(cfg, forcing_outputs=scripted)
    tokenizer = tokenizer_for(engine.spec)
    capture = BlockPoolCapture(engine.block_pool)
    log = InvocationBlockLog(engine, capture)
    engine_info = {"name": "vllm", "version": environment()["packages"].get("vllm", "unknown"), "mode": engine.mode,
                   "device": cfg.DEVICE, "block_size": cfg.BLOCK_SIZE, "num_gpu_blocks": cfg.NUM_GPU_BLOCKS,
                   "model": engine.spec.name}
    records: list[dict] = []

    def on_group(invocations) -> None:
        recs = [capture_record(inv, run_id=record.run_dir.name, engine_info=engine_info, clock_domain=CLOCK_DOMAIN,
                               block_events=log.events_for(inv.call.invocation_id), policy=cfg.POLICY,
                               scheduling=log.scheduling_for(inv.call.invocation_id)) for inv in invocations]
        record.append_jsonl(CAPTURE, recs)
        records.extend(recs)

    scfg = search_config(cfg)
    outputs = scripted_policy(cfg, tokenizer).token_ids if scripted else None
    t0 = time.monotonic()
    try:
        search = TotSearch(engine_generator(engine, scfg, on_step=capture.mark_step, outputs=outputs), tokenizer, scfg,
                           on_group=on_group).run(puzzles, started_at=t_start)
    finally:
        search_s = time.monotonic() - t0
        drain = drain_check(engine.block_pool)
        log.close()
        capture.close()
        record.append_jsonl(BLOCK_EVENTS, capture.to_records())
        engine.close()
    record.append_jsonl(OUTCOMES, [o.to_dict() for o in search.outcomes])
    out = TotRun(search, records, engine.start_s, search_s, drain.ok, str(drain), log.num_unattributed, capture.counts())
    record.save("search", live_summary(out))
    return out


def live_summary(run: TotRun) -> dict:
    """What only the live search knew (``tables.LIVE_SEARCH``): the limit it met, its wall-clock times and
    the live pool's drain report; the rest of the ``search`` table is built from raw/."""
    return {"partial": run.search.partial, "limit_hit": run.search.limit_hit,
            "engine_start_s": round(run.engine_start_s, 1), "search_s": round(run.search_s, 1),
            "drain_ok": run.drain_ok}


# Seconds per decode step of a group (it decodes until its longest output, up to MAX_TOKENS), by device and shape.
# cpu: measured here with other jobs on the 2 cores (tiny 0.08; the 0.5B shape 1.3 alone, 2.6 for 8 requests);
# cuda: the published H200 run of section 19 (7B shape, dummy weights: 3 calls of 192 tokens in 16.8 s).
DECODE_STEP_S = {("cpu", "tiny"): 0.08, ("cpu", "qwen2.5-0.5b"): 2.0, ("cuda", "qwen2.5-0.5b"): 0.012,
                 ("cuda", "qwen2.5-7b"): 0.03}
ENGINE_START_S = {"cpu": 45, "cuda": 60}  # import, weights, profiling (7B dummy: 14 s after import on the H200)
REPLAY_S_PER_CALL = 0.016  # one replay-engine call (scheduler + KV-cache manager, no forward pass), measured here
CALLS_PER_PUZZLE = 15  # scripted search at the default rates, BREADTH 2: 16 on puzzles 0-2, 14 on 0-19
NOTEBOOK_S = 60  # kernel start, bounds, checks (the scale traces re-derived), plots


def plan(cfg: TotHeadroomParams) -> dict:
    """What ``kmesh plan 19`` prints; starts no engine."""

    spec = resolve(cfg.MODEL)
    tok = ByteTokenizer(spec.config["vocab_size"]) if spec.is_synthetic else tokenizer_for(spec)
    puzzles = game24.load_puzzles(cfg.PUZZLES_CSV, cfg.PUZZLE_INDICES)
    question = game24.propose_question(game24.root_state(puzzles[0].numbers))
    root = len(encode(tok, game24.FEWSHOT)) + len(encode(tok, question))
    usable = cfg.NUM_GPU_BLOCKS - 1
    kv_mib = spec.kv_bytes_per_token(cfg.DTYPE) * cfg.BLOCK_SIZE * usable / (1 << 20)
    num_groups = len(puzzles) * 6  # per BFS step: one proposal group, one value group
    step_s = DECODE_STEP_S.get((cfg.DEVICE, cfg.MODEL))
    engine_s = step_s * cfg.MAX_TOKENS * num_groups if step_s else None
    num_scale_calls = CALLS_PER_PUZZLE * cfg.NUM_SCALE_PUZZLES * len(cfg.SCRIPT_ERROR_RATES)
    replay_s = REPLAY_S_PER_CALL * (CALLS_PER_PUZZLE * len(puzzles) + num_scale_calls) * len(stock_pool_sizes(cfg))
    scripted = cfg.POLICY == "scripted"
    seconds = ENGINE_START_S[cfg.DEVICE] + engine_s + replay_s + NOTEBOOK_S if engine_s is not None and scripted else None
    return {
        "policy": policy_label(cfg) + (": outputs forced, every call prefilled and decoded by the engine"
                                       if scripted else ""),
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
        "stock vLLM observed at (usable blocks)": f"{stock_pool_sizes(cfg)} (replay engine; the run's own pool on the "
                                                  f"{cfg.ENGINE} engine too)",
        "LRU and ideal at (usable blocks)": bound_pool_sizes(cfg),
        "scale traces": (f"puzzles 0..{cfg.NUM_SCALE_PUZZLES - 1}, scripted, error rates {cfg.SCRIPT_ERROR_RATES}, "
                         f"replay engine" if cfg.NUM_SCALE_PUZZLES else "none"),
        "expected duration": (f"~{(ENGINE_START_S[cfg.DEVICE] + engine_s + replay_s + NOTEBOOK_S) / 60:.0f} min: "
                              f"engine start ~{ENGINE_START_S[cfg.DEVICE]} s + search ~{engine_s / 60:.1f} min "
                              f"({num_groups:.0f} groups of up to {cfg.MAX_TOKENS} decode steps at ~{step_s} s) + "
                              f"replay arms ~{replay_s / 60:.1f} min (~{num_scale_calls} scale calls x "
                              f"{len(stock_pool_sizes(cfg))} pool sizes) + notebook ~{NOTEBOOK_S} s"
                              if engine_s is not None and scripted
                              else "not measured for this shape and device"
                              + ("; with random or dummy weights nothing parses: one proposal call per puzzle"
                                 if not scripted and spec.is_synthetic else "")),
        costs.GPU_TIME: costs.gpu_time(cfg.DEVICE, None if seconds is None else costs.Span(seconds, seconds),
                                       why="no decode-step time measured for this shape and device"),
    }
