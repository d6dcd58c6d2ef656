"""The capture contract: what an invocation capture written by kmesh's own experiments must hold.

Public agent traces cannot qualify family retention (see ``traces.lineage``), so the project's
experiments write their own captures: one JSONL record per invocation, schema
``kmesh.capture/1`` (``CAPTURE_SCHEMA`` documents every field). The contract exists so that a
retention comparison can trust, without re-deriving anything from text or timing:

* lineage: ``parent_id`` names an ``invocation_id`` of the same file, in the same family, that
  was submitted no later than the child;
* timing: every timestamp of a file is on one clock (``clock_domain``), and per invocation
  ``t_submit_ns <= t_first_token_ns <= t_finish_ns`` where present; a terminal status that means
  the engine finished ("finished", "stop", "length") requires ``t_finish_ns``;
* identity: one run and one engine configuration per file;
* tokens: exact ids, ``0 <= num_cached_tokens <= len(prompt_token_ids)``;
* physical events (optional): block ids in ``1 .. num_gpu_blocks - 1`` (vLLM reserves block 0
  as the null block), steps non-decreasing.

Validation is dependency-free and collects every problem, one message per field, e.g.
``invocation 'p0': field 't_first_token_ns': must be >= t_submit_ns (got 5 < 10)``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kmesh_lib.kv.capture_fields import (
    BLOCK_OPS,
    ENGINE_MODES,
    ENGINE_NAMES,
    SCHEMA_ID,
    STATUSES,
    check_block_events,
    check_engine,
    check_times,
    check_tokens,
    is_int,
)

CAPTURE_SCHEMA: dict[str, dict[str, Any]] = {
    "schema": {"type": "str", "required": True, "doc": f'always "{SCHEMA_ID}"'},
    "run_id": {"type": "str", "required": True, "doc": "the run that wrote the file; one per file"},
    "invocation_id": {"type": "str", "required": True, "doc": "unique within the file"},
    "family_id": {"type": "str|null", "required": True, "doc": "family the invocation belongs to"},
    "parent_id": {"type": "str|null", "required": True,
                  "doc": "invocation_id (same file, same family, submitted no later) it extends"},
    "kind": {"type": "str", "required": True,
             "doc": "role, e.g. parent, child, noise, warmup, proposal, value"},
    "engine": {"type": "object", "required": True,
               "doc": "identical for every record of the file",
               "fields": {"name": f"one of {', '.join(ENGINE_NAMES)}", "version": "str",
                          "mode": f"one of {', '.join(ENGINE_MODES)}", "device": "str",
                          "block_size": "int > 0", "num_gpu_blocks": "int > 1",
                          "model": "str (optional)"}},
    "clock_domain": {"type": "str", "required": True,
                     "doc": "names the clock of every t_*_ns; identical for every record"},
    "t_submit_ns": {"type": "int", "required": True, "doc": ">= 0"},
    "t_first_token_ns": {"type": "int|null", "required": True, "doc": ">= t_submit_ns"},
    "t_finish_ns": {"type": "int|null", "required": True,
                    "doc": ">= t_first_token_ns (or t_submit_ns); required for finished/stop/length"},
    "prompt_token_ids": {"type": "list[int>=0]", "required": True, "doc": "exact, non-empty"},
    "output_token_ids": {"type": "list[int>=0]", "required": True, "doc": "exact, may be empty"},
    "num_cached_tokens": {"type": "int", "required": True, "doc": "0 <= n <= len(prompt_token_ids)"},
    "status": {"type": "str", "required": True, "doc": f"one of {', '.join(STATUSES)}"},
    "block_events": {"type": "list[object]|absent", "required": False,
                     "doc": "physical block events, steps non-decreasing",
                     "fields": {"step": "int >= 0", "op": f"one of {', '.join(BLOCK_OPS)}",
                                "block_ids": "non-empty list[int], 1 <= id < num_gpu_blocks",
                                "ref_cnts": "list[int>=0], one per block id (optional)"}},
    "extra": {"type": "object|absent", "required": False, "doc": "free-form, never validated"},
}


class CaptureError(ValueError):
    """A capture broke its contract; ``errors`` lists every problem found."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        shown = "\n  ".join(errors[:50]) + (f"\n  ... {len(errors) - 50} more" if len(errors) > 50
                                            else "")
        super().__init__(f"capture violates {SCHEMA_ID} ({len(errors)} errors):\n  {shown}")


_ONE_PER_FILE = ("run_id", "clock_domain", "engine")  # one run, one clock, one engine per file


def _label(rec: Any) -> str:
    inv = rec.get("invocation_id") if isinstance(rec, dict) else None
    return f"invocation {inv!r}" if isinstance(inv, str) and inv else "invocation <unnamed>"


def validate_record(rec: Any, *, where: str | None = None) -> list[str]:
    """Return one message per field that breaks the contract (empty when the record is valid).

    Only per-record rules are checked here; rules across records (unique ids, parents, one clock,
    run and engine per file) belong to ``validate_capture``.
    """
    where = where or _label(rec)
    if not isinstance(rec, dict):
        return [f"{where}: record must be a JSON object (got {type(rec).__name__})"]
    errors: list[str] = []

    def bad(name: str, msg: str) -> None:
        errors.append(f"{where}: field {name!r}: {msg}")

    for name in rec:
        if name not in CAPTURE_SCHEMA:
            bad(name, "unknown field (put free-form data under 'extra')")
    for name, spec in CAPTURE_SCHEMA.items():
        if spec["required"] and name not in rec:
            bad(name, "missing")
    if "schema" in rec and rec["schema"] != SCHEMA_ID:
        bad("schema", f"must be {SCHEMA_ID!r} (got {rec['schema']!r})")
    for name in ("run_id", "invocation_id", "kind", "clock_domain"):
        if name in rec and not (isinstance(rec[name], str) and rec[name]):
            bad(name, f"must be a non-empty string (got {rec[name]!r})")
    for name in ("family_id", "parent_id"):
        if name in rec and rec[name] is not None and not (isinstance(rec[name], str) and rec[name]):
            bad(name, f"must be null or a non-empty string (got {rec[name]!r})")
    if rec.get("parent_id") is not None and rec.get("parent_id") == rec.get("invocation_id"):
        bad("parent_id", "must not name the invocation itself")
    if "status" in rec and rec["status"] not in STATUSES:
        bad("status", f"must be one of {', '.join(STATUSES)} (got {rec['status']!r})")
    if "extra" in rec and not isinstance(rec["extra"], dict):
        bad("extra", f"must be an object (got {type(rec['extra']).__name__})")
    engine = rec.get("engine")
    num_gpu_blocks = check_engine(engine, bad) if "engine" in rec else None
    check_times(rec, bad)
    check_tokens(rec, bad)
    if "block_events" in rec:
        check_block_events(rec["block_events"], num_gpu_blocks, bad)
    return errors


@dataclass
class CaptureReport:
    """Validation outcome of one capture. ``ok`` iff ``errors`` is empty."""

    source: str
    num_records: int = 0
    errors: list[str] = field(default_factory=list)
    num_families: int = 0
    num_parent_links: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    clock_domain: str | None = None
    engine: dict | None = None

    @property
    def ok(self) -> bool:
        return not self.errors

    def raise_if_invalid(self) -> CaptureReport:
        if self.errors:
            raise CaptureError(self.errors)
        return self


def _read_records(path: Path, errors: list[str]) -> list[tuple[str, Any]]:
    records = []
    with open(path, "rb") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                errors.append(f"line {line_no}: blank line (a capture has one record per line)")
                continue
            try:
                records.append((f"line {line_no}", json.loads(line)))
            except (ValueError, RecursionError) as exc:
                errors.append(f"line {line_no}: not valid JSON ({exc})")
    return records


def _parent_cycles(by_id: dict[str, dict]) -> list[str]:
    """Parent links must form a forest; equal submit times would let a cycle pass the order check."""
    errors, done = [], set()
    for start in by_id:
        path, on_path, cur = [], set(), start
        while cur in by_id and cur not in done and cur not in on_path:
            path.append(cur)
            on_path.add(cur)
            nxt = by_id[cur].get("parent_id")
            cur = None if nxt == cur else nxt  # a self-link is reported per record already
        if cur in on_path:
            errors.append(f"invocation {cur!r}: field 'parent_id': parent links form a cycle")
        done.update(path)
    return errors


def validate_capture(path_or_records: str | Path | Iterable[dict]) -> CaptureReport:
    """Validate a capture file (or records in memory): every record, then the rules across them:
    unique invocation ids, parents that exist in the same family and were submitted no later,
    one run_id, one clock_domain and one engine identity per file."""
    errors: list[str] = []
    if isinstance(path_or_records, (str, os.PathLike)):
        source = str(path_or_records)
        located = _read_records(Path(path_or_records), errors)
    else:
        source = "<records>"
        located = [(f"record {i}", rec) for i, rec in enumerate(path_or_records)]
    report = CaptureReport(source, num_records=len(located))
    by_id: dict[str, dict] = {}
    for loc, rec in located:
        errors.extend(f"{loc}: {e}" for e in validate_record(rec))
        if not isinstance(rec, dict):
            continue
        inv = rec.get("invocation_id")
        if isinstance(inv, str) and inv in by_id:
            errors.append(f"{loc}: {_label(rec)}: field 'invocation_id': duplicate")
        elif isinstance(inv, str):
            by_id[inv] = rec
        report.kinds[str(rec.get("kind"))] = report.kinds.get(str(rec.get("kind")), 0) + 1
    records = [rec for _, rec in located if isinstance(rec, dict)]
    if not located:
        errors.append("capture holds no records")
    for loc, rec in located:
        for name in _ONE_PER_FILE if records and isinstance(rec, dict) else ():
            first = records[0]
            if name in rec and name in first and rec[name] != first[name]:
                errors.append(f"{loc}: {_label(rec)}: field {name!r}: must equal the first "
                              f"record's {first[name]!r} (got {rec[name]!r})")
    for loc, rec in located:
        parent_id = rec.get("parent_id") if isinstance(rec, dict) else None
        if not isinstance(parent_id, str) or parent_id == rec.get("invocation_id"):
            continue
        parent = by_id.get(parent_id)
        where = f"{loc}: {_label(rec)}: field 'parent_id'"
        if parent is None:
            errors.append(f"{where}: names no invocation in this capture (got {parent_id!r})")
            continue
        report.num_parent_links += 1
        if parent.get("family_id") != rec.get("family_id"):
            errors.append(f"{where}: parent {parent_id!r} is in family "
                          f"{parent.get('family_id')!r}, not {rec.get('family_id')!r}")
        child_t, parent_t = rec.get("t_submit_ns"), parent.get("t_submit_ns")
        if is_int(child_t) and is_int(parent_t) and child_t < parent_t:
            errors.append(f"{where}: child submitted before its parent ({child_t} < {parent_t})")
    errors.extend(_parent_cycles(by_id))
    report.errors = errors
    report.num_families = len({r.get("family_id") for r in records} - {None})
    report.clock_domain = records[0].get("clock_domain") if records else None
    report.engine = records[0].get("engine") if records else None
    return report


def write_capture(path: str | Path, records: Iterable[dict]) -> CaptureReport:
    """Validate ``records`` and write them as a capture (atomically: a temp file then rename).

    Raises ``CaptureError`` listing every problem, and writes nothing, if any record or any rule
    across records fails.
    """
    records = list(records)
    report = validate_capture(records).raise_if_invalid()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
    os.replace(tmp, path)
    report.source = str(path)
    return report


# vLLM finish reasons -> contract statuses; an unfinished request (None) was cut off by the caller.
_FINISH_REASON_STATUS = {"stop": "stop", "length": "length", "abort": "aborted", None: "aborted"}


def record_from_result(result: Any, *, run_id: str, kind: str, engine: dict, clock_domain: str,
                       family_id: str | None = None, parent_id: str | None = None,
                       block_events: list[dict] | None = None, extra: dict | None = None) -> dict:
    """Build a capture record from a ``engine.vllm_engine.requests.RequestResult`` (duck-typed: ``request_id``,
    token ids, ``t_submit_ns``, ``t_first_token_ns``, ``t_finish_ns``, ``finish_reason``,
    ``num_cached_tokens``). The record is not validated here; ``write_capture`` does that."""
    rec = {
        "schema": SCHEMA_ID, "run_id": run_id, "invocation_id": result.request_id,
        "family_id": family_id, "parent_id": parent_id, "kind": kind, "engine": dict(engine),
        "clock_domain": clock_domain, "t_submit_ns": result.t_submit_ns,
        "t_first_token_ns": result.t_first_token_ns, "t_finish_ns": result.t_finish_ns,
        "prompt_token_ids": list(result.prompt_token_ids),
        "output_token_ids": list(result.output_token_ids),
        "num_cached_tokens": result.num_cached_tokens,
        "status": _FINISH_REASON_STATUS.get(result.finish_reason, "error"),
    }
    if block_events is not None:
        rec["block_events"] = block_events
    if extra is not None:
        rec["extra"] = extra
    return rec
