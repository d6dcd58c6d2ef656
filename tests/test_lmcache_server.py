"""The lmcache server's lifecycle: loopback only, and nothing left behind, even after a SIGKILL."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kmesh_lib.base.processes import RuntimeDir, group_alive, is_alive, listening_sockets, reap_stale
from kmesh_lib.lmcache.server import LMCacheServer, ServerConfig

REPO = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys, time
from pathlib import Path
from kmesh_lib.base.processes import RuntimeDir
from kmesh_lib.lmcache.server import LMCacheServer, ServerConfig
rd = RuntimeDir.create("test-child", root=Path(sys.argv[1]))
server = None
if sys.argv[2] == "server":
    keep = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    server = LMCacheServer(ServerConfig(arena_mib=16), rd, keep_log=keep).start()
print(json.dumps({"dir": str(rd.path), "pgid": server.pid if server else None,
                  "shm": rd.record["shm"], "janitor": rd.janitor.pid}), flush=True)
time.sleep(600)
"""


def wait_for(predicate, timeout_s: float = 120.0) -> bool:
    """Whether ``predicate`` comes true within ``timeout_s``: a guard against a hang, returning as soon as it does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def start_child(root: Path, what: str, *extra: str) -> tuple[subprocess.Popen, dict]:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(root), what, *extra], stdout=subprocess.PIPE, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)}, text=True)
    line = child.stdout.readline()
    assert line, "the child died before reporting"
    return child, json.loads(line)


def ss_listeners(pid: int) -> list[str] | None:
    """Local addresses ``ss -ltnp`` shows for ``pid``, or None without ss."""
    if shutil.which("ss") is None:
        return None
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    return [line.split()[3] for line in out.splitlines() if f"pid={pid}," in line]


@pytest.mark.cpu
def test_server_listens_on_loopback_only_and_stop_removes_everything(tmp_path):
    rd = RuntimeDir.create("test", root=tmp_path)
    t0 = time.monotonic()
    server = LMCacheServer(ServerConfig(arena_mib=16), rd).start()
    waited = time.monotonic() - t0
    try:
        assert server.status()["is_healthy"]
        booted = server.healthy_at - server.spawned_at  # spawn to healthy, within what start() waited
        assert 0 < booted <= waited and server.boot_s == round(booted, 2)
        listeners = server.listeners()  # from /proc/<pid>/net/tcp{,6}: every LISTEN socket the group holds
        assert {port for _, port in listeners} == {server.port, server.http_port}, listeners
        assert all(addr == "127.0.0.1" for addr, _ in listeners), listeners
        via_ss = ss_listeners(server.pid)
        if via_ss is not None:
            assert via_ss and all(a.startswith("127.0.0.1:") for a in via_ss), via_ss
        assert server.l1_usage() == (0, 16 << 20)
        assert (rd.path / "disk").is_dir() and server.io_log.exists()
    finally:
        pgid = server.pid
        server.stop()
    assert not group_alive(pgid)
    assert not rd.path.exists()
    assert not any(Path("/dev/shm").glob(f"*{server.shm_name}*"))


@pytest.mark.cpu
def test_killed_owner_leaves_no_server_and_no_disk_tier(tmp_path):
    child, info = start_child(tmp_path, "server")
    try:
        assert group_alive(info["pgid"]) and Path(info["dir"], "disk").is_dir()
        assert listening_sockets(info["pgid"])
        child.send_signal(signal.SIGKILL)  # no atexit, no handler: only the janitor can clean up
        child.wait()
        assert wait_for(lambda: not group_alive(info["pgid"]) and not Path(info["dir"]).exists()), \
            "the janitor left the server or its directory behind"
        assert not any((Path("/dev/shm") / name).exists() for name in info["shm"])
        assert wait_for(lambda: not is_alive(info["janitor"], None))
    finally:
        child.kill()
        child.wait()


@pytest.mark.cpu
def test_a_killed_owners_server_log_is_kept_where_asked(tmp_path):
    """The server's log outlives its runtime folder however the server stops: here its owner is SIGKILLed (as the
    GPU driver kills an overdue child), so only the janitor can copy it (H100, 6 Dec 2026: a store wrote 0 bytes and
    the one log that could say why went with the folder)."""
    kept = tmp_path / "run" / "logs" / "lmcache-server-m.log"
    child, info = start_child(tmp_path / "rt", "server", str(kept))
    try:
        assert not kept.exists()  # copied when the folder goes, not before
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert wait_for(lambda: not Path(info["dir"]).exists() and kept.exists())
        assert not group_alive(info["pgid"])
        assert "LMCache" in kept.read_text(errors="replace")  # the server's own output, to its last line
    finally:
        child.kill()
        child.wait()


def test_kept_files_are_copied_when_the_folder_goes_and_bounded_to_their_tail(tmp_path):
    rd = RuntimeDir.create("keep", root=tmp_path / "rt", janitor=False)
    small, big = rd.path / "small.log", rd.path / "big.log"
    small.write_text("one line\n")
    big.write_bytes(b"head" + b"x" * 100 + b"tail")
    rd.keep(small, tmp_path / "out" / "small.log")
    rd.keep(big, tmp_path / "out" / "big.log", max_bytes=20)
    rd.keep(rd.path / "never-written.log", tmp_path / "out" / "none.log")
    with pytest.raises(ValueError):  # a file outside the folder would not go with it
        rd.keep(tmp_path / "elsewhere.log", tmp_path / "out" / "x.log")
    assert not (tmp_path / "out").exists()
    rd.close()
    assert not rd.path.exists()
    assert (tmp_path / "out" / "small.log").read_text() == "one line\n"
    first, rest = (tmp_path / "out" / "big.log").read_bytes().split(b"\n", 1)
    assert first == b"[kmesh: the first 88 of 108 bytes left out]" and rest == b"x" * 16 + b"tail"
    assert not (tmp_path / "out" / "none.log").exists()


def test_sigterm_runs_cleanup_handlers(tmp_path):
    child, info = start_child(tmp_path, "none")
    child.send_signal(signal.SIGTERM)
    child.wait(timeout=120)  # a guard against a hang
    assert not Path(info["dir"]).exists()
    assert child.returncode == -signal.SIGTERM  # the handler cleaned up, then re-raised the default


def test_stale_directories_are_reaped_at_next_start(tmp_path):
    """A dead owner's directory and any process group it still lists are gone after the next create."""
    orphan = subprocess.Popen(["sleep", "600"], start_new_session=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / "stale-run"
    (stale / "disk").mkdir(parents=True)
    (stale / "disk" / "chunk.data").write_bytes(b"x" * 4096)
    (stale / "owner.json").write_text(json.dumps({"owner_pid": dead.pid, "owner_start": 1, "pgids": [orphan.pid],
                                                  "shm": []}))
    live = RuntimeDir.create("live", root=tmp_path, janitor=False)
    try:
        assert wait_for(lambda: orphan.poll() is not None)
        assert not stale.exists()
        assert reap_stale(tmp_path) == []  # the live owner's directory stays
        assert live.path.exists()
    finally:
        live.close()
        orphan.kill()
        orphan.wait()


@pytest.mark.cpu
def test_launcher_server_installs_the_hooks_and_switches_them(tmp_path):
    rd = RuntimeDir.create("test", root=tmp_path)
    server = LMCacheServer(ServerConfig(arena_mib=16), rd)
    assert server.command()[:3] == [sys.executable, "-m", "kmesh_lib.lmcache.launcher"]
    server.start()
    try:
        ready = [json.loads(line) for line in server.io_log.read_text().splitlines()]
        assert ready[0]["op"] == "plugin_ready" and ready[0]["fs_adapters"] == [str(server.disk_dir)]
        assert ready[0]["pid"] == server.pid  # the hooks live in the server process itself, not a plugin process
        pc = lambda: server.status()["storage_manager"]["prefetch_controller"]  # noqa: E731
        assert pc()["kmesh_singleflight"] == "off" and pc()["kmesh_parked_count"] == 0
        server.set_singleflight(True)
        assert pc()["kmesh_singleflight"] == "on"
        # LMCache 0.5.6 has no PrefetchMode.WARM: the warm-store guard installs nothing, and says so
        info = server.plugin_info()
        assert info["store_controllers"] == 1 and info["warm_store_guard"]["installed"] is False
        server.set_warm_store_guard(True)
        assert server.warm_store_guard_file.read_text() == "on" and pc()["kmesh_warm_store_guard"] == "not installed"
        server.set_retention(True)
        assert server.control_file.read_text() == "retain"
        assert "kmesh switch on one server" in server.retention_mechanism
    finally:
        server.stop()


@pytest.mark.cpu
def test_stock_server_fallback_is_one_fixed_policy_and_labelled(tmp_path):
    from kmesh_lib.lmcache.disk_accounting import ServerMeter
    from kmesh_lib.lmcache.server import ServerStartError

    rd = RuntimeDir.create("test", root=tmp_path)
    server = LMCacheServer(ServerConfig(arena_mib=16, mode="stock", stock_retain=True), rd)
    cmd = server.command()
    assert Path(cmd[0]).name == "lmcache" and cmd[1] == "server" and "--kmesh-hooks" not in cmd
    assert cmd[cmd.index("--l2-prefetch-policy") + 1] == "retain"
    server.start()
    try:
        assert server.status()["is_healthy"] and not server.io_log.exists()
        server.set_retention(True)  # its own policy: nothing to do
        with pytest.raises(ServerStartError, match="discard needs its own server"):
            server.set_retention(False)
        with pytest.raises(ServerStartError, match="singleflight needs the launcher"):
            server.set_singleflight(True)
        with pytest.raises(ServerStartError, match="warm-store guard needs the launcher"):
            server.set_warm_store_guard(True)
        assert server.plugin_info() is None
        assert server.retention_mechanism == "stock --l2-prefetch-policy retain (one server per arm)"
        meter = ServerMeter(server)
        assert meter.available == {"device": True, "hook": False, "metrics": True}
        snap = meter.snapshot()
        assert snap.hook_read_bytes is None and snap.exact and meter.trace_between(snap, snap) == []
    finally:
        server.stop()
    with pytest.raises(ValueError, match="ServerConfig.mode='plugin'"):
        ServerConfig(mode="plugin")


def test_launcher_command_line_errors_name_what_is_missing():
    from kmesh_lib.lmcache.launcher import split_argv

    with pytest.raises(SystemExit, match="usage: python -m kmesh_lib.lmcache.launcher --kmesh-hooks JSON"):
        split_argv(["--port", "1"])
    with pytest.raises(SystemExit, match="missing retention_file, singleflight_file, warm_store_guard_file"):
        split_argv(["--kmesh-hooks", json.dumps({"io_log": "x"}), "--port", "1"])
    cfg, rest = split_argv(["--kmesh-hooks", json.dumps({"io_log": "a", "retention_file": "b", "singleflight_file": "c",
                                                         "warm_store_guard_file": "d"}), "--port", "1"])
    assert cfg["io_log"] == "a" and rest == ["--port", "1"]


class FakeServer:
    """What ServerMeter reads from a server: its pid (this process), the I/O log, /metrics, L1 usage, disk dir."""

    hooked = True

    def __init__(self, tmp_path: Path, metrics: str) -> None:
        self.pid, self.io_log, self.disk_dir, self.metrics = os.getpid(), tmp_path / "io.jsonl", tmp_path, metrics
        self.io_log.write_text("")

    def metrics_text(self) -> str:
        return self.metrics

    def l1_usage(self):
        return 0, 1


def test_meter_counts_agree_to_the_byte_and_absent_lookup_metrics_are_not_zero(tmp_path):
    """LMCache 0.5.3 defines no per-tier lookup-hit counters: None, not 0. MP counts must agree exactly."""
    from kmesh_lib.lmcache.disk_accounting import MIB, PhaseReads, ServerMeter

    server = FakeServer(tmp_path, "")
    meter = ServerMeter(server)
    a = meter.snapshot()
    with open(server.io_log, "a") as f:
        f.write(json.dumps({"op": "read", "bytes": 3 * MIB, "expected": 3 * MIB}) + "\n")
        f.write(json.dumps({"op": "lookup", "t_ns": 1, "ext": "g-A", "pid": 0, "n_keys": 1, "k": [1]}) + "\n")
    server.metrics = "\n".join(["# TYPE lmcache_mp_l2_prefetch_load_completed_chunks counter",
                                "lmcache_mp_l2_prefetch_load_completed_chunks_total 1.0"])
    b = meter.snapshot()
    phase = PhaseReads.between(a, b, chunk_bytes=3 * MIB)
    assert phase.lookup_hit_l1_tokens is None and phase.lookup_hit_l2_tokens is None
    assert phase.hook_bytes == phase.metric_bytes == 3 * MIB and phase.tolerance_bytes == 0
    assert [e["op"] for e in meter.trace_between(a, b)] == ["lookup"]
    # the device count is this (test) process's, which read no chunk (a page of a lazily imported module at
    # most): the counts are apart, and MP tolerates no difference at all
    assert phase.device_bytes < phase.hook_bytes and not phase.agree()
    server.metrics += "\n# TYPE lmcache_mp_lookup_hit_l1_tokens counter\nlmcache_mp_lookup_hit_l1_tokens_total 256.0\n"
    assert PhaseReads.between(b, meter.snapshot(), 3 * MIB).lookup_hit_l1_tokens == 256
