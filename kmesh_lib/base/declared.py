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

Four shapes a section's record takes, each said once in the declaration, never decided by the record:

- ``Table(build, live=("start_s",))``: a table whose named top-level fields only the live run knew (an
  engine's start time, the live pool's drain report); ``build`` gives the rest, the live fields must
  be recorded (``save_tables`` keeps the ones the notebook saved) and are named on the verify line;
- a table name with ``{PARAM}`` fields (``"{ENGINE}-B{BLOCK_SIZE}"``) is named from the run's params;
- ``build`` returning ``ABSENT``: this run has no such table (a mode its params do not run); it must
  then be absent from results.json (None is a value: a crossing that does not exist);
- ``build`` raising ``NotRecomputable(why)``: this run's files cannot rebuild it (a run recorded before
  the raw capture it needs); verify requires it present and lists it as recorded only, with why.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from kmesh_lib.base.checks import differences
from kmesh_lib.base.params import to_dict

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
    live: tuple[str, ...] = ()  # top-level fields only the live run knew: recorded, not rebuilt

    def __post_init__(self) -> None:
        if (self.build is None) == (not self.recorded_only):
            raise ValueError("a Table has a build function, or says why it is recorded only (not both)")
        if self.live and self.build is None:
            raise ValueError("live fields belong to a table that is otherwise rebuilt")


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()  # what a build returns for a table this run does not have


class NotRecomputable(Exception):
    """Raised by a ``build``: this run's files cannot rebuild the table (the message says why)."""


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


def named(tables: Mapping[str, Table | Callable], run: Any) -> dict[str, Table]:
    """The declared tables under the names ``run`` gives them (``{PARAM}`` fields from its params)."""
    out: dict[str, Table] = {}
    for name, table in tables.items():
        key = name.format(**to_dict(run.params)) if "{" in name else name
        if key in out:
            raise ValueError(f"declared tables {name!r} and another are both named {key!r} in this run")
        out[key] = as_table(table)
    return out


def _live_values(table: Table, recorded: Any) -> dict[str, Any]:
    return {f: recorded[f] for f in table.live if isinstance(recorded, Mapping) and f in recorded}


def build_tables(tables: Mapping[str, Table | Callable], run: Any,
                 recorded: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every declared table ``run``'s files rebuild, as results.json stores it; a table's live fields
    are taken from ``recorded`` (what the live run saved), a table the run lacks is left out."""
    out = {}
    for name, table in named(tables, run).items():
        if table.build is None:
            continue
        try:
            value = table.build(run)
        except NotRecomputable:
            continue
        if value is ABSENT:
            continue
        value = json_value(value)
        if table.live:
            value = {**value, **_live_values(table, (recorded or {}).get(name))}
        out[name] = value
    return out


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
    try:
        declared = named(tables, run)
    except Exception as e:  # noqa: BLE001 - names the params cannot give are a finding about the run
        return [TableLine("(declared table names)", (f"{type(e).__name__}: {e}"[:300],))]
    for name, table in declared.items():
        built, why = None, table.recorded_only
        if table.build is not None:
            try:
                built = table.build(run)
                built = built if built is ABSENT else json_value(built)
            except NotRecomputable as e:
                why = f"not recomputable from this run's files: {e}"
            except Exception as e:  # noqa: BLE001 - a table that cannot be built from these files is a finding
                lines.append(TableLine(name, (f"cannot be built from the run's files: {type(e).__name__}: {e}"[:300],)))
                continue
        if name not in results:
            absent = (built is ABSENT and not why) or table.build is None  # no such table, or none measured
            lines.append(TableLine(name, () if absent else ("declared, not in results.json",)))
            continue
        if why:
            lines.append(TableLine(name, recorded_only=why))
            continue
        if built is ABSENT:
            lines.append(TableLine(name, ("in results.json, but this run's files and params have no such table",)))
            continue
        recorded = results[name]
        found = []
        if table.live:
            if not isinstance(recorded, Mapping):
                found.append(f"{name}: recorded {type(recorded).__name__}, a table with live fields is a mapping")
            else:
                found += [f"{name}.{f}: live field not recorded" for f in table.live if f not in recorded]
                recorded = {k: v for k, v in recorded.items() if k not in table.live}
        found += differences(built, recorded, name, table.rel_tol)
        lines.append(TableLine(name, tuple(found[:max_problems]) + ((f"... {len(found) - max_problems} more",)
                                                                    if len(found) > max_problems else ()),
                               recorded_only=f"live fields {', '.join(table.live)}" if table.live else ""))
    for name in results:
        if name not in declared and name not in RUN_FIELDS:
            lines.append(TableLine(name, ("in results.json, not a declared table or run field",)))
    return lines


__all__ = ["ABSENT", "RUN_FIELDS", "NotRecomputable", "Table", "TableLine", "as_table", "build_tables", "compare_tables",
           "json_default", "json_value", "named", "recorded_only"]
