"""``kmesh list`` and ``kmesh compare``: runs with their status and figures, from their own files.

The figures are the section's ``headline(run)`` (formatted for people) and ``counts(run)``
(deterministic facts). ``compare`` puts two runs' figures side by side; where both sides hold a
number, the difference is B - A in the first number's unit.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from kmesh_lib.app.registry import SectionError, call_section
from kmesh_lib.app.runs import RunRef
from kmesh_lib.base.records import RunFileError, RunFiles

NUMBER = re.compile(r"^\s*([+\-\u2212]?\d[\d,]*(?:\.\d+)?)\s*(.*)$")


@dataclass
class RunSummary:
    ref: RunRef
    status: str
    device: str = ""
    figures: dict[str, str] = field(default_factory=dict)
    problem: str = ""  # why figures are missing

    def line(self) -> str:
        figures = "; ".join(f"{k}: {v}" for k, v in self.figures.items()) or f"({self.problem})"
        return (f"{self.ref.section.NUMBER} {self.ref.run_id:<30} {self.ref.where:<9} {self.status:<11} "
                f"{self.device[:40]:<40} {figures}")


def summarize_run(ref: RunRef, with_counts: bool = False) -> RunSummary:
    """Status, device and figures of one run; a damaged run is summarized by what is wrong."""
    run = RunFiles(ref.run_dir)
    try:
        status = run.status
        device = str(run.env.get("device", ""))
    except RunFileError as e:
        return RunSummary(ref, "damaged", problem=str(e))
    summary = RunSummary(ref, status, device)
    try:
        summary.figures = {k: str(v) for k, v in call_section(ref.section, "headline", run).items()}
        if with_counts:
            summary.figures.update({f"count {k}": str(v) for k, v in
                                    call_section(ref.section, "counts", run).items()})
    except (RunFileError, SectionError) as e:
        summary.problem = str(e)
    return summary


def _number(text: str) -> tuple[float, str] | None:
    m = NUMBER.match(text)
    if not m:
        return None
    return float(m[1].replace(",", "").replace("\u2212", "-")), m[2].split(" ")[0] if m[2] else ""


def difference(a: str | None, b: str | None) -> str:
    """B - A where both start with a number (same unit), else same / differs / only one side."""
    if a is None or b is None:
        return "only in " + ("B" if a is None else "A")
    if a == b:
        return "same"
    na, nb = _number(a), _number(b)
    if na and nb and na[1] == nb[1]:
        delta = nb[0] - na[0]
        digits = max((len(t.split(".")[1]) if "." in t else 0) for t in (NUMBER.match(a)[1], NUMBER.match(b)[1]))
        text = f"{delta:+,.{digits}f}" + (f" {na[1]}" if na[1] else "")
        if na[0]:
            text += f" ({delta / abs(na[0]):+.1%})"
        return text
    return "differs"


def compare_lines(a: RunSummary, b: RunSummary, params_a: dict, params_b: dict) -> list[str]:
    """The comparison table of ``kmesh compare``, one line per figure and per differing parameter."""
    rows = [("", "A", "B", "B - A"),
            ("run", f"{a.ref.section.KEY}/{a.ref.run_id}", f"{b.ref.section.KEY}/{b.ref.run_id}", ""),
            ("status", a.status, b.status, "same" if a.status == b.status else "differs"),
            ("device", a.device, b.device, "same" if a.device == b.device else "differs")]
    for key in dict.fromkeys([*a.figures, *b.figures]):
        rows.append((key, a.figures.get(key, "-"), b.figures.get(key, "-"),
                     difference(a.figures.get(key), b.figures.get(key))))
    for key in sorted(set(params_a) | set(params_b)):
        if key != "RUN_DIR" and params_a.get(key) != params_b.get(key):
            rows.append((f"param {key}", str(params_a.get(key, "-")), str(params_b.get(key, "-")), "differs"))
    widths = [min(max(len(r[i]) for r in rows), 48) for i in range(3)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows]
    for problem, side in ((a.problem, "A"), (b.problem, "B")):
        if problem:
            lines.append(f"{side}: {problem}")
    return lines
