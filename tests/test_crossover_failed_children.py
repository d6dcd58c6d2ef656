"""Section 21 of a run whose only restore tier's child failed: on 6 Dec 2026 (gpu-20261206-060001-01f9) the LMCache
server child finished ``store_short``, its stores writing 0 bytes, so it ran no arm and no pair and only the in-process
engine's recompute rows stand. Its notebook stopped at the floor plot (``plt.subplots`` of 0 columns), its record
without checks, counts or hashes, and verify left the paired design's checks out as if the run predated it.

The report must render whole, each section saying what it lacks and why (the child's status), the checks cell
failing on the checks; verify must judge the planned pairs missing, failed, never predated."""
from __future__ import annotations

import json

import pytest
import yaml
from crossover_records import COMPONENTS

from kmesh_lib.app.verify import verify
from kmesh_lib.base.params import build, to_dict
from kmesh_lib.base.records import RunFiles, RunRecord
from kmesh_lib.sections import crossover as section
from kmesh_lib.sections.crossover import gaps
from kmesh_lib.sections.crossover import report as cr
from kmesh_lib.sections.crossover.checks import COPIED_CONTEXT_CHECK, KV_DIGEST_CHECK, PAIRED_CHECKS
from kmesh_lib.sections.crossover.experiment import CrossoverParams

GRID = [256, 1024]
KVT = 1024
ARMS = ["recompute", "lmcache_mp_recompute", "lmcache_mp", "lmcache_mp_resident"]


def _recompute_rows(repeats: int = 3, warmup: int = 1) -> list[dict]:
    """The in-process engine's rows: recompute alone (its tier's only arm of ARMS), at position 0 of each repeat."""
    return [{"arm": "recompute", "tier": "lmcache", "context": f"tiny-{n}", "context_tokens": n, "tag": f"tiny-{n}-r{r}",
             "status": "ok", "ttft_s": 1e-5 * n + 1e-4 * r, "makespan_s": 1e-5 * n + 1e-4 * r, "num_cached_tokens": [0],
             "expected_cached_tokens": 0, "disk_read_bytes": 0, "device_read_bytes": None, "prep_s": 0.01,
             "memory_tier_bytes": 0, "components": {**COMPONENTS, "lookup_s": 0.001}, "model": "tiny", "path": "inproc",
             "repeat": r, "measured": r >= warmup, "kv_bytes_per_token": KVT, "context_bytes": n * KVT,
             "arm_position": 0, "previous_arm": None} for n in GRID for r in range(warmup + repeats)]


def _jsonl(path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def failed_tier(tmp_path):
    """A run folder as 01f9's children and driver left it: params of the paired design (NUM_RESTORES recorded),
    the in-process child ok with its recompute rows, the LMCache server child store_short with 0-byte stores, no
    raw/pairs.jsonl, the floors and grid time in results.json."""
    run_dir = tmp_path / "gpu-20261206-060001-01f9"
    (run_dir / "raw").mkdir(parents=True)
    params = to_dict(build(CrossoverParams, {"MODELS": ["tiny"], "CONTEXT_TOKENS_GRID": GRID, "NUM_REPEATS": 3,
                                             "NUM_GPU_BLOCKS": 65, "MAX_MODEL_LEN": 1024, "ARENA_MIB": 64,
                                             "ARMS": ARMS}))
    assert params["NUM_RESTORES"] and params["NUM_DISK_RESTORES"] is not None  # the paired design, planned
    (run_dir / "params.resolved.yaml").write_text(yaml.safe_dump({**params, "RUN_DIR": str(run_dir)}))
    (run_dir / "env.json").write_text(json.dumps({"device": "cpu", "packages": {}}))
    _jsonl(run_dir / "raw" / "rows.jsonl", _recompute_rows())
    _jsonl(run_dir / "raw" / "stores.jsonl", [
        {"context": f"tiny-{n}", "tier": tier, "bytes_written": written, "write_errors": 0, "seconds": 0.1,
         "model": "tiny", "context_tokens": n, "context_bytes": n * KVT}
        for tier, short in (("lmcache", False), ("lmcache_mp", True)) for n in GRID
        for written in [0 if short else n * KVT]])
    _jsonl(run_dir / "raw" / "models.jsonl", [
        {"model": "tiny", "tier": "lmcache", "path": "inproc", "kv_bytes_per_token": KVT, "status": "ok"},
        {"model": "tiny", "tier": "lmcache_mp", "path": "lmcache_mp", "kv_bytes_per_token": KVT, "status": "store_short"}])
    floors = {kind: {"label": label, "bytes": 1 << 20, "median_s": (1 << 20) / (gib_per_s * (1 << 30)),
                     "gib_per_s": gib_per_s, "best_gib_per_s": gib_per_s}
              for kind, label, gib_per_s in (("disk", "disk", 1.0), ("copy", "host memcpy (no device)", 8.0))}
    (run_dir / "results.json").write_text(json.dumps({"section": "crossover", "run_id": run_dir.name, "floors": floors,
                                                      "grid_seconds": 1.0, "status": "failed"}))
    return run_dir


def _texts(fig) -> str:
    return " ".join(t.get_text() for ax in fig.axes for t in ax.texts)


def test_every_table_and_plot_of_a_run_with_no_restore_path_says_what_it_lacks_and_why(failed_tier, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables = RunRecord(failed_tier, section.KEY).save_tables(section.TABLES)  # as the grid cell saves them
    run = RunFiles(failed_tier)
    assert tables["floor_distance"] == [] and tables["crossover"] == [] and tables["restore_resolution"] == []
    assert gaps.unmeasured(run) == [{"model": "tiny", "tier": "lmcache_mp", "child": "store_short",
                                     "arms": "lmcache_mp_recompute, lmcache_mp, lmcache_mp_resident",
                                     "contexts": "256, 1,024", "why": gaps.unmeasured(run)[0]["why"]}]
    note = gaps.note(run, cr.RESTORES)
    assert note.startswith("No measured row of lmcache_mp for tiny at any context: its lmcache_mp child finished "
                           "store_short") and "1,024 tokens: 0 of 1,048,576 bytes" in note
    # under the tables after the unmeasured one: the status and where the account is, not the account again
    assert gaps.note(run, cr.RESTORES, brief=True) == (
        "No measured row of lmcache_mp for tiny at any context (its lmcache_mp child: store_short; why: the table of "
        "unmeasured points, under the grid).")
    # the floor plot of no restore path raised "Number of columns must be a positive integer, not 0"
    fig = cr.floor_plot(tables["floor_distance"], tmp_path / "floor_distance.png", tables["splits"], missing=note)
    assert (tmp_path / "floor_distance.png").exists() and "store_short" in _texts(fig)
    fig = cr.heatmaps(tables["arms"], tmp_path / "heatmap.png", crossover=tables["crossover"], missing=note)
    assert "no restore path measured" in _texts(fig) and "store_short" in _texts(fig)
    plt.close("all")
    assert "store_short" in gaps.pairs_note(run) and "restore/resident pair" in gaps.pairs_note(run)
    assert "store_short" in section.answer(run)
    assert section.verdict(run) == ["No verdict: no measured row has both a restore and the recompute control "
                                    "(tiny lmcache_mp child: store_short)."]
    # the first screen's findings table names the planned restore path, not measured, and its child's status (01f9's
    # report had no findings table at all)
    assert section.findings(run) == [{"restore": "LMCache server (MP, DRAM)",
                                      "tiny": "not measured (lmcache_mp child: store_short)"}]


@pytest.mark.parametrize("summary, says", [
    (None, "its lmcache_mp child left no summary in raw/models.jsonl (killed at CHILD_TIMEOUT_S="),
    ({"status": "error", "detail": "RuntimeError: server gone"}, "its lmcache_mp child raised (RuntimeError: server gone)"),
])
def test_a_childs_account_is_its_own_summary(failed_tier, summary, says):
    """A child killed before its summary, or one that raised: the note names that, not a store."""
    models = [json.loads(line) for line in (failed_tier / "raw" / "models.jsonl").read_text().splitlines()]
    models = models[:1] + ([{**models[1], **summary}] if summary else [])
    _jsonl(failed_tier / "raw" / "models.jsonl", models)
    run = RunFiles(failed_tier)
    assert says in gaps.note(run) and says in gaps.pairs_note(run)
    assert gaps.unmeasured(run)[0]["child"] == (summary["status"] if summary else "no summary")


def test_a_run_that_planned_pairs_and_measured_none_fails_its_paired_checks_never_predates_them(failed_tier):
    RunRecord(failed_tier, section.KEY).save_tables(section.TABLES)
    checks = {c.name: c for c in section.checks(RunFiles(failed_tier))}
    paired = [checks[name] for name in PAIRED_CHECKS]
    # 01f9 was recorded before the copy hook and the KV digest (its rows count no bytes, digest no blocks): those two
    # checks alone are left out
    assert [c.name for c in checks.values() if c.predates] == [COPIED_CONTEXT_CHECK, KV_DIGEST_CHECK]
    # the grid is shorter than the half-width goal's contexts, and a CPU floor bounds nothing: those two stay skipped
    # the pilot check too: its params record MAX_RESTORES (the two-stage design) and the pilots it plans are missing
    assert [c.status for c in paired] == ["failed", "failed", "failed", "skipped", "skipped", "failed"]
    assert "(its child: store_short)" in paired[0].detail and "(its child: store_short)" in paired[2].detail
    planned = yaml.safe_load((failed_tier / "params.resolved.yaml").read_text())["NUM_RESTORES"] * len(GRID)  # 1 path
    assert paired[1].detail == (f"the params plan {planned} pairs and raw/pairs.jsonl holds none "
                                "(tiny lmcache_mp child: store_short)")
    resolution = checks["results.json restore spans and paired first-token differences against the floors per point "
                        "equal raw/pairs.jsonl and raw/point_floors.jsonl"]
    assert resolution.status == "skipped" and "store_short" in resolution.detail
    crossover = checks["results.json crossover points equal the rows"]
    assert "store_short" in crossover.detail  # not "raw/rows.jsonl holds no measured rows": its recompute rows stand

    # the same folder recorded before the paired design (params without NUM_RESTORES): the checks are left out
    params = yaml.safe_load((failed_tier / "params.resolved.yaml").read_text())
    del params["NUM_RESTORES"], params["NUM_DISK_RESTORES"]
    (failed_tier / "params.resolved.yaml").write_text(yaml.safe_dump(params))
    earlier = {c.name: c for c in section.checks(RunFiles(failed_tier))}
    assert all(earlier[name].status == "skipped" and earlier[name].predates for name in PAIRED_CHECKS)


@pytest.mark.notebooks
def test_a_run_whose_restore_tier_failed_renders_whole_and_stops_at_its_checks(failed_tier):
    """``kmesh run 21 --source-run``: every cell before the checks cell runs, the checks cell fails on the checks
    (having recorded them, their counts and the hashes), and verify finds only the run's real failures."""
    from kmesh_lib.app.cli import main as kmesh_main

    raw = {p.name: p.read_bytes() for p in (failed_tier / "raw").iterdir()}
    assert kmesh_main(["run", "21", "--source-run", str(failed_tier)]) == 1
    assert {p.name: p.read_bytes() for p in (failed_tier / "raw").iterdir()} == raw
    nb = json.loads((failed_tier / section.NOTEBOOK).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    stopped = next(i for i, c in enumerate(code) if "raise_on_failure(report)" in "".join(c["source"]))
    errors = [(i, o["ename"]) for i, c in enumerate(code) for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert errors == [(stopped, "AssertionError")]
    assert all(c["execution_count"] for c in code[:stopped + 1])
    results = RunFiles(failed_tier).results
    assert results["status"] == "failed" and results["check_counts"]["failed"] and results["capture_sha256"]
    verdict = verify(section, RunFiles(failed_tier))
    assert not verdict.predated and all(line.ok for line in verdict.record_lines), verdict.summary()
    assert not verdict.record_problems and "predates" not in verdict.summary()
    assert "store_short" in (failed_tier / "report.html").read_text()
