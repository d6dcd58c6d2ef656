"""Brings published runs to the declared-results record (issue 41), once, keeping every correction.

For each run folder given (default: every run under outputs/, and every run copy docs/notes keeps as evidence):

1. every table the section declares (``TABLES``) is built from the run's files (``raw/`` untouched) and
   stored in results.json; where the stored table differed, the first differences and their count are
   kept under ``migration.declared_results`` (older code wrote fewer columns, or rounded otherwise);
   a results.json key that is neither declared nor a run field is moved under
   ``migration.undeclared_figures`` with its value;
2. the checks are recomputed (``section.checks``) and recorded. A check the run recorded as ok that now
   fails or skips stops the migration of that run: the record is never narrowed to fit. A check whose
   status changes otherwise (new, removed, a recorded failure that now passes) is listed under
   ``migration.checks``; status and check_counts are recomputed from them;
3. ``capture_sha256`` hashes the published files as they stand, marked as hashed at migration (not at
   measurement: these runs predate the record), with any correction of env.json stated first;
4. ``public-results.json`` is built again (``app.public_document``), the publishing facts (failure note,
   shared captures, rewritten captures) carried over, and the run must then verify as it did.

    python scripts/migrate_declared_results.py [RUN_DIR ...] [--dry-run]

``--renamed-arms`` is a later pass over runs already on the declared record (issue 41's vocabulary: the arm whose
context is already in vLLM's KV is ``resident`` in every section; sections 16 and 21 recorded "floor", section 20
"engine"). The captures keep the old word and read as ``resident`` (each record class's ``renamed_values``), and a
recorded params file too (``base.params.RENAMED_VALUES``); so the declared tables rebuilt from them now say
``resident``. The pass stores every table that differs as rebuilt, re-records each check whose name held the old
word under its new name (its status must be the one recorded: a rename changes no verdict), leaves raw/, env.json,
params.resolved.yaml and every other check as they are, notes the pass under ``migration.renamed`` and builds
public-results.json again; the run must verify exactly as before (same line kinds).

    python scripts/migrate_declared_results.py --renamed-arms [RUN_DIR ...]   (default: runs of 16, 20, 21)

``--rebuilt-tables WHY`` is the same pass for a change of what a declared table holds (a column added, a figure now
computed otherwise): every table that differs is stored as rebuilt, every check must keep its recorded status (a
record whose details changed is stored as computed now, and listed), raw/, env.json and params.resolved.yaml stay,
the pass and its WHY go under ``migration.rebuilt``, and the run must verify with the same failed checks.

    python scripts/migrate_declared_results.py --rebuilt-tables "WHY" RUN_DIR ...

``--redrawn-figures WHY`` draws a published run's figures again from its own files, as its notebook draws them (the
section's ``figures(run, out_dir)``, which the notebook's cells call too), after the figure code changed: each
``figures/<name>`` whose pixels differ from the redraw is replaced (a palette PNG where that is a fifth smaller, as
publish stores it: ``app.compact.palette_figures``), and the pass (WHY, each figure replaced, the rest unchanged) goes
under ``migration.redrawn``. results.json's tables and checks, raw/, env.json and params.resolved.yaml stay; the
executed notebook keeps its outputs, each image output still referring to its figures/ file (so it shows the redrawn
one), its ``metadata.kmesh_figure.displayed`` the image the notebook displayed when it ran and ``redrawn`` the pass.
Re-render the report after (``kmesh report``).

    python scripts/migrate_declared_results.py --redrawn-figures "WHY" [--only-figure NAME ...] RUN_DIR ...

``--only-figure NAME`` (repeatable) limits the pass to those figure files: a figure that differs for another reason
(code changed since the run was drawn, not what WHY says) stays as published and is named under ``left_as_published``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kmesh_lib.app import registry as sections  # noqa: E402
from kmesh_lib.app.public_document import public_document  # noqa: E402
from kmesh_lib.app.published import PUBLIC_FILE  # noqa: E402
from kmesh_lib.app.verify import recomputed_status, verify  # noqa: E402
from kmesh_lib.base.checks import STATUSES, differences  # noqa: E402
from kmesh_lib.base.declared import RUN_FIELDS, build_tables, named  # noqa: E402
from kmesh_lib.base.paths import REPO_ROOT, repo_relative  # noqa: E402
from kmesh_lib.base.records import (  # noqa: E402
    RunFiles,
    capture_sha256,
    git_revision,
    read_json_object,
    write_json_atomic,
)

# Corrections of a recorded environment, by run: (dotted key, recorded, corrected, why)
ENV_CORRECTIONS = {
    "retention/gpu-20261204-030256-da21": [
        ("git.commit", "6932d2f6e8e6b10d8b8ed6a47c4f8f8de2d1ea1c", "6932d2f",
         "the commit was typed into KMESH_GIT_COMMIT on the GPU machine and does not exist; the run's tree was "
         "6932d2f (vLLM's own tiers as a path), the only commit with that prefix, resolved by git here"),
    ],
}


class Refused(Exception):
    pass


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def relative_paths(record: dict) -> dict:
    """A check record with this checkout's paths made relative, as publish writes them (a detail may name a file)."""
    text = json.dumps(record)
    for absolute, relative in ((f"{REPO_ROOT}/", ""), (f"{REPO_ROOT.parent}/", "../")):
        text = text.replace(absolute, relative)
    return json.loads(text)


def resolve_commit(prefix: str) -> str:
    """The one commit of this repository that ``prefix`` names (git resolves it; never typed in full)."""
    import subprocess

    out = subprocess.run(["git", "rev-parse", "--verify", "-q", f"{prefix}^{{commit}}"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=30).stdout.strip()
    if len(out) != 40:
        raise Refused(f"commit {prefix}: git cannot resolve it to one commit here")
    return out


def correct_env(run_dir: Path, key: str, corrections: list[tuple]) -> list[dict]:
    path = run_dir / "env.json"
    env = read_json_object(path)
    done = []
    for dotted, recorded, prefix, why in corrections:
        corrected = resolve_commit(prefix)
        *parents, leaf = dotted.split(".")
        node = env
        for part in parents:
            node = node[part]
        if node.get(leaf) == corrected:
            continue
        if node.get(leaf) != recorded:
            raise Refused(f"{key}: env.json {dotted} is {node.get(leaf)!r}, expected {recorded!r} to correct")
        node[leaf] = corrected
        done.append({"file": "env.json", "key": dotted, "recorded": recorded, "corrected": corrected, "why": why})
    if done:
        write_json_atomic(path, env)
    return done


def migrate(run_dir: Path, dry_run: bool = False) -> dict:
    key = f"{run_dir.parent.name}/{run_dir.name}"
    section = sections.get(read_json_object(run_dir / "results.json").get("section") or run_dir.parent.name)
    run = RunFiles(run_dir)
    results = run.results
    before = verify(section, RunFiles(run_dir))
    note: dict = {"when_utc": _now(), "by": "scripts/migrate_declared_results.py",
                  "commit": git_revision().get("commit")}

    built = build_tables(section.TABLES, run, results)  # a table's live fields kept as the run recorded them
    changed_tables = {}
    for name, value in built.items():
        found = differences(value, results.get(name), name)
        if found:
            changed_tables[name] = {"num_differences": len(found), "first": found[:3]}
        results[name] = value
    declared = named(section.TABLES, run)
    undeclared = {k: results.pop(k) for k in list(results) if k not in declared and k not in RUN_FIELDS}
    if changed_tables:
        note["declared_results"] = changed_tables
    if undeclared:
        note["undeclared_figures"] = undeclared

    recorded = {name: rec.get("status") for name, rec in (results.get("checks") or {}).items()}
    probe = dict(results)
    write = run_dir / "results.json"
    original_text = write.read_text(encoding="utf-8")
    write_json_atomic(write, probe)  # the checks read results.json (their figure checks): give them the tables
    try:
        checks = section.checks(RunFiles(run_dir))
    finally:
        if dry_run:
            write.write_text(original_text, encoding="utf-8")
    narrowed = [f"{c.name}: recorded ok, now {c.status} ({c.detail})" for c in checks
                if recorded.get(c.name) == "ok" and c.status != "ok" and not c.outside_input]
    if narrowed:
        write.write_text(original_text, encoding="utf-8")
        raise Refused(f"{key}: {len(narrowed)} recorded ok checks do not hold now: {narrowed[0][:300]}")
    check_changes = [{"name": c.name, "recorded": recorded.get(c.name), "recomputed": c.status}
                     for c in checks if recorded.get(c.name) != c.status and not c.outside_input]
    computed = {c.name for c in checks}
    check_changes += [{"name": n, "recorded": s, "recomputed": None} for n, s in recorded.items() if n not in computed]
    if check_changes:
        note["checks"] = check_changes
    before_checks = results.get("checks") or {}
    kept = {c.name: (before_checks[c.name] if c.name in before_checks and (c.outside_input or recorded[c.name] == c.status)
                     else relative_paths(c.as_record())) for c in checks}
    results["checks"] = kept
    counts = {s: sum(rec.get("status") == s for rec in kept.values()) for s in STATUSES}
    status = recomputed_status([c for c in checks if not c.outside_input], results)
    if status != results.get("status"):
        note["status"] = {"recorded": results.get("status"), "recomputed": status}
    results["status"], results["check_counts"] = status, counts

    corrections = ENV_CORRECTIONS.get(key, [])
    if corrections and not dry_run:
        note["env_corrections"] = correct_env(run_dir, key, corrections)
    note["capture_sha256"] = ("hashed at migration from the published files as they stood (the run predates "
                              "hashing at measurement)" + ("; env.json after the correction above" if corrections else ""))
    results["capture_sha256"] = capture_sha256(RunFiles(run_dir))
    migration = results.get("migration") if isinstance(results.get("migration"), dict) else {}
    migration.setdefault("to_declared_results", []).append(note)  # a later pass adds its own note
    results["migration"] = migration
    if dry_run:
        return note
    write_json_atomic(write, results, compact=True)

    public_path = run_dir / PUBLIC_FILE
    if not public_path.exists():  # a local run: publish builds its document
        note["verify_after"] = verify(section, RunFiles(run_dir)).summary()
        return note
    rebuild_public(run_dir)  # the document built from the run alone, as publish builds it
    after = verify(section, RunFiles(run_dir))
    problems = [line.text() for line in after.problems]
    if before.ok and not after.ok:
        print("  note: verify ok before, not ok after")
    note["verify_after"] = after.summary()
    if problems:
        note["problems_after"] = problems[:5]
    return note


def rebuild_public(run_dir: Path) -> str:
    """public-results.json built again from the run, the publishing facts carried over (no record changes)."""
    section = sections.get(read_json_object(run_dir / "results.json").get("section") or run_dir.parent.name)
    path = run_dir / PUBLIC_FILE
    if not path.exists():
        return "not published: no document"
    stated = read_json_object(path)
    kept = path.with_name(path.name + ".before")
    path.rename(kept)  # the document is built from the run alone; the stated one comes back if building fails
    try:
        verdict = verify(section, RunFiles(run_dir))
        allowed_failed = verdict.status != "passed" or bool(verdict.problems)
        doc = public_document(section, RunFiles(run_dir), verdict, allowed_failed, stated.get("failure_note") or "",
                              stated.get("shared_captures"), stated.get("captures_with_paths_rewritten"))
    except Exception:
        kept.rename(path)
        raise
    write_json_atomic(path, doc, compact=True)
    kept.unlink()
    return verify(section, RunFiles(run_dir)).summary()


def store_rebuilt_tables(section, run: RunFiles, results: dict) -> dict[str, int]:
    """Each declared table as the code builds it from ``run``, stored into ``results`` where it differs from the
    recorded one; returns table name -> number of differences, for the pass's note."""
    changed = {}
    for name, value in build_tables(section.TABLES, run, results).items():
        found = differences(value, results.get(name), name)
        if found:
            changed[name] = len(found)
            results[name] = value
    return changed


# issue 41: the old name of the arm already in vLLM's KV, per section (a check's name may hold it as a word)
RENAMED_ARM = {"retention": "floor", "prefetch": "engine", "crossover": "floor"}
RENAMED_SUMMARY = "arm renamed {old}\u2192resident (issue 41 vocabulary)"


def renamed_check_name(name: str, old: str) -> str:
    return re.sub(rf"\b{old}\b", "resident", name)


def rename_arms(run_dir: Path) -> dict:
    """The ``--renamed-arms`` pass over one run (module docstring); returns its note. Raises Refused."""
    key = f"{run_dir.parent.name}/{run_dir.name}"
    section = sections.get(read_json_object(run_dir / "results.json").get("section") or run_dir.parent.name)
    old = RENAMED_ARM.get(section.KEY)
    if old is None:
        raise Refused(f"{key}: section {section.KEY} has no renamed arm")
    kept_files = {name: (run_dir / name).read_bytes() for name in ("env.json", "params.resolved.yaml")}
    run = RunFiles(run_dir)
    results = run.results
    if any(isinstance(n, dict) and n.get("summary", "").startswith(f"arm renamed {old}") for n in
           (results.get("migration") or {}).get("renamed", [])):
        return {"skipped": "renamed already"}
    note: dict = {"when_utc": _now(), "by": "scripts/migrate_declared_results.py --renamed-arms",
                  "commit": git_revision().get("commit"), "summary": RENAMED_SUMMARY.format(old=old)}

    changed_tables = store_rebuilt_tables(section, run, results)
    write = run_dir / "results.json"
    original_text = write.read_text(encoding="utf-8")
    write_json_atomic(write, results, compact=True)  # the checks read results.json (their figure checks)
    try:
        checks = {c.name: c for c in section.checks(RunFiles(run_dir))}
        recorded = results.get("checks") or {}
        renamed_checks, kept = [], {}
        for name, record in recorded.items():
            new = name if name in checks else renamed_check_name(name, old)
            check = checks.get(new)
            if new != name:
                if check is None or new in recorded:
                    raise Refused(f"{key}: recorded check {name[:120]!r} is not computed now, nor renamed")
                if check.status != record.get("status"):
                    raise Refused(f"{key}: check {new[:120]!r} recorded {record.get('status')}, now {check.status}")
                renamed_checks.append({"recorded": name, "now": new})
                kept[new] = relative_paths(check.as_record())
            else:
                kept[name] = record
        results["checks"] = kept
    except Exception:
        write.write_text(original_text, encoding="utf-8")
        raise
    if not (changed_tables or renamed_checks):  # a run without the arm (a GPU-buffer-only run): nothing to note
        write.write_text(original_text, encoding="utf-8")
        return {"skipped": "no table or check names the arm"}
    if changed_tables:
        note["tables_rebuilt"] = changed_tables
    if renamed_checks:
        note["checks_renamed"] = renamed_checks
    failed = sorted(n for n, rec in kept.items() if rec.get("status") == "failed")
    try:
        return _record_pass(run_dir, section, key, results, "renamed", note, kept_files, failed, "the rename")
    except Refused:  # as every other refusal: the run stays as it was
        write.write_text(original_text, encoding="utf-8")
        rebuild_public(run_dir)
        raise


def rebuild_tables(run_dir: Path, why: str) -> dict:
    """The ``--rebuilt-tables`` pass over one run (module docstring); returns its note. Raises Refused."""
    key = f"{run_dir.parent.name}/{run_dir.name}"
    section = sections.get(read_json_object(run_dir / "results.json").get("section") or run_dir.parent.name)
    kept_files = {name: (run_dir / name).read_bytes() for name in ("env.json", "params.resolved.yaml")}
    run = RunFiles(run_dir)
    results = run.results
    changed_tables = store_rebuilt_tables(section, run, results)
    if not changed_tables:
        return {"skipped": "every declared table is as the code builds it"}
    write, public = run_dir / "results.json", run_dir / PUBLIC_FILE
    original_text = write.read_text(encoding="utf-8")
    original_public = public.read_bytes() if public.exists() else None
    write_json_atomic(write, results, compact=True)  # the checks read results.json (their figure checks)
    try:  # from here any failure, a refusal or not, leaves results.json and public-results.json as they were
        return _rebuild_tables_recorded(run_dir, section, key, why, results, changed_tables, kept_files)
    except BaseException:
        write.write_text(original_text, encoding="utf-8")
        if original_public is not None:
            public.write_bytes(original_public)
        raise


def _rebuild_tables_recorded(run_dir: Path, section, key: str, why: str, results: dict, changed_tables: dict,
                             kept_files: dict) -> dict:
    """``rebuild_tables`` once results.json holds the rebuilt tables: the checks, the note, the verify after."""
    checks = {c.name: c for c in section.checks(RunFiles(run_dir))}
    recorded = results.get("checks") or {}
    redetailed = []
    for name, record in recorded.items():
        check = checks.get(name)
        if check is None or check.status != record.get("status"):
            raise Refused(f"{key}: check {name[:120]!r} recorded {record.get('status')}, now "
                          f"{check.status if check else 'not computed'} (this pass changes no verdict)")
        now = relative_paths(check.as_record())
        if now != record:
            recorded[name] = now
            redetailed.append(name)
    # a later check the run predates (skipped: its evidence is a capture the run never made) stays left out, as
    # verify leaves it out (``Check.predates``)
    unrecorded = sorted(n for n, c in checks.items() if n not in recorded and not (c.predates and c.status == "skipped"))
    if unrecorded:
        raise Refused(f"{key}: checks computed now that the run never recorded: {unrecorded}")
    revision = git_revision()  # dirty: the code that rebuilt the tables is not yet that commit's (not yet committed)
    note = {"when_utc": _now(), "by": "scripts/migrate_declared_results.py --rebuilt-tables",
            "commit": revision.get("commit"), "dirty": revision.get("dirty"), "why": why, "tables_rebuilt": changed_tables}
    if redetailed:
        note["checks_redetailed"] = redetailed
    failed = sorted(n for n, rec in recorded.items() if rec.get("status") == "failed")
    return _record_pass(run_dir, section, key, results, "rebuilt", note, kept_files, failed, "the rebuild")


def _record_pass(run_dir: Path, section, key: str, results: dict, kind: str, note: dict, kept_files: dict,
                 failed: list[str], what: str) -> dict:
    """Appends ``note`` to results.json's ``migration.<kind>`` and holds the run to its record after the pass:
    env.json and params.resolved.yaml as they were (``kept_files``), public-results.json built again, and verify with
    no record problem and the same failed checks (``failed``). Returns the note with the verify summary; raises
    Refused, the caller restoring what its pass changed."""
    migration = results.get("migration") if isinstance(results.get("migration"), dict) else {}
    migration.setdefault(kind, []).append(note)
    results["migration"] = migration
    write_json_atomic(run_dir / "results.json", results, compact=True)
    if any((run_dir / name).read_bytes() != data for name, data in kept_files.items()):
        raise Refused(f"{key}: env.json or params.resolved.yaml changed (never: they are the record); results.json "
                      "restored")
    note["public"] = rebuild_public(run_dir)
    after = verify(section, RunFiles(run_dir))
    if after.record_problems or sorted(c.name for c in after.checks if c.status == "failed") != failed:
        raise Refused(f"{key}: does not verify as recorded after {what} ({after.summary()}); results.json and "
                      "public-results.json restored")
    note["verify_after"] = after.summary()
    return note


def _pixels(path: Path):
    """The figure's pixels as RGB (a palette PNG and the RGBA one it was made from compare by what they show)."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def redraw_figures(run_dir: Path, why: str, only: list[str] | None = None) -> dict:
    """The ``--redrawn-figures`` pass over one run (module docstring); returns its note. Raises Refused. ``only``: the
    figure file names this pass may replace (``--only-figure``); another that differs stays as published, named under
    ``left_as_published`` (its change is not this pass's WHY)."""
    import tempfile

    import numpy as np

    from kmesh_lib.app.compact import FIGURES, compact_notebook, palette_figures

    key = f"{run_dir.parent.name}/{run_dir.name}"
    section = sections.get(read_json_object(run_dir / "results.json").get("section") or run_dir.parent.name)
    draw = getattr(section, "figures", None)
    if draw is None:
        raise Refused(f"{key}: section {section.KEY} declares no figures(run, out_dir) to redraw them with")
    kept_files = {name: (run_dir / name).read_bytes() for name in ("env.json", "params.resolved.yaml")}
    before = verify(section, RunFiles(run_dir))
    redrawn, unchanged, not_published, left = {}, [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)  # laid out as the run: figures/ stored as publish stores them, then compared by their pixels
        drawn = draw(RunFiles(run_dir), out / FIGURES)
        palette_figures(out, section.NOTEBOOK)  # no notebook there: the files alone
        for name in drawn:
            published, now_path = run_dir / FIGURES / name, out / FIGURES / name
            if not published.is_file():  # the notebook as it ran drew no such figure: its outputs name none to show it
                not_published.append(name)
                continue
            was, now = _pixels(published), _pixels(now_path)
            if was.shape == now.shape and np.array_equal(was, now):
                unchanged.append(name)
                continue
            if only is not None and name not in only:
                left.append(name)
                continue
            redrawn[name] = (f"{was.shape[1]}x{was.shape[0]} px -> {now.shape[1]}x{now.shape[0]} px" if was.shape != now.shape
                             else f"{int(np.any(was != now, axis=2).sum())} of {was.shape[0] * was.shape[1]} pixels differ")
        if not redrawn:
            return {"skipped": f"every figure is as the code draws it ({', '.join(unchanged) or 'none drawn'})"
                    + (f", but for {', '.join(left)}, not asked for (--only-figure)" if left else "")}
        stored = {}
        for name in redrawn:
            data = (out / FIGURES / name).read_bytes()
            (run_dir / FIGURES / name).write_bytes(data)
            stored[f"{FIGURES}/{name}"] = hashlib.sha256(data).hexdigest()
    revision = git_revision()  # dirty: the code that drew them is not yet that commit's (not yet committed)
    note = {"when_utc": _now(), "by": "scripts/migrate_declared_results.py --redrawn-figures",
            "commit": revision.get("commit"), "dirty": revision.get("dirty"), "why": why,
            "figures_redrawn": {f"{FIGURES}/{n}": d for n, d in redrawn.items()},
            "figures_unchanged": [f"{FIGURES}/{n}" for n in unchanged],
            "notebook": ("the executed notebook's outputs are as it ran; each image output refers to its figures/ file "
                         "and so shows the redrawn figure; its metadata.kmesh_figure.displayed is the image displayed "
                         "when the notebook ran, its redrawn this pass")}
    if not_published:
        note["not_published"] = not_published  # drawn now, never shown by the notebook as it ran: left out
    if left:
        note["left_as_published"] = [f"{FIGURES}/{n}" for n in left]  # they differ too, for reasons not this WHY
    _mark_notebook(run_dir / section.NOTEBOOK, stored, {k: note[k] for k in ("when_utc", "by", "why")})
    compact_notebook(run_dir, section.NOTEBOOK)  # nbformat wrote it indented: back to the published format
    original = (run_dir / "results.json").read_bytes()
    failed = sorted(c.name for c in before.checks if c.status == "failed")
    try:
        return _record_pass(run_dir, section, key, read_json_object(run_dir / "results.json"), "redrawn", note,
                            kept_files, failed, "the redraw (the figures stay redrawn)")
    except Refused:
        (run_dir / "results.json").write_bytes(original)
        rebuild_public(run_dir)
        raise


def _mark_notebook(path: Path, stored: dict[str, str], mark: dict) -> None:
    """Adds ``mark`` with the file's new SHA-256 to ``metadata.kmesh_figure.redrawn`` of each image output of the
    notebook that shows one of ``stored`` (figures/<name> -> SHA-256; appended: a figure redrawn twice keeps both
    passes); ``displayed`` stays the image the notebook displayed when it ran."""
    import nbformat

    if not path.is_file():
        return
    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            figure = out.get("metadata", {}).get("kmesh_figure")
            if figure and figure.get("file") in stored:
                figure["redrawn"] = [*figure.get("redrawn", []), {**mark, "sha256": stored[figure["file"]]}]
    nbformat.write(nb, str(path))


def default_runs() -> list[Path]:
    published = sorted(p for p in (REPO_ROOT / "outputs").glob("*/*") if (p / "results.json").is_file())
    known = set(sections.SECTIONS)
    notes = sorted(p.parent for p in (REPO_ROOT / "docs" / "notes").rglob("results.json")
                   if json.loads(p.read_text()).get("section") in known)
    return published + notes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="*", type=Path)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--renamed-arms", action="store_true",
                    help="issue 41: rebuild the tables and check names that now say 'resident' (sections 16, 20, 21)")
    ap.add_argument("--rebuilt-tables", metavar="WHY",
                    help="store each declared table as the code now builds it (a column added, a figure computed "
                         "otherwise), every check's status unchanged; WHY is recorded with the pass")
    ap.add_argument("--redrawn-figures", metavar="WHY",
                    help="draw each run's figures again from its files as its notebook draws them (the section's "
                         "figures()) and replace those that differ; WHY is recorded with the pass")
    ap.add_argument("--only-figure", metavar="NAME", action="append",
                    help="with --redrawn-figures: replace only this figure file (repeatable; e.g. floor_distance.png); "
                         "the others that differ stay as published and are named in the pass")
    ap.add_argument("--public-only", action="store_true",
                    help="only build public-results.json again (the document gained a field; the record is unchanged)")
    args = ap.parse_args(argv)
    if args.dry_run and (args.renamed_arms or args.rebuilt_tables or args.redrawn_figures or args.public_only):
        ap.error("--dry-run previews the declared-results pass only: --renamed-arms, --rebuilt-tables and "
                 "--public-only write (run them on a copy to preview)")
    run_dirs = args.run_dirs or default_runs()
    status = 0
    for run_dir in run_dirs:
        key = repo_relative(run_dir) or str(run_dir)
        if args.renamed_arms:
            if (read_json_object(run_dir / "results.json").get("section") or run_dir.parent.name) not in RENAMED_ARM:
                continue
            try:
                note = rename_arms(run_dir.resolve())
            except Refused as e:
                print(f"REFUSED {e}")
                status = 1
                continue
            print(f"{key}: tables {note.get('tables_rebuilt', {})}, checks renamed {len(note.get('checks_renamed', []))}; "
                  f"{note.get('verify_after', note.get('skipped'))}")
            continue
        if args.rebuilt_tables:
            try:
                note = rebuild_tables(run_dir.resolve(), args.rebuilt_tables)
            except Refused as e:
                print(f"REFUSED {e}")
                status = 1
                continue
            print(f"{key}: tables {note.get('tables_rebuilt', {})}, checks redetailed "
                  f"{len(note.get('checks_redetailed', []))}; {note.get('verify_after', note.get('skipped'))}")
            continue
        if args.redrawn_figures:
            section = sections.get(read_json_object(run_dir / "results.json").get("section") or run_dir.parent.name)
            if not hasattr(section, "figures"):  # a section that draws no figure from its record yet (default runs)
                continue
            try:
                note = redraw_figures(run_dir.resolve(), args.redrawn_figures, args.only_figure)
            except Refused as e:
                print(f"REFUSED {e}")
                status = 1
                continue
            print(f"{key}: figures redrawn {note.get('figures_redrawn', {})}; "
                  f"{note.get('verify_after', note.get('skipped'))}")
            continue
        if args.public_only:
            print(f"{key}: {rebuild_public(run_dir.resolve())}")
            continue
        try:
            note = migrate(run_dir.resolve(), args.dry_run)
        except Refused as e:
            print(f"REFUSED {e}")
            status = 1
            continue
        print(f"{key}: tables rebuilt {sorted(note.get('declared_results', {}))}, undeclared "
              f"{sorted(note.get('undeclared_figures', {}))}, checks changed {len(note.get('checks', []))}; "
              f"{note.get('verify_after', 'dry run')}")
        for line in note.get("problems_after", []):
            print(f"  {line}")
    return status


if __name__ == "__main__":
    sys.exit(main())
