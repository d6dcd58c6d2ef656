"""``kmesh list`` and ``kmesh compare``: runs with their status and figures.

The figures are the section's ``headline(run)`` (formatted for people) and ``counts(run)``
(deterministic facts). ``list`` reads a published run's status, device and headline from its
``public-results.json`` (computed from its files when it was published, and what the index and the
README table show), so listing the published set reads one small file per run and computes nothing;
a local run's figures are computed from its files. ``compare`` computes both runs' figures and puts
them side by side; where both sides hold a number, the difference is B - A in the first number's unit.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from kmesh_lib.app.registry import SectionError, call_section
from kmesh_lib.app.runs import PUBLISHED, RunRef
from kmesh_lib.base.records import RunFileError, RunFiles, is_live_run_id

NUMBER = re.compile(r"^\s*([+\-\u2212]?\d[\d,]*(?:\.\d+)?)\s*(.*)$")
LIST_HEADER = ("section", "run", "where", "status", "device", "headline")
DEVICE_WIDTH = 24  # "cpu: Intel Xeon", "NVIDIA H200": enough to tell the published set's machines apart
DEVICE_NOISE = re.compile(r"\((R|TM)\)| Processor\b| CPU\b")  # marks and words that tell no machine apart
MIN_HEADLINE_WIDTH = 20
HEADLINE_WIDTH = 100  # where the terminal's width is unknown (output to a file or a pipe)


@dataclass
class RunSummary:
    ref: RunRef
    status: str
    device: str = ""
    figures: dict[str, str] = field(default_factory=dict)
    problem: str = ""  # why figures are missing
    public: dict | None = None  # a published run's public-results.json
    stands: bool = False  # the published run that stands for its section (published.STANDING_RULE)

    @property
    def live(self) -> bool:
        return is_live_run_id(self.ref.run_id)

    def headline(self) -> str:
        return "; ".join(f"{k}: {v}" for k, v in self.figures.items()) or f"({self.problem})"

    def cells(self) -> tuple[str, ...]:
        device = re.sub(r"\s+", " ", DEVICE_NOISE.sub("", self.device)).strip()
        return (self.ref.section.NUMBER, self.ref.run_id, "stands" if self.stands else self.ref.where, self.status,
                device[:DEVICE_WIDTH],
                self.headline())


def _public_document(ref: RunRef) -> dict | None:
    """A published run's public-results.json, or None (not published, or unreadable: then its files are read)."""
    if ref.where != PUBLISHED:
        return None
    try:
        doc = json.loads((ref.run_dir / "public-results.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("headline"), dict) and "status" in doc else None


STARTING = "starting"


def _starting(ref: RunRef) -> bool:
    """A local folder ``kmesh run`` made (its ``params.resolved.yaml``) whose notebook has not yet written
    ``results.json``: the seconds while the kernel starts. ``end_run`` writes one for a run that ends before
    its notebook began, so only a ``kmesh run`` killed in those seconds leaves a folder like this for good."""
    folder = ref.run_dir
    return (ref.where != PUBLISHED and not (folder / "results.json").exists()
            and (folder / "params.resolved.yaml").is_file())


def summarize_run(ref: RunRef, with_counts: bool = False, figures: bool = True) -> RunSummary:
    """Status, device and (unless ``figures`` is False: ``add_figures`` later) figures of one run; a damaged run
    is summarized by what is wrong. A published run's come from its public file unless ``with_counts``."""
    doc = None if with_counts else _public_document(ref)
    if doc is not None:
        summary = RunSummary(ref, str(doc["status"]), str(doc.get("environment", {}).get("device", "")), public=doc)
    else:
        run = RunFiles(ref.run_dir)
        try:
            summary = RunSummary(ref, run.status, str(run.env.get("device", "")))
        except RunFileError as e:
            if _starting(ref):
                return RunSummary(ref, STARTING, problem="no results.json yet: its notebook has not begun (kmesh run "
                                                         "is starting the kernel, or was killed before it did)")
            return RunSummary(ref, "damaged", problem=str(e))
    if figures:
        add_figures(summary, with_counts)
    return summary


def add_figures(summary: RunSummary, with_counts: bool = False) -> None:
    if summary.status in ("damaged", STARTING) or summary.figures:
        return
    if summary.public is not None and not with_counts:
        summary.figures = {k: str(v) for k, v in summary.public["headline"].items()}
        return
    run, section = RunFiles(summary.ref.run_dir), summary.ref.section
    try:
        summary.figures = {k: str(v) for k, v in call_section(section, "headline", run).items()}
        if with_counts:
            summary.figures.update({f"count {k}": str(v) for k, v in call_section(section, "counts", run).items()})
    except (RunFileError, SectionError) as e:
        summary.problem = str(e)


def list_lines(summaries: list[RunSummary], width: int | None) -> list[str]:
    """The table of ``kmesh list``: a header, aligned columns, each headline cut so a line fits ``width``
    characters (a terminal's), or to ``HEADLINE_WIDTH`` where ``width`` is None."""
    rows = [LIST_HEADER, *(s.cells() for s in summaries)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(LIST_HEADER) - 1)]
    room = HEADLINE_WIDTH if width is None else max(width - sum(widths) - 2 * len(widths), MIN_HEADLINE_WIDTH)
    lines = []
    for row in rows:
        headline = row[-1] if len(row[-1]) <= room else row[-1][:room - 1] + "\u2026"
        lines.append("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), headline]).rstrip())
    return lines


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
