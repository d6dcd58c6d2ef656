"""Shared fixtures. Engine fixtures are module-scoped: a vLLM start costs seconds to a minute."""
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# Set before nbval starts its kernels so notebook runs inherit it and never write to outputs/; made only where
# the environment names none (a nested pytest inherits its parent's), and removed when the session ends.
SESSION_RUN_ROOT = None if os.environ.get("KMESH_RUN_ROOT") else tempfile.mkdtemp(prefix="kmesh-test-runs-")
if SESSION_RUN_ROOT is not None:
    os.environ["KMESH_RUN_ROOT"] = SESSION_RUN_ROOT


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


@pytest.fixture
def smoke_run(tmp_path):
    """Executes a section's notebook on the smoke profile into a temp run folder, as ``kmesh run``
    does up to its checks cell, and returns the folder's ``RunFiles`` (for results.json tests)."""
    def run(key: str):
        import papermill

        from kmesh_lib.app import registry
        from kmesh_lib.base.params import resolve_params, to_dict
        from kmesh_lib.base.records import RunFiles

        section = registry.get(key)
        config, _, _ = resolve_params(section, "smoke", [], [])
        run_dir = tmp_path / "smoke-run"
        run_dir.mkdir()
        notebook = registry.notebook_path(section)
        papermill.execute_notebook(str(notebook), str(run_dir / section.NOTEBOOK), kernel_name="kmesh",
                                   parameters={**to_dict(config), "RUN_DIR": str(run_dir)}, cwd=str(notebook.parent),
                                   progress_bar=False)
        return RunFiles(run_dir)
    return run


# Tests and golden notebooks that read a data set of kmesh_lib.base.data are skipped, with the
# reason, when the data root does not hold it (a clone without ../shared; `kmesh data fetch`).
NOTEBOOK_DATA = {"17_trace_audit.ipynb": "lmcache-agent-trace", "19_tot_headroom.ipynb": "game24"}


def pytest_configure(config):
    config.addinivalue_line("markers", "requires_data(name): skipped with the reason when data set `name` is absent")


def pytest_collection_modifyitems(config, items):
    from kmesh_lib.base.data import missing_reason

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
