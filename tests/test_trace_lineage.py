"""Lineage verdict: only explicit fields count; edges must resolve inside their source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kmesh_lib.base.data import DATA_SETS
from kmesh_lib.traces.audit import audit_tree
from kmesh_lib.traces.lineage import MAX_FOUND_PATHS, REQUIREMENTS, LineageCollector, source_verdict
from kmesh_lib.traces.names import OTHER_FIELDS, is_safe


def _write(path: Path, records: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _full(inv: str, parent: str | None) -> dict:
    return {"request_id": inv, "parent_id": parent, "start_time": 1.0, "end_time": 2.0,
            "engine_id": "e0", "kv_events": [{"op": "alloc", "block": 3}]}


def test_explicit_fields_qualify_and_edges_resolve(tmp_path: Path):
    _write(tmp_path / "full" / "t.jsonl", [
        _full("a", None), _full("b", "a"), _full("c", "a"), _full("d", "b"),
        _full("e", "zzz"),   # dangling: names no id in the source
        _full("f", "f"),     # a self-reference is not an edge
    ])
    report = audit_tree(tmp_path).lineage
    src = report.sources["full"]
    assert src.qualifies, src.reasons
    assert (src.num_lineage_edges, src.num_dangling_parent_refs) == (3, 1)
    assert all(check.met for check in src.requirements.values())
    assert src.requirements["engine_identity"].fields_found == {"engine_id": 6}
    assert report.qualifies and report.num_lineage_edges == 3


def test_agent_trace_shape_does_not_qualify(tmp_path: Path):
    """session_id + one timestamp + model name, with prompts that share a prefix and arrive in a
    neat sequence: looks like lineage, establishes none."""
    system = "You are a helpful agent. " * 20
    _write(tmp_path / "agent" / "s.jsonl", [
        {"timestamp": 1_760_000_000_000_000 + i * 2_000_000, "session_id": f"s{i % 2}",
         "model": None, "input": system + f"step {i}", "output": "ok"} for i in range(6)])
    report = audit_tree(tmp_path).lineage
    src = report.sources["agent"]
    assert not src.qualifies and not report.qualifies
    assert src.num_lineage_edges == 0
    assert {name: c.state for name, c in src.requirements.items()} == dict.fromkeys(
        REQUIREMENTS, "absent")
    assert src.num_groups == {"session_id": 2}
    assert set(src.weak_signals) == {"timestamp", "model"}
    assert "0 lineage edges: no parent reference names an id in this source" in src.reasons


def test_partial_requirements_and_per_source_resolution(tmp_path: Path):
    # parent_id missing on one record: partial; its parent lives in another source: no edge
    _write(tmp_path / "one" / "x.jsonl", [{"id": "a", "parent_id": None}, {"id": "b"}])
    _write(tmp_path / "two" / "x.jsonl", [{"id": "c", "parent_id": "a"}])
    report = audit_tree(tmp_path).lineage
    assert report.sources["one"].requirements["parent_links"].state == "partial"
    assert report.sources["two"].requirements["parent_links"].state == "met"
    assert report.sources["two"].num_lineage_edges == 0
    assert report.sources["two"].num_dangling_parent_refs == 1


def test_nested_fields_count_and_null_engine_does_not(tmp_path: Path):
    _write(tmp_path / "n" / "x.jsonl", [
        {"id": 1, "metadata": {"parent_request_id": None, "engine": None}},
        {"id": 2, "metadata": {"parent_request_id": 1, "engine": None}}])
    src = audit_tree(tmp_path).lineage.sources["n"]
    assert src.num_lineage_edges == 1
    assert src.requirements["parent_links"].fields_found == {"metadata.parent_request_id": 2}
    assert src.requirements["engine_identity"].state == "partial"  # keys present, all null


def test_source_without_records_and_collector_ignores_non_objects():
    collector = LineageCollector()
    collector.observe("s", [1, 2])
    report = collector.finish(["s"])
    assert report.sources["s"].reasons == ["no parseable object records"]
    assert not report.qualifies
    assert json.dumps(report.to_public())


def test_ids_are_typed_and_the_verdict_rebuilds_from_its_counts(tmp_path: Path):
    # 1 and "1" are different ids: a parent "1" does not resolve to the record whose id is 1
    _write(tmp_path / "t" / "x.jsonl", [_full(1, None), _full(2, "1"), _full(3, 1)])
    src = audit_tree(tmp_path).lineage.sources["t"]
    assert (src.num_lineage_edges, src.num_dangling_parent_refs) == (1, 1)
    rebuilt = source_verdict(json.loads(json.dumps(src.to_row())))
    assert (rebuilt.qualifies, rebuilt.reasons, rebuilt.num_lineage_edges) == (src.qualifies, src.reasons, 1)


def test_field_paths_are_capped_and_safe(tmp_path: Path):
    secret = "token-" + "7" * 60
    records = [{f"wrapper{i}": {"parent_id": None}, "id": i} for i in range(MAX_FOUND_PATHS + 10)]
    records.append({secret: {"request_id": 1}})
    _write(tmp_path / "t" / "x.jsonl", records)
    src = audit_tree(tmp_path).lineage.sources["t"]
    found = src.requirements["parent_links"].fields_found
    assert len(found) == MAX_FOUND_PATHS + 1 and found[OTHER_FIELDS] == 10
    paths = [p for r in src.requirements.values() for p in r.fields_found]
    assert all(is_safe(part) for p in paths for part in p.split("."))
    assert secret not in json.dumps(src.to_row())


@pytest.mark.requires_data("lmcache-agent-trace")
def test_real_corpus_verdict():
    report = audit_tree(DATA_SETS["lmcache-agent-trace"].path()).lineage
    assert report.qualifies is False
    assert report.num_lineage_edges == 0
    for name, src in report.sources.items():
        assert not src.qualifies
        assert src.requirements["parent_links"].state == "absent", name
        assert src.requirements["cache_events"].state == "absent", name
