"""``kmesh verify``: recompute a run's checks from its files and hold the record against them.

The recomputation is the section's own ``checks(RunFiles(run_dir))``, the same function the
notebook's checks cell called. A run passes verify when:

- its status is finished (``passed`` or ``failed``; not ``running`` or ``interrupted``);
- every recorded file reads (a damaged one is a ``RunFileError``: one line naming the file);
- no recomputed check failed;
- every check the run recorded as ``ok`` recomputes as ``ok`` (a recorded ok that now fails, is
  skipped or is no longer computed is a mismatch: the record claimed more than the files show).
  One exception: a check skipped here for an input outside the run folder that this machine lacks
  (``Check.outside_input``: section 17's corpus in a clone without the data) is ``unavailable``,
  listed and counted, not a mismatch: the run's own files are intact.

A skipped check is reported but is not a failure; it is not a pass either.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType

from kmesh_lib.app.registry import call_section
from kmesh_lib.base.checks import Check, summarize
from kmesh_lib.base.records import FINISHED, RunFileError, RunFiles, effective_status


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
        if self.recorded == "ok" and self.recomputed == "skipped" and self.outside_input:
            return "unavailable"
        if self.recorded == "ok" and self.recomputed != "ok":
            return "mismatch"
        return self.recomputed

    @property
    def is_problem(self) -> bool:
        return self.kind in ("failed", "mismatch") or (self.kind == "missing" and self.recorded == "ok")

    def text(self) -> str:
        label = {"ok": "ok", "failed": "FAILED", "skipped": "skipped", "mismatch": "MISMATCH",
                 "missing": "MISSING", "unavailable": "n/a here"}[self.kind]
        notes = []
        if self.recorded is not None and self.recorded != self.recomputed:
            notes.append(f"recorded {self.recorded}, recomputed {self.recomputed or 'nothing'}")
        if self.kind == "unavailable":
            notes.append(f"needs {self.outside_input}, not on this machine")
        elif self.detail and self.kind != "ok":
            notes.append(self.detail)
        if self.recorded_only:
            notes.append("recorded only: not recomputable from raw/")
        return f"{label:<9}{self.name}" + (f" ({'; '.join(notes)})" if notes else "")


@dataclass
class Verdict:
    """The outcome of verifying one run."""

    run_id: str
    status: str
    lines: list[Line] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @property
    def problems(self) -> list[Line]:
        return [line for line in self.lines if line.is_problem]

    @property
    def ok(self) -> bool:
        return self.finished and bool(self.checks) and not self.problems

    def summary(self) -> str:
        counts = summarize(self.checks)
        mismatches = sum(line.kind in ("mismatch", "missing") for line in self.lines)
        unavailable = sum(line.kind == "unavailable" for line in self.lines)
        verdict = "verified" if self.ok else "NOT verified"
        why = []
        if not self.finished:
            why.append(f"status {self.status}: the run did not finish")
        if not self.checks:
            why.append("no checks computed")
        if unavailable:
            why.append(f"{unavailable} recorded ok, not recomputable here (an input outside the run is absent)")
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


def verify(section: ModuleType, run: RunFiles) -> Verdict:
    """Recomputes ``section.checks(run)`` and compares it with the record.

    Raises:
        RunFileError: a recorded file is missing, truncated, empty, not UTF-8 or not the right
            shape; the message names it.
        SectionError: the section's ``checks`` raised on these files.
    """
    run.read_everything()
    results = run.results
    status = effective_status(results, run.run_dir)  # a running run whose process is gone: died
    recorded = recorded_statuses(results)
    checks = call_section(section, "checks", run)
    verdict = Verdict(run.run_id, status, checks=list(checks))
    for c in checks:
        verdict.lines.append(Line(c.name, c.status, recorded.pop(c.name, None), c.detail, c.recorded_only,
                                  c.outside_input))
    for name, was in recorded.items():  # recorded, but the section no longer computes it
        verdict.lines.append(Line(name, None, was))
    return verdict
