"""The native launch thread (``kv.launch_thread``) on the CPU build, with a C-callable Python function in place of
``cuGraphLaunch``: launches are made in request order on another thread, a ticket is made only once its
launch returned, a failed launch is raised where the engine thread waits, stopping makes every queued launch
and joins the thread; and ``CopyGraphs`` neither rewrites an instance whose handed-off launch is not made yet
nor lets anything use a handed-off replay's events before it is (``gpu`` marker: on a device)."""
import os
import threading
import time
import types

import pytest
import torch

from kmesh_lib.kv import launch_thread as lt
from kmesh_lib.kv.launch_thread import (
    LAUNCH_FN,
    NOT_READY,
    QUERY_FN,
    LaunchThread,
    LaunchThreadError,
    function_address,
)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


class Recorder:
    """A launch function that records (exec, stream, thread) and returns ``err`` for exec ``fail_at``."""

    def __init__(self, fail_at: int | None = None, err: int = 700, delay_s: float = 0.0) -> None:
        self.calls, self.fail_at, self.err, self.delay_s = [], fail_at, err, delay_s
        self.fn = LAUNCH_FN(self._launch)

    def _launch(self, exec_handle, stream_handle):
        if self.delay_s:
            time.sleep(self.delay_s)
        self.calls.append((exec_handle, stream_handle, threading.get_ident()))
        return self.err if exec_handle == self.fail_at else 0

    def thread(self) -> LaunchThread:
        return LaunchThread(function_address(self.fn), keep=self.fn)


def test_launches_are_made_in_request_order_on_another_thread_and_stamped():
    rec = Recorder()
    t = rec.thread()
    tickets = [t.request(i, 1000 + i) for i in range(1, 41)]
    assert tickets == list(range(1, 41))
    t.wait_for(40)
    assert t.num_launched == 40 and [c[:2] for c in rec.calls] == [(i, 1000 + i) for i in range(1, 41)]
    assert {c[2] for c in rec.calls} != {threading.get_ident()} and len({c[2] for c in rec.calls}) == 1
    stamps = [t.stamps(k) for k in tickets]
    assert all(s is not None and s[0] <= s[1] and s[2] == 0 for s in stamps)
    assert all(a[1] <= b[0] for a, b in zip(stamps, stamps[1:]))  # one at a time, in order
    assert t.stamps(41) is None and t.stamps(0) is None  # not requested yet; no such ticket
    assert t.cpu_seconds() > 0
    t.close()


def test_a_ticket_is_made_only_once_its_launch_returned():
    rec = Recorder(delay_s=0.05)
    t = rec.thread()
    ticket = t.request(1, 2)
    assert t.num_launched == 0  # the launch is still sleeping in the callback
    t.wait_for(ticket)
    assert t.num_launched == 1 and rec.calls == [(1, 2, rec.calls[0][2])]
    t.close()


def test_a_failed_launch_is_raised_where_the_engine_thread_waits():
    rec = Recorder(fail_at=3, err=700)
    t = rec.thread()
    t.wait_for(t.request(1, 0))
    for k in range(2, 6):
        t.request(k, 0)
    with pytest.raises(LaunchThreadError, match="CUresult 700"):
        t.wait_for(5)
    assert t.stamps(3)[2] == 700 and t.stamps(4)[2] == 0
    t.close()


class Events:
    """A query function over fake events (ints): an event is complete once its id is in ``done``; ids in
    ``broken`` answer an error. Records every query (event, thread)."""

    def __init__(self, broken: tuple = ()) -> None:
        self.done, self.broken, self.queries = set(), set(broken), []
        self.fn = QUERY_FN(self._query)

    def _query(self, event):
        self.queries.append((event, threading.get_ident()))
        if event in self.broken:
            return 999
        return 0 if event in self.done else NOT_READY

    def thread(self, rec: Recorder, watch_s: float = 1e-5) -> LaunchThread:
        return LaunchThread(function_address(rec.fn), keep=(rec.fn, self.fn), query=function_address(self.fn),
                            watch_s=watch_s)


def _until(cond, timeout_s: float = 120.0) -> bool:
    """Whether ``cond`` holds within ``timeout_s``: a guard against a hang where it should come true (it returns
    as soon as it does), a short look where it must not."""
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(1e-3)
    return cond()


def test_a_watched_copy_counts_as_ended_only_once_its_event_is_queried_complete_in_ticket_order():
    rec, events = Recorder(), Events()
    t = events.thread(rec)
    first, second = t.request(1, 0, watch=101), t.request(2, 0, watch=102)
    t.wait_for(second)
    assert not _until(lambda: t.copy_ended(first), 0.05) and not t.copy_ended(second)
    assert {e for e, _ in events.queries} == {101}  # the oldest unseen copy first: stream order
    events.done.add(102)  # a later copy's event alone does not end the earlier ticket
    assert not _until(lambda: t.copy_ended(first), 0.05)
    events.done.add(101)
    assert _until(lambda: t.copy_ended(second)) and t.copy_ended(first)
    assert {tid for _, tid in events.queries} == {rec.calls[0][2]}  # queried by the launch thread
    assert t.ended_at(first) >= t.stamps(first)[1] and t.ended_at(second) >= t.ended_at(first)
    assert t.watch_error == 0
    unwatched = t.request(3, 0)  # nothing to watch: ended once made, with no stamp
    assert _until(lambda: t.copy_ended(unwatched)) and t.ended_at(unwatched) is None
    t.close()


def test_a_failed_query_stops_the_watching_and_nothing_more_counts_as_ended():
    rec, events = Recorder(), Events(broken=(201,))
    t = events.thread(rec)
    ticket = t.request(1, 0, watch=201)
    t.wait_for(ticket)
    assert _until(lambda: t.watch_error == 999)
    later = t.request(2, 0, watch=202)
    events.done.add(202)
    t.wait_for(later)
    assert not _until(lambda: t.copy_ended(later), 0.05) and not t.copy_ended(ticket)
    for k in range(3, 300):  # past the ring: room comes from the launches once watching has stopped
        t.request(k, 0)
    t.close()
    assert len(rec.calls) == 299


def test_a_copy_that_never_ends_does_not_keep_the_thread_from_stopping():
    before = _threads()
    rec, events = Recorder(), Events()
    t = events.thread(rec)
    t.wait_for(t.request(1, 0, watch=401))
    assert not _until(lambda: t.copy_ended(1), 0.05)
    t.close()
    assert _threads() == before


def test_a_failed_launch_is_not_reported_as_an_ended_copy():
    rec, events = Recorder(fail_at=1, err=700), Events()
    events.done.add(301)  # the event would read complete: the failed launch never recorded it anew
    t = events.thread(rec)
    ticket = t.request(1, 0, watch=301)
    with pytest.raises(LaunchThreadError):
        t.wait_for(ticket)
    assert not t.copy_ended(ticket)
    t.close()


def test_stopping_makes_every_queued_launch_and_joins_the_thread():
    before = _threads()
    rec = Recorder()
    t = rec.thread()
    assert _threads() == before + 1
    for k in range(1, 301):  # more than the ring holds: a request waits for room (with the GIL let go)
        t.request(k, 0)
    t.close()
    assert [c[0] for c in rec.calls] == list(range(1, 301))
    assert _threads() == before


def test_a_request_published_just_before_the_stop_is_still_made():
    """A loaded CI machine (6 Dec 2026) made 256 of 300: the thread had read num_requested, the last requests and the
    stop landed, and it stopped on the stop without reading num_requested again. Each round stops right after its
    last request, where that window is; every round must make every launch. The window is narrow: the old loop passes
    this on an idle machine (three runs here), so it is a net for the race, not a proof of its fix."""
    for num in (1, 2, 3, 17, 255, 256, 257) * 4:
        rec = Recorder()
        t = rec.thread()
        for k in range(1, num + 1):
            t.request(k, 0)
        t.close()
        assert [c[0] for c in rec.calls] == list(range(1, num + 1)), num


def test_the_library_is_built_once_per_source(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = lt.build_library()
    mtime = first.stat().st_mtime_ns
    assert lt.build_library() == first and first.stat().st_mtime_ns == mtime
    assert first.parent == tmp_path / "kmesh"


def test_without_a_compiler_the_error_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(lt.native_build.shutil, "which", lambda name: None)
    with pytest.raises((LaunchThreadError, FileNotFoundError)):
        lt.build_library()
    monkeypatch.delenv("CC")
    with pytest.raises(LaunchThreadError, match="no C compiler"):
        lt.build_library()


class FakeEvent:
    def __init__(self, done: bool = True) -> None:
        self.done = done

    def query(self) -> bool:
        return self.done


def _graphs_with(thread: LaunchThread, num_instances: int = 2):
    """A ``CopyGraphs`` without CUDA: its instances' arguments are plain buffers; only the bookkeeping runs."""
    from kmesh_lib.kv.copy_graph import CopyGraphs, GraphInstance

    g = CopyGraphs.__new__(CopyGraphs)
    g.buckets, g.thread, g.last_ticket, g._launch, g._stream_handles = [1, 2, 4], thread, 0, None, {}
    g.watching = False
    g.instances = {("layer", 4): [GraphInstance(None, None, None, memoryview(bytearray(64)), FakeEvent(), [FakeEvent()],
                                                exec_ptr=100 + i, end_ptr=500 + i) for i in range(num_instances)]}
    return g


class SideStream:
    cuda_stream = 77


def test_an_instance_whose_handed_off_launch_is_not_made_is_not_rewritten():
    rec = Recorder(delay_s=0.2)
    t = rec.thread()
    g = _graphs_with(t)
    first = g.replay("layer", 0, [1, 2, 3], stream=SideStream(), handoff=True)
    assert first.ticket == 1 and g.last_ticket == 1 and t.num_launched == 0
    second = g.replay("layer", 0, [4, 5, 6], stream=SideStream(), handoff=True)
    assert second is not first and second.ticket == 2  # the first is skipped: its launch has not read its arguments
    assert g.replay("layer", 0, [7, 8, 9], stream=SideStream(), handoff=True) is None  # both pending: the launch route
    g.await_launches()
    assert t.num_launched == 2 and [c[:2] for c in rec.calls] == [(100, 77), (101, 77)]
    assert g.replay("layer", 0, [7, 8, 9], stream=SideStream(), handoff=True) is first  # made: free again
    g.close()
    assert g.thread is None and all(i.ticket == 0 for i in g.instances[("layer", 4)])


def test_a_handed_off_replay_is_watched_by_its_last_event_and_counts_as_ended_only_while_watching():
    rec, events = Recorder(), Events()
    g = _graphs_with(events.thread(rec))
    inst = g.replay("layer", 0, [1, 2, 3], stream=SideStream(), handoff=True)
    g.await_launches()
    events.done.add(inst.end_ptr)
    assert _until(lambda: g.thread.copy_ended(inst.ticket))
    assert not g.copy_ended(inst.ticket)  # watching not checked on: the engine thread asks the event
    g.watching = True
    assert g.copy_ended(inst.ticket) and not g.copy_ended(0)  # ticket 0: launched by the engine thread
    assert {e for e, _ in events.queries} == {inst.end_ptr}
    assert g.copy_seen_ended_at(inst.ticket) >= g.launch_stamps(inst.ticket)[1]
    g.close()
    assert not g.watching and not g.copy_ended(inst.ticket)


def _packing_thread(rec: Recorder) -> LaunchThread:
    from kmesh_lib.kv import id_pack

    id_pack._route = None
    if id_pack.pack_into_address() is None:
        pytest.skip(id_pack.pack_via())
    t = rec.thread()
    t.set_pack(id_pack.pack_into_address())
    return t


class ArgsSeen(Recorder):
    """A launch that also reads, at the moment of the launch, the int32 arguments at ``args`` (what the graph's
    transfer would copy)."""

    def __init__(self, args, **kwargs) -> None:
        super().__init__(**kwargs)
        self.args, self.seen = args, []

    def _launch(self, exec_handle, stream_handle):
        self.seen.append(list(self.args))
        return super()._launch(exec_handle, stream_handle)


@pytest.mark.parametrize("in_place", [True, False])
def test_the_thread_packs_handed_over_ids_into_the_arguments_before_each_launch(monkeypatch, in_place):
    import ctypes

    monkeypatch.setattr(lt, "_IN_PLACE", in_place)
    args = (ctypes.c_int32 * 8)()
    rec = ArgsSeen(args)
    t = _packing_thread(rec)
    table = [900, 7, 70_000, 2**30 - 1, 0, 5, 6]
    first = t.request(1, 2, ids=(table, 1, 4, ctypes.addressof(args), 11))
    second = t.request(3, 4, ids=(table, 5, 2, ctypes.addressof(args), 12))
    plain = t.request(5, 6)  # no ids: the arguments stay as they are
    t.wait_for(plain)
    assert rec.seen == [[11, 4, 7, 70_000, 2**30 - 1, 0, 0, 0], [12, 2, 5, 6, 2**30 - 1, 0, 0, 0],
                        [12, 2, 5, 6, 2**30 - 1, 0, 0, 0]]
    assert [c[:2] for c in rec.calls] == [(1, 2), (3, 4), (5, 6)]
    p1, p2 = t.packed_at(first), t.packed_at(second)
    assert p1 and p2 and p1 <= t.stamps(first)[0] and t.packed_at(plain) is None  # packed, then launched
    t.close()


def test_ids_the_thread_cannot_pack_fail_their_launch_which_is_not_made():
    import ctypes

    args = (ctypes.c_int32 * 4)()
    rec = Recorder()
    t = _packing_thread(rec)
    t.wait_for(t.request(1, 0, ids=([3, 4], 0, 2, ctypes.addressof(args), 0)))
    bad = t.request(2, 0, ids=([3, 2**31], 0, 2, ctypes.addressof(args), 0))  # not an int below 2**30
    with pytest.raises(LaunchThreadError, match="could not pack a request's block ids"):
        t.wait_for(bad)
    assert [c[0] for c in rec.calls] == [1] and t.stamps(bad)[2] == lt.BAD_IDS
    t.close()
    plain = Recorder().thread()
    with pytest.raises(LaunchThreadError, match="no pack function"):
        plain.request(1, 0, ids=([3], 0, 1, ctypes.addressof(args), 0))
    plain.close()


def test_a_replay_with_unread_ids_has_the_thread_pack_them_and_elsewhere_packs_them_itself():
    import ctypes

    from kmesh_lib.kv.id_pack import IdRange

    rec = Recorder()
    g = _graphs_with(_packing_thread(rec))
    buffers = [(ctypes.c_int32 * 6)() for _ in range(2)]
    for inst, buf in zip(g.instances[("layer", 4)], buffers):
        inst.args_ptr, inst.args_view = ctypes.addressof(buf), memoryview(buf).cast("B")
    table = [10, 11, 12, 13, 14]
    inst = g.replay("layer", 3, IdRange(table, 1, 3), stream=SideStream(), handoff=True)
    g.await_launches()
    assert inst.ticket and list(buffers[0]) == [3, 3, 11, 12, 13, 0] and g.ids_packed_at(inst.ticket)
    replays = []
    for i in g.instances[("layer", 4)]:
        i.graph = types.SimpleNamespace(replay=lambda: replays.append(1))
    engine = g.replay("layer", 4, IdRange(table, 0, 3))  # launched by this thread: the ids are read here
    assert engine is inst and engine.ticket == 0 and replays == [1]
    assert list(buffers[0])[:5] == [4, 3, 10, 11, 12]
    g.close()


def test_await_launches_is_immediate_where_nothing_was_handed_off():
    g = _graphs_with(None)
    g.await_launches()  # no thread, no ticket: nothing to wait for
    assert g.launch_stamps(1) is None


@pytest.mark.gpu
@pytest.mark.parametrize("min_delay_s, unread", [(0.0, False), (20e-6, False), (0.0, True)])
def test_handed_off_graph_replays_write_the_engine_launchs_bytes(tmp_path, min_delay_s, unread):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from kmesh_lib.kv.fused_copy import triton_status
    from kmesh_lib.kv.gpu_buffer_arena import BufferArena
    from kmesh_lib.kv.id_pack import IdRange
    from kmesh_lib.kv.restore_timeline import RestoreTimeline

    if triton_status() is not None:
        pytest.skip(triton_status())
    num_blocks, num_layers = 600, 6
    kv_a = {f"l{i}": torch.zeros(2, num_blocks, 16, 2, 64, dtype=torch.bfloat16, device="cuda") for i in range(num_layers)}
    kv_b = {k: torch.zeros_like(v) for k, v in kv_a.items()}
    a, b = BufferArena(kv_a, num_blocks, 520, tmp_path), BufferArena(kv_b, num_blocks, 520, tmp_path)
    assert b.graph_route == "on" and b.graphs.thread is None  # started on first use, not with the arena
    assert b.graphs.start_thread() and b.graphs.thread_via.startswith("on"), b.graphs.thread_via
    thread = b.graphs.thread
    assert b.graphs.start_thread() and b.graphs.thread is thread  # once
    thread.set_min_delay(min_delay_s)  # a launch held back from its request copies the same bytes
    assert b.packs_ids_on_thread() == thread.packs_ids == ("packs handed-over block ids" in b.graphs.thread_via)
    if unread and not thread.packs_ids:
        pytest.skip(b.graphs.thread_via)
    noise = torch.randint(0, 256, a.buffer.shape, dtype=torch.uint8, device="cuda")
    a.buffer.copy_(noise)
    b.buffer.copy_(noise)
    gen = torch.Generator().manual_seed(1)
    for n in (3, 257, 500):
        block_ids = torch.randperm(num_blocks - 1, generator=gen)[:n].add(1).tolist()
        for t in (*kv_a.values(), *kv_b.values()):
            t.zero_()
        timelines = []
        for arena, handoff in ((a, False), (b, True)):
            tl = RestoreTimeline("restore", "r", 0, "buffer", n, 0, "cuda", ref=arena.reference(),
                                 t_start_ns=time.monotonic_ns())
            ids = IdRange([0, *block_ids, 0], 1, n) if handoff and unread else block_ids  # the thread packs these
            ends = arena.copy_into_vllm(7, 2, ids, tl, by_layer=True, handoff=handoff)
            for ready in ends:  # the forward pass's waits, as the connector makes them
                arena.reach_and_wait(ready)
            arena.order_after_reads()
            timelines.append(tl)
        torch.cuda.synchronize()
        assert [bool(tl.launch_ticket) for tl in timelines] == [False, True]
        assert all(torch.equal(kv_a[k].view(torch.uint8), kv_b[k].view(torch.uint8)) for k in kv_a), n
        t0, t1, err = b.launch_stamps(timelines[1].launch_ticket)
        assert err == 0 and timelines[1].t_ids_written_ns <= t1 and t0 <= t1
        assert t0 - timelines[1].t_ids_written_ns >= min_delay_s * 1e9  # the request is stamped after the ids
        timelines[1].t_thread_launch_begin_ns, timelines[1].t_thread_launch_end_ns = t0, t1  # as the connector does
        ticket = timelines[1].launch_ticket
        assert _until(lambda t=ticket: b.graphs.copy_ended(t)), b.graphs.watch_via  # the thread saw it end
        assert b.ended_by(ends[-1], ticket) == "thread" and b.ended_by(ends[-1]) == "query"
        timelines[1].t_thread_saw_end_ns = b.copy_seen_ended_at(ticket)
        timelines[1].t_thread_packed_ns = b.ids_packed_at(ticket)
        rec = timelines[1].record()
        assert rec["launched_by"] == "thread" and rec["copy_s"] > 0 and rec["thread_lag_s"] > 0
        assert rec["ids_packed_by"] == ("thread" if unread else "engine")
        assert (rec["thread_pack_s"] is not None and 0 <= rec["thread_pack_s"] < rec["thread_lag_s"]) == unread
        assert rec["thread_saw_end_s"] > -1e-5  # after the copy's end, up to the clock reference's error
    assert b.graphs.watch_via.startswith("on"), b.graphs.watch_via
    b.graphs.close()
    assert b.graphs.thread is None


@pytest.mark.gpu
def test_a_launch_thread_whose_check_fails_is_not_kept(tmp_path, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from kmesh_lib.kv.fused_copy import triton_status
    from kmesh_lib.kv.gpu_buffer_arena import BufferArena

    if triton_status() is not None:
        pytest.skip(triton_status())
    rec = Recorder()  # launches nothing: the check's bytes never land
    monkeypatch.setattr(LaunchThread, "for_cuda", classmethod(lambda cls: rec.thread()))
    kv = {f"l{i}": torch.zeros(2, 64, 16, 2, 64, dtype=torch.bfloat16, device="cuda") for i in range(2)}
    b = BufferArena(kv, 64, 40, tmp_path)
    assert b.graph_route == "on" and not b.graphs.start_thread()
    assert b.graphs.thread is None and b.graphs.thread_via.startswith("off (the"), b.graphs.thread_via
    assert rec.calls  # it was asked, and its replays did not land


def test_the_portable_request_publishes_the_same_launches(monkeypatch):
    monkeypatch.setattr(lt, "_IN_PLACE", False)  # kl_request's release store, as on hosts other than x86-64
    rec = Recorder()
    t = rec.thread()
    for k in range(1, 6):
        assert t.request(k, 10 * k) == k
    t.wait_for(5)
    assert [c[:2] for c in rec.calls] == [(k, 10 * k) for k in range(1, 6)]
    t.close()


def test_the_thread_gets_a_core_the_engine_thread_leaves_and_gives_back(monkeypatch):
    masks = {}
    me = threading.get_native_id()
    monkeypatch.setattr(lt.os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(lt.os, "sched_setaffinity", lambda pid, cpus: masks.__setitem__(me if pid == 0 else pid, set(cpus)))
    monkeypatch.setattr(lt, "_siblings", lambda cpu: {cpu, cpu - 4})  # 4 cores of 2 threads: 7 pairs with 3
    rec = Recorder()
    t = LaunchThread(function_address(rec.fn), keep=rec.fn, own_core=True)
    assert t.reserved[:2] == (7, {3, 7}) and masks[me] == {0, 1, 2, 4, 5, 6}
    assert "CPU 7" in t.placement() and "[3, 7]" in t.placement()
    t.wait_for(t.request(1, 2))
    t.close()
    assert masks[me] == set(range(8)) and t.reserved is None


def test_with_few_cpus_the_thread_shares_them(monkeypatch):
    monkeypatch.setattr(lt.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(lt.os, "sched_setaffinity", lambda pid, cpus: pytest.fail("no CPU should be reserved"))
    rec = Recorder()
    t = LaunchThread(function_address(rec.fn), keep=rec.fn, own_core=True)
    assert t.reserved is None and "any CPU" in t.placement()
    t.close()


def test_the_spin_is_set_while_the_thread_runs():
    rec = Recorder()
    t = rec.thread()
    t.set_spin(0.0)  # it polls at once after each launch
    assert t.spin_s == 0.0
    for k in range(1, 4):
        t.wait_for(t.request(k, 0))
    t.set_spin(0.001)
    t.wait_for(t.request(4, 0))
    assert [c[0] for c in rec.calls] == [1, 2, 3, 4]
    t.close()


def test_a_thread_collected_without_close_is_stopped_and_gives_its_core_back(monkeypatch):
    import gc

    masks = {}
    me = threading.get_native_id()
    monkeypatch.setattr(lt.os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(lt.os, "sched_setaffinity", lambda pid, cpus: masks.__setitem__(me if pid == 0 else pid, set(cpus)))
    monkeypatch.setattr(lt, "_siblings", lambda cpu: {cpu})
    before = _threads()
    rec = Recorder()
    t = LaunchThread(function_address(rec.fn), keep=rec.fn, own_core=True)
    assert masks[me] == set(range(7)) and _threads() == before + 1
    t.wait_for(t.request(1, 2))
    del t
    gc.collect()
    assert masks[me] == set(range(8)) and _threads() == before


def test_the_busy_launch_takes_its_time_on_the_thread_and_holds_no_gil():
    """``kl_busy_launch`` spins for its exec argument's nanoseconds on the launch thread; the requesting thread's
    Python keeps running meanwhile (a ctypes callback would hold the GIL for the whole launch)."""
    t = LaunchThread(lt.busy_launch_address())
    try:
        t_request = time.monotonic_ns()
        ticket = t.request(50_000_000, 0)  # 50 ms
        num_loops = 0
        while t.num_launched < ticket:
            num_loops += 1
        begin, end, err = t.stamps(ticket)
        assert err == 0 and end - begin >= 50_000_000 and begin >= t_request
        assert num_loops > 1000  # the Python loop ran through the launch
    finally:
        t.close()


@pytest.mark.parametrize("in_place", [True, False])
def test_a_least_delay_holds_each_launch_back_from_its_request(monkeypatch, in_place):
    monkeypatch.setattr(lt, "_IN_PLACE", in_place and lt._IN_PLACE)  # the request stamped by Python, or by kl_request
    t = LaunchThread(lt.busy_launch_address(), spin_s=0.01)  # spinning: without the delay it finds a request at once
    try:
        t.set_min_delay(0.002)
        assert t.min_delay_s == 0.002
        for _ in range(3):
            t_request = time.monotonic_ns()
            ticket = t.request(1000, 0)
            t.wait_for(ticket)
            begin, _, err = t.stamps(ticket)
            assert err == 0 and begin - t_request >= 2_000_000
        t.set_min_delay(3600.0)  # an hour: a launch requested now is held until the delay is lifted
        ticket = t.request(1000, 0)
        time.sleep(0.05)  # room for a thread that ignored the delay to launch it
        assert t.num_launched < ticket and t.stamps(ticket) is None
        t_release = time.monotonic_ns()
        t.set_min_delay(0.0)  # from now on at once: the held launch goes, and begins only after its release
        t.wait_for(ticket)
        begin, _, err = t.stamps(ticket)
        assert err == 0 and begin >= t_release
    finally:
        t.set_min_delay(0.0)  # a launch still held would keep the thread from ever seeing close
        t.close()
