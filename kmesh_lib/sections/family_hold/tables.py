"""Section 18's declared result (``base.declared``): every table results.json holds, from ``raw/``.

- ``real``, ``replay`` and (where the replay engine's sizes differ from the real engine's)
  ``replay_at_real``: per run mode, the engine (from its ``kmesh.capture/1`` records) and the figures
  ``report.summarize_mode`` computes from the mode's arm-samples; ``controller`` (the family-hold
  controller's counters) and ``all_drained`` (the live pool's start, drain and reset checks) only the
  live run knew: ``live``. A mode the run did not record has no table;
- ``parity_real_vs_replay``: per arm-sample, the real engine's counts against the replay engine's at
  the same sizes;
- ``sweep`` and ``sweep_crossing_parent_share``: the sweep's rows and crossing from
  ``raw/sweep.jsonl``; a run recorded before that capture existed cannot rebuild them
  (``NotRecomputable``: recorded only in that run);
- ``real_mode_s`` and ``replay_mode_s``: wall-clock times, recorded only.
"""
from __future__ import annotations

from kmesh_lib.base.declared import ABSENT, NotRecomputable, Table, recorded_only
from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections.family_hold import report
from kmesh_lib.sections.family_hold.recorded import read_mode, read_sweep, twin_mode

LIVE_MODE = ("controller", "all_drained")  # what only the live run knew of a mode: recorded, not rebuilt


def engine_of(run: RunFiles, mode: str) -> dict | None:
    """The engine the mode's capture records name (``report.engine_info``, written into each record)."""
    engines = [r.engine for r in run.records(f"capture.{mode}.jsonl")]
    return engines[0].model_dump(exclude_unset=True) if engines and all(e == engines[0] for e in engines) else None


def mode_table(run: RunFiles, mode: str) -> dict:
    """A run mode's table; ``ABSENT`` when the run did not record the mode (or its params do not run it)."""
    if mode == "replay_at_real" and twin_mode(run.params) != mode:
        return ABSENT
    arms = read_mode(run, mode)
    if not arms:
        return ABSENT
    return {"engine": engine_of(run, mode), **report.summarize_mode(arms, run.params.LOGPROB_TOLERANCE)}


def parity_table(run: RunFiles) -> list[dict]:
    return report.same_counts(read_mode(run, "real"), read_mode(run, twin_mode(run.params)))


def sweep_table(run: RunFiles) -> list[dict]:
    if not run.has_raw("sweep.jsonl"):
        raise NotRecomputable("raw/sweep.jsonl absent (the run was recorded before the sweep's capture existed)")
    return report.sweep_rows(read_sweep(run))


def crossing_table(run: RunFiles) -> float | None:
    return report.crossing(sweep_table(run))


def _mode(mode: str):
    def build_mode(run: RunFiles) -> dict:
        return mode_table(run, mode)
    build_mode.__name__ = f"{mode}_table"
    return build_mode


TABLES = {
    "real": Table(_mode("real"), live=LIVE_MODE),
    "replay": Table(_mode("replay"), live=LIVE_MODE),
    "replay_at_real": Table(_mode("replay_at_real"), live=LIVE_MODE),
    "parity_real_vs_replay": Table(parity_table),
    "sweep": Table(sweep_table),
    "sweep_crossing_parent_share": Table(crossing_table),
    "real_mode_s": recorded_only("wall-clock seconds of the first run mode: engine start and every arm-sample"),
    "replay_mode_s": recorded_only("wall-clock seconds of the replay mode: engine start and every arm-sample"),
    "real_engine_settings": recorded_only("the attention backend, batch-invariant mode and norm the live engine's "
                                          "layers reported (issue 47): what the engine ran, read while it ran"),
}

__all__ = ["LIVE_MODE", "TABLES", "engine_of", "mode_table", "parity_table", "sweep_table"]
