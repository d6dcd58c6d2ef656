"""The published format: what a run folder holds in ``outputs/`` (``kmesh publish`` makes it).

A local run (``runs/``) keeps everything it wrote. Its published copy holds each thing once:

    params.resolved.yaml, env.json, results.json
                          as recorded (absolute paths made relative, ``app.publish``)
    <notebook>.ipynb      the executed notebook; each image it displayed is moved, byte for byte,
                          to ``figures/`` and its output refers to the file (an ``<img>`` in
                          ``text/html``; ``metadata.kmesh_figure`` names the file, its SHA-256 and
                          size). No other output changes: stderr stays as the run printed it.
    figures/*.png         every figure once: exactly the image the notebook displayed
    raw/*.jsonl.gz        the captures, gzipped deterministically (level 9, no name, mtime 0);
                          ``RunFiles`` reads them as it reads ``raw/*.jsonl``. Other ``raw/`` files
                          (nested trees, small YAML) are stored as recorded.
    public-results.json   the allow-listed public document (``app.publish``)
    report.html           rendered from the published notebook; its images are ``figures/*.png``

Published by allow-list (``PUBLISHED_FILES``): a file not named there is left out and listed.
Never published: ``logs/`` and every ``*.log`` (engine and driver logs), a driver's state files
and archives, and a PNG the notebook saved beside itself (``record.figure_path``) from a cell
that also displayed that figure: the same figure drawn a second time at another resolution.
"""
from __future__ import annotations

import base64
import fnmatch
import gzip
import hashlib
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from kmesh_lib.base.records import COMPRESSED, sha256_capture, sha256_file

FORMAT = "kmesh.published/1"
FIGURES = "figures"
TOP_LEVEL = ("params.resolved.yaml", "env.json", "results.json")  # plus the section's notebook and *.png
NEVER = ("*.log", "*.tmp", "*.lock", ".ipynb_checkpoints")
IMAGE_TYPES = {"image/png": ".png", "image/jpeg": ".jpg"}
REGENERATED = {"report.html": "", "public-results.json": "", FIGURES: ""}  # made again at publish: not listed
FIGURE_CALL = re.compile(r"""figure_path\(\s*(f?)(["'])(.+?)\2\s*\)""")


@dataclass
class Compacted:
    """What ``compact`` did to a staged copy, for the publish line and the docs' size table."""

    left_out: list[str] = field(default_factory=list)  # 'path (why)'
    figures: list[str] = field(default_factory=list)  # figures/<name> written from the notebook
    gzipped: list[str] = field(default_factory=list)  # raw/<name> stored as raw/<name>.gz


def published_files(src: Path, notebook: str) -> tuple[list[Path], list[str]]:
    """The files of run folder ``src`` that the published copy holds (relative paths), and the
    rest as 'path (why)'. A symlink anywhere is returned as left out with its reason, for the
    caller to refuse."""
    keep, left = [], []
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if path.is_dir() and not path.is_symlink():
            continue
        why = _left_out_why(rel, path, notebook)
        if why:
            left.append(f"{rel.as_posix()} ({why})")
        elif rel.parts[0] not in REGENERATED:
            keep.append(rel)
    return keep, left


def _left_out_why(rel: Path, path: Path, notebook: str) -> str:
    if path.is_symlink():
        return "a symlink"
    if rel.parts[0] == "logs" or any(fnmatch.fnmatch(part, pat) for part in rel.parts for pat in NEVER):
        return "a log or temporary file: engine logs stay in the local run"
    if rel.parts[0] == "raw":
        return ""
    if len(rel.parts) == 1 and (rel.name in (*TOP_LEVEL, notebook) or rel.suffix == ".png"):
        return ""
    if rel.parts[0] in REGENERATED:
        return REGENERATED[rel.parts[0]]
    return "not a published file (a driver's state or archive)"


def gzip_captures(folder: Path) -> list[str]:
    """Replaces each ``raw/*.jsonl`` (top level) with ``raw/*.jsonl.gz`` holding the same bytes.

    The archive is deterministic (no file name, mtime 0, level 9), so publishing a run twice
    gives the same bytes; the content's SHA-256 is checked before the plain file goes.
    """
    done = []
    for plain in sorted((folder / "raw").glob("*.jsonl")):
        if not plain.is_file():
            continue
        packed = plain.with_name(plain.name + COMPRESSED)
        with open(plain, "rb") as src, open(packed, "wb") as out, \
                gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=9, mtime=0) as gz:
            shutil.copyfileobj(src, gz, 1 << 20)
        if sha256_capture(packed) != sha256_file(plain):
            raise OSError(f"{packed}: the gzipped copy does not read back as {plain.name}")
        plain.unlink()
        done.append(f"raw/{plain.name}")
    return done


def _saved_by(source: str, pngs: list[str]) -> list[str]:
    """The PNG files of ``pngs`` that a cell's source saves with ``record.figure_path(...)``, in
    the order named (an f-string name matches by its literal parts, sorted)."""
    found: list[str] = []
    for m in FIGURE_CALL.finditer(source):
        pattern = re.sub(r"\{[^}]*\}", "*", m[3]) if m[1] else m[3]
        found += [n for n in sorted(fnmatch.filter(pngs, pattern)) if n not in found]
    return found


def move_figures(folder: Path, notebook: str) -> tuple[list[str], list[str]]:
    """Moves every image the executed notebook displayed into ``figures/`` (see the module
    docstring); drops a top-level PNG that repeats a displayed figure. Returns the figure files
    written and the PNGs dropped ('name (why)')."""
    import nbformat

    nb_path = folder / notebook
    if not nb_path.is_file():
        return [], []
    nb = nbformat.read(str(nb_path), as_version=4)
    pngs = sorted(p.name for p in folder.glob("*.png"))
    by_hash = {sha256_file(folder / n): n for n in pngs}
    written: list[str] = []
    dropped: dict[str, str] = {}
    for index, cell in enumerate(nb.cells):
        images = [out for out in cell.get("outputs", []) if any(t in out.get("data", {}) for t in IMAGE_TYPES)]
        if not images:
            continue
        saved = _saved_by(cell.source, pngs)
        named = saved if len(saved) == len(images) else []
        for k, out in enumerate(images):
            kind = next(t for t in IMAGE_TYPES if t in out.data)
            data = base64.b64decode(out.data[kind])
            digest = hashlib.sha256(data).hexdigest()
            twin = by_hash.get(digest)
            stem = Path(twin or (named[k] if named else f"cell{index:02d}-{k + 1}")).stem
            name = f"{FIGURES}/{stem}{IMAGE_TYPES[kind]}"
            if name in written:
                name = f"{FIGURES}/{stem}-cell{index:02d}-{k + 1}{IMAGE_TYPES[kind]}"
            (folder / FIGURES).mkdir(exist_ok=True)
            (folder / name).write_bytes(data)
            written.append(name)
            for repeat in {twin, named[k] if named else None} - {None}:
                dropped[repeat] = f"the figure cell {index} displayed; published as {name}"
            del out.data[kind]
            out.data["text/html"] = f'<img src="{name}" alt="figure {name}">'
            out.metadata.pop(kind, None)
            out.metadata["kmesh_figure"] = {"file": name, "sha256": digest, "bytes": len(data), "was": kind}
    if written:
        nb.metadata["kmesh_published"] = {
            "format": FORMAT, "figures": len(written),
            "note": "each displayed image was moved byte for byte to the file its output names (kmesh_figure)"}
        nbformat.write(nb, str(nb_path))
    for name in dropped:
        (folder / name).unlink()
    return written, [f"{n} ({why})" for n, why in dropped.items()]


def compact(folder: Path, notebook: str) -> Compacted:
    """Brings a staged copy of a run (``published_files`` only) into the published format."""
    figures, dropped = move_figures(folder, notebook)
    return Compacted(left_out=dropped, figures=figures, gzipped=gzip_captures(folder))


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
