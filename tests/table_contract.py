"""The declared-tables contract a section's tests state on a run folder (``base.declared``).

``record.save_tables(TABLES)`` stores what ``kmesh verify`` rebuilds, so the comparison passes; and
each damage the comparator must catch is reported on the table it touched: a column dropped from
one row, a table emptied, a key no table declares.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from kmesh_lib.base.declared import compare_tables
from kmesh_lib.base.records import RunFiles, RunRecord


def problems(tables, run_dir: Path) -> dict[str, tuple[str, ...]]:
    run = RunFiles(run_dir)
    return {line.name: line.problems for line in compare_tables(tables, run, run.results) if line.problems}


def _first_row(value, path=()):
    """The path to the first mapping inside a list (a table's row), else to the first non-empty mapping."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, dict) and item:
                return (*path, i)
            found = _first_row(item, (*path, i))
            if found is not None:
                return found
    if isinstance(value, dict):
        for key, item in value.items():
            found = _first_row(item, (*path, key))
            if found is not None:
                return found
        return path if value and path else None
    return None


def _rewrite(run_dir: Path, edit) -> None:
    results = json.loads((run_dir / "results.json").read_text())
    edit(results)
    (run_dir / "results.json").write_text(json.dumps(results))


def assert_table_contract(tables, key: str, source: Path, tmp_path: Path) -> dict:
    """``save_tables`` on a copy of ``source`` stores tables that compare clean; then each damage is
    reported on its table. Returns the stored tables."""
    run_dir = tmp_path / "tables"
    shutil.copytree(source, run_dir)
    stored = RunRecord(run_dir, key).save_tables(tables)
    assert stored, "save_tables stored no table"
    assert problems(tables, run_dir) == {}

    name = next(n for n, v in stored.items() if _first_row(v) is not None)
    where = _first_row(stored[name])
    damaged = tmp_path / "damaged"

    def drop_column(results):
        row = results[name]
        for step in where:
            row = row[step]
        row.pop(next(iter(row)))

    def empty(results):
        results[name] = type(results[name])()

    def undeclared(results):
        results["hand_made_table"] = [{"a": 1}]

    for edit, touched in ((drop_column, name), (empty, name), (undeclared, "hand_made_table")):
        shutil.rmtree(damaged, ignore_errors=True)
        shutil.copytree(run_dir, damaged)
        _rewrite(damaged, edit)
        found = problems(tables, damaged)
        assert list(found) == [touched], (edit.__name__, found)
    return stored
