"""``kmesh verify``: recompute a run's checks from its files and hold the record against them.

The recomputation is the section's own ``checks(RunFiles(run_dir))``, the same function the
notebook's checks cell called. A run passes verify when:

- its status is finished (``passed`` or ``failed``; not ``running`` or ``interrupted``);
- every recorded file reads (a damaged one is a ``RunFileError``: one line naming the file);
- no recomputed check failed;
- every check recomputes with the status the run recorded for it, and the record holds every check
  the section computes (a recorded ok that now fails, a recorded failure that now passes, a check no
  longer computed or never recorded is a mismatch). One exception: a check skipped here for an input
  outside the run folder that this machine lacks (``Check.outside_input``: section 17's corpus in a
  clone without the data) is ``unavailable``, listed and counted, not a mismatch: the run's own files
  are intact. And a check the run never recorded that is skipped because the run predates its evidence
  (``Check.predates``: a capture a later version of the section records) is left out of the verdict and named
  in its summary: the record is held to what the section could state about it when it ran;
- the record itself holds (``RecordLine``): the status and ``check_counts`` recompute from the checks;
  every table ``results.json`` holds is one the section declares and equals the one built from the
  run's files (``base.declared``); every file hashed when the run finished (``capture_sha256``: each
  capture, the params, the environment) still has that hash; and ``public-results.json``, where the
  run is published, is the document ``app.public_document`` builds from the run.

A skipped check is reported but is not a failure; it is not a pass either.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType

from kmesh_lib.app.registry import call_section
from kmesh_lib.base.checks import STATUSES, Check, differences, summarize
from kmesh_lib.base.declared import compare_tables
from kmesh_lib.base.records import (
    FINISHED,
    RunFileError,
    RunFiles,
    capture_sha256,
    effective_status,
    read_json_object,
)

PUBLIC_FILE = "public-results.json"


@dataclass
class Line:
    """One verify line: a check as recomputed (None: no longer computed) and as recorded (None: not)."""

    name: str
    recomputed: str | None
    recorded: str | None
    detail: str = ""
    recorded_only: bool = False
    outside_input: str = ""

    @property
    def kind(self) -> str:
        """ok | failed | skipped as recomputed; mismatch: recorded ok, recomputed not ok; missing:
        recorded, not recomputed; unavailable: recorded ok, skipped here for want of an input
        outside the run folder."""
        if self.recomputed is None:
            return "missing"
        if self.recorded is None:
            return "unrecorded"
        if self.recorded == "ok" and self.recomputed == "skipped" and self.outside_input:
            return "unavailable"
        if self.recorded != self.recomputed:
            return "mismatch"
        return self.recomputed

    @property
    def is_problem(self) -> bool:
        return self.kind in ("failed", "mismatch", "missing")

    def text(self) -> str:
        label = {"ok": "ok", "failed": "FAILED", "skipped": "skipped", "mismatch": "MISMATCH",
                 "missing": "MISSING", "unrecorded": "UNRECORDED", "unavailable": "n/a here"}[self.kind]
        notes = []
        if self.recorded is None:
            notes.append("computed, not in the run's record")
        elif self.recorded != self.recomputed:
            notes.append(f"recorded {self.recorded}, recomputed {self.recomputed or 'nothing'}")
        if self.kind == "unavailable":
            notes.append(f"needs {self.outside_input}, not on this machine")
        elif self.detail and self.kind != "ok":
            notes.append(self.detail)
        if self.recorded_only:
            notes.append("recorded only: not recomputable from raw/")
        return f"{label:<9}{self.name}" + (f" ({'; '.join(notes)})" if notes else "")


@dataclass(frozen=True)
class RecordLine:
    """One statement about the record itself (status, counts, a declared table, hashes, the public file)."""

    name: str
    problems: tuple[str, ...] = ()
    note: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    def text(self) -> str:
        label = "ok" if self.ok else "MISMATCH"
        detail = "; ".join(self.problems) if self.problems else self.note
        return f"{label:<9}{self.name}" + (f" ({detail})" if detail else "")


@dataclass
class Verdict:
    """The outcome of verifying one run."""

    run_id: str
    status: str
    lines: list[Line] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    record_lines: list[RecordLine] = field(default_factory=list)
    predated: list[Check] = field(default_factory=list)  # unrecorded checks skipped because the run predates them

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @property
    def problems(self) -> list[Line | RecordLine]:
        """Failed checks, contradicted records, and, for a run recorded as passed, checks its record lacks (a
        passed record must hold every check; a failed run's record may have stopped short of them)."""
        unrecorded = self.status == "passed"
        return ([line for line in self.lines if line.is_problem or (unrecorded and line.kind == "unrecorded")]
                + [r for r in self.record_lines if not r.ok])

    @property
    def ok(self) -> bool:
        return self.finished and bool(self.checks) and not self.problems

    @property
    def record_problems(self) -> list[Line | RecordLine]:
        """The problems that say the record is not what the run measured (a failed check is a finding, not one)."""
        return [p for p in self.problems if not (isinstance(p, Line) and p.kind == "failed")]

    def summary(self) -> str:
        counts = summarize(self.checks)
        mismatches = sum(line.kind in ("mismatch", "missing") or (line.kind == "unrecorded" and self.status == "passed")
                         for line in self.lines)
        record = sum(not r.ok for r in self.record_lines)
        unavailable = sum(line.kind == "unavailable" for line in self.lines)
        verdict = "verified" if self.ok else "NOT verified"
        why = []
        if not self.finished:
            why.append(f"status {self.status}: the run did not finish")
        if not self.checks:
            why.append("no checks computed")
        if unavailable:
            why.append(f"{unavailable} recorded ok, not recomputable here (an input outside the run is absent)")
        if self.predated:
            why.append(f"{len(self.predated)} later check(s) this run predates, left out (skipped: "
                       + "; ".join(sorted({c.predates for c in self.predated}))[:200] + ")")
        if record:
            why.append(f"{record} of {len(self.record_lines)} record statements fail: "
                       + ", ".join(r.name for r in self.record_lines if not r.ok)[:200])
        return (f"{verdict}: {counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped, "
                f"{mismatches} recorded/recomputed mismatches" + (f"; {'; '.join(why)}" if why else ""))


def recorded_statuses(results: dict) -> dict[str, str]:
    """``results["checks"]`` as name -> status; a malformed record is a RunFileError."""
    recorded = results.get("checks", {})
    if not isinstance(recorded, dict):
        raise RunFileError("results.json: 'checks' is not an object")
    statuses = {}
    for name, rec in recorded.items():
        if not isinstance(rec, dict):
            raise RunFileError(f"results.json: check {name!r} is not an object")
        status = rec.get("status", "ok" if rec.get("ok") is True else "failed")
        statuses[name] = status if status in ("ok", "failed", "skipped") else "failed"
    return statuses


def recomputed_status(checks: list[Check], results: dict) -> str:
    """What ``RunRecord.finish`` and ``end_run`` would record from these checks: passed when there are checks,
    none failed and no error was recorded after them; interrupted stays interrupted."""
    if results.get("status") == "interrupted":
        return "interrupted"
    failed = not checks or any(c.status == "failed" for c in checks) or bool(results.get("error"))
    return "failed" if failed else "passed"


def record_counts(results: dict) -> dict[str, int]:
    """``check_counts`` as ``RunRecord.finish`` computes them from the recorded checks."""
    statuses = recorded_statuses(results)
    return {s: sum(v == s for v in statuses.values()) for s in STATUSES}


def stopped_before_checks(results: dict) -> str:
    """Why results.json lacks what the checks cell records (its checks, ``check_counts``, ``capture_sha256``), where
    the run says: its notebook stopped at an earlier cell (``end_run``'s error) before ``RunRecord.finish``."""
    error = results.get("error")
    if not isinstance(error, dict) or results.get("finished_utc"):
        return ""
    where = f"cell {error['cell']}" if error.get("cell") is not None else error.get("kind", "a cell")
    return (f": the notebook stopped at {where} ({error.get('ename')}: {str(error.get('evalue'))[:120]}) before its "
            "checks cell recorded them (RunRecord.finish), and nothing recorded them since")


def hash_lines(run: RunFiles, results: dict) -> RecordLine:
    recorded = results.get("capture_sha256")
    if not isinstance(recorded, dict) or not recorded:
        return RecordLine("file hashes recorded when the run finished",
                          ("results.json records no capture_sha256" + stopped_before_checks(results),))
    now = capture_sha256(run)
    problems = [f"{name}: hashed {recorded[name][:12]}, now {now[name][:12]}" for name in recorded
                if name in now and now[name] != recorded[name]]
    problems += [f"{name}: hashed, now absent" for name in recorded if name not in now]
    problems += [f"{name}: present, never hashed" for name in now if name not in recorded]
    return RecordLine("file hashes recorded when the run finished (captures, params, env)", tuple(problems[:5]),
                      f"{len(recorded)} files")


def public_line(section: ModuleType, run: RunFiles, verdict: Verdict) -> RecordLine | None:
    """The published document rebuilt from the run and compared (None: the run is not published here)."""
    from kmesh_lib.app.public_document import PUBLISHING_FIELDS, public_document

    path = run.run_dir / PUBLIC_FILE
    if not path.exists():
        return None
    name = f"{PUBLIC_FILE} rebuilt from the run"
    stated = read_json_object(path)
    given = {k: stated.get(k) for k in PUBLISHING_FIELDS}
    allowed_failed = verdict.status != "passed" or bool(verdict.problems)
    try:
        rebuilt = public_document(section, run, verdict, allowed_failed, given["failure_note"] or "",
                                  given["shared_captures"], given["captures_with_paths_rewritten"])
    except Exception as e:  # noqa: BLE001 - a document that cannot be rebuilt is a finding about the run
        return RecordLine(name, (f"cannot be rebuilt: {type(e).__name__}: {e}"[:300],))
    as_recorded(rebuilt, verdict)
    found = differences(rebuilt, stated, "public")
    return RecordLine(name, tuple(found[:5]) + ((f"... {len(found) - 5} more",) if len(found) > 5 else ()))


def as_recorded(document: dict, verdict: Verdict) -> None:
    """A rebuilt public document with each check this machine cannot recompute (``unavailable``: an input outside
    the run is absent) under the status the run recorded, as the published document states it: the run's own files
    are intact, so its document is held to them (a clone without section 17's corpus or 23's traces)."""
    recorded = {line.name: line.recorded for line in verdict.lines if line.kind == "unavailable"}
    counts = document.get("check_counts")
    for entry in document.get("checks") or []:
        status = recorded.get(entry.get("name"))
        if status is not None and entry.get("status") == "unavailable":
            entry["status"] = status
            if isinstance(counts, dict) and status in counts and counts.get("skipped"):
                counts["skipped"] -= 1
                counts[status] += 1


def record_lines(section: ModuleType, run: RunFiles, results: dict, checks: list[Check],
                 hashes: RecordLine | None = None, tables: list[RecordLine] | None = None) -> list[RecordLine]:
    """The record's own statements; ``hashes`` and ``tables``: the lines verify already computed."""
    out = []
    want = recomputed_status(checks, results)
    out.append(RecordLine("status recomputed from the checks", () if results.get("status") == want else
                          (f"recorded {results.get('status')}, the checks give {want}",)))
    out.append(counts_line(results))
    out += tables if tables is not None else table_lines(section, run, results)
    out.append(hashes if hashes is not None else hash_lines(run, results))
    return out


def counts_line(results: dict) -> RecordLine:
    """results.json's ``check_counts`` against its own recorded checks (nothing recomputed)."""
    counts, stated = record_counts(results), results.get("check_counts")
    return RecordLine("check_counts recomputed from the recorded checks", () if stated == counts else
                      (f"recorded {stated}, the checks record {counts}"
                       + (stopped_before_checks(results) if stated is None else ""),))


def table_lines(section: ModuleType, run: RunFiles, results: dict) -> list[RecordLine]:
    """Each declared table built again from the run's files and compared with results.json's (one line each)."""
    tables = getattr(section, "TABLES", None)
    if tables is None:
        return [RecordLine("results.json tables declared", (f"section {section.KEY} declares no TABLES",))]
    return [RecordLine(f"results.json table {line.name!r}", line.problems,
                       f"recorded only: {line.recorded_only}" if line.recorded_only else "")
            for line in compare_tables(tables, run, results)]


def verify(section: ModuleType, run: RunFiles, first_problem: bool = False) -> Verdict:
    """Recomputes ``section.checks(run)`` and compares it, and the record, with what the run recorded.

    ``first_problem`` (a gate over many runs: ``kmesh verify --first-problem``, the tamper suite) compares the
    files with the SHA-256s the run recorded when it finished before anything is recomputed, and stops there
    when they differ: the files are not the ones measured, which is the verdict, and recomputing every figure
    from them (minutes for a production trace) adds nothing to it. When they match, results.json's check counts
    are held to its own recorded checks, then the declared tables are built and compared with results.json, and a
    difference stops it there, before the checks and the public document. Without it every line is computed.

    Raises:
        RunFileError: a recorded file is missing, truncated, empty, not UTF-8 or not the right
            shape; the message names it.
        SectionError: the section's ``checks`` raised on these files.
    """
    results = run.results
    status = effective_status(results, run.run_dir)  # a running run whose process is gone: died
    # the gate hashes the files before parsing them: a file that is not the one measured is the verdict, and
    # reading every record of it first (a third of the tamper suite's time) adds nothing to it
    hashes = hash_lines(run, results) if first_problem and status in ("passed", "failed") else None
    if hashes is not None and not hashes.ok:
        return Verdict(run.run_id, status, record_lines=[hashes])
    counts = counts_line(results) if hashes is not None else None  # results.json against itself: nothing recomputed
    if counts is not None and not counts.ok:
        return Verdict(run.run_id, status, record_lines=[hashes, counts])
    run.read_everything()
    tables = table_lines(section, run, results) if hashes is not None else None
    if tables is not None and not all(line.ok for line in tables):
        return Verdict(run.run_id, status, record_lines=[hashes, *(line for line in tables if not line.ok)])
    recorded = recorded_statuses(results)
    computed = call_section(section, "checks", run)
    checks = [c for c in computed if not (c.predates and c.status == "skipped" and c.name not in recorded)]
    verdict = Verdict(run.run_id, status, checks=list(checks),
                      predated=[c for c in computed if c.predates and c.status == "skipped" and c.name not in recorded])
    for c in checks:
        verdict.lines.append(Line(c.name, c.status, recorded.pop(c.name, None), c.detail, c.recorded_only,
                                  c.outside_input))
    for name, was in recorded.items():  # recorded, but the section no longer computes it
        verdict.lines.append(Line(name, None, was))
    if verdict.finished:
        verdict.record_lines = record_lines(section, run, results, list(checks), hashes, tables)
        public = public_line(section, run, verdict)
        if public is not None:
            verdict.record_lines.append(public)
    return verdict
