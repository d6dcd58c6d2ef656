"""Section 22's declared result (``base.declared``): the tables results.json holds, each built from the run's files.

    policies   per (model, policy): makespan, first-token times, token sources, load (raw/requests.jsonl and NUM_ENGINES)
    bytes      per 'shared' trace: bytes through the server by tier (raw/arms.jsonl's server snapshots, the requests)
    restore    the children the server restored against the same children under the other policies
    probes     per model: the idle-engine child recomputed, from a local hit and restored (raw/probes.jsonl)
    order      per trace: its place in its repeat's drawn order, its fleet, the host's load at its start and end
               (raw/orders.jsonl, raw/arms.jsonl)
    comparisons  per model and two policies: makespan and the children's first token, paired differences with
               bootstrap intervals and a verdict only where the interval excludes 0 (``compare``)

``order`` and ``comparisons`` are ABSENT for a run recorded before the orders were drawn (no raw/orders.jsonl:
every published run of 1 Dec, one repeat in a fixed order): it has neither the record nor a design to compare by.

The notebook saves them with ``record.save_tables(TABLES)``; ``kmesh verify`` builds them again and compares;
``checks.table_checks`` states each one as a check of the section.
"""
from __future__ import annotations

from kmesh_lib.base.declared import ABSENT, Table
from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections.multi_engine import compare, report


def policies(run: RunFiles) -> list[dict]:
    return report.policy_table(run.records("requests.jsonl"), run.params.NUM_ENGINES)


def bytes_through_the_server(run: RunFiles) -> list[dict]:
    return report.bytes_table(run.records("arms.jsonl"), run.records("requests.jsonl"))


def restore(run: RunFiles) -> list[dict]:
    return report.restore_table(run.records("requests.jsonl"))


def probes(run: RunFiles) -> list[dict]:
    return report.probe_table(run.records("probes.jsonl"))


NO_ORDERS = "recorded before the policy order was drawn per repeat: no raw/orders.jsonl (one fixed order)"


def drawn(run: RunFiles) -> bool:
    return run.has_raw("orders.jsonl")


def order(run: RunFiles):
    return compare.order_table(run.records("orders.jsonl"), run.records("arms.jsonl")) if drawn(run) else ABSENT


def comparisons(run: RunFiles):
    return compare.comparison_table(run.records("requests.jsonl")) if drawn(run) else ABSENT


TABLES: dict[str, Table] = {
    "policies": Table(policies),
    "bytes": Table(bytes_through_the_server),
    "restore": Table(restore),
    "probes": Table(probes),
    "order": Table(order),
    "comparisons": Table(comparisons),
}

# why each table can be empty: its evidence missing (``checks.table_checks`` says skipped with it)
EMPTY = {
    "policies": "raw/requests.jsonl holds no requests",
    "bytes": "no 'shared' trace recorded the server's counters",
    "restore": "the server restored no child of a 'shared' trace",
    "probes": "raw/probes.jsonl holds no probe (NUM_PROBES=0, or a fault run)",
    "order": "raw/arms.jsonl holds no traces",
    "comparisons": "fewer than two policies ran",
}

__all__ = ["EMPTY", "NO_ORDERS", "TABLES", "drawn"]
