"""The host-staged GPU buffer as an external tier: what a section uses to add it as an arm.

    tier = GpuBufferTier(buffer_mib=1024, disk_dir=runtime.subdir("gpubuf"))
    engine = make_engine(params, **tier.llm_kwargs(params.DEVICE))   # vLLM loads HostStagedGpuBuffer
    tier.set_saving(True); run_group(engine, [context + [5]])        # the context -> the disk tier
    tier.drop_memory_copy()                                          # disk only (like LMCache's store)
    tier.set_retention(True)                                         # retain: a restore keeps its copy
    tier.prefetch(context).wait()                                    # early arm: disk -> buffer now
    run_group(engine, followups); tier.take_restores()               # one timeline per restore

Route (recorded by ``describe()``): disk tier -> pinned host chunks (O_DIRECT) -> the GPU buffer,
ONE allocation outside vLLM's block pool -> vLLM's blocks (device to device). It is host-staged:
the original study's DMA-BUF route reads the SSD straight into GPU memory, which needs cuFile/GDS
(``kv.direct_storage``); where that is available it is the route to use, and this tier says so in
its topology, but it does not implement it.

The tier offers what ``lmcache.connect``'s tiers offer, so arms written for them run on it:
``llm_kwargs``, ``set_retention``, ``memory_bytes``, ``drop_memory_copy``, ``settle``, ``meter``
(snapshots with the same field names), ``disk_dir``, ``start``, ``close``; and its connector has
``force_skip_save``, the save switch ``lmcache.probes.ExternalSwitch`` flips.

Invariant: the buffer never holds more than its capacity (``BufferIndex``); ``memory_bytes`` is the
bytes of copies a lookup can hit, ``meter`` counts every byte read from or written to the disk tier.
"""
from __future__ import annotations

import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kmesh_lib.kv import id_pack
from kmesh_lib.kv.direct_storage import direct_storage_status
from kmesh_lib.kv.gpu_buffer_index import ABSENT, PREFETCHING, RESIDENT, BufferFull
from kmesh_lib.kv.tier_snapshot import TierSnapshot, process_io

MIB = 1 << 20
CONNECTOR = "HostStagedGpuBuffer"
CONNECTOR_MODULE = "kmesh_lib.kv.gpu_buffer_connector"
LAUNCH_AT = ("step_start", "forward")  # where the worker queues a step's restores (``GpuBufferConfig.launch_at``)
WAIT_AT = ("forward", "layer")  # what the forward pass waits for (``GpuBufferConfig.wait_at``)
LAYER_GROUP_GROWTH = 4  # layer groups of 1, 4, 16, ... layers (``gpu_buffer_arena.layer_groups``)
_ns = time.monotonic_ns


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r}: one of {', '.join(choices)}")


def check_layer_group_growth(growth: int) -> None:
    if growth < 2:
        raise ValueError(f"layer_group_growth={growth}: at least 2")


def entry_path(disk_dir: str | Path, entry_id: int) -> Path:
    return Path(disk_dir) / f"entry-{entry_id}.kv"


@dataclass(frozen=True)
class GpuBufferConfig:
    """What both connector roles read from ``kv_connector_extra_config`` (keys ``kmesh.*``)."""

    tier_id: str
    buffer_bytes: int
    disk_dir: str
    chunk_bytes: int = 16 * MIB
    retain: bool = True
    saving: bool = True
    launch_at: str = "step_start"  # where restores are queued: "step_start" or "forward" (the connector's docstring)
    wait_at: str = "forward"  # the whole copy before the forward pass, or each layer group before its layers
    layer_group_growth: int = LAYER_GROUP_GROWTH  # with layer waits: how fast the copy's layer groups grow
    copy_graphs: bool = True  # queue each restore's copy as one replay of a captured CUDA graph (``kv.copy_graph``)

    def extra(self) -> dict:
        return {f"kmesh.{k}": v for k, v in self.__dict__.items()}

    @classmethod
    def from_extra(cls, extra: dict) -> GpuBufferConfig:
        fields = {k.removeprefix("kmesh."): v for k, v in (extra or {}).items() if k.startswith("kmesh.")}
        missing = {"tier_id", "buffer_bytes", "disk_dir"} - set(fields)
        if missing:
            raise ValueError(f"HostStagedGpuBuffer: kv_connector_extra_config lacks kmesh.{', kmesh.'.join(sorted(missing))}")
        return cls(**fields)


@dataclass
class _Shared:
    """The two connector halves of one tier in this process, found by ``tier_id``."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    scheduler: object = None
    worker: object = None


_SHARED: dict[str, _Shared] = {}


def shared_state(tier_id: str) -> _Shared:
    return _SHARED.setdefault(tier_id, _Shared())


class GpuBufferMeter:
    def __init__(self, tier: GpuBufferTier) -> None:
        self.tier = tier

    def snapshot(self) -> TierSnapshot:
        worker = self.tier.shared.worker
        c = dict(worker.arena.counters) if worker is not None and worker.arena is not None else {}
        device, calls, written = process_io()
        disk = sum(p.stat().st_size for p in Path(self.tier.disk_dir).glob("entry-*.kv"))
        return TierSnapshot(c.get("read_bytes", 0), c.get("reads", 0), c.get("write_bytes", 0), c.get("write_errors", 0),
                            device, self.tier.memory_bytes(), disk, c.get("staged_bytes", 0), c.get("restored_bytes", 0),
                            calls, device_write_bytes=written)


@dataclass
class Prefetch:
    """One ``prefetch`` call: ``status`` is ``started``, ``resident`` (nothing to do), ``miss`` (no entry
    holds a prefix of the tokens) or ``buffer_full``; ``wait()`` returns once the copy is resident."""

    status: str
    entry_id: int | None = None
    num_blocks: int = 0
    t_submit_ns: int = field(default_factory=_ns)
    t_ready_ns: int | None = None
    error: str | None = None
    timeline: object = None
    done: threading.Event = field(default_factory=threading.Event)

    def wait(self, timeout_s: float = 120.0) -> Prefetch:
        if not self.done.wait(timeout_s):
            raise TimeoutError(f"prefetch of entry {self.entry_id} not done after {timeout_s:.0f} s")
        if self.error:
            raise RuntimeError(f"prefetch of entry {self.entry_id} failed: {self.error}")
        return self

    def record(self) -> dict:
        rec = {"status": self.status, "entry_id": self.entry_id, "num_blocks": self.num_blocks,
               "t_submit_ns": self.t_submit_ns, "t_ready_ns": self.t_ready_ns, "error": self.error}
        if self.timeline is not None:
            rec["timeline"] = self.timeline.record()
        return rec


class GpuBufferTier:
    """The host-staged GPU buffer tier (``HostStagedGpuBuffer``) and its controls.

    Args:
        buffer_mib: the buffer's capacity (one GPU allocation, outside vLLM's pool and budget).
        disk_dir: the disk tier's directory (one O_DIRECT file per context); ``close`` empties it.
        chunk_mib: bytes per O_DIRECT read/write and per host-to-device copy.
        retain: a restore keeps the buffer's copy (True) or frees it after loading vLLM (False).
        saving: whether prompts are saved to the disk tier from the start (``set_saving`` switches it).
        launch_at, wait_at, layer_group_growth, copy_graphs: ``GpuBufferConfig``'s.
    """

    path = "gpubuf"
    connector = CONNECTOR
    lookup = "on_demand"  # a lookup only checks; a restore loads just the blocks vLLM lacks
    data_start = "disk tier (one O_DIRECT file per context)"
    route = ("host staging: disk -> pinned host chunks -> GPU buffer (one allocation outside vLLM's block pool) "
             "-> vLLM blocks, device to device")

    def __init__(self, buffer_mib: int, disk_dir: str | Path, chunk_mib: int = 16, retain: bool = True,
                 saving: bool = True, launch_at: str = "step_start", wait_at: str = "forward",
                 layer_group_growth: int = LAYER_GROUP_GROWTH, copy_graphs: bool = True) -> None:
        if buffer_mib <= 0:
            raise ValueError(f"buffer_mib={buffer_mib}: the GPU buffer needs a positive size")
        _check_choice("launch_at", launch_at, LAUNCH_AT)
        _check_choice("wait_at", wait_at, WAIT_AT)
        check_layer_group_growth(layer_group_growth)
        self.disk_dir = Path(disk_dir)
        self.config = GpuBufferConfig(f"gpubuf-{secrets.token_hex(4)}", buffer_mib * MIB, str(self.disk_dir),
                                      chunk_mib * MIB, retain, saving, launch_at, wait_at, layer_group_growth,
                                      copy_graphs)
        self.shared = shared_state(self.config.tier_id)
        self.meter = GpuBufferMeter(self)
        self._executor: ThreadPoolExecutor | None = None
        self._prefetches: list[Prefetch] = []
        self._stream = None

    # -- engine wiring --
    def start(self) -> GpuBufferTier:
        self.disk_dir.mkdir(parents=True, exist_ok=True)
        return self

    def llm_kwargs(self, device: str) -> dict:
        from vllm.config import KVTransferConfig

        self.start()
        return {"kv_transfer_config": KVTransferConfig(
            kv_connector=CONNECTOR, kv_connector_module_path=CONNECTOR_MODULE, kv_role="kv_both",
            kv_connector_extra_config=self.config.extra())}

    @property
    def scheduler_side(self):
        if self.shared.scheduler is None:
            raise RuntimeError("no HostStagedGpuBuffer scheduler side: was the engine built with tier.llm_kwargs()?")
        return self.shared.scheduler

    @property
    def index(self):
        return self.scheduler_side.index

    @property
    def worker(self):
        if self.shared.worker is None:
            raise RuntimeError("no HostStagedGpuBuffer worker side (in-process engine only)")
        return self.shared.worker

    @property
    def arena(self):
        worker = self.shared.worker
        if worker is None or worker.arena is None:
            raise RuntimeError("no HostStagedGpuBuffer worker side with registered KV caches (in-process engine only)")
        return worker.arena

    def describe(self) -> dict:
        """The tier's route and capacity, and whether the direct-storage (GDS) route exists here."""
        out = {"tier": self.path, "connector": f"{CONNECTOR_MODULE}.{CONNECTOR}", "route": self.route,
               "buffer_bytes": self.config.buffer_bytes, "chunk_bytes": self.config.chunk_bytes,
               "launch_at": self.config.launch_at, "wait_at": self.config.wait_at,
               "layer_group_growth": self.config.layer_group_growth,
               "direct_storage": direct_storage_status(self.disk_dir)}
        out["route_used"] = "host-staged"
        if self.shared.scheduler is not None:
            out.update(bytes_per_block=self.index.bytes_per_block, num_buffer_blocks=self.index.num_buffer_blocks,
                       ids_packed_by=id_pack.pack_via())  # by the scheduler side, unless handed to the launch thread
        if self.shared.worker is not None and self.shared.worker.arena is not None:
            a = self.shared.worker.arena
            out.update(device=str(a.device), buffer_allocation_bytes=a.buffer.numel(), num_planes=len(a.planes),
                       layer_group_sizes=[end - start for start, end in a.layer_groups],
                       copy_word_bytes=a.word_bytes, blocks_per_chunk=a.blocks_per_chunk,
                       copy_route=a.copy_route)  # "fused" (one Triton launch) or "torch (<why>)"
            if a.scatter is not None:
                out["copy_launch"] = a.scatter.launch_route  # "handle" (Triton's compiled kernel) or "jit (<why>)"
            out["copy_graphs"] = a.graph_route  # "on", or "off (<why>)": restores then take the launch route
            if a.graphs is not None:
                out["copy_graph_sizes"] = a.graphs.describe()
        return out

    # -- switches --
    def set_retention(self, retain: bool) -> None:
        with self.shared.lock:
            self.index.retain = retain

    def set_wait_at(self, wait_at: str) -> None:
        """What the forward pass waits for from the next step on (``GpuBufferConfig.wait_at``); the
        configured value stays in ``describe()``, each restore records its own (``RestoreTimeline``)."""
        _check_choice("wait_at", wait_at, WAIT_AT)
        self.worker.wait_at = wait_at

    def start_launch_thread(self, spin_s: float | None = None, min_delay_s: float | None = None) -> str:
        """The native launch thread (``kv.launch_thread``), started on first use (``CopyGraphs.start_thread``: call
        between steps), with its spin after a launch (``spin_s``) and the least delay from a request to its launch
        (``min_delay_s``, ``LaunchThread.set_min_delay``) set where given (None: as they are). Which copies it
        launches is ``set_launch_thread``'s. Returns its state in words ("on (...)" or "off (why)")."""
        arena = self.worker.arena
        graphs = arena.graphs if arena is not None else None
        if graphs is None:
            return f"off (no copy graphs: {arena.graph_route if arena is not None else 'no arena'})"
        if graphs.start_thread():
            if spin_s is not None:
                graphs.thread.set_spin(spin_s)
            if min_delay_s is not None:
                graphs.thread.set_min_delay(min_delay_s)
        return graphs.thread_via

    def set_launch_thread(self, on: bool) -> None:
        """From the next step on, copies waited for layer by layer (``wait_at`` "layer") on the graph route have
        their graph launched by the native launch thread (started here on first use: ``start_launch_thread``),
        else by the engine thread; each restore records which (``RestoreTimeline.launched_by``). Without a
        thread, ``on`` launches stay on the engine thread."""
        if on:
            self.start_launch_thread()
        self.worker.handoff = on and self.has_launch_thread

    def set_thread_packs_ids(self, on: bool) -> None:
        """From the next step on, whether the launch thread packs the block ids of the copies handed to it (where it
        has a packer: ``HostStagedGpuBuffer.ids_to_thread``; the default) or the scheduler side packs them first, as
        before 9176ce6: the two on one engine, for an A/B on one host (``bench_gpubuf_restore_parts.py --ids-by``)."""
        self.worker.thread_packs_ids = on

    @property
    def has_launch_thread(self) -> bool:
        """Whether a launch thread runs here (``start_launch_thread``)."""
        worker = self.shared.worker
        graphs = worker.arena.graphs if worker is not None and worker.arena is not None else None
        return graphs is not None and graphs.thread is not None

    def launch_thread_cpu_s(self) -> float | None:
        """The launch thread's CPU time so far (``LaunchThread.cpu_seconds``); None without one."""
        return self.arena.graphs.thread.cpu_seconds() if self.has_launch_thread else None

    def time_forward_steps(self, on: bool) -> None:
        """Times every forward pass from the next step on (``take_forward_steps``); off by default: two
        events per step."""
        self.worker.time_forward = on
        self.worker.forward_steps.clear()

    def take_forward_steps(self) -> list[dict]:
        """Forward passes timed since the last call, oldest first: ``t_start_ns`` (the host reached its first
        attention layer), ``forward_s`` (from there to its end on the GPU; host stamps on the CPU build) and
        ``queue_s`` (the host's time from there to ``wait_for_save``, the whole pass queued; host stamps on both
        builds, so on the CPU build it equals ``forward_s``). On CUDA, ``queue_s`` as long as ``forward_s`` says the
        GPU pass was waiting on the host (launch-bound). ``to_first_layer_s``: the host's seconds from the step's
        ``bind_connector_metadata`` (where vLLM starts a step's synchronous loads, ``start_load_kv`` next; a step
        without loads is stamped at the same point) to that first layer, the host path a restored step and its
        resident partner share but for the restore's part in it; None where the step bound no metadata of its own
        before the pass."""
        worker = self.shared.worker
        if worker is None:
            return []
        steps, worker.forward_steps = worker.forward_steps, []
        out = []
        for t_bound_ns, t_start_ns, start, t_end_ns, end in steps:
            if isinstance(end, int):
                seconds = (end - start) / 1e9
            else:
                end.synchronize()
                seconds = start.elapsed_time(end) / 1e3
            out.append({"t_start_ns": t_start_ns, "forward_s": seconds, "queue_s": (t_end_ns - t_start_ns) / 1e9,
                        "to_first_layer_s": None if t_bound_ns is None else (t_start_ns - t_bound_ns) / 1e9})
        return out

    def take_reference(self) -> None:
        """Puts the next step's restores on the clock by a reference taken now (``BufferArena.keep_reference``:
        the device synchronized, no step running), so that step takes none (``measure`` 0, ``reference_at``
        "before_step"). Call between requests, then ``reference_drift`` after the request. No-op on CPU."""
        self.arena.keep_reference()

    def reference_drift(self) -> dict | None:
        """``BufferArena.reference_drift``: the host's clock against the GPU's since ``take_reference``
        (``interval_ms``, ``drift_us``); None where none was taken (CPU)."""
        return self.arena.reference_drift()

    def set_loading(self, on: bool) -> None:
        self.scheduler_side.loading = on

    def set_saving(self, on: bool) -> None:
        self.scheduler_side.force_skip_save = not on

    # -- state --
    def memory_bytes(self) -> int:
        with self.shared.lock:
            return self.index.resident_bytes()

    def buffer_state(self) -> dict:
        """Bytes resident, allocated (with pending frees) and capacity; the entries' states."""
        with self.shared.lock:
            ix = self.index
            return {"resident_bytes": ix.resident_bytes(), "allocated_bytes": ix.allocated_bytes(),
                    "pending_free_bytes": ix.num_pending_free_blocks * ix.bytes_per_block,
                    "capacity_bytes": ix.capacity_bytes(), "num_entries": len(ix.entries),
                    "states": {str(e.entry_id): e.state for e in ix.entries.values()}, **ix.stats}

    def drop_memory_copy(self) -> None:
        """Frees every copy in the buffer; the contexts stay on the disk tier. Call between groups."""
        self.settle()
        with self.shared.lock:
            self.index.drop_copies()
            if self.index.resident_bytes():
                raise RuntimeError(f"{self.index.resident_bytes()} bytes still resident after dropping every copy")

    def settle(self, timeout_s: float = 60.0) -> None:
        """Waits for every prefetch, then releases extents awaiting release (no step may be running)."""
        for p in list(self._prefetches):
            p.done.wait(timeout_s)
        self._prefetches = [p for p in self._prefetches if not p.done.is_set()]
        if self._prefetches:
            raise TimeoutError(f"{len(self._prefetches)} prefetches still running after {timeout_s:.0f} s")
        with self.shared.lock:
            self.index.release_pending()

    # -- prefetch (section 20's early arm) --
    def prefetch(self, token_ids) -> Prefetch:
        """Starts reading the stored context that is the longest prefix of ``token_ids`` into the buffer.

        Returns at once; lookups of that context answer "later" until the copy is resident, then hit
        the buffer. A context already in the buffer is ``resident`` (done at once).
        """
        with self.shared.lock:
            entry = self.index.find_by_tokens(token_ids)
            if entry is None:
                p = Prefetch("miss")
                p.done.set()
                return p
            if entry.state != ABSENT:
                p = Prefetch("resident" if entry.state == RESIDENT else entry.state, entry.entry_id, entry.num_blocks)
                if entry.state == PREFETCHING:
                    self._prefetches.append(p)  # done when the running one is
                    self._join(p, entry.entry_id)
                else:
                    p.t_ready_ns = _ns()
                    p.done.set()
                return p
            try:
                extent = self.index.allocate(entry, PREFETCHING)
            except BufferFull as e:
                p = Prefetch("buffer_full", entry.entry_id, entry.num_blocks, error=str(e))
                p.done.set()
                return p
        arena = self.arena
        p = Prefetch("started", entry.entry_id, entry.num_blocks)
        after = arena.event()  # the side stream starts after every copy queued on vLLM's stream so far
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kmesh-prefetch")
        self._prefetches.append(p)
        self._executor.submit(self._run_prefetch, p, entry.entry_id, entry.num_blocks, extent, after)
        return p

    def _join(self, p: Prefetch, entry_id: int) -> None:
        def waiter():
            running = [q for q in self._prefetches if q.entry_id == entry_id and q.status == "started"]
            for q in running:
                q.done.wait()
            p.t_ready_ns = _ns()
            p.done.set()

        threading.Thread(target=waiter, daemon=True).start()

    def _run_prefetch(self, p: Prefetch, entry_id: int, num_blocks: int, extent: int, after) -> None:
        from kmesh_lib.kv.restore_timeline import RestoreTimeline

        arena = self.arena
        stream = None
        if arena.is_cuda:
            import torch

            if self._stream is None:
                self._stream = torch.cuda.Stream(device=arena.device)
            stream = self._stream
            stream.wait_event(after)
            if arena.last_read_event is not None:
                stream.wait_event(arena.last_read_event)
        tl = RestoreTimeline("prefetch", None, entry_id, "disk", num_blocks, num_blocks * arena.bytes_per_block,
                             str(arena.device), t_start_ns=_ns(), ref=arena.reference(stream))
        ok = False
        try:
            arena.stage(entry_id, num_blocks, extent, tl, stream=stream)
            if stream is not None:
                stream.synchronize()
            tl.t_launched_ns = _ns()
            ok = True
        except Exception as e:  # noqa: BLE001 - reported on the handle; the extent is freed
            p.error = f"{type(e).__name__}: {e}"
        with self.shared.lock:
            entry = self.index.entries.get(entry_id)
            if entry is not None:
                entry.state = RESIDENT if ok else entry.state
                if not ok:
                    self.index.free_copy(entry)
        p.timeline = tl
        p.t_ready_ns = _ns()
        p.done.set()

    # -- records --
    def take_restores(self) -> list[dict]:
        """Every restore's timeline since the last call (``kv.restore_timeline``), oldest first."""
        worker = self.shared.worker
        if worker is None:
            return []
        return [t.record() for t in worker.records()]

    def close(self) -> None:
        worker = self.shared.worker
        if worker is not None and worker.arena is not None and worker.arena.graphs is not None:
            worker.arena.graphs.close()  # the launch thread: joined after its queued launches
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for path in Path(self.disk_dir).glob("entry-*.kv"):
            path.unlink(missing_ok=True)
        _SHARED.pop(self.config.tier_id, None)
