"""base.declared: the shapes a declared table takes (live fields, named from params, absent, not recomputable)."""
from __future__ import annotations

import json

import yaml

from kmesh_lib.base.captures import declare
from kmesh_lib.base.declared import ABSENT, NotRecomputable, Table, compare_tables, recorded_only
from kmesh_lib.base.params import RunParams, params_dataclass
from kmesh_lib.base.records import RunFiles, RunRecord


@params_dataclass
class XParams(RunParams):
    """Section "x"'s parameters: what its table names and builds read."""

    ENGINE: str = "real"
    BLOCK_SIZE: int = 16


declare("x", XParams, {})


def run_folder(tmp_path, params: dict) -> RunRecord:
    (tmp_path / "raw").mkdir(parents=True)
    (tmp_path / "params.resolved.yaml").write_text(yaml.safe_dump(params))
    record = RunRecord(tmp_path, "x")
    record.flush()
    return record


def problems(tables, tmp_path) -> dict[str, tuple]:
    run = RunFiles(tmp_path)
    return {line.name: line.problems for line in compare_tables(tables, run, run.results)}


def _absent(run):
    return ABSENT


def _cannot(run):
    raise NotRecomputable("raw/sweep.jsonl absent")


TABLES = {
    "{ENGINE}-B{BLOCK_SIZE}": Table(lambda run: {"block_size": run.params.BLOCK_SIZE}, live=("start_s",)),
    "absent": Table(_absent),
    "none": Table(lambda run: None),  # a table whose value is null: stored, compared
    "sweep": Table(_cannot),
    "wall_s": recorded_only("a wall-clock time"),
}


def test_live_fields_are_kept_and_required(tmp_path):
    record = run_folder(tmp_path, {"ENGINE": "real", "BLOCK_SIZE": 16})
    record.save("real-B16", {"start_s": 1.5})
    record.save("wall_s", 2.0)
    record.save("sweep", [1, 2])
    stored = record.save_tables(TABLES)
    assert stored == {"real-B16": {"block_size": 16, "start_s": 1.5}, "none": None}  # absent, not recomputable: not written
    assert problems(TABLES, tmp_path) == {"real-B16": (), "absent": (), "none": (), "sweep": (), "wall_s": ()}

    results = json.loads((tmp_path / "results.json").read_text())
    del results["real-B16"]["start_s"]
    results["real-B16"]["block_size"] = 32
    results["absent"] = {"a": 1}
    (tmp_path / "results.json").write_text(json.dumps(results))
    found = problems(TABLES, tmp_path)
    assert found["real-B16"] == ("real-B16.start_s: live field not recorded", "real-B16.block_size: 16 != 32")
    assert found["absent"] == ("in results.json, but this run's files and params have no such table",)


def test_a_not_recomputable_table_must_still_be_recorded(tmp_path):
    run_folder(tmp_path, {"ENGINE": "real", "BLOCK_SIZE": 16})
    found = problems(TABLES, tmp_path)
    assert found["sweep"] == ("declared, not in results.json",)
    assert found["wall_s"] == ()  # recorded only: a run that did not measure it claims nothing
    assert found["real-B16"] == ("declared, not in results.json",)
    assert found["absent"] == ()
    assert found["none"] == ("declared, not in results.json",)


def test_names_from_params_that_collide_are_a_finding(tmp_path):
    run_folder(tmp_path, {"ENGINE": "replay", "BLOCK_SIZE": 16})
    tables = {"{ENGINE}-B{BLOCK_SIZE}": Table(_absent), "replay-B16": Table(_absent)}
    assert list(problems(tables, tmp_path)) == ["(declared table names)"]
