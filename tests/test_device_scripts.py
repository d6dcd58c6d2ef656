"""``scripts/device_run.sh``'s checks before it installs or runs anything on the GPU machine, whose copy of the
tree has no .git, and the measured provenance of such a copy (``base.provenance``): the commit is recorded only
when every file matches the carried manifest, and dirty is measured, never typed."""
import json
import os
import shutil
import subprocess
from pathlib import Path

from kmesh_lib.base import provenance

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "device_run.sh"
REPO = SCRIPT.parent.parent


def _run(tmp_path: Path, manifest: bool) -> subprocess.CompletedProcess:
    """The script from a copy of it in ``tmp_path`` (no .git above it), with a ``python3`` that fails at once:
    past the checks, the first thing the script runs is pip, so exit status 1 means the checks let it through."""
    shutil.copy(SCRIPT, tmp_path / "device_run.sh")
    if manifest:
        (tmp_path / provenance.MANIFEST).write_text("{}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text("#!/bin/sh\nexit 7\n")
    (bin_dir / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KMESH_", "GIT_"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", GIT_CEILING_DIRECTORIES=str(tmp_path.parent))
    return subprocess.run(["sh", "device_run.sh", "21"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)


def test_a_copy_without_git_or_manifest_stops_before_anything_runs(tmp_path):
    out = _run(tmp_path, manifest=False)
    assert out.returncode == 2
    assert "no .kmesh-tree.json" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_a_copy_with_a_manifest_gets_past_the_check(tmp_path):
    out = _run(tmp_path, manifest=True)
    assert out.returncode == 1 and "no .kmesh-tree.json" not in out.stderr


def _copy_of_checkout(tmp_path: Path) -> tuple[Path, dict]:
    """A copy of this checkout's committed files without .git, with the manifest of HEAD."""
    manifest = provenance.tree_manifest(REPO)
    copy = tmp_path / "tree"
    for name in manifest["files"]:
        if name.startswith(provenance.WATCHED):
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            out = subprocess.run(["git", "show", f"HEAD:{name}"], cwd=REPO, capture_output=True, check=True)
            (copy / name).write_bytes(out.stdout)
    (copy / provenance.MANIFEST).write_text(json.dumps(manifest))
    return copy, manifest


def test_a_manifested_copy_records_its_commit_only_while_every_file_matches(tmp_path):
    copy, manifest = _copy_of_checkout(tmp_path)
    clean = provenance.git_revision(copy)
    assert clean == {"commit": manifest["commit"], "dirty": False, "source": provenance.MANIFEST}
    edited = copy / "kmesh_lib" / "base" / "checks.py"
    edited.write_text(edited.read_text() + "\n# edited on the device\n")
    dirty = provenance.git_revision(copy)
    assert dirty["commit"] is None and dirty["dirty"] is True and dirty["manifest_commit"] == manifest["commit"]
    assert dirty["changed"] == ["changed kmesh_lib/base/checks.py"]
    edited.unlink()
    (copy / "kmesh_lib" / "extra.py").write_text("x = 1\n")
    assert provenance.git_revision(copy)["changed"] == ["missing kmesh_lib/base/checks.py", "added kmesh_lib/extra.py"]


def test_git_blob_id_is_gits_own(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("kmesh\n")
    out = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True)
    assert provenance.git_blob_id(path) == out.stdout.strip()


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
    monkeypatch.setattr(records, "REPO_ROOT", tree)
    assert records.git_revision() == {"commit": None, "dirty": None}
    monkeypatch.setattr(records, "REPO_ROOT", tmp_path)  # the repository's own root: its commit
    assert len(records.git_revision()["commit"]) == 40
