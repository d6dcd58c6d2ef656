"""Section 17, trace audit: Can agent traces qualify family retention?"""
from kmesh_lib.base.captures import declare
from kmesh_lib.sections.trace_audit.captures import CAPTURES
from kmesh_lib.sections.trace_audit.checks import checks
from kmesh_lib.sections.trace_audit.experiment import audit_run, plan
from kmesh_lib.sections.trace_audit.params import TraceAuditParams as Params
from kmesh_lib.sections.trace_audit.results import answer, counts, findings, headline, public_results, verdict
from kmesh_lib.sections.trace_audit.tables import TABLES

KEY = "trace_audit"
NUMBER = "17"
TITLE = "trace audit"
NOTEBOOK = "17_trace_audit.ipynb"
USES_ENGINE = False
QUESTION = "Can agent traces qualify family retention?"

declare(KEY, Params, CAPTURES)

__all__ = ["CAPTURES", "KEY", "NOTEBOOK", "NUMBER", "Params", "QUESTION", "TABLES", "TITLE", "USES_ENGINE", "answer",
           "audit_run", "checks", "counts", "findings", "headline", "plan", "public_results", "verdict"]
