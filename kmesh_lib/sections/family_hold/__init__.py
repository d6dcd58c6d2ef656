"""Section 18, family hold: Does holding a parent's blocks for its child pay under cache pressure?"""
from kmesh_lib.base.captures import declare
from kmesh_lib.sections.family_hold.captures import CAPTURES
from kmesh_lib.sections.family_hold.checks import checks, counts
from kmesh_lib.sections.family_hold.experiment import plan
from kmesh_lib.sections.family_hold.params import FamilyHoldParams as Params
from kmesh_lib.sections.family_hold.summary import answer, findings, headline, public_results, verdict
from kmesh_lib.sections.family_hold.tables import TABLES

KEY = "family_hold"
NUMBER = "18"
TITLE = "family hold"
NOTEBOOK = "18_family_hold.ipynb"
USES_ENGINE = True
QUESTION = "Does holding a parent's blocks for its child pay under cache pressure?"

declare(KEY, Params, CAPTURES)

__all__ = ["CAPTURES", "KEY", "NOTEBOOK", "NUMBER", "Params", "QUESTION", "TABLES", "TITLE", "USES_ENGINE", "answer", "checks",
           "counts", "findings", "headline", "plan", "public_results", "verdict"]
