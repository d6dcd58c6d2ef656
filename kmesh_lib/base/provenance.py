"""Which code a run measured: the commit and whether the tree differed from it, read where the run ran.

In a checkout, git says (``HEAD`` and ``git status``). A copy of the tree without ``.git``, or with a ``.git``
it does not match (the GPU machine's), carries a manifest, ``.kmesh-tree.json``, written where the copy was made
(``scripts/tree_manifest.py``): the commit and the git blob id of every file the commit holds. The run
hashes the files it has against it, so the commit is recorded only when every file matches, and a
changed, missing or added file makes the run dirty by measurement, not by a typed flag.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

MANIFEST = ".kmesh-tree.json"
SCHEMA = "kmesh.tree-manifest/1"
WATCHED = ("kmesh_lib", "notebooks", "params", "scripts")  # an added file here changes what runs
SKIPPED_PARTS = ("__pycache__", ".ipynb_checkpoints")


def git_blob_id(path: Path) -> str:
    """The id git gives the file's content (``git hash-object``), computed without git."""
    data = Path(path).read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _git(root: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def tree_manifest(root: Path) -> dict:
    """The manifest of checkout ``root`` at ``HEAD``: the commit and each tracked file's blob id there."""
    commit = _git(root, "rev-parse", "--verify", "-q", "HEAD").strip()
    if not commit:
        raise ValueError(f"{root}: not a git checkout with a commit")
    files = {}
    for line in _git(root, "ls-tree", "-r", "--full-tree", "HEAD").splitlines():
        meta, _, name = line.partition("\t")
        mode, kind, blob = meta.split()
        if kind == "blob" and mode != "120000":
            files[name] = blob
    return {"schema": SCHEMA, "commit": commit, "files": files}


def _watched_files(root: Path) -> set[str]:
    out = set()
    for top in WATCHED:
        for path in (root / top).rglob("*"):
            if path.is_file() and not any(part in SKIPPED_PARTS for part in path.parts) and path.suffix != ".pyc":
                out.add(path.relative_to(root).as_posix())
    return out


def check_manifest(root: Path, manifest: dict) -> dict:
    """``{"commit", "dirty", "source", "changed"}`` of the tree at ``root`` against ``manifest``: the commit
    only when no file differs (else None, with the manifest's commit as ``manifest_commit``)."""
    files = manifest.get("files") or {}
    changed = []
    for name, blob in sorted(files.items()):
        path = root / name
        if not path.is_file():
            if name.startswith(WATCHED):  # data and docs may stay behind; code may not
                changed.append(f"missing {name}")
        elif git_blob_id(path) != blob:
            changed.append(f"changed {name}")
    changed += [f"added {name}" for name in sorted(_watched_files(root) - set(files))]
    out = {"commit": None if changed else manifest.get("commit"), "dirty": bool(changed), "source": MANIFEST}
    if changed:
        out.update(manifest_commit=manifest.get("commit"), changed=changed[:20], num_changed=len(changed))
    return out


def _status_entries(porcelain_z: str) -> list[tuple[str, list[str]]]:
    """(XY, paths) per entry of ``git status --porcelain -z``: a rename or copy names its new path and its old one
    (``-z`` puts the old path in the next NUL-separated field and quotes no path, so neither " -> " in a name nor
    git's C-style quoting of unusual names can be misread)."""
    fields = porcelain_z.split("\0")
    out, i = [], 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if len(entry) < 4:
            continue
        xy, paths = entry[:2], [entry[3:]]
        if "R" in xy or "C" in xy:
            paths.append(fields[i])
            i += 1
        out.append((xy, paths))
    return out


def _what_differs(entries: list[tuple[str, list[str]]]) -> dict:
    """What a dirty checkout's ``git status`` names (``_status_entries``): how many files, the first few, and
    whether any is code (``WATCHED``: a rename touches code where either of its paths is). The GPU machine's copy
    (6 Dec) carried .git at HEAD with outputs/ set aside for the carry limit (``scripts/device_tree.sh``): dirty by
    git, its code as committed; the record says which of the two."""
    watched = tuple(f"{top}/" for top in WATCHED)
    return {"num_changed": len(entries), "changed": [f"{xy.strip()} {' <- '.join(paths)}" for xy, paths in entries[:5]],
            "code_changed": any(p.startswith(watched) for _, paths in entries for p in paths)}


def git_revision(root: Path) -> dict:
    """The commit ``root`` holds and whether it is dirty, measured (module docstring); ``{"commit": None,
    "dirty": None}`` when neither git nor a manifest can say."""
    top = _git(root, "rev-parse", "--show-toplevel").strip()
    # git looks upwards for a repository: a copy of the tree without .git inside another repository (the GPU
    # machine's working folder once reported an old kmesh commit, 3 Dec) is not that repository's commit
    git = None
    if top and Path(top).resolve() == Path(root).resolve():
        status = _status_entries(_git(root, "status", "--porcelain", "-z", "--untracked-files=no"))
        git = {"commit": _git(root, "rev-parse", "--verify", "-q", "HEAD").strip() or None, "dirty": bool(status)}
        if not git["dirty"]:
            return git
        git.update(_what_differs(status))
    path = Path(root) / MANIFEST
    if path.is_file():
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return git or {"commit": None, "dirty": None, "source": f"{MANIFEST} unreadable"}
        if isinstance(manifest, dict) and manifest.get("schema") == SCHEMA:
            checked = check_manifest(Path(root), manifest)
            # A .git at the root that the tree does not match, beside a manifest it matches file for file: the GPU
            # machine's copy kept an earlier call's .git (5 Dec: HEAD c458964, the tree two sessions newer), so
            # the manifest written where the copy was made says which commit this is. A dirty .git at the manifest's
            # own commit is this checkout, dirty: the manifest lets data and docs stay behind, git does not
            if git is None or (not checked["dirty"] and git["commit"] != manifest.get("commit")):
                return {**checked, **({"stale_git": git} if git else {})}
    return git or {"commit": None, "dirty": None}


__all__ = ["MANIFEST", "check_manifest", "git_blob_id", "git_revision", "tree_manifest"]
