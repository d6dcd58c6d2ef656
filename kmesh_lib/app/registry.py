"""The experiment sections, by key and number, each checked for the whole section interface.

Every section package (``kmesh_lib/sections/<key>/``) exports the same names (``INTERFACE``):
constants ``KEY``, ``NUMBER``, ``TITLE``, ``NOTEBOOK``, ``QUESTION``, ``USES_ENGINE``; ``Params``
(the typed parameters); ``plan(cfg) -> dict`` (starts nothing); and, each taking
``run: base.records.RunFiles``: ``checks``, ``counts``, ``headline``, ``answer`` and
``public_results``. ``get`` refuses a section that lacks any of them (``kmesh plan`` asks only
for ``PLANNING``), naming what is missing: the app has no fallback for a missing part. Section
modules import vLLM lazily, so this import stays fast and ``kmesh plan`` or a bad-params error
comes back before anything heavy loads.
"""
from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

from kmesh_lib.base.paths import NOTEBOOKS_DIR
from kmesh_lib.base.records import RunFileError, RunFiles
from kmesh_lib.sections import (
    crossover,
    engine_check,
    family_hold,
    multi_engine,
    prefetch,
    production_trace,
    retention,
    tot_headroom,
    trace_audit,
)

CONSTANTS = {"KEY": str, "NUMBER": str, "TITLE": str, "NOTEBOOK": str, "QUESTION": str, "USES_ENGINE": bool, "TABLES": dict,
             "CAPTURES": dict}
FUNCTIONS = ("plan", "checks", "counts", "headline", "answer", "public_results")
INTERFACE = (*CONSTANTS, "Params", *FUNCTIONS)
PLANNING = (*CONSTANTS, "Params", "plan")  # what `kmesh plan` uses: it reads no run

SECTIONS: dict[str, ModuleType] = {m.KEY: m for m in (
    engine_check, retention, trace_audit, family_hold, tot_headroom, prefetch, crossover, multi_engine,
    production_trace)}


class UnknownSection(KeyError):
    """No section has that key, number or notebook name."""


class SectionInterfaceError(TypeError):
    """A section package lacks part of the section interface."""


def missing_interface(section: ModuleType, needs: tuple[str, ...] = INTERFACE) -> list[str]:
    """The names of ``needs`` that ``section`` lacks or has with the wrong kind of value."""
    missing = [name for name, kind in CONSTANTS.items()
               if name in needs and not isinstance(getattr(section, name, None), kind)]
    if "Params" in needs and not isinstance(getattr(section, "Params", None), type):
        missing.append("Params")
    missing += [name for name in FUNCTIONS if name in needs and not callable(getattr(section, name, None))]
    return missing


def validate(section: ModuleType, needs: tuple[str, ...] = INTERFACE) -> ModuleType:
    missing = missing_interface(section, needs)
    if missing:
        name = getattr(section, "KEY", None) or section.__name__
        raise SectionInterfaceError(f"section {name} lacks {', '.join(missing)} "
                                    "(the section interface: docs/architecture.md)")
    return section


def notebook_path(section: ModuleType) -> Path:
    return NOTEBOOKS_DIR / section.NOTEBOOK


def find(name: str) -> ModuleType:
    """``name`` is a section key ("engine_check"), number ("00") or notebook name."""
    for section in SECTIONS.values():
        if name in (section.KEY, section.NUMBER, section.NOTEBOOK, section.NOTEBOOK.removesuffix(".ipynb")):
            return section
    known = ", ".join(f"{s.NUMBER} ({s.KEY})" for s in SECTIONS.values())
    raise UnknownSection(f"unknown section {name!r}; known: {known}")


def get(name: str, needs: tuple[str, ...] = INTERFACE) -> ModuleType:
    """The section ``name`` names, with the interface ``needs`` (else ``SectionInterfaceError``)."""
    return validate(find(name), needs)


def all_sections() -> list[ModuleType]:
    """Every section, each validated: listings and the index need all of them whole."""
    return [validate(s) for s in SECTIONS.values()]


class SectionError(RuntimeError):
    """A section's function raised on a run (a damaged run, or a bug: KMESH_DEBUG=1 shows the traceback)."""


def call_section(section: ModuleType, name: str, run: RunFiles):
    """``section.<name>(run)``; a RunFileError passes, any other error becomes one SectionError line."""
    try:
        return getattr(section, name)(run)
    except RunFileError:
        raise
    except Exception as e:
        if os.environ.get("KMESH_DEBUG"):
            raise
        raise SectionError(f"{section.KEY}.{name} raised {type(e).__name__}: {str(e)[:200]} on run {run.run_id} "
                           "(KMESH_DEBUG=1 shows the traceback)") from None
