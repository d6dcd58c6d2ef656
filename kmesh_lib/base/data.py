"""The data sets kmesh reads, where they live, and how they are pinned.

One setting, the **data root**: ``$KMESH_DATA_ROOT`` when set, else ``../shared/data`` next to the
repository (where the data is in the workspace kmesh was built in). A relative value is relative to
the repository root, like every path in ``params/``. ``kmesh data fetch`` fills it.

A parameter that names data says so with a ``$KMESH_DATA_ROOT/`` prefix (``TRACE_ROOT:
$KMESH_DATA_ROOT/lmcache-agent-trace``); ``resolve_path`` expands it at the moment of use, so a
run's ``params.resolved.yaml`` holds no machine's absolute path and ``kmesh verify`` finds the data
wherever the verifying machine keeps it.

Each data set is pinned to an upstream git revision and to a SHA-256 manifest kept in the repo
(``data/<name>.sha256``, the format ``sha256sum -c`` reads, paths relative to the set's directory).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from kmesh_lib.base.paths import REPO_ROOT, in_repo

DATA_ROOT_ENV = "KMESH_DATA_ROOT"
DEFAULT_DATA_ROOT = "../shared/data"  # relative to the repository root
DATA_ROOT_PREFIX = "$" + DATA_ROOT_ENV
MANIFEST_DIR = REPO_ROOT / "data"


def data_root() -> Path:
    value = os.environ.get(DATA_ROOT_ENV) or DEFAULT_DATA_ROOT
    return in_repo(Path(value).expanduser()).resolve()


def resolve_path(value: str | Path) -> Path:
    """A parameter's path: ``$KMESH_DATA_ROOT/...`` under the data root, a relative path under
    the repository root (papermill runs notebooks from ``notebooks/``, so the working directory
    is no anchor), an absolute path as it is."""
    text = str(value)
    if text == DATA_ROOT_PREFIX or text.startswith(DATA_ROOT_PREFIX + "/"):
        return data_root() / text[len(DATA_ROOT_PREFIX) + 1:]
    return in_repo(Path(text).expanduser()).resolve()


@dataclass(frozen=True)
class DataSet:
    """One pinned data set: ``local_dir`` under the data root mirrors ``upstream_dir`` of
    ``repo`` at ``revision``."""

    name: str
    local_dir: str
    repo: str
    revision: str
    upstream_dir: str
    license: str
    used_by: str

    @property
    def manifest_path(self) -> Path:
        return MANIFEST_DIR / f"{self.name}.sha256"

    def path(self, root: Path | None = None) -> Path:
        return (root or data_root()) / self.local_dir

    def url(self, relpath: str) -> str:
        upstream = f"{self.upstream_dir}/{relpath}" if self.upstream_dir else relpath
        return f"https://raw.githubusercontent.com/{self.repo}/{self.revision}/{quote(upstream)}"

    def manifest(self) -> dict[str, str]:
        return read_manifest(self.manifest_path)


DATA_SETS = {ds.name: ds for ds in (
    DataSet("lmcache-agent-trace", "lmcache-agent-trace", "LMCache/lmcache-agent-trace",
            "780bcc2979715150d8b9fd4737e026e625444cc9", "", "Apache-2.0",
            "section 17 (trace audit): the JSONL records only; upstream's READMEs, scripts and images are left out"),
    DataSet("game24", "game24", "princeton-nlp/tree-of-thought-llm",
            "8050e67d0e3a0fddc424d7fa5801538722a4c4cc", "src/tot/data/24", "MIT",
            "section 19 (search headroom): the Game of 24 puzzles, in file order"),
    DataSet("mooncake-traces", "mooncake-traces", "kvcache-ai/Mooncake",
            "3b5a594133958449a1feaf1c9e0fc1b553e34a28", "FAST25-release/traces", "Apache-2.0",
            "section 23 (production trace): the conversation and synthetic traces of the FAST'25 release"),
)}


def read_manifest(path: Path) -> dict[str, str]:
    """``{relpath: sha256}`` from a ``sha256sum`` file; ``#`` lines are comments. A path that is
    absolute or climbs out with ``..`` is refused: a manifest must not place files elsewhere."""
    entries = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        digest, sep, relpath = line.partition("  ")
        parts = Path(relpath).parts
        if (not sep or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest)
                or not relpath or Path(relpath).is_absolute() or ".." in parts):
            raise ValueError(f"{path}: line {number} is not '<sha256>  <relative path>'")
        entries[relpath] = digest
    return entries


def manifest_text(ds: DataSet, hashes: dict[str, str]) -> str:
    header = (f"# {ds.name}: {ds.repo} at {ds.revision}" + (f", {ds.upstream_dir}/" if ds.upstream_dir else "")
              + f" ({ds.license})\n# used by {ds.used_by}\n"
              f"# check: cd $KMESH_DATA_ROOT/{ds.local_dir} && sha256sum -c <repo>/data/{ds.manifest_path.name}\n")
    return header + "".join(f"{digest}  {relpath}\n" for relpath, digest in sorted(hashes.items()))


def sha256_of(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            hasher.update(chunk)
    return hasher.hexdigest()


@dataclass
class DataStatus:
    """How the files under the data root compare with a manifest."""

    data_set: DataSet
    root: Path
    num_files: int
    missing: list[str]
    changed: list[str]

    @property
    def ok(self) -> bool:
        return not self.missing and not self.changed

    def line(self) -> str:
        if self.ok:
            return f"{self.data_set.name}: {self.num_files} file(s) match data/{self.data_set.manifest_path.name}"
        return (f"{self.data_set.name}: {len(self.missing)} of {self.num_files} files missing, "
                f"{len(self.changed)} changed under {self.data_set.path(self.root)}"
                + (f" (first: {(self.missing + self.changed)[0]})" if self.missing or self.changed else ""))


def check_data_set(name: str, root: Path | None = None, rehash: bool = True) -> DataStatus:
    """Every manifest file present under the data root and, with ``rehash``, unchanged."""
    ds = DATA_SETS[name]
    base = ds.path(root)
    missing, changed = [], []
    manifest = ds.manifest()
    for relpath, digest in manifest.items():
        path = base / relpath
        if not path.is_file():
            missing.append(relpath)
        elif rehash and sha256_of(path) != digest:
            changed.append(relpath)
    return DataStatus(ds, root or data_root(), len(manifest), missing, changed)


def missing_reason(name: str) -> str | None:
    """Why a data set cannot be used here (for a test's skip), or None when all its files are
    present. Presence only: ``kmesh data verify`` re-hashes."""
    status = check_data_set(name, rehash=False)
    if not status.missing:
        return None
    return (f"data set {name} is not under the data root {status.root} ({len(status.missing)} of "
            f"{status.num_files} files missing); set {DATA_ROOT_ENV} or run `kmesh data fetch`")
