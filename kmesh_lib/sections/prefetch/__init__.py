"""Section 20, prefetch: Does loading shared context early help, once repeat reads are gone?"""
from kmesh_lib.base.captures import declare
from kmesh_lib.sections.prefetch.captures import CAPTURES
from kmesh_lib.sections.prefetch.checks import checks, counts
from kmesh_lib.sections.prefetch.experiment import plan
from kmesh_lib.sections.prefetch.params import PrefetchParams as Params
from kmesh_lib.sections.prefetch.summary import answer, findings, headline, public_results, verdict
from kmesh_lib.sections.prefetch.tables import TABLES

KEY = "prefetch"
NUMBER = "20"
TITLE = "prefetch"
NOTEBOOK = "20_prefetch.ipynb"
USES_ENGINE = True
QUESTION = "Does loading shared context early help, once repeat reads are gone?"

declare(KEY, Params, CAPTURES)

__all__ = ["CAPTURES", "KEY", "NOTEBOOK", "NUMBER", "Params", "QUESTION", "TABLES", "TITLE", "USES_ENGINE", "answer", "checks",
           "counts", "findings", "headline", "plan", "public_results", "verdict"]
