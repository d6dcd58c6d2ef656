"""``scripts/migrate_declared_results.py --redrawn-figures`` on a copy of a published section 21 run: a figure the
notebook drew before its code was fixed is drawn again from the run's own files, as the notebook now draws it, and
the pass is recorded (results.json, the notebook's figure output, the report)."""
import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections import crossover as section
from kmesh_lib.sections.crossover import plots
from kmesh_lib.sections.crossover import report as cr

REPO = Path(__file__).resolve().parent.parent
RUN = REPO / "outputs" / "crossover" / "gpu-20261207-183057-9c33"  # the GPU buffer on its own engine: gpubuf_recompute
spec = importlib.util.spec_from_file_location("migrate_declared_results", REPO / "scripts" / "migrate_declared_results.py")
migrate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(migrate)
HEATMAP = "figures/crossover_heatmap.png"


@pytest.fixture
def stale_copy(tmp_path, monkeypatch):
    """The run copied, its heatmap as the notebook drew it before each panel named its own control: "gpubuf_retained
    restore vs recompute" over gpubuf_recompute's cells (as 89ce was published on 6 Dec 2026; 9c33 since 89ce's withdrawal)."""
    import matplotlib

    matplotlib.use("Agg")
    run_dir = tmp_path / "crossover" / RUN.name
    shutil.copytree(RUN, run_dir)
    with monkeypatch.context() as old:
        old.setattr(cr, "_controls_named", lambda controls, grid, models: "recompute")
        section.figures(RunFiles(run_dir), tmp_path / "stale")
    shutil.copy(tmp_path / "stale" / "crossover_heatmap.png", run_dir / HEATMAP)
    return run_dir


def _image_outputs(run_dir: Path) -> dict[str, dict]:
    nb = json.loads((run_dir / section.NOTEBOOK).read_text())
    return {o["metadata"]["kmesh_figure"]["file"]: o["metadata"]["kmesh_figure"] for c in nb["cells"]
            for o in c.get("outputs", []) if "kmesh_figure" in o.get("metadata", {})}


def test_a_stale_figure_is_redrawn_as_the_notebook_draws_it_and_the_pass_recorded(stale_copy, tmp_path):
    before = json.loads((stale_copy / "results.json").read_text())
    displayed = _image_outputs(stale_copy)[HEATMAP]["displayed"]
    note = migrate.redraw_figures(stale_copy, "each panel names the recompute its cells are over")
    assert HEATMAP in note["figures_redrawn"] and "figures/handoff.png" in note["figures_unchanged"]

    results = json.loads((stale_copy / "results.json").read_text())
    recorded = results["migration"]["redrawn"][-1]
    assert recorded["why"] == "each panel names the recompute its cells are over"
    assert recorded["figures_redrawn"] == note["figures_redrawn"] and "executed notebook" in recorded["notebook"]
    assert {k: v for k, v in results.items() if k != "migration"} == {k: v for k, v in before.items() if k != "migration"}
    assert "0 recorded/recomputed mismatches" in note["verify_after"]  # then what checks it predates, if any

    # what the file now shows is the current drawing: its panels over the GPU buffer engine's own recompute
    fig = plots.heatmap(RunFiles(stale_copy), results, tmp_path / "now.png")
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    gpubuf = [t for t in titles if t.startswith("gpubuf")]  # 9c33 holds every tier; 89ce held the GPU buffer's alone
    assert gpubuf and all(t.endswith("vs gpubuf_recompute") for t in gpubuf), titles
    assert migrate.redraw_figures(stale_copy, "again")["skipped"].startswith("every figure is as the code draws it")

    shown = _image_outputs(stale_copy)[HEATMAP]
    assert shown["displayed"] == displayed and shown["redrawn"][-1]["why"] == recorded["why"]
    assert (stale_copy / section.NOTEBOOK).read_text().count("\n") <= 1  # compact JSON, as published

    from kmesh_lib.app.cli import main as kmesh_main

    assert kmesh_main(["report", "21", "--run-dir", str(stale_copy)]) == 0
    said = re.findall(r"figures redrawn from the record \(([^)]*)\): ([^<]*)", (stale_copy / "report.html").read_text())
    assert said and "crossover_heatmap.png" in said[-1][0] and said[-1][1] == recorded["why"]  # this pass: the last


def test_a_section_without_figures_is_refused(tmp_path):
    """A run of a section that declares no ``figures`` to draw with: refused, nothing written."""
    retention = next((REPO / "outputs" / "retention").iterdir())
    run_dir = tmp_path / "retention" / retention.name
    shutil.copytree(retention, run_dir)
    before = (run_dir / "results.json").read_bytes()
    with pytest.raises(migrate.Refused, match="declares no figures"):
        migrate.redraw_figures(run_dir, "why")
    assert (run_dir / "results.json").read_bytes() == before


def test_only_the_figures_asked_for_are_redrawn_and_the_others_that_differ_are_named(stale_copy):
    """``--only-figure``: a pass for one figure's change (issue 42's floor plot) leaves another figure that differs for
    another reason (here the stale heatmap) as published, and names it, so the pass's WHY is not set on it."""
    shutil.copy(stale_copy / HEATMAP, stale_copy / "figures" / "floor_distance.png")  # another picture: to be redrawn
    stale = (stale_copy / HEATMAP).read_bytes()
    note = migrate.redraw_figures(stale_copy, "the floor plot's verdicts", only=["floor_distance.png"])
    assert list(note["figures_redrawn"]) == ["figures/floor_distance.png"]
    assert note["left_as_published"] == [HEATMAP] and (stale_copy / HEATMAP).read_bytes() == stale
    assert "0 recorded/recomputed mismatches" in note["verify_after"]
    again = migrate.redraw_figures(stale_copy, "again", only=["floor_distance.png"])
    assert again["skipped"].endswith("but for crossover_heatmap.png, not asked for (--only-figure)")
