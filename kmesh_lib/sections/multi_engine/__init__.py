"""Section 22, multi engine: Several engines, one LMCache server: does shared KV beat routing and recomputation?"""
from kmesh_lib.base.captures import declare
from kmesh_lib.sections.multi_engine.captures import CAPTURES
from kmesh_lib.sections.multi_engine.checks import checks, counts
from kmesh_lib.sections.multi_engine.experiment import plan
from kmesh_lib.sections.multi_engine.params import MultiEngineParams as Params
from kmesh_lib.sections.multi_engine.summary import answer, findings, headline, public_results, verdict
from kmesh_lib.sections.multi_engine.tables import TABLES

KEY = "multi_engine"
NUMBER = "22"
TITLE = "multi engine"
NOTEBOOK = "22_multi_engine.ipynb"
USES_ENGINE = True
QUESTION = "Several engines, one LMCache server: does shared KV beat prefix-aware routing and recomputation?"

declare(KEY, Params, CAPTURES)

__all__ = ["CAPTURES", "KEY", "NOTEBOOK", "NUMBER", "Params", "QUESTION", "TABLES", "TITLE", "USES_ENGINE", "answer", "checks",
           "counts", "findings", "headline", "plan", "public_results", "verdict"]
