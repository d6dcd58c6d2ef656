"""Regenerates tests/golden/<notebook> from notebooks/ with the smoke profile.

nbval re-executes the goldens and compares the cells tagged nbval-check-output against the
outputs stored here, so a golden is reviewed like code: run this, read the diff, commit.
Outputs of other cells are dropped (nbval --nbval-lax does not compare them). The notebooks run
the way ``kmesh run`` runs them (``app.execute``: no progress-bar text, no kernel file or process
left behind); their run folders go to a temp dir, never into runs/ or outputs/.

    .venv/bin/python scripts/make_goldens.py [SECTION ...]
"""
import os
import sys
import tempfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from kmesh_lib.app import registry as sections  # noqa: E402
from kmesh_lib.app.execute import execute  # noqa: E402
from kmesh_lib.base import params  # noqa: E402
from kmesh_lib.base.params import resolve_params  # noqa: E402

GOLDEN = ROOT / "tests" / "golden"


def make(section) -> Path:
    config, _, _ = resolve_params(section, "smoke", [], [])
    values = {k: v for k, v in params.to_dict(config).items() if k != "RUN_DIR"}  # runs go to KMESH_RUN_ROOT
    out = GOLDEN / section.NOTEBOOK
    notebook = sections.notebook_path(section)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["KMESH_RUN_ROOT"] = tmp
        outcome = execute(notebook, out, values, "kmesh", notebook.parent, timeout_s=1800, log_output=False)
    if outcome.status != "completed":
        raise SystemExit(f"golden {section.NOTEBOOK}: the smoke run {outcome.status}: {outcome.line()}")
    nb = nbformat.read(str(out), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and "nbval-check-output" not in cell.metadata.get("tags", []):
            cell.outputs = []
    nbformat.write(nb, str(out))
    return out


if __name__ == "__main__":
    GOLDEN.mkdir(parents=True, exist_ok=True)
    names = sys.argv[1:] or [s.KEY for s in sections.SECTIONS.values() if sections.notebook_path(s).exists()]
    for name in names:
        print("golden:", make(sections.get(name)), flush=True)
