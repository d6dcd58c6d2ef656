"""One-off (3 Dec 2026): rewrite every published run's executed notebook as compact JSON, as ``kmesh publish``
now writes it (``app.compact.compact_notebook``): the content ``nbformat`` reads is unchanged (checked for each),
the bytes a quarter to a third fewer. Reports are rendered from that content and stay as they are.

    python scripts/compact_published_notebooks.py [--dry-run]
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
from kmesh_lib.app.compact import compact_notebook  # noqa: E402
from kmesh_lib.app.runs import published_root  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="say what would be saved; write nothing")
    args = ap.parse_args()
    total = 0
    for section in registry.SECTIONS.values():
        for run in sorted(p for p in (published_root() / section.KEY).glob("*") if (p / section.NOTEBOOK).is_file()):
            if args.dry_run:
                with tempfile.TemporaryDirectory() as tmp:
                    shutil.copy(run / section.NOTEBOOK, Path(tmp) / section.NOTEBOOK)
                    saved = compact_notebook(Path(tmp), section.NOTEBOOK)
            else:
                saved = compact_notebook(run, section.NOTEBOOK)
            total += saved
            print(f"{section.KEY}/{run.name}: {saved:,} bytes {'would be ' if args.dry_run else ''}saved")
    print(f"total: {total:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
