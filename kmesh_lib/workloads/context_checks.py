"""Checks shared by the shared-context sections (16 retention, 20 prefetch), over their raw records.

Both sections record one summary per engine run in ``raw/blocks.jsonl`` (``workloads.context_groups.Block``)
and one record per group in ``raw/groups.jsonl``. The statements here are about the summaries, read as typed
records (``workloads.context_records.EngineRunRecord``):

    every engine run finished      status ``ok``; ``running`` (never finished), ``failed`` (raised, with
                                   its error) and ``disk_full`` are not
    listeners                      every lmcache server and engine process listened on 127.0.0.1 only:
                                   a run that recorded no listener list is no evidence (skipped)
    cleanup                        no server process or disk-tier file left behind: a run that
                                   recorded no cleanup fields is no evidence (skipped)

the machine's topology as a table (``topology_rows``: the striped row and the GPU buffer's route),
and two helpers every check of these sections is built from:

    every(name, items, has_evidence, holds)   ok only when every item has evidence and holds;
                                              failed when one with evidence does not hold;
                                              skipped when an item (or every item) lacks evidence
    figures_match(name, recorded, recomputed) a figure results.json states, recomputed from raw/
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kmesh_lib.base.checks import Check, differences
from kmesh_lib.base.declared import json_value
from kmesh_lib.workloads.context_records import EngineRunRecord

NOT_AVAILABLE = "not available"


def every(name: str, items: Iterable[Any], has_evidence: Callable[[Any], bool], holds: Callable[[Any], bool],
          describe: Callable[[Any], str] = repr, missing: str = "no records") -> Check:
    """The statement "``holds`` for every item", ok only on complete evidence (never on none)."""
    items = list(items)
    with_evidence = [x for x in items if has_evidence(x)]
    bad = [x for x in with_evidence if not holds(x)]
    lacking = len(items) - len(with_evidence)
    if bad:
        return Check(name, "failed", f"{len(bad)} of {len(items)}; first: {describe(bad[0])}")
    if not items:
        return Check(name, "skipped", missing)
    if lacking:
        return Check(name, "skipped", f"{lacking} of {len(items)} recorded no evidence; {len(with_evidence)} hold")
    return Check(name, "ok", f"{len(items)} of {len(items)}")


def ran(blocks: list[EngineRunRecord]) -> list[EngineRunRecord]:
    """Engine-run summaries of runs that were attempted (not the rows for what is not available)."""
    return [b for b in blocks if b.status != NOT_AVAILABLE]


def external(blocks: list[EngineRunRecord]) -> list[EngineRunRecord]:
    """Attempted runs with an LMCache tier (every path but the plain ``engine`` control)."""
    return [b for b in ran(blocks) if b.path != "engine"]


def listener_addresses(block: EngineRunRecord) -> list[str] | None:
    """Every listening address the run recorded, or None when a list it should have is missing.

    An MP run records its server's listeners (``listeners``) and every run its engine process's
    (``engine_listeners``); an empty recorded list is evidence (that process listened nowhere).
    """
    lists = [block.engine_listeners] + ([block.listeners] if block.path == "mp" else [])
    if any(addresses is None for addresses in lists):
        return None
    return [a for addresses in lists for a in addresses]


def listeners_local(blocks: list[EngineRunRecord]) -> Check:
    return every("every lmcache server and engine process listened on 127.0.0.1 only", ran(blocks),
                 lambda b: listener_addresses(b) is not None,
                 lambda b: all(str(a).startswith("127.0.0.1:") for a in listener_addresses(b)),
                 lambda b: f"{b.engine_run}: {[a for a in listener_addresses(b) if not str(a).startswith('127.0.0.1:')]}",
                 missing="no engine run recorded")


def cleaned_up(blocks: list[EngineRunRecord]) -> Check:
    fields = ("runtime_dir_removed", "server_gone")

    def recorded(b):
        return b.cleanup is not None and all(isinstance(b.cleanup.get(f), bool) for f in fields)

    return every("no server process or disk-tier file left behind", external(blocks), recorded,
                 lambda b: all(b.cleanup[f] for f in fields), lambda b: f"{b.engine_run}: {b.cleanup}",
                 missing="no run with an LMCache tier was recorded")


def runs_finished(name: str, blocks: list[EngineRunRecord], planned: list[str]) -> Check:
    """Every planned engine run has exactly one summary, with status ok (a crashed run is not finished)."""
    by: dict[str, list[EngineRunRecord]] = {}
    for b in blocks:
        by.setdefault(b.engine_run, []).append(b)
    missing = [p for p in planned if p not in by]
    doubled = [p for p in planned if len(by.get(p, [])) > 1]
    bad = [f"{p}: {b.status}" + (f" ({b.error or b.detail})" if b.error or b.detail else "")
           for p in planned for b in by.get(p, []) if b.status != "ok"]
    if not planned:
        return Check(name, "skipped", "no engine run was planned")
    problems = ([f"no summary for {', '.join(missing)}"] if missing else []) + \
        ([f"more than one summary for {', '.join(doubled)}"] if doubled else []) + bad
    return Check(name, not problems, "; ".join(problems[:4]) or f"{len(planned)} of {len(planned)} ok")


def topology_rows(blocks: list[EngineRunRecord]) -> list[dict]:
    """The machine as the run recorded it: the striped row (with the topology it was decided on) and
    the GPU buffer's route (host-staged, or GDS where cuFile and nvidia-fs could read the disk tier)."""
    rows = []
    striped = next((b for b in blocks if b.path == "mp-striped" and b.topology), None)
    if striped is not None:
        t = striped.topology
        rows.append({"row": "striped store (mp-striped)", "status": striped.status, "detail": striped.detail,
                     "nvme_count": t.get("nvme_count"), "block_devices": ", ".join(t.get("block_devices") or []),
                     "md_raid0": t.get("md_raid0"), "gpu_pcie": "; ".join(
                         f"{g.get('name')} gen {g.get('pcie.link.gen.current')}/{g.get('pcie.link.gen.max')} "
                         f"x{g.get('pcie.link.width.current')}/{g.get('pcie.link.width.max')}" for g in t.get("gpu_pcie") or [])
                     or "no GPU"})
    for b in blocks:
        ds = (b.tier or {}).get("direct_storage")
        if b.path == "gpubuf" and ds is not None:
            rows.append({"row": f"GPU buffer route ({b.engine_run})", "status": ds.get("route"),
                         "detail": "; ".join(ds.get("reasons") or []) or "cuFile, nvidia-fs and an NVMe disk tier",
                         "disk": (ds.get("disk") or {}).get("source")})
    return rows


def figures_match(name: str, recorded: Any, recomputed: Any, rel: float = 1e-9) -> Check:
    """results.json's figure equals the one recomputed from raw/, by the one comparator
    (``base.checks.differences``): the same keys, the same rows, floats within ``rel``. A figure
    results.json does not state is skipped here; ``kmesh verify`` holds the record to the section's
    declared tables, where a missing one is a mismatch."""
    if recorded is None:
        return Check(name, "skipped", "results.json states no such figure")
    found = differences(json_value(recomputed), recorded, "", rel)
    return Check(name, "failed", "; ".join(found[:3])) if found else Check(name, "ok", "recomputed from raw/")
