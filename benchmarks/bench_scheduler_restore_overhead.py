"""What vLLM's scheduler spends on a restore beyond the copy: a prefix found in its own cache vs one a
connector brings (issue 13).

    .venv/bin/python benchmarks/bench_scheduler_restore_overhead.py [--contexts 4096 16384 32512] [--out FILE]

vLLM's real v1 ``Scheduler`` and ``KVCacheManager`` (the replay engine: no forward pass, so what is timed
is the scheduler's Python) run one follow-up request, a PREFIX_TOKENS prefix + SUFFIX_TOKENS fresh tokens,
one output token, in each case:

    resident   the prefix is in vLLM's prefix cache (a local hit: ~prefix/16 blocks found and touched)
    external   a connector reports the prefix as ``num_external_computed_tokens`` (a synchronous load,
               as kmesh's GPU buffer does): that many new blocks allocated and cached at allocation
    miss       nowhere: the whole prompt is scheduled for prefill (same allocation, no connector)

Per case, medians over REPEATS (after WARMUPS) of wall ms: ``request`` (``Request`` built: every block
hashed, the same in every case), ``schedule`` and ``update`` (the step that admits the request and the
one ``update_from_output`` after it, which finishes it and frees its blocks), and inside ``schedule``
the KV-cache calls that walk blocks one by one (``get_computed_blocks``, ``allocate_slots``; the block
pool's ``touch``, ``get_new_blocks``, ``cache_full_blocks``; ``free_blocks`` inside ``update``) and the
connector's scheduler-side calls. The connector here is a stub (it answers from the request id and
keeps the block ids, as kmesh's connector does), so its own lookup costs are not in these figures.

Before each external and miss repeat the prefix cache is reset, so new blocks come from a clean pool
(a full pool would add vLLM's eviction of cached blocks). Prints figures; asserts no timing, only that
each case got the hit it stands for.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))  # vLLM imports the stub connector below by this module's name

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorMetadata,
)

CONTEXTS = (4096, 16_384, 32_512)
BLOCK_SIZE = 16
SUFFIX_TOKENS = 16
WARMUPS, REPEATS = 3, 20
MODEL = "qwen2.5-0.5b"  # the scheduler's work does not depend on the shape, only on blocks
CASES = ("resident", "external", "miss")


class RestoreStub(KVConnectorBase_V1):
    """Scheduler side only: a request named ``ext-<N>-...`` has its first N tokens in the connector."""

    def __init__(self, vllm_config, role, kv_cache_config=None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.block_ids: dict[str, list[int]] = {}

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        if not request.request_id.startswith("ext-"):
            return 0, False
        return max(0, int(request.request_id.split("-")[1]) - num_computed_tokens), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        if num_external_tokens > 0:  # what a real connector needs for its load: the block ids
            first = request.num_computed_tokens // BLOCK_SIZE
            self.block_ids[request.request_id] = list(blocks.get_block_ids()[0][first:])

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        self.block_ids.clear()
        return KVConnectorMetadata()

    def request_finished(self, request, block_ids):
        return False, None

    # worker side: never runs (the replay engine has no model runner)
    def start_load_kv(self, forward_context, **kwargs) -> None: ...
    def wait_for_layer_load(self, layer_name: str) -> None: ...
    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None: ...
    def wait_for_save(self) -> None: ...


class Timers:
    """Wraps bound methods of live objects (instance attributes win over the class's), summing ms."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, obj, name: str, label: str) -> None:
        fn = getattr(obj, name, None)
        if fn is None:
            return  # not in this vLLM version

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ms[label] += (time.perf_counter() - t0) * 1e3
                self.calls[label] += 1
        setattr(obj, name, timed)

    def take(self) -> dict[str, float]:
        out = dict(self.ms)
        self.ms.clear()
        self.calls.clear()
        return out


def make_engine(max_context: int):
    from vllm.config import KVTransferConfig

    from kmesh_lib.engine.config import EngineParams
    from kmesh_lib.engine.replay import ReplayEngine

    max_len = max_context + SUFFIX_TOKENS + 16
    num_blocks = 2 * (-(-max_len // BLOCK_SIZE)) + 1  # the prefix and one request beside it; block 0 is null
    params = EngineParams(ENGINE="replay", MODEL=MODEL, DTYPE="bfloat16", BLOCK_SIZE=BLOCK_SIZE,
                          NUM_GPU_BLOCKS=num_blocks, MAX_MODEL_LEN=max_len, MAX_NUM_BATCHED_TOKENS=max_len)
    ktc = KVTransferConfig(kv_connector="RestoreStub", kv_connector_module_path=Path(__file__).stem,
                           kv_role="kv_both")
    engine = ReplayEngine(params, kv_transfer_config=ktc)
    timers = Timers()
    sched = engine.scheduler
    timers.wrap(sched, "schedule", "schedule")
    timers.wrap(sched, "update_from_output", "update")
    kvm = sched.kv_cache_manager
    timers.wrap(kvm, "get_computed_blocks", "get_computed_blocks")
    timers.wrap(kvm, "allocate_slots", "allocate_slots")
    pool = kvm.block_pool
    for name in ("touch", "get_new_blocks", "cache_full_blocks", "free_blocks"):
        timers.wrap(pool, name, f"pool.{name}")
    connector = sched.get_kv_connector() if hasattr(sched, "get_kv_connector") else sched.connector
    for name in ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta"):
        timers.wrap(connector, name, f"connector.{name}")
    return engine, timers


def run_one(engine, timers, rid: str, prompt: list[int]) -> tuple[dict, int | None]:
    """Submits one request and steps until it finishes: (ms per timer, tokens vLLM found cached)."""
    from kmesh_lib.engine.requests import RequestSpec

    timers.take()
    t0 = time.perf_counter()
    engine.submit(RequestSpec(rid, prompt, max_tokens=1))
    request_ms = (time.perf_counter() - t0) * 1e3
    num_cached, done = None, False
    while not done:
        for out in engine.step():
            if out.request_id == rid and out.finished:
                done, num_cached = True, out.num_cached_tokens
    return {"request": request_ms, **timers.take()}, num_cached


def measure(engine, timers, context_tokens: int, warmups: int, repeats: int) -> list[dict]:
    rng = random.Random(context_tokens)
    vocab = engine.vocab_size

    def tokens(n):
        return [rng.randrange(4, vocab) for _ in range(n)]

    prefix = tokens(context_tokens)
    rows = []
    for case in CASES:
        samples, cached = [], []
        engine.reset_prefix_cache()
        if case == "resident":
            run_one(engine, timers, f"warm-{context_tokens}", prefix + tokens(SUFFIX_TOKENS))
        for k in range(warmups + repeats):
            if case != "resident":
                engine.reset_prefix_cache()
            rid = f"ext-{context_tokens}-{k}" if case == "external" else f"{case}-{context_tokens}-{k}"
            figures, num_cached = run_one(engine, timers, rid, prefix + tokens(SUFFIX_TOKENS))
            if k >= warmups:
                samples.append(figures)
                cached.append(num_cached)
        keys = sorted({key for s in samples for key in s})
        med = {key: statistics.median(s.get(key, 0.0) for s in samples) for key in keys}
        rows.append({"context_tokens": context_tokens, "case": case, "num_prefix_blocks": context_tokens // BLOCK_SIZE,
                     "num_cached_tokens": cached[0], "repeats": repeats, "median_ms": med})
    return rows


COLUMNS = ("request", "schedule", "get_computed_blocks", "allocate_slots", "pool.touch", "pool.get_new_blocks",
           "pool.cache_full_blocks", "connector.update_state_after_alloc", "update", "pool.free_blocks")


def table(rows: list[dict]) -> str:
    short = {"get_computed_blocks": "get_comp", "allocate_slots": "alloc", "pool.touch": "touch",
             "pool.get_new_blocks": "new_blks", "pool.cache_full_blocks": "cache", "pool.free_blocks": "free",
             "connector.update_state_after_alloc": "conn.upd"}
    head = f"{'tokens':>6} {'case':<9} {'cached':>6} " + " ".join(f"{short.get(c, c):>9}" for c in COLUMNS)
    lines = [head, "-" * len(head)]
    for r in rows:
        m = r["median_ms"]
        lines.append(f"{r['context_tokens']:>6} {r['case']:<9} {r['num_cached_tokens'] or 0:>6} "
                     + " ".join(f"{m.get(c, 0.0):>9.3f}" for c in COLUMNS))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", nargs="+", type=int, default=list(CONTEXTS))
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    import vllm

    t0 = time.perf_counter()
    engine, timers = make_engine(max(args.contexts))
    print(f"scheduler restore overhead: vllm {vllm.__version__}, replay engine ({MODEL} shape, "
          f"block {BLOCK_SIZE}, {engine.params.NUM_GPU_BLOCKS} blocks), medians of {args.repeats}, ms", flush=True)
    rows = []
    for n in args.contexts:
        rows += measure(engine, timers, n, WARMUPS, args.repeats)
    engine.close()
    for r in rows:  # each case must be what it says, or its figures mean something else
        want = 0 if r["case"] == "miss" else r["context_tokens"]
        if (r["num_cached_tokens"] or 0) != want:
            print(f"WARNING: {r['case']} at {r['context_tokens']} tokens found {r['num_cached_tokens']} cached, "
                  f"expected {want}")
    print(table(rows))
    by = {(r["context_tokens"], r["case"]): r["median_ms"] for r in rows}
    for n in args.contexts:
        res, ext = by[(n, "resident")], by[(n, "external")]
        extra = ext["schedule"] + ext.get("update", 0) - res["schedule"] - res.get("update", 0)
        print(f"{n} tokens: external - resident = {extra:+.3f} ms (schedule + update)")
    print(f"took {time.perf_counter() - t0:.1f} s")
    if args.out:
        args.out.write_text(json.dumps({"vllm": vllm.__version__, "rows": rows}, indent=1))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
