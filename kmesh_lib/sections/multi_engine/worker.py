"""One vLLM engine in its own process, driven over a socket by the router (``router.py``) through
its handle (``engine_process.EngineProcess``).

    router process                                   engine process (this module's ``main``)
    EngineProcess.start()   -- spawn, own session -->  import vllm; send "imported"
    EngineProcess.build()   -- "build" ------------->  VllmEngine(...) with KV events (and the
                                                       LMCache MP connector when a server is given);
                            <-- "ready" -------------  pool size, start time, listeners
    EngineProcess.submit()  -- "submit" ------------>  engine.add_request
                            <-- "step" --------------  per step: new tokens (stamped with
                                                       time.monotonic_ns when the step returned),
                                                       finished requests with their cached-token
                                                       split, and the KV events of the step
    EngineProcess.drain()   -- "drain" ------------->  step until the scheduler holds no request
    EngineProcess.reset()   -- "reset" ------------->  drain, reset the prefix cache
    EngineProcess.stop()    -- "stop" -------------->  close the engine, os._exit(0)

Invariants:
    - every token stamp is ``time.monotonic_ns()`` (CLOCK_MONOTONIC, one clock for every process on
      the host), so the router compares them with its own arrival stamps;
    - the KV events are vLLM's own (``KVCacheManager.take_events``, the batches its ZMQ publisher
      would send), handed over the socket instead of a TCP publisher, so the engine opens no port;
    - a request's cached tokens split into the part vLLM's pool held (``num_local_cached_tokens``:
      what the scheduler passed to the connector's lookup) and the part the LMCache server
      supplied (``num_external_tokens``: what the lookup answered), taken at the lookup that got the
      request scheduled.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from multiprocessing.connection import Connection

STEP_IDLE_S = 0.001  # a step that produced nothing (a load in flight): wait this long for a command


class EventCollector:
    """Stands in for vLLM's KV event publisher: keeps the batches until the worker sends them."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def publish(self, batch) -> None:
        for e in batch.events:
            kind = type(e).__name__
            medium = getattr(e, "medium", None)
            if medium not in (None, "GPU"):  # a connector's own tier, not this engine's pool
                continue
            if kind == "BlockStored":
                self.events.append({"type": "stored", "block_hashes": list(e.block_hashes),
                                    "parent_block_hash": e.parent_block_hash, "token_ids": list(e.token_ids),
                                    "block_size": e.block_size})
            elif kind == "BlockRemoved":
                self.events.append({"type": "removed", "block_hashes": list(e.block_hashes)})
            elif kind == "AllBlocksCleared":
                self.events.append({"type": "cleared"})

    def take(self) -> list[dict]:
        out, self.events = self.events, []
        return out

    def shutdown(self) -> None:
        pass


def external_id(request_id: str) -> str:
    """The router's request id: vLLM's engine core appends ``-<8 hex>`` to the id it was given."""
    head, _, tail = request_id.rpartition("-")
    return head if head and len(tail) == 8 and all(c in "0123456789abcdef" for c in tail) else request_id


def _engine_class():
    from kmesh_lib.engine.vllm_engine import VllmEngine

    class RoutedEngine(VllmEngine):
        """VllmEngine whose requests can skip reading the prefix cache (the recompute control)."""

        def submit_routed(self, request_id: str, prompt: list[int], max_tokens: int, skip_prefix_cache: bool) -> None:
            from vllm import SamplingParams
            from vllm.inputs import TokensPrompt

            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=0, ignore_eos=True,
                                    detokenize=False, skip_reading_prefix_cache=skip_prefix_cache)
            self._seen[request_id] = 0
            self._engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(prompt)), params)

    return RoutedEngine


def _llm_kwargs(spec: dict, memory_share: float) -> dict:
    from vllm.config import KVEventsConfig, KVTransferConfig

    from kmesh_lib.engine.model_spec import resolve
    from kmesh_lib.lmcache.connect import apply_vllm_cpu_workarounds, keep_engine_rendezvous_local

    params = spec["engine"]
    kwargs: dict = {"kv_events_config": KVEventsConfig(enable_kv_cache_events=True, publisher="null")}
    if spec.get("server") is not None:
        if params["DEVICE"] == "cpu":
            apply_vllm_cpu_workarounds()
        kwargs["kv_transfer_config"] = KVTransferConfig(kv_connector="LMCacheMPConnector", kv_role="kv_both",
                                                        kv_connector_extra_config=spec["server"])
    if params["DEVICE"] == "cuda":
        import torch

        keep_engine_rendezvous_local()
        free, total = torch.cuda.mem_get_info()
        pool = resolve(params["MODEL"]).kv_bytes_per_token(params["DTYPE"]) * params["BLOCK_SIZE"] * params["NUM_GPU_BLOCKS"]
        # The pool is NUM_GPU_BLOCKS (kv_cache_memory_bytes); gpu_memory_utilization only has to pass
        # vLLM's start-up check (free >= utilization x total), so each engine asks for its share of
        # what is free now.
        kwargs["kv_cache_memory_bytes"] = int(pool * 1.02)
        kwargs["gpu_memory_utilization"] = round(0.9 * free * memory_share / total, 4)
    return kwargs


def serve(conn: Connection, spec: dict) -> None:
    import vllm  # noqa: F401 - the slow import, done before "imported" so engines import in parallel

    from kmesh_lib.base.params import build
    from kmesh_lib.base.processes import listening_sockets
    from kmesh_lib.engine.config import EngineParams

    threads = spec.get("threads")
    if threads:
        import torch

        torch.set_num_threads(threads)
    conn.send({"op": "imported", "pid": os.getpid()})
    msg = conn.recv()
    if msg.get("op") != "build":
        return
    params = build(EngineParams, spec["engine"])
    engine = _engine_class()(params, **_llm_kwargs(spec, msg["memory_share"]))
    scheduler = engine.scheduler
    collector = EventCollector()
    scheduler.kv_event_publisher = collector
    engine.kv_cache_manager.take_events()  # the warm-up's events and its reset are not the trace's
    lookups: dict[str, tuple[int, int]] = {}
    connector = getattr(scheduler, "connector", None)
    if connector is not None:
        original = connector.get_num_new_matched_tokens

        def get_num_new_matched_tokens(request, num_computed_tokens):
            out = original(request, num_computed_tokens)
            if out is not None and out[0] is not None:
                lookups[external_id(request.request_id)] = (int(num_computed_tokens), int(out[0]))
            return out

        connector.get_num_new_matched_tokens = get_num_new_matched_tokens
    pool = engine.block_pool
    conn.send({"op": "ready", "pid": os.getpid(), "start_s": engine.start_s, "num_gpu_blocks": params.NUM_GPU_BLOCKS,
               "free_blocks": pool.get_num_free_blocks(), "connector": type(connector).__name__ if connector else None,
               "listeners": [f"{a}:{p}" for a, p in listening_sockets(pids=[os.getpid()])],
               "threads": threads})
    idle = False
    while True:
        if conn.poll(0 if engine.has_unfinished() and not idle else
                     STEP_IDLE_S if scheduler.has_requests() else 0.5):
            while True:
                msg = conn.recv()
                op = msg["op"]
                if op == "submit":
                    engine.submit_routed(msg["request_id"], msg["prompt_token_ids"], msg["max_tokens"],
                                         msg["skip_prefix_cache"])
                    conn.send({"op": "submitted", "request_id": msg["request_id"], "t_ns": time.monotonic_ns()})
                elif op == "reset":
                    ok = engine.reset_prefix_cache()
                    engine.kv_cache_manager.take_events()  # AllBlocksCleared: the router resets its index itself
                    lookups.clear()
                    conn.send({"op": "reset", "ok": ok, "free_blocks": pool.get_num_free_blocks(),
                               "cached_blocks": len(pool.cached_block_hash_to_block)})
                elif op == "drain":
                    engine.drain()
                    conn.send({"op": "drained", "requests_left": scheduler.has_requests()})
                elif op == "stop":
                    engine.close()
                    conn.send({"op": "stopped"})
                    return
                if not conn.poll(0):
                    break
        if not (engine.has_unfinished() or scheduler.has_requests()):
            continue
        outputs = engine.step()
        stamp = time.monotonic_ns()
        events = collector.take()
        idle = not outputs and not events
        if idle:
            continue
        rows = []
        for out in outputs:
            row = {"request_id": out.request_id, "new_token_ids": out.new_token_ids,
                   "new_logprobs": out.new_logprobs, "finished": out.finished, "num_cached_tokens": out.num_cached_tokens}
            if out.finished:
                row["finish_reason"] = out.finish_reason
                local_ext = lookups.pop(out.request_id, None)
                if connector is None:  # no server: every cached token came from this engine's pool
                    local_ext = (out.num_cached_tokens, 0)
                row["lookup"] = list(local_ext) if local_ext is not None else None
            rows.append(row)
        conn.send({"op": "step", "t_ns": stamp, "outputs": rows, "events": events})


def main(argv: list[str]) -> None:
    conn = Connection(int(argv[0]))
    spec = json.loads(argv[1])
    status = 0
    try:
        serve(conn, spec)
    except Exception:  # noqa: BLE001 - reported to the router, then the process exits
        status = 1
        text = traceback.format_exc()
        print(text, file=sys.stderr)
        try:
            conn.send({"op": "error", "text": text.strip().splitlines()[-1] + "\n" + text[-3000:]})
        except OSError:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # LMCache leaves non-daemon threads behind


if __name__ == "__main__":
    main(sys.argv[1:])
