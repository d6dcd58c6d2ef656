"""The router's handle on one engine process (``worker.py`` is the process itself).

Invariants:
    - the engine process leads its own process group, recorded in the fleet's ``RuntimeDir`` before
      anything else happens: the router's exit, a SIGTERM, or the router's death (the janitor)
      kills it;
    - ``stop`` returns what happened (exit code, whether the group is gone), measured after the fact.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from multiprocessing.connection import Connection

from kmesh_lib.base.paths import pythonpath_with_repo
from kmesh_lib.base.processes import RuntimeDir, group_alive, kill_group


class EngineStartError(RuntimeError):
    """The engine process exited or reported an error before it was ready; the message says why."""


class EngineProcess:
    """The router's side of one engine process."""

    def __init__(self, index: int, runtime: RuntimeDir, spec: dict) -> None:
        self.index = index
        self.runtime = runtime
        self.spec = spec  # engine params, server address, threads: see ``main``
        self.log_path = runtime.path / f"engine{index}.log"
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.ready: dict = {}
        self.dead_reason: str | None = None  # set once the router saw the process gone

    def start(self) -> EngineProcess:
        parent_sock, child_sock = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": pythonpath_with_repo(), "PYTHONUNBUFFERED": "1"}
        env.update(self.spec.get("env", {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kmesh_lib.sections.multi_engine.worker", str(child_sock.fileno()),
             json.dumps(self.spec)],
            pass_fds=(child_sock.fileno(),), start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT, env=env, cwd=str(self.runtime.path))
        self.runtime.own_group(self.proc.pid)  # start_new_session: its pid is its process group id
        child_sock.close()
        self.conn = Connection(parent_sock.detach())
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def expect(self, op: str, timeout_s: float) -> dict:
        """The next message, which must be ``op``; an error or an exit raises EngineStartError."""
        if not self.conn.poll(timeout_s):
            raise EngineStartError(f"engine {self.index}: no {op!r} within {timeout_s:.0f} s\n{self.log_tail()}")
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):
            self.proc.wait(timeout=10)
            raise EngineStartError(f"engine {self.index} exited with {self.proc.returncode} before {op!r}\n"
                                   f"{self.log_tail()}") from None
        if msg.get("op") == "error":
            raise EngineStartError(f"engine {self.index}: {msg['text']}")
        if msg.get("op") != op:
            raise EngineStartError(f"engine {self.index}: expected {op!r}, got {msg.get('op')!r}")
        return msg

    def build(self, memory_share: float, timeout_s: float) -> dict:
        self.conn.send({"op": "build", "memory_share": memory_share})
        self.ready = self.expect("ready", timeout_s)
        return self.ready

    def submit(self, request_id: str, prompt_token_ids: list[int], max_tokens: int, skip_prefix_cache: bool) -> None:
        self.conn.send({"op": "submit", "request_id": request_id, "prompt_token_ids": prompt_token_ids,
                        "max_tokens": max_tokens, "skip_prefix_cache": skip_prefix_cache})

    def reset(self, timeout_s: float = 60.0) -> dict:
        """Drains the engine and resets its prefix cache; returns the pool's state afterwards."""
        self.conn.send({"op": "reset"})
        while True:  # late step messages of the last arm (frees after an async store) come first
            msg = self.expect_any(timeout_s)
            if msg.get("op") == "reset":
                return msg

    def drain(self, timeout_s: float = 60.0) -> None:
        """Steps the engine until its scheduler holds no request: with the MP connector, a finished
        request's blocks are freed only once its store to the server completed."""
        self.conn.send({"op": "drain"})
        while self.expect_any(timeout_s).get("op") != "drained":
            pass

    def expect_any(self, timeout_s: float) -> dict:
        if not self.conn.poll(timeout_s):
            raise EngineStartError(f"engine {self.index}: no answer within {timeout_s:.0f} s\n{self.log_tail()}")
        msg = self.conn.recv()
        if msg.get("op") == "error":
            raise EngineStartError(f"engine {self.index}: {msg['text']}")
        return msg

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the engine's whole process group (the fault the kill test injects)."""
        os.killpg(self.proc.pid, signal.SIGKILL)

    def stop(self, timeout_s: float = 30.0) -> dict:
        """Asks the engine to close and exit, then kills its group if it has not; returns what it saw."""
        if self.alive():
            try:
                self.conn.send({"op": "stop"})
                self.proc.wait(timeout=timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                pass
        kill_group(self.proc.pid, grace_s=2.0)
        self.proc.wait()
        graceful = self.proc.returncode == 0  # it closed its engine and exited on "stop"
        if self.conn is not None:
            self.conn.close()
        return {"engine": self.index, "pid": self.proc.pid, "exit_code": self.proc.returncode,
                "stopped_gracefully": graceful, "group_gone": not group_alive(self.proc.pid)}

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""
