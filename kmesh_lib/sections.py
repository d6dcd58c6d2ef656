"""The experiment sections: notebook, params class, plan and verify hooks for each.

Imports of section modules are lazy so ``kmesh plan`` and bad-params errors come back in a
second, before anything imports vLLM.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


@dataclass(frozen=True)
class Section:
    key: str  # the params file stem and outputs/ folder
    number: str
    notebook: str
    params_class: str  # "module:Class" inside kmesh_lib
    uses_engine: bool
    question: str

    @property
    def notebook_path(self) -> Path:
        return NOTEBOOKS / self.notebook

    def params_cls(self) -> type:
        module, cls = self.params_class.split(":")
        return getattr(importlib.import_module(f"kmesh_lib.{module}"), cls)

    def hook(self, name: str):
        """The section module's optional ``plan``/``verify`` function, or None."""
        module = importlib.import_module(f"kmesh_lib.{self.params_class.split(':')[0]}")
        return getattr(module, name, None)


SECTIONS = {s.key: s for s in [
    Section("engine_check", "00", "00_engine_check.ipynb", "engine_check:EngineCheckParams", True,
            "Does the engine share a prefix, and does its block pool drain afterwards?"),
]}


def get(name: str) -> Section:
    """``name`` is a section key ("engine_check") or number ("00")."""
    for section in SECTIONS.values():
        if name in (section.key, section.number, section.notebook, section.notebook.removesuffix(".ipynb")):
            return section
    known = ", ".join(f"{s.number} ({s.key})" for s in SECTIONS.values())
    raise KeyError(f"unknown section {name!r}; known: {known}")
