"""Executing a section's notebook headlessly: papermill, and nothing the run starts outlives it.

``execute`` runs papermill and returns how the notebook ended, never raising for the notebook's
own failures:

    completed     every cell ran
    failed        a cell raised (its number, exception name and message), the kernel died, a
                  cell ran past the timeout, or the kernel could not start
    interrupted   Ctrl-C (KeyboardInterrupt) in this process

Around the execution:

- the kernel's connection file (and ``JUPYTER_RUNTIME_DIR``) go to a private folder that is
  removed after, so a killed kernel leaves nothing in /tmp;
- on Linux this process is a child subreaper while the notebook runs: whatever the kernel started
  and left behind (an LMCache server in its own session, a janitor) is re-parented here instead
  of to init, and ``reap_descendants`` waits for it, then ends it (SIGTERM, then SIGKILL);
- ``TQDM_DISABLE=1`` in the kernel's environment only (``KERNEL_ENV``): progress-bar text would be
  saved in the notebook; this process keeps papermill's cell bar (cells done, rate, ETA) on the
  terminal's stderr, or, with ``log_output``, each cell's output instead, less the bare
  ``<... object>`` text of a display that has no plain form;
- Ctrl-C also stops the kernel (SIGTERM) as it raises KeyboardInterrupt here, so the run ends
  even where the interrupt is swallowed inside papermill's event loop (nbclient then reports a
  dead kernel, which counts as interrupted); after an interrupt the abandoned execute task's
  complaints ("Kernel died", "Task exception was never retrieved") are not logged: the run's one
  line says what happened;
- a second Ctrl-C during that cleanup is ignored, so the cleanup finishes and no second
  traceback is printed.
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

PR_SET_CHILD_SUBREAPER = 36
KERNEL_ENV = {"TQDM_DISABLE": "1"}  # set for the kernel, never here: here tqdm draws papermill's cell bar
BARE_REPR = re.compile(r"^<[\w.]+ object( at 0x[0-9a-f]+)?>$")  # IPython's text for a display with no plain form
REAP_GRACE_S = 8.0  # a janitor cleans up within about a second of its owner's death


@dataclass
class Outcome:
    status: str  # completed | failed | interrupted
    error: dict | None = None
    reaped: list[str] | None = None  # processes that outlived the kernel and were ended here

    def line(self) -> str:
        if self.error:
            e = self.error
            where = f" in cell {e['cell']}" if e.get("cell") is not None else ""
            return f"{e['kind']}{where}: {e['ename']}: {e['evalue']}"
        return self.status


def _set_subreaper(on: bool) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) == 0


def _descendants(exclude: set[int], recursive: bool = True) -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=recursive) if p.pid not in exclude]


def _end(procs: list[psutil.Process]) -> list[str]:
    """SIGTERM, then SIGKILL after 3 s; returns ``name[pid]`` of each process it had to end."""
    ended = []
    for p in procs:
        try:
            ended.append(f"{p.name()}[{p.pid}]")
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=3.0)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=3.0)
    return ended


def reap_descendants(exclude: set[int], grace_s: float = REAP_GRACE_S) -> list[str]:
    """Ends what the run left: descendants of this process other than the pids in ``exclude``.

    The kernel first (a direct child still running after a second: an interrupted run), so its
    own exit handlers and janitors clean up what they own; then whatever is left after
    ``grace_s``. Returns ``name[pid]`` of each process that had to be ended.
    """
    _, kernels = psutil.wait_procs(_descendants(exclude, recursive=False), timeout=1.0)
    ended = _end(kernels)
    rest = _descendants(exclude)
    if rest:
        _, alive = psutil.wait_procs(rest, timeout=grace_s)
        ended += _end(alive + [p for p in _descendants(exclude) if p not in alive])
    return ended


@contextmanager
def _env(**values: str):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _kernel_manager_class(runtime: Path, kernel_log: Path | None) -> type:
    """A kernel manager whose connection file lies in ``runtime`` (jupyter_client's default is a
    ``tempfile.mkstemp`` file in /tmp, which a killed kernel leaves behind), and whose kernel writes
    its own stderr (start-up warnings, the last words of a dying kernel) to ``kernel_log``."""
    from jupyter_client.manager import AsyncKernelManager

    class RunKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs) -> None:
            super().__init__(**kwargs)
            self.connection_file = str(runtime / f"kernel-{secrets.token_hex(4)}.json")

        async def _async_launch_kernel(self, kernel_cmd, **kw) -> None:
            kw = {**kw, "env": {**(kw.get("env") or os.environ), **KERNEL_ENV}}
            if kernel_log is None:
                return await super()._async_launch_kernel(kernel_cmd, **kw)
            kernel_log.parent.mkdir(parents=True, exist_ok=True)
            with open(kernel_log, "ab") as log:  # the kernel keeps its own copy of the descriptor
                return await super()._async_launch_kernel(kernel_cmd, **{**kw, "stderr": log})

    return RunKernelManager


def _first_line(text: object, limit: int = 1000) -> str:
    """An error's first line for results.json, cut at a word (with an ellipsis) past ``limit`` characters: a checks
    cell's assertion names every failed check on that line (``base.checks``), so 300 characters kept only the first."""
    lines = str(text).strip().splitlines()
    line = lines[0].strip() if lines else ""
    if len(line) <= limit:
        return line
    cut = line[:limit - 2]
    # at the last word break, unless that loses more than half (a long path or value: textwrap.shorten kept "…" alone)
    word = cut.rstrip() if line[len(cut)].isspace() else cut.rsplit(None, 1)[0] if " " in cut else ""
    return (word if len(word) >= limit // 2 else cut) + " \u2026"


def _last_started_cell(out_nb: Path) -> int | None:
    """The execution count of the last cell papermill started, from the notebook it saved: the cell
    the run stopped in (papermill marks every cell completed once it stops, so the start time is
    what is left to tell)."""
    import nbformat

    try:
        nb = nbformat.read(str(out_nb), as_version=4)
    except (OSError, ValueError):
        return None
    started = [c for c in nb.cells if c.get("metadata", {}).get("papermill", {}).get("start_time")]
    return started[-1].get("execution_count") if started else None


def _cell_bar(log_output: bool) -> dict | bool:
    """papermill's progress bar over the notebook's cells (done / total, elapsed, ETA), on stderr; none where
    the cells' own output is printed, or where the user's environment turns tqdm off. ``disable`` is given,
    not left to tqdm: tqdm reads ``TQDM_DISABLE`` once, when first imported (maybe by a run in this process)."""
    if log_output or os.environ.get("TQDM_DISABLE", "").lower() not in ("", "0", "false"):
        return False
    return {"disable": False, "dynamic_ncols": True}


@contextmanager
def _ticking_bars(on: bool, every_s: float = 1.0):
    """Redraws the live tqdm bars every ``every_s`` while the block runs: tqdm draws only when a cell ends, so
    during a cell of many minutes the bar's elapsed time would stand still, as a hung run's does."""
    if not on:
        yield
        return
    from tqdm import tqdm

    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(every_s):
            for bar in list(tqdm._instances):
                if not bar.disable:
                    bar.refresh()

    ticker = threading.Thread(target=tick, name="kmesh-cell-bar", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()


RUNTIME_PREFIX = "kmesh-jupyter-"  # + the pid of the `kmesh run` that made it


def clean_stale_runtimes(tmp: Path | None = None) -> list[Path]:
    """Removes the kernel runtime folders of runs whose process is gone (a ``kmesh run`` killed
    with SIGKILL removes nothing); a folder whose pid is alive is left alone."""
    removed = []
    for path in Path(tmp or tempfile.gettempdir()).glob(RUNTIME_PREFIX + "*-*"):
        pid = path.name[len(RUNTIME_PREFIX):].split("-")[0]
        if pid.isdigit() and path.is_dir() and not path.is_symlink() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def execute(notebook: Path, out_nb: Path, parameters: dict, kernel: str, cwd: Path, timeout_s: int | None,
            log_output: bool, kernel_log: Path | None = None) -> Outcome:
    """Runs ``notebook`` into ``out_nb`` with papermill; see the module docstring."""
    import papermill
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    if log_output:  # papermill logs cell output at INFO on its logger, which has no handler of its own
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.addFilter(lambda record: not BARE_REPR.match(record.getMessage().strip()))  # says nothing here
        pm_log = logging.getLogger("papermill")
        pm_log.addHandler(handler)
        pm_log.setLevel(logging.INFO)
    clean_stale_runtimes()
    runtime = Path(tempfile.mkdtemp(prefix=f"{RUNTIME_PREFIX}{os.getpid()}-"))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    subreaper = _set_subreaper(True)
    outcome = Outcome("completed")
    interrupted = False

    def on_sigint(signum, frame):
        nonlocal interrupted
        if not interrupted:
            interrupted = True
            for kernel in _descendants(before, recursive=False):
                try:
                    kernel.terminate()
                except psutil.NoSuchProcess:
                    pass
        raise KeyboardInterrupt

    in_main_thread = threading.current_thread() is threading.main_thread()  # where Python delivers signals
    default_sigint = signal.signal(signal.SIGINT, on_sigint) if in_main_thread else None
    try:
        bar = _cell_bar(log_output)
        with _env(JUPYTER_RUNTIME_DIR=str(runtime)), _ticking_bars(bool(bar)):
            papermill.execute_notebook(str(notebook), str(out_nb), parameters=parameters, kernel_name=kernel,
                                       cwd=str(cwd), execution_timeout=timeout_s, log_output=log_output,
                                       progress_bar=bar, kernel_manager_class=_kernel_manager_class(runtime, kernel_log))
    except (KeyboardInterrupt, papermill.PapermillExecutionError, DeadKernelError) as e:
        if interrupted or isinstance(e, KeyboardInterrupt):
            outcome = Outcome("interrupted", {"kind": "interrupted", "cell": _last_started_cell(out_nb),
                                              "ename": "KeyboardInterrupt", "evalue": "Ctrl-C"})
        elif isinstance(e, DeadKernelError):
            outcome = Outcome("failed", {"kind": "dead kernel", "cell": _last_started_cell(out_nb),
                                         "ename": "DeadKernelError", "evalue": _first_line(e)})
        else:
            outcome = Outcome("failed", {"kind": "cell error", "cell": e.exec_count, "ename": e.ename,
                                         "evalue": _first_line(e.evalue)})
    except CellTimeoutError as e:
        outcome = Outcome("failed", {"kind": "timeout", "cell": _last_started_cell(out_nb), "ename": "CellTimeoutError",
                                     "evalue": _first_line(e)})
    except Exception as e:  # the kernel did not start, papermill could not write: the run still ends failed
        outcome = Outcome("failed", {"kind": "papermill", "cell": None, "ename": type(e).__name__,
                                     "evalue": _first_line(e)})
    finally:
        if in_main_thread:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if interrupted or outcome.status == "interrupted":
            # the abandoned execute task logs the kernel's death when the loop or the collector next
            # touches it (nbclient's "Kernel died", asyncio's "Task exception was never retrieved")
            logging.disable(logging.CRITICAL)
        try:
            outcome.reaped = reap_descendants(before)
            if subreaper:
                _set_subreaper(False)
            shutil.rmtree(runtime, ignore_errors=True)
        finally:
            if in_main_thread:
                signal.signal(signal.SIGINT, default_sigint)
        if log_output:
            pm_log.removeHandler(handler)
    return outcome
