"""Section 20's declared result (``base.declared``): every table ``results.json`` holds, each built from
``raw/groups.jsonl``, ``raw/blocks.jsonl`` and the params (read once, as ``PrefetchParams``).

    scaled, bootstrap          whether the sizes are below the paper's; the resampling the intervals use
                               (this code's method, the run's BOOTSTRAP_RESAMPLES and SEED)
    engine_runs                every engine run's summary as ``raw/blocks.jsonl`` holds it
    confirmation_lead_ms       the lead each path and group size's confirmation used
    pilot_readiness, lead_sweep, example_4, all_cases, all_cases_with_recomputed, placement, disk_reads,
    singleflight, restore_split, driver_overhead, recomputed_groups    the tables of ``stats``
    topology                   the striped row and the GPU buffer's route, as the run recorded the machine
    lead_choice                per pilot lead: ready x/n, its one-sided 95 % lower bound, whether LEAD_RULE takes it;
                               the confirmation's ready-at-T with its 95 % interval at the chosen lead (absent from
                               runs recorded before LEAD_RULE)

The intervals are recomputed with the run's own resamples and seed, always: a run whose results name
another resampling differs in ``bootstrap`` and in every table with intervals. The notebook and the GPU
driver save them with ``record.save_tables(TABLES)``; ``kmesh verify`` builds them again and holds
results.json to them; the section's figure checks compare the same builds.
"""
from __future__ import annotations

from kmesh_lib.base.declared import ABSENT, Table
from kmesh_lib.sections.prefetch import stats as ps
from kmesh_lib.sections.prefetch.captures import PrefetchEngineRun, PrefetchGroup
from kmesh_lib.sections.prefetch.params import PrefetchParams, scaled
from kmesh_lib.workloads.context_checks import topology_rows


def groups_of(run) -> list[PrefetchGroup]:
    """The run's groups, each with its status (``recomputed`` derived for runs recorded before it existed)."""
    return ps.classify(run.records("groups.jsonl"))


def confirmation_leads(blocks: list[PrefetchEngineRun]) -> dict[str, float]:
    """The lead each engine run's confirmation used, by path and group size."""
    return {f"{b.path} N={b.group_size}": b.lead_ms for b in blocks if b.lead_ms is not None}


def bootstrap(cfg: PrefetchParams) -> dict:
    """The resampling of every interval: this code's method, the run's resamples and seed."""
    return {"method": ps.BOOTSTRAP, "resamples": cfg.BOOTSTRAP_RESAMPLES, "seed": cfg.SEED}


def _resampled(table):
    """A table with intervals: ``table(groups, resamples, seed)`` with the run's own resamples and seed."""
    def build(run):
        cfg = run.params
        return table(groups_of(run), cfg.BOOTSTRAP_RESAMPLES, cfg.SEED)
    return Table(build)


def _example_4(run) -> dict:
    groups = groups_of(run)
    return ps.example(groups, sorted({g.path for g in groups})[0], 4) if groups else {}


def _of_groups(table):
    return Table(lambda run: table(groups_of(run)))


def _lead_choice(run):
    """The pilot's lead choice under the run's LEAD_RULE; absent from runs recorded before the rule was a parameter
    (their params.resolved.yaml names none: they chose the shortest all-ready lead, pilot_readiness shows it)."""
    if "LEAD_RULE" not in run.recorded_params:
        return ABSENT
    cfg = run.params
    return ps.lead_choice(groups_of(run), list(cfg.LEADS_MS), cfg.LEAD_RULE)


TABLES: dict[str, Table] = {
    "scaled": Table(lambda run: bool(scaled(run.params))),
    "bootstrap": Table(lambda run: bootstrap(run.params)),
    "engine_runs": Table(lambda run: [b.as_recorded() for b in run.records("blocks.jsonl")]),
    "pilot_readiness": _of_groups(ps.pilot_table),
    "confirmation_lead_ms": Table(lambda run: confirmation_leads(run.records("blocks.jsonl"))),
    "example_4": Table(_example_4),
    "all_cases": _resampled(ps.all_cases),
    "all_cases_with_recomputed": _resampled(lambda groups, resamples, seed: ps.all_cases(groups, resamples, seed,
                                                                                       with_recomputed=True)),
    "placement": _resampled(ps.placement),
    "disk_reads": _of_groups(ps.disk_reads),
    "singleflight": _of_groups(ps.singleflight_table),
    "restore_split": _of_groups(ps.restore_rows),
    "topology": Table(lambda run: topology_rows(run.records("blocks.jsonl"))),
    "driver_overhead": _of_groups(ps.overhead),
    "recomputed_groups": _of_groups(ps.recomputed_groups),
    "lead_sweep": _of_groups(ps.lead_sweep),
    "lead_choice": Table(_lead_choice),
}

__all__ = ["TABLES", "bootstrap", "confirmation_leads", "groups_of"]
