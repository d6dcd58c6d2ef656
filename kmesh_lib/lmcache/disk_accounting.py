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
mode), to less than half a chunk: LMCache reads whole chunks, so a smaller difference can only be
another read of the same process (in-process, the engine's own files: a JIT cache entry, say; the
MP server reads nothing else and its counts agree exactly). The phase's bytes are the hook's.
``read_proc_io`` returns None where the kernel does not expose per-process I/O accounting; the
device count is then reported as unavailable, not as 0.
"""
from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

MIB = 1 << 20
_PROM_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")

# Prometheus names of the MP counters (OTel name + unit + _total), see lmcache/v1/mp_observability
METRIC_NAMES = {
    "l2_loaded_chunks": "lmcache_mp_l2_prefetch_load_completed_chunks_total",
    "lookup_hit_l1_tokens": "lmcache_mp_lookup_hit_l1_tokens_total",
    "lookup_hit_l2_tokens": "lmcache_mp_lookup_hit_l2_tokens_total",
    "l2_stored_chunks": "lmcache_mp_l2_store_completed_objects_chunks_total",
    "l1_allocation_failures": "lmcache_mp_l1_allocation_failure_chunks_total",
    "l2_usage_bytes": "lmcache_mp_l2_usage_bytes",
}
# l2_prefetch_failure by reason: l1_oom (no arena space), l1_contended (another request's copy became
# resident first; the lookup falls back to that L1 copy), not_found (the disk tier lost the chunk)
PREFETCH_FAILURE = "lmcache_mp_l2_prefetch_failure_chunks_total"
FAILURE_REASONS = ("l1_oom", "l1_contended", "not_found")


def read_proc_io(pid: int | str = "self") -> dict[str, int] | None:
    """The fields of ``/proc/<pid>/io`` (read_bytes, syscr, ...), or None when unavailable."""
    try:
        text = Path(f"/proc/{pid}/io").read_text()
    except (FileNotFoundError, PermissionError, ProcessLookupError):
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {k.strip(): int(v) for k, v in fields.items()}


def parse_prometheus(text: str) -> dict[str, float]:
    """Metric name -> value summed over its label sets, plus ``name{reason}`` for ``reason`` labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _PROM_LINE.match(line)
        if not m or m.group(3) in ("NaN", "+Inf", "-Inf"):
            continue
        value = float(m.group(3))
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
        reason = re.search(r'reason="([^"]*)"', m.group(2) or "")
        if reason:
            key = f"{m.group(1)}{{{reason.group(1)}}}"
            out[key] = out.get(key, 0.0) + value
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
    tolerance_bytes: int = 0  # counts agree when they differ by no more than this (half a chunk)

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
        return cls(device, hook, b.hook_reads - a.hook_reads,
                   None if chunks is None else chunks * chunk_bytes, d("lookup_hit_l1_tokens"),
                   d("lookup_hit_l2_tokens"), oom, d("failure_l1_contended") or 0, d("failure_not_found") or 0,
                   b.hook_write_errors - a.hook_write_errors, retained, chunk_bytes // 2)

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

    def to_dict(self) -> dict:
        return {**asdict(self), "agree": self.agree()}


class IOLogReader:
    """Running totals of the server plugin's JSON-lines I/O log, read incrementally."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offset = 0
        self.totals = {"read_bytes": 0, "reads": 0, "write_bytes": 0, "write_errors": 0}
        self.retention: dict[str, int] = {}

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


class ServerMeter:
    """MP mode: the lmcache server's device reads, the plugin's byte hook, and ``/metrics``."""

    def __init__(self, server) -> None:
        self.server = server
        self.log = IOLogReader(server.io_log)
        self.available = {"device": read_proc_io(server.pid) is not None, "hook": True, "metrics": True}

    def snapshot(self) -> Snapshot:
        io = read_proc_io(self.server.pid)
        self.log.poll()
        prom = parse_prometheus(self.server.metrics_text())
        metrics = {k: prom.get(name, 0.0) for k, name in METRIC_NAMES.items()}
        metrics.update({f"failure_{r}": prom.get(f"{PREFETCH_FAILURE}{{{r}}}", 0.0) for r in FAILURE_REASONS})
        used, _ = self.server.l1_usage()
        t = self.log.totals
        return Snapshot(io and io["read_bytes"], io and io["syscr"], t["read_bytes"], t["reads"], t["write_bytes"],
                        t["write_errors"], dict(self.log.retention), metrics, used, dir_bytes(self.server.disk_dir))


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
        return Snapshot(io and io["read_bytes"], io and io["syscr"], t["read_bytes"], t["reads"], t["write_bytes"],
                        t["write_errors"], memory_tier_bytes=self.memory_bytes(), disk_tier_bytes=dir_bytes(self.disk_dir))


class NullMeter:
    """No external cache (recompute and engine-resident arms): this process's device reads only."""

    available = {"device": read_proc_io() is not None, "hook": False, "metrics": False}

    def snapshot(self) -> Snapshot:
        io = read_proc_io()
        return Snapshot(io and io["read_bytes"], io and io["syscr"])

