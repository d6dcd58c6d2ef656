"""`kmesh plan` states a run's GPU time before it starts: every section with a gpu profile gives the plan line
``GPU time`` from its own cost model, in GPU seconds; on the CPU it says none."""
from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kmesh_lib.base.params import resolve_params
from kmesh_lib.engine import costs

ROOT = Path(__file__).resolve().parents[1]
DATA_OF = {"production_trace": "mooncake-traces"}  # a gpu profile that reads a data set a clone may lack
GPU_PROFILED = [pytest.param(key, marks=[pytest.mark.requires_data(DATA_OF[key])] if key in DATA_OF else [])
                for key in sorted(p.name.removesuffix(".gpu.yaml") for p in (ROOT / "params").glob("*.gpu.yaml")
                                  if p.name != "engine.gpu.yaml") + ["engine_check"]]


def test_gpu_time_is_stated_in_gpu_seconds():
    assert costs.gpu_time("cuda", costs.Span(100, 300)) == "about 200 GPU s (100 to 300 GPU s; 1 GPU)"
    assert costs.gpu_time("cuda", costs.Span(50, 50), gpus=2) == "about 100 GPU s (2 GPUs)"
    assert costs.gpu_time("cpu", costs.Span(1, 2)) == "none (DEVICE=cpu)"
    assert costs.gpu_time("cuda", None, why="no timing").startswith("not estimated: no timing")


@pytest.mark.parametrize("key", GPU_PROFILED)
def test_every_gpu_profile_plans_its_gpu_time(key):
    section = importlib.import_module(f"kmesh_lib.sections.{key}")
    try:
        cfg, _, _ = resolve_params(section, "gpu", [], [])
        plan = section.plan(cfg)
    except FileNotFoundError as e:  # section 19's puzzles are a data set a clone may lack
        pytest.skip(f"{key}: {e}")
    assert re.fullmatch(r"about [\d,]+ GPU s \(.*GPUs?\)", plan[costs.GPU_TIME]), plan[costs.GPU_TIME]
    cpu, _, _ = resolve_params(section, "smoke", [], [])
    assert section.plan(cpu)[costs.GPU_TIME] == f"none (DEVICE={cpu.DEVICE})"


@pytest.mark.parametrize("number", ["16", "20", "21", "22"])
def test_kmesh_plan_prints_the_gpu_time(number):
    out = subprocess.run([sys.executable, "-m", "kmesh_lib.app.cli", "plan", number, "--profile", "gpu"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert re.search(r"^GPU time: about [\d,]+ GPU s", out.stdout, re.M), out.stdout


@pytest.mark.parametrize("key", ["retention", "prefetch", "crossover", "multi_engine", "family_hold", "engine_check"])
@pytest.mark.parametrize("profile", ["smoke", "cpu", "gpu"])
def test_every_published_run_a_plan_names_is_in_outputs(key, profile):
    """Sections 16 and 20's cpu plans took their expected duration 'from outputs/retention/cpu-20261129-201843' and
    'outputs/prefetch/cpu-20261129-200122', runs withdrawn since (their files in git): a plan names a folder of
    outputs/ only where it is there."""
    section = importlib.import_module(f"kmesh_lib.sections.{key}")
    cfg, _, _ = resolve_params(section, profile, [], [])
    text = " ".join(str(v) for v in section.plan(cfg).values())
    named = re.findall(r"outputs/[a-z_]+/[a-z0-9]+-\d{8}-\d{6}[-\w]*", text)
    assert [n for n in named if not (ROOT / n).is_dir()] == [], text


def test_section_21s_plan_holds_every_published_childs_measured_seconds():
    """Each (model, tier) child a published section 21 run timed (raw/models.jsonl's ``seconds``: runs from 6 Dec
    2026) lies within the span ``experiment.unit_duration`` plans for it at that run's own params. 0248's four 0.5B
    children (71-99 s on an H100) fell below the plan's low ends (93-152 s), which charged 0.1-0.3 s of preparation
    per row and 20-100 ms per paired follow-up where CUDA's took 7-27 ms and 0-4 ms; the driver's budget and the
    device plan read these spans."""
    import json
    import lzma

    import yaml

    from kmesh_lib.app import registry
    from kmesh_lib.base import params as params_mod
    from kmesh_lib.sections.crossover import experiment

    section = registry.get("21")
    timed = []
    for run in sorted((ROOT / "outputs" / "crossover").glob("gpu-*")):
        lines = lzma.open(run / "raw" / "models.jsonl.xz", "rt").read().splitlines()[1:]
        children = [r for r in map(json.loads, lines) if r.get("status") == "ok" and r.get("seconds") is not None]
        if not children:
            continue  # a run from before its children recorded their seconds
        values = yaml.safe_load((run / "params.resolved.yaml").read_text())
        cfg = params_mod.build(section.Params, params_mod.current_names(values))
        for r in children:
            span, _ = experiment.unit_duration(cfg, r["model"], r["tier"])
            timed.append((run.name, r["model"], r["tier"], round(span.low), r["seconds"], round(span.high)))
    assert len(timed) >= 8, timed  # 7 Dec: the children of 1727, 4b9b, d7bf, 5750 and 408a among them
    assert not [t for t in timed if not t[3] <= t[4] <= t[5]], timed
