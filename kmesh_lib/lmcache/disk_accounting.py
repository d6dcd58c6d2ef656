"""Disk-tier bytes per phase, counted two (or three) independent ways, and external-cache usage.

A meter takes ``snapshot()`` at phase boundaries; ``PhaseReads.between(a, b)`` is the phase.

    device   ``/proc/<pid>/io`` read_bytes of the process that reads the disk tier (the lmcache
             server in MP mode, this process in-process). With O_DIRECT every chunk read is a
             block-device read, so this is what the SSD served; page-cache hits would not show.
    hook     LMCache's own read function, wrapped: bytes it asked the file system for
             (``lmcache.server_plugin`` in MP mode, ``LocalDiskBackend.read_file`` in-process).
    metrics  LMCache's counters (MP: ``/metrics`` on the HTTP port): chunks loaded from L2,
             lookup hits in L1 and L2 tokens, allocation and prefetch failures.

Invariant checked per phase: device bytes == hook bytes (== metrics chunks x chunk bytes in MP
mode). MP mode: to the byte (the server process reads nothing but the disk tier; both snapshots
say ``exact``). In-process: to less than half a chunk, because LMCache reads whole chunks, so a
smaller difference can only be another read of the engine process (its own files: a JIT cache
entry, say). The phase's bytes are the hook's. ``read_proc_io`` (psutil's ``io_counters``)
returns None where the kernel does not expose per-process I/O accounting; the device count is
then reported as unavailable, not as 0.

Writes are recorded beside the reads, not checked: the hook's bytes written to the disk tier and
the device's ``write_bytes`` (which also counts the process's other writes: its logs). MP mode
also keeps the server's lookup and store traces (``server_plugin.LookupTrace``, ``StoreTrace``):
``ServerMeter`` snapshots carry the trace's position, and ``ServerMeter.trace_between(a, b)``
returns the phase's events (``lmcache.lookups``).
"""
from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

MIB = 1 << 20

# Prometheus names of the MP counters (OTel name + unit + _total), see lmcache/v1/mp_observability
METRIC_NAMES = {
    "l2_loaded_chunks": "lmcache_mp_l2_prefetch_load_completed_chunks_total",
    "lookup_hit_l1_tokens": "lmcache_mp_lookup_hit_l1_tokens_total",
    "lookup_hit_l2_tokens": "lmcache_mp_lookup_hit_l2_tokens_total",
    "l2_stored_chunks": "lmcache_mp_l2_store_completed_objects_chunks_total",
    "l1_allocation_failures": "lmcache_mp_l1_allocation_failure_chunks_total",
    "l2_usage_bytes": "lmcache_mp_l2_usage_bytes",
    "l1_write_chunks": "lmcache_mp_l1_write_chunks_total",  # chunks whose L1 write finished (stores and loads)
    "l1_read_failures": "lmcache_mp_l1_read_failure_chunks_total",  # reserve_read failures (a store's L2 copy too)
    "l2_store_submitted_chunks": "lmcache_mp_l2_store_submitted_objects_chunks_total",
}
VERSION_DEPENDENT_METRICS = ("lookup_hit_l1_tokens", "lookup_hit_l2_tokens")  # 0.5.6 only
# l2_prefetch_failure by reason: l1_oom (no arena space), l1_contended (another request's copy became
# resident first; the lookup falls back to that L1 copy), not_found (the disk tier lost the chunk)
PREFETCH_FAILURE = "lmcache_mp_l2_prefetch_failure_chunks_total"
FAILURE_REASONS = ("l1_oom", "l1_contended", "not_found")


def read_proc_io(pid: int | None = None) -> dict[str, int] | None:
    """``/proc/<pid>/io`` through psutil (read_bytes, read_count, ...; this process when None), or None."""
    import psutil

    try:
        io = (psutil.Process(pid) if pid is not None else psutil.Process()).io_counters()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, AttributeError, NotImplementedError):
        return None
    return io._asdict()


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name -> value summed over its label sets, plus ``name{reason}`` for samples with a ``reason`` label.

    Parsed with ``prometheus_client``'s text parser; NaN and infinite samples are left out.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if math.isnan(sample.value) or math.isinf(sample.value):
                continue
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
            reason = sample.labels.get("reason")
            if reason is not None:
                key = f"{sample.name}{{{reason}}}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


def dir_bytes(path: Path) -> int:
    """Bytes in the regular files under ``path`` (the disk tier's size as the file system sees it)."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file()) if Path(path).exists() else 0


@dataclass
class Snapshot:
    device_read_bytes: int | None = None
    device_read_calls: int | None = None
    hook_read_bytes: int | None = None  # None: no hook on this path
    hook_reads: int = 0
    hook_write_bytes: int = 0
    hook_write_errors: int = 0
    retention_decisions: dict = field(default_factory=dict)  # mode -> chunks decided (MP)
    metrics: dict = field(default_factory=dict)  # METRIC_NAMES key -> value (MP)
    memory_tier_bytes: int = 0  # LMCache's in-memory copy outside vLLM (L1 / LocalCPU hot cache)
    disk_tier_bytes: int = 0  # the disk tier's files
    exact: bool = False  # the device count reads nothing but the disk tier (the MP server): agree to the byte
    trace_index: int = 0  # MP: lookup-trace events seen so far (``ServerMeter.trace_between``)
    device_write_bytes: int | None = None


def wait_for_written(meter, before: Snapshot, nbytes: int, timeout_s: float, written=None, poll=None) -> Snapshot:
    """The meter's snapshot once the bytes written to the disk tier since ``before`` reach ``nbytes``, a write error
    shows, or ``timeout_s`` has passed, whichever comes first (a store that stays short is the caller's to record).
    ``written(snapshot)``: the bytes written since ``before`` (default: the byte hook's); ``poll``: called between
    looks (a tier's ``settle``). The MP connector hands a worker's stores to the server asynchronously, so its queues
    can be idle before the store's last chunks reach them: a store is over when its bytes are on the disk tier."""
    import time

    def since(snap: Snapshot) -> int:
        return written(snap) if written is not None else snap.hook_write_bytes - before.hook_write_bytes

    deadline = time.monotonic() + timeout_s
    after = meter.snapshot()
    while since(after) < nbytes and after.hook_write_errors == before.hook_write_errors and time.monotonic() < deadline:
        time.sleep(0.02)
        if poll is not None:
            poll()
        after = meter.snapshot()
    return after


@dataclass
class PhaseReads:
    """What one phase read from the disk tier, by each count."""

    device_bytes: int | None
    hook_bytes: int | None
    hook_reads: int
    metric_bytes: int | None  # MP: chunks loaded from L2 x chunk bytes
    lookup_hit_l1_tokens: int | None
    lookup_hit_l2_tokens: int | None
    oom_chunks: int  # MP: chunks that found no arena space (L1 allocation or prefetch reservation)
    contended_chunks: int  # MP: chunks another request's copy made resident first (no reread for them)
    missing_chunks: int  # MP: chunks the disk tier no longer had
    write_errors: int
    retained_chunks: int  # MP: chunks the retention switch kept in L1
    tolerance_bytes: int = 0  # counts agree when they differ by no more than this (0 MP; half a chunk in-process)
    hook_write_bytes: int = 0  # written to the disk tier, by the hook (recorded, not checked)
    device_write_bytes: int | None = None  # the process's write_bytes (its logs included)

    @classmethod
    def between(cls, a: Snapshot, b: Snapshot, chunk_bytes: int) -> PhaseReads:
        def d(key):
            return int(b.metrics[key] - a.metrics.get(key, 0)) if key in b.metrics else None

        device = (b.device_read_bytes - a.device_read_bytes
                  if a.device_read_bytes is not None and b.device_read_bytes is not None else None)
        chunks = d("l2_loaded_chunks")
        oom = max(d("l1_allocation_failures") or 0, d("failure_l1_oom") or 0)
        retained = b.retention_decisions.get("retain", 0) - a.retention_decisions.get("retain", 0)
        hook = b.hook_read_bytes - a.hook_read_bytes if b.hook_read_bytes is not None else None
        device_written = (b.device_write_bytes - a.device_write_bytes
                          if a.device_write_bytes is not None and b.device_write_bytes is not None else None)
        return cls(device, hook, b.hook_reads - a.hook_reads,
                   None if chunks is None else chunks * chunk_bytes, d("lookup_hit_l1_tokens"),
                   d("lookup_hit_l2_tokens"), oom, d("failure_l1_contended") or 0, d("failure_not_found") or 0,
                   b.hook_write_errors - a.hook_write_errors, retained, 0 if a.exact and b.exact else chunk_bytes // 2,
                   b.hook_write_bytes - a.hook_write_bytes, device_written)

    def counts(self) -> dict[str, int]:
        """The independent byte counts this phase has (device, hook, metrics)."""
        c = {}
        if self.hook_bytes is not None:
            c["hook"] = self.hook_bytes
        if self.device_bytes is not None:
            c["device"] = self.device_bytes
        if self.metric_bytes is not None:
            c["metrics"] = self.metric_bytes
        return c

    def agree(self) -> bool:
        """Every available count gives the same bytes, to within ``tolerance_bytes``."""
        values = list(self.counts().values())
        return not values or max(values) - min(values) <= self.tolerance_bytes

    @property
    def bytes(self) -> int:
        """The phase's disk-tier bytes: LMCache's own count (the hook) where there is one, else the device's."""
        return self.hook_bytes if self.hook_bytes is not None else (self.device_bytes or 0)

    @property
    def written_bytes(self) -> int | None:
        """Bytes the phase wrote to the disk tier: the hook's where it counts reads too, else the device's."""
        return self.hook_write_bytes if self.hook_bytes is not None else self.device_write_bytes

    def to_dict(self) -> dict:
        return {**asdict(self), "agree": self.agree()}


TRACE_OPS = ("lookup", "park", "start", "load", "done", "release",
             "store_submit", "store_done", "l1_delete", "warm_handoff", "warm_store_skipped", "store_reserve")


class IOLogReader:
    """Running totals of the server plugin's JSON-lines I/O log, read incrementally."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offset = 0
        self.totals = {"read_bytes": 0, "reads": 0, "write_bytes": 0, "write_errors": 0}
        self.retention: dict[str, int] = {}
        self.trace: list[dict] = []  # lookup-trace events, in log order

    def poll(self) -> None:
        if not self.path.exists():
            return
        with open(self.path) as f:
            f.seek(self._offset)
            while True:
                line = f.readline()
                if not line.endswith("\n"):
                    break  # a line still being written: read it next time
                self._offset += len(line.encode())
                rec = json.loads(line)
                op = rec.get("op")
                if op == "read":
                    self.totals["read_bytes"] += rec["bytes"]
                    self.totals["reads"] += 1
                elif op == "write":
                    self.totals["write_bytes"] += rec["bytes"]
                elif op == "write_error":
                    self.totals["write_errors"] += 1
                elif op == "retention":
                    self.retention[rec["mode"]] = self.retention.get(rec["mode"], 0) + rec["chunks"]
                elif op in TRACE_OPS:
                    self.trace.append(rec)


class ServerMeter:
    """MP mode: the lmcache server's device reads, the launcher's byte hook and lookup trace, ``/metrics``.

    A stock server (no launcher) has no hook: its phases have two counts, device and metrics.
    """

    def __init__(self, server) -> None:
        self.server = server
        self.log = IOLogReader(server.io_log)
        self.hooked = getattr(server, "hooked", True)
        self.available = {"device": read_proc_io(server.pid) is not None, "hook": self.hooked, "metrics": True}

    def snapshot(self) -> Snapshot:
        io = read_proc_io(self.server.pid)
        self.log.poll()
        prom = parse_prometheus(self.server.metrics_text())
        # a counter shows only after its first increment: absent = 0, except where this LMCache may
        # not define it at all (0.5.3 has no per-tier lookup hits): absent there = not counted (None)
        metrics = {k: prom.get(name, 0.0) for k, name in METRIC_NAMES.items()
                   if k not in VERSION_DEPENDENT_METRICS or name in prom}
        metrics.update({f"failure_{r}": prom.get(f"{PREFETCH_FAILURE}{{{r}}}", 0.0) for r in FAILURE_REASONS})
        used, _ = self.server.l1_usage()
        t = self.log.totals
        return Snapshot(io and io["read_bytes"], io and io["read_count"], t["read_bytes"] if self.hooked else None,
                        t["reads"], t["write_bytes"], t["write_errors"], dict(self.log.retention), metrics, used,
                        dir_bytes(self.server.disk_dir), exact=True, trace_index=len(self.log.trace),
                        device_write_bytes=io and io["write_bytes"])

    def trace_between(self, a: Snapshot, b: Snapshot) -> list[dict]:
        """The lookup-trace events logged between two snapshots (empty for a stock server)."""
        return self.log.trace[a.trace_index:b.trace_index]


class DiskReadHook:
    """In-process: wraps ``LocalDiskBackend.read_file``/``write_file`` (class level) and counts bytes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.totals = {"read_bytes": 0, "reads": 0, "write_bytes": 0, "write_errors": 0}
        self.installed = False

    def install(self) -> None:
        if self.installed:
            return
        from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

        read, write, hook = LocalDiskBackend.read_file, LocalDiskBackend.write_file, self

        def read_file(backend, key, buffer, path):
            existed = os.path.exists(path)
            out = read(backend, key, buffer, path)
            if existed:
                hook._add(read_bytes=len(buffer), reads=1)
            return out

        def write_file(backend, buffer, path):
            try:
                out = write(backend, buffer, path)
            except OSError:
                hook._add(write_errors=1)
                raise
            hook._add(write_bytes=len(buffer))
            return out

        LocalDiskBackend.read_file, LocalDiskBackend.write_file = read_file, write_file
        self.installed = True

    def _add(self, **delta: int) -> None:
        with self.lock:
            for k, v in delta.items():
                self.totals[k] += v


class InprocMeter:
    """In-process mode: this process's device reads and the ``LocalDiskBackend`` byte hook."""

    def __init__(self, hook: DiskReadHook, disk_dir: Path, memory_bytes=lambda: 0) -> None:
        self.hook = hook
        self.disk_dir = disk_dir
        self.memory_bytes = memory_bytes
        self.available = {"device": read_proc_io() is not None, "hook": True, "metrics": False}

    def snapshot(self) -> Snapshot:
        io = read_proc_io()
        with self.hook.lock:
            t = dict(self.hook.totals)
        return Snapshot(io and io["read_bytes"], io and io["read_count"], t["read_bytes"], t["reads"], t["write_bytes"],
                        t["write_errors"], memory_tier_bytes=self.memory_bytes(), disk_tier_bytes=dir_bytes(self.disk_dir),
                        device_write_bytes=io and io["write_bytes"])


class NullMeter:
    """No external cache (recompute and engine-resident arms): this process's device reads only."""

    available = {"device": read_proc_io() is not None, "hook": False, "metrics": False}

    def snapshot(self) -> Snapshot:
        io = read_proc_io()
        return Snapshot(io and io["read_bytes"], io and io["read_count"], device_write_bytes=io and io["write_bytes"])

