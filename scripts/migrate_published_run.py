"""One-off: give a run folder recorded before runs had a status (before the app layer, Dec 2026)
the record the current tools read, so that it can be verified and published again.

    python scripts/migrate_published_run.py SECTION RUN_DIR [--dry-run]
    python scripts/migrate_published_run.py SECTION RUN_DIR --rendered-again COMMIT WHY

What it changes, in ``results.json`` only (``raw/``, ``params.resolved.yaml``, ``env.json`` and
the executed notebook are not touched):

- ``checks``: the section's ``checks(run)`` recomputed from ``raw/`` and ``params.resolved.yaml``
  (the same call as ``kmesh verify``); ``check_counts``; ``status``: ``passed`` when no check
  failed, else ``failed`` (``RunRecord.finish``'s rule);
- ``finished_utc``: the executed notebook's papermill end time (the run's own clock), when it has one;
- a figure of ``results.json`` that a since-fixed bug computed wrongly, only where ``CORRECTIONS``
  names the run, the figure, the fix commit and why: recomputed from ``raw/`` by the section's own
  code; the old value is kept;
- ``migration``: the date, this script, the checkout's commit, a one-line summary, the checks as
  the run had recorded them (kept whole), the names recorded ok that now fail or are no longer
  computed, and every correction with its before and after.

A folder that already records a status is refused: nothing to migrate. Then publish the folder
with ``kmesh publish`` (``--allow-failed --why`` when its checks now fail).

``--rendered-again``: a migrated run whose notebook as measured cannot be shown whole (a table
pandas truncated before ``show_whole_tables``) and whose section renders from ``raw/``
(``kmesh run SECTION --source-run RUN_DIR``) is rendered again; this records it in ``migration``
with the commit that keeps the notebook as measured.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kmesh_lib.app import registry  # noqa: E402
from kmesh_lib.app.verify import recorded_statuses  # noqa: E402
from kmesh_lib.base.checks import summarize  # noqa: E402
from kmesh_lib.base.records import RunFiles, git_revision, write_json_atomic  # noqa: E402


def _family_hold_logprob_mismatches(run: RunFiles, results: dict) -> tuple[object, object]:
    from kmesh_lib.sections.family_hold import report
    from kmesh_lib.sections.family_hold.recorded import read_mode

    after = report.output_mismatches(read_mode(run, "real"), run.params.LOGPROB_TOLERANCE)
    before = results["real"]["logprob_mismatches"]
    results["real"]["logprob_mismatches"] = after
    return before, after


def _retention_arms(run: RunFiles, results: dict) -> tuple[object, object]:
    from kmesh_lib.sections.retention.report import arm_rows

    before, results["arms"] = results["arms"], arm_rows(run.raw("groups.jsonl"))
    return before, results["arms"]


# (section, run id) -> [(figure, fix commit, why, recompute(run, results) -> (before, after))]
CORRECTIONS = {
    ("family_hold", "gpu-20261129-214946"): [(
        "real.logprob_mismatches", "6ed526b",
        "the list compared chosen-token logprobs exactly and ignored LOGPROB_TOLERANCE=0.01, so the notebook's "
        "checks cell stopped a run within tolerance; recomputed from raw/requests.jsonl with the run's tolerance",
        _family_hold_logprob_mismatches)],
    ("retention", "cpu-20261129-201843"): [(
        "arms", "f262c61",
        "the table said 'device in 5/5' for the four control arms (engine floor and recompute), a byte agreement "
        "claimed from one counter on arms without an LMCache tier, and kept load_1m_median unrounded; "
        "recomputed from raw/groups.jsonl by the section's arm_rows",
        _retention_arms)],
}


def papermill_end(run_dir: Path, notebook: str) -> str | None:
    try:
        nb = json.loads((run_dir / notebook).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    end = (nb.get("metadata", {}).get("papermill") or {}).get("end_time")
    return str(end) if end else None


def migrate(section, run_dir: Path, dry_run: bool = False) -> dict:
    run = RunFiles(run_dir)
    results = run.results
    if isinstance(results.get("status"), str):
        raise SystemExit(f"{run_dir}: records status {results['status']!r} already; nothing to migrate")
    recorded_before = results.get("checks", {})
    corrected = {}
    for figure, commit, why, recompute in CORRECTIONS.get((section.KEY, run.run_id), []):
        before, after = recompute(run, results)
        corrected[figure] = {"fixed_in": commit, "why": why, "before": before, "after": after}
    if corrected and not dry_run:  # the checks read results.json: the corrected figures first
        write_json_atomic(run_dir / "results.json", results)
    checks = section.checks(RunFiles(run_dir))  # --dry-run: on the uncorrected file
    now = {c.name: c.status for c in checks}
    was = recorded_statuses({"checks": recorded_before})
    counts = summarize(checks)
    status = "passed" if checks and not counts["failed"] else "failed"
    migration = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "by": "scripts/migrate_published_run.py",
        "commit": git_revision().get("commit"),
        "summary": (f"recorded before runs had a status; status {status} recomputed from checks(run) "
                    f"({counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped); raw/ untouched"
                    + (f"; corrected {', '.join(corrected)} (a since-fixed bug)" if corrected else "")),
        "checks_recorded_before": recorded_before,
        "recorded_ok_now_not_ok": sorted(n for n, s in was.items() if s == "ok" and now.get(n, "ok") != "ok"),
        "recorded_not_computed_now": sorted(n for n in was if n not in now),
        "corrected": corrected,
    }
    results["checks"] = {c.name: c.as_record() for c in checks}
    results["check_counts"] = counts
    results["status"] = status
    end = papermill_end(run_dir, section.NOTEBOOK)
    if end and not results.get("finished_utc"):
        results["finished_utc"] = end
        migration["finished_utc_from"] = "the executed notebook's papermill end_time"
    results["migration"] = migration
    if not dry_run:
        write_json_atomic(run_dir / "results.json", results)
    return migration


def record_render(section, run_dir: Path, commit: str, why: str) -> dict:
    """After ``kmesh run SECTION --source-run RUN_DIR`` rendered a migrated run's notebook again from
    its raw/ (the notebook as measured could not be shown whole): says so in ``migration``, with
    where the notebook as measured stays (``git show COMMIT:outputs/<section>/<run_id>/<notebook>``)."""
    run = RunFiles(run_dir)
    results = run.results
    migration = results.get("migration")
    if not isinstance(migration, dict):
        raise SystemExit(f"{run_dir}: not a migrated run")
    where = f"git show {commit}:outputs/{section.KEY}/{run.run_id}/{section.NOTEBOOK}"
    migration["rendered_again"] = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                   "by": f"kmesh run {section.NUMBER} --source-run", "why": why,
                                   "notebook_as_measured": where}
    migration["summary"] += f"; notebook rendered again from raw/ (as measured: {where})"
    write_json_atomic(run_dir / "results.json", results)
    return migration


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("section")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="print what would be recorded; write nothing")
    parser.add_argument("--rendered-again", nargs=2, metavar=("COMMIT", "WHY"),
                        help="record that the notebook was rendered again from raw/ (kmesh run --source-run), "
                             "the notebook as measured staying in git at COMMIT")
    args = parser.parse_args(argv)
    section = registry.find(args.section)
    if args.rendered_again:
        print(f"{args.run_dir}: {record_render(section, args.run_dir, *args.rendered_again)['summary']}")
        return 0
    m = migrate(section, args.run_dir, args.dry_run)
    print(f"{args.run_dir}: {m['summary']}")
    for name in m["recorded_ok_now_not_ok"]:
        print(f"  recorded ok, now not ok: {name}")
    if m["recorded_not_computed_now"]:
        print(f"  recorded, no longer computed: {len(m['recorded_not_computed_now'])} checks (kept in migration)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
