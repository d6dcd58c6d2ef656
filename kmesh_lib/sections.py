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

    def module(self):
        name = self.params_class.split(":")[0]
        try:
            return importlib.import_module(f"kmesh_lib.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"kmesh_lib.{name}":
                raise KeyError(f"section {self.number} ({self.key}) is not built yet: kmesh_lib/{name}.py is missing") from None
            raise

    def params_cls(self) -> type:
        return getattr(self.module(), self.params_class.split(":")[1])

    def hook(self, name: str):
        """The section module's optional ``plan``/``verify`` function, or None."""
        return getattr(self.module(), name, None)


SECTIONS = {s.key: s for s in [
    Section("engine_check", "00", "00_engine_check.ipynb", "engine_check:EngineCheckParams", True,
            "Does the engine share a prefix, and does its block pool drain afterwards?"),
    Section("retention", "16", "16_retention.ipynb", "retention_experiment:RetentionParams", True,
            "Does keeping LMCache's copy stop repeat SSD reads?"),
    Section("trace_audit", "17", "17_trace_audit.ipynb", "trace_audit_experiment:TraceAuditParams", False,
            "Can agent traces qualify family retention?"),
    Section("family_hold", "18", "18_family_hold.ipynb", "family_experiment:FamilyHoldParams", True,
            "Does holding a parent's blocks for its child pay under cache pressure?"),
    Section("tot_headroom", "19", "19_tot_headroom.ipynb", "tot_experiment:TotHeadroomParams", True,
            "Does model-driven branching leave room for better retention?"),
    Section("prefetch", "20", "20_prefetch.ipynb", "prefetch_experiment:PrefetchParams", True,
            "Does loading shared context early help, once repeat reads are gone?"),
    Section("crossover", "21", "21_crossover.ipynb", "crossover_experiment:CrossoverParams", True,
            "When does restoring KV beat recomputing it?"),
]}


def get(name: str) -> Section:
    """``name`` is a section key ("engine_check") or number ("00")."""
    for section in SECTIONS.values():
        if name in (section.key, section.number, section.notebook, section.notebook.removesuffix(".ipynb")):
            return section
    known = ", ".join(f"{s.number} ({s.key})" for s in SECTIONS.values())
    raise KeyError(f"unknown section {name!r}; known: {known}")
