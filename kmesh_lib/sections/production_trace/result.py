"""Section 23's declared result (``base.declared``): every table ``results.json`` holds, built from ``raw/``
(the trace, the replay arms, the parity slice, section 21's costs) and the params, as ``checks`` build them.

The run computes each table once while it measures and saves it; ``kmesh verify`` builds them again here
and holds results.json to them. The access trace is built once per run folder read (it is the costly part).
"""
from __future__ import annotations

from functools import lru_cache

from kmesh_lib.base.declared import ABSENT, Table, recorded_only
from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections.production_trace import tables
from kmesh_lib.sections.production_trace.experiment import trace_name
from kmesh_lib.sections.production_trace.params import COSTS, PARITY, REPLAY, TRACE
from kmesh_lib.sections.production_trace.trace import access_trace, trace_stats


@lru_cache(maxsize=2)
def _inputs(run_dir: str, raw_sha: str):
    run = RunFiles(run_dir)
    cfg = run.params
    requests = tables.requests_of(run.raw(TRACE))
    return cfg, requests, access_trace(requests, cfg.BLOCK_SIZE), run.raw(REPLAY), run.raw(COSTS)


def _of(run: RunFiles):
    run = RunFiles.of(run)
    return _inputs(str(run.run_dir), run.raw_sha256(TRACE) or "")


def _trace(run):
    cfg, requests, _, _, _ = _of(run)
    return {"name": trace_name(cfg), **trace_stats(requests)}


def _concurrent(run):
    cfg, _, access, arms, _ = _of(run)
    rows = tables.concurrent_rows(cfg, access, arms)
    return rows if any(a.get("mode") == "concurrent" for a in arms) else ABSENT


def _parity(run):
    parity = RunFiles.of(run).raw(PARITY)
    return tables.parity_table(parity) if parity else ABSENT


TABLES = {
    "trace": Table(_trace),
    "pools": Table(lambda run: tables.pool_table(_of(run)[0], _of(run)[2], _of(run)[3])),
    "replays": Table(lambda run: tables.replay_rows(_of(run)[0], _of(run)[2], _of(run)[3])),
    "concurrent": Table(_concurrent),
    "tiers": Table(lambda run: tables.tier_table(_of(run)[0], _of(run)[2], _of(run)[4])),
    "engines": Table(lambda run: tables.engine_table(_of(run)[0], _of(run)[2])),
    "parity": Table(_parity),
    "replay_not_run": recorded_only("the pools the run found too small to replay the trace in, as it planned them"),
    "seconds": recorded_only("wall-clock seconds of each part of the run"),
}

__all__ = ["TABLES"]
