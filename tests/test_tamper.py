"""The tamper suite: every published run, copied and edited once, must fail ``kmesh verify``.

A reviewer's single edit to anything a run publishes (its public document, environment, parameters,
tables, captures, check record) has to show. For each published run the untouched copy first
verifies as the run recorded (a passed run verifies; a run published as failed keeps exactly its
own problems); then each edit below is made to a fresh copy and must add a problem the untouched
copy does not have. Edited copies are verified as a gate over many runs verifies them
(``first_problem``: files that differ from the SHA-256s recorded at measurement stop verify there, before
every figure is recomputed -- minutes for section 23's production trace, per edit); the untouched copy is
verified in full, and ``test_a_full_verify_of_an_edited_capture_also_recomputes_what_changed`` holds the full
verify to more than the hash line.
"""
from __future__ import annotations

import json
import lzma
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from kmesh_lib.app import registry
from kmesh_lib.app.verify import verify
from kmesh_lib.base.captures import is_header
from kmesh_lib.base.declared import RUN_FIELDS
from kmesh_lib.base.paths import REPO_ROOT
from kmesh_lib.base.records import COMPRESSED, RunFiles

PUBLISHED = sorted(p for p in (REPO_ROOT / "outputs").glob("*/*") if (p / "results.json").is_file())


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, separators=(",", ":")) + "\n", encoding="utf-8")


def _first_number_path(value, path=()):
    """The path to the first int or float (not bool) inside ``value``, depth first."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _first_number_path(item, (*path, key))
        if found is not None:
            return found
    return None


def _set(value, path, new):
    for key in path[:-1]:
        value = value[key]
    value[path[-1]] = new


def _get(value, path):
    for key in path:
        value = value[key]
    return value


def _changed(number):
    return number + 1 if isinstance(number, int) else number * 1.5 + 1.0


def _tables(run_dir: Path) -> dict:
    results = _json(run_dir / "results.json")
    return {k: v for k, v in results.items() if k not in RUN_FIELDS}


def _row_table(run_dir: Path) -> str | None:
    """The first table that is a list of row objects with at least one number."""
    for name, value in _tables(run_dir).items():
        if isinstance(value, list) and value and all(isinstance(r, dict) and r for r in value) \
                and _first_number_path(value) is not None:
            return name
    return None


def _capture(run_dir: Path) -> Path | None:
    """The capture with the most lines (a group record file), stored plain or as xz."""
    raw = sorted((run_dir / "raw").glob("*.jsonl*"))
    best, lines = None, 0
    for path in raw:
        n = len(_read_capture(path).splitlines())
        if n > lines:
            best, lines = path, n
    return best if lines >= 2 else None


def _read_capture(path: Path) -> str:
    opener = lzma.open if path.name.endswith(COMPRESSED) else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read()


def _write_capture(path: Path, text: str) -> None:
    if path.name.endswith(COMPRESSED):
        with lzma.open(path, "wt", encoding="utf-8", preset=0) as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")


def _edit_capture(run_dir: Path, change: Callable[[list[str]], list[str]]) -> bool:
    path = _capture(run_dir)
    if path is None:
        return False
    lines = _read_capture(path).splitlines()
    _write_capture(path, "\n".join(change(lines)) + "\n")
    return True


# ---- the edits: each changes one thing and says False when the run has nothing of that kind ----

def public_headline(d: Path) -> bool:
    path = d / "public-results.json"
    doc = _json(path)
    if not doc.get("headline"):
        return False
    key = next(iter(doc["headline"]))
    doc["headline"][key] = doc["headline"][key] + " (edited)"
    _write_json(path, doc)
    return True


def public_counts(d: Path) -> bool:
    path = d / "public-results.json"
    doc = _json(path)
    doc["check_counts"]["ok"] += 1
    _write_json(path, doc)
    return True


def public_capture_hash(d: Path) -> bool:
    path = d / "public-results.json"
    doc = _json(path)
    if not doc.get("capture_hashes"):
        return False
    name = next(iter(doc["capture_hashes"]))
    doc["capture_hashes"][name] = "0" * 64
    _write_json(path, doc)
    return True


def env_device(d: Path) -> bool:
    path = d / "env.json"
    env = _json(path)
    env["device"] = "NVIDIA B200 (edited)"
    _write_json(path, env)
    return True


def params_value(d: Path) -> bool:
    path = d / "params.resolved.yaml"
    params = yaml.safe_load(path.read_text())
    for key, value in sorted(params.items()):
        if isinstance(value, int) and not isinstance(value, bool) and key != "SEED":
            params[key] = value * 2 + 1
            path.write_text(yaml.safe_dump(params, sort_keys=True))
            return True
    return False


def table_figure(d: Path) -> bool:
    path = d / "results.json"
    results = _json(path)
    for name, value in _tables(d).items():
        where = _first_number_path(value)
        if where is not None:
            _set(results[name], where, _changed(_get(value, where)))
            _write_json(path, results)
            return True
    return False


def dropped_column(d: Path) -> bool:
    name = _row_table(d)
    if name is None:
        return False
    path = d / "results.json"
    results = _json(path)
    column = next(iter(results[name][0]))
    for row in results[name]:
        row.pop(column, None)
    _write_json(path, results)
    return True


def emptied_table(d: Path) -> bool:
    name = _row_table(d)
    if name is None:
        return False
    path = d / "results.json"
    results = _json(path)
    results[name] = []
    _write_json(path, results)
    return True


def undeclared_key(d: Path) -> bool:
    path = d / "results.json"
    results = _json(path)
    results["speedup"] = 2.0
    _write_json(path, results)
    return True


def check_counts(d: Path) -> bool:
    path = d / "results.json"
    results = _json(path)
    results["check_counts"]["failed"] = results["check_counts"].get("failed", 0) + 3
    _write_json(path, results)
    return True


def check_status(d: Path) -> bool:
    path = d / "results.json"
    results = _json(path)
    name = next(iter(results["checks"]))
    rec = results["checks"][name]
    rec["status"] = "failed" if rec.get("status") == "ok" else "ok"
    rec["ok"] = rec["status"] == "ok"
    _write_json(path, results)
    return True


def raw_line_deleted(d: Path) -> bool:
    return _edit_capture(d, lambda lines: lines[:-1])


def raw_line_duplicated(d: Path) -> bool:
    return _edit_capture(d, lambda lines: [*lines, lines[-1]])


def raw_line_moved(d: Path) -> bool:
    return _edit_capture(d, lambda lines: [*lines[1:], lines[0]])


def raw_field_no_table_reads(d: Path) -> bool:
    """A number deep in one record (a group's makespan, a timestamp) changed without touching any table."""
    def change(lines):
        for i, line in enumerate(lines):
            record = json.loads(line)
            where = _first_number_path(record)
            if where is not None:
                _set(record, where, _changed(_get(record, where)))
                lines[i] = json.dumps(record)
                return lines
        return lines
    return _edit_capture(d, change)


def _first_record(lines: list[str]) -> int:
    """The index of the capture's first record (after its schema header, where it has one)."""
    return 1 if lines and is_header(json.loads(lines[0])) else 0


def raw_field_renamed(d: Path) -> bool:
    """One record's first field under another name (the class declares the old one, and forbids the new)."""
    def change(lines):
        i = _first_record(lines)
        record = json.loads(lines[i])
        key = next(iter(record))
        lines[i] = json.dumps({(f"{key}_renamed" if k == key else k): v for k, v in record.items()})
        return lines
    return _edit_capture(d, change)


def raw_field_wrong_type(d: Path) -> bool:
    """One record's first top-level number written as a string."""
    def change(lines):
        for i in range(_first_record(lines), len(lines)):
            record = json.loads(lines[i])
            key = next((k for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)), None)
            if key is not None:
                record[key] = str(record[key])
                lines[i] = json.dumps(record)
                return lines
        return lines
    return _edit_capture(d, change)


def raw_schema_version_unknown(d: Path) -> bool:
    """The capture's header says a schema version this code does not know."""
    path = _capture(d)
    if path is None:
        return False
    cls = RunFiles(d).capture_class(path.name.removesuffix(COMPRESSED))
    header = {"schema": cls.SCHEMA if cls is not None else "unknown", "version": 99}
    return _edit_capture(d, lambda lines: [json.dumps(header), *lines[_first_record(lines):]])


EDITS = [public_headline, public_counts, public_capture_hash, env_device, params_value, table_figure,
         dropped_column, emptied_table, undeclared_key, check_counts, check_status, raw_line_deleted,
         raw_line_duplicated, raw_line_moved, raw_field_no_table_reads, raw_field_renamed, raw_field_wrong_type,
         raw_schema_version_unknown]


def _problems(section, run_dir: Path, first_problem: bool = False) -> tuple[bool, set[str]]:
    try:
        verdict = verify(section, RunFiles(run_dir), first_problem=first_problem)
    except Exception as e:  # noqa: BLE001 - a damaged file named by verify (RunFileError) is a caught edit
        return False, {f"raised {type(e).__name__}: {e}"}
    return verdict.ok, {line.text() for line in verdict.problems}


@pytest.mark.parametrize("run_dir", PUBLISHED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_single_edit_to_a_published_run_fails_verify(run_dir, tmp_path):
    section = registry.get(run_dir.parent.name)
    clean = tmp_path / "clean" / run_dir.parent.name / run_dir.name
    shutil.copytree(run_dir, clean)
    # the untouched copy, verified in full as on a fresh clone: every check recomputed from raw/, no recorded
    # ok that no longer holds, and the verdict the public file (and so the index and README) shows
    verdict = verify(section, RunFiles(clean))
    ok, baseline = verdict.ok, {line.text() for line in verdict.problems}
    public = _json(run_dir / "public-results.json")
    assert not [line.text() for line in verdict.lines if line.kind in ("mismatch", "missing")]
    assert (verdict.ok, verdict.status) == (public["verified"], public["status"]), baseline
    assert verdict.ok or (public["allowed_failed"] and public["failure_note"]), baseline
    assert ok == (public["status"] == "passed" and not public["allowed_failed"]), baseline
    missed, tried = [], 0
    for edit in EDITS:
        copy = tmp_path / edit.__name__ / run_dir.parent.name / run_dir.name
        shutil.copytree(run_dir, copy)
        if not edit(copy):
            continue
        tried += 1
        edited_ok, problems = _problems(section, copy, first_problem=True)
        if edited_ok or not (problems - baseline):
            missed.append(edit.__name__)
        shutil.rmtree(copy.parent.parent)
    assert tried >= 10, f"only {tried} kinds of edit apply to this run"
    assert not missed, f"verify let these single edits through: {missed}"


def test_a_full_verify_of_an_edited_capture_also_recomputes_what_changed(tmp_path):
    """Without ``first_problem`` an edited capture is not only a hash mismatch: the checks and tables recomputed
    from it say what the edit changed."""
    run_dir = next(p for p in PUBLISHED if p.parent.name == "retention")
    section = registry.get("retention")
    copy = tmp_path / run_dir.parent.name / run_dir.name
    shutil.copytree(run_dir, copy)
    assert raw_line_deleted(copy)
    gate = verify(section, RunFiles(copy), first_problem=True)
    full = verify(section, RunFiles(copy))
    assert [r.name for r in gate.problems] == ["file hashes recorded when the run finished (captures, params, env)"]
    assert len(full.problems) > 1 and any(r.name.startswith("file hashes") for r in full.problems)
