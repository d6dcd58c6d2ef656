"""The data root, the pinned data sets and `kmesh data fetch|verify`, and the trace tests on a
clone whose data root is empty (a fresh clone without ../shared)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kmesh_lib.app.cli import main
from kmesh_lib.base import data
from kmesh_lib.base.paths import REPO_ROOT
from kmesh_lib.workloads import game24


def _mirror(tmp_path: Path) -> Path:
    """A mirror laid out like a data root, made from the manifests (fake content, real names)."""
    mirror = tmp_path / "mirror"
    for ds in data.DATA_SETS.values():
        for relpath in ds.manifest():
            path = mirror / ds.local_dir / relpath
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"fake {relpath}\n")
    return mirror


@pytest.fixture
def fake_manifests(tmp_path: Path, monkeypatch) -> Path:
    """Manifests for a small mirror, so fetch runs without the real data."""
    mirror = tmp_path / "src"
    (mirror / "lmcache-agent-trace" / "a").mkdir(parents=True)
    (mirror / "lmcache-agent-trace" / "a" / "x.jsonl").write_text('{"id": 1}\n')
    (mirror / "lmcache-agent-trace" / "b.jsonl").write_text("")
    (mirror / "game24").mkdir()
    (mirror / "game24" / "24.csv").write_text("Rank,Puzzles\n1,1 1 4 6\n")
    (mirror / "mooncake-traces").mkdir()
    (mirror / "mooncake-traces" / "conversation_trace.jsonl").write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n')
    monkeypatch.setattr(data, "MANIFEST_DIR", tmp_path / "manifests")
    assert main(["data", "manifest", "--from", str(mirror)]) == 0
    return mirror


def test_the_data_root_is_one_setting(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("KMESH_DATA_ROOT", raising=False)
    assert data.data_root() == (REPO_ROOT / "../shared/data").resolve()
    monkeypatch.setenv("KMESH_DATA_ROOT", str(tmp_path))
    assert data.data_root() == tmp_path
    assert data.resolve_path("$KMESH_DATA_ROOT/game24/24.csv") == tmp_path / "game24" / "24.csv"
    assert data.resolve_path("$KMESH_DATA_ROOTX/y") == (REPO_ROOT / "$KMESH_DATA_ROOTX/y").resolve()
    assert data.resolve_path("/abs/p") == Path("/abs/p")
    monkeypatch.setenv("KMESH_DATA_ROOT", "rel/data")  # relative to the repo, not the working directory
    monkeypatch.chdir(tmp_path)
    assert data.data_root() == REPO_ROOT / "rel" / "data"


def test_section_19_puzzles_resolve_through_the_data_root(tmp_path: Path, monkeypatch):
    from kmesh_lib.sections.tot_headroom.params import TotHeadroomParams

    assert TotHeadroomParams.PUZZLES_CSV == "$KMESH_DATA_ROOT/game24/24.csv"
    monkeypatch.setenv("KMESH_DATA_ROOT", str(tmp_path))
    assert game24.repo_path(TotHeadroomParams.PUZZLES_CSV) == tmp_path / "game24" / "24.csv"
    assert game24.repo_path("params/x.csv") == REPO_ROOT / "params" / "x.csv"


def test_manifests_pin_every_file_at_the_studys_revisions():
    trace, puzzles = data.DATA_SETS["lmcache-agent-trace"], data.DATA_SETS["game24"]
    assert trace.revision == "780bcc2979715150d8b9fd4737e026e625444cc9"
    assert puzzles.revision.startswith("8050e67d0e3a")
    manifest = trace.manifest()
    assert len(manifest) == 78 and all(p.endswith(".jsonl") for p in manifest)
    assert list(puzzles.manifest()) == ["24.csv"]
    assert puzzles.url("24.csv") == ("https://raw.githubusercontent.com/princeton-nlp/tree-of-thought-llm/"
                                     "8050e67d0e3a0fddc424d7fa5801538722a4c4cc/src/tot/data/24/24.csv")


@pytest.mark.parametrize("line", ["abc  x.jsonl", "0" * 64 + "  /etc/passwd", "0" * 64 + "  ../x", "0" * 64 + " x"])
def test_a_manifest_cannot_place_files_elsewhere(tmp_path: Path, line: str):
    path = tmp_path / "m.sha256"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match="line 1"):
        data.read_manifest(path)


def test_fetch_from_a_mirror_verifies_and_places_every_file(fake_manifests: Path, tmp_path: Path, capsys):
    root = tmp_path / "root"
    assert main(["data", "fetch", "--from", str(fake_manifests), "--data-root", str(root)]) == 0
    assert (root / "lmcache-agent-trace" / "a" / "x.jsonl").read_text() == '{"id": 1}\n'
    assert (root / "game24" / "24.csv").is_file()
    assert "2 fetched" in capsys.readouterr().out
    assert main(["data", "fetch", "--from", str(fake_manifests), "--data-root", str(root)]) == 0
    assert "2 already present, 0 fetched" in capsys.readouterr().out
    assert main(["data", "verify", "--data-root", str(root)]) == 0


@pytest.mark.parametrize("root", ["/etc/kmesh-data-probe", "/usr/share/kmesh-data-probe"])
def test_fetch_refuses_a_system_folder_as_the_data_root(fake_manifests: Path, capsys, root):
    """--data-root /etc/droot was made and written (as root); a data root is a folder written to, as a run's."""
    assert main(["data", "fetch", "--from", str(fake_manifests), "--data-root", root]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"kmesh data: data root {root}: under /") and "a system folder" in line
    assert not Path(root).exists()


def test_fetch_refuses_a_file_that_does_not_match(fake_manifests: Path, tmp_path: Path, capsys):
    (fake_manifests / "lmcache-agent-trace" / "a" / "x.jsonl").write_text('{"id": 2}\n')  # the mirror changed
    root = tmp_path / "root"
    assert main(["data", "fetch", "lmcache-agent-trace", "--from", str(fake_manifests), "--data-root", str(root)]) == 1
    out = capsys.readouterr().out
    assert "1 failed" in out and "does not match the manifest" in out
    assert not (root / "lmcache-agent-trace" / "a" / "x.jsonl").exists()
    assert not any(p.name.startswith(".") for p in (root / "lmcache-agent-trace" / "a").iterdir())


def test_verify_names_a_changed_or_missing_file(fake_manifests: Path, tmp_path: Path, capsys):
    root = tmp_path / "root"
    assert main(["data", "fetch", "--from", str(fake_manifests), "--data-root", str(root)]) == 0
    (root / "game24" / "24.csv").write_text("tampered\n")
    (root / "lmcache-agent-trace" / "b.jsonl").unlink()
    assert main(["data", "verify", "--data-root", str(root)]) == 1
    out = capsys.readouterr().out
    assert "game24: 0 of 1 files missing, 1 changed" in out and "lmcache-agent-trace: 1 of 2 files missing" in out
    # what to do next, for the sets with files missing (a changed file is fetched again the same way)
    assert out.strip().splitlines()[-1].startswith("to get the missing files: kmesh data fetch lmcache-agent-trace (")


def test_a_section_19_plan_without_the_puzzles_names_the_fetch(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setenv("KMESH_DATA_ROOT", str(tmp_path))
    assert main(["plan", "19"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert str(tmp_path / "game24" / "24.csv") in line and line.endswith("`kmesh data fetch game24` gets it")


def test_fetch_without_network_fails_in_one_line_per_file(fake_manifests: Path, tmp_path: Path, capsys, monkeypatch):
    import urllib.request

    def offline(url, timeout):
        raise OSError("Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    assert main(["data", "fetch", "game24", "--data-root", str(tmp_path / "root")]) == 1
    out = capsys.readouterr().out
    assert "from github.com/princeton-nlp/tree-of-thought-llm" in out
    assert "failed: https://raw.githubusercontent.com/" in out and "Name or service not known" in out


def test_bad_arguments_exit_2(capsys, tmp_path: Path):
    assert main(["data", "fetch", "nope"]) == 2
    assert "unknown data set 'nope'" in capsys.readouterr().err
    assert main(["data", "fetch", "--from", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err


@pytest.mark.requires_data("lmcache-agent-trace")
@pytest.mark.requires_data("game24")
def test_the_real_data_matches_its_manifests(tmp_path: Path, capsys):
    assert main(["data", "verify"]) == 0
    assert main(["data", "fetch", "--from", str(data.data_root()), "--data-root", str(tmp_path)]) == 0
    assert "78 fetched" in capsys.readouterr().out
    assert data.check_data_set("lmcache-agent-trace", tmp_path).ok


@pytest.mark.skipif(os.environ.get("KMESH_DATA_ROOT_SUBRUN") == "1", reason="already the no-data run")
@pytest.mark.skipif(all(data.missing_reason(name) for name in data.DATA_SETS),
                    reason="this session has no data set (a clone without ../shared): it is the no-data run already, "
                           "these files' data tests skip in it with their reason")
def test_the_trace_tests_pass_with_an_empty_data_root(tmp_path: Path):
    """A clone with no ../shared: data tests skip with their reason, everything else passes. Where this session
    itself has no data, it is that clone, and running the files again in a child would repeat it."""
    env = os.environ | {"KMESH_DATA_ROOT": str(tmp_path / "empty"), "KMESH_DATA_ROOT_SUBRUN": "1",
                        "PYTHONPATH": str(REPO_ROOT)}
    (tmp_path / "empty").mkdir()
    files = ["tests/test_trace_audit.py", "tests/test_trace_lineage.py", "tests/test_trace_audit_experiment.py",
             "tests/test_trace_data.py"]
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", *files,
                          "-k", "not 50mb and not parse_cost and not documented_multiple"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    skipped = [line for line in out.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) >= 4, out.stdout[-3000:]
    assert all("is not under the data root" in line and "kmesh data fetch" in line for line in skipped
               if "the no-data run" not in line), skipped
