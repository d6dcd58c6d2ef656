"""base.derived and the interval memo: a build runs once per content of the files it reads, and any edit to
one of them builds afresh (the cache never answers for a changed capture or params file)."""
import json

import numpy as np

from kmesh_lib.base import derived
from kmesh_lib.base.intervals import bootstrap_interval
from kmesh_lib.base.records import RunFiles


def _run(tmp_path, name="run", value=1):
    run_dir = tmp_path / name
    (run_dir / "raw").mkdir(parents=True)
    (run_dir / "params.resolved.yaml").write_text("SEED: 0\n")
    (run_dir / "raw" / "groups.jsonl").write_text(json.dumps({"value": value}) + "\n")
    (run_dir / "raw" / "other.jsonl").write_text(json.dumps({"x": 1}) + "\n")
    return RunFiles(run_dir)


def test_a_build_runs_once_per_content_and_again_after_any_edit_to_what_it_reads(tmp_path):
    derived.forget()
    calls = []

    def build(run):
        calls.append(run.run_dir.name)
        return {"total": sum(r["value"] for r in run.raw("groups.jsonl"))}

    def of(run):
        return derived.once_per_content(run, "test.total", ["groups.jsonl"], lambda: build(run))

    first = _run(tmp_path, "a")
    assert of(first) == {"total": 1} and of(first) == {"total": 1}
    assert of(_run(tmp_path, "copy")) == {"total": 1}  # the same bytes in another folder: no new build
    assert calls == ["a"]

    edited = _run(tmp_path, "edited", value=5)
    assert of(edited) == {"total": 5}
    params_edited = _run(tmp_path, "params")
    (params_edited.run_dir / "params.resolved.yaml").write_text("SEED: 1\n")
    assert of(params_edited) == {"total": 1}
    other_edited = _run(tmp_path, "other")  # a capture the build does not name: the key stays
    (other_edited.run_dir / "raw" / "other.jsonl").write_text(json.dumps({"x": 2}) + "\n")
    assert of(other_edited) == {"total": 1}
    assert calls == ["a", "edited", "params"]


def test_a_caller_cannot_change_what_the_next_one_reads(tmp_path):
    derived.forget()
    run = _run(tmp_path)
    got = derived.once_per_content(run, "test.rows", ["groups.jsonl"], lambda: {"rows": [1, 2]})
    got["rows"].append(3)
    assert derived.once_per_content(run, "test.rows", ["groups.jsonl"], lambda: {"rows": []}) == {"rows": [1, 2]}


def test_an_interval_is_the_same_from_the_memo_and_differs_with_any_input():
    a, b = np.arange(10.0), np.arange(10.0)[::-1] * 0.5
    stat = lambda x, y, axis: np.mean(x - y, axis=axis)  # noqa: E731
    first = bootstrap_interval((a, b), stat, paired=True, resamples=999, seed=3)
    assert bootstrap_interval((a.copy(), b.copy()), stat, paired=True, resamples=999, seed=3) == first  # equal arrays
    assert bootstrap_interval((a, b), stat, paired=True, resamples=999, seed=3) == first
    assert bootstrap_interval((a, b), stat, paired=True, resamples=999, seed=4) != first
    shifted = b.copy()
    shifted[0] += 1.0
    assert bootstrap_interval((a, shifted), stat, paired=True, resamples=999, seed=3) != first
    median = lambda x, y, axis: np.median(x - y, axis=axis)  # noqa: E731
    assert bootstrap_interval((a, b), median, paired=True, resamples=999, seed=3) != first


def test_where_the_folder_is_does_not_change_the_key(tmp_path):
    here, there = _run(tmp_path, "here"), _run(tmp_path, "there")
    (here.run_dir / "params.resolved.yaml").write_text("RUN_DIR: runs/x/here\nSEED: 0\n")
    (there.run_dir / "params.resolved.yaml").write_text("RUN_DIR: outputs/x/there\nSEED: 0\n")
    assert derived.content_key(here, ["groups.jsonl"]) == derived.content_key(there, ["groups.jsonl"])
