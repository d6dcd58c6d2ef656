"""Regenerates every notebook's `parameters` cell from its section's resolved smoke profile.

    python scripts/sync_parameters_cells.py           # rewrite the cells in notebooks/ and tests/golden/
    python scripts/sync_parameters_cells.py --check   # only report; exit 1 when a cell differs

The cell is one ``NAME = value  # description`` line per field of the section's Params, in field
order, with the smoke profile's values and each field's ``Field(description=...)``; so an
interactive notebook starts from the smoke profile and a default lives only in the Params class
and params/. Only that cell's source changes: its id, metadata, outputs and every other cell stay
as they are. papermill injects a run's values (RUN_DIR, SEED, PROFILE, ...) in a cell after it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kmesh_lib.app import registry  # noqa: E402
from kmesh_lib.base.params import parameters_cell, resolve_params  # noqa: E402

NOTEBOOK_DIRS = (ROOT / "notebooks", ROOT / "tests" / "golden")


def cell_source(section) -> str:
    config, _, _ = resolve_params(section, "smoke", [], [])
    header = (f"# Parameters: the smoke profile (scripts/sync_parameters_cells.py writes this cell; papermill injects "
              f"a run's values after it; `kmesh plan {section.NUMBER}` shows them)")
    return parameters_cell(config, header)


def parameters_cell_of(notebook: dict) -> dict:
    cells = [c for c in notebook["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise SystemExit(f"expected one cell tagged 'parameters', found {len(cells)}")
    return cells[0]


def notebooks() -> list[tuple[Path, object]]:
    """(notebook path, section) for every section notebook and its golden copy."""
    return [(d / s.NOTEBOOK, s) for d in NOTEBOOK_DIRS for s in registry.SECTIONS.values() if (d / s.NOTEBOOK).exists()]


def sync(path: Path, section, write: bool) -> bool:
    """Returns whether the cell differed (and was rewritten when ``write``)."""
    text = path.read_text(encoding="utf-8")
    notebook = json.loads(text)
    cell = parameters_cell_of(notebook)
    want = cell_source(section)
    if "".join(cell["source"]) == want:
        return False
    if write:
        cell["source"] = want.splitlines(keepends=True)
        path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="report cells that differ; change nothing")
    args = parser.parse_args()
    stale = [path for path, section in notebooks() if sync(path, section, write=not args.check)]
    for path in stale:
        print(f"{'differs' if args.check else 'rewrote'}: {path.relative_to(ROOT)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
