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

``--screenshots DIR`` also writes a 1400-pixel-wide PNG of each page's top (``<section>-<run>.png``).
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
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="*", type=Path)
    parser.add_argument("--screenshots", type=Path, default=None, metavar="DIR")
    args = parser.parse_args(argv)
    pages = args.reports or sorted((REPO / "outputs").glob("*/*/report.html"))
    browser = chromium()
    failed = 0
    for page in pages:
        found = problems(page, rendered_dom(browser, page))
        name = f"{page.parent.parent.name}/{page.parent.name}"
        print(("ok      " if not found else "FAILED  ") + name + "".join(f"\n    {p}" for p in found))
        failed += bool(found)
        if args.screenshots:
            args.screenshots.mkdir(parents=True, exist_ok=True)
            shot = args.screenshots / f"{page.parent.parent.name}-{page.parent.name}.png"
            subprocess.run([browser, *CHROMIUM_FLAGS, f"--screenshot={shot}", "--window-size=1400,2200",
                            page.resolve().as_uri()], capture_output=True, timeout=120)
    print(f"{len(pages) - failed} of {len(pages)} reports pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
