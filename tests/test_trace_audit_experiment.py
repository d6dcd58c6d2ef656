"""Section 17 glue: params, plan, the contract example, and verify catching a tampered run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kmesh_lib.app import registry as sections
from kmesh_lib.app.cli import main
from kmesh_lib.app.publish import find_private_keys, public_results
from kmesh_lib.base import params
from kmesh_lib.base.params import resolve_params
from kmesh_lib.base.paths import REPO_ROOT
from kmesh_lib.kv.capture_contract import write_capture
from kmesh_lib.sections import trace_audit as ta_checks
from kmesh_lib.sections.trace_audit import experiment as ta
from kmesh_lib.sections.trace_audit import params as ta_params
from kmesh_lib.sections.trace_audit.checks import public_invariants
from kmesh_lib.traces.audit import audit_tree


def _line(obj) -> str:
    return json.dumps(obj) + "\n"


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """Two sources, a malformed line, a duplicate, a directory without JSONL."""
    root = tmp_path / "corpus"
    (root / "alpha").mkdir(parents=True)
    (root / "beta").mkdir()
    (root / "gamma").mkdir()
    rec = {"timestamp": 1_760_000_000_000_000, "session_id": "s0", "input": "hi", "output": "yo"}
    (root / "alpha" / "a.jsonl").write_text(_line(rec) + _line(rec) + "{broken\n")
    (root / "beta" / "b.jsonl").write_text(_line(rec | {"session_id": "s1", "model": None}))
    (root / "gamma" / "notes.txt").write_text("not a trace")
    return root


def _run_dir(tmp_path: Path, root: Path) -> Path:
    """What the notebook records, minus the notebook: results.json, params, the contrast capture."""
    run_dir = tmp_path / "run"
    audit = audit_tree(root)
    capture = run_dir / "contrast" / "kmesh-capture" / "capture.jsonl"
    write_capture(capture, ta.contract_example("test-run"))
    contrast = audit_tree(capture.parent.parent)
    results = {"section": "trace_audit", "run_id": "run", "audit": audit.to_public(),
               "inputs": audit.file_hashes, "lineage_verdict": audit.lineage.qualifies,
               "contrast": {"path": "contrast/kmesh-capture/capture.jsonl",
                            "sha256": contrast.files[0].sha256,
                            "qualifies": contrast.lineage.qualifies}}
    (run_dir / "results.json").write_text(json.dumps(results))
    (run_dir / "params.resolved.yaml").write_text(yaml.safe_dump({"TRACE_ROOT": str(root)}))
    return run_dir


def _failed(run_dir: Path) -> list[str]:
    return [c.name for c in ta_checks.checks(run_dir) if not c.ok]


def test_missing_or_file_root_is_a_param_error(tmp_path: Path):
    with pytest.raises(params.ParamError, match=r"TRACE_ROOT='/nonexistent/traces': .* does not exist"):
        params.build(ta.TraceAuditParams, {"TRACE_ROOT": "/nonexistent/traces"})
    not_dir = tmp_path / "file.jsonl"
    not_dir.write_text("{}\n")
    with pytest.raises(params.ParamError, match="is not a directory"):
        params.build(ta.TraceAuditParams, {"TRACE_ROOT": str(not_dir)})
    with pytest.raises(params.ParamError, match="MAX_LINE_MB=0: must be > 0"):
        params.build(ta.TraceAuditParams, {"TRACE_ROOT": str(tmp_path), "MAX_LINE_MB": 0})


def test_cli_plan_fails_with_exit_2_on_a_missing_root(capsys):
    assert main(["plan", "17", "--set", "TRACE_ROOT=/nonexistent/traces"]) == 2
    assert "TRACE_ROOT='/nonexistent/traces'" in capsys.readouterr().err


def test_relative_root_resolves_against_the_repo_not_the_cwd(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # papermill runs notebooks from notebooks/
    assert ta_params.resolve_root("kmesh_lib") == REPO_ROOT / "kmesh_lib"
    cfg = params.build(ta.TraceAuditParams, {"TRACE_ROOT": "kmesh_lib", "MAX_LINE_MB": 0.5})
    assert cfg.max_line_bytes == 1 << 19


def test_params_layer_without_engine_files(tmp_path):
    section = sections.get("17")
    for name in ("common.yaml", "trace_audit.yaml", "engine.smoke.yaml", "trace_audit.smoke.yaml"):
        (tmp_path / name).write_text("SEED: 1\n")
    files = params.param_files(section.KEY, "smoke", section.USES_ENGINE, tmp_path)
    assert [f.name for f in files] == ["common.yaml", "trace_audit.yaml", "trace_audit.smoke.yaml"]


def test_plan_counts_files_and_bytes_without_auditing(corpus: Path):
    cfg = params.build(ta.TraceAuditParams, {"TRACE_ROOT": str(corpus)})
    out = ta.plan(cfg)
    size = sum(p.stat().st_size for p in corpus.rglob("*.jsonl"))
    assert out["files to audit"] == (f"2 JSONL files, {size / 1e6:.1f} MB, in 2 sources; "
                                     "1 other file listed, not read")
    assert out["sources"].startswith("alpha (1 file, ")
    assert "expected duration" in out


def test_contract_example_is_valid_and_qualifies(tmp_path: Path):
    path = tmp_path / "c" / "kmesh-capture" / "capture.jsonl"
    report = write_capture(path, ta.contract_example("r"))
    assert report.ok and (report.num_families, report.num_parent_links) == (2, 2)
    lineage = audit_tree(tmp_path / "c").lineage
    assert lineage.qualifies and lineage.num_lineage_edges == 2


def test_tables_and_matrices(corpus: Path):
    audit = audit_tree(corpus)
    labels = ta.source_labels(audit)
    assert labels == {"alpha": "alpha (2 records)", "beta": "beta (1 record)"}
    have = ta.coverage_matrix(audit)
    assert have.loc["beta (1 record)", "model"] == 0.0  # present but null
    assert have.loc["alpha (2 records)", "model"] == 0.0  # absent
    assert have.loc["alpha (2 records)", "input"] == 1.0
    need = ta.requirement_matrix(audit.lineage, labels)
    assert need.shape == (2, 5) and (need == 0).all().all()
    verdict = ta.verdict_table(audit.lineage)
    assert list(verdict["qualifies"]) == [False, False]
    assert ta.timestamp_table(audit)["unit"].tolist() == ["us", "us"]


def test_set_hash_formula_matches_the_audit(corpus: Path):
    audit = audit_tree(corpus)
    assert ta.set_sha256_of(audit.file_hashes) == audit.set_sha256
    assert all(public_invariants(audit.to_public()).values())


def test_verify_passes_on_an_honest_run(tmp_path: Path, corpus: Path):
    run_dir = _run_dir(tmp_path, corpus)
    assert _failed(run_dir) == []
    assert find_private_keys(json.loads((run_dir / "results.json").read_text())) == []


def test_verify_catches_a_tampered_input_hash(tmp_path: Path, corpus: Path):
    run_dir = _run_dir(tmp_path, corpus)
    results = json.loads((run_dir / "results.json").read_text())
    results["inputs"]["alpha/a.jsonl"] = "0" * 64
    (run_dir / "results.json").write_text(json.dumps(results))
    failed = _failed(run_dir)
    assert "input files re-hash to the recorded sha256" in failed
    assert "inputs are the audit's file hashes" in failed
    assert "set hash recomputes from the inputs" in failed


def test_verify_catches_a_changed_input_file(tmp_path: Path, corpus: Path):
    run_dir = _run_dir(tmp_path, corpus)
    (corpus / "beta" / "b.jsonl").write_text(_line({"timestamp": 1}))
    assert _failed(run_dir) == ["input files re-hash to the recorded sha256"]


def test_verify_catches_doctored_counts_and_verdict(tmp_path: Path, corpus: Path):
    run_dir = _run_dir(tmp_path, corpus)
    results = json.loads((run_dir / "results.json").read_text())
    results["audit"]["summary"]["num_unique_records"] += 1
    results["audit"]["files"][0]["num_malformed_lines"] = 0
    results["lineage_verdict"] = True
    (run_dir / "results.json").write_text(json.dumps(results))
    failed = _failed(run_dir)
    assert "audit: records = unique + duplicate copies" in failed
    assert "audit: malformed lines per file sum to the total" in failed
    assert "lineage verdict recorded and consistent" in failed


def test_verify_tolerates_a_corpus_that_is_gone(tmp_path: Path, corpus: Path):
    run_dir = _run_dir(tmp_path, corpus)
    (run_dir / "params.resolved.yaml").write_text(yaml.safe_dump({"TRACE_ROOT": "/nonexistent"}))
    checks = {c.name: c for c in ta_checks.checks(run_dir)}
    rehash = checks["input files re-hash to the recorded sha256"]
    assert rehash.ok and "nothing re-hashed" in rehash.detail


def test_public_results_carry_the_input_hashes(tmp_path: Path, corpus: Path):
    run_dir = _run_dir(tmp_path, corpus)
    public = public_results(run_dir)
    assert public["input_hashes"] == audit_tree(corpus).file_hashes
    assert public["results"]["audit"]["set_sha256"] == audit_tree(corpus).set_sha256


def test_cli_resolves_the_shared_corpus_by_default():
    root = ta_params.resolve_root(ta_params.DEFAULT_TRACE_ROOT)
    if not root.is_dir():
        pytest.skip("shared corpus not present")
    cfg, _, _ = resolve_params(sections.get("17"), "cpu", [], [])
    assert cfg.trace_root == root
