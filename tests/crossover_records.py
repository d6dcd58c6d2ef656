"""Section 21's typed records from the hand-made rows its tests write: each field a test leaves out at a neutral
value (the rows a test builds name only what it is about), then validated by the capture's class as
``RunFiles.records`` reads a run's files."""
from __future__ import annotations

from kmesh_lib.sections.crossover.captures import ChildSummary, GridRow, PairRow, PointFloors

COMPONENTS = {"lookup_s": 0.0, "lookup_calls": 0, "lookup_wall_s": None, "disk_read_s": None, "disk_reads": None,
              "load_s": None, "save_s": None, "forward_s": 0.0, "exec_s": 0.0, "exec_calls": 0, "other_s": 0.0}
FOLLOW_UP = {"arm": "recompute", "tier": "lmcache", "context": "m", "context_tokens": 0, "tag": "t", "status": "ok",
             "ttft_s": 0.0, "makespan_s": 0.0, "num_cached_tokens": [], "expected_cached_tokens": 0, "disk_read_bytes": 0,
             "device_read_bytes": None, "prep_s": 0.0, "memory_tier_bytes": 0, "components": COMPONENTS, "model": "m",
             "path": "mp", "measured": True, "kv_bytes_per_token": 1024, "context_bytes": 0}
GRID_ROW = {**FOLLOW_UP, "repeat": 0}
PAIR_ROW = {**FOLLOW_UP, "pair": 0, "role": "restore", "pair_arm": "dram", "pair_position": 0}
CHILD = {"model": "m", "tier": "lmcache", "path": "mp", "kv_bytes_per_token": 1024, "status": "ok"}
POINT_FLOORS = {"model": "m", "tier": "lmcache", "context_tokens": 0, "context_bytes": 0, "when": "before", "floors": {}}


def _filled(defaults: dict, row: dict) -> dict:
    return {**defaults, **row, "components": {**COMPONENTS, **row.get("components", {})}}


def as_grid_rows(rows: list[dict]) -> list[GridRow]:
    return [GridRow.model_validate(_filled(GRID_ROW, r)) for r in rows]


def as_pair_rows(rows: list[dict]) -> list[PairRow]:
    return [PairRow.model_validate(_filled(PAIR_ROW, r)) for r in rows]


def as_children(records: list[dict]) -> list[ChildSummary]:
    return [ChildSummary.model_validate({**CHILD, **c}) for c in records]


def as_point_floors(records: list[dict]) -> list[PointFloors]:
    return [PointFloors.model_validate({**POINT_FLOORS, **f}) for f in records]
