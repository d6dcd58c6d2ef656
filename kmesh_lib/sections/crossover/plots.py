"""Section 21's figures, drawn from a run's own files: the notebook's cells call these, and so does a redraw of a
published run (``scripts/migrate_declared_results.py --redrawn-figures``), so both draw the same figure from the
same record.

Each drawing function takes the run (``RunFiles``: its params and raw/) and its declared tables (what the
notebook's ``record.save_tables`` returned, or the run's results.json, which holds the same tables once saved) and
saves the PNG to ``path_out``. ``figures`` (the section's ``figures``) draws every figure the notebook draws for
that run, under the file name its cells give ``record.figure_path``.
"""
from __future__ import annotations

from pathlib import Path

from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections.crossover import gaps, report, summary
from kmesh_lib.sections.crossover.params import CrossoverParams, tiers

HEATMAP = "crossover_heatmap.png"
FLOOR_DISTANCE = "floor_distance.png"
HANDOFF = "handoff.png"


def heatmap_title(cfg: CrossoverParams) -> str:
    """The heatmap's title: the profile, the tiers (LMCache's path beside the ``lmcache`` tier, the one it
    applies to) and the KV's dtype and block size. It said "LMCache inproc path" before the tiers, which read as
    the path of every tier, lmcache_mp's (the server) too (bd94, 6 Dec 2026)."""
    names = [f"lmcache ({cfg.path})" if t == "lmcache" else t for t in tiers(cfg)]
    return f"{cfg.PROFILE}: tiers {', '.join(names)}; {cfg.DTYPE}, B={cfg.BLOCK_SIZE}"


def heatmap(run: RunFiles, tables: dict, path_out):
    """``report.heatmaps`` of the arms table, each cell's interval from the crossover table; with no restore path
    measured, the children's accounts of why (``gaps.note``); the panels of paths whose restores the KV digest found
    other than the computed marked as a copy's time (``summary.not_as_computed``)."""
    digests = summary.kv_digest_by_path(run)
    wrong_kv = {p: summary.differing_of(digests[p]) for p in summary.not_as_computed(digests)}
    return report.heatmaps(tables["arms"], path_out, heatmap_title(run.params), crossover=tables["crossover"],
                           missing=gaps.note(run, report.RESTORES), wrong_kv=wrong_kv)


def floor_distance(run: RunFiles, tables: dict, path_out):
    """``report.floor_plot`` of the floor-distance table with the timed restores' own spans (the splits table)."""
    return report.floor_plot(tables["floor_distance"], path_out, tables["splits"], missing=gaps.note(run, report.RESTORES))


def handoff(run: RunFiles, path_out):
    """``report.handoff_plot`` of the run's rows; None (nothing saved) where the run has no handoff table (no
    off-thread launch beside the engine-launched arm), as the notebook draws it only then."""
    rows = run.records("rows.jsonl")
    return report.handoff_plot(rows, path_out) if report.handoff_table(rows) else None


def figures(run: RunFiles, out_dir: Path, tables: dict | None = None) -> list[str]:
    """Draws every figure the notebook draws for ``run`` into ``out_dir``, under the names its cells save them as;
    ``tables``: the declared tables (default: the run's results.json). Returns the names of the files written (a
    figure the run has nothing for, the handoff plot of a run without the off-thread arm, is not)."""
    import matplotlib.pyplot as plt

    tables = run.results if tables is None else tables
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = {HEATMAP: heatmap(run, tables, out_dir / HEATMAP),
             FLOOR_DISTANCE: floor_distance(run, tables, out_dir / FLOOR_DISTANCE),
             HANDOFF: handoff(run, out_dir / HANDOFF)}
    for fig in drawn.values():
        if fig is not None:
            plt.close(fig)
    return [name for name, fig in drawn.items() if fig is not None]
