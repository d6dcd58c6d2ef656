"""A small section with the whole section interface and no engine, for the app's tests.

Its notebook (``write_notebook``) records five raw items and their total, so its checks recompute a
figure from ``raw/`` and compare it with ``results.json``, as a real section's do. What the notebook
does besides is chosen by the ``KMESH_FAKE`` environment variable, which the kernel inherits:

    pass      the run passes
    raise     a cell raises after the raw items are written
    die       the kernel kills itself (a dead kernel)
    sleep     a cell sleeps (a timeout, or a Ctrl-C while it sleeps)
    orphan    the notebook starts a process in its own session and leaves it behind, then sleeps
"""
from __future__ import annotations

from pathlib import Path

import nbformat

from kmesh_lib.base.checks import check
from kmesh_lib.base.declared import Table, recorded_only
from kmesh_lib.base.params import RunParams as Params  # noqa: F401  (the section interface)

KEY = "fake_section"
NUMBER = "99"
TITLE = "fake section"
NOTEBOOK = "99_fake_section.ipynb"
QUESTION = "Does the app keep its promises about a run?"
USES_ENGINE = False
NUM_ITEMS = 5


def plan(cfg) -> dict:
    return {"items": NUM_ITEMS}


def _total(run) -> int:
    return sum(r["value"] for r in run.raw("items.jsonl"))


# the declared result: results.json's one table, built from raw/, and what the app's tests plant in a record
CAPTURES: dict = {}  # its items.jsonl is read as dicts
TABLES = {"total": Table(_total),
          **{name: recorded_only("planted by a test of publishing") for name in ("disk_root", "model", "unexpected")}}


def checks(run) -> list:
    items = run.raw("items.jsonl")
    recorded = run.results.get("total")
    return [check("every item recorded", len(items) == NUM_ITEMS, f"{len(items)} items", evidence=items),
            check("the recorded total equals the raw items' sum", recorded == _total(run),
                  f"recorded {recorded}, raw {_total(run)}", evidence=items)]


def counts(run) -> dict:
    return {"items": len(run.raw("items.jsonl")), "total": _total(run)}


def headline(run) -> dict:
    return {"total": f"{run.results['total']:,} units", "items": str(len(run.raw("items.jsonl")))}


def answer(run) -> str:
    return f"Yes: the total is **{run.results['total']}**, from {len(run.raw('items.jsonl'))} items."


def public_results(run) -> dict:
    return {"total": run.results["total"], "num_items": len(run.raw("items.jsonl"))}


CELLS = [
    ("markdown", "# 99 Fake section\n\nA notebook for the app's tests.", []),
    ("code", 'RUN_DIR = None  # run directory\nPROFILE = "smoke"  # profile\nSEED = 0  # seed', ["parameters"]),
    ("code", """\
import logging, os, subprocess, sys, time
import pandas as pd
from IPython.display import Markdown, display
from kmesh_lib.base.params import RunParams
from kmesh_lib.base.records import RunRecord
import fake_section as section

record = RunRecord.open(section.KEY, RunParams(RUN_DIR=RUN_DIR, SEED=SEED, PROFILE=PROFILE))
(record.run_dir / "kernel.pid").write_text(str(os.getpid()))
print("run directory:", record.run_dir)""", []),
    ("code", """\
behaviour = os.environ.get("KMESH_FAKE", "pass")
record.append_jsonl("items.jsonl", [{"i": i, "value": i * i} for i in range(section.NUM_ITEMS)])
record.save_tables(section.TABLES)
os.write(2, b"C-LEVEL STDERR NOISE\\n")  # as C code writes: fd 2
logging.getLogger("vllm.fake").error("VLLM LOGGER NOISE")
lm = logging.getLogger("lmcache.fake")  # as lmcache.logging.init_logger does, after the run opened
lm.handlers.clear(); lm.propagate = False; lm.addHandler(logging.StreamHandler()); lm.error("LMCACHE LOGGER NOISE")
from tqdm import tqdm
for _ in tqdm(range(3), desc="PROGRESS"):
    pass
if behaviour == "raise":
    raise RuntimeError("planted failure")
if behaviour == "die":
    os.kill(os.getpid(), 9)
if behaviour == "orphan":
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    (record.run_dir / "orphan.pid").write_text(str(orphan.pid))
if behaviour in ("sleep", "orphan"):
    (record.run_dir / "sleeping").write_text("")
    time.sleep(120)
pd.DataFrame({"row": range(80), **{f"column_{c}": range(80) for c in range(30)}})""", []),
    ("code", """\
from kmesh_lib.base.checks import raise_on_failure, show
run = record.files()
report = section.checks(run)
record.save_checks(report)
show(report, section.counts(run))
record.finish(report)
raise_on_failure(report)""", ["nbval-check-output"]),
    ("code", "display(Markdown(section.answer(run)))", []),
]


def write_notebook(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    for kind, source, tags in CELLS:
        cell = nbformat.v4.new_code_cell(source) if kind == "code" else nbformat.v4.new_markdown_cell(source)
        cell.metadata["tags"] = tags
        nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"name": "kmesh", "display_name": "kmesh", "language": "python"}
    nbformat.write(nb, str(path))
    return path


def register(registry, notebook: Path) -> None:
    """Adds this module to ``registry`` as section 99, its notebook at ``notebook`` (a subprocess's
    setup; tests use ``install``)."""
    import sys

    registry.SECTIONS[KEY] = sys.modules[__name__]
    original = registry.notebook_path
    registry.notebook_path = lambda s: notebook if s.KEY == KEY else original(s)


def install(monkeypatch, tmp_path: Path):
    """Section 99 in the registry for one test, and this folder on the kernel's PYTHONPATH."""
    import os
    import sys

    from kmesh_lib.app import registry

    module = sys.modules[__name__]
    notebook = write_notebook(tmp_path / NOTEBOOK)
    monkeypatch.setitem(registry.SECTIONS, KEY, module)
    original = registry.notebook_path
    monkeypatch.setattr(registry, "notebook_path", lambda s: notebook if s.KEY == KEY else original(s))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    return module


def make_run(total: int | None = None, finish: bool = True, extra_results: dict | None = None,
             extra_raw: dict[str, list[dict]] | None = None) -> Path:
    """A fake run made in-process (no kernel): raw items, their total, checks, and a small
    executed-looking notebook for the report."""
    from kmesh_lib.base.records import RunRecord

    record = RunRecord.open(KEY, Params(RUN_DIR=None, SEED=0, PROFILE="smoke"))
    record.append_jsonl("items.jsonl", [{"i": i, "value": i * i} for i in range(NUM_ITEMS)])
    record.save("total", sum(i * i for i in range(NUM_ITEMS)) if total is None else total)
    for name, value in (extra_results or {}).items():
        record.save(name, value)
    for name, records in (extra_raw or {}).items():
        record.append_jsonl(name, records)
    if finish:
        report = checks(record.files())
        record.save_checks(report)
        record.finish(report)
    else:
        record.close()
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print('run directory:', RUN_DIR)", execution_count=1)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"run directory: {record.run_dir}\n")]
    nb.cells = [nbformat.v4.new_markdown_cell("# 99 Fake section"), cell]
    nbformat.write(nb, str(record.run_dir / NOTEBOOK))
    return record.run_dir


def write_raw(run_dir: Path, name: str, text: str) -> Path:
    """Writes ``raw/<name>`` into a made run as if the run had written it before it finished (its hash recorded)."""
    from kmesh_lib.base.records import RunFiles, capture_sha256, write_json_atomic

    path = Path(run_dir) / "raw" / name
    path.write_text(text)
    results = RunFiles(run_dir).results
    results["capture_sha256"] = capture_sha256(RunFiles(run_dir))
    write_json_atomic(Path(run_dir) / "results.json", results)
    return path
