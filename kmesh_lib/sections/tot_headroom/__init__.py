"""Section 19, search headroom: Does model-driven branching leave room for better retention?"""
from kmesh_lib.base.captures import declare
from kmesh_lib.sections.tot_headroom.captures import CAPTURES
from kmesh_lib.sections.tot_headroom.checks import checks
from kmesh_lib.sections.tot_headroom.experiment import plan
from kmesh_lib.sections.tot_headroom.params import TotHeadroomParams as Params
from kmesh_lib.sections.tot_headroom.report import answer, counts, findings, headline, public_results, verdict
from kmesh_lib.sections.tot_headroom.tables import TABLES

KEY = "tot_headroom"
NUMBER = "19"
TITLE = "search headroom"
NOTEBOOK = "19_tot_headroom.ipynb"
USES_ENGINE = True
QUESTION = "Does model-driven branching leave room for better retention?"

declare(KEY, Params, CAPTURES)

__all__ = ["CAPTURES", "KEY", "NOTEBOOK", "NUMBER", "Params", "QUESTION", "TABLES", "TITLE", "USES_ENGINE", "answer", "checks",
           "counts", "findings", "headline", "plan", "public_results", "verdict"]
