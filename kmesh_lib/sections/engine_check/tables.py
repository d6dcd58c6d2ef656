"""Section 00's declared result (``base.declared``): one table per arm, built from ``raw/``.

An arm's table is named as the arm (``<ENGINE>-B<BLOCK_SIZE>``, ``replay-B<REPLAY_BLOCK_SIZE>``):
its engine, block size, per-request rows and block operations per kind (``checks.arm_table``, from
``raw/requests.jsonl`` and ``raw/block_events.jsonl``). Two fields only the live run knew are
``live``: ``start_s`` (the engine's start, wall-clock) and ``drain_ok`` (the live pool's drain
report, the evidence of the recorded-only drain check). An arm without raw requests has no table.
"""
from __future__ import annotations

from kmesh_lib.base.declared import Table
from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections.engine_check.checks import LIVE, arm_table, arms


def engine_arm(run: RunFiles) -> dict:
    return arm_table(run, list(arms(run.params))[0])


def replay_arm(run: RunFiles) -> dict:
    return arm_table(run, list(arms(run.params))[1])


TABLES = {
    "{ENGINE}-B{BLOCK_SIZE}": Table(engine_arm, live=LIVE),
    "replay-B{REPLAY_BLOCK_SIZE}": Table(replay_arm, live=LIVE),
}

__all__ = ["TABLES"]
