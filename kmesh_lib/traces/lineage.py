"""Lineage verdict: can a trace corpus back a trace-driven family-retention comparison?

A pressure comparison replays invocation families against one engine's KV cache and asks which
family members kept their blocks. Replaying a trace for that needs, per source:

1. explicit parent links: a field naming the invocation this one extends;
2. invocation start times and 3. completion times: when each invocation held blocks;
4. engine identity: which engine (and so which cache) served it;
5. physical cache events: which blocks were allocated, touched, evicted.

Only explicit fields count. Two tempting substitutes are rejected on purpose:

* Text-prefix overlap. Agent prompts share long system prompts and tool schemas, so a request
  that merely reuses the same preamble overlaps a real child's prompt just as well. Overlap cannot
  tell "child of X" from "unrelated request with X's system prompt", and it says nothing about
  which engine held which blocks, or whether they were still resident when the next call came.
* Timestamp spacing. "B arrived 2 s after A finished" fits a child, a retry, a sibling and an
  unrelated session alike; concurrent sessions interleave, and a single timestamp per record
  does not even say whether it marks submission or completion.

Either heuristic would manufacture the lineage the comparison is supposed to measure, so the
verdict counts an edge only when a parent-link field names an id that some record of the same
source carries (ids are resolved per source: sources are independent captures, and short ids
such as 1 or "0" would otherwise join unrelated frameworks). Grouping fields (session_id,
conversation_id, ...) are reported, but they only say two calls belong together, not which one
extends which; ordering them would need timestamps again.

The collector is fed one parsed record at a time by ``traces.audit.audit_tree``; it stores digests of
ids and parent references only, never prompts or outputs.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kmesh_lib.traces.names import OTHER_FIELDS, safe_name

PARENT_FIELDS = ("parent_id", "parent", "parent_invocation_id", "parent_request_id",
                 "parent_call_id", "previous_response_id", "prev_request_id", "caused_by",
                 "reply_to")
ID_FIELDS = ("invocation_id", "request_id", "id", "call_id", "response_id", "span_id",
             "message_id")
GROUPING_FIELDS = ("session_id", "conversation_id", "thread_id", "trace_id", "family_id",
                   "task_id")
START_FIELDS = ("t_submit_ns", "start_time", "started_at", "start", "submit_time",
                "request_time", "arrival_time", "t_start", "created", "created_at")
COMPLETION_FIELDS = ("t_finish_ns", "end_time", "finished_at", "completed_at", "end",
                     "finish_time", "completion_time", "t_end", "latency", "latency_ms",
                     "latency_s", "duration", "duration_ms", "duration_s", "elapsed",
                     "elapsed_ms", "e2e_latency")
ENGINE_FIELDS = ("engine", "engine_id", "engine_name", "engine_version", "instance_id",
                 "server_id", "worker_id", "replica_id", "backend", "endpoint", "host")
CACHE_EVENT_FIELDS = ("block_events", "kv_events", "cache_events", "kv_cache_events",
                      "block_ids", "block_hashes", "evictions")

# Requirement name -> fields that satisfy it. Start and completion are checked separately
# because a single "timestamp" cannot be both.
REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "parent_links": PARENT_FIELDS,
    "start_times": START_FIELDS,
    "completion_times": COMPLETION_FIELDS,
    "engine_identity": ENGINE_FIELDS,
    "cache_events": CACHE_EVENT_FIELDS,
}

_REQUIREMENT_OF = {name: req for req, names in REQUIREMENTS.items() for name in names}

# Block events describe the pool, not each call: one record may carry a step's events for all, so
# cache events are met when any record carries them; every other requirement is per invocation.
MET_BY_ANY_RECORD = frozenset({"cache_events"})

# Fields that look relevant but do not satisfy a requirement, with the reason shown to readers.
WEAK_SIGNALS = {
    "timestamp": "a single timestamp: neither a start nor a completion time on its own",
    "model": "a model name: names weights, not the engine instance whose cache served the call",
    "num_cached_tokens": "a cache-hit count: says how much hit, not which blocks lived where",
    "cached_tokens": "a cache-hit count: says how much hit, not which blocks lived where",
}

_MAX_ID_CHARS = 256  # longer "ids" are text, not identifiers; not worth holding
MAX_FOUND_PATHS = 16  # field paths recorded per source and requirement; further ones pool in OTHER


def _fields(rec: dict) -> Iterator[tuple[str, str, str, Any]]:
    """Yield (key, sub, lowercase leaf name, value) for top-level keys (sub None) and one nested
    dict level."""
    for key, value in rec.items():
        yield key, None, key.lower(), value
        if isinstance(value, dict):
            for sub, sub_value in value.items():
                yield key, sub, str(sub).lower(), sub_value


def _id_key(value: Any) -> int | None:
    """A 64-bit digest of an id value (ints and strings kept apart: 1 is not "1"), or None when
    the value is no id. Ids are held as digests: a million UUIDs cost 60 MB instead of 120 MB, and
    a false edge would need a 64-bit collision between two ids of one source."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        data = b"i" + str(value).encode()
    elif isinstance(value, str) and 0 < len(value) <= _MAX_ID_CHARS:
        data = b"s" + value.encode("utf-8", "surrogatepass")
    else:
        return None
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@dataclass
class RequirementCheck:
    """How one source meets one requirement.

    Invariant: ``met`` iff every object record carries at least one of ``fields_checked`` as a
    key (null allowed: roots have no parent, aborted calls no completion time) and at least one
    record carries a non-null value; for ``MET_BY_ANY_RECORD`` requirements a non-null value on
    any record suffices.
    """

    name: str
    fields_checked: tuple[str, ...]
    fields_found: dict[str, int]
    num_records_with_key: int
    num_records_with_value: int
    num_records: int

    @property
    def met(self) -> bool:
        if self.name in MET_BY_ANY_RECORD:
            return self.num_records_with_value > 0
        return (self.num_records > 0 and self.num_records_with_key == self.num_records
                and self.num_records_with_value > 0)

    @property
    def state(self) -> str:
        if self.met:
            return "met"
        return "partial" if self.num_records_with_key else "absent"


@dataclass
class SourceLineage:
    """Lineage verdict for one source. ``qualifies`` iff every requirement is met and at least
    one lineage edge resolves."""

    source: str
    num_records: int
    requirements: dict[str, RequirementCheck]
    num_lineage_edges: int
    num_dangling_parent_refs: int
    num_groups: dict[str, int]
    weak_signals: dict[str, str]
    qualifies: bool
    reasons: list[str]

    def to_row(self) -> dict:
        """The counts the verdict is computed from (``source_verdict`` rebuilds it from them)."""
        return {"source": self.source, "num_records": self.num_records,
                "requirements": {r.name: {"fields_found": r.fields_found,
                                          "num_records_with_key": r.num_records_with_key,
                                          "num_records_with_value": r.num_records_with_value}
                                 for r in self.requirements.values()},
                "num_lineage_edges": self.num_lineage_edges,
                "num_dangling_parent_refs": self.num_dangling_parent_refs,
                "num_groups": self.num_groups, "weak_signals": sorted(self.weak_signals)}


def source_verdict(row: dict) -> SourceLineage:
    """The verdict for one source from its counts (``SourceLineage.to_row``): the one place the
    rule is written, used by the audit and by section 17's checks on a recorded run."""
    n = row["num_records"]
    checks = {}
    for req, names in REQUIREMENTS.items():
        counts = row["requirements"].get(req, {})
        checks[req] = RequirementCheck(req, names, dict(counts.get("fields_found", {})),
                                       counts.get("num_records_with_key", 0),
                                       counts.get("num_records_with_value", 0), n)
    edges = row["num_lineage_edges"]
    reasons = []
    if n == 0:
        reasons.append("no parseable object records")
    for check in checks.values():
        if n and not check.met and check.fields_found:
            reasons.append(f"{check.name} partial: {', '.join(sorted(check.fields_found))}"
                           " missing on some records or null on all")
        elif n and not check.met:
            reasons.append(f"{check.name} absent: no record has any of its "
                           f"{len(check.fields_checked)} fields")
    if n and edges == 0:
        reasons.append("0 lineage edges: no parent reference names an id in this source")
    weak = {k: WEAK_SIGNALS[k] for k in sorted(row.get("weak_signals", [])) if k in WEAK_SIGNALS}
    return SourceLineage(row["source"], n, checks, edges, row["num_dangling_parent_refs"],
                         dict(row.get("num_groups", {})), weak, qualifies=not reasons, reasons=reasons)


@dataclass
class LineageReport:
    sources: dict[str, SourceLineage] = field(default_factory=dict)

    @property
    def qualifies(self) -> bool:
        """True iff at least one source could back a trace-driven pressure comparison."""
        return any(s.qualifies for s in self.sources.values())

    @property
    def num_lineage_edges(self) -> int:
        return sum(s.num_lineage_edges for s in self.sources.values())

    def reasons(self) -> list[str]:
        return [f"{name}: {r}" for name, s in self.sources.items() for r in s.reasons]

    def to_public(self) -> dict:
        """Counts and states per source; names only from the fixed vocabularies above and the
        sources' safe names. No record content."""
        return {
            "qualifies": self.qualifies,
            "num_lineage_edges": self.num_lineage_edges,
            "sources": [  # a list: source names come from the corpus and stay out of keys
                {
                    "source": name, "num_records": s.num_records, "qualifies": s.qualifies,
                    "num_lineage_edges": s.num_lineage_edges,
                    "num_dangling_parent_refs": s.num_dangling_parent_refs,
                    "requirements": {r.name: r.state for r in s.requirements.values()},
                    "num_groups": s.num_groups, "weak_signals": sorted(s.weak_signals),
                } for name, s in self.sources.items()],
        }

    def frame(self):
        """One row per (source, requirement); pandas is imported lazily."""
        import pandas as pd
        rows = [{"source": s.source, "requirement": r.name, "state": r.state,
                 "share_with_key": r.num_records_with_key / r.num_records if r.num_records else 0.0,
                 "fields_found": ", ".join(sorted(r.fields_found)),
                 "num_lineage_edges": s.num_lineage_edges, "qualifies": s.qualifies}
                for s in self.sources.values() for r in s.requirements.values()]
        return pd.DataFrame(rows)


class LineageCollector:
    """Accumulates explicit lineage fields one record at a time: counts, field paths in their
    safe form (at most ``MAX_FOUND_PATHS`` per source and requirement), and 64-bit digests of ids
    and parent references. Memory grows with the records that carry ids, never with key count."""

    def __init__(self) -> None:
        self._num_records: Counter[str] = Counter()
        self._with_key: dict[str, Counter[str]] = defaultdict(Counter)
        self._with_value: dict[str, Counter[str]] = defaultdict(Counter)
        self._found: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        self._ids: dict[str, set[int]] = defaultdict(set)
        self._parent_refs: dict[str, list[tuple[int | None, int]]] = defaultdict(list)
        self._groups: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
        self._weak: dict[str, set[str]] = defaultdict(set)

    def observe(self, source: str, rec: Any) -> None:
        if not isinstance(rec, dict):
            return
        self._num_records[source] += 1
        own_id, parent_ref = None, None
        has_key: set[str] = set()
        has_value: set[str] = set()
        for key, sub, leaf, value in _fields(rec):
            req = _REQUIREMENT_OF.get(leaf)
            if req is not None:
                has_key.add(req)
                path = safe_name(key) if sub is None else f"{safe_name(key)}.{safe_name(sub)}"
                found = self._found[source][req]
                found[path if path in found or len(found) < MAX_FOUND_PATHS else OTHER_FIELDS] += 1
                if value is not None:
                    has_value.add(req)
            if leaf in WEAK_SIGNALS:
                self._weak[source].add(leaf)
            if leaf in ID_FIELDS and own_id is None:
                own_id = _id_key(value)
                if own_id is not None:
                    self._ids[source].add(own_id)
            elif leaf in PARENT_FIELDS and parent_ref is None:
                parent_ref = _id_key(value)
            elif leaf in GROUPING_FIELDS and (gid := _id_key(value)) is not None:
                self._groups[source][leaf].add(gid)
        self._with_key[source].update(has_key)
        self._with_value[source].update(has_value)
        if parent_ref is not None:
            self._parent_refs[source].append((own_id, parent_ref))

    def finish(self, sources: list[str]) -> LineageReport:
        """Resolve parent references into edges and build the verdict for every source."""
        report = LineageReport()
        for source in sources:
            ids = self._ids[source]
            refs = self._parent_refs[source]
            row = {"source": source, "num_records": self._num_records[source],
                   "requirements": {req: {"fields_found": dict(self._found[source][req]),
                                          "num_records_with_key": self._with_key[source][req],
                                          "num_records_with_value": self._with_value[source][req]}
                                    for req in REQUIREMENTS},
                   "num_lineage_edges": sum(1 for own, parent in refs if parent in ids and parent != own),
                   "num_dangling_parent_refs": sum(1 for _, parent in refs if parent not in ids),
                   "num_groups": {k: len(v) for k, v in sorted(self._groups[source].items())},
                   "weak_signals": sorted(self._weak[source])}
            report.sources[source] = source_verdict(row)
        return report
