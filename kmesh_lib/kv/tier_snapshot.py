"""A kv-layer tier's counters at one moment, in the field names of ``lmcache.disk_accounting.Snapshot``.

The GPU buffer (``kv.gpu_buffer``) and vLLM's own tiers (``kv.offloading``) report their disk-tier
bytes this way, so ``lmcache.disk_accounting.PhaseReads.between`` takes their snapshots as it takes
LMCache's and sections 16 and 20 check every tier with one set of statements.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TierSnapshot:
    """Counters at one moment; field names as ``lmcache.disk_accounting.Snapshot``'s."""

    hook_read_bytes: int = 0  # bytes the tier read from its disk files, counted in its own I/O calls
    hook_reads: int = 0
    hook_write_bytes: int = 0
    hook_write_errors: int = 0
    device_read_bytes: int | None = None  # this process's block-device reads (/proc/self/io)
    memory_tier_bytes: int = 0  # the tier's copies outside vLLM's block pool that a lookup can hit
    disk_tier_bytes: int = 0
    staged_bytes: int = 0
    restored_bytes: int = 0
    # LMCache-only counts, empty here, so ``lmcache.disk_accounting.PhaseReads.between`` takes these
    # snapshots as it takes LMCache's: no metrics (two counts: hook and device), no retention decisions,
    # and not ``exact`` (the device count is the whole engine process's reads: agree to half a chunk)
    device_read_calls: int | None = None
    metrics: dict = field(default_factory=dict)
    retention_decisions: dict = field(default_factory=dict)
    exact: bool = False
    trace_index: int = 0
    device_write_bytes: int | None = None  # this process's writes (/proc/self/io), recorded beside the hook's


def process_io() -> tuple[int | None, int | None, int | None]:
    """This process's (read bytes, read calls, written bytes) from the block layer (psutil; None where
    the platform has no I/O counters). O_DIRECT reads count: they reach the device."""
    import psutil

    try:
        io = psutil.Process().io_counters()
    except (AttributeError, psutil.Error):
        return None, None, None
    return io.read_bytes, io.read_count, io.write_bytes
