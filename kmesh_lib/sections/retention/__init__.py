"""Section 16, retention: Does keeping LMCache's copy stop repeat SSD reads?"""
from kmesh_lib.base.captures import declare
from kmesh_lib.sections.retention.captures import CAPTURES
from kmesh_lib.sections.retention.checks import checks, counts
from kmesh_lib.sections.retention.experiment import plan
from kmesh_lib.sections.retention.params import RetentionParams as Params
from kmesh_lib.sections.retention.summary import answer, findings, headline, public_results, verdict
from kmesh_lib.sections.retention.tables import TABLES

KEY = "retention"
NUMBER = "16"
TITLE = "retention"
NOTEBOOK = "16_retention.ipynb"
USES_ENGINE = True
QUESTION = "Does keeping LMCache's copy stop repeat SSD reads?"

declare(KEY, Params, CAPTURES)

__all__ = ["CAPTURES", "KEY", "NOTEBOOK", "NUMBER", "Params", "QUESTION", "TABLES", "TITLE", "USES_ENGINE", "answer", "checks",
           "counts", "findings", "headline", "plan", "public_results", "verdict"]
