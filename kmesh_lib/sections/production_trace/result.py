"""Section 23's declared result (``base.declared``): every table ``results.json`` holds, built from ``raw/``
(the trace, the replay arms, the parity slice, section 21's costs) and the params, as ``checks`` build them.

The run saves them with ``record.save_tables(TABLES)`` once raw/ is written; ``kmesh verify`` builds them
again here and holds results.json to them. They come from ``tables.derived``, built once per content of raw/ and the
params in a process, so the checks and these declarations of one verify share one build (the costly part).
"""
from __future__ import annotations

from kmesh_lib.base.declared import ABSENT, Table, recorded_only
from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections.production_trace import tables
from kmesh_lib.sections.production_trace.params import PARITY, REPLAY, TRACE
from kmesh_lib.sections.production_trace.trace import trace_name, trace_stats


def _trace(run):
    run = RunFiles.of(run)
    return {"name": trace_name(run.params), **trace_stats(tables.requests_of(run.records(TRACE)))}


def _concurrent(run):
    arms = RunFiles.of(run).records(REPLAY)
    return tables.derived(run)["concurrent"] if any(a.mode == "concurrent" for a in arms) else ABSENT


def _parity(run):
    parity = RunFiles.of(run).records(PARITY)
    return tables.parity_table(parity) if parity else ABSENT


TABLES = {
    "trace": Table(_trace),
    "pools": Table(lambda run: tables.derived(run)["pools"]),
    "replays": Table(lambda run: tables.derived(run)["replays"]),
    "concurrent": Table(_concurrent),
    "tiers": Table(lambda run: tables.derived(run)["tiers"]),
    "engines": Table(lambda run: tables.derived(run)["engines"]),
    "parity": Table(_parity),
    "replay_not_run": recorded_only("the pools the run found too small to replay the trace in, as it planned them"),
    "seconds": recorded_only("wall-clock seconds of each part of the run"),
}

__all__ = ["TABLES"]
