"""Shared fixtures. Engine fixtures are module-scoped: a vLLM start costs seconds to a minute."""
import os
import tempfile

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# Set before nbval starts its kernels so notebook runs inherit it and never write to outputs/.
os.environ.setdefault("KMESH_RUN_ROOT", tempfile.mkdtemp(prefix="kmesh-test-runs-"))


@pytest.fixture(autouse=True)
def _run_root(tmp_path, monkeypatch):
    """Runs made by tests land in a temp dir, never in outputs/."""
    monkeypatch.setenv("KMESH_RUN_ROOT", str(tmp_path / "runs"))


def pytest_collectstart(collector):
    """nbval: compare text only; engine logs (stderr), HTML tables and widgets vary run to run."""
    if hasattr(collector, "skip_compare"):
        collector.skip_compare = collector.skip_compare + (
            "stderr", "text/html", "application/javascript", "application/vnd.jupyter.widget-view+json",
            "image/png", "image/svg+xml")


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
        notebook = NOTEBOOK_DATA.get(item.path.name)
        for name in names + ([notebook] if notebook else []):
            if name not in reasons:
                reasons[name] = missing_reason(name)
            if reasons[name]:
                item.add_marker(pytest.mark.skip(reason=reasons[name]))
                break
