"""Section 00, engine check: Does the engine share a prefix, and does its block pool drain afterwards?"""
from kmesh_lib.base.captures import declare
from kmesh_lib.sections.engine_check.captures import CAPTURES
from kmesh_lib.sections.engine_check.checks import checks, counts
from kmesh_lib.sections.engine_check.experiment import plan
from kmesh_lib.sections.engine_check.params import EngineCheckParams as Params
from kmesh_lib.sections.engine_check.summary import answer, findings, headline, public_results, verdict
from kmesh_lib.sections.engine_check.tables import TABLES

KEY = "engine_check"
NUMBER = "00"
TITLE = "engine check"
NOTEBOOK = "00_engine_check.ipynb"
USES_ENGINE = True
QUESTION = "Does the engine share a prefix, and does its block pool drain afterwards?"

declare(KEY, Params, CAPTURES)

__all__ = ["CAPTURES", "KEY", "NOTEBOOK", "NUMBER", "Params", "QUESTION", "TABLES", "TITLE", "USES_ENGINE", "answer", "checks",
           "counts", "findings", "headline", "plan", "public_results", "verdict"]
