"""Runs inside the ``lmcache server`` process, loaded through its ``--server-module`` extension point.

Two things, both observation or configuration of real LMCache objects, never a replacement of
LMCache's data path:

1. **Retention switch.** The prefetch controller's policy is wrapped so that its retention
   decision (``plan_l1_retention``: keep a chunk loaded from L2 in L1 after it reached the engine,
   or mark it temporary) follows a control file the harness writes between groups: ``retain``
   behaves exactly like LMCache's ``RetainPrefetchPolicy``, ``discard`` like its
   ``DefaultPrefetchPolicy``. Load planning is the wrapped policy's own. This lets one engine and
   one server run both arms in alternation.
2. **Byte hook.** The ``fs`` L2 adapter's O_DIRECT read and write functions are wrapped to append
   one JSON line per chunk (op, bytes, errno) to an I/O log: the LMCache-level count of disk-tier
   bytes, next to the device count (``/proc/<pid>/io``) and LMCache's own metrics.

Imports nothing from kmesh_lib and only the standard library at module level, so the server
starts as fast as without it.
"""
from __future__ import annotations

import json
import os
import threading
import time

RETAIN, DISCARD = "retain", "discard"


class RetentionControl:
    """The control file's current word (``retain`` or ``discard``), re-read when its mtime changes."""

    def __init__(self, path: str, default: str = DISCARD) -> None:
        self.path = path
        self.default = default
        self._mtime_ns = -1
        self._mode = default

    def mode(self) -> str:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return self.default
        if st.st_mtime_ns != self._mtime_ns:
            with open(self.path) as f:
                word = f.read().strip()
            self._mode = word if word in (RETAIN, DISCARD) else self.default
            self._mtime_ns = st.st_mtime_ns
        return self._mode


class IOLog:
    """Append-only JSON lines; one lock so concurrent executor threads never interleave lines."""

    def __init__(self, path: str) -> None:
        self._f = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def write(self, **record) -> None:
        record["t"] = time.time()
        line = json.dumps(record)
        with self._lock:
            self._f.write(line + "\n")


def switchable_policy(inner, control: RetentionControl, log: IOLog):
    """Wraps ``inner`` (a PrefetchPolicy) so its L1 retention decision follows ``control``."""
    from lmcache.v1.distributed.storage_controllers.prefetch_policy import (
        PrefetchPolicy,
    )

    class SwitchableRetentionPolicy(PrefetchPolicy):
        def plan_load(self, *args, **kwargs):
            return inner.plan_load(*args, **kwargs)

        def plan_l1_retention(self, keys, l1_manager_desc, l2_adapter_desc):
            mode = control.mode()
            log.write(op="retention", mode=mode, chunks=len(keys))
            return [mode == RETAIN] * len(keys)

    return SwitchableRetentionPolicy()


def hook_fs_adapter(adapter, log: IOLog) -> None:
    """Counts every byte the ``fs`` adapter reads or writes through its O_DIRECT helpers."""
    read, write = adapter._read_with_odirect, adapter._write_with_odirect

    def counted_read(file_path, dst_buf):
        n = read(file_path, dst_buf)
        log.write(op="read", bytes=int(n or 0), expected=len(dst_buf))
        return n

    def counted_write(file_path, buf):
        try:
            write(file_path, buf)
        except OSError as e:
            log.write(op="write_error", bytes=0, expected=len(buf), errno=e.errno)
            raise
        log.write(op="write", bytes=len(buf), expected=len(buf))

    adapter._read_with_odirect = counted_read
    adapter._write_with_odirect = counted_write


def build_server_modules(build_context):
    """The ``--server-module`` factory: installs the switch and the hook, adds no module.

    ``build_context.config``: ``control_file`` (retention word), ``io_log`` (JSON lines path).
    """
    cfg = build_context.config
    log = IOLog(cfg["io_log"])
    storage_manager = build_context.server_context._storage_manager
    controller = storage_manager._prefetch_controller
    controller._policy = switchable_policy(controller._policy, RetentionControl(cfg["control_file"]), log)
    hooked = []
    for adapter in storage_manager._l2_adapters.values():
        if type(adapter).__name__ == "FSL2Adapter":
            hook_fs_adapter(adapter, log)
            hooked.append(str(adapter._base_path))
    log.write(op="plugin_ready", hooked=hooked, pid=os.getpid())
    return None
