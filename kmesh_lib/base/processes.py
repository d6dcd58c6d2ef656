"""Run-scoped runtime directories for LMCache that nothing outlives.

    <RUNTIME_ROOT>/<token>/
        owner.json     owner pid + start time, the process groups and SHM segments to kill/unlink, and the
                       files to keep (``RuntimeDir.keep``: copied out before the directory goes)
        janitor.pid    the janitor watching the owner
        disk/          the disk tier (lmcache ``fs`` adapter or in-process LocalDiskBackend)
        ...            server log, control files, I/O log

Invariants:
    - a directory lives only as long as its owner process. ``close()`` (also run by ``atexit`` and
      by SIGTERM/SIGHUP handlers) kills every recorded process group, copies the files it keeps to
      their destinations (each its last ``max_bytes``), and removes the directory and its SHM segments;
    - when the owner dies without running Python cleanup (SIGKILL, OOM kill), the janitor -- a small
      process in its own session that polls the owner -- does the same within about a second;
    - when both are gone (a killed session), the next ``RuntimeDir.create`` reaps every directory
      whose owner no longer runs, killing any process group still alive in it.

A pid is identified with its start time (``/proc/<pid>/stat`` field 22), so a recycled pid never
keeps a stale directory alive.
"""
from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kmesh_lib.base.paths import REPO_ROOT, pythonpath_with_repo

RUNTIME_ROOT = Path(os.environ.get("KMESH_LMCACHE_RUNTIME", Path(tempfile.gettempdir()) / "kmesh-lmcache"))
SHM_DIR = Path("/dev/shm")
JANITOR_POLL_S = 0.5
KEEP_MAX_BYTES = 4 << 20  # a kept file's copy: its last 4 MiB (a server log's tail holds why it stopped)
_LIVE: dict[Path, RuntimeDir] = {}


def _stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state is [0], pgrp [2], start time [19])."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return stat.rsplit(")", 1)[1].split()


def process_start_time(pid: int) -> int | None:
    """Clock ticks since boot when ``pid`` started, or None when no such process runs."""
    fields = _stat(pid)
    if fields is None or fields[0] == "Z":  # a zombie has exited; only its exit status is left
        return None
    return int(fields[19])


def is_alive(pid: int, start_time: int | None) -> bool:
    now = process_start_time(pid)
    return now is not None and (start_time is None or now == start_time)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return bool(group_pids(pgid))


def kill_group(pgid: int, grace_s: float = 5.0) -> None:
    """SIGTERM the group, then SIGKILL whatever is left after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return
            time.sleep(0.05)


def group_pids(pgid: int) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            fields = _stat(int(p.name))
            if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
                pids.append(int(p.name))
    return pids


def listening_sockets(pgid: int | None = None, pids: list[int] | None = None) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket held by the processes of group ``pgid`` (or ``pids``)."""
    import psutil

    found = set()
    for pid in group_pids(pgid) if pids is None else pids:
        try:
            proc = psutil.Process(pid)
            # psutil < 6 (the GPU image may ship one) names it connections()
            conns = getattr(proc, "net_connections", None) or proc.connections
            conns = conns(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        found.update((c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN)
    return sorted(found)


def copy_tail(src: Path, dest: Path, max_bytes: int = KEEP_MAX_BYTES) -> None:
    """``src`` copied to ``dest`` (its folder made): all of it, or where it is longer than ``max_bytes`` its last
    ``max_bytes`` under one first line saying how many bytes were left out. Nothing where ``src`` is missing."""
    try:
        size = src.stat().st_size
    except FileNotFoundError:
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as f, open(dest, "wb") as out:
        if size > max_bytes:
            f.seek(size - max_bytes)
            out.write(f"[kmesh: the first {size - max_bytes:,} of {size:,} bytes left out]\n".encode())
        out.write(f.read(max_bytes))


def keep_files(path: Path, record: dict) -> None:
    """Copies each file the directory keeps (``RuntimeDir.keep``) to its destination; a copy that fails is said on
    stderr, never raised: what follows (removing the directory) must run."""
    for item in record.get("keep", []):
        try:
            copy_tail(path / item["src"], Path(item["dest"]), item["max_bytes"])
        except OSError as e:
            print(f"kmesh: could not keep {item['src']} as {item['dest']}: {e}", file=sys.stderr)


def remove_tree(path: Path, record: dict) -> None:
    for name in record.get("shm", []):
        (SHM_DIR / name).unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)


def reap(path: Path, record: dict) -> None:
    """Kills the directory's process groups, copies out the files it keeps (after the kill: a log holds its
    writer's last line), unlinks its SHM segments and removes it."""
    for pgid in record.get("pgids", []):
        kill_group(pgid, grace_s=2.0)
    keep_files(path, record)
    remove_tree(path, record)


def runtime_root(parent: str | Path | None = None) -> Path:
    """Where run-scoped directories live: ``RUNTIME_ROOT``, or a ``kmesh-lmcache`` folder of its own under a
    parent the user names (a disk, a RAID mount). Never the parent itself: ``reap_stale`` removes every
    directory under the root that has no live owner, which must never touch anything but kmesh's."""
    return Path(parent) / "kmesh-lmcache" if parent else RUNTIME_ROOT


def read_record(path: Path) -> dict | None:
    try:
        return json.loads((path / "owner.json").read_text())
    except (OSError, json.JSONDecodeError):  # no owner.json, or not a directory at all
        return None


def reap_stale(root: Path = RUNTIME_ROOT) -> list[str]:
    """Removes every directory under ``root`` whose owner is gone. Returns their names."""
    reaped = []
    if not root.is_dir():
        return reaped
    for path in sorted(root.iterdir()):
        record = read_record(path)
        if record is None:
            # owner.json is written right after mkdir: a directory without one older than a minute is debris
            if path.is_dir() and time.time() - path.stat().st_mtime > 60:
                shutil.rmtree(path, ignore_errors=True)
                reaped.append(path.name)
            continue
        if not is_alive(record["owner_pid"], record.get("owner_start")):
            reap(path, record)
            reaped.append(path.name)
    return reaped


class RuntimeDir:
    """One run-scoped directory, its janitor, and the process groups and SHM segments it owns."""

    def __init__(self, path: Path, record: dict) -> None:
        self.path = path
        self.record = record
        self.janitor: subprocess.Popen | None = None

    @classmethod
    def create(cls, prefix: str = "run", root: Path = RUNTIME_ROOT, janitor: bool = True) -> RuntimeDir:
        root.mkdir(parents=True, exist_ok=True)
        reap_stale(root)
        token = f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}"
        path = root / token
        path.mkdir()
        pid = os.getpid()
        rd = cls(path, {"token": token, "owner_pid": pid, "owner_start": process_start_time(pid),
                        "pgids": [], "shm": [], "created": time.time()})
        rd._write()
        if janitor:
            rd.janitor = subprocess.Popen(
                [sys.executable, "-m", "kmesh_lib.base.processes", "janitor", str(path)],
                start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=open(path / "janitor.log", "w"), cwd=str(REPO_ROOT),
                env={**os.environ, "PYTHONPATH": pythonpath_with_repo()})
            (path / "janitor.pid").write_text(str(rd.janitor.pid))
        _LIVE[path] = rd
        _install_handlers()
        return rd

    @property
    def token(self) -> str:
        return self.record["token"]

    def subdir(self, name: str) -> Path:
        d = self.path / name
        d.mkdir(exist_ok=True)
        return d

    def own_group(self, pgid: int) -> None:
        self.record["pgids"].append(pgid)
        self._write()

    def own_shm(self, name: str) -> None:
        self.record["shm"].append(name.lstrip("/"))
        self._write()

    def keep(self, src: Path, dest: Path, max_bytes: int = KEEP_MAX_BYTES) -> None:
        """``src`` (a file in this directory) is copied to ``dest`` when the directory goes, whichever way it goes:
        ``close``, the SIGTERM handler, the janitor after its owner's death, or the next ``create``'s reap."""
        rel = Path(src).resolve().relative_to(self.path.resolve())  # raises for a file outside: it would not go
        self.record.setdefault("keep", []).append({"src": str(rel), "dest": str(Path(dest).resolve()),
                                                   "max_bytes": int(max_bytes)})
        self._write()

    def _write(self) -> None:
        tmp = self.path / "owner.json.tmp"
        tmp.write_text(json.dumps(self.record))
        os.replace(tmp, self.path / "owner.json")

    def close(self) -> None:
        """Kills the owned groups, removes the directory and SHM segments, stops the janitor."""
        reap(self.path, self.record)
        if self.janitor is not None:
            self.janitor.terminate()
            try:
                self.janitor.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.janitor.kill()
                self.janitor.wait()
            self.janitor = None
        _LIVE.pop(self.path, None)


def close_all() -> None:
    for rd in list(_LIVE.values()):
        rd.close()


_HANDLERS_INSTALLED = False


def _install_handlers() -> None:
    """atexit plus SIGTERM/SIGHUP handlers that clean up, then chain to the previous handler."""
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(close_all)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            previous = signal.getsignal(sig)

            def handler(signum, frame, previous=previous):
                close_all()
                if callable(previous):
                    previous(signum, frame)
                elif previous != signal.SIG_IGN:
                    signal.signal(signum, signal.SIG_DFL)
                    os.kill(os.getpid(), signum)

            signal.signal(sig, handler)
        except ValueError:  # not the main thread: atexit and the janitor still cover us
            pass


def janitor_main(path: Path) -> int:
    """Polls the owner; when it is gone, reaps ``path``. Exits when ``path`` disappears."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        record = read_record(path)
        if record is None:
            if not path.exists():
                return 0
        elif not is_alive(record["owner_pid"], record.get("owner_start")):
            reap(path, record)
            return 0
        time.sleep(JANITOR_POLL_S)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "janitor":
        sys.exit(janitor_main(Path(sys.argv[2])))
    print("usage: python -m kmesh_lib.base.processes janitor <runtime dir>", file=sys.stderr)
    sys.exit(2)
