"""The server plugin's store trace and warm-store guard on LMCache 0.5.6's real objects (no server process).

A real ``StorageManager`` (L1 DRAM arena, ``fs`` L2 adapter with O_DIRECT, ``--l2-store-policy
skip_l1``) with ``install_hooks`` on it: a write into L1 is stored to L2 by the real store
controller and dropped from L1, and the trace says so. The guard cannot install on 0.5.6 (no
``PrefetchMode.WARM``; its warm prefetch ends with ``finish_write_and_reserve_read``); its two
parts are run against a real ``L1Manager`` and ``StoreListener``: ``finish_write`` inside a WARM
finish with the guard on enqueues nothing, with it off enqueues the keys and remembers them.
"""
from __future__ import annotations

import enum
import json
import time
import types

import pytest

lmcache_api = pytest.importorskip("lmcache.v1.distributed.api")

import torch  # noqa: E402
from lmcache.v1.distributed.config import parse_args  # noqa: E402
from lmcache.v1.distributed.l1_manager import L1Manager  # noqa: E402
from lmcache.v1.distributed.storage_controllers.store_controller import StoreListener  # noqa: E402
from lmcache.v1.distributed.storage_manager import StorageManager  # noqa: E402

from kmesh_lib.lmcache.server_plugin import (  # noqa: E402
    IOLog,
    StoreTrace,
    guard_store_listener,
    install_hooks,
    is_warm,
    key_ids,
    warm_finish,
)

CHUNK = 4096  # one O_DIRECT block per object
LAYOUT = lmcache_api.MemoryLayoutDesc([torch.Size([CHUNK])], [torch.uint8])


def config(disk):
    return parse_args(["--l1-size-gb", "0.0625", "--no-l1-use-lazy", "--eviction-policy", "LRU",
                       "--l2-adapter", json.dumps({"type": "fs", "base_path": str(disk), "use_odirect": True}),
                       "--l2-store-policy", "skip_l1"])


def keys(n: int, salt: int = 0) -> list:
    return [lmcache_api.ObjectKey(chunk_hash=bytes([salt, i]) * 16, model_name="m", kv_rank=0) for i in range(n)]


def lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def wait_for(predicate, timeout_s: float = 120.0) -> bool:
    """Whether ``predicate`` comes true within ``timeout_s``: a guard against a hang, returning as soon as it does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def hooked(tmp_path):
    sm = StorageManager(config(tmp_path / "disk"))
    cfg = {"io_log": str(tmp_path / "io.jsonl"), "retention_file": str(tmp_path / "retention"),
           "singleflight_file": str(tmp_path / "singleflight"), "warm_store_guard_file": str(tmp_path / "guard")}
    try:
        yield sm, install_hooks(sm, cfg), tmp_path / "io.jsonl", tmp_path / "guard"
    finally:
        sm.close()


@pytest.mark.cpu
def test_store_trace_logs_the_store_controllers_l2_write_and_its_skip_l1_deletion(hooked):
    sm, info, log, guard_file = hooked
    ks = keys(4)
    objs = sm.reserve_write(ks, LAYOUT)
    assert set(objs) == set(ks)
    sm.finish_write(ks)  # a new write: the store controller stores it to L2, then (skip_l1) drops it from L1
    assert wait_for(lambda: any(r["op"] == "l1_delete" for r in lines(log)))
    recs = lines(log)
    submit = [r for r in recs if r["op"] == "store_submit"]
    done = [r for r in recs if r["op"] == "store_done"]
    delete = [r for r in recs if r["op"] == "l1_delete"]
    assert [(r["k"], r["warm_keys"]) for r in submit] == [(key_ids(ks), 0)]
    assert [(r["task"], r["ok"], r["bytes"], r["k"]) for r in done] == [(submit[0]["task"], True, 4 * CHUNK, key_ids(ks))]
    assert [(r["by"], sorted(r["k"]), r["locked"]) for r in delete] == [("store", sorted(key_ids(ks)), [])]
    assert sum(r["bytes"] for r in recs if r["op"] == "write") == 4 * CHUNK  # the fs hook: the bytes on disk
    assert submit[0]["t_ns"] <= done[0]["t_ns"] <= delete[0]["t_ns"]
    assert wait_for(lambda: sm.get_l1_usage()[0] == 0)

    # stored again (as 0.5.3 does with a warm prefetch's keys): the fs adapter finds the files and writes
    # nothing, yet reports the store done, and skip_l1 drops the keys from L1 again
    sm.reserve_write(ks, LAYOUT)
    sm.finish_write(ks)
    assert wait_for(lambda: sum(r["op"] == "l1_delete" for r in lines(log)) == 2)
    again = [r for r in lines(log) if r["op"] == "store_done"][-1]
    assert again["ok"] and again["bytes"] == 0
    assert sum(r["bytes"] for r in lines(log) if r["op"] == "write") == 4 * CHUNK


@pytest.mark.cpu
def test_on_lmcache_056_the_guard_installs_nothing_and_says_why(hooked):
    sm, info, log, guard_file = hooked
    assert info["store_controllers"] == 1 and info["fs_adapters"]
    assert info["warm_store_guard"]["installed"] is False and "PrefetchMode.WARM" in info["warm_store_guard"]["detail"]
    assert lines(log)[0]["op"] == "plugin_ready" and lines(log)[0]["warm_store_guard"] == info["warm_store_guard"]
    listener = sm._store_controller._listener
    assert "on_l1_keys_write_finished" not in vars(listener)  # the stock listener method, unwrapped
    guard_file.write_text("on")
    assert sm._prefetch_controller.report_status()["kmesh_warm_store_guard"] == "not installed"


def test_a_warm_request_is_told_by_its_mode_not_by_the_modes_own_attributes():
    """0.5.3's request carries ``mode`` (PrefetchMode), 0.5.6's ``lock_mode`` (PrefetchLockMode).

    NOTE: the first guard (686da3f) asked ``_mode(request.mode)``, which is "None" for every request,
    so it never fired on the H200; ``is_warm`` takes the request.
    """
    class PrefetchMode(enum.Enum):  # lmcache 0.5.3 ``lmcache.v1.distributed.api.PrefetchMode``
        LOOKUP = enum.auto()
        WARM = enum.auto()

    assert is_warm(types.SimpleNamespace(mode=PrefetchMode.WARM))
    assert not is_warm(types.SimpleNamespace(mode=PrefetchMode.LOOKUP))
    assert not is_warm(types.SimpleNamespace(lock_mode=lmcache_api.PrefetchLockMode.NO_LOCK))
    assert not hasattr(lmcache_api, "PrefetchMode")  # 0.5.6: which is why the guard installs nothing here


@pytest.mark.cpu
def test_the_guard_keeps_a_warm_finishs_keys_from_a_real_store_listener(tmp_path):
    """A real L1Manager calls the wrapped real StoreListener inside its lock, on this thread."""
    l1 = L1Manager(config(tmp_path / "disk").l1_manager_configs[0])
    listener = StoreListener()
    l1.register_listener(listener)
    log = IOLog(str(tmp_path / "io.jsonl"))
    trace = StoreTrace(types.SimpleNamespace(), log)  # no store controller: only its warm-key memory is used
    guard_store_listener(listener, trace, log)

    def write(ks, tag="w"):
        assert all(err.name == "SUCCESS" for err, _ in l1.reserve_write(ks, [False] * len(ks), LAYOUT, tag=tag).values())
        assert all(err.name == "SUCCESS" for err in l1.finish_write(ks, tag=tag).values())

    try:
        a, b, c = keys(2, 1), keys(2, 2), keys(2, 3)
        write(a)  # outside a WARM finish: the listener's own behaviour, a new write to store
        assert listener.pop_pending_keys() == a
        with warm_finish(guard=True):  # a WARM finish with the guard on: nothing for the store controller
            write(b)
        assert listener.pending_count() == 0
        with warm_finish(guard=False):  # the guard off (stock 0.5.3): enqueued, and remembered as warm
            write(c)
        assert listener.pop_pending_keys() == c and trace.take_warm(c + a) == 2 and trace.take_warm(c) == 0
        recs = [r for r in lines(tmp_path / "io.jsonl")]
        assert [(r["op"], r["k"]) for r in recs] == [("warm_store_skipped", key_ids(b)), ("warm_handoff", key_ids(c))]
        write(keys(1, 4))  # the thread is no longer marked once the finish is over
        assert listener.pending_count() == 1
    finally:
        listener.close()
        l1.close()


@pytest.mark.cpu
def test_a_store_reservation_says_what_it_reserved_and_why_the_rest_was_not(hooked):
    """A store whose L1 reservation fails commits nothing and tells the engine nothing (0.5.3's
    ``LMCacheDrivenTransferModule.store`` reports success): the ``store_reserve`` line is where it shows,
    naming the L1 error of each key left out and the arena's bytes before it."""
    sm, info, log, guard_file = hooked
    assert info["l1_managers"] == 1
    used0, total = sm.get_l1_usage()
    big = lmcache_api.MemoryLayoutDesc([torch.Size([total // 3])], [torch.uint8])  # three of them: more than the arena
    ks = keys(3, salt=7)
    assert sm.reserve_write(ks, big) == {}  # all or nothing: one object too many and none is reserved
    first = keys(2, salt=8)
    assert set(sm.reserve_write(first, big)) == set(first)  # two fit
    sm.finish_write(first)
    recs = [r for r in lines(log) if r["op"] == "store_reserve"]
    assert [(r["n_keys"], r["reserved"], r["errors"], r["l1_used"], r["l1_total"]) for r in recs] == [
        (3, 0, {"OUT_OF_MEMORY": 3}, used0, total), (2, 2, {}, used0, total)]
    again = sm.reserve_write(first[:1], LAYOUT)  # already in L1 (until skip_l1 drops it after its L2 write)
    last = [r for r in lines(log) if r["op"] == "store_reserve"][-1]
    assert last["n_keys"] == 1 and last["reserved"] == len(again) and last["errors"] in ({}, {"KEY_NOT_WRITABLE": 1})


@pytest.mark.cpu
def test_a_clear_before_the_store_controller_has_the_keys_loses_the_store_and_the_trace_shows_it(hooked):
    """LMCache 0.5.3's ``/cache/clear`` forces (``ManagementModule.clear``): a clear after a store's chunks were
    committed to L1 but before the store controller read-locked them for their L2 write frees them, and the store
    writes nothing while the server's status shows nothing in flight. Here the store loop is held between popping the
    keys and taking them (the window) while the clear runs; the trace then names the signature: the reservation
    succeeded, no L2 store was submitted, no byte written."""
    import threading

    sm, info, log, guard_file = hooked
    sc = sm._store_controller
    popped, go = threading.Event(), threading.Event()
    process = sc._process_new_keys

    def held(keys):
        popped.set()
        go.wait(60)
        return process(keys)

    sc._process_new_keys = held
    ks = keys(4, salt=9)
    assert set(sm.reserve_write(ks, LAYOUT)) == set(ks)
    sm.finish_write(ks)
    assert popped.wait(60)
    status = sc.report_status()
    assert status["pending_keys_count"] == 0 and status["in_flight_task_count"] == 0  # what settle() sees: idle
    sm.clear(force=True)
    go.set()
    assert wait_for(lambda: sc.report_status()["in_flight_task_count"] == 0)
    time.sleep(0.5)  # a store submitted after the clear would show within this
    recs = lines(log)
    assert [(r["reserved"], r["errors"]) for r in recs if r["op"] == "store_reserve"] == [(4, {})]
    assert [r for r in recs if r["op"] in ("store_submit", "write")] == []
    assert sm.get_l1_usage()[0] == 0
