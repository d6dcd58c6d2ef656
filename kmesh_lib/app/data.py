"""``kmesh data fetch|verify|manifest``: put the pinned data sets under the data root and check them.

    kmesh data fetch [--from DIR] [--data-root DIR] [NAME ...]
        every file of each data set's manifest, from GitHub at the pinned revision, or with
        --from from a local mirror laid out like a data root (DIR/lmcache-agent-trace/...,
        DIR/game24/24.csv): for machines without network. A file is written only after its
        SHA-256 matches the manifest (to a temporary name, then renamed); files already present
        and matching are left alone.
    kmesh data verify [--data-root DIR] [NAME ...]
        re-hash what is under the data root against the manifests; exit 1 on a difference.
    kmesh data manifest --from DIR [NAME ...]
        rewrite data/<name>.sha256 from a trusted copy (when a pin moves).

The data sets, their revisions and the data root are defined in ``kmesh_lib.base.data``.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import urllib.request
from pathlib import Path

from kmesh_lib.base.data import (
    DATA_ROOT_ENV,
    DATA_SETS,
    DataSet,
    check_data_set,
    data_root,
    manifest_text,
    sha256_of,
)
from kmesh_lib.base.params import WRITE_REFUSED

NETWORK_TIMEOUT_S = 60


class FetchError(RuntimeError):
    """A file could not be fetched or did not match its manifest. The message names it."""


def _copy_verified(source, dest: Path, want: str, label: str) -> int:
    """Streams ``source`` (a binary file object) into ``dest`` through a temporary name, renaming
    only when the SHA-256 equals ``want``. Returns the bytes written."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    hasher = hashlib.sha256()
    num_bytes = 0
    try:
        with open(tmp, "wb") as out:
            while chunk := source.read(1 << 20):
                hasher.update(chunk)
                out.write(chunk)
                num_bytes += len(chunk)
        if hasher.hexdigest() != want:
            raise FetchError(f"{label}: sha256 {hasher.hexdigest()[:16]}… does not match the manifest's {want[:16]}…")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return num_bytes


def fetch_file(ds: DataSet, relpath: str, want: str, dest: Path, mirror: Path | None) -> int:
    if mirror is not None:
        source_path = mirror / ds.local_dir / relpath
        if not source_path.is_file():
            raise FetchError(f"{source_path}: not in the mirror")
        with open(source_path, "rb") as source:
            return _copy_verified(source, dest, want, str(source_path))
    url = ds.url(relpath)
    try:
        with urllib.request.urlopen(url, timeout=NETWORK_TIMEOUT_S) as source:
            return _copy_verified(source, dest, want, url)
    except OSError as exc:  # URLError, HTTPError and timeouts are OSErrors
        raise FetchError(f"{url}: {getattr(exc, 'reason', None) or exc}") from None


def fetch(names: list[str], mirror: Path | None, root: Path, out=print) -> int:
    """Fetches each data set into ``root``; returns the number of files that failed."""
    num_failed = 0
    for name in names:
        ds = DATA_SETS[name]
        manifest = ds.manifest()
        present = fetched = num_bytes = 0
        failures = []
        for relpath, want in sorted(manifest.items()):
            dest = ds.path(root) / relpath
            if dest.is_file() and not dest.is_symlink() and sha256_of(dest) == want:
                present += 1
                continue
            try:
                num_bytes += fetch_file(ds, relpath, want, dest, mirror)
                fetched += 1
            except (FetchError, OSError) as exc:
                failures.append(str(exc) if isinstance(exc, FetchError) else f"{dest}: {exc.strerror or exc}")
        source = f"mirror {mirror}" if mirror else f"github.com/{ds.repo}"
        out(f"{ds.name} @ {ds.revision[:12]} from {source}: {len(manifest)} file(s), {present} already present, "
            f"{fetched} fetched ({num_bytes / 1e6:.1f} MB), {len(failures)} failed -> {ds.path(root)}")
        for failure in failures[:10]:
            out(f"  failed: {failure}")
        extra = _extra_files(ds.path(root), manifest)
        if extra:
            out(f"  note: {len(extra)} file(s) under {ds.path(root)} are not in the manifest "
                f"(first: {extra[0]}); the audit reads every file there")
        num_failed += len(failures)
    return num_failed


def _extra_files(base: Path, manifest: dict[str, str]) -> list[str]:
    if not base.is_dir():
        return []
    found = sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file() or p.is_symlink())
    return [p for p in found if p not in manifest and not p.rsplit("/", 1)[-1].startswith(".")]


def verify(names: list[str], root: Path, out=print) -> int:
    num_bad = 0
    incomplete = []
    for name in names:
        status = check_data_set(name, root)
        out(status.line())
        num_bad += not status.ok
        if status.missing:
            incomplete.append(name)
    if incomplete:
        out(f"to get the missing files: kmesh data fetch {' '.join(incomplete)} (--from DIR: from a local copy)")
    return num_bad


def write_manifests(names: list[str], mirror: Path, out=print) -> None:
    for name in names:
        ds = DATA_SETS[name]
        base = mirror / ds.local_dir
        files = sorted(p for p in base.rglob("*") if p.is_file() and not p.is_symlink())
        if not files:
            raise FetchError(f"{base}: no files to write a manifest from")
        hashes = {p.relative_to(base).as_posix(): sha256_of(p) for p in files}
        ds.manifest_path.parent.mkdir(parents=True, exist_ok=True)
        ds.manifest_path.write_text(manifest_text(ds, hashes))
        out(f"{ds.manifest_path}: {len(hashes)} files from {base}")


def add_parser(sub) -> None:
    """Registers ``kmesh data`` on the CLI's subparsers."""
    p = sub.add_parser("data", help="fetch or verify the pinned data sets (kmesh data fetch --from DIR)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("fetch", "verify", "manifest"))
    p.add_argument("names", nargs="*", metavar="NAME", help=f"data sets (default: all of {', '.join(DATA_SETS)})")
    p.add_argument("--from", dest="mirror", type=Path, default=None,
                   help="a local mirror laid out like a data root, instead of the network")
    p.add_argument("--data-root", type=Path, default=None,
                   help=f"where the data goes (default: ${DATA_ROOT_ENV}, else ../shared/data from the repo)")
    p.set_defaults(fn=main)


def main(args) -> int:
    names = args.names or list(DATA_SETS)
    unknown = [n for n in names if n not in DATA_SETS]
    if unknown:
        print(f"kmesh data: unknown data set {unknown[0]!r}; known: {', '.join(DATA_SETS)}", file=sys.stderr)
        return 2
    root = (args.data_root or data_root()).resolve()
    if args.action == "fetch":  # a folder written to, as a run's (base.params.WRITE_REFUSED)
        refused = next((r for r in WRITE_REFUSED if root == r or root.is_relative_to(r)), None)
        if refused is not None:
            print(f"kmesh data: data root {root}: under {refused}, a system folder; name a folder of your own",
                  file=sys.stderr)
            return 2
    if args.mirror is not None and not args.mirror.is_dir():
        print(f"kmesh data: --from {args.mirror}: not a directory", file=sys.stderr)
        return 2
    try:
        if args.action == "fetch":
            if args.mirror is not None and args.mirror.resolve() == root:
                return 1 if verify(names, root) else 0
            return 1 if fetch(names, args.mirror, root) else 0
        if args.action == "verify":
            return 1 if verify(names, root) else 0
        if args.mirror is None:
            print("kmesh data manifest: --from DIR is required (the trusted copy to hash)", file=sys.stderr)
            return 2
        write_manifests(names, args.mirror)
        return 0
    except (FetchError, ValueError) as exc:
        print(f"kmesh data {args.action}: {exc}", file=sys.stderr)
        return 1


__all__ = ["fetch", "verify", "write_manifests", "add_parser", "FetchError"]
