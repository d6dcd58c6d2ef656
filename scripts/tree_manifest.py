"""Writes ``.kmesh-tree.json`` (``kmesh_lib.base.provenance``) at the checkout's root: the commit and the blob id
of each file it holds, so a copy of the tree without ``.git`` (the GPU machine's) measures its own commit and
dirtiness. Run it where the copy is made, right before the device call; carry the file with the tree.

    python scripts/tree_manifest.py          # prints the commit, and how many files differ from it here
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kmesh_lib.base.provenance import MANIFEST, check_manifest, tree_manifest  # noqa: E402

root = Path(__file__).resolve().parent.parent
manifest = tree_manifest(root)
(root / MANIFEST).write_text(json.dumps(manifest, separators=(",", ":")) + "\n", encoding="utf-8")
here = check_manifest(root, manifest)
print(f"{MANIFEST}: commit {manifest['commit'][:12]}, {len(manifest['files'])} files; "
      + (f"this tree differs in {here['num_changed']} (a run records it dirty)" if here["dirty"] else "this tree matches"))
