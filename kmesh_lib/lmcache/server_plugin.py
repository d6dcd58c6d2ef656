"""Runs inside the ``lmcache server`` process: installed by ``kmesh_lib.lmcache.launcher`` before it serves.

Seven things, each observation or configuration of real LMCache objects (LMCache 0.5.3 and 0.5.6);
none replaces LMCache's data path:

1. **Retention switch.** The prefetch controller's policy is wrapped so that its L1 retention
   decision (keep a chunk loaded from L2 in L1 after it reached the engine, or mark it temporary)
   follows a control file the harness writes between groups: ``retain`` decides like LMCache's
   ``RetainPrefetchPolicy``, ``discard`` like its ``DefaultPrefetchPolicy``. Load planning is the
   wrapped policy's own. 0.5.3 asks ``select_l1_retentions(keys)``, 0.5.6
   ``plan_l1_retention(keys, l1_desc, l2_desc)``; the wrapper answers both.
2. **Byte hook.** The ``fs`` L2 adapter's O_DIRECT read and write functions are wrapped to append
   one JSON line per chunk (op, bytes): LMCache's own count of disk-tier bytes, next to the
   device count (``/proc/<pid>/io``) and LMCache's metrics.
3. **Lookup trace.** One line per lookup as the storage manager receives it (``lookup``: the
   engine's request id, the chunk keys, what L1 held), and the prefetch controller's steps for
   it (``start``: its L1 lock pass; ``load``: the L2 load submitted, keys and bytes; ``done``) and
   the engine's release of its read locks (``release``). Every stamp is ``time.monotonic_ns()``,
   the clock the harness stamps requests with (CLOCK_MONOTONIC is system-wide on Linux), so a
   lookup can be placed against the loads of the same keys: in flight, or finished.
4. **Singleflight** (switchable by a second control file). A prefetch request whose keys overlap a
   request the controller already has in flight is parked instead of started; it starts in the
   first controller-loop pass after no overlapping request is in flight, and its L1 lock pass then
   finds the keys the first request loaded (read-locked for its reader, or retained), so it reads
   nothing from L2. Stock LMCache issues its own load (0.5.6: per-request write tags) or loses
   the L1 reservation and falls back to its L1-only hit (0.5.3: ``KEY_NOT_WRITABLE``).

5. **Store trace.** The store controller's steps (both versions): each L2 store it submits
   (``store_submit``: keys, and how many a warm finish handed it, see 6), each store it finalizes
   (``store_done``: ok, bytes the adapter reported written) and each L1 deletion it makes there
   (``l1_delete``: the keys deleted, and those it skipped because a reader held them). With the
   lookup trace this names why a lookup after a warm prefetch found nothing in L1.
6. **Warm-store guard** (switchable by a third control file; LMCache 0.5.3 only). 0.5.3 finishes a
   warm prefetch's (``POST /cache/prefetches``, ``PrefetchMode.WARM``) loads with
   ``L1Manager.finish_write``, whose listeners include the store controller's ``StoreListener``:
   it takes the keys for new writes and stores them to L2 again (the ``fs`` adapter finds the
   files there and writes nothing, but reports the store done) and, under ``--l2-store-policy
   skip_l1``, deletes them from L1 a few ms after the prefetch completed (``L1Manager.delete``
   skips read-locked keys, so only a lookup that locked them first keeps the copy). A lookup-mode
   load ends with ``finish_write_and_reserve_read``, which the listener ignores; 0.5.6 finishes
   every load that way. With the guard on, keys ``finish_write`` hands the listener while the
   prefetch controller finishes a WARM request (same thread, inside L1Manager's lock) are not
   enqueued (``warm_store_skipped``): they came from L2. With it off they are, and logged
   (``warm_handoff``). Where LMCache has no ``PrefetchMode.WARM`` (0.5.6) nothing is installed;
   ``plugin_ready`` says so. NOTE: the first guard (686da3f, reverted in c7aa510) asked
   ``_mode(request.mode)``, which is "None" for every request, so it never fired on the H200.

7. **Store reservations.** The storage manager's ``reserve_write`` (the store path's L1 reservation: the
   engine's chunks get their L1 objects there; the prefetch controller reserves through the L1 manager
   directly) logs one ``store_reserve`` line per call: keys asked, keys reserved, the L1 error of each key
   left out (``OUT_OF_MEMORY``: the arena had no room for the call's batch, all or nothing per L1 manager;
   ``KEY_NOT_WRITABLE``: the key was in L1 already) and the arena's bytes in use and in all just before. A
   store whose keys all fail commits nothing and still reports success to the engine (0.5.3
   ``LMCacheDrivenTransferModule.store``): this line is where that shows.

Invariant: every hook calls the wrapped LMCache function exactly once with the same arguments,
except the warm-store guard when on, which withholds from the store listener the keys a WARM
finish hands it; the singleflight only delays when ``_start_lookup_phase`` runs, on the
controller's own thread.

Imports only the standard library at module level, so the server starts as fast as without it.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time

RETAIN, DISCARD = "retain", "discard"
ON, OFF = "on", "off"


class WordSwitch:
    """A control file's current word (one of ``choices``; ``default`` when absent or unknown).

    Read on every decision (a few hundred a second at most, ~10 us each): an mtime cache could miss
    two writes within one timestamp tick.
    """

    def __init__(self, path: str, choices: tuple[str, ...], default: str) -> None:
        self.path, self.choices, self.default = path, choices, default

    def word(self) -> str:
        try:
            with open(self.path) as f:
                word = f.read().strip()
        except FileNotFoundError:
            return self.default
        return word if word in self.choices else self.default


class IOLog:
    """Append-only JSON lines; one lock so concurrent executor threads never interleave lines."""

    def __init__(self, path: str) -> None:
        self._f = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def write(self, **record) -> None:
        record.setdefault("t_ns", time.monotonic_ns())
        line = json.dumps(record)
        with self._lock:
            self._f.write(line + "\n")


class SwitchableRetentionPolicy:
    """Delegates to the stock policy; only the retention decision follows the control file."""

    def __init__(self, inner, control: WordSwitch, log: IOLog) -> None:
        self._inner, self._control, self._log = inner, control, log

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _decide(self, keys) -> list[bool]:
        mode = self._control.word()
        self._log.write(op="retention", mode=mode, chunks=len(keys))
        return [mode == RETAIN] * len(keys)

    def select_l1_retentions(self, keys):  # LMCache 0.5.3
        return self._decide(keys)

    def plan_l1_retention(self, keys, l1_manager_desc=None, l2_adapter_desc=None):  # LMCache 0.5.6
        return self._decide(keys)


def hook_fs_adapter(adapter, log: IOLog) -> None:
    """Counts every byte the ``fs`` adapter reads or writes through its O_DIRECT helpers."""
    read, write = adapter._read_with_odirect, adapter._write_with_odirect

    def counted_read(file_path, dst_buf):
        t0 = time.monotonic_ns()
        n = read(file_path, dst_buf)
        log.write(op="read", bytes=int(n or 0), expected=len(dst_buf), t0_ns=t0)
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


# -- keys of a prefetch spec / in-flight request, in both LMCache versions --
def spec_keys(spec) -> list:
    """0.5.3 ``PrefetchRequestSpec.keys``; 0.5.6 ``PrefetchTaskSpec.key_groups[*].keys``."""
    if hasattr(spec, "keys") and not callable(spec.keys):
        return list(spec.keys)
    return [k for group in spec.key_groups for k in group.keys]


def request_keys(request) -> list:
    """0.5.3 ``InFlightPrefetchRequest.keys``; 0.5.6 ``get_flattened_keys()``."""
    if hasattr(request, "get_flattened_keys"):
        return request.get_flattened_keys()
    return list(request.keys)


def key_ids(keys) -> list[int]:
    """Short per-key ids for the log: equal keys give equal ids within this server process."""
    return [hash(k) & 0xFFFFFFFF for k in keys]


def l1_locked_count(request) -> int | None:
    """Keys the request found (and read-locked) in L1 at its lock pass."""
    try:
        if hasattr(request, "l1_readlocks"):  # 0.5.3
            return int(request.l1_readlocks.popcount())
        return int(request.key_states.l1_locked_keys.merge().popcount())  # 0.5.6: MapState, L1 index -> Bitmap2D
    except Exception:  # noqa: BLE001 - an unknown LMCache layout: reported as unknown, never guessed
        return None


def _plan_keys(plan) -> int:
    """0.5.3 passes adapter -> Bitmap of keys to load; 0.5.6 key -> reserved MemoryObj."""
    values = list(plan.values())
    if values and all(hasattr(v, "popcount") for v in values):
        return int(sum(v.popcount() for v in values))
    return len(values)


def _mode(spec) -> str:
    mode = getattr(spec, "mode", None) or getattr(spec, "lock_mode", None)
    return getattr(mode, "name", str(mode))


class LookupTrace:
    """Wraps the storage manager's and the prefetch controller's lookup steps; owns the singleflight."""

    def __init__(self, storage_manager, controller, log: IOLog, singleflight: WordSwitch) -> None:
        self.sm, self.controller, self.log, self.singleflight = storage_manager, controller, log, singleflight
        self.parked: list[tuple[int, object, int, list[int]]] = []  # (request id, spec, t parked, blockers)
        self._wrap_storage_manager()
        self._wrap_controller()

    # -- storage manager: what the engine asked for --
    def _wrap_storage_manager(self) -> None:
        sm, log = self.sm, self.log
        submit, release = sm.submit_prefetch_task, sm.finish_read_prefetched

        def submit_prefetch_task(spec, *args, **kwargs):
            t = time.monotonic_ns()
            handle = submit(spec, *args, **kwargs)
            keys = spec_keys(spec)
            found = getattr(handle, "l1_found_indices", None)  # 0.5.3 locks L1 here, before the controller
            log.write(op="lookup", t_ns=t, ext=str(getattr(handle, "external_request_id", "")),
                      pid=int(handle.prefetch_request_id), n_keys=len(keys), k=key_ids(keys), mode=_mode(spec),
                      l1_keys=None if found is None else len(found))
            return handle

        def finish_read_prefetched(keys, *args, **kwargs):
            out = release(keys, *args, **kwargs)
            log.write(op="release", k=key_ids(keys), n_keys=len(keys))
            return out

        sm.submit_prefetch_task = submit_prefetch_task
        sm.finish_read_prefetched = finish_read_prefetched

    # -- controller: its lock pass, loads and completion; the singleflight --
    def _wrap_controller(self) -> None:
        c, log = self.controller, self.log
        start, pending = c._start_lookup_phase, c._start_pending_requests
        submit_loads, finish, status = c._submit_load_tasks, c._finish_request, c.report_status

        def run_start(request_id, spec, t_parked: int | None) -> None:
            t = time.monotonic_ns()
            start(request_id, spec)
            request = c._in_flight_requests.get(request_id)
            keys = spec_keys(spec)
            log.write(op="start", pid=request_id, t_ns=t, waited_ns=0 if t_parked is None else t - t_parked,
                      parked=t_parked is not None, n_keys=len(keys), k=key_ids(keys),
                      l1_keys=None if request is None else l1_locked_count(request))

        def blockers(spec) -> list[int]:
            mine = set(spec_keys(spec))
            return [rid for rid, req in list(c._in_flight_requests.items()) if mine.intersection(request_keys(req))]

        def start_lookup_phase(request_id, spec):
            if self.singleflight.word() == ON:
                waiting_for = blockers(spec)
                if waiting_for:
                    t = time.monotonic_ns()
                    self.parked.append((request_id, spec, t, waiting_for))
                    log.write(op="park", pid=request_id, t_ns=t, behind=waiting_for)
                    return
            run_start(request_id, spec, None)

        def start_pending_requests():
            still = []
            for request_id, spec, t_parked, waiting_for in self.parked:
                if len(c._in_flight_requests) < c._max_in_flight and not blockers(spec):
                    try:
                        run_start(request_id, spec, t_parked)
                    except Exception:  # noqa: BLE001 - as LMCache's own loop does: log, keep serving
                        import logging

                        logging.getLogger(__name__).exception("kmesh: parked prefetch %d failed to start", request_id)
                else:
                    still.append((request_id, spec, t_parked, waiting_for))
            self.parked = still
            pending()

        def submit_load_tasks(request, plan, *args, **kwargs):
            t = time.monotonic_ns()
            out = submit_loads(request, plan, *args, **kwargs)
            log.write(op="load", pid=request.request_id, t_ns=t, n_keys=_plan_keys(plan),
                      bytes=int(sum(getattr(request, "load_bytes_by_adapter", {}).values())))
            return out

        def finish_request(request, *args, **kwargs):
            # its chunks become readable in L1 inside ``finish``: a lock pass between the two stamps finds them
            t_finish = time.monotonic_ns()
            out = finish(request, *args, **kwargs)
            log.write(op="done", pid=request.request_id, mode=_mode(request), t_finish_ns=t_finish)
            return out

        def report_status():
            out = status()
            out["kmesh_parked_count"] = len(self.parked)
            out["kmesh_singleflight"] = self.singleflight.word()
            return out

        c._start_lookup_phase = start_lookup_phase
        c._start_pending_requests = start_pending_requests
        c._submit_load_tasks = submit_load_tasks
        c._finish_request = finish_request
        c.report_status = report_status


# Per thread: ``warm`` while the prefetch controller finishes a WARM request (``guard``: the guard's
# word then), ``store_finalize`` while the store controller finalizes a store, ``store_reserve`` (key -> the
# L1 manager's answer) inside the storage manager's ``reserve_write``. LMCache calls the listener, the L1
# deletion and the L1 managers' ``reserve_write`` on the thread that set them.
_STATE = threading.local()


def store_controllers(storage_manager) -> list:
    """0.5.6: one per L1 manager (``_store_controllers``); 0.5.3: the one ``_store_controller``."""
    many = getattr(storage_manager, "_store_controllers", None)
    if isinstance(many, dict) and many:
        return list(many.values())
    one = getattr(storage_manager, "_store_controller", None)
    return [] if one is None else [one]


def _keys_with(result: dict, error: str) -> list:
    """The keys of an ``L1Manager`` result dict (key -> ``L1Error``) with the error named ``error``."""
    return [k for k, e in result.items() if getattr(e, "name", None) == error]


class StoreTrace:
    """Wraps each store controller's L2 submissions, its finalize step and the L1 deletions made there.

    ``mark_warm``/``take_warm``: keys a WARM finish handed the store listener (``WarmStoreGuard``,
    guard off), so a later ``store_submit`` line says how many of its keys came from one.
    """

    def __init__(self, storage_manager, log: IOLog) -> None:
        self.log = log
        self._warm: set = set()
        self._lock = threading.Lock()  # never held while calling LMCache
        self.controllers = store_controllers(storage_manager)
        wrapped: set[int] = set()
        for sc in self.controllers:
            self._wrap_finalize(sc)
            l1 = getattr(sc, "_l1_manager", None)
            if l1 is not None and id(l1) not in wrapped:
                wrapped.add(id(l1))
                self._wrap_delete(l1)
            for adapter in getattr(sc, "_l2_adapters", {}).values():
                if id(adapter) not in wrapped:
                    wrapped.add(id(adapter))
                    self._wrap_submit(adapter)

    def mark_warm(self, keys) -> None:
        with self._lock:
            self._warm.update(keys)

    def take_warm(self, keys) -> int:
        with self._lock:
            mine = self._warm.intersection(keys)
            self._warm -= mine
        return len(mine)

    def _wrap_submit(self, adapter) -> None:
        submit, log = adapter.submit_store_task, self.log

        def submit_store_task(keys, objects, *args, **kwargs):
            t = time.monotonic_ns()
            task_id = submit(keys, objects, *args, **kwargs)
            log.write(op="store_submit", t_ns=t, task=int(task_id), n_keys=len(keys), k=key_ids(keys),
                      warm_keys=self.take_warm(keys))
            return task_id

        adapter.submit_store_task = submit_store_task

    def _wrap_finalize(self, sc) -> None:
        finalize, log = sc._finalize_store, self.log

        def finalize_store(task_key, task, *args, **kwargs):
            t = time.monotonic_ns()
            _STATE.store_finalize = True
            try:
                return finalize(task_key, task, *args, **kwargs)
            finally:
                _STATE.store_finalize = False
                keys = list(getattr(task, "keys", []))
                log.write(op="store_done", t_ns=t, task=int(task_key[1]), ok=bool(getattr(task, "l2_store_result", False)),
                          bytes=getattr(task, "l2_bytes_transferred", None), n_keys=len(keys), k=key_ids(keys))

        sc._finalize_store = finalize_store

    def _wrap_delete(self, l1) -> None:
        delete, log = l1.delete, self.log

        def delete_keys(keys, *args, **kwargs):
            out = delete(keys, *args, **kwargs)
            if getattr(_STATE, "store_finalize", False):  # the store policy's deletion (skip_l1)
                deleted, locked = _keys_with(out, "SUCCESS"), _keys_with(out, "KEY_IS_LOCKED")
                log.write(op="l1_delete", by="store", n_keys=len(deleted), k=key_ids(deleted), locked=key_ids(locked))
            return out

        l1.delete = delete_keys


def l1_managers(storage_manager) -> list:
    """The storage manager's L1 managers: 0.5.6 writes through ``_write_managers`` in order; 0.5.3 has one."""
    out = []
    for m in [*getattr(storage_manager, "_write_managers", ()), getattr(storage_manager, "_l1_manager", None)]:
        if m is not None and all(m is not x for x in out):
            out.append(m)
    return out


def l1_usage(managers) -> tuple[int | None, int | None]:
    """(bytes in use, bytes in all) over the L1 managers, or (None, None) where one cannot say."""
    try:
        pairs = [m.get_memory_usage() for m in managers]
    except Exception:  # noqa: BLE001 - an unknown LMCache layout: reported as unknown, never guessed
        return None, None
    return sum(int(u) for u, _ in pairs), sum(int(t) for _, t in pairs)


class StoreReserveTrace:
    """Wraps the storage manager's ``reserve_write`` and its L1 managers' own: inside the former, each L1 manager's
    answer per key is noted (a later manager's answer replaces an earlier one's: 0.5.6 retries OUT_OF_MEMORY keys
    on the next), and one ``store_reserve`` line says what the call reserved and why the rest was not."""

    def __init__(self, storage_manager, log: IOLog) -> None:
        self.log = log
        self.managers = l1_managers(storage_manager)
        for m in self.managers:
            self._wrap_l1(m)
        reserve = storage_manager.reserve_write

        def reserve_write(keys, *args, **kwargs):
            used, total = l1_usage(self.managers)
            t = time.monotonic_ns()
            _STATE.store_reserve = {}
            try:
                out = reserve(keys, *args, **kwargs)
            finally:
                answers, _STATE.store_reserve = _STATE.store_reserve, None
            errors: dict[str, int] = {}
            for k in keys:
                if k not in out:
                    name = answers.get(k, "UNKNOWN")
                    errors[name] = errors.get(name, 0) + 1
            self.log.write(op="store_reserve", t_ns=t, n_keys=len(keys), reserved=len(out), errors=errors,
                           l1_used=used, l1_total=total)
            return out

        storage_manager.reserve_write = reserve_write

    @staticmethod
    def _wrap_l1(l1) -> None:
        reserve = l1.reserve_write

        def reserve_write(keys, *args, **kwargs):
            out = reserve(keys, *args, **kwargs)
            answers = getattr(_STATE, "store_reserve", None)
            if answers is not None:  # inside the storage manager's reserve_write: the store path
                for k, result in out.items():
                    err = result[0] if isinstance(result, tuple) else result
                    answers[k] = getattr(err, "name", str(err))
            return out

        l1.reserve_write = reserve_write


def warm_mode():
    """LMCache 0.5.3's ``PrefetchMode.WARM``, or None where this LMCache has none (0.5.6)."""
    try:
        from lmcache.v1.distributed.api import PrefetchMode
    except ImportError:
        return None
    return getattr(PrefetchMode, "WARM", None)


def is_warm(request) -> bool:
    """A WARM prefetch request (0.5.3 ``InFlightPrefetchRequest.mode``; 0.5.6 requests have ``lock_mode``)."""
    return _mode(request) == "WARM"


@contextlib.contextmanager
def warm_finish(guard: bool):
    """Marks this thread as finishing a WARM request (``guard``: keep its keys from the store listener)."""
    _STATE.warm, _STATE.guard = True, guard
    try:
        yield
    finally:
        _STATE.warm = _STATE.guard = False


def guard_store_listener(listener, trace: StoreTrace, log: IOLog) -> None:
    """Wraps a ``StoreListener``'s ``on_l1_keys_write_finished``: inside ``warm_finish(guard=True)``
    the keys are not enqueued (``warm_store_skipped``); inside ``warm_finish(guard=False)`` they are,
    and remembered (``warm_handoff``, ``StoreTrace.mark_warm``); elsewhere it is the listener's own.

    Called by ``L1Manager.finish_write`` inside its lock: it calls nothing of L1Manager.
    """
    enqueue = listener.on_l1_keys_write_finished

    def on_l1_keys_write_finished(keys, *args, **kwargs):
        if keys and getattr(_STATE, "warm", False):
            if getattr(_STATE, "guard", False):  # they came from L2: storing them again is pointless
                log.write(op="warm_store_skipped", n_keys=len(keys), k=key_ids(keys))
                return None
            trace.mark_warm(keys)
            log.write(op="warm_handoff", n_keys=len(keys), k=key_ids(keys))
        return enqueue(keys, *args, **kwargs)

    listener.on_l1_keys_write_finished = on_l1_keys_write_finished


class WarmStoreGuard:
    """Keeps a warm prefetch's keys out of the store listener (word ``on``); logs them either way.

    Installs only where LMCache has ``PrefetchMode.WARM`` (0.5.3), a prefetch finish step and a store
    listener: the prefetch controller's ``_finish_request`` runs a WARM request inside
    ``warm_finish`` (the word read once per finish), and every store listener is wrapped
    (``guard_store_listener``). ``report`` says whether it installed, and why not.
    """

    def __init__(self, controller, trace: StoreTrace, log: IOLog, word: WordSwitch) -> None:
        self.word = word
        listeners = [getattr(sc, "_listener", None) for sc in trace.controllers]
        listeners = [x for x in listeners if x is not None and hasattr(x, "on_l1_keys_write_finished")]
        if warm_mode() is None:
            self.report = {"installed": False, "detail": "this LMCache has no PrefetchMode.WARM: its warm prefetch "
                                                         "finishes loads with finish_write_and_reserve_read, which the "
                                                         "store listener ignores; nothing to guard"}
            return
        if not listeners or not hasattr(controller, "_finish_request"):
            self.report = {"installed": False, "detail": "no store listener or prefetch finish step found"}
            return
        for listener in listeners:
            guard_store_listener(listener, trace, log)
        finish = controller._finish_request

        def finish_request(request, *args, **kwargs):
            if not is_warm(request):
                return finish(request, *args, **kwargs)
            with warm_finish(self.word.word() == ON):
                return finish(request, *args, **kwargs)

        controller._finish_request = finish_request
        self.report = {"installed": True, "detail": f"{len(listeners)} store listener(s)"}

    def state(self) -> str:
        return self.word.word() if self.report["installed"] else "not installed"


def install_hooks(storage_manager, cfg: dict) -> dict:
    """Installs the seven hooks on a built ``StorageManager``; returns what it hooked.

    ``cfg``: ``retention_file``, ``singleflight_file`` and ``warm_store_guard_file`` (control words),
    ``io_log`` (JSON lines). The report (also the ``plugin_ready`` line) names the ``fs`` adapters
    hooked, the store controllers traced, the L1 managers whose store reservations are traced and whether the
    warm-store guard installed (and why not).
    """
    log = IOLog(cfg["io_log"])
    controller = storage_manager._prefetch_controller
    controller._policy = SwitchableRetentionPolicy(
        controller._policy, WordSwitch(cfg["retention_file"], (RETAIN, DISCARD), DISCARD), log)
    hooked = []
    for adapter in storage_manager._l2_adapters.values():
        if type(adapter).__name__ == "FSL2Adapter":
            hook_fs_adapter(adapter, log)
            hooked.append(str(adapter._base_path))
    LookupTrace(storage_manager, controller, log, WordSwitch(cfg["singleflight_file"], (ON, OFF), OFF))
    trace = StoreTrace(storage_manager, log)
    reserve = StoreReserveTrace(storage_manager, log)
    guard = WarmStoreGuard(controller, trace, log, WordSwitch(cfg["warm_store_guard_file"], (ON, OFF), OFF))
    status = controller.report_status

    def report_status():
        out = status()
        out["kmesh_warm_store_guard"] = guard.state()
        return out

    controller.report_status = report_status
    info = {"fs_adapters": hooked, "pid": os.getpid(), "store_controllers": len(trace.controllers),
            "l1_managers": len(reserve.managers), "warm_store_guard": guard.report}
    log.write(op="plugin_ready", **info)
    return info
