"""A section's declared result: the tables ``results.json`` holds, each a function of the run's files.

A section exports ``TABLES = {name: Table(build)}``. Its notebook saves them with
``RunRecord.save_tables(section.TABLES)``, never by hand, and ``kmesh verify`` builds them again
from the run's files and holds ``results.json`` to them with one comparator
(``base.checks.differences``): the same tables, the same columns, the same rows, floats within the
table's ``rel_tol``.

Invariants ``kmesh verify`` states about a finished run's ``results.json``:

- every key is a run field (``RUN_FIELDS``: status, checks, times, hashes) or a declared table;
- every declared table is present, and equal to the one built from ``raw/`` and the params;
- a table declared ``recorded_only`` (a figure the run measured and kept only in results.json: a
  mode's wall-clock time) cannot be rebuilt, and the verify line says so; a run that did not
  measure it has none (nothing is claimed).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from kmesh_lib.base.checks import differences

# results.json keys that are the run's bookkeeping, not its figures (base.records writes them)
RUN_FIELDS = frozenset({
    "section", "run_id", "status", "checks", "check_counts", "started_utc", "finished_utc", "ended_utc",
    "error", "render_environment", "migration", "capture_sha256", "capture_sha256_as_measured", "runner",
    "inputs",  # SHA-256s of the inputs read from outside the run folder (a corpus, a puzzle list)
})


@dataclass(frozen=True)
class Table:
    """One declared table: ``build(run)`` gives its value from the run's files.

    ``recorded_only`` says why a table cannot be rebuilt from ``raw/`` (``build`` is then None):
    verify names it as not recomputable, and does not require it.
    """

    build: Callable[[Any], Any] | None
    rel_tol: float = 1e-9
    recorded_only: str = ""

    def __post_init__(self) -> None:
        if (self.build is None) == (not self.recorded_only):
            raise ValueError("a Table has a build function, or says why it is recorded only (not both)")


def recorded_only(why: str) -> Table:
    """A table the run measured and kept only in results.json (a wall-clock time): present, not rebuilt."""
    return Table(None, recorded_only=why)


def as_table(value: Table | Callable[[Any], Any]) -> Table:
    return value if isinstance(value, Table) else Table(value)


def json_default(obj: Any):
    """How results.json and raw/ store what JSON has no type for: numpy scalars, DataFrames, sets, paths."""
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, PurePath):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def json_value(value: Any) -> Any:
    """``value`` as results.json stores it (a JSON round trip: tuples become lists, numpy scalars numbers)."""
    if hasattr(value, "to_json") and hasattr(value, "columns"):  # a DataFrame is saved as its records
        return json.loads(value.to_json(orient="records"))
    return json.loads(json.dumps(value, default=json_default))


def build_tables(tables: Mapping[str, Table | Callable], run: Any) -> dict[str, Any]:
    """Every rebuildable declared table of ``run``, as results.json stores it."""
    return {name: json_value(table.build(run)) for name, table in ((n, as_table(t)) for n, t in tables.items())
            if table.build is not None}


@dataclass(frozen=True)
class TableLine:
    """One verify line about results.json: a declared table (or an undeclared key) and what differs."""

    name: str
    problems: tuple[str, ...] = ()
    recorded_only: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems


def compare_tables(tables: Mapping[str, Table | Callable], run: Any, results: Mapping[str, Any],
                   max_problems: int = 5) -> list[TableLine]:
    """results.json held to the declared tables of ``run`` (module docstring); one line per table and
    one per undeclared key."""
    lines = []
    for name, table in tables.items():
        table = as_table(table)
        if name not in results and table.build is None:
            continue
        if name not in results:
            lines.append(TableLine(name, ("declared, not in results.json",)))
            continue
        if table.build is None:
            lines.append(TableLine(name, recorded_only=table.recorded_only))
            continue
        try:
            built = json_value(table.build(run))
        except Exception as e:  # noqa: BLE001 - a table that cannot be built from these files is a finding
            lines.append(TableLine(name, (f"cannot be built from the run's files: {type(e).__name__}: {e}"[:300],)))
            continue
        found = differences(built, results[name], name, table.rel_tol)
        lines.append(TableLine(name, tuple(found[:max_problems]) + ((f"... {len(found) - max_problems} more",)
                                                                    if len(found) > max_problems else ())))
    for name in results:
        if name not in tables and name not in RUN_FIELDS:
            lines.append(TableLine(name, ("in results.json, not a declared table or run field",)))
    return lines


__all__ = ["RUN_FIELDS", "Table", "TableLine", "as_table", "build_tables", "compare_tables", "json_default", "json_value",
           "recorded_only"]
