"""The published format: what a run folder holds in ``outputs/`` (``kmesh publish`` makes it).

A local run (``runs/``) keeps everything it wrote. Its published copy holds each thing once:

    params.resolved.yaml, env.json, results.json
                          as recorded (absolute paths made relative, ``app.publish``); results.json
                          as compact JSON (``compact_json``: the same value, no indentation)
    <notebook>.ipynb      the executed notebook, as compact JSON (``compact_notebook``: nbformat's content
                          without its indentation); each image output refers to its figure file (an
                          ``<img>`` in ``text/html``; ``metadata.kmesh_figure`` names the file and
                          keeps the displayed image's SHA-256 and size); the saved widget state
                          (progress bars, the live panel) is dropped and counted. No other output
                          changes: stderr stays as the run printed it.
    figures/*.png         every figure once: the PNG the cell saved with ``record.figure_path``
                          from the figure it displayed, or else the displayed image itself; stored
                          as a 256-colour palette PNG where that is a fifth smaller (``palette_figures``)
    raw/*.jsonl.xz        the captures, xz-compressed (preset 9e; the container holds no name or
                          time, so publishing twice gives the same bytes); ``RunFiles`` reads them
                          as it reads ``raw/*.jsonl`` (xz, not gzip: on the published set 0.40 MB
                          against 0.75 MB, and 4x smaller for section 18's token lists). Other ``raw/`` files
                          (nested trees, small YAML) are stored plain. Machine paths in any of
                          them are made relative first (``app.publish``).
    public-results.json   the allow-listed public document (``app.publish``), as compact JSON
    report.html           rendered from the published notebook; its images are ``figures/*.png``,
                          its stylesheet the published set's ``report.css`` (``app.published``)

Published by allow-list (``published_files``): a file not named above is left out and listed.
Never published: ``logs/`` and every ``*.log`` (engine and driver logs), a driver's state files
and archives, a ``raw/`` file that repeats a top-level record, and a second copy of a figure
(the notebook's base64 image next to the PNG its cell saved from the same matplotlib figure).
"""
from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import lzma
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kmesh_lib.base.records import COMPACT_JSON, COMPRESSED, sha256_capture, sha256_file

FORMAT = "kmesh.published/1"
FIGURES = "figures"
TOP_LEVEL = ("params.resolved.yaml", "env.json", "results.json")  # plus the section's notebook and *.png
NEVER = ("*.log", "*.tmp", "*.lock", ".ipynb_checkpoints")
IMAGE_TYPES = {"image/png": ".png", "image/jpeg": ".jpg"}
REGENERATED = {"report.html": "", "public-results.json": ""}  # made again at publish: not copied, not listed
FIGURE_CALL = re.compile(r"""figure_path\(\s*(f?)(["'])(.+?)\2\s*\)""")


@dataclass
class Compacted:
    """What ``compact`` did to a staged copy, for the publish line and the docs' size table."""

    left_out: list[str] = field(default_factory=list)  # 'path (why)'
    figures: list[str] = field(default_factory=list)  # figures/<name> written from the notebook
    compressed: list[str] = field(default_factory=list)  # raw/<name> stored as raw/<name>.xz
    paths_rewritten: list[str] = field(default_factory=list)  # files whose machine paths became relative
    moved: list[str] = field(default_factory=list)  # 'name.png (why)': a saved PNG now in figures/


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
    if rel.parts[0] in ("raw", FIGURES):  # figures/: a published run published again in place
        return ""
    if len(rel.parts) == 1 and (rel.name in (*TOP_LEVEL, notebook) or rel.suffix == ".png"):
        return ""
    if rel.parts[0] in REGENERATED:
        return REGENERATED[rel.parts[0]]
    return "not a published file (a driver's state or archive)"


def _content_key(path: Path) -> str:
    """What makes two records copies: their bytes, or for a YAML mapping its content but ``RUN_DIR``
    (the folder a run was measured in, which publishing rewrites in one copy and a device run records
    as its own folder in the other)."""
    if path.suffix in (".yaml", ".yml"):
        try:
            data = yaml.safe_load(path.read_text())
        except (yaml.YAMLError, UnicodeDecodeError):
            data = None
        if isinstance(data, dict):
            return "yaml:" + json.dumps({k: v for k, v in data.items() if k != "RUN_DIR"}, sort_keys=True, default=str)
    return sha256_file(path)


def drop_raw_copies(folder: Path) -> list[str]:
    """Removes a ``raw/`` file that copies a top-level record (section 21 keeps a copy of
    ``params.resolved.yaml`` in ``raw/`` for its child processes; ``_content_key``): 'raw/name (why)'
    for each."""
    records = {_content_key(p): p.name for p in folder.iterdir() if p.is_file()}
    dropped = []
    for path in sorted((folder / "raw").rglob("*")):
        if path.is_file() and (twin := records.get(_content_key(path))):
            path.unlink()
            dropped.append(f"{path.relative_to(folder).as_posix()} (a copy of {twin})")
    return dropped


def compress_captures(folder: Path) -> list[str]:
    """Replaces each ``raw/*.jsonl`` (top level) with ``raw/*.jsonl.xz`` holding the same bytes;
    the content's SHA-256 is checked before the plain file goes."""
    done = []
    for plain in sorted((folder / "raw").glob("*.jsonl")):
        if not plain.is_file():
            continue
        packed = plain.with_name(plain.name + COMPRESSED)
        with open(plain, "rb") as src, lzma.open(packed, "wb", preset=9 | lzma.PRESET_EXTREME) as out:
            shutil.copyfileobj(src, out, 1 << 20)
        if sha256_capture(packed) != sha256_file(plain):
            raise OSError(f"{packed}: the compressed copy does not read back as {plain.name}")
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
    """Keeps every figure the executed notebook displayed once, in ``figures/``, and makes the
    notebook's image outputs refer to it (see the module docstring). Per displayed image:

    - a top-level PNG with the same bytes: that file, moved;
    - else, where the cell saved as many PNGs with ``record.figure_path`` as it displayed images:
      the PNG it saved from the same figure (drawn at the notebook's savefig dpi, smaller than the
      inline image), moved; the output's ``metadata.kmesh_figure.displayed`` keeps the displayed
      image's SHA-256 and size;
    - else the displayed bytes themselves, as ``figures/cell<NN>-<k>.png``.

    It also drops the notebook's saved widget state (``metadata.widgets``: the models behind
    progress bars and the live panel, including the panel's own PNG), counted in
    ``metadata.kmesh_published``: it is the state of a UI, not a result, and the report shows no
    widget. The widget views stay in the cells.

    Returns the figure files and 'name (why)' for each top-level PNG that was moved.
    """
    import nbformat

    nb_path = folder / notebook
    if not nb_path.is_file():
        return [], []
    nb = nbformat.read(str(nb_path), as_version=4)
    pngs = sorted(p.name for p in folder.glob("*.png"))
    by_hash = {sha256_file(folder / n): n for n in pngs}
    written: list[str] = []
    moved: dict[str, str] = {}
    for index, cell in enumerate(nb.cells):
        images = [out for out in cell.get("outputs", []) if any(t in out.get("data", {}) for t in IMAGE_TYPES)]
        if not images:
            continue
        saved = [n for n in _saved_by(cell.source, pngs) if n not in moved]
        named = saved if len(saved) == len(images) else []
        for k, out in enumerate(images):
            kind = next(t for t in IMAGE_TYPES if t in out.data)
            data = base64.b64decode(out.data[kind])
            displayed = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
            source = by_hash.get(displayed["sha256"]) or (named[k] if named else None)
            name = f"{FIGURES}/{source or f'cell{index:02d}-{k + 1}{IMAGE_TYPES[kind]}'}"
            (folder / FIGURES).mkdir(exist_ok=True)
            if source and source not in moved:
                (folder / source).rename(folder / name)
                moved[source] = f"cell {index} displayed this figure; kept once as {name}"
            elif not source:
                (folder / name).write_bytes(data)
            written.append(name)
            del out.data[kind]
            out.data["text/html"] = f'<img src="{name}" alt="figure {name}">'
            out.metadata.pop(kind, None)
            out.metadata["kmesh_figure"] = {"file": name, "was": kind, "displayed": displayed,
                                            "kept": "the displayed bytes" if displayed["sha256"] == sha256_file(
                                                folder / name) else "the PNG this cell saved from the same figure"}
    widgets = nb.metadata.pop("widgets", None)
    if written or widgets:
        models = (widgets or {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
        nb.metadata["kmesh_published"] = {
            "format": FORMAT, "figures": len(written),
            "note": "each displayed image is kept once, in the file its output names (metadata kmesh_figure)",
            **({"widget_state_dropped": {"models": len(models), "bytes": len(json.dumps(widgets))}} if widgets else {})}
        nbformat.write(nb, str(nb_path))
    return written, [f"{n} ({why})" for n, why in moved.items()]


def drop_table_text(folder: Path, notebook: str) -> int:
    """Drops the ``text/plain`` copy of every output whose ``text/html`` holds a ``<table``.

    pandas displays a DataFrame twice, as an HTML table and as its fixed-width text; every reader of
    a published notebook (Jupyter, nbconvert's report, GitHub) shows the HTML, so the text is a
    second copy of the same numbers (a quarter of a notebook's bytes). ``metadata.kmesh_published``
    counts what went. Returns the bytes dropped (0 when nothing was).
    """
    import nbformat

    nb_path = folder / notebook
    if not nb_path.is_file():
        return 0
    nb = nbformat.read(str(nb_path), as_version=4)
    dropped = count = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "text/plain" in data and "<table" in str(data.get("text/html", "")):
                dropped += len(json.dumps(data.pop("text/plain")))
                count += 1
    if count:
        meta = nb.metadata.setdefault("kmesh_published", {"format": FORMAT})
        meta["table_text_dropped"] = {"outputs": count + meta.get("table_text_dropped", {}).get("outputs", 0),
                                      "note": "each table output keeps its HTML; its plain-text copy went"}
        nbformat.write(nb, str(nb_path))
    return dropped


PALETTE_MIN_SAVING = 0.2  # keep a palette copy only when it is at least a fifth smaller


def palette_figures(folder: Path, notebook: str) -> int:
    """Stores each ``figures/*.png`` as a 256-colour palette PNG where that is at least a fifth smaller.

    A matplotlib plot holds few colours besides its anti-aliased edges: on the published set of
    1 Dec 2026 (44 figures) the palette copies took 0.73 MB against 2.01 MB, with a largest change
    of 29/255 and a mean of 0.08/255 per pixel channel (median-cut palette, no dithering). The
    numbers behind a figure are in ``raw/`` and ``results.json``, never only in its pixels. Each
    output that shows the file says so in ``metadata.kmesh_figure.stored`` (with the file's new
    SHA-256). Returns the bytes saved.
    """
    import io

    import nbformat
    from PIL import Image

    saved, stored = 0, {}
    for png in sorted((folder / FIGURES).glob("*.png")):
        before = png.read_bytes()
        try:
            with Image.open(io.BytesIO(before)) as im:
                if im.mode == "P":
                    continue  # already a palette image (published before)
                palette = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT,
                                                     dither=Image.Dither.NONE)
        except (OSError, ValueError):  # not an image Pillow reads: kept as it is
            continue
        out = io.BytesIO()
        palette.save(out, "PNG", optimize=True)
        if len(out.getvalue()) > (1 - PALETTE_MIN_SAVING) * len(before):
            continue
        png.write_bytes(out.getvalue())
        saved += len(before) - len(out.getvalue())
        stored[f"{FIGURES}/{png.name}"] = {"as": "256-colour palette PNG (app.compact.palette_figures)",
                                          "sha256": hashlib.sha256(out.getvalue()).hexdigest(),
                                          "bytes_before": len(before)}
    nb_path = folder / notebook
    if stored and nb_path.is_file():
        nb = nbformat.read(str(nb_path), as_version=4)
        for cell in nb.cells:
            for out in cell.get("outputs", []):
                figure = out.get("metadata", {}).get("kmesh_figure")
                if figure and figure.get("file") in stored:
                    figure["stored"] = stored[figure["file"]]
        nbformat.write(nb, str(nb_path))
    return saved


def compact_notebook(folder: Path, notebook: str) -> int:
    """Rewrites the executed notebook as compact JSON: nbformat's content (what ``nbformat.read`` gives, which
    every reader shows), without nbformat's indentation and per-line string lists, a quarter to a third of a
    published notebook's bytes (625 kB over the published set of 3 Dec 2026). The content read back must be equal,
    or nothing is written. Returns the bytes saved (0 when there is no notebook or nothing to save)."""
    import nbformat

    nb_path = folder / notebook
    if not nb_path.is_file():
        return 0
    before = nb_path.read_text(encoding="utf-8")
    nb = nbformat.reads(before, as_version=4)
    after = json.dumps(nb, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n"
    if nbformat.reads(after, as_version=4) != nb:
        raise ValueError(f"{nb_path}: the notebook as compact JSON reads back differently")
    saved = len(before.encode()) - len(after.encode())
    if saved > 0:
        nb_path.write_text(after, encoding="utf-8")
    return max(saved, 0)


def compact_json(path: Path) -> int:
    """Rewrites a JSON record without its indentation (key order kept, text as UTF-8), a fifth of a published
    run's ``results.json`` and ``public-results.json`` (380 kB over the published set of 4 Dec 2026). The value
    read back must be equal, or nothing is written. Returns the bytes saved (0 when there is no file or nothing
    to save)."""
    if not path.is_file():
        return 0
    before = path.read_text(encoding="utf-8")
    value = json.loads(before)
    after = json.dumps(value, **COMPACT_JSON) + "\n"
    if json.loads(after) != value:
        raise ValueError(f"{path}: the record as compact JSON reads back differently")
    saved = len(before.encode()) - len(after.encode())
    if saved > 0:
        path.write_text(after, encoding="utf-8")
    return max(saved, 0)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
