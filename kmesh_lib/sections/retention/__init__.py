"""Section 16, retention: Does keeping LMCache's copy stop repeat SSD reads?"""
from kmesh_lib.sections.retention.checks import checks
from kmesh_lib.sections.retention.experiment import plan
from kmesh_lib.sections.retention.params import RetentionParams as Params

KEY = "retention"
NUMBER = "16"
TITLE = "retention"
NOTEBOOK = "16_retention.ipynb"
USES_ENGINE = True
QUESTION = "Does keeping LMCache's copy stop repeat SSD reads?"

__all__ = ["KEY", "NOTEBOOK", "NUMBER", "Params", "QUESTION", "TITLE", "USES_ENGINE", "plan", "checks"]
