"""The engine's log goes to the run folder (``logs/engine.log``), never into notebook cells.

Three sources write engine text, and each is routed while a run is open:

    Python loggers   ``vllm`` configures a StreamHandler on its ``vllm`` logger when it is imported;
                     LMCache gives every module logger its own StreamHandler when that module is
                     imported (``lmcache.logging.init_logger``, propagate off). Both usually happen
                     after the run opened, so routing replaces handlers as they are attached, not
                     once: a stream handler attached to a ``vllm*`` or ``lmcache*`` logger is
                     swapped for the run's FileHandler.
    fd 2             C and C++ code (torch, the CPU attention kernels, LMCache's extension) writes
                     to file descriptor 2, which a Jupyter kernel forwards into the cell. fd 2
                     points at the log file while the run is open; Python's own ``sys.stderr``
                     (tracebacks, warnings) keeps its destination.
    progress bars    tqdm's text would be saved in the notebook: ``TQDM_DISABLE=1`` for the run
                     (tqdm reads it when it is first imported, so ``kmesh run`` also sets it for
                     the whole kernel; the report leaves out any progress text that got through).

The levels are the engines' own settings (``VLLM_LOGGING_LEVEL``, ``LMCACHE_LOG_LEVEL``).

Invariant: at most one routing is active in a process; ``close()`` restores every handler, fd 2,
``sys.stderr`` and the environment exactly as they were, and is safe to call twice.
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
from pathlib import Path

ENGINE_LOGGERS = ("vllm", "lmcache")
LEVEL_VARIABLES = {"vllm": "VLLM_LOGGING_LEVEL", "lmcache": "LMCACHE_LOG_LEVEL"}  # the engines' own settings
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_active: EngineLog | None = None
_original_add_handler = logging.Logger.addHandler


def _is_engine_logger(name: str) -> bool:
    return any(name == root or name.startswith(root + ".") for root in ENGINE_LOGGERS)


def _is_console_handler(handler: logging.Handler) -> bool:
    return type(handler) is logging.StreamHandler or (
        isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler))


def _routing_add_handler(logger: logging.Logger, handler: logging.Handler) -> None:
    log = _active
    if log is not None and _is_engine_logger(logger.name) and _is_console_handler(handler):
        log.moved.append((logger, handler))
        handler = log.handler
    _original_add_handler(logger, handler)


class EngineLog:
    """Routes engine output to ``path`` until ``close()``; see the module docstring."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.moved: list[tuple[logging.Logger, logging.Handler]] = []
        self.handler: logging.Handler | None = None
        self._saved_fd2: int | None = None
        self._saved_stderr = None
        self._saved_env: dict[str, str | None] = {}
        self._saved_levels: dict[str, tuple[int, bool]] = {}

    def open(self) -> EngineLog:
        global _active
        if _active is not None:
            _active.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handler = logging.FileHandler(self.path, encoding="utf-8")
        self.handler.setFormatter(logging.Formatter(LOG_FORMAT))
        _active = self
        logging.Logger.addHandler = _routing_add_handler
        for name in ENGINE_LOGGERS:  # the roots, so records of loggers made later have a home
            logger = logging.getLogger(name)
            self._saved_levels[name] = (logger.level, logger.propagate)
            logger.propagate = False
            if logger.level == logging.NOTSET:
                logger.setLevel(os.environ.get(LEVEL_VARIABLES[name], "INFO").upper())
        for logger in [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)] + [
                logging.getLogger(n) for n in ENGINE_LOGGERS]:
            if not _is_engine_logger(logger.name):
                continue
            for handler in [h for h in logger.handlers if _is_console_handler(h)]:
                logger.removeHandler(handler)
                self.moved.append((logger, handler))
            if self.handler not in logger.handlers and (logger.name in ENGINE_LOGGERS or not logger.propagate):
                _original_add_handler(logger, self.handler)
        self._set_env("TQDM_DISABLE", "1")
        self._redirect_fd2()
        atexit.register(self.close)
        return self

    def _set_env(self, key: str, value: str) -> None:
        self._saved_env[key] = os.environ.get(key)
        os.environ[key] = value

    def _redirect_fd2(self) -> None:
        sys.stderr.flush()
        self._saved_fd2 = os.dup(2)
        try:
            python_stderr_is_fd2 = sys.stderr.fileno() == 2
        except (AttributeError, OSError, ValueError):  # a Jupyter kernel's stream has no fd
            python_stderr_is_fd2 = False
        if python_stderr_is_fd2:  # a script: keep Python's tracebacks on the terminal
            self._saved_stderr = sys.stderr
            sys.stderr = open(os.dup(self._saved_fd2), "w", buffering=1, encoding="utf-8", errors="replace",
                              closefd=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 2)
        os.close(fd)

    def close(self) -> None:
        global _active
        if self.handler is None:
            return
        if self._saved_fd2 is not None:
            os.dup2(self._saved_fd2, 2)
            os.close(self._saved_fd2)
            self._saved_fd2 = None
        if self._saved_stderr is not None:
            sys.stderr.close()
            sys.stderr = self._saved_stderr
            self._saved_stderr = None
        if _active is self:
            _active = None
            logging.Logger.addHandler = _original_add_handler
        for logger in {id(lg): lg for lg, _ in self.moved}.values():
            logger.removeHandler(self.handler)
        for name in ENGINE_LOGGERS:
            logging.getLogger(name).removeHandler(self.handler)
        for logger, handler in self.moved:
            logger.addHandler(handler)
        for name, (level, propagate) in self._saved_levels.items():
            logging.getLogger(name).setLevel(level)
            logging.getLogger(name).propagate = propagate
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self.handler.close()
        self.handler = None
        self.moved.clear()
        atexit.unregister(self.close)


def active() -> EngineLog | None:
    return _active
