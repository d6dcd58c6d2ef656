"""One-off (3 Dec 2026 for notebooks, 4 Dec for the JSON records): rewrite every published run's executed notebook,
``results.json`` and ``public-results.json`` as compact JSON, as ``kmesh publish`` now writes them
(``app.compact.compact_notebook`` and ``compact_json``): the content read back is unchanged (checked for each
file), the bytes a fifth to a third fewer. Reports are rendered from that content and stay as they are.

    python scripts/compact_published_runs.py [--dry-run]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kmesh_lib.app import registry  # noqa: E402
from kmesh_lib.app.compact import compact_json, compact_notebook  # noqa: E402
from kmesh_lib.app.published import PUBLIC_FILE  # noqa: E402
from kmesh_lib.app.runs import published_root  # noqa: E402


def compact_run(run: Path, notebook: str) -> int:
    return compact_notebook(run, notebook) + compact_json(run / "results.json") + compact_json(run / PUBLIC_FILE)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="say what would be saved; write nothing")
    args = ap.parse_args()
    total = 0
    for section in registry.SECTIONS.values():
        for run in sorted(p for p in (published_root() / section.KEY).glob("*") if (p / section.NOTEBOOK).is_file()):
            if args.dry_run:
                with tempfile.TemporaryDirectory() as tmp:
                    shutil.copytree(run, Path(tmp) / run.name)
                    saved = compact_run(Path(tmp) / run.name, section.NOTEBOOK)
            else:
                saved = compact_run(run, section.NOTEBOOK)
            total += saved
            print(f"{section.KEY}/{run.name}: {saved:,} bytes {'would be ' if args.dry_run else ''}saved")
    print(f"total: {total:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
