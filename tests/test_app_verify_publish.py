"""``kmesh verify`` recomputes and compares; ``kmesh publish`` lets only allow-listed fields out.

Runs here are made in-process by section 99 (``tests/fake_section.py``): five raw items and their
total, whose checks recompute the total from ``raw/`` and compare it with ``results.json``.
"""
import json
import os
import shutil
from pathlib import Path

import fake_section
import pytest

from kmesh_lib.app import cli, published, registry
from kmesh_lib.base import paths, records
from kmesh_lib.base.public import PublicContentError, validate_public

SECRET = "SECRET-hunter2-do-not-publish"
TOKEN_IDS = list(range(151600, 152100))  # 500 token ids


@pytest.fixture
def section(monkeypatch, tmp_path):
    module = fake_section.install(monkeypatch, tmp_path)
    (tmp_path / "published").mkdir()
    (tmp_path / "README.md").write_text(f"# readme\n\n{published.README_BEGIN}\nold table\n{published.README_END}\n")
    return module


def verify(run_dir: Path, capsys) -> tuple[int, list[str], str]:
    code = cli.main(["verify", "99", run_dir.name])
    captured = capsys.readouterr()
    return code, captured.out.strip().splitlines(), captured.err.strip()


def test_verify_passes_a_run_whose_record_matches_its_files(section, capsys):
    run_dir = fake_section.make_run()
    code, out, _ = verify(run_dir, capsys)
    assert code == 0
    assert out[:2] == ["ok       every item recorded", "ok       the recorded total equals the raw items' sum"]
    assert out[-1].startswith("verified: 2 ok, 0 failed, 0 skipped, 0 recorded/recomputed mismatches")


def test_verify_fails_an_edited_raw_line(section, capsys):
    run_dir = fake_section.make_run()
    raw = run_dir / "raw" / "items.jsonl"
    lines = raw.read_text().splitlines()
    lines[2] = json.dumps({"i": 2, "value": 5})  # was 4
    raw.write_text("\n".join(lines) + "\n")
    code, out, _ = verify(run_dir, capsys)
    assert code == 1
    assert "MISMATCH the recorded total equals the raw items' sum (recorded ok, recomputed failed; " \
           "recorded 30, raw 31)" in out


def test_verify_fails_an_edited_results_figure(section, capsys):
    run_dir = fake_section.make_run()
    results = json.loads((run_dir / "results.json").read_text())
    results["total"] = 3000
    (run_dir / "results.json").write_text(json.dumps(results))
    code, out, _ = verify(run_dir, capsys)
    assert code == 1 and any(line.startswith("MISMATCH") and "recorded 3000, raw 30" in line for line in out)


def test_verify_fails_a_run_that_did_not_finish(section, capsys):
    run_dir = fake_section.make_run(finish=False)
    code, out, _ = verify(run_dir, capsys)
    assert code == 1 and "status running: the run did not finish" in out[-1]


def test_verify_reports_a_recorded_ok_that_is_no_longer_computed(section, capsys, monkeypatch):
    run_dir = fake_section.make_run()
    all_checks = fake_section.checks
    monkeypatch.setattr(fake_section, "checks", lambda run: all_checks(run)[1:])
    code, out, _ = verify(run_dir, capsys)
    assert code == 1 and "MISSING  every item recorded (recorded ok, recomputed nothing)" in out


def test_a_check_that_needs_data_this_machine_lacks_is_not_a_mismatch(section, capsys, monkeypatch):
    from kmesh_lib.base.checks import Check

    all_checks = fake_section.checks
    monkeypatch.setattr(fake_section, "checks", lambda run: [*all_checks(run), Check("the corpus re-hashes", "ok")])
    run_dir = fake_section.make_run()  # recorded ok where the corpus was
    absent = Check("the corpus re-hashes", "skipped", "the corpus is not on this machine", outside_input="the corpus")
    monkeypatch.setattr(fake_section, "checks", lambda run: [*all_checks(run), absent])
    code, out, _ = verify(run_dir, capsys)
    assert code == 0 and "n/a here the corpus re-hashes (recorded ok, recomputed skipped; needs the corpus, " \
        "not on this machine)" in out
    assert "1 recorded ok, not recomputable here" in out[-1]
    bare = Check("the corpus re-hashes", "skipped", "raw/ lost the rows")  # skipped for want of the run's own files
    monkeypatch.setattr(fake_section, "checks", lambda run: [*all_checks(run), bare])
    code, out, _ = verify(run_dir, capsys)
    assert code == 1 and any(line.startswith("MISMATCH the corpus re-hashes") for line in out)
    with pytest.raises(ValueError, match="outside_input names why a check is skipped"):
        Check("x", "ok", outside_input="the corpus")


def test_a_later_check_the_run_predates_is_left_out_not_unrecorded(section, capsys, monkeypatch):
    """A check a later version of the section states, skipped because the run predates its evidence (``predates``),
    is left out of the verdict of a passed run that never recorded it, and named in the summary; skipped without that
    reason, the same unrecorded check is a mismatch of a passed run's record."""
    from kmesh_lib.base.checks import Check

    run_dir = fake_section.make_run()
    all_checks = fake_section.checks
    later = Check("the pairs were measured", "skipped", "this run predates the pairs", predates="this run predates the pairs")
    monkeypatch.setattr(fake_section, "checks", lambda run: [*all_checks(run), later])
    code, out, _ = verify(run_dir, capsys)
    assert code == 0 and out[-1].startswith("verified: 2 ok, 0 failed, 0 skipped")
    assert "1 later check(s) this run predates, left out (skipped: this run predates the pairs)" in out[-1]
    bare = Check("the pairs were measured", "skipped", "no pairs")
    monkeypatch.setattr(fake_section, "checks", lambda run: [*all_checks(run), bare])
    code, out, _ = verify(run_dir, capsys)
    assert code == 1 and any(line.startswith("UNRECORDED") for line in out)
    with pytest.raises(ValueError, match="predates names why a check is skipped"):
        Check("x", "ok", predates="a later capture")


def test_a_notebook_that_stopped_before_its_checks_is_recorded_by_kmesh_run_else_verify_names_the_cell(section, capsys):
    """A notebook that raised in a display cell (section 21's floor plot of a run with no restore path, 060001-01f9)
    never reached its checks cell: results.json had no checks, counts or hashes, and verify said only "records no
    capture_sha256". Verify names the cell that stopped it; ``kmesh run`` records the checks from the run's files,
    their counts and the hashes (the status stays failed with its error), and the record then holds."""
    run_dir = fake_section.make_run(finish=False)
    error = {"kind": "cell error", "cell": 8, "ename": "ValueError", "evalue": "Number of columns must be a positive "
             "integer, not 0"}
    records.end_run(run_dir, section.KEY, "failed", error)
    code, out, _ = verify(run_dir, capsys)
    assert code == 1
    stopped = ("the notebook stopped at cell 8 (ValueError: Number of columns must be a positive integer, not 0) before "
               "its checks cell recorded them (RunRecord.finish), and nothing recorded them since")
    assert f"MISMATCH file hashes recorded when the run finished (results.json records no capture_sha256: {stopped})" in out
    assert any(line.startswith("MISMATCH check_counts") and stopped in line for line in out)

    cli.record_stopped_run(section, run_dir)
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "failed" and results["error"] == error and "finished_utc" not in results
    assert results["check_counts"] == {"ok": 2, "failed": 0, "skipped": 0} and results["capture_sha256"]
    code, out, _ = verify(run_dir, capsys)
    assert not [line for line in out if line.startswith(("MISMATCH", "UNRECORDED"))], out
    assert out[-1].startswith("verified: 2 ok, 0 failed, 0 skipped, 0 recorded/recomputed mismatches")


def damage(run_dir: Path, kind: str) -> str:
    """Damages ``run_dir`` one way; returns the file name the one-line error must name."""
    results, raw = run_dir / "results.json", run_dir / "raw" / "items.jsonl"
    if kind == "results missing":
        results.unlink()
    elif kind == "results truncated":
        results.write_text(results.read_text()[:40])
    elif kind == "results empty":
        results.write_text("")
    elif kind == "results not an object":
        results.write_text("[1, 2, 3]")
    elif kind == "results not utf-8":
        results.write_bytes(b'{"status": "passed", "x": "\xff\xfe"}')
    elif kind == "raw line truncated":
        raw.write_text(raw.read_text()[:-9])
    elif kind == "raw not utf-8":
        raw.write_bytes(raw.read_bytes() + b'{"i": 9, "value": "\xff"}\n')
    elif kind == "params not yaml":
        (run_dir / "params.resolved.yaml").write_text("RUN_DIR: [unclosed\n")
    elif kind == "params a fifo":  # a read that would block for ever
        (run_dir / "params.resolved.yaml").unlink()
        os.mkfifo(run_dir / "params.resolved.yaml")
    elif kind == "results nested too deep":  # json's recursion limit, not a JSON error
        results.write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    elif kind == "raw nested too deep":
        raw.write_text(raw.read_text() + "[" * 100_000 + "]" * 100_000 + "\n")
    return {"raw": "items.jsonl", "params": "params.resolved.yaml"}.get(kind.split()[0], "results.json")


DAMAGE = ["results missing", "results truncated", "results empty", "results not an object", "results not utf-8",
          "raw line truncated", "raw not utf-8", "params not yaml", "params a fifo", "results nested too deep",
          "raw nested too deep"]


@pytest.mark.parametrize("kind", DAMAGE)
@pytest.mark.parametrize("command", ["verify", "publish", "report"])  # report rendered a damaged run, exit 0, unsaid
def test_a_damaged_run_folder_gives_one_line_naming_the_file(section, capsys, kind, command):
    run_dir = fake_section.make_run()
    name = damage(run_dir, kind)
    code = cli.main([command, "99", run_dir.name])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == "" and "Traceback" not in captured.err
    (line,) = captured.err.strip().splitlines()
    assert line.startswith(f"kmesh {command}: ") and name in line


@pytest.mark.parametrize("kind, where", [("raw not utf-8", "is not UTF-8 text"),
                                         ("raw nested too deep", "is not valid JSON (nested deeper")])
def test_a_damaged_capture_line_is_named_by_its_number(section, capsys, kind, where):
    """A bad byte or a record nested past json's recursion limit is named with its line (the bad byte was named
    only as 'not UTF-8 text' somewhere in the file; the deep record was a RecursionError traceback)."""
    run_dir = fake_section.make_run()
    damage(run_dir, kind)
    last = len((run_dir / "raw" / "items.jsonl").read_bytes().splitlines())
    assert cli.main(["verify", "99", run_dir.name]) == 2
    assert f"items.jsonl: line {last} {where}" in capsys.readouterr().err


def test_latest_is_the_newest_run_id_not_the_newest_file(section, capsys, monkeypatch):
    ids = iter(["smoke-20261201-120000-ffff", "cpu-20261201-130000-0000", "smoke-20261201-120500-0000"])
    monkeypatch.setattr(records, "new_run_id", lambda profile: next(ids))
    runs = [fake_section.make_run() for _ in range(3)]
    (runs[0] / "results.json").touch()  # the oldest run's files are now the newest
    assert cli.main(["verify", "99", "--latest"]) == 0
    assert "fake_section cpu-20261201-130000-0000 (local" in capsys.readouterr().out.splitlines()[-1]
    assert cli.main(["verify", "99", "--latest", "--profile", "smoke"]) == 0
    assert "fake_section smoke-20261201-120500-0000 (local" in capsys.readouterr().out.splitlines()[-1]


def test_verify_needs_a_run_named(section, capsys):
    fake_section.make_run()
    assert cli.main(["verify", "99"]) == 2
    assert "name one run of fake_section: RUN_ID, --latest or --run-dir (latest: smoke-" in capsys.readouterr().err


def publish(run_dir: Path, capsys, *extra) -> tuple[int, str, str]:
    """``kmesh publish`` of a fake run, which is a smoke-profile run: with ``--allow-smoke``."""
    code = cli.main(["publish", "99", run_dir.name, "--allow-smoke", *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_smoke_profile_run_is_published_only_when_asked(section, capsys, tmp_path):
    run_dir = fake_section.make_run()  # PROFILE smoke
    assert cli.main(["publish", "99", run_dir.name]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"kmesh publish: run {run_dir.name} is a smoke-profile run (a tiny model that tests the pipeline, "
                   "not a measurement); --allow-smoke publishes it anyway")
    assert not (tmp_path / "published" / "fake_section").exists()
    assert "old table" in (tmp_path / "README.md").read_text()  # the README table untouched
    assert publish(run_dir, capsys)[0] == 0


def test_publish_copies_a_verified_run_with_relative_paths_and_an_allow_listed_public_file(section, capsys, tmp_path):
    run_dir = fake_section.make_run()
    code, out, err = publish(run_dir, capsys)
    assert code == 0, err
    dest = tmp_path / "published" / "fake_section" / run_dir.name
    assert out.startswith(f"published fake_section {run_dir.name} -> {dest}")
    assert not (dest / "logs").exists() and (dest / "raw" / "items.jsonl.xz").exists()
    assert not (dest / "raw" / "items.jsonl").exists()  # the published format stores captures xz-compressed
    for path in dest.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".yaml", ".ipynb", ".html"):
            assert str(tmp_path) not in path.read_text(), path  # relative paths only
    assert "RUN_DIR: published/fake_section/" in (dest / "params.resolved.yaml").read_text()
    public = json.loads((dest / "public-results.json").read_text())
    assert set(public) == {"schema", "section", "number", "title", "uses_engine", "run_id", "status", "verified",
                           "allowed_failed",
                           "failure_note", "migrated", "published_format", "check_counts", "checks", "environment",
                           "params", "input_hashes", "capture_hashes", "capture_hash_of", "shared_captures",
                           "captures_with_paths_rewritten",
                           "headline", "verdict", "counts", "results", "report"}
    assert (public["status"], public["verified"], public["allowed_failed"]) == ("passed", True, False)
    assert public["capture_hashes"]["items.jsonl"] == records.sha256_file(run_dir / "raw" / "items.jsonl")
    assert public["results"] == {"total": 30, "num_items": 5} and public["headline"]["total"] == "30 units"
    assert "host" not in public["environment"] and set(public["params"]) == {"SEED", "PROFILE"}
    assert cli.main(["verify", "99", run_dir.name, "--run-dir", str(dest)]) == 2  # one selector at a time
    capsys.readouterr()
    assert cli.main(["verify", "99", "--run-dir", str(dest)]) == 0  # the published copy verifies


def test_publish_refuses_what_did_not_pass_unless_allowed_and_marks_it(section, capsys, tmp_path):
    unfinished = fake_section.make_run(finish=False)
    code, _, err = publish(unfinished, capsys)
    assert code == 1 and "status running" in err and "--allow-failed" in err
    assert not (tmp_path / "published" / "fake_section").exists()
    failing = fake_section.make_run(total=31)  # its own check fails: recorded 31, raw 30
    assert publish(failing, capsys)[0] == 1
    code, _, err = publish(failing, capsys, "--allow-failed")
    assert code == 1 and "--allow-failed needs --why" in err  # a failed run goes out with its reason or not at all
    why = "The total was typed in by hand as 31."
    code, out, _ = publish(failing, capsys, "--allow-failed", "--why", why)
    assert code == 0 and "marked: published with --allow-failed" in out
    dest = tmp_path / "published" / "fake_section" / failing.name
    public = json.loads((dest / "public-results.json").read_text())
    assert (public["status"], public["verified"], public["allowed_failed"]) == ("failed", False, True)
    assert public["failure_note"] == why
    index = (tmp_path / "published" / "index.html").read_text()
    assert f"published with --allow-failed: {why}" in index and '<span class="banner failed">FAILED</span>' in index
    assert f"| failed (published with --allow-failed: {why}) |" in (tmp_path / "README.md").read_text()
    report = (dest / "report.html").read_text()
    assert '<span class="banner failed">FAIL</span>' in report and f"Published with --allow-failed: {why}" in report
    assert '<link rel="stylesheet" href="../../report.css">' in report and "<style>" not in report
    assert (tmp_path / "published" / "report.css").is_file()  # written with the index
    assert cli.main(["report", "99", "--run-dir", str(dest)]) == 0  # rendered again in place: still linked
    assert '<link rel="stylesheet" href="../../report.css">' in (dest / "report.html").read_text()


def test_publish_refuses_twice_and_a_symlink(section, capsys, tmp_path):
    run_dir = fake_section.make_run()
    assert publish(run_dir, capsys)[0] == 0
    code, _, err = publish(run_dir, capsys)
    assert code == 1 and "already published; --replace" in err
    assert publish(run_dir, capsys, "--replace")[0] == 0
    other = fake_section.make_run()
    (other / "rootlink").symlink_to("/")
    code, _, err = publish(other, capsys)
    assert code == 1 and "a symlink" in err


def test_publish_refuses_a_raw_capture_another_published_run_holds(section, capsys, tmp_path):
    first = fake_section.make_run()
    assert publish(first, capsys)[0] == 0
    copy = fake_section.make_run()  # the same items: byte-identical raw/items.jsonl, its only capture
    code, _, err = publish(copy, capsys)
    assert code == 1 and "byte-identical" in err and first.name in err


def test_a_capture_shared_in_part_is_published_and_named(section, capsys, tmp_path):
    first = fake_section.make_run()
    assert publish(first, capsys)[0] == 0
    second = fake_section.make_run()  # items.jsonl equal to the first run's, but a capture of its own too
    fake_section.write_raw(second, "extra.jsonl", '{"own": 1}\n')
    code, out, err = publish(second, capsys)
    assert code == 0, err
    public = json.loads((tmp_path / "published" / "fake_section" / second.name / "public-results.json").read_text())
    assert public["shared_captures"] == {"items.jsonl": f"fake_section/{first.name}"}
    assert f"raw/items.jsonl: the same content as fake_section/{first.name}'s" in out


def test_the_published_format_reads_back_and_verify_catches_an_edited_compressed_line(section, capsys, tmp_path):
    import lzma

    run_dir = fake_section.make_run()
    assert publish(run_dir, capsys)[0] == 0
    dest = tmp_path / "published" / "fake_section" / run_dir.name
    run = records.RunFiles(dest)
    assert run.raw_names() == ["items.jsonl"] and run.raw("items.jsonl") == records.RunFiles(run_dir).raw("items.jsonl")
    packed = dest / "raw" / "items.jsonl.xz"
    first = packed.read_bytes()
    assert publish(run_dir, capsys, "--replace")[0] == 0 and packed.read_bytes() == first  # the same bytes again
    lines = lzma.decompress(packed.read_bytes()).decode().splitlines()
    lines[2] = json.dumps({"i": 2, "value": 5})
    packed.write_bytes(lzma.compress(("\n".join(lines) + "\n").encode()))
    assert cli.main(["verify", "99", "--run-dir", str(dest)]) == 1
    assert "recorded 30, raw 31" in capsys.readouterr().out
    packed.write_bytes(packed.read_bytes()[:-12])  # truncated
    assert cli.main(["verify", "99", "--run-dir", str(dest)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "items.jsonl.xz: not a readable xz file" in line
    (dest / "raw" / "items.jsonl").write_text("{}\n")
    with pytest.raises(records.RunFileError, match="stored twice"):
        records.RunFiles(dest).raw("items.jsonl")


PNG_1PX = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")


def test_publish_keeps_each_figure_once_and_no_log(section, capsys, tmp_path):
    import base64
    import hashlib

    import nbformat

    run_dir = fake_section.make_run()
    nb_path = run_dir / section.NOTEBOOK
    nb = nbformat.read(str(nb_path), as_version=4)
    cell = nbformat.v4.new_code_cell('fig.savefig(record.figure_path("total.png"), dpi=80)', execution_count=2)
    cell.outputs = [nbformat.v4.new_output("display_data", data={"image/png": PNG_1PX, "text/plain": "<Figure>"},
                                           metadata={"image/png": {"width": 1}})]
    nb.cells.append(cell)
    nbformat.write(nb, str(nb_path))
    (run_dir / "total.png").write_bytes(b"\x89PNG the same figure saved at another dpi")
    extra = nbformat.v4.new_code_cell("plt.show()", execution_count=3)  # displayed, never saved
    extra.outputs = [nbformat.v4.new_output("display_data", data={"image/png": PNG_1PX, "text/plain": "<Figure>"})]
    nb.cells.append(extra)
    table = nbformat.v4.new_code_cell("df", execution_count=4)  # a DataFrame: an HTML table and its text copy
    table.outputs = [nbformat.v4.new_output("execute_result", execution_count=4, data={
        "text/html": "<table><tr><th>arm</th></tr><tr><td>early 41.4</td></tr></table>", "text/plain": "arm\nearly 41.4"})]
    nb.cells.append(table)
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {"m1": {}, "m2": {}}}}
    nbformat.write(nb, str(nb_path))
    (run_dir / "blocks.log").write_text("INFO engine noise\n")
    fake_section.write_raw(run_dir, "child-tiny.log", "INFO engine noise\n")
    (run_dir / "lead-mp-N4.json").write_text("{}")
    fake_section.write_raw(run_dir, "params_for_children.yaml", (run_dir / "params.resolved.yaml").read_text())
    code, out, err = publish(run_dir, capsys)
    assert code == 0, err
    dest = tmp_path / "published" / "fake_section" / run_dir.name
    saved = b"\x89PNG the same figure saved at another dpi"
    assert (dest / "figures" / "total.png").read_bytes() == saved  # once: the PNG the cell saved
    assert not (dest / "total.png").exists() and "figure: total.png (cell 2 displayed this figure; kept once" in out
    for name in ("blocks.log", "raw/child-tiny.log", "lead-mp-N4.json", "raw/params_for_children.yaml"):
        assert not (dest / name).exists() and f"left out: {name} (" in out
    published_nb = nbformat.read(str(dest / section.NOTEBOOK), as_version=4)
    assert "widgets" not in published_nb.metadata
    assert published_nb.metadata["kmesh_published"]["widget_state_dropped"]["models"] == 2
    cells = published_nb.cells
    tabled = cells[-1].outputs[0]  # the table keeps its HTML only; a figure's text stays (no table there)
    assert "text/plain" not in tabled.data and "early 41.4" in tabled.data["text/html"]
    assert published_nb.metadata["kmesh_published"]["table_text_dropped"]["outputs"] == 1
    shown, only = cells[-3].outputs[0], cells[-2].outputs[0]
    assert "image/png" not in shown.data and shown.data["text/plain"] == "<Figure>"
    assert shown.data["text/html"] == '<img src="figures/total.png" alt="figure figures/total.png">'
    displayed = {"sha256": hashlib.sha256(base64.b64decode(PNG_1PX)).hexdigest(), "bytes": 70}
    assert shown.metadata["kmesh_figure"] == {"file": "figures/total.png", "was": "image/png", "displayed": displayed,
                                              "kept": "the PNG this cell saved from the same figure"}
    assert (dest / only.metadata["kmesh_figure"]["file"]).read_bytes() == base64.b64decode(PNG_1PX)
    assert only.metadata["kmesh_figure"]["kept"] == "the displayed bytes"
    report = (dest / "report.html").read_text()
    assert 'src="figures/total.png"' in report and "data:image" not in report and PNG_1PX[:40] not in report
    assert "early 41.4" in report  # the table, from its HTML
    before = {p.relative_to(dest): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    shutil.rmtree(run_dir)  # the local run is gone: the published one is published again in place
    code, _, err = publish(dest, capsys)
    assert code == 0, err
    after = {p.relative_to(dest): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    assert set(after) == set(before)
    assert [k for k in before if after[k] != before[k]] == [], "published again in place, the files change"


def test_publish_makes_machine_paths_relative_and_refuses_one_it_cannot(section, capsys, tmp_path):
    import nbformat

    run_dir = fake_section.make_run(extra_results={"disk_root": "/tmp/kmesh-lmcache/run-1/disk"})
    nb_path = run_dir / section.NOTEBOOK
    nb = nbformat.read(str(nb_path), as_version=4)
    nb.cells[-1].outputs.append(nbformat.v4.new_output(
        "stream", name="stderr", text="/opt/venv/lib/python3.12/site-packages/tqdm/auto.py:21: TqdmWarning\n"))
    gpu_box = "/srv/gpu-box/kmesh/outputs/device/99-gpu"  # where the run was made: only the notebook names it
    nb.metadata["papermill"] = {"parameters": {"RUN_DIR": gpu_box}}
    nb.cells[-1].outputs.append(nbformat.v4.new_output("stream", name="stdout", text=f"run: {gpu_box}\n"))
    nbformat.write(nb, str(nb_path))
    fake_section.write_raw(run_dir, "blocks.jsonl", '{"disk_root": "/tmp/kmesh-lmcache/run-1/disk"}\n')
    fake_section.write_raw(run_dir, "params_copy.yaml", f"RUN_DIR: {run_dir}\n")
    assert publish(run_dir, capsys)[0] == 0
    dest = tmp_path / "published" / "fake_section" / run_dir.name
    assert json.loads((dest / "results.json").read_text())["disk_root"] == "<tmp>/kmesh-lmcache/run-1/disk"
    assert records.RunFiles(dest).raw("blocks.jsonl") == [{"disk_root": "<tmp>/kmesh-lmcache/run-1/disk"}]
    assert (dest / "raw" / "params_copy.yaml").read_text() == f"RUN_DIR: published/fake_section/{run_dir.name}\n"
    public = json.loads((dest / "public-results.json").read_text())
    assert public["captures_with_paths_rewritten"] == ["raw/blocks.jsonl", "raw/params_copy.yaml"]
    assert public["capture_hashes"]["items.jsonl"] == records.sha256_file(run_dir / "raw" / "items.jsonl")
    assert "<site-packages>/tqdm/auto.py:21" in (dest / section.NOTEBOOK).read_text()
    assert f"run: published/fake_section/{run_dir.name}" in (dest / section.NOTEBOOK).read_text()
    other = fake_section.make_run(total=30, extra_results={"model": "/home/someone/models/qwen"})
    fake_section.write_raw(other, "extra.jsonl", '{"own": 2}\n')
    code, _, err = publish(other, capsys)
    assert code == 1 and "an absolute path is left" in err and "/home/someone/models/qwen" in err
    assert not (tmp_path / "published" / "fake_section" / other.name).exists()


def test_withdrawing_a_run_that_is_not_published_is_bad_input(section, capsys, tmp_path):
    """Like verify, report and publish, an unknown run id exits 2 (bad input) with one line naming the section's
    folder it looked in (relative to the checkout where it lies inside): it exited 1, as a refusal does."""
    assert cli.main(["withdraw", "99", "cpu-20990101-000000-0000", "--why", "x"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == ("kmesh withdraw: no published run cpu-20990101-000000-0000 of fake_section under "
                    f"{tmp_path}/published/fake_section")


def test_withdraw_lists_a_run_as_superseded_and_publishing_it_again_takes_it_off(section, capsys, tmp_path):
    old, new = fake_section.make_run(), fake_section.make_run()
    fake_section.write_raw(new, "extra.jsonl", '{"own": 3}\n')
    for run_dir in (old, new):
        assert publish(run_dir, capsys)[0] == 0
    with pytest.raises(SystemExit):  # --why is required (argparse)
        cli.main(["withdraw", "99", old.name])
    capsys.readouterr()
    # bad input (an unknown run id, an empty sentence) exits 2 like an unknown run id to withdraw; it exited 1
    assert cli.main(["withdraw", "99", old.name, "--why", "x", "--superseded-by", "cpu-20990101-000000-0000"]) == 2
    assert "not another published run" in capsys.readouterr().err
    assert cli.main(["withdraw", "99", old.name, "--why", "  "]) == 2
    assert capsys.readouterr().err == "kmesh withdraw: --why: one sentence of 1 to 240 characters\n"
    assert (tmp_path / "published" / "fake_section" / old.name).is_dir()
    why = "Made before the items were counted twice."
    assert cli.main(["withdraw", "99", old.name, "--why", why, "--superseded-by", new.name]) == 0
    capsys.readouterr()
    published_root = tmp_path / "published"
    assert not (published_root / "fake_section" / old.name).exists()
    (entry,) = published.read_withdrawn(published_root)
    assert (entry["run_id"], entry["why"], entry["superseded_by"], entry["status"]) == (old.name, why, new.name, "passed")
    readme, index = (tmp_path / "README.md").read_text(), (published_root / "index.html").read_text()
    # the index lists it with its successor (the why is in withdrawn.json); the README counts it and points there
    assert (f'<td>{old.name}</td><td><a href="fake_section/{new.name}/report.html">{new.name}</a></td>' in index
            and 'href="withdrawn.json"' in index)
    assert old.name not in readme and "Withdrawn runs: 1 (99: 1)" in readme and "published/index.html" in readme
    assert cli.main(["withdraw", "99", old.name, "--why", "Restated.", "--superseded-by", new.name]) == 0
    (entry,) = published.read_withdrawn(published_root)  # an entry restated, not a second one
    assert (entry["why"], entry["status"]) == ("Restated.", "passed")
    (published_root / "fake_section" / new.name).rename(tmp_path / "aside")  # ...so that the old run may come back
    assert publish(old, capsys)[0] == 0 and published.read_withdrawn(published_root) == []


def test_a_run_another_run_reads_as_its_input_is_not_withdrawn(section, capsys, tmp_path):
    """Section 23 prices its restores from section 21's published runs (CROSSOVER_RUNS) and verifying it reads them
    again: withdrawing one took its readers' input away (7 Dec 2026, 442e, put back by hand). Refused (exit 1),
    naming the reader; nothing is removed or listed."""
    read, reader = fake_section.make_run(), fake_section.make_run()
    fake_section.write_raw(reader, "extra.jsonl", '{"own": 4}\n')
    for run_dir in (read, reader):
        assert publish(run_dir, capsys)[0] == 0
    params = tmp_path / "published" / "fake_section" / reader.name / "params.resolved.yaml"
    params.write_text(params.read_text() + f"INPUT_RUNS:\n- published/fake_section/{read.name}\n")
    assert cli.main(["withdraw", "99", read.name, "--why", "Superseded."]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"kmesh withdraw: {read.name} is an input of 1 file(s)") and reader.name in err
    assert (tmp_path / "published" / "fake_section" / read.name).is_dir()
    assert published.read_withdrawn(tmp_path / "published") == []
    assert cli.main(["withdraw", "99", reader.name, "--why", "Superseded."]) == 0  # a run naming itself: no reader


def test_section_23s_inputs_are_found_among_the_published_runs():
    from kmesh_lib.app.publish import named_as_input

    readers = named_as_input(paths.REPO_ROOT / "outputs", "crossover", "gpu-20261201-224722-442e")
    assert "kmesh_lib/sections/production_trace/params.py" in readers
    assert sum(r.startswith("outputs/production_trace/") for r in readers) >= 1
    assert named_as_input(paths.REPO_ROOT / "outputs", "crossover", "gpu-20261207-183057-9c33") == []


def test_planted_secrets_and_token_ids_never_reach_the_public_files(section, capsys, tmp_path, monkeypatch):
    run_dir = fake_section.make_run(extra_results={
        "unexpected": {"token_like": TOKEN_IDS, "note": SECRET, SECRET * 30: 1}, "inputs": {}},
        extra_raw={"other.jsonl": [{"prompt": SECRET, "ids": TOKEN_IDS}]})
    assert publish(run_dir, capsys)[0] == 0
    outputs = tmp_path / "published"
    public_texts = [p.read_text() for p in [*outputs.rglob("public-results.json"), outputs / "index.html",
                                            tmp_path / "README.md"]]
    for text in public_texts:  # results.json and raw/ travel as evidence; the public files hold none of it
        assert SECRET not in text and "151600, 151601" not in text and "151600,151601" not in text


@pytest.mark.parametrize("planted, rule", [
    ({"ids": TOKEN_IDS}, "a list of 500 integers looks like token ids"),
    ({"ids": [float(t) for t in TOKEN_IDS]}, "a list of 500 integers"),
    ({"text": " ".join(map(str, TOKEN_IDS))}, "a string of"),
    ({"note": SECRET * 10}, "a string of 290 characters"),
    ({SECRET * 30: 1}, "a key of 870 characters is not a short label"),
    ({"nested": {"deeper": [{"x": {"y": {"z": {"a": {"b": {"c": {"d": 1}}}}}}}]}}, "nested deeper"),
    ({"bytes": b"raw"}, "a bytes is not publishable"),
    ({"nan": float("nan")}, "not a finite number"),
])
def test_a_sections_public_results_are_rejected_naming_the_path(section, capsys, tmp_path, monkeypatch, planted, rule):
    run_dir = fake_section.make_run()
    monkeypatch.setattr(fake_section, "public_results", lambda run: {"total": 30, **planted})
    code = cli.main(["publish", "99", run_dir.name, "--allow-smoke"])
    err = capsys.readouterr().err
    assert code == 2 and rule in err and err.startswith("kmesh publish: results")
    assert SECRET not in err  # the message names the path, not the content
    assert not (tmp_path / "published" / "fake_section").exists()  # nothing half-published


def test_validate_public_accepts_aggregates():
    validate_public({"N=4": {"saving_ms": 41.4, "ci": [40.0, 42.6], "ready": "200/200", "ok": True, "none": None},
                     "hist": list(range(32))})
    with pytest.raises(PublicContentError, match="hist: a list of 33 integers"):
        validate_public({"hist": list(range(33))}, "hist")


def test_index_and_readme_list_every_published_run(section, capsys, tmp_path):
    runs = [fake_section.make_run() for _ in range(2)]
    items = runs[1] / "raw" / "items.jsonl"  # make the second run's capture its own
    fake_section.write_raw(runs[1], "items.jsonl", items.read_text() + "\n")
    for run_dir in runs:
        assert publish(run_dir, capsys)[0] == 0
    readme = (tmp_path / "README.md").read_text()
    index = (tmp_path / "published" / "index.html").read_text()
    for run_dir in runs:
        assert f"[{run_dir.name}](published/fake_section/{run_dir.name}/report.html)" in readme
        assert f'href="fake_section/{run_dir.name}/report.html"' in index
    assert "| 99 fake section |" in readme and "total: 30 units; items: 5" in readme and "old table" not in readme
    assert cli.main(["index"]) == 0


def test_list_and_compare_show_figures(section, capsys, monkeypatch):
    a = fake_section.make_run()
    b = fake_section.make_run(total=31)
    monkeypatch.setattr(registry, "SECTIONS", {"fake_section": section})
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[1]: line.split() for line in out.splitlines()[1:]}
    assert rows[a.name][:4] == ["99", a.name, "local", "passed"] and rows[b.name][3] == "failed"
    assert "total: 30 units" in out and "total: 31 units" in out
    assert cli.main(["compare", a.name, f"fake_section/{b.name}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split() == ["status", "passed", "failed", "differs"] for line in lines)
    assert any(line.startswith("total") and "+1 units (+3.3%)" in line for line in lines)
    assert any(line.startswith("count total") and "same" in line for line in lines)
    # the short id the listings show names a run where exactly one id ends with it
    assert cli.main(["compare", a.name.rsplit("-", 1)[1], b.name.rsplit("-", 1)[1]]) == 0
    assert f"fake_section/{a.name}" in capsys.readouterr().out


def test_list_has_a_header_aligned_columns_and_filters_and_leaves_live_runs_out(section, capsys, monkeypatch):
    ids = iter(["smoke-20261201-120000-aaaa", "smoke-20261201-120001-bbbb"])
    monkeypatch.setattr(records, "new_run_id", lambda profile: next(ids))
    monkeypatch.setattr(registry, "SECTIONS", {"fake_section": section})
    a, b = fake_section.make_run(), fake_section.make_run(total=31)  # b fails its total check
    live = a.parent / f"{a.name}{records.LIVE_MARK}60ms-N4-20261201-120500"  # as section 20's panel names one
    shutil.copytree(a, live)

    def listed(*args: str) -> list[str]:
        assert cli.main(["list", *args]) == 0
        return capsys.readouterr().out.splitlines()

    lines = listed()
    assert lines[0].split() == ["section", "run", "where", "status", "device", "headline"]
    assert [line.split()[1] for line in lines[1:]] == [a.name, b.name]  # oldest first; the live run left out
    status_at = lines[0].index("status")
    assert [line[status_at:].split()[0] for line in lines] == ["status", "passed", "failed"]  # one column
    assert [line.split()[1] for line in listed("--passed")[1:]] == [a.name]
    assert [line.split()[1] for line in listed("--latest")[1:]] == [b.name]
    assert [line.split()[1] for line in listed("--latest", "--passed")[1:]] == [a.name]
    assert [line.split()[1] for line in listed("--live")[1:]] == [live.name]
    assert listed("--section", "99") == listed("99") == lines
    assert cli.main(["verify", "99", "--latest"]) == 1 and b.name in capsys.readouterr().out  # not the live copy
    from kmesh_lib.app.listing import MIN_HEADLINE_WIDTH

    monkeypatch.setenv("COLUMNS", "300")
    wide = listed()
    # the columns before the headline are as wide as their cells (the device's is the measuring machine's CPU name),
    # so the widths are set from where the headline starts
    at = wide[0].index("headline")
    width = at + MIN_HEADLINE_WIDTH + 4
    monkeypatch.setenv("COLUMNS", str(width))
    narrow = listed()
    assert all(len(line) <= width for line in narrow) and narrow[1].endswith("\u2026"), narrow
    assert len(wide[1]) > width and narrow[1][:-1] == wide[1][:width - 1], (narrow, wide)
    monkeypatch.setenv("COLUMNS", str(at + 2))  # too narrow: the headline keeps its least width, the line runs over
    assert [len(line) - at for line in listed()[1:]] == [MIN_HEADLINE_WIDTH, MIN_HEADLINE_WIDTH]


def test_list_shows_a_run_whose_notebook_has_not_begun_as_starting(section, capsys, monkeypatch):
    """`kmesh list` in the seconds after `kmesh run` made the folder (params.resolved.yaml, no results.json yet)
    said "damaged (results.json: missing)"; a folder with neither file still is."""
    monkeypatch.setattr(registry, "SECTIONS", {"fake_section": section})
    monkeypatch.setenv("COLUMNS", "200")  # the whole line, whatever the terminal (CI's output is a file: 80)
    starting, damaged = fake_section.make_run(), fake_section.make_run(total=31)
    for folder in (starting, damaged):
        for name in ("results.json", "env.json"):
            (folder / name).unlink()
    (damaged / "params.resolved.yaml").unlink()
    assert cli.main(["list"]) == 0
    rows = {line.split()[1]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows[starting.name].split()[3] == "starting" and "no results.json yet" in rows[starting.name]
    assert rows[damaged.name].split()[3] == "damaged"


def test_list_reads_a_published_run_from_its_public_file_without_computing(section, capsys, monkeypatch):
    monkeypatch.setattr(registry, "SECTIONS", {"fake_section": section})
    run_dir = fake_section.make_run()
    assert publish(run_dir, capsys)[0] == 0
    monkeypatch.setattr(section, "headline", lambda run: pytest.fail("a published run's headline was computed"))
    assert cli.main(["list", "--where", "published"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert run_dir.name in line and "passed" in line and "total: 30 units" in line


def test_listing_the_real_published_set_reads_only_public_files(monkeypatch, capsys):
    from kmesh_lib.app import listing

    computed = []
    monkeypatch.setenv("KMESH_PUBLISHED_ROOT", str(paths.OUTPUTS))  # the session points it at a temp dir
    monkeypatch.setattr(listing, "call_section", lambda section, name, run: computed.append((section.KEY, name)))
    assert cli.main(["list", "--where", "published"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert computed == [] and len(lines) == 1 + len([p for p in paths.OUTPUTS.glob("*/*") if p.is_dir()])
    # every run has its figures, none a problem: the headline column never opens with "(problem)" (a headline's
    # own parenthesis, cut by the column's width, may end a line: section 23's "stock vLLM (qw…")
    column = lines[0].index("headline")
    assert all(not line[column:].startswith("(") for line in lines[1:])


def test_list_marks_the_run_that_stands_as_the_index_does(monkeypatch, capsys):
    """`kmesh list` showed every published run as 'published': which one the README's Findings stand on was in the
    README and the index only (section 21's --latest is a failed run, 29e7; its standing run is a47e)."""
    monkeypatch.setenv("KMESH_PUBLISHED_ROOT", str(paths.OUTPUTS))
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["list", "--where", "published"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    marked = {(r[0], r[1]) for r in rows if r[2] == "stands"}
    want = {(d["number"], d["run_id"]) for d in published.standing(published.collect(paths.OUTPUTS)).values()}
    # which run stands moves as runs are published (a47e until 4eef passed, 6 Dec): the listing must agree with the
    # index, mark one run for section 21, and mark only runs that passed
    assert marked == want and any(section == "21" for section, _ in marked), marked
    assert all(r[2] in ("stands", "published") for r in rows)
    assert all(r[3] == "passed" for r in rows if r[2] == "stands"), rows


def test_every_real_section_has_the_whole_interface():
    for section in registry.SECTIONS.values():
        assert registry.missing_interface(section) == [], section.KEY


def test_the_registry_refuses_a_section_that_lacks_part_of_the_interface(monkeypatch):
    import types

    partial = types.ModuleType("partial_section")
    for name in registry.INTERFACE:
        setattr(partial, name, getattr(fake_section, name))
    partial.KEY, partial.NUMBER = "partial_section", "98"
    del partial.answer
    monkeypatch.setitem(registry.SECTIONS, "partial_section", partial)
    with pytest.raises(registry.SectionInterfaceError, match="section partial_section lacks answer"):
        registry.get("98")
    for command in (["run", "98"], ["verify", "98", "--latest"], ["report", "98", "--latest"],
                    ["publish", "98", "--latest"], ["list", "98"]):
        assert cli.main(command) == 2, command
    assert registry.get("98", needs=registry.PLANNING) is partial  # plan reads no run: it needs no answer


def test_the_readme_results_table_is_in_sync_with_outputs():
    entries, withdrawn = published.collect(paths.OUTPUTS), published.read_withdrawn(paths.OUTPUTS)
    readme = (paths.REPO_ROOT / "README.md").read_text()
    begin = readme.index(published.README_BEGIN) + len(published.README_BEGIN) + 1
    assert readme[begin:readme.index(published.README_END)] == published.readme_table(entries, withdrawn=withdrawn)
    assert len(entries) == len([p for p in paths.OUTPUTS.glob("*/*") if p.is_dir()])
    assert (paths.OUTPUTS / "index.html").read_text() == published.index_html(entries, withdrawn)


def test_the_readmes_count_of_passing_runs_that_skip_checks_is_the_published_sets():
    """The Known limits line counts passing published runs that skip a check: a count typed once went stale as runs
    were published and withdrawn (it said 14 of 29 where the set held 12 of 27), so it is held to outputs/."""
    import re

    entries = published.collect(paths.OUTPUTS)
    passing = [d for d in entries if published.stands(d)]
    skipping = [d for d in passing if (d.get("check_counts") or {}).get("skipped")]
    said = re.search(r"\*\*Skipped checks\.\*\* (\d+) of the (\d+) passing published runs skip",
                     (paths.REPO_ROOT / "README.md").read_text())
    assert said, "README's Known limits has no 'Skipped checks' count"
    assert (int(said[1]), int(said[2])) == (len(skipping), len(passing))


# Every published run verifying as its public file says is stated in tests/test_tamper.py, on the untouched
# copy each tamper case starts from (one process builds each run's tables once for both).


def test_every_run_kept_in_the_notes_verifies_as_it_was_recorded():
    """The compact run copies docs/notes cites as evidence (unpublished replications, failed runs kept
    with their cause) stay readable by today's checks: each recomputes from its own raw/ with no
    recorded verdict contradicted, a passed copy verifies and a failed one still fails. Folders of a
    section that no longer exists (the 1 Dec ``restore_paths`` probe) are not runs kmesh can check."""
    from kmesh_lib.app import verify as verify_mod

    known = {section.KEY for section in registry.all_sections()}
    kept = []
    for results_file in sorted((paths.REPO_ROOT / "docs" / "notes").rglob("results.json")):
        folder = results_file.parent
        record = json.loads(results_file.read_text())
        if record.get("section") not in known:
            continue  # not a section's run; a section's copy with raw/ gone is checked, and fails as missing
        kept.append(folder)
        verdict = verify_mod.verify(registry.get(record["section"]), records.RunFiles(folder))
        assert not [line.text() for line in verdict.lines if line.kind in ("mismatch", "missing")], folder
        assert verdict.ok == (record["status"] == "passed"), (folder, verdict.summary())
    assert len(kept) >= 11, kept  # 4 Dec: 4 unpublished, 5 failed, 2 passed native checks


def test_the_published_set_is_compact_and_holds_no_machine_path_or_copy():
    """outputs/ as committed: the published format in every run, no log, no absolute path, no run
    that is a copy of another; under 15 MiB in all (8 MiB until 4 Dec 2026, when section 16's H200 run gained vLLM's
    own tiers' rows and section 20 a run of them: 27 runs, 8.9 MB; 8.3 MiB once results.json and public-results.json
    were compact JSON; 9 MiB until 5 Dec, when section 21's first paired-design H200 run and section 23's GPU parity
    slice made 32 runs, 9.8 MB; 10 MiB until 6 Dec, when section 21's H200 grid at 0.5B and 7B in the paired design
    added three runs, 1.5 MB, and withdrawing the two runs they supersede left 11.1 MB: the 1 Dec runs at 0.5B and 7B
    stay, as section 23's restore costs are read from them; 11 MiB until 6 Dec's H100 rows (LMCache's server at 0.5B and
    7B, the 7B GPU buffer, the 0.5B grid with the swept disk floor: 1.5 MB) left 11.6 MiB after withdrawing 0015 and 29e7;
    12 MiB until 6 Dec, when bbf8 (7B, every tier) left 12.0 MiB and issue 42's migration of section 21's 11 runs (each
    grid cost's interval and verdict, the paired table's count below the copy floor, the floor plots redrawn: 0.2 MB)
    took it past; 13 MiB until 7 Dec, when vLLM's CPU tier's first digested runs (3951, 0.5B at every length; e7c8, 1.5B at
    16k, 128 pairs: 0.5 MB) took it to 13.2 MiB, with 89ce and b43a held until an H200 run at HEAD supersedes them;
    on 7 Dec 9c33, the first, 1.1 MB, left 13.93 MiB with 89ce withdrawn for it and 5750 for 1727, and 442e kept,
    section 23's input; 14 MiB until that evening, when migrating section 21's 12 runs to judge each grid cost against
    the floors timed around its point (two columns a row, the floor plots redrawn, the answers re-rendered: 0.1 MB) took
    it to 14.02 MiB; a run set aside for room is withdrawn, never dropped)."""
    from kmesh_lib.app import compact
    from kmesh_lib.app import publish as publish_mod

    folders = [p for p in paths.OUTPUTS.glob("*/*") if p.is_dir()]
    total = sum(compact.folder_bytes(f) for f in folders)
    assert total < 15 * 1024 * 1024, f"outputs/ holds {total:,} bytes"
    for folder in folders:
        assert not list(folder.glob("raw/*.jsonl")) and not list(folder.rglob("*.log")), folder
        assert not (folder / "logs").exists() and not publish_mod.absolute_paths(folder), folder
        report = (folder / "report.html").read_text()
        assert "data:image" not in report, folder
        for record in ("results.json", published.PUBLIC_FILE):  # compact JSON, as publish writes it
            assert "\n " not in (folder / record).read_text(encoding="utf-8"), folder / record
        # one stylesheet for the set: each report links it rather than carrying its own copy
        assert "<style>" not in report and '<link rel="stylesheet" href="../../report.css">' in report, folder
    from kmesh_lib.app.report import STYLESHEET, report_css
    assert (paths.OUTPUTS / STYLESHEET).read_text() == report_css()
    captures = {}
    for folder in folders:
        run = records.RunFiles(folder)
        mine = {run.raw_sha256(n) for n in run.raw_names("*")}
        for other, theirs in captures.items():
            assert not mine or not mine <= theirs, f"{folder} is a copy of {other}"
        captures[folder] = mine
    by_hash: dict[str, list[Path]] = {}
    for path in sorted(paths.OUTPUTS.rglob("*")):
        if path.is_file():
            by_hash.setdefault(records.sha256_file(path), []).append(path.relative_to(paths.OUTPUTS))
    for same in (group for group in by_hash.values() if len(group) > 1):
        assert len({p.parts[:2] for p in same}) == len(same), f"a run holds one file twice: {same}"
        if all(rel.parts[2] == "figures" for rel in same):
            continue  # two runs drew the same deterministic figure (section 18's replay sweep)
        if all(rel.parts[2:] == ("params.resolved.yaml",) for rel in same):
            continue  # one profile run twice (section 21's 0.5B grid on an H100, 4b9b, and on the H200, 9c33): their
            # captures, checked above, tell a copy
        named = [published.read_public(paths.OUTPUTS / rel.parts[0] / rel.parts[1] / published.PUBLIC_FILE)
                 ["shared_captures"].get(rel.name.removesuffix(".xz")) for rel in same]
        assert all(rel.parts[2] == "raw" for rel in same) and any(named), f"copies, not named as shared: {same}"


def test_figures_are_stored_as_palette_pngs_where_that_saves_a_fifth(tmp_path):
    """A real matplotlib plot shrinks and says so in its output's metadata; a file Pillow cannot read
    and a PNG that would not shrink enough stay as they were; a second pass changes nothing."""
    import base64
    import hashlib

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import nbformat
    from PIL import Image

    from kmesh_lib.app.compact import palette_figures

    (tmp_path / "figures").mkdir()
    fig, ax = plt.subplots(figsize=(6, 4))
    for k in range(5):
        ax.plot(range(50), [((i * (k + 1)) % 17) + k for i in range(50)], label=f"arm {k}", alpha=0.7)
    ax.legend()
    fig.savefig(tmp_path / "figures" / "plot.png", dpi=100)
    plt.close(fig)
    (tmp_path / "figures" / "tiny.png").write_bytes(base64.b64decode(PNG_1PX))
    (tmp_path / "figures" / "fake.png").write_bytes(b"\x89PNG not an image")
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("plot()")
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": '<img src="figures/plot.png">'},
                                           metadata={"kmesh_figure": {"file": "figures/plot.png"}})]
    nb.cells.append(cell)
    nbformat.write(nb, str(tmp_path / "n.ipynb"))
    before = {p.name: p.read_bytes() for p in (tmp_path / "figures").iterdir()}

    saved = palette_figures(tmp_path, "n.ipynb")
    plot = (tmp_path / "figures" / "plot.png").read_bytes()
    assert saved == len(before["plot.png"]) - len(plot) and len(plot) <= 0.8 * len(before["plot.png"])
    with Image.open(tmp_path / "figures" / "plot.png") as im:
        assert im.mode == "P" and im.size == (600, 400)
    for name in ("tiny.png", "fake.png"):
        assert (tmp_path / "figures" / name).read_bytes() == before[name]
    stored = nbformat.read(str(tmp_path / "n.ipynb"), as_version=4).cells[0].outputs[0].metadata["kmesh_figure"]["stored"]
    assert stored["sha256"] == hashlib.sha256(plot).hexdigest() and stored["bytes_before"] == len(before["plot.png"])
    assert palette_figures(tmp_path, "n.ipynb") == 0  # published again: nothing left to shrink


def test_a_published_notebook_is_compact_json_that_reads_back_the_same(tmp_path):
    """``compact_notebook``: the same notebook for ``nbformat`` (cells, outputs, metadata, multi-line sources and
    HTML), fewer bytes, no indentation; a second pass saves nothing; no notebook, nothing done."""
    import nbformat

    from kmesh_lib.app.compact import compact_notebook

    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell("# A title\n\nTwo lines, \u00d7 and \u2265 kept as they are."))
    cell = nbformat.v4.new_code_cell("show(\n    table)", execution_count=1)
    cell.outputs = [nbformat.v4.new_output("execute_result", execution_count=1, data={
        "text/html": "<table>\n<tr><td>1.03\u00d7</td></tr>\n</table>"}),
        nbformat.v4.new_output("stream", name="stderr", text="a warning\nand another\n")]
    nb.cells.append(cell)
    nb.metadata["kmesh_published"] = {"format": "kmesh.published/1"}
    nbformat.write(nb, str(tmp_path / "n.ipynb"))
    before = (tmp_path / "n.ipynb").read_bytes()
    saved = compact_notebook(tmp_path, "n.ipynb")
    after = (tmp_path / "n.ipynb").read_bytes()
    assert saved == len(before) - len(after) > 0 and b"\n " not in after and "\u00d7".encode() in after
    assert nbformat.read(str(tmp_path / "n.ipynb"), as_version=4) == nbformat.reads(before.decode(), as_version=4)
    nbformat.validate(nbformat.read(str(tmp_path / "n.ipynb"), as_version=4))
    assert compact_notebook(tmp_path, "n.ipynb") == 0 and (tmp_path / "n.ipynb").read_bytes() == after
    assert compact_notebook(tmp_path, "missing.ipynb") == 0


def test_a_published_json_record_is_compact_and_reads_back_the_same(tmp_path):
    """``compact_json``: the same value (key order kept, non-ASCII text as it is), fewer bytes, no indentation; a
    second pass saves nothing; no file, nothing done. The record a run writes stays indented."""
    from kmesh_lib.app.compact import compact_json

    value = {"status": "passed", "b": [1, 2.5, None, {"x\u00d7": "\u2265 1.2\u00d7"}], "a": {"nested": [True]}}
    path = tmp_path / "results.json"
    records.write_json_atomic(path, value)
    before = path.read_bytes()
    assert b"\n " in before
    saved = compact_json(path)
    after = path.read_bytes()
    assert saved == len(before) - len(after) > 0 and b"\n " not in after and "\u2265".encode() in after
    assert json.loads(after) == value and list(json.loads(after)) == ["status", "b", "a"]
    assert compact_json(path) == 0 and path.read_bytes() == after
    assert compact_json(tmp_path / "missing.json") == 0
    records.write_json_atomic(tmp_path / "public.json", value, compact=True)
    assert (tmp_path / "public.json").read_bytes() == after


def test_a_raw_params_copy_that_differs_only_in_its_run_dir_is_dropped(tmp_path):
    from kmesh_lib.app.compact import drop_raw_copies

    (tmp_path / "raw").mkdir()
    (tmp_path / "params.resolved.yaml").write_text("A: 1\nB: [2, 3]\nRUN_DIR: outputs/x/run\n")
    (tmp_path / "raw" / "child_params.yaml").write_text("B: [2, 3]\nRUN_DIR: runs/device/21-gpu\nA: 1\n")
    (tmp_path / "raw" / "other_params.yaml").write_text("A: 2\nB: [2, 3]\nRUN_DIR: outputs/x/run\n")
    (tmp_path / "raw" / "rows.jsonl").write_text('{"a": 1}\n')
    assert drop_raw_copies(tmp_path) == ["raw/child_params.yaml (a copy of params.resolved.yaml)"]
    assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == ["other_params.yaml", "rows.jsonl"]


def test_a_withdrawn_runs_successor_is_followed_to_the_published_run():
    """41 of the 69 withdrawn runs named a successor withdrawn since (section 21's chains pass through up to 11), which the
    index showed bare, a run the reader cannot open; it now follows the chain to the published run, linked (a
    published successor is linked too)."""
    entries = [{"section": "s", "run_id": "c", "_path": "s/c", "report": "report.html"}]
    withdrawn = [{"section": "s", "run_id": "a", "superseded_by": "b"}, {"section": "s", "run_id": "b", "superseded_by": "c"},
                 {"section": "s", "run_id": "x", "superseded_by": "y"}, {"section": "s", "run_id": "y", "superseded_by": None},
                 {"section": "s", "run_id": "p", "superseded_by": "q"}, {"section": "s", "run_id": "q", "superseded_by": "p"},
                 {"section": "s", "run_id": "n", "superseded_by": None}]
    published_ = {("s", "c"): entries[0]}
    text = {w["run_id"]: published.successor_text(w, withdrawn, published_) for w in withdrawn}
    link = '<a href="s/c/report.html">c</a>'
    assert text == {"a": f"b (withdrawn; now {link})", "b": link, "x": "y (withdrawn too)", "y": "-",
                    "p": "q (withdrawn too)", "q": "p (withdrawn too)", "n": "-"}


def test_a_published_run_verifies_where_an_outside_input_is_absent(section, capsys, monkeypatch, tmp_path):
    """A published run whose check needs data outside it (section 17's corpus, 23's traces) verified as 'NOT verified:
    ... public-results.json rebuilt from the run (public.check_counts.ok: 8 != 10; ... 'unavailable' != 'ok')' in a
    clone without the data (KMESH_DATA_ROOT=/nonexistent on 17's 0bbb and 23's 4f23); its document is held to what
    it recorded, as its checks are. A check that fails for the run's own files still fails it."""
    from kmesh_lib.base.checks import Check

    all_checks = fake_section.checks
    monkeypatch.setattr(fake_section, "checks", lambda run: [*all_checks(run), Check("the corpus re-hashes", "ok")])
    run_dir = fake_section.make_run()
    assert publish(run_dir, capsys)[0] == 0
    shutil.rmtree(run_dir)  # the published copy is the one verified
    absent = Check("the corpus re-hashes", "skipped", "the corpus is not on this machine", outside_input="the corpus")
    monkeypatch.setattr(fake_section, "checks", lambda run: [*all_checks(run), absent])
    code, out, _ = verify(run_dir, capsys)
    assert code == 0 and "1 recorded ok, not recomputable here" in out[-1] and "(published" in out[-1]
    failing = Check("the corpus re-hashes", "failed", "raw/ lost the rows")
    monkeypatch.setattr(fake_section, "checks", lambda run: [*all_checks(run), failing])
    assert verify(run_dir, capsys)[0] == 1
