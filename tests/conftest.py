"""Shared fixtures. Engine fixtures are module-scoped: a vLLM start costs seconds to a minute."""
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# Set before nbval starts its kernels so notebook runs inherit it and never write to outputs/; made only where
# the environment names none (a nested pytest inherits its parent's), and removed when the session ends.
SESSION_RUN_ROOT = None if os.environ.get("KMESH_RUN_ROOT") else tempfile.mkdtemp(prefix="kmesh-test-runs-")
if SESSION_RUN_ROOT is not None:
    os.environ["KMESH_RUN_ROOT"] = SESSION_RUN_ROOT
# Where the goldens' kernels put their runs: this session's root (pytest-xdist's workers inherit the controller's).
GOLDEN_RUN_ROOT = os.environ["KMESH_RUN_ROOT"]
# This session, as every pytest-xdist worker sees it (they inherit the controller's environment): a root named from
# outside (KMESH_RUN_ROOT) outlives a session, and an earlier session's golden-ended marker must not end a wait
TEST_SESSION = os.environ.setdefault("KMESH_TEST_SESSION", f"{os.getpid()}-{time.time_ns()}")


def pytest_sessionfinish(session, exitstatus):
    """The session's run root goes with it. A hook, not a session fixture's teardown: nbval's cells request no
    fixtures, so a session of goldens alone would never set one up (nor tear it down)."""
    if SESSION_RUN_ROOT is not None:
        shutil.rmtree(SESSION_RUN_ROOT, ignore_errors=True)


@pytest.fixture(autouse=True)
def _run_root(tmp_path, monkeypatch):
    """Runs made by tests land in a temp dir, never in runs/ or outputs/; a run a test opened and
    did not finish gives its log streams (fd 2, the engine loggers) back afterwards."""
    monkeypatch.setenv("KMESH_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.setenv("KMESH_PUBLISHED_ROOT", str(tmp_path / "published"))
    yield
    from kmesh_lib.base import runlog

    if runlog.active() is not None:
        runlog.active().close()


def pytest_collectstart(collector):
    """nbval: compare text only; engine logs (stderr), HTML tables and widgets vary run to run."""
    if hasattr(collector, "skip_compare"):
        collector.skip_compare = collector.skip_compare + (
            "stderr", "text/html", "application/javascript", "application/vnd.jupyter.widget-view+json",
            "image/png", "image/svg+xml")


GOLDEN_WAIT_S = 1800  # how long a test waits for its section's golden to finish its run (then runs the notebook itself)


def _golden_run(section, values: dict) -> Path | None:
    """The finished run this session's golden of ``section`` made with exactly ``values`` as its params, or None
    (none yet, a run folder still being written, or a run whose kernel is gone without finishing: ``died``)."""
    from kmesh_lib.base.records import RunFileError, RunFiles

    root = Path(GOLDEN_RUN_ROOT) / section.KEY
    for run_dir in sorted(root.glob("*")) if root.is_dir() else []:
        run = RunFiles(run_dir)
        try:
            recorded, status = run.recorded_params, run.status
        except (OSError, RunFileError):
            continue  # a run folder being written
        if {k: v for k, v in recorded.items() if k != "RUN_DIR"} == values and status in ("passed", "failed"):
            return run_dir
    return None


def _golden_ended_marker(notebook: str) -> Path:
    return Path(GOLDEN_RUN_ROOT) / f".golden-ended-{TEST_SESSION}-{notebook}"


def _golden_ended(notebook: str) -> bool:
    """Whether this session's golden of ``notebook`` has run its last cell (on any worker), however it went: a
    golden whose kernel died or never started leaves no finished run, and a test waiting for one stops waiting."""
    return _golden_ended_marker(notebook).exists()


def pytest_runtest_teardown(item, nextitem):
    """A golden notebook's last cell on this worker (pytest-xdist's loadfile keeps a notebook's cells together and
    in order) marks the golden ended for the tests waiting on its run (``smoke_run``)."""
    if item.path.parent.name == "golden" and (nextitem is None or nextitem.path != item.path):
        _golden_ended_marker(item.path.name).touch()


@pytest.fixture
def smoke_run(tmp_path, request):
    """A section's notebook executed on the smoke profile, as ``kmesh run`` executes it up to its checks cell,
    in a temp run folder; returns the folder's ``RunFiles`` (for results.json tests).

    The goldens (tests/golden) execute every notebook on the smoke profile in this session, first in collection
    order; when the section's golden is among this session's tests, its run (exactly the smoke profile's params)
    is copied instead of executing the notebook a second time -- waited for while it is still going on another
    pytest-xdist worker. Without it (a golden deselected, failed to start, or a different profile), the
    notebook is executed here."""
    def run(key: str):
        import papermill

        from kmesh_lib.app import registry
        from kmesh_lib.base.params import resolve_params, to_dict
        from kmesh_lib.base.records import RunFiles

        section = registry.get(key)
        config, _, _ = resolve_params(section, "smoke", [], [])
        run_dir = tmp_path / "smoke-run"
        values = {k: v for k, v in to_dict(config).items() if k != "RUN_DIR"}
        in_session = any(item.path.parent.name == "golden" and item.path.name == section.NOTEBOOK
                         for item in request.session.items)
        deadline = time.monotonic() + (GOLDEN_WAIT_S if in_session else 0)
        golden = _golden_run(section, values)
        while golden is None and in_session and time.monotonic() < deadline and not _golden_ended(section.NOTEBOOK):
            time.sleep(2)  # the golden is queued or running on another worker
            golden = _golden_run(section, values)
        golden = golden or _golden_run(section, values)  # it may have finished as it ended
        if golden is not None:
            shutil.copytree(golden, run_dir, symlinks=True)
            return RunFiles(run_dir)
        run_dir.mkdir()
        notebook = registry.notebook_path(section)
        papermill.execute_notebook(str(notebook), str(run_dir / section.NOTEBOOK), kernel_name="kmesh",
                                   parameters={**values, "RUN_DIR": str(run_dir)}, cwd=str(notebook.parent),
                                   progress_bar=False)
        return RunFiles(run_dir)
    return run


# Tests and golden notebooks that read a data set of kmesh_lib.base.data are skipped, with the
# reason, when the data root does not hold it (a clone without ../shared; `kmesh data fetch`).
NOTEBOOK_DATA = {"17_trace_audit.ipynb": "lmcache-agent-trace", "19_tot_headroom.ipynb": "game24"}


KERNEL_START_ATTEMPTS = 3


def _retrying_kernel_class():
    """nbval's kernel, started again when it dies at start-up. Seen once in a fresh clone's CI on a loaded machine
    (golden 20: "Kernel died before replying to kernel_info", every cell an error): nbval sends the kernel's stderr
    to /dev/null, so the cause was lost. Here a start that fails is retried (a warning names the attempt and the
    kernel's stderr), and after the last attempt the error carries that stderr. A kernel that starts is untouched:
    a cell's failure is never retried."""
    import tempfile
    import warnings

    from nbval import kernel as nbval_kernel

    class RetryingKernel(nbval_kernel.RunningKernel):
        def __init__(self, kernel_name, cwd=None, startup_timeout=60):
            for attempt in range(1, KERNEL_START_ATTEMPTS + 1):
                self._stderr = tempfile.TemporaryFile(mode="w+")  # kept open for the kernel's life
                try:
                    self.km, self.kc = nbval_kernel.start_new_kernel(
                        startup_timeout=startup_timeout, kernel_name=kernel_name, stderr=self._stderr, cwd=cwd)
                except RuntimeError as exc:
                    self._stderr.seek(0)
                    why = f"kernel start {attempt}/{KERNEL_START_ATTEMPTS} failed ({exc}); its stderr ended: " \
                          f"{self._stderr.read()[-1500:]!r}"
                    self._stderr.close()
                    if attempt == KERNEL_START_ATTEMPTS:
                        raise RuntimeError(why) from exc
                    warnings.warn(why, stacklevel=1)
                    continue
                self._ensure_iopub_up()
                return

    return RetryingKernel


def pytest_configure(config):
    config.addinivalue_line("markers", "requires_data(name): skipped with the reason when data set `name` is absent")
    if config.pluginmanager.hasplugin("nbval"):
        import nbval.plugin

        nbval.plugin.RunningKernel = _retrying_kernel_class()


# Scheduling only (pytest-xdist hands out files in collection order): the goldens first, longest first (a test
# that reads a smoke run waits for its golden on the other worker, so the long goldens must not start last), then
# the files that take minutes, longest first, so no long file starts last on one worker while the other idles.
# Seconds in a fresh clone's CI (ci18, 5 Dec): goldens 22 107, 21 107, 16 44, 20 39, 19 36, 18 26, 23 21, 00 17,
# 17 6; files: tamper 157 (then cut), multi_engine_gpu 61, prefetch 57, app_runs 52, retention 46, multi_engine 44,
# lmcache_server 28, lmcache_singleflight 22, fused_copy 21, trace_audit 17, offloading 16, trace_data 13.
GOLDENS = ("21_crossover.ipynb", "22_multi_engine.ipynb", "16_retention.ipynb", "20_prefetch.ipynb",
           "19_tot_headroom.ipynb", "18_family_hold.ipynb", "23_production_trace.ipynb", "00_engine_check.ipynb",
           "17_trace_audit.ipynb")
LONG_FILES = ("test_tamper.py", "test_multi_engine_gpu.py", "test_prefetch.py", "test_app_runs.py", "test_retention.py",
              "test_multi_engine.py", "test_lmcache_server.py", "test_lmcache_singleflight.py", "test_fused_copy.py",
              "test_trace_audit.py", "test_offloading.py", "test_trace_data.py")


def _schedule_rank(item) -> tuple[int, int]:
    if item.path.parent.name == "golden":
        return 0, GOLDENS.index(item.path.name) if item.path.name in GOLDENS else len(GOLDENS)
    return (1, LONG_FILES.index(item.path.name)) if item.path.name in LONG_FILES else (2, 0)


def pytest_collection_modifyitems(config, items):
    from kmesh_lib.base.data import missing_reason

    items[:] = sorted(items, key=_schedule_rank)  # stable: a file's tests keep their order

    reasons: dict[str, str | None] = {}
    for item in items:
        names = [m.args[0] for m in item.iter_markers("requires_data")]
        # a notebook, or a case parametrized by a section or a notebook path whose smoke profile reads a data set
        params = item.callspec.params if hasattr(item, "callspec") else {}
        notebooks = [item.path.name, getattr(params.get("section"), "NOTEBOOK", None), getattr(params.get("path"), "name", None)]
        names += [NOTEBOOK_DATA[n] for n in notebooks if n in NOTEBOOK_DATA]
        for name in names:
            if name not in reasons:
                reasons[name] = missing_reason(name)
            if reasons[name]:
                item.add_marker(pytest.mark.skip(reason=reasons[name]))
                break
