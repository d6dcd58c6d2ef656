"""The experiment sections, by key and number.

Every section package (``kmesh_lib/sections/<key>/``) has the same interface: ``KEY``, ``NUMBER``,
``TITLE``, ``NOTEBOOK``, ``QUESTION``, ``USES_ENGINE``, ``Params`` (the typed parameters),
``plan(cfg) -> dict`` (starts nothing) and ``checks(run: RunFiles) -> list[Check]`` (computed from
the run's recorded files). Section modules import vLLM lazily, so this import stays fast and
``kmesh plan`` or a bad-params error comes back before anything heavy loads.
"""
from __future__ import annotations

from pathlib import Path
from types import ModuleType

from kmesh_lib.base.paths import NOTEBOOKS_DIR
from kmesh_lib.sections import (
    crossover,
    engine_check,
    family_hold,
    multi_engine,
    prefetch,
    retention,
    tot_headroom,
    trace_audit,
)

SECTIONS: dict[str, ModuleType] = {m.KEY: m for m in (
    engine_check, retention, trace_audit, family_hold, tot_headroom, prefetch, crossover, multi_engine)}


def notebook_path(section: ModuleType) -> Path:
    return NOTEBOOKS_DIR / section.NOTEBOOK


def get(name: str) -> ModuleType:
    """``name`` is a section key ("engine_check"), number ("00") or notebook name."""
    for section in SECTIONS.values():
        if name in (section.KEY, section.NUMBER, section.NOTEBOOK, section.NOTEBOOK.removesuffix(".ipynb")):
            return section
    known = ", ".join(f"{s.NUMBER} ({s.KEY})" for s in SECTIONS.values())
    raise KeyError(f"unknown section {name!r}; known: {known}")
