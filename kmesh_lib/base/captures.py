"""A section's declared captures: one typed, versioned record class per ``raw/*.jsonl``, and its ``Params``.

A section declares what its run folder holds next to its ``TABLES``::

    CAPTURES = {"groups.jsonl": GroupRecord, "blocks.jsonl": EngineRunRecord}
    declare(KEY, Params, CAPTURES)       # in the section's __init__

A record class is a frozen pydantic model (``CaptureRecord``) that forbids fields it does not declare and
validates strictly (an int field refuses ``"12"`` and ``true``; a float field takes an int). Its field names
and types are the ones the code writes, units in the names (``makespan_s``, ``context_bytes``); a field
that only some records carry (a path's own, or one added after runs were published) is optional, and its
comment says which records lack it and why.

Both directions go through the class:

- writing: ``RunRecord.append_jsonl`` validates every record as it will be stored (its JSON round trip)
  before the line is written; a wrong field fails then, naming the capture and the field;
- reading: ``RunFiles.records(name)`` gives the typed records; a line that does not validate is a
  ``RunFileError`` naming the file, the line and the field, so ``kmesh verify`` reports it as one line.

**The schema version is a header line**, the file's first: ``{"schema": "retention.groups", "version": 1}``.
A header rather than a field in every line because the records stay exactly what the run measured (section
16's ``blocks`` table publishes ``raw/blocks.jsonl`` as recorded, and a 7,620-line capture would carry the
same two fields 7,620 times), and because it says what the whole file is before any record is read. It is
written when the file is created (``append_jsonl``; the later appends, from this or a child process, find
it there). ``read_jsonl`` and ``RunFiles.raw`` leave it out of the records; ``RunFiles.records`` holds it to
the class. A file without a header is version 1: the runs published before this declaration (their raw
captures are evidence and never edited) read with the same classes. A file whose header names another
schema or a version this code does not know is a ``RunFileError``. When a class changes incompatibly,
its ``VERSION`` goes up and the class before stays readable (``LEGACY = {1: OldRecord}`` on the new one).

Base imports no section, so the declarations are registered (``declare``) by the section packages as they
are imported, and a run folder finds its section's by the section name ``results.json`` records.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

HEADER_KEYS = frozenset({"schema", "version"})
UNVERSIONED = 1  # what a file without a header is: the runs recorded before captures had versions


class CaptureRecord(BaseModel):
    """One line of a capture. Subclasses set ``SCHEMA`` (``"<section>.<capture>"``) and ``VERSION``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)

    SCHEMA: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1
    LEGACY: ClassVar[dict[int, type[CaptureRecord]]] = {}  # earlier versions this code still reads

    def holds(self, field_name: str) -> bool:
        """Whether the stored line holds the field, even as null (an optional field a run recorded before it
        existed is absent, and reads as its default)."""
        return field_name in self.model_fields_set

    def as_recorded(self) -> dict[str, Any]:
        """The record as the capture stores it: its own field names (aliases), only the fields it has; a value
        renamed since (``renamed_values``) under its current name."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)

    @classmethod
    def header(cls) -> dict[str, Any]:
        return {"schema": cls.SCHEMA, "version": cls.VERSION}

    @classmethod
    def reading(cls, version: int) -> type[CaptureRecord] | None:
        """The class that reads a file of ``version``; None when this code does not know it."""
        return cls if version == cls.VERSION else cls.LEGACY.get(version)


class CaptureError(ValueError):
    """A record, or a capture's header, that its declared class refuses. The message names the field."""


def is_header(record: Mapping[str, Any]) -> bool:
    """Whether a capture's first line is its schema header (exactly the keys ``schema`` and ``version``)."""
    return set(record) == HEADER_KEYS


def field_problems(error: ValidationError, limit: int = 3) -> str:
    """A pydantic error as one short clause per field: ``field 'x': not declared; field 'y': Field required``."""
    out = []
    for e in error.errors()[:limit]:
        where = ".".join(str(p) for p in e["loc"]) or "(record)"
        what = "not declared" if e["type"] == "extra_forbidden" else e["msg"]
        out.append(f"field {where!r}: {what}")
    more = len(error.errors()) - limit
    return "; ".join(out) + (f"; {more} more" if more > 0 else "")


def validate_record(cls: type[CaptureRecord], record: Mapping[str, Any], writing: bool = False) -> CaptureRecord:
    """``record`` as ``cls``; CaptureError naming the fields otherwise. ``writing``: a record about to be stored
    (``renamed_values`` refuses an old name there, and reads it as the new one otherwise)."""
    try:
        return cls.model_validate(record, context={"writing": writing})
    except ValidationError as e:
        raise CaptureError(field_problems(e)) from None


def renamed_values(*fields: str, renamed: Mapping[str, str]) -> Any:
    """A class's before-validator of ``fields``: a value a capture recorded under a name renamed since reads as its
    current name (``renamed``: old -> new). A published capture is evidence and keeps the word it was written with;
    the records, and every table, check and plot built from them, say the current one. A record being written
    (``validate_record(..., writing=True)``) that names an old value is refused, so a new capture never does::

        _arm_renamed = renamed_values("arm", renamed={"floor": "resident"})   # in the record class
    """
    def rename(cls, value: Any, info: ValidationInfo) -> Any:
        if not (isinstance(value, str) and value in renamed):
            return value
        if (info.context or {}).get("writing"):
            raise ValueError(f"{value!r} is now {renamed[value]!r}")
        return renamed[value]

    return field_validator(*fields, mode="before")(rename)


def as_stored(record: Mapping[str, Any], default) -> dict[str, Any]:
    """The record as a JSON line gives it back (tuples become lists, numpy scalars numbers)."""
    return json.loads(json.dumps(record, default=default))


def reading_class(cls: type[CaptureRecord], header: Mapping[str, Any] | None) -> type[CaptureRecord]:
    """The class that reads a file with ``header`` (None: no header, version 1); CaptureError for a header that
    names another schema or a version this code does not know."""
    if header is None:
        version = UNVERSIONED
    else:
        if header.get("schema") != cls.SCHEMA:
            raise CaptureError(f"header names schema {header.get('schema')!r}, this capture is {cls.SCHEMA!r}")
        version = header.get("version")
    reader = cls.reading(version) if isinstance(version, int) and not isinstance(version, bool) else None
    if reader is None:
        known = sorted({cls.VERSION, *cls.LEGACY})
        raise CaptureError(f"schema {cls.SCHEMA!r} version {version!r}: this code reads version "
                           f"{', '.join(map(str, known))}")
    return reader


# -- the sections' declarations (registered by the section packages; base imports none) --

@dataclass(frozen=True)
class Declaration:
    """What a section's run folder holds: its ``Params`` class and a record class per capture name (or pattern)."""

    section: str
    params: type | None
    captures: Mapping[str, type[CaptureRecord]] = field(default_factory=dict)

    def capture_class(self, name: str) -> type[CaptureRecord] | None:
        """The class of capture ``name`` (``"groups.jsonl"``; a pattern such as ``"capture.*.jsonl"`` matches)."""
        if name in self.captures:
            return self.captures[name]
        return next((cls for pattern, cls in self.captures.items() if fnmatchcase(name, pattern)), None)


_DECLARED: dict[str, Declaration] = {}


def declare(section: str, params: type | None, captures: Mapping[str, type[CaptureRecord]]) -> Declaration:
    """Registers ``section``'s declaration (a section package calls it as it is imported)."""
    for name, cls in captures.items():
        if not (isinstance(cls, type) and issubclass(cls, CaptureRecord)) or not cls.SCHEMA:
            raise TypeError(f"section {section}: capture {name!r} is declared by {cls!r}, not a CaptureRecord "
                            "class with a SCHEMA")
    _DECLARED[section] = Declaration(section, params, dict(captures))
    return _DECLARED[section]


def declaration(section: str | None) -> Declaration | None:
    """``section``'s declaration; None when no section of that name was imported."""
    return _DECLARED.get(section) if section else None


__all__ = ["CaptureError", "CaptureRecord", "Declaration", "HEADER_KEYS", "UNVERSIONED", "as_stored", "declaration",
           "declare", "field_problems", "is_header", "reading_class", "renamed_values", "validate_record"]
