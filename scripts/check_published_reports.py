"""Opens every published report in headless Chromium and checks what a reader sees.

    python scripts/check_published_reports.py [--screenshots DIR] [REPORT.html ...]

For each ``outputs/*/*/report.html`` (or the files named), Chromium renders the page
(``--dump-dom``: the DOM after layout, as a browser shows it) and this script checks:

- the header: the status banner (PASS / FAIL ...), the section title, the run id and device rows;
- no engine log line in the page text (vLLM's ``INFO 11-29 19:07:56 ...`` records, LMCache's
  ``[2026-...] LMCache INFO``): they belong in the run's ``logs/engine.log``;
- no truncated table: no cell of a table that is only ``...`` (pandas' elision);
- nothing from the network: no ``<script>``, no ``http(s)://`` in a ``src`` or a stylesheet link;
- every image the page shows is a file in the run folder (``figures/*.png``), none inlined; a local
  run's report (``runs/...``, no ``public-results.json`` beside it) inlines its images by design, one
  file to pass around, so there only the other checks apply.

- the first screen (issue 43): the section's verdict (``ul.verdict``) and its findings table;
- nothing wider than the page: with ``--layout``, Chromium lays the page out at 1280 px (a copy with a
  measuring script, in a temp dir beside nothing of the run's) and the page's scroll width, and the right
  edge of every table, image and pre, must stay within the window; the page's height with the folded
  parts closed and opened is printed (``SCREENS_MAX`` screens of 900 px at most, closed).

``--screenshots DIR`` also writes a 1280x900 PNG of each page's first screen (``<section>-<run>.png``).
Exit 1 when a page fails a check (each failure is one line naming the page).
"""
from __future__ import annotations

import argparse
import html
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kmesh_lib.app.report import ENGINE_LINE  # noqa: E402

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--allow-file-access-from-files"]
TAG = re.compile(r"<[^>]+>")


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return name
    raise SystemExit("no Chromium on PATH (apt-get install chromium)")


def rendered_dom(browser: str, page: Path) -> str:
    out = subprocess.run([browser, *CHROMIUM_FLAGS, "--dump-dom", page.resolve().as_uri()],
                         capture_output=True, text=True, timeout=120)
    if out.returncode or not out.stdout.strip():
        raise RuntimeError(f"chromium could not render {page}: {out.stderr.strip()[-200:]}")
    return out.stdout


def problems(page: Path, dom: str) -> list[str]:
    out = []
    header = dom[dom.find("<header"):dom.find("</header>")]
    if not re.search(r'<span class="banner (passed|failed|running|interrupted)">', header):
        out.append("no status banner in the header")
    for row in ("run", "status", "device", "git commit", "versions"):  # and finished or rendered
        if f'<td class="k">{row}</td>' not in header:
            out.append(f"header has no '{row}' row")
    text = html.unescape(TAG.sub("", dom[dom.find("<main>"):]))
    engine = [line for line in text.splitlines() if ENGINE_LINE.match(line.strip())]
    if engine:
        out.append(f"{len(engine)} engine log lines, first: {engine[0].strip()[:100]}")
    cells = re.findall(r"<t[dh][^>]*>\s*(?:\.\.\.|…)\s*</t[dh]>", dom)
    if cells:
        out.append(f"a truncated table ({len(cells)} '...' cells)")
    if re.search(r"<script\b", dom, re.I):
        out.append("a <script> element")
    if re.search(r"""(?:src|href)=["']https?://""", dom) and re.search(r"""<(?:script|link|img)[^>]+https?://""", dom):
        out.append("loads something from the network")
    published = (page.parent / "public-results.json").is_file()
    for src in re.findall(r"""<img[^>]+src=["']([^"']+)["']""", dom):
        if src.startswith("data:"):
            if published:
                out.append("an image inlined as data: (figures live in figures/)")
        elif not (page.parent / src).is_file():
            out.append(f"an image that is not in the run folder: {src}")
    if '<ul class="verdict">' not in header:
        out.append("no verdict on the first screen")
    if '<table class="findings">' not in header:
        out.append("no findings table on the first screen")
    return out


WIDTH, SCREEN, SCREENS_MAX = 1280, 900, 10
MEASURE = ('<script>window.addEventListener("load",()=>{{{opened}const d=document.documentElement;'
           'const r=Math.max(0,...[...document.querySelectorAll("table,img,pre")].filter(e=>e.offsetParent)'
           '.map(e=>e.getBoundingClientRect().right));const t=document.createElement("pre");t.id="kmesh-measure";'
           't.textContent=d.scrollHeight+" "+d.scrollWidth+" "+Math.round(r);document.body.appendChild(t)}})</script>')


def layout(browser: str, page: Path) -> tuple[list[str], str]:
    """Lays ``page`` out at WIDTH px, folded parts closed then open: the problems, and one line of heights."""
    import tempfile

    heights, out = [], []
    for opened in (False, True):
        text = page.read_text(encoding="utf-8")
        script = MEASURE.format(opened='document.querySelectorAll("details").forEach(e=>e.open=true);' if opened else "")
        text = text.replace("<head>", f'<head><base href="{page.parent.resolve().as_uri()}/">', 1)
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "page.html"
            copy.write_text(text.replace("</body>", script + "</body>"), encoding="utf-8")
            dom = subprocess.run([browser, *CHROMIUM_FLAGS, f"--window-size={WIDTH},{SCREEN}", "--virtual-time-budget=5000",
                                  f"--user-data-dir={tmp}/profile", "--dump-dom", copy.as_uri()],
                                 capture_output=True, text=True, timeout=120).stdout
        m = re.search(r'id="kmesh-measure">(\d+) (\d+) (\d+)<', dom)
        if not m:
            return [f"could not lay the page out ({'open' if opened else 'closed'})"], ""
        height, width, right = map(int, m.groups())
        heights.append(height)
        if width > WIDTH or right > WIDTH:
            out.append(f"wider than the page ({'opened' if opened else 'closed'}): scroll width {width}, "
                       f"rightmost table/image/pre edge {right} px, window {WIDTH}")
    if heights[0] > SCREENS_MAX * SCREEN:
        out.append(f"{heights[0]} px tall with the folded parts closed: more than {SCREENS_MAX} screens")
    return out, f"{heights[0]} px closed ({heights[0] / SCREEN:.1f} screens), {heights[1]} px opened"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="*", type=Path)
    parser.add_argument("--screenshots", type=Path, default=None, metavar="DIR")
    parser.add_argument("--layout", action="store_true", help="lay each page out: width and height (slower)")
    args = parser.parse_args(argv)
    pages = args.reports or sorted((REPO / "outputs").glob("*/*/report.html"))
    browser = chromium()
    failed = 0
    for page in pages:
        found = problems(page, rendered_dom(browser, page))
        heights = ""
        if args.layout:
            more, heights = layout(browser, page)
            found += more
        name = f"{page.parent.parent.name}/{page.parent.name}"
        print(("ok      " if not found else "FAILED  ") + name + (f"  [{heights}]" if heights else "")
              + "".join(f"\n    {p}" for p in found))
        failed += bool(found)
        if args.screenshots:
            args.screenshots.mkdir(parents=True, exist_ok=True)
            shot = args.screenshots / f"{page.parent.parent.name}-{page.parent.name}.png"
            subprocess.run([browser, *CHROMIUM_FLAGS, f"--screenshot={shot}", f"--window-size={WIDTH},{SCREEN}",
                            page.resolve().as_uri()], capture_output=True, timeout=120)
    print(f"{len(pages) - failed} of {len(pages)} reports pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
