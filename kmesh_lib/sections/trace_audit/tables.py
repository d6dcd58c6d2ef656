"""Section 17's declared result (``base.declared``): three tables, each built from ``raw/`` and the params.

- ``audit``: the corpus's name, the totals of the audit's rows, the set hash of the files read whole
  and the audit's limits; ``elapsed_s`` (the audit's wall-clock time) is live;
- ``lineage``: each source's verdict from its lineage counts, and the corpus's;
- ``contrast``: the contract capture the run wrote under raw/, its hash and its own verdict.

``inputs`` (the hashes of the files read from outside the run folder) is a run field. The corpus
itself is not re-read here: the checks that go back to it keep their ``outside_input`` skip.
"""
from __future__ import annotations

from kmesh_lib.base.declared import Table
from kmesh_lib.sections.trace_audit.checks import LIVE_AUDIT, audit_table, contrast_table, lineage_table

TABLES = {
    "audit": Table(audit_table, live=LIVE_AUDIT),
    "lineage": Table(lineage_table),
    "contrast": Table(contrast_table),
}

__all__ = ["TABLES"]
