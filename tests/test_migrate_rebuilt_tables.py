"""``scripts/migrate_declared_results.py --rebuilt-tables`` on a copy of a published run: a refusal, or any failure
after results.json was rewritten, leaves the run's results.json and public-results.json as they were."""
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RUN = REPO / "outputs" / "crossover" / "gpu-20261205-053105-942c"  # the paired design's run: its resolution table
spec = importlib.util.spec_from_file_location("migrate_declared_results", REPO / "scripts" / "migrate_declared_results.py")
migrate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(migrate)


@pytest.fixture
def stale_copy(tmp_path):
    """The run copied, its resolution table as older code stored it (no span_lag1): the pass has a table to rebuild."""
    run_dir = tmp_path / "crossover" / RUN.name
    shutil.copytree(RUN, run_dir)
    results = json.loads((run_dir / "results.json").read_text())
    for row in results["restore_resolution"]:
        row.pop("span_lag1")
    (run_dir / "results.json").write_text(json.dumps(results, separators=(",", ":")))
    return run_dir


def test_a_failure_after_the_rewrite_restores_the_run(stale_copy, monkeypatch):
    before = {name: (stale_copy / name).read_bytes() for name in ("results.json", "public-results.json")}

    def broken(run_dir):
        raise RuntimeError("public document")
    monkeypatch.setattr(migrate, "rebuild_public", broken)
    with pytest.raises(RuntimeError):
        migrate.rebuild_tables(stale_copy, "test")
    assert {name: (stale_copy / name).read_bytes() for name in before} == before


def test_a_changed_status_is_refused_and_the_run_restored(stale_copy):
    results = json.loads((stale_copy / "results.json").read_text())
    name = next(n for n, rec in results["checks"].items() if rec["status"] == "failed")
    results["checks"][name]["status"] = "ok"  # recorded ok: the rebuild must not store it failed, nor narrow it
    (stale_copy / "results.json").write_text(json.dumps(results, separators=(",", ":")))
    before = {name: (stale_copy / name).read_bytes() for name in ("results.json", "public-results.json")}
    with pytest.raises(migrate.Refused, match="recorded ok, now failed"):
        migrate.rebuild_tables(stale_copy, "test")
    assert {name: (stale_copy / name).read_bytes() for name in before} == before


def test_the_pass_stores_the_rebuilt_table_and_verifies_as_recorded(stale_copy):
    note = migrate.rebuild_tables(stale_copy, "test")
    assert note["tables_rebuilt"] == {"restore_resolution": 12} and note["verify_after"].startswith("NOT verified")
    results = json.loads((stale_copy / "results.json").read_text())
    assert all("span_lag1" in row for row in results["restore_resolution"])
    assert results["migration"]["rebuilt"][-1]["why"] == "test" and "dirty" in results["migration"]["rebuilt"][-1]
    assert migrate.rebuild_tables(stale_copy, "again") == {"skipped": "every declared table is as the code builds it"}


def test_dry_run_with_a_pass_that_writes_is_refused_before_touching_a_run(stale_copy, capsys):
    before = (stale_copy / "results.json").read_bytes()
    with pytest.raises(SystemExit) as stop:
        migrate.main(["--dry-run", "--rebuilt-tables", "why", str(stale_copy)])
    assert stop.value.code == 2 and "--rebuilt-tables" in capsys.readouterr().err
    assert (stale_copy / "results.json").read_bytes() == before


def test_a_later_check_the_run_predates_stays_left_out(tmp_path):
    """A run from before the paired design records none of its checks (skipped: no raw/pairs.jsonl); the pass
    leaves them out, as verify does, instead of refusing the run."""
    old = REPO / "outputs" / "crossover" / "gpu-20261201-224722-442e"  # a run from before the paired design
    run_dir = tmp_path / "crossover" / old.name
    shutil.copytree(old, run_dir)
    results = json.loads((run_dir / "results.json").read_text())
    for row in results["crossover"]:
        for key in [k for k in row if k.startswith("speedup_ci@")]:
            row.pop(key)
    (run_dir / "results.json").write_text(json.dumps(results, separators=(",", ":")))
    note = migrate.rebuild_tables(run_dir, "the speed-up interval")
    assert set(note["tables_rebuilt"]) == {"crossover"}
    from kmesh_lib.sections.crossover.checks import PAIRED_CHECKS

    recorded = json.loads((run_dir / "results.json").read_text())["checks"]
    assert recorded and not set(PAIRED_CHECKS) & set(recorded)
