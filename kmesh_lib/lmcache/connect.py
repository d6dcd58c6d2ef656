"""How vLLM reaches LMCache: one ``Tier`` per path, with the harness-side workarounds.

    path    connector            where LMCache runs          data route into the engine                          a lookup
    mp      LMCacheMPConnector   ``lmcache server`` process  disk (fs, O_DIRECT) -> L1 DRAM arena -> engine KV      prefetches
    inproc  LMCacheConnectorV1   inside the vLLM process     disk (LocalDiskBackend, O_DIRECT) -> LocalCPU -> GPU   checks only

Both are host staging: the bytes pass through DRAM on their way from the disk tier to the engine.
A tier offers the same few operations to the protocol: ``llm_kwargs()`` for ``vllm.LLM``,
``set_retention(retain)``, ``set_singleflight(on)`` (and, MP only, ``set_warm_store_guard(on)``:
``lmcache.server_plugin``'s guard), ``drop_memory_copy()`` (the context back to
disk-only), ``settle()`` (no LMCache I/O in flight), ``meter`` (``lmcache.disk_accounting``),
``lookups(a, b, roles)`` (what each lookup between two snapshots did, ``lmcache.lookups``),
``describe()`` (row labels), ``close()``.

Availability: the in-process connector needs a GPU connector for the device; LMCache 0.5.6's
``CreateGPUConnector`` has none for CPU (it raises, and vLLM runs in degraded recompute mode), so
the path is reported as not available there rather than run. Neither LMCache version installed
here has an external tier in GPU memory (MP L1 types are DRAM, DEVDAX and GDS, an NVMe slab).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from kmesh_lib.base.processes import RuntimeDir
from kmesh_lib.engine.vllm_engine import apply_vllm_cpu_workarounds
from kmesh_lib.lmcache.disk_accounting import DiskReadHook, InprocMeter, ServerMeter, Snapshot
from kmesh_lib.lmcache.lookups import Lookup, phase_lookups, store_events, store_reservations
from kmesh_lib.lmcache.server import LMCacheServer, ServerConfig, ServerStartError, transfer_mode_for


class TierError(RuntimeError):
    """The external cache is not in the state the protocol needs (reported, never timed)."""


def keep_engine_rendezvous_local() -> None:
    """Single-process vLLM: rendezvous through a file store, so torch opens no listening socket.

    NOTE: vLLM 0.26 (the GPU machine) starts its one-process torch.distributed group with
    ``tcp://<host ip>:<port>``; torch's TCPStore server then listens on every interface ([::]),
    which this section's "nothing listens beyond 127.0.0.1" forbids. vLLM 0.32's
    ``UniProcExecutor._distributed_args`` already uses ``get_file_store_init_method()`` for this
    case; this back-ports that choice (a ``tcp://`` method becomes a ``file://`` store).
    """
    import tempfile
    import uuid

    from vllm.v1.executor import uniproc_executor

    cls = uniproc_executor.UniProcExecutor
    if getattr(cls._distributed_args, "_kmesh_patched", False):
        return
    original = cls._distributed_args

    def _distributed_args(self):
        method, rank, local_rank = original(self)
        if method.startswith("tcp://"):
            method = f"file://{tempfile.gettempdir()}/vllm_dist_{uuid.uuid4().hex}"
        return method, rank, local_rank

    _distributed_args._kmesh_patched = True
    cls._distributed_args = _distributed_args


def inproc_support(device: str) -> tuple[bool, str]:
    """Whether the installed LMCache has an in-process GPU connector for ``device``."""
    if device == "cuda":
        return True, "LMCacheConnectorV1 with LMCache's CUDA GPU connector"
    return False, (f"LMCache's in-process connector has no {device} GPU connector (CreateGPUConnector handles "
                   "cuda, xpu, musa and hpu only; vLLM would run in degraded recompute mode)")


def gpu_tier_support() -> tuple[bool, str]:
    """Whether the installed LMCache has an external tier in GPU memory."""
    try:
        from lmcache.v1.distributed.api import L1BackendType

        kinds = [k.name for k in L1BackendType]
    except Exception:  # noqa: BLE001 - an older LMCache without the MP storage API
        kinds = []
    gpu = [k for k in kinds if any(w in k.upper() for w in ("GPU", "CUDA", "HBM", "DEVICE"))]
    if gpu:
        return True, f"L1 backend types {gpu}"
    return False, (f"no external tier in GPU memory in this LMCache (MP L1 types: {', '.join(kinds) or 'none'}; "
                   "GDS is an NVMe slab; the in-process backends stage in host memory)")


def wait_until(predicate, timeout_s: float, what: str, poll_s: float = 0.02) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TierError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


class MPTier:
    """LMCacheMPConnector and a real ``lmcache server`` (L1 DRAM arena + fs disk tier).

    ``server_mode``: ``launcher`` (one server runs both arms through kmesh's retention switch; byte
    hook, lookup trace, singleflight and warm-store guard available) or ``stock`` (the console script
    with a fixed ``--l2-prefetch-policy``: ``stock_retain`` picks ``retain`` or ``default``; one server
    per arm). The server starts with the singleflight and the warm-store guard off (stock LMCache's
    behaviour); ``start`` writes this tier's settings, the ``set_*`` methods change them later.
    ``server_log``: where the server's log is kept when it stops (``LMCacheServer``'s ``keep_log``).
    """

    path = "mp"
    connector = "LMCacheMPConnector"
    # A lookup is a prefetch: it loads every chunk the arena lacks from the disk tier into L1,
    # whether or not vLLM already holds those tokens (the scheduler-side lookup of the MP connector).
    lookup = "prefetch"
    data_start = "disk tier (lmcache fs adapter, O_DIRECT)"
    route = "host staging: disk -> L1 DRAM arena -> engine KV"

    def __init__(self, arena_mib: int, chunk_size: int, runtime: RuntimeDir | None = None, device: str = "cpu",
                 server_mode: str = "launcher", stock_retain: bool = False, singleflight: bool = False,
                 server_log: Path | None = None) -> None:
        if singleflight and server_mode != "launcher":
            raise TierError("singleflight needs server_mode='launcher' (the hook lives in the server process)")
        self.runtime = runtime or RuntimeDir.create("retention-mp")
        self.device = device
        self.server = LMCacheServer(ServerConfig(arena_mib=arena_mib, chunk_size=chunk_size, mode=server_mode,
                                                 stock_retain=stock_retain, transfer_mode=transfer_mode_for(device)),
                                    self.runtime, keep_log=server_log)
        self.singleflight = singleflight
        self.warm_store_guard = False
        self.meter: ServerMeter | None = None

    @property
    def disk_dir(self) -> Path:
        return self.server.disk_dir

    def begin(self) -> MPTier:
        """Spawns the server without waiting for it (``start`` waits): its boot overlaps other work."""
        try:
            self.server.begin()
        except (ServerStartError, OSError) as e:
            raise TierError(f"lmcache server did not spawn: {e}") from e
        return self

    def start(self) -> MPTier:
        try:
            self.server.start()
        except ServerStartError as e:
            raise TierError(str(e)) from e
        self.server.set_singleflight(self.singleflight)
        self.server.set_warm_store_guard(self.warm_store_guard)
        self.meter = ServerMeter(self.server)
        return self

    def describe(self) -> dict:
        """Row labels: how retention is switched, whether the singleflight and the warm-store guard are
        on, which counts exist, and the hooks' install report (launcher servers)."""
        return {"server_mode": self.server.cfg.mode, "retention_mechanism": self.server.retention_mechanism,
                "singleflight": self.singleflight, "warm_store_guard": self.warm_store_guard,
                "transfer_mode": self.server.cfg.transfer_mode,
                "byte_counts": sorted(k for k, v in (self.meter.available if self.meter else {}).items() if v),
                "hooks": self.server.plugin_info()}

    def set_warm_store_guard(self, on: bool) -> None:
        """The warm-store guard's word (``server_plugin.WarmStoreGuard``): before ``start`` it is what
        ``start`` writes; after, it is written at once (read at every WARM prefetch's finish)."""
        if on and self.server.cfg.mode != "launcher":
            raise TierError("the warm-store guard needs server_mode='launcher' (the hook lives in the server process)")
        self.warm_store_guard = on
        if self.meter is not None:
            self.server.set_warm_store_guard(on)

    def set_singleflight(self, on: bool) -> None:
        try:
            self.server.set_singleflight(on)
        except ServerStartError as e:
            raise TierError(str(e)) from e
        self.singleflight = on

    def lookups(self, a: Snapshot, b: Snapshot, roles: dict[str, str]) -> list[Lookup]:
        """The lookups between two snapshots, classified (``lmcache.lookups``); [] for a stock server."""
        return phase_lookups(self.meter.trace_between(a, b), roles)

    def store_events(self, a: Snapshot, b: Snapshot) -> dict[str, int]:
        """Chunks per store-side event between two snapshots (``lookups.store_events``)."""
        return store_events(self.meter.trace_between(a, b))

    def store_diagnostics(self, a: Snapshot, settled: Snapshot, b: Snapshot) -> dict:
        """What tells one store's outcomes apart, from snapshots taken before it, once its I/O settled (the memory
        copy still there) and after the copy was dropped: the L1 arena's bytes in use at each and in all; LMCache's
        own counts over the store (chunks whose L1 write finished, L1 allocation and read failures, L2 stores
        submitted and finished); the store path's L1 reservations (``lookups.store_reservations``: reserved, or
        left out and why) and the store controller's steps (``lookups.store_events``), both empty for a stock
        server; and the free bytes of ``/dev/shm``, where the arena's segment lives."""
        import shutil

        def delta(key: str) -> int | None:
            return int(b.metrics[key] - a.metrics.get(key, 0)) if key in b.metrics else None

        trace = self.meter.trace_between(a, b)
        try:
            shm_free = shutil.disk_usage("/dev/shm").free
        except OSError:  # no /dev/shm on this machine
            shm_free = None
        return {"l1_bytes_before": a.memory_tier_bytes, "l1_bytes_settled": settled.memory_tier_bytes,
                "l1_bytes_after": b.memory_tier_bytes, "arena_bytes": self.server.l1_usage()[1],
                "store_metrics": {k: delta(k) for k in ("l1_write_chunks", "l1_allocation_failures", "l1_read_failures",
                                                        "l2_store_submitted_chunks", "l2_stored_chunks")},
                "store_reservations": store_reservations(trace), "store_events": store_events(trace),
                "shm_free_bytes": shm_free}

    def llm_kwargs(self, device: str) -> dict:
        from vllm.config import KVTransferConfig

        if device == "cpu":
            apply_vllm_cpu_workarounds()
        return {"kv_transfer_config": KVTransferConfig(kv_connector=self.connector, kv_role="kv_both",
                                                       kv_connector_extra_config=self.server.connector_extra_config())}

    def set_retention(self, retain: bool) -> None:
        try:
            self.server.set_retention(retain)
        except ServerStartError as e:
            raise TierError(str(e)) from e

    def memory_bytes(self) -> int:
        return self.server.l1_usage()[0]

    def drop_memory_copy(self, timeout_s: float = 30.0) -> None:
        """The L1 arena empty, the disk tier's copy kept. ``/cache/clear`` (not forced) skips an object
        with a lock on it and never comes back for it, and an engine's release of its read lock reaches
        the server after the request has finished (``ContextGroupRun.wait_for_drop``). So the queues
        drain first and the clear is sent again until the arena is empty: one clear with a wait behind
        it failed CI at 98ba043 (section 20's smoke run, 30 s, the arena never emptied).

        NOTE: LMCache 0.5.3's ``/cache/clear`` always forces (``http_apis/cache_api.py`` ``clear_cache``:
        ``force`` "accepted ... but not honored"; ``ManagementModule.clear`` calls ``clear(force=True)``): it
        frees write- and read-locked objects too. Right after a store, ``settle`` can pass before the store
        controller has the store's chunks (``settle`` says why), and a clear then frees them before their L2
        write: the store writes nothing. After a store, ``wait_for_store`` first."""
        self.settle(timeout_s)

        def cleared() -> bool:
            self.server.clear_l1()
            return self.memory_bytes() == 0

        wait_until(cleared, timeout_s, "the L1 arena to empty after /cache/clear", poll_s=0.05)

    def wait_for_store(self, timeout_s: float = 120.0) -> bool:
        """Whether every chunk a store put in the L1 arena reached the disk tier within ``timeout_s``, from an arena
        that was empty before the store (``RestoreBench.store`` drops the memory copy first). Under ``--l2-store-policy
        skip_l1`` the store controller deletes a chunk from L1 only once its L2 write finished
        (``StoreController._finalize_store``: ``select_l1_deletions`` on success), so the arena emptying by itself,
        with no clear sent, is that; a chunk whose L2 write failed stays, and the wait ends False.

        ``settle`` alone is not enough: the server's status counts the store listener's queue and the L2 tasks in
        flight, not a store whose chunks are copied but not yet committed to L1 (0.5.3 LMCache-driven transfer:
        ``finish_write`` runs on the ``DeviceHostFuncDispatcher`` thread, polled every 5 ms, after the copies' event
        the engine waits on has fired) nor keys the store loop popped and has not yet submitted
        (``_status_in_flight_count`` counts a task only once submitted). A clear in that window freed the chunks
        before their L2 write: on the H100 (6 Dec 2026, 0.5.3, 7B) whole stores wrote 0 bytes. Section 20's store
        (``ContextGroupRun.store_context``) waits for the bytes on the disk tier for the same reason (H200: 1 of 16
        chunks written when ``settle`` returned)."""
        if self.server.cfg.store_policy != "skip_l1":
            raise TierError(f"wait_for_store needs --l2-store-policy skip_l1 (this server: {self.server.cfg.store_policy})")
        try:
            wait_until(lambda: self.memory_bytes() == 0, timeout_s,
                       "the store's chunks to reach the disk tier (skip_l1 empties the L1 arena)", poll_s=0.02)
        except TierError:
            return False
        self.settle(timeout_s)
        return True

    def settle(self, timeout_s: float = 30.0) -> None:
        """No prefetch or L2 store the server's status counts in flight. NOTE: a store whose chunks are not yet
        committed to L1, or whose keys the store loop popped but has not yet submitted, is not counted
        (``wait_for_store`` says why and waits for it)."""
        def idle() -> bool:
            sm = self.server.status()["storage_manager"]
            pc, sc = sm["prefetch_controller"], sm["store_controller"]
            return (pc["in_flight_request_count"] == 0 and pc["pending_queue_size"] == 0
                    and pc["submission_queue_size"] == 0 and pc.get("kmesh_parked_count", 0) == 0
                    and sc["pending_keys_count"] == 0 and sc["in_flight_task_count"] == 0)

        wait_until(idle, timeout_s, "the lmcache server's prefetch and store queues to drain", poll_s=0.05)

    def close(self) -> None:
        self.server.stop()


class InprocTier:
    """LMCacheConnectorV1: LMCache inside the vLLM process, LocalCPUBackend + LocalDiskBackend.

    Retention is LocalCPUBackend's hot cache, switched at run time with ``set_hot_cache`` (the
    ``local_cpu`` setting, live): on, a chunk read from disk for a retrieve stays in host memory
    (``StorageManager.batched_get`` writes it back); off, it is a staging buffer only.
    """

    path = "inproc"
    connector = "LMCacheConnectorV1"
    # A lookup only checks (and pins); a retrieve loads just the tokens vLLM lacks
    # (``get_num_new_matched_tokens`` returns hits - vLLM's computed tokens), so a follow-up whose
    # context is in vLLM's prefix cache reads nothing from the disk tier in either arm.
    lookup = "on_demand"
    data_start = "disk tier (LMCache LocalDiskBackend, O_DIRECT)"
    route = "host staging: disk -> LocalCPU buffer -> engine KV"

    def __init__(self, arena_mib: int, chunk_size: int, disk_mib: int, runtime: RuntimeDir | None = None) -> None:
        self.runtime = runtime or RuntimeDir.create("retention-inproc")
        self.disk_dir = self.runtime.subdir("disk")
        self.hook = DiskReadHook()
        self.config_file = self.runtime.path / "lmcache.yaml"
        self.config_file.write_text(
            f"chunk_size: {chunk_size}\nlocal_cpu: true\nmax_local_cpu_size: {arena_mib / 1024:.6f}\n"
            f"local_disk: \"file://{self.disk_dir}/\"\nmax_local_disk_size: {disk_mib / 1024:.6f}\n"
            "save_unfull_chunk: false\nenable_async_loading: false\nextra_config:\n  use_odirect: true\n")
        self.meter = InprocMeter(self.hook, self.disk_dir, self.memory_bytes)

    def start(self) -> InprocTier:
        self.hook.install()
        os.environ["LMCACHE_CONFIG_FILE"] = str(self.config_file)
        return self

    def llm_kwargs(self, device: str) -> dict:
        from vllm.config import KVTransferConfig

        return {"kv_transfer_config": KVTransferConfig(kv_connector=self.connector, kv_role="kv_both")}

    def engine(self):
        from lmcache.integration.vllm.utils import ENGINE_NAME
        from lmcache.v1.cache_engine import LMCacheEngineBuilder

        engine = LMCacheEngineBuilder.get(ENGINE_NAME)
        if engine is None:
            raise TierError("no in-process LMCache engine: did the connector start (see the vLLM log)?")
        return engine

    def _backend(self, name: str):
        return self.engine().storage_manager.storage_backends.get(name)

    def set_retention(self, retain: bool) -> None:
        self.engine().set_hot_cache(retain)

    def set_singleflight(self, on: bool) -> None:
        """In-process LMCache has no server to hold a lookup back: only ``off`` exists here."""
        if on:
            raise TierError("singleflight is a hook in the lmcache server (MP path); the in-process connector has none")

    def describe(self) -> dict:
        return {"server_mode": None, "retention_mechanism": "LocalCPUBackend hot cache (set_hot_cache), in-process",
                "singleflight": False, "transfer_mode": None,
                "byte_counts": sorted(k for k, v in self.meter.available.items() if v)}

    def memory_bytes(self) -> int:
        cpu = self._backend("LocalCPUBackend") if self._engine_ready() else None
        if cpu is None:
            return 0
        with cpu.cpu_lock:
            return sum(len(obj.byte_array) for obj in cpu.hot_cache.values())

    def _engine_ready(self) -> bool:
        try:
            self.engine()
            return True
        except (TierError, ImportError):
            return False

    def drop_memory_copy(self, timeout_s: float = 10.0) -> None:
        """LocalCPUBackend empty, the disk tier's copy kept. Its ``clear`` skips an object that cannot be evicted
        yet (pinned by a lookup, or being written), as the server's does: it is sent again until none is left."""
        engine = self.engine()

        def cleared() -> bool:
            engine.clear(locations=["LocalCPUBackend"])
            return self.memory_bytes() == 0

        wait_until(cleared, timeout_s, "LocalCPUBackend to empty", poll_s=0.05)

    def settle(self, timeout_s: float = 30.0) -> None:
        disk = self._backend("LocalDiskBackend")
        if disk is None:
            raise TierError("LocalDiskBackend missing: max_local_disk_size must be > 0")
        wait_until(lambda: not disk.disk_worker.put_tasks, timeout_s, "LocalDiskBackend writes to finish")

    def close(self) -> None:
        os.environ.pop("LMCACHE_CONFIG_FILE", None)
        self.runtime.close()
