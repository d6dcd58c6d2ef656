"""One-off (issue 45, 4 Dec 2026): apply ``kmesh publish``'s redaction (``app.redact.redact_folder``) to runs
published before it: credential-looking names hashed, the host name and the kernel string out of ``env.json``,
the host out of ``@HOST`` clock domains, vLLM's log lines out of the executed notebooks. A capture that changes
gets its new SHA-256 in ``public-results.json`` and is listed in ``captures_with_paths_rewritten``.

    python scripts/redact_published_runs.py [--root DIR] [--dry-run]

``--root`` names a published set (default: the repository's, or ``KMESH_PUBLISHED_ROOT``); ``--dry-run``
works on a copy of each run and reports what would change.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kmesh_lib.app import registry  # noqa: E402
from kmesh_lib.app.publish import rehash_copy  # noqa: E402
from kmesh_lib.app.published import PUBLIC_FILE  # noqa: E402
from kmesh_lib.app.redact import redact_folder  # noqa: E402
from kmesh_lib.app.runs import published_root  # noqa: E402
from kmesh_lib.base.records import COMPACT_JSON, open_capture  # noqa: E402


def redact_run(run: Path, notebook: str) -> dict[str, list[str]]:
    done = redact_folder(run, notebook)
    if done.changes:  # the record's file hashes follow the redacted files; the ones recorded stay as measured
        changed = rehash_copy(run)
        if changed:
            done.add("results.json", f"capture_sha256 of {', '.join(sorted(changed))} after redaction "
                                     "(as measured: capture_sha256_as_measured)")
    public_path = run / PUBLIC_FILE
    if done.captures and public_path.is_file():
        public = json.loads(public_path.read_text())
        for rel in done.captures:
            name = rel.removeprefix("raw/").removesuffix(".xz")
            if name in public.get("capture_hashes", {}):
                with open_capture(run / rel) as f:
                    public["capture_hashes"][name] = hashlib.sha256(f.read()).hexdigest()
                public["captures_with_paths_rewritten"] = sorted(set(public.get("captures_with_paths_rewritten", []))
                                                                 | {name})
        public_path.write_text(json.dumps(public, **COMPACT_JSON) + "\n")
        done.add(PUBLIC_FILE, f"capture hashes of {len(done.captures)} redacted captures")
    return done.changes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=None, help="the published set (default: outputs/)")
    ap.add_argument("--dry-run", action="store_true", help="work on a copy of each run; write nothing here")
    args = ap.parse_args()
    root = args.root or published_root()
    runs = changed = 0
    for section in registry.SECTIONS.values():
        for run in sorted(p for p in (root / section.KEY).glob("*") if (p / section.NOTEBOOK).is_file()):
            runs += 1
            if args.dry_run:
                with tempfile.TemporaryDirectory() as tmp:
                    shutil.copytree(run, Path(tmp) / run.name)
                    changes = redact_run(Path(tmp) / run.name, section.NOTEBOOK)
            else:
                changes = redact_run(run, section.NOTEBOOK)
            changed += bool(changes)
            for rel, what in changes.items():
                print(f"{section.KEY}/{run.name}/{rel}: {'; '.join(what)}")
    print(f"{changed} of {runs} runs {'would change' if args.dry_run else 'changed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
