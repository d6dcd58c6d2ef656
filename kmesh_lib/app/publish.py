"""``kmesh publish``: a finished, verified run into the tracked set ``outputs/<section>/<run_id>/``.

Steps, each of which can refuse (nothing is left half-published):

1. verify the run (``app.verify``): a run that did not finish, fails a check or whose record
   claims more than its files show is refused, unless ``allow_failed`` with a one-sentence
   ``failure_note`` saying why it failed (the public file, the index, the README and the
   report's header then show both);
2. copy the run's published files into a staging folder beside its destination, by allow-list
   (``app.compact.published_files``: no ``logs/``, no ``*.log``, no driver state; a symlink is
   refused) and bring the copy into the published format (``app.compact``: figures moved out
   of the notebook into ``figures/``, ``raw/*.jsonl`` xz-compressed) after redacting it
   (``app.redact``: credential-looking names hashed, no host name or kernel string, no engine log
   lines; a capture it changes is named in ``captures_with_paths_rewritten``);
3. rewrite absolute paths as relative ones in the text files, captures included (the run folder
   -> ``outputs/<section>/<run_id>``, the checkout -> ``""``, the folder around it -> ``../``, an
   installed package -> ``<site-packages>/``, the temp dir -> ``<tmp>/``: a disk tier's root, a
   params copy's RUN_DIR) and refuse a copy in which an absolute path is left. A capture changes
   in its path strings only, is named in ``captures_with_paths_rewritten``, and the copy must
   verify exactly as the run did (step 5);
4. refuse a copy of another published run (every capture equal, by content, to that run's);
   captures that equal another run's only in part are kept and named in the public file
   (``shared_captures``: two runs measured the same deterministic thing);
5. verify the copy again, build ``public-results.json`` by allow-list (``public_document``),
   render ``report.html``, and move the staging folder into place;
6. regenerate ``outputs/index.html`` and the README's results table (``app.published``).

``public-results.json`` holds only named fields: schema, section, run id, status, check statuses,
allowed environment keys, the Params fields, input and capture SHA-256s, the section's
``headline``, ``counts`` and ``public_results``; everything a section returns passes
``base.public.validate_public``. Nothing from ``results.json`` or ``raw/`` is copied in wholesale.
A capture's SHA-256 is of what is stored, uncompressed: ``xz -dc raw/NAME.xz | sha256sum``
reproduces it, and it equals the local run's file unless the capture is named in
``captures_with_paths_rewritten``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType

from kmesh_lib.app import published as published_set
from kmesh_lib.app.compact import (
    Compacted,
    compact_json,
    compact_notebook,
    compress_captures,
    drop_raw_copies,
    drop_table_text,
    move_figures,
    palette_figures,
    published_files,
)
from kmesh_lib.app.public_document import public_document
from kmesh_lib.app.published import PUBLIC_FILE
from kmesh_lib.app.redact import redact_folder
from kmesh_lib.app.report import PUBLISHED_STYLESHEET, render_report
from kmesh_lib.app.runs import RunNotFound, display_path, published_root
from kmesh_lib.app.verify import Verdict, verify
from kmesh_lib.base.params import ParamError
from kmesh_lib.base.paths import REPO_ROOT, repo_relative
from kmesh_lib.base.public import (
    MAX_STRING_CHARS,
    validate_public,
)
from kmesh_lib.base.records import RunFileError, RunFiles, capture_sha256, open_capture, write_json_atomic

REWRITTEN_SUFFIXES = (".json", ".yaml", ".ipynb", ".txt", ".md", ".csv")
SITE_PACKAGES = re.compile(r"(?:/[^/\s\"'<>:]+)+/(?:site|dist)-packages/")
ABSOLUTE_PATH = re.compile(r"(?<![\w.>~-])/(?:work|home|root|Users|mnt|opt|srv|scratch|data|tmp|var|private|usr)/"
                           r"[^\s\"'<>]*")


class PublishRefused(ValueError):
    """The run may not be published as asked; the message says why and what would allow it."""


@dataclass
class Published:
    run_dir: Path
    public: dict
    verdict: Verdict
    compacted: Compacted


def notebook_run_dir(run_dir: Path, notebook: str) -> str | None:
    """The RUN_DIR papermill gave the notebook (``metadata.papermill.parameters``): for a run made on
    another machine, a folder that neither this checkout nor params.resolved.yaml names."""
    try:
        nb = json.loads((run_dir / notebook).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = ((nb.get("metadata", {}).get("papermill") or {}).get("parameters") or {}).get("RUN_DIR")
    return value if isinstance(value, str) else None


def _path_rewrites(run_dir: Path, recorded_run_dir: str | None, dest_rel: str,
                   notebook_dir: str | None = None) -> list[tuple[str, str]]:
    """(absolute, relative) pairs, longest first: the run folder as it is (absolute, and relative to
    the checkout) and as it was recorded, then each checkout (``<root>/`` -> ``""``), then the
    folder around a checkout (-> ``../``)."""
    pairs = [(str(run_dir.resolve()), dest_rel)]
    local = repo_relative(run_dir)  # `kmesh run --source-run runs/...` names the folder so in the notebook
    if local and local != dest_rel and len(local) > 8:
        pairs.append((local, dest_rel))
    roots = [REPO_ROOT]
    for named in (recorded_run_dir, notebook_dir):
        if not named or len(named) <= 8:
            continue
        recorded = Path(named)
        pairs.append((named.rstrip("/"), dest_rel))
        if recorded.is_absolute() and len(recorded.parts) > 4 and recorded.parents[1].name in ("runs", "outputs"):
            roots.append(recorded.parents[2])  # the checkout the run was made in: <root>/runs/<section>/<id>
    for root in roots:
        pairs.append((f"{root}/", ""))
        if len(root.parent.parts) > 1 and str(root.parent) != tempfile.gettempdir():
            pairs.append((f"{root.parent}/", "../"))
    return sorted(set(pairs), key=lambda p: -len(p[0]))


def _text_files(folder: Path) -> list[Path]:
    """The text files paths are rewritten in: top-level records and every text capture under raw/."""
    top = [p for p in folder.iterdir() if p.is_file() and p.suffix in REWRITTEN_SUFFIXES]
    raw = [p for p in sorted((folder / "raw").rglob("*")) if p.is_file() and p.suffix in (*REWRITTEN_SUFFIXES, ".jsonl")]
    return top + raw


def _rewrite_paths(folder: Path, pairs: list[tuple[str, str]]) -> list[str]:
    """Applies ``pairs``, then the installed-package and temp-dir rules, to ``_text_files``; returns
    the files changed (relative). A capture changes only in its path strings: the copy is verified
    again after, and must give every check the verdict the run's own files gave."""
    tmp = tempfile.gettempdir().rstrip("/") + "/"
    changed = []
    for path in _text_files(folder):
        text = path.read_text(encoding="utf-8")
        new = text
        for old, rel in pairs:
            new = new.replace(old, rel)
        new = SITE_PACKAGES.sub("<site-packages>/", new)
        new = re.sub(rf"(?<![\w.>~-]){re.escape(tmp)}", "<tmp>/", new)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(path.relative_to(folder).as_posix())
    return changed


def absolute_paths(folder: Path) -> list[str]:
    """'file: path' for each absolute machine path left in the published copy: its records, report,
    notebook and every capture (compressed ones read through)."""
    found = []
    files = [p for p in folder.iterdir() if p.is_file() and p.suffix in (*REWRITTEN_SUFFIXES, ".html")]
    files += [p for p in sorted((folder / "raw").rglob("*")) if p.is_file()]
    for path in files:
        with open_capture(path) as f:
            text = f.read().decode("utf-8", "replace")
        found += [f"{path.relative_to(folder).as_posix()}: {m[0][:80]}" for m in ABSOLUTE_PATH.finditer(text)]
    return found


def _rewritten_before(src: Path) -> set[str]:
    """The captures a published run (published again in place) had its paths rewritten in then."""
    try:
        before = published_set.read_public(src / PUBLIC_FILE).get("captures_with_paths_rewritten") or []
    except published_set.PublishedSetError:
        return set()
    return {f for f in before if isinstance(f, str) and f.startswith("raw/")}


def _copy_run(src: Path, staging: Path, notebook: str) -> list[str]:
    """Copies the run's published files (``app.compact.published_files``); returns what was left out."""
    keep, left = published_files(src, notebook)
    links = [entry for entry in left if entry.endswith("(a symlink)")]
    if links:
        raise PublishRefused(f"{src / links[0].removesuffix(' (a symlink)')}: a symlink; "
                             "a run folder publishes plain files only")
    for rel in keep:
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, staging / rel)
    return left


def _capture_hashes(folder: Path) -> dict[str, str]:
    run = RunFiles(folder)
    return {name: run.raw_sha256(name) for name in run.raw_names("*")
            if (run.raw_path(name) and run.raw_path(name).stat().st_size)}


def shared_captures(run_id: str, folder: Path) -> dict[str, str]:
    """Captures of the staged copy whose content another published run holds: name -> that run.

    Raises:
        PublishRefused: every capture equals one other run's: the run is a copy of it (a device
            folder next to its rendered copy, a run that re-used another's groups).
    """
    mine = _capture_hashes(folder)
    if not mine:
        return {}
    shared: dict[str, str] = {}
    for other in sorted(published_root().glob("*/*")):
        if other.name == run_id or other.name.startswith(".") or not other.is_dir():
            continue
        theirs = set(_capture_hashes(other).values())
        same = sorted(name for name, digest in mine.items() if digest in theirs)
        where = f"{other.parent.name}/{other.name}"
        if len(same) == len(mine):
            raise PublishRefused(f"every capture of {run_id} ({', '.join(f'raw/{n}' for n in same)}) is "
                                 f"byte-identical to {where}'s: the published set keeps one copy; "
                                 "publish one of the two runs")
        for name in same:
            shared.setdefault(name, where)
    return shared


def rehash_copy(folder: Path) -> dict[str, str]:
    """The published copy's ``capture_sha256``, hashed again after publishing rewrote paths in it (a capture or
    params copy that named a machine path). The hashes the run recorded for the files that changed are kept as
    ``capture_sha256_as_measured``; returns those."""
    path = folder / "results.json"
    results = RunFiles(folder).results
    before = results.get("capture_sha256") or {}
    now = capture_sha256(RunFiles(folder))
    changed = {name: digest for name, digest in before.items() if now.get(name) != digest}
    if changed:
        results["capture_sha256_as_measured"] = {**(results.get("capture_sha256_as_measured") or {}), **changed}
    results["capture_sha256"] = now
    write_json_atomic(path, results, compact=True)
    return changed


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


def _check_failure_note(note: str, allowed_failed: bool) -> str:
    note = " ".join((note or "").split())
    if not allowed_failed:
        if note:
            raise PublishRefused("--why explains a run published with --allow-failed; this run passes")
        return ""
    if not note:
        raise PublishRefused("--allow-failed needs --why 'one sentence': why the run failed, for the index, "
                             "the README and the report")
    if len(note) > MAX_STRING_CHARS:
        raise PublishRefused(f"--why: {len(note)} characters; one sentence of at most {MAX_STRING_CHARS}")
    return note


def publish(section: ModuleType, run_dir: Path, allow_failed: bool = False, replace: bool = False,
            readme: Path | None = None, why: str = "", allow_smoke: bool = False) -> Published:
    """Publishes ``run_dir`` (module docstring). Raises RunFileError, PublishRefused or PublicContentError."""
    src = Path(run_dir).resolve()
    verdict = verify(section, RunFiles(src))  # a damaged run folder is named first
    if RunFiles(src).recorded_params.get("PROFILE") == "smoke" and not allow_smoke:
        raise PublishRefused(f"run {src.name} is a smoke-profile run (a tiny model that tests the pipeline, "
                             "not a measurement); --allow-smoke publishes it anyway")
    allowed_failed = _check_publishable(verdict, allow_failed)
    failure_note = _check_failure_note(why, allowed_failed)
    dest = (published_root() / section.KEY / src.name).resolve()
    dest_rel = f"{published_root().name}/{section.KEY}/{src.name}"
    in_place = src == dest
    if dest.exists() and not in_place and not replace:
        raise PublishRefused(f"{dest_rel} is already published; --replace publishes this run over it")
    recorded_run_dir = RunFiles(src).recorded_params.get("RUN_DIR")
    staging_parent = dest.parent / f".publishing-{os.getpid()}"
    staging = staging_parent / src.name  # named as the run: the copy's run id and report title are its own
    shutil.rmtree(staging_parent, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        left_out = _copy_run(src, staging, section.NOTEBOOK)
        redacted = redact_folder(staging, section.NOTEBOOK)  # credentials, the host, engine log lines
        figures, repeated = move_figures(staging, section.NOTEBOOK)
        drop_table_text(staging, section.NOTEBOOK)
        palette_figures(staging, section.NOTEBOOK)
        rewritten = _rewrite_paths(staging, _path_rewrites(src, recorded_run_dir, dest_rel,
                                                           notebook_run_dir(src, section.NOTEBOOK)))
        compact_notebook(staging, section.NOTEBOOK)  # after every rewrite of it
        compact_json(staging / "results.json")
        left_out += drop_raw_copies(staging)
        compacted = Compacted(left_out, figures, compress_captures(staging), rewritten, repeated)
        shared = shared_captures(src.name, staging)
        rehash_copy(staging)
        copy = RunFiles(staging)
        again = verify(section, copy)
        if again.ok != verdict.ok or [ln.kind for ln in again.lines] != [ln.kind for ln in verdict.lines]:
            raise PublishRefused(f"the published copy verifies differently from {src}: " + again.summary())
        public = public_document(section, copy, again, allowed_failed, failure_note, shared,
                                 sorted({f for f in rewritten if f.startswith("raw/")} | set(redacted.captures)
                                        | _rewritten_before(src)))
        write_json_atomic(staging / PUBLIC_FILE, public, compact=True)
        render_report(section, staging, note=f"Published with --allow-failed: {failure_note}" if allowed_failed else "",
                      stylesheet=PUBLISHED_STYLESHEET)
        left = absolute_paths(staging)
        if left:
            raise PublishRefused(f"an absolute path is left in the published copy ({len(left)}: {left[0]}); "
                                 "record paths relative to the repository, or extend app.publish's rewrites")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(staging, dest)
        published_set.write_withdrawn(published_root(), [
            e for e in published_set.read_withdrawn(published_root()) if (e["section"], e["run_id"]) != (section.KEY, src.name)])
    finally:
        shutil.rmtree(staging_parent, ignore_errors=True)
        if not any(dest.parent.iterdir()):
            dest.parent.rmdir()  # a refused first run of a section leaves no empty folder
    published_set.regenerate(published_root(), readme)
    return Published(dest, public, again, compacted)




def _last_commit_holding(folder: Path) -> str | None:
    """The last commit that touched ``folder`` (where its files stay readable after it is removed)."""
    import subprocess

    try:
        out = subprocess.run(["git", "-C", str(folder.parent), "log", "-1", "--format=%H", "--", folder.name],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def named_as_input(root: Path, key: str, run_id: str) -> list[str]:
    """The files that name published run ``<key>/<run_id>`` as an input, repo-relative where they lie in the
    checkout: a section's defaults (``kmesh_lib/sections/*/params.py``, ``params/*.yaml``) and another published
    run's ``params.resolved.yaml`` (section 23 prices its restores from section 21's runs, CROSSOVER_RUNS, and
    verifying it reads them again). A run named there cannot be withdrawn: its readers would lose their input
    (7 Dec 2026: 442e, which section 23's default and its five published runs read, was withdrawn and put back)."""
    needle = f"{key}/{run_id}"
    own = root / key / run_id
    files = [*sorted((REPO_ROOT / "kmesh_lib" / "sections").glob("*/params.py")),
             *sorted((REPO_ROOT / "params").glob("*.yaml")),
             *(p for p in sorted(root.glob("*/*/params.resolved.yaml")) if p.parent != own)]
    return [display_path(p) for p in files if needle in p.read_text(errors="replace")]


def withdraw(section: ModuleType, run_id: str, why: str, superseded_by: str | None = None,
             readme: Path | None = None) -> dict:
    """Removes published run ``run_id`` and lists it under the withdrawn runs (``withdrawn.json``:
    why, the run that supersedes it, its status then, and the last commit that holds its files),
    then regenerates the listings. A run withdrawn already gets its entry's why and successor
    restated (its commit stays). Raises RunNotFound for a run that is not published (nor withdrawn) and for a
    --superseded-by that is no other published run, ParamError for a --why that is no sentence (bad input: exit 2),
    else PublishRefused (among them for a run another file names as its input: ``named_as_input``)."""
    root = published_root()
    folder = root / section.KEY / run_id
    listed = [e for e in published_set.read_withdrawn(root) if (e["section"], e["run_id"]) == (section.KEY, run_id)]
    if "/" in run_id or not (folder.is_dir() or listed):
        raise RunNotFound(f"no published run {run_id} of {section.KEY} under {display_path(root / section.KEY)}")
    why = " ".join((why or "").split())
    if not why or len(why) > MAX_STRING_CHARS:  # bad input, as an unknown run id is (exit 2), not a refusal
        raise ParamError(f"--why: one sentence of 1 to {MAX_STRING_CHARS} characters")
    if superseded_by is not None and (superseded_by == run_id or "/" in superseded_by
                                      or not (root / section.KEY / superseded_by).is_dir()):
        raise RunNotFound(f"--superseded-by {superseded_by}: not another published run of {section.KEY}")
    if not folder.is_dir():  # withdrawn already: say it again (a replacement was published since)
        entry = {**listed[0], "why": why, "superseded_by": superseded_by}
        validate_public(entry, "withdrawn")
        published_set.write_withdrawn(root, [e for e in published_set.read_withdrawn(root) if e is not listed[0]
                                             and (e["section"], e["run_id"]) != (section.KEY, run_id)] + [entry])
        published_set.regenerate(root, readme)
        return entry
    readers = named_as_input(root, section.KEY, run_id)
    if readers:
        raise PublishRefused(f"{run_id} is an input of {len(readers)} file(s), which would lose it: "
                             f"{', '.join(readers[:3])}{' ...' if len(readers) > 3 else ''}; "
                             f"point them at another run first")
    try:
        status = published_set.read_public(folder / PUBLIC_FILE)["status"]
    except published_set.PublishedSetError:  # a run recorded before public-results/3, or before run status
        try:
            status = RunFiles(folder).results.get("status") or "not recorded"
        except RunFileError:
            status = "unreadable"
    entry = {"section": section.KEY, "number": section.NUMBER, "title": section.TITLE, "run_id": run_id,
             "why": why, "superseded_by": superseded_by, "status": status,
             "withdrawn_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "commit": _last_commit_holding(folder)}
    validate_public(entry, "withdrawn")
    entries = [e for e in published_set.read_withdrawn(root) if (e["section"], e["run_id"]) != (section.KEY, run_id)]
    published_set.write_withdrawn(root, [*entries, entry])
    shutil.rmtree(folder)
    if not any(folder.parent.iterdir()):
        folder.parent.rmdir()
    published_set.regenerate(root, readme)
    return entry


__all__ = ["PublishRefused", "Published", "RunFileError", "public_document", "publish", "withdraw"]
