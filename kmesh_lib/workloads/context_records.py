"""The captures of the context-group protocol (``context_groups``), as sections 16 and 20 record them.

``raw/blocks.jsonl`` holds one ``EngineRunRecord`` per engine run (or per row that could not run here);
``raw/groups.jsonl`` one group record per group (each section's own class, on ``GroupIdentity``).

Vocabulary: the captures call one engine run (an engine started for a path and a group size, with its tier
and server) a "block", the field ``block`` and the file ``blocks.jsonl``. That word is vLLM's for a KV block,
so the classes name the field ``engine_run``; the captures keep ``block`` (``alias``), since the published
ones are evidence and are never rewritten.

Nested records (a tier's description, a phase's disk reads, a lookup, a restore's split) stay mappings
here: their own classes come with the code that writes them (``lmcache.disk_accounting``, ``lmcache.lookups``,
``kv.restore_timeline``).
"""
from __future__ import annotations

from typing import Any

from pydantic import Field

from kmesh_lib.base.captures import CaptureRecord

Mapping = dict[str, Any]


class EngineRunRecord(CaptureRecord):
    """One engine run's summary (``context_groups.Block.summary``), or a row for a path that cannot run here.

    Every field after ``status`` is optional: a row for a path this machine cannot run (``not available``)
    holds only its identity, status and why; a run that failed holds what it reached before it failed.
    """

    engine_run: str = Field(alias="block")  # "<path>-N<group size>", or the path of a row that could not run
    path: str
    group_size: int | None = None  # None: a row for no group size (LMCache's GPU tier), or a run the parent recorded
    status: str  # ok | failed | disk_full | not available
    detail: str | None = None  # why a run did not run or ended early
    error: str | None = None  # a raised run's exception
    disk_tier: Mapping | None = None  # the disk tier's free space, checked before the context is stored
    tier_ready_s: float | None = None  # what the tier's (server's) boot still cost after the engine's overlap
    server_boot_s: float | None = None  # the lmcache server's boot from spawn (runs recorded after it was measured)
    connector: str | None = None
    listeners: list[str] | None = None  # the lmcache server's sockets (MP paths)
    lmcache_server: Mapping | None = None  # the server's description (MP paths)
    tier: Mapping | None = None  # the tier's description (the in-process, GPU-buffer and native paths)
    engine_start_s: float | None = None
    engine_listeners: list[str] | None = None  # sockets the engine's process listens on (none expected)
    store: Mapping | None = None  # storing the context on the disk tier: chunks, bytes, who wrote them
    cleanup: Mapping | None = None  # the runtime folder and server gone after the run
    close_s: float | None = None
    seconds: float | None = None
    topology: Mapping | None = None  # the striped row's machine (mp-striped rows that could not run)


class GroupIdentity(CaptureRecord):
    """What names a group in both sections: its engine run, arm, pair and whether it is measured."""

    engine_run: str = Field(alias="block")
    path: str
    group_size: int
    arm: str
    pair: int
    order: int  # the arm's place in its pair
    measured: bool
    status: str  # ok, or why the group does not enter the tables
    detail: str
    singleflight: bool | None  # MP paths: a lookup overlapping an in-flight load waited for it; None elsewhere
    arrival: str  # the follow-ups' arrival pattern (together, <x>ms, <k>step)
    context_tokens: int
    context_bytes: int
    chunk_bytes: int
    first_token_s: list[float]  # each follow-up's first token, from the phase's start
    num_cached_tokens: list[int]  # vLLM's per follow-up
    num_output_tokens: list[int]
    submit_ms: list[float]  # each follow-up's submission, from the first's
    makespan_s: float
    followup_disk_reads: dict[str, int] | None = None  # per follow-up, lookups that read the disk (MP, hooked)
    utc: str


__all__ = ["EngineRunRecord", "GroupIdentity"]
