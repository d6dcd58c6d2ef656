"""``report.html``: the executed notebook as a slim page with the run's header and answer.

The page is nbconvert's ``basic`` template (cells only, no page chrome, no scripts) wrapped in our
own head: a title naming the section and the run, ``REPORT_CSS`` plus pygments' highlighting
(about 8 KB, against about 258 KB of JupyterLab CSS per file before: inlined in a local run's
report; a published report links the published set's one ``report.css``, which
``app.published.regenerate`` writes from ``report_css()``), a header (run id,
status banner from ``results.json``, git commit, device, key versions, check counts) and the
section's ``answer(run)``. Nothing loads from the network: widget views are left out (an offline
reader would see a blank box; a section shows a static figure next to its panel) and no MathJax,
require.js or widget-manager script is linked.

What the report leaves out of the cells, it counts in the header: progress-bar text (tqdm) and
engine log lines that reached a cell before ``base.runlog`` kept them in ``logs/engine.log``
(runs recorded before it). The executed notebook itself is never changed.
"""
from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from kmesh_lib.app.registry import SectionError, call_section
from kmesh_lib.base.checks import STATUSES
from kmesh_lib.base.records import ENGINE_LOG, RunFileError, RunFiles

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
ANSI = r"(?:\x1b\[[0-9;]*m)*"
ENGINE_LINE = re.compile(
    rf"^{ANSI}(?:\(\w+ pid=\d+\) )?(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d{{2}}-\d{{2}} \d{{2}}:\d{{2}}:\d{{2}}"
    rf"|^{ANSI}\[\d{{4}}-\d{{2}}-\d{{2}} [\d:,.]+\] LMCache (?:INFO|WARNING|ERROR|DEBUG|CRITICAL)")
ANSI_CODE = re.compile(r"\x1b\[[0-9;]*m")  # vLLM colours each field of a record, not only its start
PROGRESS = re.compile(r"\r|\d+%\|.*\|")
BANNERS = {"passed": "PASS", "failed": "FAIL", "running": "RUNNING: did not finish",
           "interrupted": "INTERRUPTED"}
VERSION_KEYS = ("python", "vllm", "lmcache", "torch")

REPORT_CSS = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d1d1f;max-width:1100px;margin:0 auto;
padding:1.5em 2em 4em}
h1,h2,h3{line-height:1.25}a{color:#0b5cad}code,pre,.meta td.v{font-family:ui-monospace,Menlo,Consolas,monospace;
font-size:13px}
header.run{border-bottom:1px solid #ccc;margin-bottom:2em;padding-bottom:1em}
.banner{display:inline-block;font-weight:700;padding:.25em .8em;border-radius:4px;color:#fff;letter-spacing:.05em}
.banner.passed{background:#1a7f37}.banner.failed{background:#c62828}.banner.running,.banner.interrupted{background:#b26a00}
.question{font-size:1.1em;color:#444}.meta{border-collapse:collapse;margin:.8em 0}
.meta td{padding:.15em 1em .15em 0;vertical-align:top}.meta td.k{color:#666;white-space:nowrap}
.stopped{color:#a40000;font-weight:600}
.answer{background:#f5f7fa;border-left:4px solid #0b5cad;padding:.5em 1.2em;margin-top:1em}
.note{color:#666;font-size:.9em}.status-note{margin-left:.8em;font-weight:600;color:#c62828}
.cell{margin:1.2em 0}.prompt{display:none}
.input_area{background:#f6f8fa;border:1px solid #e1e4e8;border-radius:4px;padding:.4em .8em;overflow-x:auto}
.input_area pre,.output_text pre{margin:0;white-space:pre-wrap;word-break:break-word}
.output_area{margin:.4em 0 0 0;overflow-x:auto}.output_stderr{background:#fff5f5}.output_error pre{color:#a40000}
.output_png img,.rendered_html img{max-width:100%;height:auto}
table.dataframe{border-collapse:collapse;font-size:13px;margin:.4em 0}
table.dataframe th,table.dataframe td{border:1px solid #ddd;padding:.2em .6em;text-align:right}
table.dataframe thead th{background:#f0f0f0}table.dataframe tbody tr:nth-child(odd){background:#fafafa}
.ansi-red-fg{color:#c62828}.ansi-green-fg{color:#1a7f37}.ansi-yellow-fg{color:#9a6700}.ansi-blue-fg{color:#0b5cad}
.ansi-cyan-fg{color:#00838f}.ansi-bold{font-weight:700}
"""

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
{style}
</head><body>
{header}
<main>
{body}
</main>
</body></html>
"""


@dataclass
class LeftOut:
    """What ``clean_for_report`` left out of the cells."""

    widget_views: int = 0
    progress_outputs: int = 0
    engine_lines: int = 0

    def note(self) -> str:
        parts = []
        if self.engine_lines:
            parts.append(f"{self.engine_lines} engine log lines")
        if self.progress_outputs:
            parts.append(f"{self.progress_outputs} progress-bar outputs")
        if self.widget_views:
            parts.append(f"{self.widget_views} interactive widget views (open the notebook in Jupyter)")
        return ("Left out of this page (still in the notebook): " + "; ".join(parts) + ".") if parts else ""


def _drop_engine_lines(text: str) -> tuple[str, int]:
    """Engine log records out of a stderr text, with what belongs to them: indented lines (a config
    dump) and a logged traceback up to its exception line. Other lines stay."""
    kept, dropped = [], 0
    in_record = in_traceback = False
    for line in text.splitlines(keepends=True):
        if ENGINE_LINE.match(ANSI_CODE.sub("", line)):
            in_record, in_traceback = True, False
        elif in_record and line.startswith("Traceback (most recent call last)"):
            in_traceback = True
        elif in_record and in_traceback and not line[:1].isspace():
            in_traceback = False  # the exception line closes the traceback; it is dropped too
        elif in_record and not (line[:1].isspace() or in_traceback):
            in_record = False
        if in_record:
            dropped += 1
        else:
            kept.append(line)
    return "".join(kept), dropped


PAPERMILL_ERROR_TAG = "papermill-error-cell-tag"
PAPERMILL_CELL = re.compile(r"In \[(\d+)\]")


def _restate_papermill_banner(cell) -> None:
    """papermill's two red 2em banners (at the top, and above the cell that raised) as one plain
    sentence each: the header already carries the status, and a run's checks cell raising is how a
    failed run ends (or, for a migrated run, how a since-fixed bug stopped it)."""
    m = PAPERMILL_CELL.search(cell.source)
    if "papermill-error-cell" in cell.source and "id=" in cell.source:
        cell.source = ('<p class="stopped" id="papermill-error-cell">The notebook stopped in the next cell: '
                       'it raised (its error is its last output).</p>')
    elif m:
        cell.source = (f'<p class="stopped">The notebook stopped in <a href="#papermill-error-cell">cell '
                       f'In [{m[1]}]</a>, which raised; the header above gives the run\'s status as its checks '
                       f'recompute from its files.</p>')


def clean_for_report(nb) -> LeftOut:
    """Removes widget views, progress-bar text and engine log lines from ``nb`` (in place), and
    restates papermill's error banners as plain sentences."""
    left = LeftOut()
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if PAPERMILL_ERROR_TAG in cell.get("metadata", {}).get("tags", []):
            _restate_papermill_banner(cell)
        if cell.cell_type != "code":
            continue
        outputs = []
        for out in cell.get("outputs", []):
            if out.output_type in ("display_data", "execute_result") and WIDGET_VIEW in out.get("data", {}):
                left.widget_views += 1
                continue
            if out.output_type == "stream":
                if PROGRESS.search(out.text):
                    left.progress_outputs += 1
                    continue
                # vLLM logs to stdout when its logger was set up before the run took stderr (GPU runs
                # recorded before base.runlog): engine records are dropped from either stream
                out.text, dropped = _drop_engine_lines(out.text)
                left.engine_lines += dropped
                if not out.text.strip():
                    continue
            outputs.append(out)
        cell.outputs = outputs
    return left


def _markdown(text: str) -> str:
    from nbconvert.filters.markdown import markdown2html

    return markdown2html(text)


def header_html(section: ModuleType, run: RunFiles, left_out: LeftOut, answer: str | None, answer_error: str,
                note: str = "") -> str:
    results, env = run.results, run.env
    status = results.get("status", "unknown")
    git = env.get("git") or {}
    commit = (git.get("commit") or "unknown")[:12] + (" (uncommitted changes)" if git.get("dirty") else "")
    packages = env.get("packages") or {}
    versions = ", ".join(f"{k} {packages.get(k) or env.get(k)}" for k in VERSION_KEYS if packages.get(k) or env.get(k))
    recorded = results.get("checks") or {}
    counts = {s: sum(isinstance(c, dict) and c.get("status") == s for c in recorded.values()) for s in STATUSES}
    rendered_on = results.get("render_environment")
    rows = [("run", run.run_id), ("status", status), ("started", results.get("started_utc", "")),
            ("rendered" if isinstance(rendered_on, dict) else "finished",
             results.get("finished_utc") or results.get("ended_utc") or "not finished"),
            ("git commit", commit), ("device", env.get("device", "unknown")), ("versions", versions),
            ("checks", ", ".join(f"{n} {s}" for s, n in counts.items()))]
    if isinstance(rendered_on, dict):
        rows.append(("rendered on", f"{rendered_on.get('device', 'unknown')} (the notebook read this run's raw/; "
                                    "nothing was measured there)"))
    migration = results.get("migration")
    if isinstance(migration, dict):
        rows.append(("migrated", f"{migration.get('date', '')}: {migration.get('summary', '')}"))
    error = results.get("error")
    if isinstance(error, dict):
        rows.append(("error", f"{error.get('kind', '')} in cell {error.get('cell', '?')}: "
                              f"{error.get('ename', '')}: {error.get('evalue', '')}"))
    links = [f'<a href="{html.escape(section.NOTEBOOK)}">the executed notebook</a>',
             '<a href="results.json">results.json</a>']
    if (run.run_dir / "public-results.json").exists():
        links.append('<a href="public-results.json">public-results.json</a>')
    if (run.run_dir / ENGINE_LOG).exists():
        links.append(f'<a href="{ENGINE_LOG.as_posix()}">the engine log</a>')
    table = "".join(f'<tr><td class="k">{html.escape(k)}</td><td class="v">{html.escape(str(v))}</td></tr>'
                    for k, v in rows)
    answer_part = (_markdown(answer) if answer is not None
                   else f'<p class="note">No answer: {html.escape(answer_error)}</p>')
    left = left_out.note()
    return (f'<header class="run">\n<span class="banner {html.escape(status)}">'
            f'{html.escape(BANNERS.get(status, status.upper()))}</span>\n'
            + (f'<span class="status-note">{html.escape(note)}</span>\n' if note else "")
            + f'<h1>{html.escape(section.NUMBER)} {html.escape(section.TITLE)}</h1>\n'
            f'<p class="question">{html.escape(section.QUESTION)}</p>\n<table class="meta">{table}</table>\n'
            f'<p>{" · ".join(links)}</p>\n<section class="answer"><h2>Answer</h2>\n{answer_part}</section>\n'
            + (f'<p class="note">{html.escape(left)}</p>\n' if left else "") + "</header>")


@dataclass
class Rendered:
    path: Path
    left_out: LeftOut
    answer_error: str  # empty when the section's answer rendered


def published_note(run_dir: Path) -> str:
    """'Published with --allow-failed: <why>' for a published run that went out failed, so that
    ``kmesh report`` on it keeps the sentence ``kmesh publish`` put there; else empty."""
    path = Path(run_dir) / "public-results.json"
    try:
        public = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (ValueError, UnicodeDecodeError):
        return ""
    if isinstance(public, dict) and public.get("allowed_failed"):
        return f"Published with --allow-failed: {public.get('failure_note') or 'this run did not pass verify'}"
    return ""


STYLESHEET = "report.css"  # the published set's one stylesheet, beside index.html
PUBLISHED_STYLESHEET = f"../../{STYLESHEET}"  # from a published run's folder, <root>/<section>/<run>/


def _page_css(resources: dict) -> str:
    return REPORT_CSS + "".join(resources.get("inlining", {}).get("css", []))


def report_css() -> str:
    """The stylesheet every report uses: ``REPORT_CSS`` and the notebook template's own (pygments')."""
    import nbformat
    from nbconvert import HTMLExporter

    return _page_css(HTMLExporter(template_name="basic").from_notebook_node(nbformat.v4.new_notebook())[1])


def render_report(section: ModuleType, run_dir: Path, note: str = "", stylesheet: str | None = None) -> Rendered:
    """Writes ``run_dir/report.html`` from the executed notebook and the run's files (a published
    run that went out failed keeps its ``published_note``). ``stylesheet``: a relative link to the
    page's CSS (a published run: ``PUBLISHED_STYLESHEET``); None inlines it (a local run).

    A section whose ``answer`` raises (a run that stopped before the figures it needs) gets a
    report that says so in place of the answer, and ``Rendered.answer_error`` says it too.

    Raises:
        RunFileError: the notebook or results.json is missing or unreadable.
    """
    import nbformat
    from nbconvert import HTMLExporter

    run = RunFiles(run_dir)
    note = note or published_note(run.run_dir)
    nb_path = run.run_dir / section.NOTEBOOK
    if not nb_path.is_file():
        raise RunFileError(f"{nb_path}: missing (the notebook did not start, or this is not {section.KEY}'s run)")
    try:
        nb = nbformat.read(str(nb_path), as_version=4)
    except (ValueError, UnicodeDecodeError, OSError) as e:
        raise RunFileError(f"{nb_path}: not a readable notebook ({str(e).splitlines()[0][:120]})") from None
    left_out = clean_for_report(nb)
    body, resources = HTMLExporter(template_name="basic").from_notebook_node(nb)
    try:  # a run that stopped early may lack the figures its answer needs: the page says so
        answer, answer_error = call_section(section, "answer", run), ""
    except (RunFileError, SectionError) as e:
        answer, answer_error = None, str(e)
    title = f"{section.NUMBER} {section.TITLE} · {run.run_id}"
    style = (f'<link rel="stylesheet" href="{html.escape(stylesheet)}">' if stylesheet
             else f"<style>{_page_css(resources)}</style>")
    page = PAGE.format(title=html.escape(title), style=style, body=body,
                       header=header_html(section, run, left_out, answer, answer_error, note))
    out = run.run_dir / "report.html"
    out.write_text(page, encoding="utf-8")
    return Rendered(out, left_out, answer_error)
