"""Capture contract: valid captures pass, every broken rule gets its own per-field message."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kmesh_lib.kv.capture_contract import (
    CAPTURE_SCHEMA,
    SCHEMA_ID,
    CaptureError,
    record_from_result,
    validate_capture,
    validate_record,
    write_capture,
)
from kmesh_lib.traces.audit import audit_tree

ENGINE = {"name": "vllm", "version": "0.32.0", "mode": "real", "device": "cpu", "block_size": 16,
          "num_gpu_blocks": 64}


def _rec(inv: str, *, parent: str | None = None, family: str | None = "f0", kind: str = "child",
         t: int = 1_000, **over) -> dict:
    rec = {"schema": SCHEMA_ID, "run_id": "run-1", "invocation_id": inv, "family_id": family,
           "parent_id": parent, "kind": kind, "engine": dict(ENGINE), "clock_domain": "monotonic_ns",
           "t_submit_ns": t, "t_first_token_ns": t + 10, "t_finish_ns": t + 20,
           "prompt_token_ids": [1, 2, 3, 4], "output_token_ids": [5, 6], "num_cached_tokens": 0,
           "status": "finished"}
    rec.update(over)
    return rec


def family() -> list[dict]:
    """A parent, two children that extend it, a noise request and a warmup without a family."""
    return [
        _rec("p0", kind="parent", t=1_000,
             block_events=[{"step": 0, "op": "alloc", "block_ids": [1, 2], "ref_cnts": [1, 1]},
                           {"step": 3, "op": "hold", "block_ids": [1]}]),
        _rec("c0", parent="p0", t=2_000, num_cached_tokens=4),
        _rec("c1", parent="p0", t=2_000, num_cached_tokens=4, status="length"),
        _rec("n0", family="noise", kind="noise", t=1_500, status="aborted", t_finish_ns=None),
        _rec("w0", family=None, kind="warmup", t=10, output_token_ids=[], t_first_token_ns=None,
             t_finish_ns=None, status="aborted"),
    ]


def test_valid_capture_passes_and_round_trips(tmp_path: Path):
    path = tmp_path / "raw" / "capture.jsonl"
    report = write_capture(path, family())
    assert report.ok and report.num_records == 5
    assert (report.num_families, report.num_parent_links) == (2, 2)
    assert report.kinds == {"parent": 1, "child": 2, "noise": 1, "warmup": 1}
    again = validate_capture(path)
    assert again.ok, again.errors
    assert [json.loads(line)["invocation_id"] for line in path.read_text().splitlines()] == [
        "p0", "c0", "c1", "n0", "w0"]
    assert not list(path.parent.glob("*.tmp"))


def test_schema_documents_every_field():
    rec = family()[0]
    assert set(rec) <= set(CAPTURE_SCHEMA)
    assert {k for k, v in CAPTURE_SCHEMA.items() if v["required"]} == set(rec) - {"block_events"}
    json.dumps(CAPTURE_SCHEMA)  # a plain dict, publishable as is


@pytest.mark.parametrize("change,expected", [
    (dict(t_first_token_ns=5, t_submit_ns=10),
     "invocation 'x': field 't_first_token_ns': must be >= t_submit_ns (got 5 < 10)"),
    (dict(t_finish_ns=1_005), "field 't_finish_ns': must be >= t_first_token_ns (got 1005 < 1010)"),
    (dict(t_first_token_ns=None, t_finish_ns=990), "must be >= t_submit_ns (got 990 < 1000)"),
    (dict(t_finish_ns=None), "field 't_finish_ns': must be set when status is 'finished'"),
    (dict(t_first_token_ns=None), "field 't_first_token_ns': must be set when output_token_ids"),
    (dict(t_submit_ns=True), "field 't_submit_ns': must be an int >= 0 (got True)"),
    (dict(t_submit_ns=None), "field 't_submit_ns': must be an int >= 0 (got None)"),
    (dict(schema="kmesh.capture/0"), "field 'schema': must be 'kmesh.capture/1'"),
    (dict(run_id=""), "field 'run_id': must be a non-empty string"),
    (dict(family_id=3), "field 'family_id': must be null or a non-empty string (got 3)"),
    (dict(parent_id="x"), "field 'parent_id': must not name the invocation itself"),
    (dict(kind=None), "field 'kind': must be a non-empty string (got None)"),
    (dict(status="done"), "field 'status': must be one of finished, aborted"),
    (dict(prompt_token_ids=[]), "field 'prompt_token_ids': must not be empty"),
    (dict(prompt_token_ids=[1, -2]), "field 'prompt_token_ids': must hold ints >= 0 (item 1 is -2)"),
    (dict(output_token_ids="56"), "field 'output_token_ids': must be a list of ints >= 0 (got str)"),
    (dict(num_cached_tokens=5), "field 'num_cached_tokens': must be in 0..len(prompt_token_ids)=4"),
    (dict(num_cached_tokens=1.0), "field 'num_cached_tokens': must be an int (got 1.0)"),
    (dict(engine="vllm"), "field 'engine': must be an object (got str)"),
    (dict(engine={**ENGINE, "mode": "sim"}), "field 'engine.mode': must be one of real, replay"),
    (dict(engine={**ENGINE, "name": "sglang"}), "field 'engine.name': must be one of vllm"),
    (dict(engine={**ENGINE, "block_size": 0}), "field 'engine.block_size': must be an int > 0"),
    (dict(engine={**ENGINE, "num_gpu_blocks": 1}), "field 'engine.num_gpu_blocks': must be an int > 1"),
    (dict(engine={k: v for k, v in ENGINE.items() if k != "device"}), "field 'engine.device': missing"),
    (dict(engine={**ENGINE, "gpu": 0}), "field 'engine.gpu': unknown field"),
    (dict(prompt="hello"), "field 'prompt': unknown field (put free-form data under 'extra')"),
    (dict(extra=[1]), "field 'extra': must be an object (got list)"),
    (dict(block_events={}), "field 'block_events': must be a list (got dict)"),
    (dict(block_events=[{"step": 0, "op": "steal", "block_ids": [1]}]),
     "field 'block_events[0].op': must be one of alloc, touch"),
    (dict(block_events=[{"step": -1, "op": "alloc", "block_ids": [1]}]),
     "field 'block_events[0].step': must be an int >= 0 (got -1)"),
    (dict(block_events=[{"step": 2, "op": "alloc", "block_ids": [1]},
                        {"step": 1, "op": "free", "block_ids": [1]}]),
     "field 'block_events[1].step': must be >= the previous event's step (got 1 < 2)"),
    (dict(block_events=[{"step": 0, "op": "alloc", "block_ids": [0]}]),
     "field 'block_events[0].block_ids': ids must be ints in 1..63 (got 0)"),
    (dict(block_events=[{"step": 0, "op": "alloc", "block_ids": [64]}]),
     "field 'block_events[0].block_ids': ids must be ints in 1..63 (got 64)"),
    (dict(block_events=[{"step": 0, "op": "alloc", "block_ids": []}]),
     "field 'block_events[0].block_ids': must be a non-empty list of ints"),
    (dict(block_events=[{"step": 0, "op": "alloc", "block_ids": [1, 2], "ref_cnts": [1]}]),
     "field 'block_events[0].ref_cnts': must be 2 ints >= 0, one per block id"),
    (dict(block_events=[{"step": 0, "op": "alloc", "block_ids": [1], "hash": "ab"}]),
     "field 'block_events[0].hash': unknown field"),
])
def test_each_broken_rule_has_a_per_field_message(change, expected):
    errors = validate_record(_rec("x", **change))
    assert any(expected in e for e in errors), errors
    assert all(e.startswith("invocation 'x': field '") for e in errors), errors


def test_missing_fields_and_non_objects():
    rec = _rec("x")
    del rec["status"], rec["clock_domain"]
    assert validate_record(rec) == ["invocation 'x': field 'clock_domain': missing",
                                    "invocation 'x': field 'status': missing"]
    assert validate_record([1]) == ["invocation <unnamed>: record must be a JSON object (got list)"]
    assert validate_record(_rec("x")) == []


@pytest.mark.parametrize("mutate,expected", [
    (lambda r: r[2].update(invocation_id="c0"),
     "record 2: invocation 'c0': field 'invocation_id': duplicate"),
    (lambda r: r[1].update(parent_id="ghost"),
     "field 'parent_id': names no invocation in this capture"),
    (lambda r: r[1].update(family_id="f9"), "parent 'p0' is in family 'f0', not 'f9'"),
    (lambda r: r[1].update(t_submit_ns=500, t_first_token_ns=600, t_finish_ns=700),
     "child submitted before its parent (500 < 1000)"),
    (lambda r: r[3].update(clock_domain="wall_ns"),
     "record 3: invocation 'n0': field 'clock_domain': must equal the first record's"),
    (lambda r: r[4].update(engine={**ENGINE, "version": "0.33.0"}),
     "record 4: invocation 'w0': field 'engine': must equal the first record's"),
    (lambda r: r[1].update(run_id="run-2"), "field 'run_id': must equal the first record's"),
    (lambda r: (r[0].update(parent_id="c0"), r[1].update(t_submit_ns=1_000)),
     "field 'parent_id': parent links form a cycle"),
])
def test_rules_across_records(mutate, expected):
    records = copy.deepcopy(family())
    mutate(records)
    report = validate_capture(records)
    assert not report.ok
    assert any(expected in e for e in report.errors), report.errors


def test_write_capture_refuses_and_lists_every_problem(tmp_path: Path):
    records = family()
    records[0]["t_first_token_ns"] = 1                    # before submit
    records[1]["parent_id"] = "ghost"                      # dangling parent
    records[2]["engine"] = {**ENGINE, "num_gpu_blocks": 32}  # a second engine identity
    path = tmp_path / "capture.jsonl"
    with pytest.raises(CaptureError) as info:
        write_capture(path, records)
    assert len(info.value.errors) == 3
    assert "3 errors" in str(info.value)
    assert not path.exists()


def test_capture_file_problems(tmp_path: Path):
    path = tmp_path / "bad.jsonl"
    good = json.dumps(family()[0])
    path.write_text(good + "\n\n{oops\n")
    errors = validate_capture(path).errors
    assert errors[0] == "line 2: blank line (a capture has one record per line)"
    assert errors[1].startswith("line 3: not valid JSON")
    (tmp_path / "empty.jsonl").write_text("")
    assert validate_capture(tmp_path / "empty.jsonl").errors == ["capture holds no records"]


def test_record_from_result_passes():
    from kmesh_lib.engine.requests import RequestResult
    parent = RequestResult("p0", [1, 2, 3], output_token_ids=[4, 5], t_submit_ns=100,
                           t_token_ns=[150, 160], finish_reason="length")
    child = RequestResult("c0", [1, 2, 3, 4, 5, 6], output_token_ids=[7], num_cached_tokens=5,
                          t_submit_ns=200, t_token_ns=[210], finish_reason="stop")
    cut = RequestResult("c1", [1, 2, 3, 9], t_submit_ns=220, finish_reason=None)
    common = dict(run_id="r", engine=ENGINE, clock_domain="monotonic_ns", family_id="f")
    records = [record_from_result(parent, kind="parent", **common),
               record_from_result(child, kind="child", parent_id="p0", **common),
               record_from_result(cut, kind="child", parent_id="p0", **common)]
    assert [r["status"] for r in records] == ["length", "stop", "aborted"]
    report = validate_capture(records)
    assert report.ok, report.errors


def test_a_capture_qualifies_where_agent_traces_do_not(tmp_path: Path):
    """The audit's lineage verdict accepts what the contract guarantees."""
    write_capture(tmp_path / "ours" / "capture.jsonl", family())
    lineage = audit_tree(tmp_path).lineage
    ours = lineage.sources["ours"]
    assert ours.qualifies, ours.reasons
    assert ours.num_lineage_edges == 2
    assert lineage.qualifies
