"""What a report does to the executed notebook's outputs so that a reader takes it in at a glance.

The executed notebook is never changed: these functions work on the copy ``app.report`` renders.

- **Figures** (an ``<img>`` or PNG output) move to the page's figure section, right after the verdict
  and the findings, captioned by the heading above the cell that drew them.
- **Tables** (pandas' ``dataframe`` HTML): values a reader should not have to decode are restated
  (``NaN``/``None`` as "–", a list or dict repr as plain items, floats rounded to what the figure
  can carry, a byte count in MiB), the meaningless row numbers go, and a long or wide table is
  folded (``<details>``, its rows and columns in the summary) inside a box that scrolls sideways, so
  no table is ever wider than the page.
- **The check list** (``base.checks.show``'s ``ok/failed/skipped NAME`` and ``count NAME = V``
  lines, and ``measured:`` lines) is folded with its counts in the summary ("493 checks: 493 ok").
- **A long printed output** (more than ``LONG_OUTPUT`` lines) is folded with its line count.
- **A raised cell**: on a run whose status is ``passed`` (the checks recompute from its files), the
  traceback is a row saying which check the old notebook asserted and why the run stands (a strict
  check kept as a measured line, or a since-fixed bug the migration names); on a run that did not
  pass, the error line stays visible and the traceback is folded.
"""
from __future__ import annotations

import ast
import html
import math
import re
from dataclasses import dataclass, field

DASH = "–"
FOLD_ROWS = 10  # a table with more rows than this, or more columns than FOLD_COLUMNS, is folded
FOLD_COLUMNS = 8
LONG_OUTPUT = 25  # printed lines
MIB = 1 << 20
CHECK_LINE = re.compile(r"^(ok|failed|skipped)\s+(.+)$")
COUNT_LINE = re.compile(r"^count\s+(.+?) = (.*)$")
MEASURED_LINE = re.compile(r"^measured:\s+(.+)$")
IMG = re.compile(r"<img\b[^>]*>", re.I)
TD = re.compile(r"(<td\b[^>]*>)(.*?)(</td>)", re.S)
TH = re.compile(r"(<th\b[^>]*>)(.*?)(</th>)", re.S)
ROW_NUMBER = re.compile(r"(<tr\b[^>]*>)\s*<th>\s*\d+\s*</th>", re.S)
EMPTY_CORNER = re.compile(r"(<thead>\s*<tr\b[^>]*>)\s*<th>\s*</th>", re.S)
SCOPED_STYLE = re.compile(r"<style scoped>.*?</style>", re.S)
NUMBER = re.compile(r"^-?\d+(?:\.\d+)?(?:e[-+]?\d+)?$", re.I)
MISSING = {"nan", "none", "<na>", "nat", "null", ""}
WORD_MISSING = re.compile(r"(?<![\w.])(?:NaN|None|nan|<NA>)(?![\w.])")


def number_text(x: float | int, unit: str = "") -> str:
    """A number as a reader wants it: integers as they are (thousands grouped from 10 000), floats to
    three significant figures (never in exponent form between 0.001 and 10^9)."""
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) < 1e15 and unit != "frac"):
        v = int(x)
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    if isinstance(x, float) and not math.isfinite(x):
        return DASH
    a = abs(x)
    if a >= 100:
        return f"{x:,.0f}" if a >= 100_000 else f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 0.001:
        return f"{x:.3g}" if a < 1 else f"{x:.2f}"
    return "0" if x == 0 else f"{x:.1e}"


def _is_bytes(name: str) -> bool:
    n = name.lower()
    return "bytes" in n or n.endswith("_b") or n == "bytes"


def mib_text(value: int | float) -> str:
    return f"{number_text(value / MIB)} MiB"


def value_text(raw: str, column: str = "") -> str:
    """One table cell's (unescaped) text as the report shows it."""
    text = raw.strip()
    if text.lower() in MISSING:
        return DASH
    if NUMBER.match(text):
        x = float(text) if any(c in text for c in ".eE") else int(text)
        if isinstance(x, float) and not math.isfinite(x):
            return DASH
        if column and _is_bytes(column) and abs(x) >= MIB:
            return mib_text(x)
        return number_text(x)
    if text[:1] in "[{(" and text[-1:] in "]})":
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return WORD_MISSING.sub(DASH, text)
        return literal_text(value)
    return bytes_in_text(WORD_MISSING.sub(DASH, text))


def literal_text(value) -> str:
    """A list, tuple or dict as plain items: ``[2.0, 2.0, 3.0]`` → "2, 2, 3"; ``{'a': 1}`` → "a 1"."""
    if value is None:
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return number_text(value)
    if isinstance(value, dict):
        if not value:
            return DASH
        return "; ".join(f"{k} {literal_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple, set)):
        return ", ".join(literal_text(v) for v in value) if value else DASH
    return str(value)


@dataclass
class Table:
    html: str
    rows: int
    columns: int

    @property
    def long(self) -> bool:
        return self.rows > FOLD_ROWS or self.columns > FOLD_COLUMNS


def tidy_table(table_html: str) -> Table:
    """pandas' HTML table with its values restated, row numbers dropped and a scrolling box around it."""
    text = SCOPED_STYLE.sub("", table_html)
    thead = text[text.find("<thead"):text.find("</thead>")]
    head_rows = re.findall(r"<tr\b.*?</tr>", thead, re.S)
    # m[2]: the header cell's text (m[1] is its opening tag: every column was named "", so no cell was formatted by
    # its column, and a bytes column's header said MiB over its bytes)
    columns = [html.unescape(re.sub(r"<[^>]+>", "", m[2])).strip() for m in TH.finditer(head_rows[-1])] if head_rows else []
    numbered = bool(re.search(r"<tbody>\s*<tr\b[^>]*>\s*<th>\s*\d+\s*</th>", text, re.S))
    if numbered:  # a RangeIndex: the row numbers say nothing
        text = ROW_NUMBER.sub(r"\1", text)
        text = EMPTY_CORNER.sub(r"\1", text)
        columns = columns[1:] if columns and not columns[0] else columns
    body_start = text.find("<tbody")
    head, body = text[:body_start], text[body_start:]
    rows = re.findall(r"<tr\b.*?</tr>", body, re.S)
    new_rows = []
    for row in rows:
        # a row's data cells are the header's last columns: a named index (the physical floors' disk/copy, section 21)
        # puts its labels in <th> cells before them, which took the first columns' names and shifted every cell's
        # column by one (review finding, 6 Dec 2026: "bytes (MiB)" over 1,073,741,824 bytes)
        cells = iter(columns[max(0, len(columns) - len(TD.findall(row))):])

        def cell(m, cells=cells):
            col = next(cells, "")
            return m[1] + html.escape(value_text(html.unescape(m[2]), col)) + m[3]

        new_rows.append(TD.sub(cell, row))
    for old, new in zip(rows, new_rows):
        body = body.replace(old, new, 1)

    def header(m):
        name = html.unescape(re.sub(r"<[^>]+>", "", m[2])).strip()
        # no unit here: a bytes cell of a MiB and more says "MiB" itself, a smaller one is a count of bytes (a header
        # "(MiB)" stood over 12,288 bytes per token)
        return m[1] + html.escape(name).replace("_", "_<wbr>") + m[3]

    head = TH.sub(header, head)
    text = head + body
    text = text.replace('<table border="1" class="dataframe">', '<table class="dataframe">')
    return Table(f'<div class="table-box">{text.strip()}</div>', len(rows), len(columns))


def folded(summary: str, inner: str, kind: str = "") -> str:
    return (f'<details class="fold {kind}"><summary>{html.escape(summary)}</summary>\n'
            f'{inner}\n</details>')


def table_output(table_html: str) -> str:
    """A dataframe output as the report shows it: inline when short and narrow, else folded."""
    parts = re.split(r"(<div>\s*(?:<style scoped>.*?</style>\s*)?<table\b.*?</table>\s*</div>)", table_html, flags=re.S)
    out = []
    for part in parts:
        if 'class="dataframe"' not in part:
            out.append(part)
            continue
        t = tidy_table(part)
        size = f"{t.rows} rows × {t.columns} columns"
        out.append(folded(f"Table: {size} (open to read; it scrolls sideways)", t.html, "table") if t.long else t.html)
    return "".join(out)


@dataclass
class CheckList:
    checks: list[tuple[str, str]] = field(default_factory=list)
    counts: list[tuple[str, str]] = field(default_factory=list)
    measured: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)


def parse_check_lines(text: str) -> CheckList | None:
    """``text`` as ``base.checks.show``'s lines (and ``measured:`` lines); None when it is not that."""
    out, lines = CheckList(), [line for line in text.splitlines() if line.strip()]
    for line in lines:
        if m := CHECK_LINE.match(line):
            out.checks.append((m[1], m[2].strip()))
        elif m := COUNT_LINE.match(line):
            out.counts.append((m[1].strip(), m[2].strip()))
        elif m := MEASURED_LINE.match(line):
            out.measured.append(m[1].strip())
        else:
            out.other.append(line)
    known = len(out.checks) + len(out.counts) + len(out.measured)
    return out if known and known >= 0.8 * len(lines) else None


def count_value(name: str, value: str) -> str:
    text = value.strip()
    if NUMBER.match(text) and _is_bytes(name) and abs(float(text)) >= MIB:
        return mib_text(float(text))
    return value_text(text, name)


def _rows(rows: list[tuple[str, ...]], head: tuple[str, ...], classes: tuple[str, ...] = ()) -> str:
    body = "".join("<tr>" + "".join(
        f'<td class="{html.escape(classes[i]) if i < len(classes) else ""}">{html.escape(v)}</td>'
        for i, v in enumerate(r)) + "</tr>" for r in rows)
    return ('<div class="table-box"><table class="dataframe list"><thead><tr>'
            + "".join(f"<th>{html.escape(h)}</th>" for h in head) + f"</tr></thead><tbody>{body}</tbody></table></div>")


def check_list_html(cl: CheckList, details: dict[str, str] | None = None) -> str:
    """The folded check list: failed and skipped first, each with its recorded detail (a skipped check's reason),
    then ok; the counts and the measured lines each folded."""
    out = []
    if cl.checks:
        tally: dict[str, int] = {}
        for status, _ in cl.checks:
            tally[status] = tally.get(status, 0) + 1
        summary = f"{len(cl.checks)} checks: " + ", ".join(f"{n} {s}" for s, n in sorted(
            tally.items(), key=lambda sn: ("failed", "skipped", "ok").index(sn[0])))
        order = sorted(cl.checks, key=lambda sc: ("failed", "skipped", "ok").index(sc[0]))
        def why(status: str, name: str) -> str:
            detail = (details or {}).get(name, "") if status != "ok" else ""
            return f'<br><span class="why">{html.escape(value_text_inline(detail))}</span>' if detail else ""

        table = "".join(f'<tr><td class="st {s}">{s}</td><td>{html.escape(value_text_inline(n))}{why(s, n)}</td></tr>'
                        for s, n in order)
        out.append(folded(summary, f'<div class="table-box"><table class="dataframe list checks"><tbody>{table}'
                                   f"</tbody></table></div>", "checks"))
    if cl.measured:
        out.append(folded(f"{len(cl.measured)} measured lines (strict statements kept as measurements)",
                          _rows([(value_text_inline(m),) for m in cl.measured], ("measured",)), "measured"))
    if cl.counts:
        out.append(folded(f"{len(cl.counts)} counts (deterministic facts the smoke goldens pin)",
                          _rows([(n, count_value(n, v)) for n, v in cl.counts], ("count", "value")), "counts"))
    if cl.other:
        out.append("<pre>" + html.escape("\n".join(cl.other)) + "</pre>")
    return "\n".join(out)


INLINE_LITERAL = re.compile(r"\[[^\[\]{}]*\]|\{[^{}\[\]]*\}")
BYTES_IN_TEXT = re.compile(r"(?<![\w.])(\d{7,}) bytes\b")


def bytes_in_text(text: str) -> str:
    """"12582912 bytes" in running text as "12 MiB"."""
    return BYTES_IN_TEXT.sub(lambda m: mib_text(int(m[1])), text)


def value_text_inline(text: str) -> str:
    """A printed line with its list and dict reprs restated (``[2.0, 3.0]`` → "2, 3") and no NaN/None."""
    def lit(m):
        try:
            return "(" + literal_text(ast.literal_eval(m[0])) + ")" if m[0][:1] == "[" else literal_text(ast.literal_eval(m[0]))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return m[0]

    text = INLINE_LITERAL.sub(lit, text).replace("((", "(").replace("))", ")")
    return bytes_in_text(WORD_MISSING.sub(DASH, text))


def stream_html(text: str, check_details: dict[str, str] | None = None) -> str | None:
    """A printed output as the report shows it, or None to leave it to the template (short, plain);
    ``check_details``: the checks' recorded details by name, for a printed check list."""
    cl = parse_check_lines(text)
    if cl is not None:
        return check_list_html(cl, check_details)
    lines = text.rstrip("\n").splitlines()
    tidy = "\n".join(value_text_inline(line) for line in lines)
    pre = f'<div class="output_text"><pre>{html.escape(tidy)}</pre></div>'
    if len(lines) > LONG_OUTPUT:
        return folded(f"Printed output: {len(lines)} lines", pre, "printed")
    return pre


def error_html(ename: str, evalue: str, traceback_text: str, status: str, why: str) -> str:
    """A cell that raised. On a passed run, one row saying why the run stands; else the error, traceback folded."""
    evalue = bytes_in_text(evalue)
    if status == "passed":
        return (f'<div class="table-box"><table class="dataframe list expected"><thead><tr><th>the notebook stopped on'
                f'</th><th>why the run still passes</th></tr></thead><tbody><tr><td>{html.escape(ename)}: '
                f'{html.escape(evalue)}</td><td>{html.escape(why)}</td></tr></tbody></table></div>')
    shown = evalue if len(evalue) <= 400 else evalue[:400] + "\u2026 (in full in the traceback)"  # cut visibly
    return (f'<p class="stopped">{html.escape(ename)}: {html.escape(shown)}</p>'
            + folded("The traceback", f"<pre>{html.escape(traceback_text)}</pre>", "traceback"))
