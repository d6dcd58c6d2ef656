"""``LaunchThread``: a native thread (``launch_thread.c``) that makes the driver's graph launches for the engine's
thread, so a restore's launch leaves the step's host path (issue 13).

On the H200 machine's host one ``cuGraphLaunch`` costs 40-50 us of host time between steps, on the engine
thread or on another (measured both ways at a021e22: 0.088 ms copy call on the engine thread, 0.048 ms for the
call on a thread of its own), about a third of what a restore adds to the step at 0.5B 16k. Handed to a
thread that does nothing else, the engine thread pays two slot stores and one counter store (``request``: no
call into C, no lock, no wake-up; a condition variable's wake cost it about 25 us there), and the launch is
made on another core while the engine's runner prepares the step's inputs (a millisecond or more with
``launch_at="step_start"``). The thread finds a request by polling: it spins ``SPIN_S`` after its last launch,
then sleeps ``POLL_S`` between looks (``cpu_seconds`` says what that cost a core).

What that costs in correctness, and how it is kept: the engine thread must not use the graph's events (wait
on, query or time them) before the launch that records them has been made, or it would read their previous
replay. Every such use goes through ``wait_for(ticket)`` first (``CopyGraphs.await_launches``), which spins on
the thread's counter (its host time is counted where it is spent: in the forward pass's first layer wait). Only
copies onto a stream the engine thread queues nothing else on (the layer-wait route's side stream) are handed
over: on the forward pass's own stream the order of two threads' launches would be a race. The in-place stores
rely on x86-64 keeping stores in order (the slot before the counter); elsewhere ``request`` calls ``kl_request``,
a release store.

The thread also watches each handed-off copy's last event (``request(..., watch=)``: it queries the event between
requests, at most once per ``WATCH_S``) and publishes how many copies it has seen end, so the forward pass's
first layer wait learns that the copy has ended from a counter read in place (``copy_ended``) instead of its own
event query, a driver call through torch of about 8 us on the H200 host with the step's caches cold
(``benchmarks/bench_cuda_host_calls.py``). Not seen yet, the engine thread queries the event as before.

A request may also carry the copy's block ids unread (``request(..., ids=)``: a Python list, a range of it, and where
the graph's pinned arguments are): the thread writes the arguments itself before the launch, reading the list's ints
without the GIL through ``id_pack``'s ``kp_pack_into`` (``set_pack``), so the engine thread reads none of the 1,024
int objects of a 16k-token restore: the two parts that packing and writing them cost it at 0.5B 16k on the H200
(``pack_ids`` 0.021 ms, ``write_ids`` 0.020 ms in crossover b3f2) leave its path; not yet measured there with this.
The thread holds each request's list until its slot is reused; the requester leaves the list unchanged until the
launch is made.

The library is compiled once per source (``cc``, as Triton compiles its own launcher stubs) into a per-user
cache; without a compiler there is no thread and the engine thread launches as before (the arena says why).
``function_address`` gives a C function to hand in: ``cuGraphLaunch`` on CUDA; tests pass a
``ctypes.CFUNCTYPE`` callback and exercise the same thread on the CPU build.
"""
from __future__ import annotations

import ctypes
import os
import platform
import threading
import time
import weakref
from pathlib import Path

from kmesh_lib.kv import native_build

SOURCE = Path(__file__).with_name("launch_thread.c")
LAUNCH_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)  # (exec, stream) -> error
QUERY_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)  # (event) -> 0 complete, NOT_READY, or an error
NOT_READY = 600  # CUDA_ERROR_NOT_READY: what ``query`` answers for an event not complete yet
BAD_IDS = -3  # KL_BAD_IDS: a request's block ids could not be packed; its launch was not made
ARGS_HEADER = 2  # KL_ARGS_HEADER: the arguments' int32 header the thread writes before packed ids (src_row0, num)
WAIT_TIMEOUT_S = 10.0  # a launch not made in this long is a stuck thread, not a slow one
NUM_SLOTS = 256  # KL_RING
SPIN_S = 0.002  # the thread spins this long after a launch (a step's restores come together)
POLL_S = 20e-6  # ... then sleeps this long between looks (its timer slack set to 1 ns)
WATCH_S = 10e-6  # the least time between two queries of a watched event (each is a driver call beside the engine's)
_IN_PLACE = platform.machine() in ("x86_64", "AMD64")  # stores reach another core in program order
MIN_CPUS_TO_RESERVE = 4  # below this many allowed CPUs the thread is not given a core of its own


def _siblings(cpu: int) -> set[int]:
    """``cpu`` and its SMT siblings (one physical core), from sysfs; just ``cpu`` where sysfs does not say."""
    path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    out = {cpu}
    try:
        for part in path.read_text().strip().split(","):
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    except (OSError, ValueError):
        pass
    return out


def reserve_core() -> tuple[int, set[int], set[int]] | None:
    """A core for the launch thread: the calling (engine) thread's highest allowed CPU, whose physical core the
    calling thread then leaves (``os.sched_setaffinity`` on it alone; threads it starts later inherit that).
    Returns (cpu, the core's CPUs, the calling thread's mask before), or None with fewer than
    ``MIN_CPUS_TO_RESERVE`` CPUs allowed. Why: a thread that spins on a CPU the engine thread is put on would
    take that thread's time slices. Measured on the H200 VM it did not explain what it was added for (a quarter to
    a third of off-thread restores stall the engine thread 0.08-0.13 ms right after their request, unpinned at
    43a9d5d and pinned at d2dc0f0 alike: docs/notes/gpu-restore-paths.md); it stays as the guard it is."""
    allowed = os.sched_getaffinity(0)
    if len(allowed) < MIN_CPUS_TO_RESERVE:
        return None
    cpu = max(allowed)
    core = _siblings(cpu) & allowed
    if len(allowed - core) < MIN_CPUS_TO_RESERVE - 1:
        return None
    os.sched_setaffinity(0, allowed - core)
    return cpu, core, allowed


class LaunchThreadError(RuntimeError):
    """The thread could not be built or started, or a launch it made failed."""


def build_library() -> Path:
    """The compiled library for this source (``native_build``). Raises ``LaunchThreadError`` naming the compiler's
    complaint."""
    return native_build.build_library(SOURCE, ("-lpthread",), LaunchThreadError)


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.kl_start.argtypes, lib.kl_start.restype = (vp, vp, vp, i64, i64, ctypes.c_int, vp, i64), vp
    lib.kl_request.argtypes = (vp, vp, vp, vp, vp, i64, i64, vp, ctypes.c_int32)
    lib.kl_request.restype = i64
    lib.kl_set_pack.argtypes, lib.kl_set_pack.restype = (vp, vp), None
    for name in ("kl_ids_slots", "kl_ids_first_slots", "kl_ids_num_slots", "kl_args_slots", "kl_src_row0_slots"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = (vp,), vp
    lib.kl_ended_counter.argtypes, lib.kl_ended_counter.restype = (vp,), ctypes.POINTER(i64)
    lib.kl_watch_error.argtypes, lib.kl_watch_error.restype = (vp,), ctypes.POINTER(ctypes.c_int)
    lib.kl_watch_slots.argtypes, lib.kl_watch_slots.restype = (vp,), vp
    lib.kl_counter.argtypes, lib.kl_counter.restype = (vp,), ctypes.POINTER(i64)
    lib.kl_requested.argtypes, lib.kl_requested.restype = (vp,), ctypes.POINTER(i64)
    lib.kl_exec_slots.argtypes, lib.kl_exec_slots.restype = (vp,), vp
    lib.kl_stream_slots.argtypes, lib.kl_stream_slots.restype = (vp,), vp
    lib.kl_cpu_ns.argtypes, lib.kl_cpu_ns.restype = (vp,), i64
    lib.kl_set_spin.argtypes, lib.kl_set_spin.restype = (vp, i64), None
    lib.kl_set_min_delay.argtypes, lib.kl_set_min_delay.restype = (vp, i64), None
    lib.kl_request_stamps.argtypes, lib.kl_request_stamps.restype = (vp,), vp
    lib.kl_slot_of.argtypes = (vp, i64, ctypes.POINTER(i64), ctypes.POINTER(i64), ctypes.POINTER(ctypes.c_int),
                               ctypes.POINTER(i64), ctypes.POINTER(i64))
    lib.kl_slot_of.restype = ctypes.c_int
    lib.kl_error_flag.argtypes, lib.kl_error_flag.restype = (vp,), ctypes.POINTER(ctypes.c_int)
    lib.kl_stop.argtypes, lib.kl_stop.restype = (vp,), None
    return lib


def _give_back(engine_tid: int, reserved: tuple | None) -> None:
    """The engine thread's CPU mask as it was before ``reserve_core`` (by its id: this may run on another thread)."""
    if reserved:
        try:
            os.sched_setaffinity(engine_tid, reserved[2])
        except OSError:
            pass  # the engine thread has ended


def _stop(kl_stop, handle: int, engine_tid: int, reserved: tuple | None) -> None:
    kl_stop(handle)
    _give_back(engine_tid, reserved)


def function_address(fn) -> int:
    """A ctypes function's (or callback's) C address."""
    return ctypes.cast(fn, ctypes.c_void_p).value


def busy_launch_address() -> int:
    """The C address of ``kl_busy_launch``: a launch that spins for its ``exec`` argument's nanoseconds and returns
    0, holding no lock and no GIL (a ctypes callback would take the GIL for its whole run)."""
    return function_address(_load(build_library()).kl_busy_launch)


class LaunchThread:
    """One native launch thread. ``launch``: the C address of ``int launch(void *exec, void *stream)``;
    ``set_context`` and ``context``: ``cuCtxSetCurrent`` and the context the thread makes current first
    (None: none); ``query``: the C address of ``int query(void *event)`` (``cuEventQuery``) for watched
    requests (None: no watching). Requests come from one thread (the engine's). Invariants: ``num_launched``
    only grows, and reaches a ticket only once that launch is made; ``copy_ended(ticket)`` is true only once the
    thread has queried that request's watched event complete after making its launch (stream order then says
    every earlier launch's copy on the same stream has ended too)."""

    def __init__(self, launch: int, set_context: int | None = None, context: int | None = None,
                 keep: object = None, spin_s: float = SPIN_S, poll_s: float = POLL_S, own_core: bool = False,
                 query: int | None = None, watch_s: float = WATCH_S) -> None:
        self._lib = lib = _load(build_library())
        self._keep = keep  # a callback handed in as ``launch`` must outlive the thread
        # own_core: the thread keeps to a core the calling thread leaves (``reserve_core``; None: shares them all)
        self.reserved = reserve_core() if own_core else None
        self._engine_tid = threading.get_native_id()
        cpu = self.reserved[0] if self.reserved else -1
        handle = lib.kl_start(launch, set_context, context, int(spin_s * 1e9), int(poll_s * 1e9), cpu, query,
                              int(watch_s * 1e9))
        if not handle:
            _give_back(self._engine_tid, self.reserved)
            raise LaunchThreadError("kl_start could not start a thread")
        self._handle = handle
        self._counter = lib.kl_counter(handle).contents  # read in place: no call into the library
        self._error = lib.kl_error_flag(handle).contents
        self._requested = lib.kl_requested(handle).contents
        self._ended = lib.kl_ended_counter(handle).contents
        self._watch_error = lib.kl_watch_error(handle).contents
        self._watch_slots = (ctypes.c_void_p * NUM_SLOTS).from_address(lib.kl_watch_slots(handle))
        self._exec_slots = (ctypes.c_void_p * NUM_SLOTS).from_address(lib.kl_exec_slots(handle))
        self._stream_slots = (ctypes.c_void_p * NUM_SLOTS).from_address(lib.kl_stream_slots(handle))
        self._request_stamps = (ctypes.c_int64 * NUM_SLOTS).from_address(lib.kl_request_stamps(handle))
        self._ids_slots = (ctypes.c_void_p * NUM_SLOTS).from_address(lib.kl_ids_slots(handle))
        self._ids_first_slots = (ctypes.c_int64 * NUM_SLOTS).from_address(lib.kl_ids_first_slots(handle))
        self._ids_num_slots = (ctypes.c_int64 * NUM_SLOTS).from_address(lib.kl_ids_num_slots(handle))
        self._args_slots = (ctypes.c_void_p * NUM_SLOTS).from_address(lib.kl_args_slots(handle))
        self._src_row0_slots = (ctypes.c_int32 * NUM_SLOTS).from_address(lib.kl_src_row0_slots(handle))
        self._ids_held: list = [None] * NUM_SLOTS  # each slot's id list, alive until the slot is reused
        self.packs_ids = False  # ``set_pack``: requests may carry their block ids for the thread to pack
        self.num_requested = 0
        self.spin_s, self.min_delay_s = spin_s, 0.0
        # on close, or when collected: the thread stopped and joined, then the engine thread's CPUs given back
        self._finalizer = weakref.finalize(self, _stop, lib.kl_stop, handle, self._engine_tid, self.reserved)

    @classmethod
    def for_cuda(cls) -> LaunchThread:
        """A thread that makes ``cuGraphLaunch`` calls in this thread's current CUDA context."""
        cuda = ctypes.CDLL("libcuda.so.1")
        ctx = ctypes.c_void_p()
        err = cuda.cuCtxGetCurrent(ctypes.byref(ctx))
        if err or not ctx.value:
            raise LaunchThreadError(f"no current CUDA context to hand the thread (cuCtxGetCurrent: {err})")
        return cls(function_address(cuda.cuGraphLaunch), function_address(cuda.cuCtxSetCurrent), ctx.value,
                   own_core=True, query=function_address(cuda.cuEventQuery))

    def placement(self) -> str:
        """Where the thread runs, in words."""
        if not self.reserved:
            return f"on any CPU (fewer than {MIN_CPUS_TO_RESERVE} allowed, or not asked for)"
        cpu, core, _ = self.reserved
        return f"on CPU {cpu}; the engine thread keeps off CPUs {sorted(core)}"

    @property
    def num_launched(self) -> int:
        return self._counter.value

    def set_pack(self, pack: int | None) -> None:
        """The C address of ``int pack(int32_t *dst, PyObject *list, int64_t first, int64_t num)`` that makes no
        Python API call (``id_pack.pack_into_address``); from now on requests may carry ids. None: none may."""
        self._lib.kl_set_pack(self._handle, pack)
        self.packs_ids = pack is not None

    def request(self, exec_handle: int, stream_handle: int, watch: int = 0, ids: tuple | None = None) -> int:
        """Queues one launch; returns its ticket (made once ``num_launched`` reaches it). ``watch``: an event
        (a pointer) the launch records last, whose completion the thread looks for (``copy_ended``). ``ids``
        (with ``set_pack``): ``(list, first, num, args_address, src_row0)``: the thread writes ``[src_row0, num,
        list[first:first + num]...]`` as int32 at ``args_address`` before the launch, reading the list without the
        GIL; it holds the list until the slot is reused, and the caller changes it only once the launch is made
        (``wait_for``). An id it cannot pack fails the launch (``BAD_IDS``). Waits while every slot holds a launch
        not made yet, or a watch not settled."""
        ticket = self.num_requested + 1
        if ticket - self._ended.value > NUM_SLOTS:
            self._wait_for_room(ticket - NUM_SLOTS)
        k = (ticket - 1) % NUM_SLOTS
        if ids is not None and not self.packs_ids:
            raise LaunchThreadError("a request carried block ids, but the thread was given no pack function")
        self._ids_held[k] = ids[0] if ids is not None else None
        if _IN_PLACE:
            self._exec_slots[k], self._stream_slots[k], self._watch_slots[k] = exec_handle, stream_handle, watch
            if ids is None:
                self._ids_slots[k] = None
            else:
                table, first, num, args, src_row0 = ids
                self._ids_first_slots[k], self._ids_num_slots[k] = first, num
                self._args_slots[k], self._src_row0_slots[k] = args, src_row0
                self._ids_slots[k] = id(table)  # the list object's address (CPython)
            self._request_stamps[k] = time.monotonic_ns()  # CLOCK_MONOTONIC, as the thread's own stamps
            self._requested.value = ticket  # after the slot: this store publishes it
        else:
            table, first, num, args, src_row0 = ids if ids is not None else (None, 0, 0, None, 0)
            self._lib.kl_request(self._handle, exec_handle, stream_handle, watch,
                                 None if table is None else id(table), first, num, args, src_row0)
        self.num_requested = ticket
        return ticket

    def _wait_for_room(self, ticket: int) -> None:
        """Returns once ``ticket``'s slot may be rewritten: its launch made, and its watch settled (or watching
        has stopped, ``watch_error``)."""
        self.wait_for(ticket)
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        while self._ended.value < ticket and not self._watch_error.value:
            if time.monotonic() > deadline:
                raise LaunchThreadError(f"launch {ticket}'s copy not seen ended in {WAIT_TIMEOUT_S:.0f} s")

    def copy_ended(self, ticket: int) -> bool:
        """Whether the thread has seen launch ``ticket``'s watched event complete (a counter read in place: no
        call into C or the driver), its launch and every earlier one having succeeded. False says only "not seen
        yet": the caller asks the event itself."""
        return self._ended.value >= ticket and not self._error.value

    @property
    def watch_error(self) -> int:
        """The first failed query's result (0: none; -1: a watch fell a ring behind); watching stops there."""
        return self._watch_error.value

    def ended_at(self, ticket: int) -> int | None:
        """When the thread saw launch ``ticket``'s watched event complete (``time.monotonic_ns`` clock); None:
        not seen (not yet, not watched, or its slot was reused)."""
        slot = self._slot(ticket)
        return None if slot is None else slot[3] or None

    def packed_at(self, ticket: int) -> int | None:
        """When the thread began packing launch ``ticket``'s ids (``time.monotonic_ns`` clock); None: it packed none,
        the launch is not made yet, or its slot was reused."""
        slot = self._slot(ticket)
        return None if slot is None else slot[4] or None

    def _slot(self, ticket: int) -> tuple[int, int, int, int, int] | None:
        """``kl_slot_of``: (begin, end, result, seen ended (0: not), began packing (0: not)) of a made launch; None
        while not made, or once its ring slot was reused."""
        t0, t1, err, t_ended, t_packed = (ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int(), ctypes.c_int64(),
                                          ctypes.c_int64())
        if self._lib.kl_slot_of(self._handle, ticket, ctypes.byref(t0), ctypes.byref(t1), ctypes.byref(err),
                                ctypes.byref(t_ended), ctypes.byref(t_packed)):
            return None
        return t0.value, t1.value, err.value, t_ended.value, t_packed.value

    def wait_for(self, ticket: int) -> None:
        """Returns once launch ``ticket`` (and every earlier one) has been made; raises if any failed."""
        counter = self._counter
        if counter.value < ticket:
            deadline = time.monotonic() + WAIT_TIMEOUT_S
            while counter.value < ticket:
                if time.monotonic() > deadline:
                    raise LaunchThreadError(f"launch {ticket} not made in {WAIT_TIMEOUT_S:.0f} s "
                                            f"({counter.value} of {self.num_requested} made)")
        err = self._error.value
        if err == BAD_IDS:
            raise LaunchThreadError("the launch thread could not pack a request's block ids (an id that is not an int "
                                    "below 2**30, or a range outside its list): that launch was not made")
        if err:
            raise LaunchThreadError(f"a launch made by the launch thread failed: CUresult {err}")

    def stamps(self, ticket: int) -> tuple[int, int, int] | None:
        """(begin, end, result) of a made launch, ``time.monotonic_ns`` clock; None while not made, or once its
        ring slot was reused (256 requests later)."""
        slot = self._slot(ticket)
        return None if slot is None else slot[:3]

    def set_spin(self, seconds: float) -> None:
        """How long the thread spins after a launch before it polls (0: it polls at once), from now on."""
        self._lib.kl_set_spin(self._handle, int(seconds * 1e9))
        self.spin_s = seconds

    def set_min_delay(self, seconds: float) -> None:
        """A launch begins no sooner than ``seconds`` after its request (0: as soon as the thread finds it), from
        now on. For experiments: on the H200 the engine thread's Python after the request stalled when the launch
        began within about 5 us of it (docs/notes/gpu-restore-paths.md)."""
        self._lib.kl_set_min_delay(self._handle, int(seconds * 1e9))
        self.min_delay_s = seconds

    def cpu_seconds(self) -> float | None:
        """The thread's own CPU time so far: what its polling, spinning and launches cost a core."""
        ns = self._lib.kl_cpu_ns(self._handle)
        return None if ns < 0 else ns / 1e9

    def close(self) -> None:
        """Makes every queued launch, then ends and joins the thread (also when collected), and gives the engine
        thread its CPUs back."""
        self._finalizer()
        self.reserved = None
