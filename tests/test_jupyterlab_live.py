"""Section 20's live panel in a real JupyterLab, driven by a headless Chromium (issue 43).

``scripts/jupyterlab_live_check.py`` runs the notebook's cells at the smoke profile in JupyterLab, moves the lead
slider, presses Run, and checks that the live run passed (its results and ``kmesh verify``) and that its point
joined the panel's figure. Skipped, with the reason, where Chromium, JupyterLab or playwright is missing
(``pip install -e .[browser]`` adds playwright; it drives /usr/bin/chromium and downloads no browser).
"""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from jupyterlab_live_check import CHROMIUM  # noqa: E402

pytestmark = [
    pytest.mark.slow, pytest.mark.cpu,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}"),
    pytest.mark.skipif(importlib.util.find_spec("jupyterlab") is None, reason="JupyterLab is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("playwright") is None,
                       reason="playwright is not installed (pip install -e .[browser])"),
]


def test_the_live_panel_in_jupyterlab_runs_a_lead_that_passes_and_plots_its_point(tmp_path):
    shots = tmp_path / "shots"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "jupyterlab_live_check.py"), "--shots", str(shots)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "passed"
    assert any(line.startswith("kmesh verify (exit 0)") for line in lines)
    assert any(line.startswith("the new point: lead 150 ms") for line in lines)
    assert {p.name for p in shots.iterdir()} >= {"before.png", "running.png", "after.png"}
