"""Figures legible at 100 % zoom (issue 43): sections 00, 17, 18, 19, 20's panel and 23, drawn from published runs
(or small made-up inputs where the figure takes objects a run does not keep) and saved as the notebooks save them.

Each saved PNG is at ``base.figures.DPI`` (its ``pHYs``), every text is at least ``min_points`` of the figure's
width (10 CSS px in the report's column), and no legend overlaps an axes (legends sit off the data).
"""
from pathlib import Path
from types import SimpleNamespace

import pytest

from kmesh_lib.base.figures import DPI, min_points
from kmesh_lib.base.records import RunFiles

ROOT = Path(__file__).resolve().parents[1]
OUTPUTS = ROOT / "outputs"

pytest.importorskip("matplotlib")


def published(section: str) -> list[Path]:
    return sorted(p for p in (OUTPUTS / section).iterdir() if (p / "results.json").is_file())


def png_dpi(path: Path) -> float:
    head = path.read_bytes()[:4096]
    at = head.find(b"pHYs")
    assert at > 0, f"{path.name}: no pHYs chunk"
    return int.from_bytes(head[at + 4:at + 8], "big") * 0.0254


def assert_legible(fig, path: Path) -> None:
    from matplotlib.legend import Legend
    from matplotlib.text import Text

    assert round(png_dpi(path)) == DPI
    saved_in = int.from_bytes(path.read_bytes()[16:20], "big") / DPI  # wider than the figure with a legend beside it
    floor = min_points(max(fig.get_figwidth(), saved_in))  # the report fits the saved width into its column
    small = [(t.get_text(), t.get_fontsize()) for t in fig.findobj(Text) if t.get_text() and t.get_fontsize() < floor - 1e-6]
    assert not small, f"{path.name}: texts under {floor:.2f} pt: {small[:5]}"
    if not hasattr(fig.canvas, "get_renderer"):  # a bare Figure (the live panel's): give it Agg's canvas
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    renderer = fig.canvas.get_renderer()
    legends = [lg for lg in fig.findobj(Legend)]
    for lg in legends:
        box = lg.get_window_extent(renderer)
        for ax in fig.axes:
            if ax.get_label() == "<colorbar>":
                continue
            assert not box.overlaps(ax.get_window_extent(renderer)), f"{path.name}: a legend lies over an axes"


@pytest.mark.parametrize("run_dir", published("tot_headroom"), ids=lambda p: p.name)
def test_section_19_figures(run_dir, tmp_path):
    from kmesh_lib.sections.tot_headroom import plots

    for name in ("search_tree", "prefill_vs_pool", "headroom_by_error_rate"):
        out = tmp_path / f"{name}.png"
        ax = getattr(plots, name)(RunFiles(run_dir), out=out)
        assert_legible(ax.figure, out)


@pytest.mark.parametrize("run_dir", published("family_hold"), ids=lambda p: p.name)
def test_section_18_figures(run_dir, tmp_path):
    from kmesh_lib.sections.family_hold import plots, tables
    from kmesh_lib.sections.family_hold.recorded import read_mode

    run = RunFiles(run_dir)
    out = tmp_path / "cached_tokens.png"
    assert_legible(plots.cached_tokens([(m, read_mode(run, m)) for m in ("real", "replay")], out), out)
    built = {name: table.build(run) for name, table in tables.TABLES.items() if name.startswith("sweep")}
    out = tmp_path / "sweep_crossing.png"
    fig = plots.sweep_crossing(built["sweep"], built["sweep_crossing_parent_share"], run.params.REPLAY_BLOCK_SIZE, out)
    assert_legible(fig, out)


def test_section_17_figure_grows_downward_with_its_fields(tmp_path):
    import pandas as pd

    from kmesh_lib.sections.trace_audit import plots

    sources = [f"source {i} (1,000 records)" for i in range(8)]
    need = pd.DataFrame([[1.0] * 6] * 8, index=sources, columns=[f"requirement {i}" for i in range(6)])
    widths = []
    for num_fields in (5, 40):
        have = pd.DataFrame([[0.5] * num_fields] * 8, index=sources, columns=[f"field_{i}" for i in range(num_fields)])
        out = tmp_path / f"field_coverage_{num_fields}.png"
        fig = plots.field_coverage(have, need, out)
        assert_legible(fig, out)
        assert len(fig.axes) == -(-num_fields // plots.MAX_COLUMNS) + 2  # field panels, the requirements, the bar
        widths.append(fig.get_figwidth())
    assert widths[1] <= plots.LABELS_IN + plots.COLUMN_IN * plots.MAX_COLUMNS  # 40 fields: more panels, not wider


def test_section_00_figure(tmp_path):
    from kmesh_lib.sections.engine_check import plots

    def run(mode, block_size):
        return SimpleNamespace(engine_mode=mode, block_size=block_size,
                               capture=SimpleNamespace(num_free_by_step=[(0, 64), (1, 60), (2, 58), (3, 64)]))

    out = tmp_path / "blocks_in_use.png"
    assert_legible(plots.blocks_in_use([(run("real", 32), 64), (run("replay", 16), 64)], out), out)


@pytest.mark.parametrize("run_dir", published("prefetch")[:1], ids=lambda p: p.name)
def test_section_20_panel_figure(run_dir, tmp_path):
    from kmesh_lib.sections.prefetch.plots import lead_sweep_figure, png, png_css_width
    from kmesh_lib.sections.prefetch.tables import groups_of

    groups = groups_of(RunFiles(run_dir))
    fig = lead_sweep_figure(groups, only=(groups[0].path, groups[0].group_size), highlight_ms=150.0)
    out = tmp_path / "panel.png"
    image = png(fig)
    out.write_bytes(image)
    assert_legible(fig, out)
    assert png_css_width(image) == round(int.from_bytes(image[16:20], "big") * 96 / DPI)


@pytest.mark.parametrize("run_dir", published("production_trace"), ids=lambda p: p.name)
def test_section_23_figures(run_dir, tmp_path):
    """4f23's tier figure had its eight rows' labels run into each other (7 pt, two lines, 7 in wide)."""
    from kmesh_lib.sections.production_trace import plots

    run = RunFiles(run_dir)
    for name, draw in (("cached_share_vs_pool", plots.cached_share_vs_pool), ("tier_savings", plots.tier_savings)):
        out = tmp_path / f"{name}.png"
        fig = draw(run, out).figure
        assert_legible(fig, out)
        renderer = fig.canvas.get_renderer()
        boxes = [t.get_window_extent(renderer) for t in fig.axes[0].get_xticklabels() if t.get_text()]
        assert not any(a.overlaps(b) for a, b in zip(boxes, boxes[1:])), f"{name}: tick labels overlap"
