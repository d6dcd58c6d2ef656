"""Section 16's declared result (``base.declared``): every table ``results.json`` holds, each built from
``raw/groups.jsonl`` and ``raw/blocks.jsonl`` alone, read as their declared records (``captures``).

    blocks             every engine run's summary as ``raw/blocks.jsonl`` holds it (the not-available rows too)
    arms               per combination and arm: both stopwatches, disk MiB per phase, counters agreeing
    discard_to_retain  per combination: discard / retain of the arms' medians (from ``arms``), and discard - retain
                       of each stopwatch paired by pair, the median difference with its order-statistic interval and coverage
    not_run            what did not run, and why
    rereads            per block, each measured discard group's follow-up reads of the context
    arrivals           per combination and arm: reads per group and per follow-up, lookup mechanisms
    restore_split      the GPU buffer's restores, split
    topology           the striped row and the GPU buffer's route, as the run recorded the machine

The notebook and the GPU driver save them with ``record.save_tables(TABLES)``; ``kmesh verify`` builds
them again and holds results.json to them; the section's figure checks compare the same builds.
"""
from __future__ import annotations

from kmesh_lib.base.declared import Table
from kmesh_lib.sections.retention import report as rr
from kmesh_lib.sections.retention.captures import RetentionEngineRun, RetentionGroup
from kmesh_lib.workloads.context_checks import topology_rows


def _groups(run) -> list[RetentionGroup]:
    return run.records("groups.jsonl")


def _blocks(run) -> list[RetentionEngineRun]:
    return run.records("blocks.jsonl")


TABLES: dict[str, Table] = {
    "blocks": Table(lambda run: [b.as_recorded() for b in _blocks(run)]),
    "arms": Table(lambda run: rr.arm_rows(_groups(run))),
    "discard_to_retain": Table(lambda run: rr.ratio_rows(rr.arm_rows(_groups(run)), _groups(run))),
    "not_run": Table(lambda run: rr.unavailable_rows(_blocks(run))),
    "rereads": Table(lambda run: rr.rereads_by_block(_groups(run))),
    "arrivals": Table(lambda run: rr.arrival_rows(_groups(run))),
    "restore_split": Table(lambda run: rr.restore_rows(_groups(run))),
    "topology": Table(lambda run: topology_rows(_blocks(run))),
}

__all__ = ["TABLES"]
