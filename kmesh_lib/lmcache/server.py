"""A real ``lmcache server`` (multiprocess mode) owned by one run: start, query, stop.

    L0  vLLM's paged KV (the engine)
    L1  the server's DRAM arena, shared with the vLLM worker through POSIX SHM or CUDA IPC  (``--l1-size-gb``)
    L2  the disk tier: lmcache's ``fs`` adapter with O_DIRECT under a run-scoped directory

The context is stored with ``--l2-store-policy skip_l1`` (L1 is dropped once the L2 write is done),
so it starts on the disk tier only. Two ways to run the server (``ServerConfig.mode``):

    launcher  ``python -m kmesh_lib.lmcache.launcher``: the stock server with kmesh's hooks installed
              before it serves (``server_plugin``): the retention switch (``set_retention``, one
              server runs both arms), the byte hook, the lookup and store traces, the singleflight
              switch (``set_singleflight``) and the warm-store guard switch (``set_warm_store_guard``;
              0.5.3 only, ``plugin_info`` says whether it installed). Works on LMCache 0.5.3 and 0.5.6.
    stock     the ``lmcache server`` console script, untouched: retention is the fixed
              ``--l2-prefetch-policy`` (``retain`` or ``default``), so each arm needs its own server;
              no byte hook (two byte counts: device and metrics), no traces, no singleflight, no guard.

Invariants:
    - every listener is on 127.0.0.1: the request port and the HTTP port (which also serves
      ``/metrics``; ``lmcache server`` starts no separate Prometheus listener); ``listeners()``
      reads the server's sockets (psutil) so callers can check it;
    - the server runs in its own process group inside a ``RuntimeDir``: stopping, exiting, a
      SIGTERM, or the owner's death (the janitor) kills the group and removes the disk tier and
      the SHM segment;
    - with ``keep_log``, the server's log (``server.log``: its stdout and stderr) is copied there, its
      last ``KEEP_MAX_BYTES``, whichever of those ways the server stops (``RuntimeDir.keep``): LMCache
      logs what it skipped (an L1 allocation that failed, a store it could not finish) only there.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kmesh_lib.base.paths import pythonpath_with_repo
from kmesh_lib.base.processes import RuntimeDir, kill_group, listening_sockets
from kmesh_lib.lmcache.tier_params import CHUNK_TOKENS

HOST = "127.0.0.1"
SERVER_ENV = {"LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1", "LMCACHE_DISABLE_BANNER": "1",
              "PYTHONUNBUFFERED": "1"}


class ServerStartError(RuntimeError):
    """The server exited or never became healthy; the message ends with its log tail."""


MODES = ("launcher", "stock")
STOP_GRACE_S = 1.0  # SIGTERM, then SIGKILL after this long
PREFETCH_POLICIES = {True: "retain", False: "default"}  # stock --l2-prefetch-policy for retain / discard


@dataclass(frozen=True)
class ServerConfig:
    arena_mib: int = 512  # L1 DRAM arena
    chunk_size: int = CHUNK_TOKENS
    store_policy: str = "skip_l1"  # the stored context ends up on the disk tier only
    eviction_policy: str = "LRU"
    mode: str = "launcher"  # launcher (kmesh hooks) or stock (the console script, fixed policy)
    stock_retain: bool = False  # stock mode only: --l2-prefetch-policy retain (True) or default (False)
    # NOTE: the CPU worker resolves its transfer mode to engine-driven, and with the server's 0.5.6
    # default (lmcache_driven) vLLM hangs in LLM() until mq_timeout; on CUDA ``auto`` resolves to
    # LMCache-driven CUDA IPC (0.5.3's default; forcing engine_driven there is not what was verified).
    transfer_mode: str = "engine_driven"
    startup_timeout_s: float = 180.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"ServerConfig.mode={self.mode!r}: choose from {', '.join(MODES)}")


def transfer_mode_for(device: str) -> str:
    """The ``--supported-transfer-mode`` the server needs for an engine on ``device``."""
    return "auto" if device == "cuda" else "engine_driven"


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago (bind port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def lmcache_executable() -> str:
    candidate = Path(sys.executable).with_name("lmcache")
    found = str(candidate) if candidate.exists() else shutil.which("lmcache")
    if not found:
        raise ServerStartError("no `lmcache` executable next to this Python or on PATH")
    return found


class LMCacheServer:
    """One ``lmcache server`` process. Use as a context manager or call ``start``/``stop``."""

    def __init__(self, cfg: ServerConfig, runtime: RuntimeDir, keep_log: Path | None = None) -> None:
        self.cfg = cfg
        self.runtime = runtime
        self.disk_dir = runtime.subdir("disk")
        self.control_file = runtime.path / "retention"
        self.singleflight_file = runtime.path / "singleflight"
        self.warm_store_guard_file = runtime.path / "warm_store_guard"
        self.io_log = runtime.path / "l2_io.jsonl"
        self.log_path = runtime.path / "server.log"
        if keep_log is not None:  # copied out when the runtime dir goes, however it goes
            runtime.keep(self.log_path, keep_log)
        self.shm_name = f"kmesh_{runtime.token.replace('-', '_')}"
        self.proc: subprocess.Popen | None = None
        self.port = self.http_port = 0
        # monotonic seconds: when the process was spawned, and when ``start`` first saw /status healthy
        self.spawned_at: float | None = None
        self.healthy_at: float | None = None

    @property
    def boot_s(self) -> float | None:
        """Seconds from spawn to the first healthy answer ``start`` saw: the boot itself when ``start``
        followed the spawn, an upper bound on it when ``begin`` spawned early (``start`` polls only
        once a caller waits)."""
        if self.spawned_at is None or self.healthy_at is None:
            return None
        return round(self.healthy_at - self.spawned_at, 2)

    @property
    def hooked(self) -> bool:
        """The retention switch, byte hook, traces, singleflight and warm-store guard live in this server."""
        return self.cfg.mode == "launcher"

    @property
    def retention_mechanism(self) -> str:
        """How retain vs discard is chosen in this server (a row label)."""
        if self.hooked:
            return "kmesh switch on one server (launcher hook on the prefetch policy's L1 retention)"
        return f"stock --l2-prefetch-policy {PREFETCH_POLICIES[self.cfg.stock_retain]} (one server per arm)"

    # -- lifecycle --
    def server_args(self) -> list[str]:
        """The ``lmcache server`` arguments (both modes)."""
        l2 = {"type": "fs", "base_path": str(self.disk_dir), "use_odirect": True}
        policy = "default" if self.hooked else PREFETCH_POLICIES[self.cfg.stock_retain]
        return ["--host", HOST, "--port", str(self.port), "--http-host", HOST, "--http-port", str(self.http_port),
                "--chunk-size", str(self.cfg.chunk_size),
                "--l1-size-gb", f"{self.cfg.arena_mib / 1024:.6f}", "--no-l1-use-lazy",
                "--eviction-policy", self.cfg.eviction_policy,
                "--supported-transfer-mode", self.cfg.transfer_mode, "--shm-name", self.shm_name,
                "--l2-adapter", json.dumps(l2),
                "--l2-store-policy", self.cfg.store_policy, "--l2-prefetch-policy", policy]

    def command(self) -> list[str]:
        if not self.hooked:
            return [lmcache_executable(), "server", *self.server_args()]
        hooks = {"io_log": str(self.io_log), "retention_file": str(self.control_file),
                 "singleflight_file": str(self.singleflight_file),
                 "warm_store_guard_file": str(self.warm_store_guard_file)}
        return [sys.executable, "-m", "kmesh_lib.lmcache.launcher", "--kmesh-hooks", json.dumps(hooks),
                *self.server_args()]

    def begin(self) -> LMCacheServer:
        """Spawns the server and returns at once (``start`` waits for it): the caller can do other
        work (import vLLM, start an engine) while the server boots (about 11 s on the H200)."""
        if self.proc is None:
            if self.hooked:
                self.set_retention(False)
                self.set_singleflight(False)
                self.set_warm_store_guard(False)
            self.port, self.http_port = free_port(), free_port()
            self._spawn()
        return self

    def start(self) -> LMCacheServer:
        """Spawns the server unless ``begin`` did, and waits until it is healthy (hooks ready)."""
        last_error = None
        for _attempt in range(3):  # a picked port can be taken before the server binds it
            try:
                self.begin()
                self._wait_healthy()
                return self
            except ServerStartError as e:
                last_error = e
                self._kill()
                if "Address already in use" not in str(e):
                    break
        raise last_error

    def _spawn(self) -> None:
        env = {**os.environ, **SERVER_ENV,
               "PYTHONPATH": pythonpath_with_repo()}
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=open(self.log_path, "ab"),
                                     stderr=subprocess.STDOUT, start_new_session=True, env=env,
                                     cwd=str(self.runtime.path))
        self.spawned_at, self.healthy_at = time.monotonic(), None
        self.runtime.own_group(self.proc.pid)  # start_new_session: its pid is its process group id
        self.runtime.own_shm(f"lmcache_l1_pool_{self.shm_name}")

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerStartError(f"lmcache server exited with {self.proc.returncode}\n{self.log_tail()}")
            try:
                if self.status().get("is_healthy") and self._plugin_ready():
                    self.healthy_at = time.monotonic()
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise ServerStartError(f"lmcache server not healthy after {self.cfg.startup_timeout_s:.0f} s\n{self.log_tail()}")

    def _plugin_ready(self) -> bool:
        if not self.hooked:
            return True
        return self.io_log.exists() and '"plugin_ready"' in self.io_log.read_text()

    def plugin_info(self) -> dict | None:
        """The hooks' install report (the ``plugin_ready`` line: fs adapters hooked, store controllers
        traced, whether the warm-store guard installed and why not); None for a stock server."""
        if not self.hooked or not self.io_log.exists():
            return None
        with open(self.io_log) as f:
            for line in f:
                if '"plugin_ready"' in line:
                    return {k: v for k, v in json.loads(line).items() if k not in ("op", "t_ns")}
        return None

    def _kill(self) -> None:
        if self.proc is not None:
            # NOTE: the server holds nothing worth a graceful exit (its disk tier is removed next), and it
            # rarely leaves within a few seconds of SIGTERM: a short grace saves ~5 s per engine run.
            kill_group(self.proc.pid, grace_s=STOP_GRACE_S)
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        """Kills the server's process group and removes the disk tier (the runtime dir goes too)."""
        self._kill()
        self.runtime.close()

    def __enter__(self) -> LMCacheServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""

    # -- control and queries --
    def set_retention(self, retain: bool) -> None:
        """Whether chunks loaded from L2 stay in L1 after they reached the engine (read per load).

        A stock server's retention is its fixed policy: asking it for the other one raises.
        """
        if not self.hooked:
            if retain != self.cfg.stock_retain:
                raise ServerStartError(f"a stock server runs --l2-prefetch-policy {PREFETCH_POLICIES[self.cfg.stock_retain]} "
                                       f"only; {'retain' if retain else 'discard'} needs its own server")
            return
        self._write_word(self.control_file, "retain" if retain else "discard")

    def set_singleflight(self, on: bool) -> None:
        """Whether a prefetch overlapping one in flight waits for it (launcher servers only)."""
        if not self.hooked:
            if on:
                raise ServerStartError("singleflight needs the launcher (ServerConfig.mode='launcher')")
            return
        self._write_word(self.singleflight_file, "on" if on else "off")

    def set_warm_store_guard(self, on: bool) -> None:
        """Whether keys a WARM prefetch's finish hands the store listener are kept from it (launcher
        servers only; a no-op where the guard did not install, see ``plugin_info``)."""
        if not self.hooked:
            if on:
                raise ServerStartError("the warm-store guard needs the launcher (ServerConfig.mode='launcher')")
            return
        self._write_word(self.warm_store_guard_file, "on" if on else "off")

    @staticmethod
    def _write_word(path: Path, word: str) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(word)
        os.replace(tmp, path)

    def _http(self, method: str, path: str, body: dict | None = None, timeout: float = 10.0):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://{HOST}:{self.http_port}{path}", data=data, method=method,
                                     headers={"content-type": "application/json"} if data else {})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read().decode()

    def status(self) -> dict:
        return json.loads(self._http("GET", "/status"))

    def metrics_text(self) -> str:
        return self._http("GET", "/metrics")

    def clear_l1(self) -> None:
        """Drops every unlocked L1 object (0.5.3: every object) -- the disk tier keeps its copy."""
        self._http("POST", "/cache/clear", {"tier": "l1", "force": False})

    def l1_usage(self) -> tuple[int, int]:
        """(bytes in use, arena bytes) of the L1 arena."""
        sm = self.status()["storage_manager"]
        if "l1_usage" in sm:  # 0.5.6
            used, total = sm["l1_usage"]
        else:  # 0.5.3 reports it per L1 manager only
            used, total = sm["l1_manager"]["memory_used_bytes"], sm["l1_manager"]["memory_total_bytes"]
        return int(used), int(total)

    def listeners(self) -> list[tuple[str, int]]:
        """(address, port) of every listening TCP socket the server's processes hold."""
        return listening_sockets(self.proc.pid)

    def connector_extra_config(self) -> dict:
        return {"lmcache.mp.host": f"tcp://{HOST}", "lmcache.mp.port": self.port}
