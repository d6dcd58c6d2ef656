"""``scripts/device_run.sh``'s checks before it installs or runs anything on the GPU machine, whose copy of the
tree has no .git: every run must record the commit it measured (``base.records.git_revision`` takes it from
``KMESH_GIT_COMMIT`` there)."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "device_run.sh"


def _run(tmp_path: Path, commit: str | None) -> subprocess.CompletedProcess:
    """The script from a copy of it in ``tmp_path`` (no .git above it), with a ``python3`` that fails at once:
    past the checks, the first thing the script runs is pip, so exit status 1 means the checks let it through."""
    shutil.copy(SCRIPT, tmp_path / "device_run.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text("#!/bin/sh\nexit 7\n")
    (bin_dir / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KMESH_", "GIT_"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", GIT_CEILING_DIRECTORIES=str(tmp_path.parent))
    if commit is not None:
        env["KMESH_GIT_COMMIT"] = commit
    return subprocess.run(["sh", "device_run.sh", "21"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("commit", [None, "", "unknown", "HEAD", "504ed"])
def test_a_run_without_a_commit_hash_stops_before_anything_runs(tmp_path, commit):
    out = _run(tmp_path, commit)
    assert out.returncode == 2
    assert "is not a commit hash" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_a_run_with_a_commit_hash_gets_past_the_check(tmp_path):
    out = _run(tmp_path, "504edec0aa")
    assert out.returncode == 1 and "is not a commit hash" not in out.stderr


def test_a_tree_without_git_inside_another_repository_records_no_commit(tmp_path, monkeypatch):
    """git looks upwards: a copy of the tree without .git inside another repository (the GPU machine's folder once
    gave an old kmesh commit) must record no commit, not that repository's."""
    from kmesh_lib.base import records

    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, env=env)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "outer"], check=True, env=env)
    tree = tmp_path / "tree"
    tree.mkdir()
    monkeypatch.delenv("KMESH_GIT_COMMIT", raising=False)
    monkeypatch.setattr(records, "REPO_ROOT", tree)
    assert records.git_revision() == {"commit": None, "dirty": None}
    monkeypatch.setattr(records, "REPO_ROOT", tmp_path)  # the repository's own root: its commit
    assert len(records.git_revision()["commit"]) == 40
