"""The server plugin's store trace on LMCache 0.5.6's real objects (no server process).

A real ``StorageManager`` (L1 DRAM arena, ``fs`` L2 adapter with O_DIRECT, ``--l2-store-policy
skip_l1``) with ``install_hooks`` on it: a write into L1 is stored to L2 by the real store
controller and dropped from L1, and the trace says so.
"""
from __future__ import annotations

import json
import time

import pytest

lmcache_api = pytest.importorskip("lmcache.v1.distributed.api")

import torch  # noqa: E402
from lmcache.v1.distributed.config import parse_args  # noqa: E402
from lmcache.v1.distributed.storage_manager import StorageManager  # noqa: E402

from kmesh_lib.lmcache.server_plugin import install_hooks, key_ids  # noqa: E402

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


def wait_for(predicate, timeout_s: float = 10.0) -> bool:
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
           "singleflight_file": str(tmp_path / "singleflight")}
    try:
        yield sm, install_hooks(sm, cfg), tmp_path / "io.jsonl"
    finally:
        sm.close()


@pytest.mark.cpu
def test_store_trace_logs_the_store_controllers_l2_write_and_its_skip_l1_deletion(hooked):
    sm, info, log = hooked
    assert info["store_controllers"] == 1 and lines(log)[0]["op"] == "plugin_ready"
    ks = keys(4)
    objs = sm.reserve_write(ks, LAYOUT)
    assert set(objs) == set(ks)
    sm.finish_write(ks)  # a new write: the store controller stores it to L2, then (skip_l1) drops it from L1
    assert wait_for(lambda: any(r["op"] == "l1_delete" for r in lines(log)))
    recs = lines(log)
    submit = [r for r in recs if r["op"] == "store_submit"]
    done = [r for r in recs if r["op"] == "store_done"]
    delete = [r for r in recs if r["op"] == "l1_delete"]
    assert [r["k"] for r in submit] == [key_ids(ks)]
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
