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
    server = LMCacheServer(ServerConfig(arena_mib=16), rd).start()
print(json.dumps({"dir": str(rd.path), "pgid": server.pid if server else None,
                  "shm": rd.record["shm"], "janitor": rd.janitor.pid}), flush=True)
time.sleep(600)
"""


def wait_for(predicate, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def start_child(root: Path, what: str) -> tuple[subprocess.Popen, dict]:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(root), what], stdout=subprocess.PIPE, cwd=REPO,
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
    server = LMCacheServer(ServerConfig(arena_mib=16), rd).start()
    try:
        assert server.status()["is_healthy"]
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


def test_sigterm_runs_cleanup_handlers(tmp_path):
    child, info = start_child(tmp_path, "none")
    child.send_signal(signal.SIGTERM)
    child.wait(timeout=10)
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
        assert wait_for(lambda: orphan.poll() is not None, 10)
        assert not stale.exists()
        assert reap_stale(tmp_path) == []  # the live owner's directory stays
        assert live.path.exists()
    finally:
        live.close()
        orphan.kill()
        orphan.wait()
