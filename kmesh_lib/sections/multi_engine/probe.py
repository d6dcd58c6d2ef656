"""What a restore costs against a recompute and a local hit, on idle engines (section 21's question,
asked at this trace's context length and model, so the answer can use it).

After a fleet's traces, NUM_PROBES times, on drained, reset pools and a fresh family of the trace's
shape, one request at a time:

    fleet    step                                             what the child measures
    local    parent on engine 0; its child on engine 1,       recompute: every prompt token computed
             skipping the prefix cache
    local    the same child on engine 0                       local: the parent's blocks in the pool
    shared   parent on engine 0 (stored to the server);       restore: the parent's chunks loaded from
             its child on engine 1                            the server into engine 1's pool

Each child's first-token time runs from its submission to its first token, with nothing else in
the engines, so it is the request's own prefill (and load) time. Rows go to ``raw/probes.jsonl``.
"""
from __future__ import annotations

import random
import time

from kmesh_lib.engine.model_spec import resolve
from kmesh_lib.sections.multi_engine.params import kv_bytes_per_token
from kmesh_lib.sections.multi_engine.router import prompt_sha

STEPS = {"local": (("recompute", 1, True), ("local", 0, False)), "shared": (("restore", 1, False),)}


def run_one(engine, request_id: str, prompt: list[int], max_tokens: int, skip_prefix_cache: bool,
            timeout_s: float) -> dict:
    """Submits one request to an idle engine and reads its messages until it finished."""
    t0 = time.monotonic_ns()
    engine.submit(request_id, prompt, max_tokens, skip_prefix_cache)
    tokens, logprobs, stamps = [], [], []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg = engine.expect_any(max(0.1, deadline - time.monotonic()))
        for out in msg.get("outputs", []) if msg["op"] == "step" else []:
            if out["request_id"] != request_id:
                continue
            tokens += out["new_token_ids"]
            logprobs += out["new_logprobs"]
            stamps += [msg["t_ns"]] * len(out["new_token_ids"])
            if out["finished"]:
                local, external = out["lookup"] if out["lookup"] is not None else (None, None)
                return {"ttft_s": (stamps[0] - t0) / 1e9, "e2e_s": (stamps[-1] - t0) / 1e9, "output_token_ids": tokens,
                        "logprobs": logprobs, "num_cached_tokens": out["num_cached_tokens"],
                        "num_local_cached_tokens": local, "num_external_tokens": external}
    raise TimeoutError(f"probe request {request_id} unfinished after {timeout_s:.0f} s")


def probe(fleet, cfg, record, log=print, unit: str | None = None) -> list[dict]:
    """NUM_PROBES families through this fleet's probe steps; returns (and records) one row per child (tagged with
    the GPU driver's ``unit`` where one runs it)."""
    vocab = resolve(fleet.model).config["vocab_size"]
    live = [e for e in fleet.engines if e.alive()]
    if len(live) < 2 or cfg.NUM_PROBES == 0:
        return []
    rows = []
    for i in range(cfg.NUM_PROBES):
        fleet.reset()
        start = fleet.snapshot()
        rng = random.Random(f"multi-engine-probe-{cfg.SEED}-{i}")
        context = [rng.randrange(4, vocab) for _ in range(cfg.PARENT_TOKENS)]
        suffix = [rng.randrange(4, vocab) for _ in range(cfg.CHILD_SUFFIX_TOKENS)]
        timeout = cfg.TRACE_TIMEOUT_S
        parent = run_one(live[0], f"probe{i}-parent", context, cfg.MAX_TOKENS, False, timeout)
        child = context + parent["output_token_ids"] + suffix
        live[0].drain()  # the parent's store to the server completed (its blocks are freed only then) ...
        fleet.snapshot()  # ... and the server's own queues are empty before the child looks it up
        for kind, e, skip in STEPS[fleet.kind]:
            before = fleet.snapshot()
            row = run_one(live[e], f"probe{i}-{kind}", child, cfg.MAX_TOKENS, skip, timeout)
            after = fleet.snapshot()
            row.update(model=fleet.model, fleet=fleet.kind, probe=i, kind=kind, engine=live[e].index,
                       num_prompt_tokens=len(child), prompt_sha=prompt_sha(child), parent_ttft_s=parent["ttft_s"],
                       kv_bytes_per_token=kv_bytes_per_token(cfg, fleet.model),
                       server_start=start, server_before=before, server_after=after,
                       **({"unit": unit} if unit else {}))
            rows.append(row)
            log(f"{fleet.model} probe {i} {kind}: first token {1e3 * row['ttft_s']:.1f} ms, "
                f"{row['num_cached_tokens']} cached ({row['num_external_tokens']} from the server)")
    record.append_jsonl("probes.jsonl", rows)
    return rows
