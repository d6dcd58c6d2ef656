"""Section 23, a production trace: how much prefix reuse does stock vLLM leave, and what would an external tier add?"""
from kmesh_lib.base.captures import declare
from kmesh_lib.sections.production_trace.captures import CAPTURES
from kmesh_lib.sections.production_trace.checks import checks
from kmesh_lib.sections.production_trace.experiment import plan
from kmesh_lib.sections.production_trace.params import ProductionTraceParams as Params
from kmesh_lib.sections.production_trace.report import answer, counts, findings, headline, public_results, verdict
from kmesh_lib.sections.production_trace.result import TABLES

KEY = "production_trace"
NUMBER = "23"
TITLE = "production trace"
NOTEBOOK = "23_production_trace.ipynb"
USES_ENGINE = True
QUESTION = "How much prefix reuse does stock vLLM leave on a production trace, and what would an external tier add?"
# The paper's scale is the replay engine over the whole trace (the cpu profile); the gpu profile runs the parity slice
PAPER_SCALE_PROFILE = "cpu"

declare(KEY, Params, CAPTURES)

__all__ = ["CAPTURES", "KEY", "NOTEBOOK", "NUMBER", "PAPER_SCALE_PROFILE", "Params", "QUESTION", "TABLES", "TITLE",
           "USES_ENGINE", "answer", "checks", "counts", "findings", "headline", "plan", "public_results", "verdict"]
