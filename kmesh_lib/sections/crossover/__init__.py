"""Section 21, crossover: When does restoring KV beat recomputing it?"""
from kmesh_lib.base.captures import declare
from kmesh_lib.sections.crossover.captures import CAPTURES
from kmesh_lib.sections.crossover.checks import checks, counts
from kmesh_lib.sections.crossover.experiment import plan
from kmesh_lib.sections.crossover.params import CrossoverParams as Params
from kmesh_lib.sections.crossover.plots import figures
from kmesh_lib.sections.crossover.summary import answer, findings, headline, public_results, replications, verdict
from kmesh_lib.sections.crossover.tables import TABLES

KEY = "crossover"
NUMBER = "21"
TITLE = "crossover"
NOTEBOOK = "21_crossover.ipynb"
USES_ENGINE = True
QUESTION = "When does restoring KV beat recomputing it?"

declare(KEY, Params, CAPTURES)

__all__ = ["CAPTURES", "KEY", "NOTEBOOK", "NUMBER", "Params", "QUESTION", "TABLES", "TITLE", "USES_ENGINE", "answer", "checks",
           "counts", "figures", "findings", "headline", "plan", "public_results", "replications", "verdict"]
