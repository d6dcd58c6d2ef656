"""Checks: statements about a run, each computed from the run's recorded files.

A check has one of three statuses, and it is never ``ok`` by default:

    ok       the statement holds on the evidence, and the evidence is present
    failed   the statement does not hold
    skipped  the evidence is missing (an arm that did not run, a corpus that is absent): the
             detail says what is missing. A skipped check is not a pass.

``recorded_only`` marks a check whose evidence is not in ``raw/`` (a figure the run measured and
kept only as a result): ``kmesh verify`` re-reads it but cannot recompute it.

``outside_input`` names what a ``skipped`` check needed from outside the run folder and did not
find on this machine (a data set the check re-reads: section 17's corpus). ``kmesh verify`` then
reports a check the run recorded as ok as not recomputable here, not as a contradiction of the
record: the run's own files are intact, this machine lacks the input.

Each section has one ``checks(run: RunFiles) -> list[Check]``. The notebook calls it on the files
it has just written, ``kmesh verify`` on the files of a finished run, a GPU driver on its own run
directory: one computation, three callers.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

STATUSES = ("ok", "failed", "skipped")


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | failed | skipped (a bool is taken as ok / failed)
    detail: str = ""
    recorded_only: bool = False
    outside_input: str = ""  # skipped because this input outside the run folder is absent here
    predates: str = ""  # skipped because the run was recorded before the evidence it needs existed (why)

    def __post_init__(self) -> None:
        if isinstance(self.status, bool):
            object.__setattr__(self, "status", "ok" if self.status else "failed")
        if self.status not in STATUSES:
            raise ValueError(f"check {self.name!r}: status {self.status!r} is not one of {STATUSES}")
        if self.outside_input and self.status != "skipped":
            raise ValueError(f"check {self.name!r}: outside_input names why a check is skipped")
        if self.predates and self.status != "skipped":
            raise ValueError(f"check {self.name!r}: predates names why a check is skipped")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def as_record(self) -> dict:
        return {"ok": self.ok, "status": self.status, "detail": self.detail,
                **({"recorded_only": True} if self.recorded_only else {}),
                **({"outside_input": self.outside_input} if self.outside_input else {}),
                **({"predates": self.predates} if self.predates else {})}


def check(name: str, ok: bool, detail: str = "", evidence: object = True, missing: str = "") -> Check:
    """``ok`` or ``failed``, or ``skipped`` when ``evidence`` is empty (an empty list, None, 0 items).

    Use it for every statement quantified over records: ``all()`` over nothing is true, and a
    check built on it would pass with no evidence.
    """
    if evidence is None or (hasattr(evidence, "__len__") and len(evidence) == 0) or evidence is False:
        return Check(name, "skipped", missing or "no evidence recorded")
    return Check(name, bool(ok), detail)


def all_of(name: str, items: Iterable[Any], predicate: Callable[[Any], bool], describe: Callable[[Any], str] = repr,
           missing: str = "") -> Check:
    """``predicate`` holds for every item, and there is at least one item (else skipped)."""
    items = list(items)
    bad = [item for item in items if not predicate(item)]
    detail = f"{len(items) - len(bad)} of {len(items)}" + (f"; first failing: {describe(bad[0])}" if bad else "")
    return check(name, not bad, detail, items, missing)


def summarize(checks: list[Check]) -> dict[str, int]:
    return {status: sum(c.status == status for c in checks) for status in STATUSES}


def verdict(checks: list[Check]) -> str:
    """The checks in one phrase for a results table: "all passed" only when none failed and none was skipped
    (a skipped check is not a pass), else the counts that are not ok: "1 failed", "all others passed, 1 skipped",
    or "none ran, 23 skipped" where no check had its evidence (a run still running: there are no others).
    A check the run predates (``Check.predates``: skipped for evidence a later version records) is not counted, as
    ``kmesh verify`` leaves it out of a run that never recorded it."""
    counts = summarize([c for c in checks if not c.predates])
    if not counts["failed"] and not counts["skipped"]:
        return "all passed"
    if not counts["failed"]:
        return f"{'all others passed' if counts['ok'] else 'none ran'}, {counts['skipped']} skipped"
    return f"{counts['failed']} failed" + (f", {counts['skipped']} skipped" if counts["skipped"] else "")


def show(checks: list[Check], counts: dict[str, object] | None = None) -> None:
    """Prints one deterministic line per check (status and name) and per count.

    The notebooks' checks cells call this and nbval compares the lines with the smoke goldens, so
    only statuses and deterministic counts are printed; details (timings) go to the report table.
    """
    for c in checks:
        print(f"{c.status:<7} {c.name}")
    for name, value in (counts or {}).items():
        print(f"count   {name} = {value}")


def raise_on_failure(checks: list[Check]) -> None:
    """Stops a notebook at its checks cell when a check failed (the run is recorded first)."""
    failed = [c for c in checks if c.status == "failed"]
    if failed:
        raise AssertionError(f"{len(failed)} check(s) failed: " + "; ".join(f"{c.name}: {c.detail}" for c in failed[:5]))


def differences(recomputed: Any, recorded: Any, path: str = "", rel_tol: float = 1e-9) -> list[str]:
    """Where ``recorded`` (a figure read from results.json) differs from ``recomputed`` (the same
    figure recomputed from raw/), as ``path: recomputed != recorded`` lines; empty when they agree.

    Mappings and lists are compared element by element (a missing key or a different length is a
    difference); floats agree within ``rel_tol``, since JSON keeps a float's exact value and the
    tolerance only absorbs a platform's last-bit rounding (a NaN agrees with a NaN: JSON keeps those too); ints,
    strings, bools and None exactly.
    """
    where = path or "value"
    if isinstance(recomputed, dict) and isinstance(recorded, dict):
        out = [f"{path}.{k}: missing in results.json" for k in recomputed if k not in recorded]
        out += [f"{path}.{k}: in results.json, not recomputed" for k in recorded if k not in recomputed]
        for k in recomputed:
            if k in recorded:
                out += differences(recomputed[k], recorded[k], f"{path}.{k}" if path else str(k), rel_tol)
        return out
    if isinstance(recomputed, (list, tuple)) and isinstance(recorded, (list, tuple)):
        if len(recomputed) != len(recorded):
            return [f"{where}: {len(recomputed)} items recomputed, {len(recorded)} recorded"]
        return [d for i, (a, b) in enumerate(zip(recomputed, recorded)) for d in differences(a, b, f"{where}[{i}]", rel_tol)]
    numbers = (int, float)
    if (isinstance(recomputed, numbers) and isinstance(recorded, numbers) and not isinstance(recomputed, bool)
            and not isinstance(recorded, bool) and (isinstance(recomputed, float) or isinstance(recorded, float))):
        close = math.isclose(recomputed, recorded, rel_tol=rel_tol, abs_tol=1e-12) or (
            math.isnan(recomputed) and math.isnan(recorded))  # the same undefined figure (an interval of one pair)
        return [] if close else [f"{where}: {recomputed!r} != {recorded!r}"]
    return [] if recomputed == recorded and type(recomputed) is type(recorded) else [f"{where}: {recomputed!r} != {recorded!r}"]
