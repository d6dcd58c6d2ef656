"""The life of a run folder: ids that cannot collide, honest status, nothing left behind.

The notebook tests execute section 99 (``tests/fake_section.py``: no engine) with papermill through
``kmesh run``; a kernel start costs a few seconds each.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import fake_section
import nbformat
import psutil
import pytest

from kmesh_lib.app import cli
from kmesh_lib.app.execute import Outcome
from kmesh_lib.base import records
from kmesh_lib.base.params import RunParams
from kmesh_lib.base.records import RunFolderInUse, RunRecord, claim_run_dir, new_run_dir, run_id_sort_key

SAME_SECOND = "smoke-20261201-120000"


@pytest.fixture
def section(monkeypatch, tmp_path):
    return fake_section.install(monkeypatch, tmp_path)


def ids_from(monkeypatch, *suffixes):
    """new_run_id gives these ids in turn, all in one second: collisions on purpose."""
    ids = iter(f"{SAME_SECOND}-{s}" for s in suffixes)
    monkeypatch.setattr(records, "new_run_id", lambda profile: next(ids))


def test_run_ids_name_their_second_and_a_random_part():
    run_id = records.new_run_id("smoke")
    assert records.RUN_ID_PATTERN.match(run_id)["suffix"]
    assert len({records.new_run_id("smoke") for _ in range(200)}) > 190  # 4 hex digits: 1 in 65,536


def test_same_second_runs_get_distinct_folders_through_run_record_open(monkeypatch):
    ids_from(monkeypatch, "aaaa", "aaaa", "bbbb")
    first = RunRecord.open("fake_section", RunParams(PROFILE="smoke"))
    second = RunRecord.open("fake_section", RunParams(PROFILE="smoke"))
    assert first.run_dir != second.run_dir
    assert (first.run_dir.name, second.run_dir.name) == (f"{SAME_SECOND}-aaaa", f"{SAME_SECOND}-bbbb")
    first.close()
    second.close()


def test_concurrent_new_run_dirs_never_share_a_folder(monkeypatch, tmp_path):
    """Eight threads ask for a folder at once, every id colliding with another thread's once."""
    lock = threading.Lock()
    calls = []

    def colliding_id(profile):
        with lock:
            calls.append(profile)
            return f"{SAME_SECOND}-{(len(calls) - 1) // 2:04x}"  # each id is handed out twice

    monkeypatch.setattr(records, "new_run_id", colliding_id)
    made: list[Path] = []
    threads = [threading.Thread(target=lambda: made.append(new_run_dir("s", "smoke", tmp_path))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 8 and len(set(made)) == 8
    assert len(calls) > 8  # some threads collided and took the next id


def test_same_second_runs_get_distinct_folders_through_kmesh_run(monkeypatch, section, capsys):
    ids_from(monkeypatch, "cccc", "cccc", "dddd")
    seen = []

    def fake_execute(notebook, out_nb, parameters, *args, **kwargs):
        seen.append(Path(parameters["RUN_DIR"]))
        return Outcome("failed", {"kind": "cell error", "cell": 1, "ename": "E", "evalue": "no engine here"})

    monkeypatch.setattr(cli, "execute", fake_execute)
    assert cli.main(["run", "99", "--profile", "smoke"]) == 1
    assert cli.main(["run", "99", "--profile", "smoke"]) == 1
    assert [p.name for p in seen] == [f"{SAME_SECOND}-cccc", f"{SAME_SECOND}-dddd"]
    for run_dir in seen:  # each records its own failure
        assert json.loads((run_dir / "results.json").read_text())["status"] == "failed"


def test_run_dir_refuses_a_folder_that_holds_a_run(monkeypatch, section, tmp_path, capsys):
    held = tmp_path / "held"
    held.mkdir()
    (held / "results.json").write_text('{"status": "passed"}')
    assert cli.main(["run", "99", "--profile", "smoke", "--run-dir", str(held)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds a run" in err[0]
    assert json.loads((held / "results.json").read_text()) == {"status": "passed"}  # untouched
    empty = tmp_path / "empty"
    empty.mkdir()
    assert claim_run_dir(empty) == empty  # an empty folder is free


@pytest.mark.parametrize("where, message", [
    ("{held}/raw/new", "inside the run folder"),  # was written into the other run's raw/
    ("{tmp}/a/../b", "a folder written to is named without '..'"),  # made {tmp}/a and wrote the run at {tmp}/b
    ("/etc/kmesh-run-probe", "under /etc, a system folder"),  # written into /etc (as root)
    ("/usr/local/kmesh-run-probe", "under /usr, a system folder"),
])
def test_run_dir_refuses_a_folder_a_run_must_not_write(section, tmp_path, capsys, where, message):
    held = tmp_path / "held"
    (held / "raw").mkdir(parents=True)
    (held / "params.resolved.yaml").write_text("SEED: 0\n")
    folder = where.format(held=held, tmp=tmp_path)
    assert cli.main(["run", "99", "--profile", "smoke", "--run-dir", folder]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"kmesh run: --run-dir {folder}: {message}")
    assert not Path(folder).exists() and not (tmp_path / "a").exists() and sorted(held.rglob("*")) == [
        held / "params.resolved.yaml", held / "raw"]


def test_run_record_open_refuses_a_folder_with_a_run_unless_resuming(tmp_path):
    run_dir = tmp_path / "run"
    RunRecord.open("fake_section", RunParams(PROFILE="smoke"), run_dir=str(run_dir)).finish([])
    with pytest.raises(RunFolderInUse, match="already holds a run .status failed"):
        RunRecord.open("fake_section", RunParams(PROFILE="smoke"), run_dir=str(run_dir))
    again = RunRecord.open("fake_section", RunParams(PROFILE="smoke"), run_dir=str(run_dir), resume=True)
    assert again.results["status"] == "running"
    again.close()


def test_run_ids_sort_by_the_time_they_name():
    ids = ["gpu-20261129-214531-device", "cpu-20261201-000000-ffff", "smoke-20261130-235959-0000",
           "cpu-20261129-200122"]
    assert sorted(ids, key=run_id_sort_key) == ["cpu-20261129-200122", "gpu-20261129-214531-device",
                                                "smoke-20261130-235959-0000", "cpu-20261201-000000-ffff"]


def results_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def only_run(root: Path) -> Path:
    (run_dir,) = list((root / "fake_section").iterdir())
    return run_dir


def cell_text(nb_path: Path) -> str:
    nb = nbformat.read(str(nb_path), as_version=4)
    return json.dumps([c.get("outputs", []) for c in nb.cells])


@pytest.mark.notebooks
def test_a_passing_run_keeps_engine_logs_and_progress_bars_out_of_its_cells(section, tmp_path, monkeypatch, capsys):
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where jupyter_client's default would go
    assert cli.main(["run", "99", "--profile", "smoke", "--log-output"]) == 0
    out = capsys.readouterr().out
    run_dir = only_run(tmp_path / "runs")
    assert "run directory:" in out  # --log-output prints cell output
    assert "Markdown object>" not in out  # not the bare text of a display with no plain form
    assert out.strip().splitlines()[-1].startswith(f"passed: {run_dir}".replace(str(Path.cwd()) + "/", ""))
    assert out.strip().endswith(f"a smoke run tests the pipeline and measures nothing (kmesh publish 99 {run_dir.name} "
                                "--allow-smoke publishes it anyway)")  # not the bare publish that refuses it
    assert results_of(run_dir)["status"] == "passed"
    log = (run_dir / "logs" / "engine.log").read_text()
    cells = cell_text(run_dir / section.NOTEBOOK)
    for noise in ("C-LEVEL STDERR NOISE", "VLLM LOGGER NOISE", "LMCACHE LOGGER NOISE"):
        assert noise in log and noise not in cells
    assert "PROGRESS" not in cells  # tqdm is off in the kernel
    assert (run_dir / "logs" / "kernel.log").is_file()  # the kernel's own stderr, out of the terminal
    assert "column_29" in cells and "..." not in cells  # the whole 80 x 31 table
    assert list((tmp_path / "tmp").iterdir()) == []  # no kernel connection file, no runtime dir
    assert not psutil.pid_exists(int((run_dir / "kernel.pid").read_text()))
    report = (run_dir / "report.html").read_text()
    assert f"<title>99 fake section · {run_dir.name}</title>" in report and ">PASS<" in report
    assert "the total is <strong>30</strong>" in report


@pytest.mark.notebooks
@pytest.mark.parametrize("behaviour, args, kind, ename", [
    ("raise", [], "cell error", "RuntimeError"),
    ("die", [], "dead kernel", "DeadKernelError"),
    ("sleep", ["--timeout", "15"], "timeout", "CellTimeoutError"),  # the setup cell takes ~4 s on a loaded 2-core box
])
def test_a_failed_notebook_is_recorded_as_failed_with_its_cell_and_error(section, tmp_path, monkeypatch, capsys,
                                                                           behaviour, args, kind, ename):
    monkeypatch.setenv("KMESH_FAKE", behaviour)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    assert cli.main(["run", "99", "--profile", "smoke", *args]) == 1
    run_dir = only_run(tmp_path / "runs")
    results = results_of(run_dir)
    assert results["status"] == "failed" and "finished_utc" not in results
    assert results["error"]["kind"] == kind and results["error"]["ename"] == ename
    assert results["error"]["cell"] == 4  # In [4]: after parameters (1), injected parameters (2), setup (3)
    # the checks cell never ran: kmesh run recorded the checks from the files the cell had written, with their
    # counts and the files' hashes, so the record holds what verify recomputes (the status stays failed)
    assert results["check_counts"] == {"ok": 2, "failed": 0, "skipped": 0} and results["capture_sha256"]
    if behaviour == "raise":
        assert results["error"]["evalue"] == "planted failure"
    said = capsys.readouterr()
    last = said.out.strip().splitlines()[-1]
    assert last.startswith("failed: ") and kind in last
    assert "Executing:" in said.err and ("cell/s" in said.err or "s/cell" in said.err)  # papermill's cell bar
    assert "FAIL" in (run_dir / "report.html").read_text()
    assert list((tmp_path / "tmp").iterdir()) == []  # the dead kernel's connection file too
    assert not psutil.pid_exists(int((run_dir / "kernel.pid").read_text()))


DRIVER = """
import sys
sys.path.insert(0, sys.argv[1])
import fake_section
from pathlib import Path
from kmesh_lib.app import cli, registry
fake_section.register(registry, fake_section.write_notebook(Path(sys.argv[2])))
sys.exit(cli.main(["run", "99", "--profile", "smoke"]))
"""


@pytest.mark.notebooks
def test_ctrl_c_ends_the_run_with_one_line_and_leaves_nothing_behind(tmp_path):
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "KMESH_FAKE": "orphan", "TMPDIR": str(tmp_path / "tmp"),
           "PYTHONPATH": os.pathsep.join([str(Path(fake_section.__file__).parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(Path(fake_section.__file__).parent),
                             str(tmp_path / "99.ipynb")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 600  # a guard against a hang (a kernel that never starts), not a time expected
    while not list((tmp_path / "runs").glob("fake_section/*/sleeping")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    run_dir = only_run(tmp_path / "runs")
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the foreground group
    out, err = proc.communicate(timeout=600)  # a guard, as above
    assert proc.returncode == 130
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err and "IPKernelApp" not in err
    lines = out.strip().splitlines()
    assert lines[-1].startswith("interrupted: ") and str(run_dir.name) in lines[-1] and len(lines) == 2
    assert results_of(run_dir)["status"] == "interrupted"
    for pid_file in ("kernel.pid", "orphan.pid"):  # the kernel, and what it started in its own session
        assert not psutil.pid_exists(int((run_dir / pid_file).read_text())), pid_file
    assert list((tmp_path / "tmp").iterdir()) == []


# -- a run whose process died (issue 45) --

def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_running_run_whose_runner_is_gone_reads_died(tmp_path, section, capsys):
    run_dir = tmp_path / "runs" / "fake_section" / "smoke-20261201-120000-dead"
    run_dir.mkdir(parents=True)
    (run_dir / "params.resolved.yaml").write_text("PROFILE: smoke\n")
    (run_dir / "raw").mkdir()
    (run_dir / "env.json").write_text("{}")
    me = {"pid": os.getpid(), "started": records.process_started(os.getpid())}
    for runner, want in (({"pid": _dead_pid(), "started": 1.0}, "died"), (me, "running"),
                         ({**me, "started": me["started"] - 3600}, "died"),  # the pid, reused by another process
                         (None, "running")):  # recorded before runners were: not guessed at
        results = {"status": "running", **({"runner": runner} if runner else {})}
        (run_dir / "results.json").write_text(json.dumps(results))
        assert records.RunFiles(run_dir).status == want, runner
    (run_dir / "results.json").write_text(json.dumps({"status": "running", "runner": {"pid": _dead_pid(),
                                                                                      "started": 1.0}}))
    assert cli.main(["list", "99"]) == 0
    assert " died " in capsys.readouterr().out
    assert cli.main(["verify", "99", "--run-dir", str(run_dir)]) != 0
    assert "died" in capsys.readouterr().out


def test_the_runner_is_the_kmesh_run_process_when_it_says_so(monkeypatch):
    monkeypatch.setenv(records.RUNNER_ENV, "4242:1700000000.5")
    assert records.current_runner() == {"pid": 4242, "started": 1700000000.5}
    monkeypatch.delenv(records.RUNNER_ENV)
    assert records.current_runner()["pid"] == os.getpid()


def test_stale_kernel_runtime_folders_are_removed_and_live_ones_kept(tmp_path):
    from kmesh_lib.app.execute import RUNTIME_PREFIX, clean_stale_runtimes

    dead = tmp_path / f"{RUNTIME_PREFIX}{_dead_pid()}-ab12"
    live = tmp_path / f"{RUNTIME_PREFIX}{os.getpid()}-cd34"
    other = tmp_path / f"{RUNTIME_PREFIX}x1y2"  # not named by a pid: not ours to judge
    for folder in (dead, live, other):
        folder.mkdir()
        (folder / "kernel-1.json").write_text("{}")
    assert clean_stale_runtimes(tmp_path) == [dead]
    assert not dead.exists() and live.exists() and other.exists()


@pytest.mark.notebooks
def test_a_killed_run_reads_died_and_the_next_run_cleans_its_kernel_folder(tmp_path):
    """kill -9 of `kmesh run`: its results.json still says running, but list and verify say died,
    and the kernel runtime folder it left in the temp dir goes when the next run starts."""
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "KMESH_FAKE": "sleep", "TMPDIR": str(tmp_path / "tmp"),
           "PYTHONPATH": os.pathsep.join([str(Path(fake_section.__file__).parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(Path(fake_section.__file__).parent),
                             str(tmp_path / "99.ipynb")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 600  # a guard against a hang (a kernel that never starts), not a time expected
    while not list((tmp_path / "runs").glob("fake_section/*/sleeping")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    run_dir = only_run(tmp_path / "runs")
    kernel = psutil.Process(int((run_dir / "kernel.pid").read_text()))
    proc.kill()  # SIGKILL: no handler runs, nothing is cleaned
    proc.communicate(timeout=60)
    try:
        assert results_of(run_dir)["status"] == "running"
        assert results_of(run_dir)["runner"]["pid"] == proc.pid
        assert records.RunFiles(run_dir).status == "died"
        left = list((tmp_path / "tmp").glob("kmesh-jupyter-*"))
        assert [p.name.split("-")[2] for p in left] == [str(proc.pid)]
    finally:
        kernel.kill()  # the orphaned kernel (its session survives the kill)
    from kmesh_lib.app.execute import clean_stale_runtimes

    assert clean_stale_runtimes(tmp_path / "tmp") == left


@pytest.mark.parametrize("profile, passed, hint", [
    ("cpu", True, "publish with: kmesh publish 99 RUN"),
    ("cpu", False, "it did not pass (kmesh publish 99 RUN --allow-failed --why SENTENCE publishes it marked so)"),
    ("smoke", True, "a smoke run tests the pipeline and measures nothing (kmesh publish 99 RUN --allow-smoke publishes "
                    "it anyway)"),
])
def test_the_publish_hint_names_what_publish_takes(tmp_path, profile, passed, hint):
    from types import SimpleNamespace

    run_dir = tmp_path / "RUN"
    run_dir.mkdir()
    (run_dir / "params.resolved.yaml").write_text(f"PROFILE: {profile}\n")
    assert cli.publish_hint(SimpleNamespace(NUMBER="99"), run_dir, passed) == hint


def test_a_raised_cells_error_keeps_every_failed_check_and_is_cut_at_a_word():
    """The checks cell names every failed check on one line; results.json keeps up to 1,000 characters of it (300 kept
    only section 21's first of two), cut at a word with an ellipsis, never the lines after the first."""
    from kmesh_lib.app.execute import _first_line

    two = "2 check(s) failed: " + "; ".join(f"check {i}: " + "detail " * 30 for i in (1, 2))
    assert _first_line(two + "\nTraceback line") == " ".join(two.split())  # whole: 460 characters
    long = _first_line("word " * 400)
    assert len(long) <= 1000 and long.endswith(" \u2026") and long[:-2].split(" ") == ["word"] * len(long[:-2].split(" "))
    # a long unbroken value (a path, a JSON blob) is cut inside it, never dropped: shorten() kept "AssertionError: …"
    path = _first_line("FileNotFoundError: /tmp/" + "x" * 1200)
    assert len(path) <= 1000 and path.startswith("FileNotFoundError: /tmp/xxx") and path.endswith("x \u2026")


def test_run_dir_of_another_section_is_named_in_one_line(capsys):
    """A run folder of another section given to a section's command: one line naming both sections, before
    anything reads its captures (it read 'raw/requests.jsonl: section crossover declares no record class')."""
    other = next(p for p in sorted((Path(__file__).parents[1] / "outputs" / "crossover").iterdir())
                 if (p / "results.json").is_file())
    assert cli.main(["verify", "18", "--run-dir", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "a run of crossover, not of family_hold" in err, err


def test_a_short_id_names_a_run_that_is_both_local_and_published(monkeypatch, tmp_path):
    """kmesh publish copies a run and leaves it in runs/: its short id named the same run twice and was refused as
    ambiguous ('a47e ends 2 run ids'), where the whole id found it (the local copy first). Two runs whose ids end
    alike are still refused."""
    from types import SimpleNamespace

    from kmesh_lib.app.runs import RunNotFound, find_any

    monkeypatch.setenv("KMESH_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.setenv("KMESH_PUBLISHED_ROOT", str(tmp_path / "published"))
    sec = SimpleNamespace(KEY="s", NUMBER="99")
    for root in ("runs", "published"):
        (tmp_path / root / "s" / "gpu-20261205-114504-a47e").mkdir(parents=True)
    ref = find_any("a47e", [sec])
    assert (ref.run_id, ref.where) == ("gpu-20261205-114504-a47e", "local")
    assert find_any("gpu-20261205-114504-a47e", [sec]).run_dir == ref.run_dir
    (tmp_path / "published" / "s" / "gpu-20261206-000000-a47e").mkdir()
    with pytest.raises(RunNotFound, match="ends 2 run ids"):
        find_any("a47e", [sec])
