"""Section 00: does the engine share a prefix, and does the block pool drain afterwards?

Two requests share ``CONTEXT_TOKENS`` tokens. The second must hit the prefix cache for every full
block of the shared prefix it may reuse (vLLM recomputes the last prompt token, so the hit is
capped at ``floor((P - 1) / B) * B`` for a P-token prompt), on the real engine and on the replay
engine, and after both finish the pool must be whole again (the drain check).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from kmesh_lib.engine import costs
from kmesh_lib.engine.model_spec import resolve
from kmesh_lib.engine.requests import RequestResult, RequestSpec, run_group
from kmesh_lib.kv.capture import BlockPoolCapture, drain_check
from kmesh_lib.sections.engine_check.checks import expected_prefix_hit
from kmesh_lib.sections.engine_check.params import EngineCheckParams


def random_tokens(rng: random.Random, n: int, vocab_size: int) -> list[int]:
    """Token ids in [4, vocab) so no special id (pad, bos, eos, unk) appears in a prompt."""
    return [rng.randrange(4, vocab_size) for _ in range(n)]


def shared_prefix_pair(cfg: EngineCheckParams, vocab_size: int) -> list[RequestSpec]:
    rng = random.Random(cfg.SEED)
    prefix = random_tokens(rng, cfg.CONTEXT_TOKENS, vocab_size)
    return [RequestSpec(name, prefix + random_tokens(rng, cfg.SUFFIX_TOKENS, vocab_size), max_tokens=cfg.MAX_TOKENS)
            for name in ("first", "second")]


@dataclass
class EngineCheckRun:
    engine_mode: str
    block_size: int
    results: list[RequestResult]
    capture: BlockPoolCapture
    drain_ok: bool
    drain_text: str
    start_s: float

    @property
    def arm(self) -> str:
        return f"{self.engine_mode}-B{self.block_size}"

    def raw_requests(self) -> list[dict]:
        return [{"arm": self.arm, "request_id": r.request_id, "prompt_token_ids": r.prompt_token_ids,
                 "output_token_ids": r.output_token_ids, "logprobs": r.logprobs, "num_cached_tokens": r.num_cached_tokens,
                 "t_submit_ns": r.t_submit_ns, "t_token_ns": r.t_token_ns, "finish_reason": r.finish_reason}
                for r in self.results]


def run_pair(engine, cfg: EngineCheckParams, block_size: int) -> EngineCheckRun:
    """Sends the two requests one after the other with a capture on the engine's block pool."""
    specs = shared_prefix_pair(cfg, engine.spec.config["vocab_size"])
    capture = BlockPoolCapture(engine.block_pool)
    results = []
    for spec in specs:  # sequential: the second must find the first's blocks cached
        results += run_group(engine, [spec], on_step=capture.mark_step)
    report = drain_check(engine.block_pool)
    capture.close()
    return EngineCheckRun(engine.mode, block_size, results, capture, report.ok, str(report), engine.start_s)


def expected_duration(cfg: EngineCheckParams) -> tuple[costs.Span, str]:
    """Engine start, two requests on the real engine, the replay engine: from the sizes and ``engine.costs``."""
    device = "cuda" if cfg.DEVICE == "cuda" else "cpu"
    prefill, note = costs.prefill_s(device, cfg.MODEL, 2 * (cfg.CONTEXT_TOKENS + cfg.SUFFIX_TOKENS))
    decode, _ = costs.decode_s(device, cfg.MODEL, 2 * cfg.MAX_TOKENS)
    start = costs.ENGINE_START_S[device] if cfg.ENGINE == "real" else costs.REPLAY_START_S
    return costs.NOTEBOOK_S + start + prefill + decode + costs.REPLAY_START_S, note


def plan(cfg: EngineCheckParams) -> dict:
    """What ``kmesh plan 00`` prints: no engine is started."""

    spec = resolve(cfg.MODEL)
    prompt = cfg.CONTEXT_TOKENS + cfg.SUFFIX_TOKENS
    duration, note = expected_duration(cfg)
    return {
        "arms": f"real vLLM on {cfg.DEVICE} ({spec.name}, {cfg.WEIGHTS} weights, {cfg.DTYPE}); replay engine (no forward pass)",
        "real engine": f"BLOCK_SIZE={cfg.BLOCK_SIZE}, NUM_GPU_BLOCKS={cfg.NUM_GPU_BLOCKS} (null block included)",
        "replay engine": f"BLOCK_SIZE={cfg.REPLAY_BLOCK_SIZE}, NUM_GPU_BLOCKS={cfg.REPLAY_NUM_GPU_BLOCKS}",
        "requests": f"2 sequential, {prompt} prompt tokens each ({cfg.CONTEXT_TOKENS} shared), {cfg.MAX_TOKENS} output tokens",
        "expected cache hit of the second": f"{expected_prefix_hit(prompt, cfg.CONTEXT_TOKENS, cfg.BLOCK_SIZE)} tokens (real), "
                                            f"{expected_prefix_hit(prompt, cfg.CONTEXT_TOKENS, cfg.REPLAY_BLOCK_SIZE)} (replay)",
        "expected duration": f"{duration}" + (f"; {note}" if note else ""),
        costs.GPU_TIME: costs.gpu_time(cfg.DEVICE, duration),
    }


def record_run(record, run: EngineCheckRun) -> dict:
    """Writes the arm's requests and block events to ``raw/``, and saves what only the live run knew
    (``checks.LIVE``: the engine's start time, the live drain report) under the arm's name, where
    ``record.save_tables(section.TABLES)`` keeps them beside the table it builds from raw/."""
    record.append_jsonl("requests.jsonl", run.raw_requests())
    record.append_jsonl("block_events.jsonl", [{"arm": run.arm, **e} for e in run.capture.to_records()])
    return record.save(run.arm, {"start_s": round(run.start_s, 2), "drain_ok": run.drain_ok})
