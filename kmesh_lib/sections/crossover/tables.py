"""Section 21's declared result (``base.declared``): every table results.json holds, each built from the
run's files.

    floors              recorded only: the physical floors the notebook measures live (disk, host->device and,
                        with GPU-buffer arms, device->device bandwidth), kept only in results.json
    grid_seconds        recorded only: the grid's wall-clock seconds, timed by the notebook around its children
    models              the child summaries of raw/models.jsonl, for the models of the params' MODELS
    arms, crossover, components, splits, scatter_sources, forward_steps, forward_step_pairs
                        ``report``'s tables of raw/rows.jsonl (an empty list where no row records what a table
                        reads: splits without a timed restore, scatter_sources without GPU clocks, forward
                        steps without a timed forward pass)
    floor_distance      ``report.floor_table`` of the arms table, the recorded floors, raw/rows.jsonl and, where
                        the run has the paired design, raw/point_floors.jsonl (each cost's 95% interval and its
                        verdict against the floor timed around its point, else the run-start one)
    splits              ``report.split_table``: the medians of each timed restore's parts, with the 95% intervals
                        of the goals' medians (``restore_ci_ms``, ``critical_ci_ms``, ``charged_ci_ms``) that
                        ``report.timeline_goal_table`` and ``critical_goal_table`` judge against the floor
    restore_resolution  ``report.resolution_table`` of raw/pairs.jsonl and raw/point_floors.jsonl (the paired
                        design: each restore's span and its paired first-token difference, with 95% intervals,
                        against the floor measured before and after the point); ABSENT in runs recorded before it
                        (``gaps.predates_pairs``)

The notebook saves them with ``record.save_tables(TABLES)``; ``kmesh verify`` builds them again and
compares; ``checks.table_checks`` states each one as a check of the section.
"""
from __future__ import annotations

from kmesh_lib.base.declared import ABSENT, Table, recorded_only
from kmesh_lib.base.records import RunFileError, RunFiles
from kmesh_lib.sections.crossover import report
from kmesh_lib.sections.crossover.captures import GridRow
from kmesh_lib.sections.crossover.gaps import PAIRED_SINCE, predates_pairs


def rows(run: RunFiles) -> list[GridRow]:
    return run.records("rows.jsonl")


def recorded_floors(run: RunFiles) -> dict:
    """The floors the run measured (results.json, ``floors``), with the disk and host->device floors every
    path's distance needs.

    Raises:
        RunFileError: results.json records no such floors (the floor-distance table cannot be built).
    """
    floors = run.readable_results.get("floors") or {}
    if not (floors.get("disk") and floors.get("copy")):
        raise RunFileError(f"{run.run_dir / 'results.json'}: no disk and host->device floors recorded")
    return floors


def models(run: RunFiles) -> list[dict]:
    """The child summaries of raw/models.jsonl, for the models the params name (the notebook's table of children)."""
    wanted = set(run.params.MODELS)
    return [m.as_recorded() for m in run.records("models.jsonl") if m.model in wanted]


def arms(run: RunFiles) -> list[dict]:
    return report.arm_table(rows(run))


def crossover(run: RunFiles) -> list[dict]:
    return report.crossover_table(arms(run), rows(run))


def components(run: RunFiles) -> list[dict]:
    return report.component_table(rows(run))


def floor_distance(run: RunFiles) -> list[dict]:
    """``report.floor_table``: each cost's interval from the rows, its verdict against a physical floor on CUDA only
    (on the CPU the floors are timed beside the engine's threads, as ``restore_resolution`` judges them), against the
    floors timed around its point where the run has the paired design (raw/point_floors.jsonl)."""
    around = [] if predates_pairs(run) else run.records("point_floors.jsonl")
    return report.floor_table(arms(run), recorded_floors(run), rows(run), bound=run.params.DEVICE == "cuda",
                              point_floors=around)


def splits(run: RunFiles) -> list[dict]:
    return report.split_table(rows(run))


def scatter_sources(run: RunFiles) -> list[dict]:
    return report.scatter_table(rows(run))


def forward_steps(run: RunFiles) -> list[dict]:
    return report.forward_step_table(rows(run))


def forward_step_pairs(run: RunFiles) -> list[dict]:
    return report.forward_step_pairs(rows(run))


def restore_resolution(run: RunFiles):
    """``report.resolution_table``; ABSENT where the run predates the paired design (``gaps.predates_pairs``: no
    raw/pairs.jsonl, and params that plan none). A run planned in the design whose children measured no pair has
    the table, empty."""
    if predates_pairs(run):
        return ABSENT
    return report.resolution_table(run.records("pairs.jsonl"), run.records("point_floors.jsonl"),
                                   bound=run.params.DEVICE == "cuda")


TABLES: dict[str, Table] = {
    "floors": recorded_only("the physical floors (disk, host->device, device->device bandwidth) are measured live by "
                            "the notebook's own process, not from a capture; floor_distance is rebuilt from them"),
    "grid_seconds": recorded_only("the grid's wall-clock seconds, timed by the notebook around its children"),
    "models": Table(models),
    "arms": Table(arms),
    "crossover": Table(crossover),
    "components": Table(components),
    "floor_distance": Table(floor_distance),
    "splits": Table(splits),
    "scatter_sources": Table(scatter_sources),
    "forward_steps": Table(forward_steps),
    "forward_step_pairs": Table(forward_step_pairs),
    "restore_resolution": Table(restore_resolution),
}

# each rebuildable table's check (``checks.table_checks``): its name, and why the table can be empty (its evidence
# missing), in the order the checks are listed
TITLES = {
    "arms": ("results.json median first token per (model, context, arm) equal the rows",
             "raw/rows.jsonl holds no measured rows"),
    "crossover": ("results.json crossover points equal the rows", "raw/rows.jsonl holds no measured rows"),
    "components": ("results.json per-component medians equal the rows", "raw/rows.jsonl holds no measured rows"),
    "floor_distance": ("results.json distance to the floors equal the rows and the recorded floors",
                       "no path of the rows has a floor"),
    "splits": ("results.json restore timeline splits equal the rows",
               "raw/rows.jsonl records no restore timeline (only the GPU buffer and vLLM's CPU tier record one)"),
    "scatter_sources": ("results.json forward-step spread and its sources equal the rows",
                        "no row records the GPU's clocks (the CPU build, or a run before NVML was read)"),
    "forward_steps": ("results.json forward passes' own spans against the resident's equal the rows",
                      "no row records its forward pass's span (no GPU-buffer arms, or a run before the tier timed them)"),
    "forward_step_pairs": ("results.json forward passes paired by repeat, pooled over the points equal the rows",
                           "no two repeats record a forward pass's span for a pair of arms"),
    "models": ("results.json child summaries equal raw/models.jsonl", "raw/models.jsonl records no child of MODELS"),
    "restore_resolution": ("results.json restore spans and paired first-token differences against the floors per "
                           "point equal raw/pairs.jsonl and raw/point_floors.jsonl",
                           "raw/pairs.jsonl holds no restore/resident pair"),
}


def recomputed_tables(run: RunFiles) -> dict:
    """Every rebuildable table of ``run`` for the report and the public document; floor_distance only where the
    run recorded its floors (``recorded_floors``)."""
    out = {}
    for name, table in TABLES.items():
        if table.build is None:
            continue
        try:
            value = table.build(run)
            if value is not ABSENT:
                out[name] = value
        except RunFileError:
            if name != "floor_distance":
                raise
    return out


__all__ = ["PAIRED_SINCE", "TABLES", "TITLES", "recomputed_tables", "recorded_floors"]
