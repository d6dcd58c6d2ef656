"""The declared captures (``base.captures``): every record written and read through its section's class.

A record the class refuses fails as it is written, naming the capture and the field; a stored line it
refuses is one ``RunFileError`` naming the file, the line and the field; a header naming a version this
code does not know is refused; and every published run's declared captures read as version 1 with the
same classes, each record giving back exactly the line it was read from (an arm renamed since, issue 41, under its
new name).
"""
from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

import pytest

from kmesh_lib.app import registry
from kmesh_lib.base.captures import CaptureError, declaration
from kmesh_lib.base.paths import REPO_ROOT
from kmesh_lib.base.records import RunFileError, RunFiles, RunRecord

PUBLISHED = sorted(p for p in (REPO_ROOT / "outputs").glob("*/*") if (p / "results.json").is_file())
RETENTION = REPO_ROOT / "outputs" / "retention" / "cpu-20261201-062854-c0b9"


def _published_group() -> dict:
    return RunFiles(RETENTION).raw("groups.jsonl")[0]


def _new_run(tmp_path: Path) -> RunRecord:
    registry.get("retention")
    (tmp_path / "raw").mkdir()
    return RunRecord(tmp_path, "retention")


def test_a_record_the_class_refuses_fails_as_it_is_written(tmp_path):
    record = _new_run(tmp_path)
    renamed = {("block_name" if k == "block" else k): v for k, v in _published_group().items()}
    with pytest.raises(CaptureError, match=r"raw/groups\.jsonl: .*field 'block'.*field 'block_name': not declared"):
        record.append_jsonl("groups.jsonl", renamed)
    wrong_type = {**_published_group(), "pair": "3"}
    with pytest.raises(CaptureError, match=r"raw/groups\.jsonl: .*field 'pair': Input should be a valid integer"):
        record.append_jsonl("groups.jsonl", wrong_type)
    assert not (tmp_path / "raw" / "groups.jsonl").exists()  # nothing of a refused write is written


def test_a_new_capture_starts_with_its_schema_header_and_reads_back_typed(tmp_path):
    record = _new_run(tmp_path)
    group = _published_group()
    record.append_jsonl("groups.jsonl", [group, group])
    record.append_jsonl("groups.jsonl", group)
    lines = (tmp_path / "raw" / "groups.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {"schema": "retention.groups", "version": 1}
    run = RunFiles(tmp_path, section="retention")
    assert run.raw("groups.jsonl") == [group] * 3  # the header is no record
    typed = run.records("groups.jsonl")
    assert [r.as_recorded() for r in typed] == [group] * 3
    assert typed[0].engine_run == group["block"] and typed[0].makespan_s == group["makespan_s"]


def _copy_with(tmp_path: Path, change) -> Path:
    run_dir = tmp_path / "retention" / RETENTION.name
    shutil.copytree(RETENTION, run_dir)
    path = run_dir / "raw" / "groups.jsonl.xz"
    with lzma.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    with lzma.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(change(lines)) + "\n")
    return run_dir


def _edit_line(lines: list[str], index: int, edit) -> list[str]:
    lines[index] = json.dumps(edit(json.loads(lines[index])))
    return lines


@pytest.mark.parametrize(("change", "message"), [
    (lambda lines: _edit_line(lines, 4, lambda r: {("ttft_s" if k == "ttft_a_s" else k): v for k, v in r.items()}),
     r"groups\.jsonl\.xz: line 5 is not a RetentionGroup \(field 'ttft_a_s': Field required; field 'ttft_s': not declared\)"),
    (lambda lines: _edit_line(lines, 0, lambda r: {**r, "measured": "yes"}),
     r"groups\.jsonl\.xz: line 1 is not a RetentionGroup \(field 'measured': Input should be a valid boolean\)"),
    (lambda lines: [json.dumps({"schema": "retention.groups", "version": 7}), *lines],
     r"groups\.jsonl\.xz: schema 'retention.groups' version 7: this code reads version 1"),
    (lambda lines: [json.dumps({"schema": "prefetch.groups", "version": 1}), *lines],
     r"groups\.jsonl\.xz: header names schema 'prefetch.groups', this capture is 'retention.groups'"),
])
def test_a_stored_line_the_class_refuses_is_one_line_naming_file_line_and_field(tmp_path, change, message):
    from kmesh_lib.app.verify import verify

    run_dir = _copy_with(tmp_path, change)
    with pytest.raises(RunFileError, match=message) as caught:
        verify(registry.get("retention"), RunFiles(run_dir))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("run_dir", PUBLISHED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_published_captures_read_as_version_1_with_the_declared_classes(run_dir):
    section = registry.get(run_dir.parent.name)
    assert declaration(section.KEY).captures == section.CAPTURES
    run = RunFiles(run_dir)
    for name in run.raw_names():
        if run.capture_class(name) is None:
            assert not section.CAPTURES, f"{name}: a capture {section.KEY} does not declare"
            continue
        assert [r.as_recorded() for r in run.records(name)] == [_as_read(line, section.KEY, name) for line in run.raw(name)]


# issue 41: the arm whose context is already in vLLM's KV, as the captures published before it name it
OLD_ARMS = {"retention": ("groups.jsonl", "floor"), "prefetch": ("groups.jsonl", "engine"),
            "crossover": ("rows.jsonl", "floor")}


def _as_read(line: dict, section: str, name: str) -> dict:
    """A stored line as its record reads it: the renamed arm under its current name, every other value as stored."""
    capture, old = OLD_ARMS.get(section, (None, None))
    if name.replace(".unfinished", "") not in (capture, "pairs.jsonl" if section == "crossover" else None):
        return line
    return {k: "resident" if k in ("arm", "previous_arm") and v == old else v for k, v in line.items()}


@pytest.mark.parametrize(("run_dir", "section"), [
    (RETENTION, "retention"), (REPO_ROOT / "outputs" / "prefetch" / "cpu-20261201-063425-dc67", "prefetch"),
    (REPO_ROOT / "outputs" / "crossover" / "cpu-20261202-132634-a2df", "crossover")], ids=lambda v: str(v)[-9:])
def test_a_published_old_arm_name_reads_as_resident_and_a_new_record_may_not_write_it(tmp_path, run_dir, section):
    """The published capture keeps the word it was written with (evidence); its record, and every table and check
    built from it, says ``resident``. A record written now that names the old word is refused, naming the field."""
    name, old = OLD_ARMS[section]
    run = RunFiles(run_dir)
    stored = [line for line in run.raw(name) if line["arm"] == old]
    read = run.records(name)
    assert stored and sum(r.arm == "resident" for r in read) == len(stored) and not any(r.arm == old for r in read)
    (tmp_path / "raw").mkdir()
    record = RunRecord(tmp_path, section)
    with pytest.raises(CaptureError, match=rf"raw/{name}: record 0 .*field 'arm': Value error, '{old}' is now 'resident'"):
        record.append_jsonl(name, stored[0])
    record.append_jsonl(name, {**stored[0], "arm": "resident"})
    assert RunFiles(tmp_path, section=section).records(name)[0].arm == "resident"


def test_sections_18_and_19_read_kmesh_capture_records_typed_and_refuse_a_stray_field(tmp_path):
    """kmesh.capture/1 (``kv.capture_records.InvocationRecord``): 18's capture.<mode>.jsonl by its pattern, 19's
    tot_capture.jsonl with its typed ``extra``, whose undeclared field fails as it is written."""
    registry.get("family_hold")
    family = RunFiles(REPO_ROOT / "outputs" / "family_hold" / "cpu-20261201-060851-7382")
    assert {family.capture_class(f"capture.{mode}.jsonl").__name__ for mode in ("real", "replay", "replay_at_real")} \
        == {"FamilyHoldInvocation"}
    first = family.records("capture.real.jsonl")[0]
    assert (first.schema_id, first.engine.block_size, first.block_events[0].op) == ("kmesh.capture/1", 32, "alloc")
    registry.get("tot_headroom")
    call = RunFiles(REPO_ROOT / "outputs" / "tot_headroom" / "cpu-20261201-065654-28e5").raw("tot_capture.jsonl")[0]
    (tmp_path / "raw").mkdir()
    record = RunRecord(tmp_path, "tot_headroom")
    with pytest.raises(CaptureError, match=r"raw/tot_capture\.jsonl: .*field 'extra\.seeds': not declared"):
        record.append_jsonl("tot_capture.jsonl", {**call, "extra": {**call["extra"], "seeds": [1]}})
    record.append_jsonl("tot_capture.jsonl", call)
    assert RunFiles(tmp_path, section="tot_headroom").records("tot_capture.jsonl")[0].extra.seed == call["extra"]["seed"]
