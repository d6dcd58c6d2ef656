"""Section 23: the trace format and its tokens, the access model against token-level bounds, the LRU model
against vLLM's own scheduler, the tier, engine and cost models, a replay-engine run end to end with its
checks from raw/, what tampering does to them, and the Mooncake data set's pinning."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kmesh_lib.app.cli import main
from kmesh_lib.base import data, derived
from kmesh_lib.base.captures import CaptureError, is_header
from kmesh_lib.base.params import ParamError, defaults
from kmesh_lib.base.public import find_private_keys
from kmesh_lib.base.records import RunFiles, RunRecord
from kmesh_lib.bounds.access import build_access_trace
from kmesh_lib.bounds.ideal import simulate_min
from kmesh_lib.bounds.lru import lru_hit_blocks
from kmesh_lib.engine.replay import replay_token
from kmesh_lib.sections import production_trace as section
from kmesh_lib.sections.production_trace import experiment as tx
from kmesh_lib.sections.production_trace import replay, sim, tables
from kmesh_lib.sections.production_trace.captures import CostRow
from kmesh_lib.sections.production_trace.params import REPLAY, TRACE, ProductionTraceParams
from kmesh_lib.sections.production_trace.trace import (
    TraceFormatError,
    TraceRequest,
    access_trace,
    load_trace,
    parse_request,
    prompt_token_ids,
    synthetic_trace,
    trace_digest,
)

VOCAB = 512
SMALL = dict(TRACE_FILE=None, NUM_SYNTHETIC_REQUESTS=40, ENGINE="replay", BLOCK_SIZE=16, NUM_GPU_BLOCKS=65,
             MAX_MODEL_LEN=1024, POOL_GIB=[0.05, 0.5], REPLAY_POOL_GIB=[0.5], CONCURRENT_POOL_GIB=[0.5],
             TIER_POOL_GIB=0.05, DRAM_TIER_GIB=[0.2], DISK_TIER_GIB=[1.0], NUM_ENGINES=[2], ENGINE_POOL_GIB=0.2,
             SHARED_TIER_GIB=1.0, PARITY_NUM_REQUESTS=0, PROFILE="smoke")


# -- the trace and its tokens --

def test_the_synthetic_trace_is_seeded_chained_and_shares_prefixes():
    a, b = synthetic_trace(60, seed=3), synthetic_trace(60, seed=3)
    assert trace_digest(a) == trace_digest(b) != trace_digest(synthetic_trace(60, seed=4))
    where = {}
    for r in a:
        assert len(r.hash_ids) == -(-r.num_prompt_tokens // 512) and r.num_output_tokens >= 1
        for pos, h in enumerate(r.hash_ids):
            assert where.setdefault(h, (r.hash_ids[pos - 1] if pos else None, pos)) == (
                r.hash_ids[pos - 1] if pos else None, pos)
    firsts = [r.hash_ids[0] for r in a]
    assert len(set(firsts)) < len(firsts)  # shared system prompts
    assert any(set(x.hash_ids) < set(y.hash_ids) for x in a for y in a if len(x.hash_ids) > 2)  # next turns
    assert [r.timestamp_ms for r in a] == sorted(r.timestamp_ms for r in a)


def test_tokens_are_a_function_of_the_id_and_shared_exactly_as_far_as_the_ids_agree():
    x = TraceRequest(0, 1300, 5, (7, 8, 9))
    y = TraceRequest(0, 1100, 5, (7, 8, 11))
    tx_, ty = prompt_token_ids(x, VOCAB, 0), prompt_token_ids(y, VOCAB, 0)
    assert len(tx_) == 1300 and len(ty) == 1100 and min(tx_) >= 4 and max(tx_) < VOCAB
    common = next(i for i, (p, q) in enumerate(zip(tx_, ty)) if p != q)
    assert common == 1024  # two shared 512-token blocks, then different ids
    assert prompt_token_ids(TraceRequest(0, 700, 1, (7, 8)), VOCAB, 0) == tx_[:700]  # the last block is cut
    assert prompt_token_ids(x, VOCAB, 1) != tx_  # the seed names the tokens too


@pytest.mark.parametrize("line", ['{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}',
                                  '{"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [1]}',
                                  '{"timestamp": 0, "input_length": 10}', "not json"])
def test_a_line_that_is_not_a_mooncake_request_is_named(line):
    with pytest.raises(TraceFormatError, match="t.jsonl:3"):
        parse_request(line, "t.jsonl:3")


def replay_outputs(prompt: list[int], num_output: int) -> list[int]:
    out, prev = [], prompt[-1]
    for i in range(num_output):
        prev = replay_token(prev, len(prompt) + i, VOCAB)
        out.append(prev)
    return out


@pytest.mark.parametrize("block_size", [16, 32, 128])
def test_the_access_model_from_hash_ids_equals_the_token_level_one(block_size):
    """Blocks named from hash ids give the same LRU hits and ideal as blocks hashed from the token ids."""
    requests = synthetic_trace(50, seed=1)
    records = []
    for r in requests:
        prompt = prompt_token_ids(r, VOCAB, 0)
        records.append({"prompt_token_ids": prompt, "output_token_ids": replay_outputs(prompt, r.num_output_tokens)})
    tokens, ids = build_access_trace(records, block_size), access_trace(requests, block_size)
    assert ids.num_read_blocks == tokens.num_read_blocks and ids.num_accesses == tokens.num_accesses
    for num_blocks in (8, 40, 200, 2000):
        assert lru_hit_blocks(ids, num_blocks) == lru_hit_blocks(tokens, num_blocks)
        assert simulate_min(ids, num_blocks).num_prefill_tokens == simulate_min(tokens, num_blocks).num_prefill_tokens


def _replay(requests, num_blocks: int, num_speculative_tokens: int) -> tuple[dict, list]:
    """One sequential replay: its record and the free queue it leaves, (block_id, block hash) in eviction order."""
    cfg = ProductionTraceParams(**SMALL)
    params = replay.engine_params(cfg, "replay", num_blocks, 16, replay.max_model_len(requests))
    left = []
    arm = replay.run_sequential(params, requests, num_speculative_tokens=num_speculative_tokens, on_finish=lambda e: left.extend(
        (b.block_id, b.block_hash) for b in e.block_pool.free_block_queue.get_all_free_blocks()))
    return arm, left


def _conversation_slice(num_requests: int):
    path = data.resolve_path(defaults(ProductionTraceParams)["TRACE_FILE"])
    return load_trace(path, num_requests)


@pytest.mark.parametrize("source", ["synthetic", pytest.param("conversation", marks=pytest.mark.requires_data(
    "mooncake-traces"))])
def test_speculative_decoding_replays_the_same_cache_as_one_token_a_step(source):
    """The replay's speculative path (drafts of BLOCK_SIZE - 1, all accepted) leaves every request's cached
    tokens and the pool's whole free queue (blocks, hashes, eviction order) as plain decoding does, in fewer
    steps; each pool holds the longest request and no more, so it evicts."""
    requests = synthetic_trace(40, seed=2) if source == "synthetic" else _conversation_slice(60)
    num_blocks = -(-replay.max_model_len(requests) // 16)
    plain, plain_queue = _replay(requests, num_blocks, 0)
    fast, fast_queue = _replay(requests, num_blocks, 15)
    assert fast["requests"] == plain["requests"] and fast_queue == plain_queue and fast["drain_ok"]
    assert sum(plain["requests"]["num_cached_tokens"]) > 0
    assert fast["num_steps"] * 4 < plain["num_steps"] and fast["num_speculative_tokens"] == 15
    assert sum(plain["requests"]["num_prompt_tokens"]) > num_blocks * 16  # more than the pool holds: it evicted


def names_by_loop(requests, block_size):
    """``access_trace``'s names, request by request in plain Python: a hash id's number as first seen, times
    512 // B, plus the block's place in it; an output block numbered after every prompt name, as its (last
    hash id, P, j) is first seen. Per request its first R written blocks, then all W."""
    per, numbers, tails, out = 512 // block_size, {}, {}, []
    num_prompt_names = len({h for r in requests for h in r.hash_ids}) * per
    for r in requests:
        num_reads = (r.num_prompt_tokens - 1) // block_size
        num_writes = (r.num_prompt_tokens + r.num_output_tokens - 1) // block_size
        bases = [numbers.setdefault(h, len(numbers)) * per for h in r.hash_ids]
        written = [bases[j // per] + j % per if j < r.num_prompt_tokens // block_size
                   else tails.setdefault((r.hash_ids[-1], r.num_prompt_tokens, j), num_prompt_names + len(tails))
                   for j in range(num_writes)]
        out.append((written[:num_reads], written))
    return out


@pytest.mark.parametrize("block_size", [16, 128, 512])
def test_access_trace_names_and_lays_out_blocks_as_the_plain_loop(block_size):
    requests = synthetic_trace(70, seed=4, max_output_tokens=700)
    requests += [requests[3], TraceRequest(0, 512, 1, (1,))]  # equal prompts write equal output blocks
    requests += [TraceRequest(0, 600, 40, (2**70, 5)), TraceRequest(1, 700, 40, (2**70, 5))]  # ids past int64
    acc = access_trace(requests, block_size)
    assert acc.access_start[-1] == acc.num_accesses and acc.num_requests == len(requests)
    for r, (reads, writes) in enumerate(names_by_loop(requests, block_size)):
        start, end = acc.access_start[r], acc.access_start[r + 1]
        assert acc.block_hash[start:end].tolist() == reads + writes
        assert acc.is_read[start:end].tolist() == [True] * len(reads) + [False] * len(writes)
        assert acc.request_index[start:end].tolist() == [r] * (end - start)
        assert acc.num_read_blocks[r] == len(reads)
    assert access_trace([], block_size).num_accesses == 0


# -- the models --

def test_the_lru_model_is_bounds_lru_plus_the_partial_blocks_slot():
    """Without partial blocks it is ``bounds.lru``; with one on every request, ``bounds.lru`` a block smaller."""
    acc = access_trace(synthetic_trace(50, seed=2), 16)
    for n in (30, 100, 400):
        acc.has_partial_block = [False] * acc.num_requests
        assert sim.two_level(acc, n, 0)[0] == lru_hit_blocks(acc, n)
        acc.has_partial_block = [True] * acc.num_requests
        assert sim.two_level(acc, n, 0)[0] == lru_hit_blocks(acc, n - 1)


def test_a_tier_keeps_the_pools_hits_and_stays_under_the_ideal_of_both():
    acc = access_trace(synthetic_trace(80, seed=5), 16)
    alone = sim.two_level(acc, 40, 0)
    assert alone[1] == [0] * acc.num_requests
    for tier in (50, 400, 10_000):
        gpu, restored = sim.two_level(acc, 40, tier)
        assert gpu == alone[0] and sum(restored) > 0
        assert sum(gpu) + sum(restored) <= sum(acc.num_read_blocks) - (
            simulate_min(acc, 40 + tier).num_read_misses)


def test_a_tier_as_large_as_the_pool_restores_its_own_run_less_the_pools():
    """The tier table's shortcut (a tier's own leading runs, less the pool's; a never-evicting tier as the
    set of blocks written so far) equals the two-level pass, at tiers from the pool's size to past the trace."""
    acc = access_trace(synthetic_trace(120, seed=7), 16)
    num_distinct = len(set(acc.block_hash))
    for pool in (12, 40, 150):
        for tier in (pool, pool + 1, 3 * pool, num_distinct, 10 * num_distinct):
            gpu, restored = sim.two_level(acc, pool, tier)
            alone = sim.seen_hits(acc) if tier >= num_distinct else sim.pool_hits(acc, tier, hold_partial_block=False)
            assert sim.tier_hits_over_pool(gpu, alone) == restored, (pool, tier)
            assert sum(restored) > 0


def test_engine_routes():
    requests = [TraceRequest(0, 2000, 4, (1, 2, 3, 4 + i)) for i in range(12)]  # one shared 3-block prefix
    acc = access_trace(requests, 16)
    rr = sim.engines(acc, 4, 10_000, "round_robin")
    assert rr["engine"] == [i % 4 for i in range(12)]
    assert rr["gpu_hit_blocks"][:4] == [0, 0, 0, 0] and rr["gpu_hit_blocks"][4] == 96  # 3 x 512 / 16
    sticky = sim.engines(acc, 4, 10_000, "prefix_aware", slack=100.0)
    assert set(sticky["engine"]) == {0} and sum(sticky["gpu_hit_blocks"]) == 11 * 96
    bounded = sim.engines(acc, 4, 10_000, "prefix_aware", slack=0.0)
    assert len(set(bounded["engine"])) == 4  # the load bound spreads them
    loads = sim.engine_loads(acc, bounded, 4)
    assert sum(loads) == sum(acc.num_prompt_tokens) - 16 * sum(bounded["gpu_hit_blocks"])
    shared = sim.engines(acc, 4, 10_000, "round_robin_shared_tier", tier_blocks=10_000)
    assert sum(shared["tier_hit_blocks"]) == 3 * 96 and shared["gpu_hit_blocks"] == rr["gpu_hit_blocks"]
    with pytest.raises(ValueError, match="route"):
        sim.engines(acc, 2, 10, "random")


def test_saved_time_interpolates_section_21s_points():
    rows = [CostRow(run_id="r", status="passed", shape="s", arm=arm, context_tokens=c, ttft_ms=ms, n=1, device="d")
            for arm, pts in (("recompute", [(1000, 20.0), (2000, 50.0), (4000, 130.0)]),
                             ("dram", [(1000, 10.0), (2000, 12.0), (4000, 16.0)]))
            for c, ms in pts]
    got = sim.saved_ms(rows, "s", "dram", [0, 1000, 3000, 500, 6000])
    assert np.allclose(got, [0.0, 10.0, 90.0 - 14.0, 5.0 - 9.0, 210.0 - 20.0])
    assert sim.distribution(np.array([0.0, 1.0, 2.0, 3.0]))["p50"] == 1.5


# -- a run on the replay engine --

def make_run(run_dir: Path, **overrides) -> Path:
    cfg = ProductionTraceParams(**{**SMALL, **overrides})
    record = RunRecord.open(section.KEY, cfg, run_dir=str(run_dir))
    tx.run(cfg, record)
    record.finish(section.checks(record.files()))
    return run_dir


@pytest.fixture(scope="module")
def replay_run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("pt") / "run")


@pytest.fixture
def copy(replay_run, tmp_path) -> Path:
    return Path(shutil.copytree(replay_run, tmp_path / "copy"))


def statuses(run_dir) -> dict[str, str]:
    return {c.name: c.status for c in section.checks(RunFiles(run_dir))}


PARITY_CHECKS = {"parity slice: the real engine's cached tokens equal the replay engine's, request by request",
                 "parity slice reused some prefix (the comparison is not of zeros)",
                 "parity table recomputed from raw/ equals results.json"}


def test_a_replay_run_passes_every_check_that_has_evidence(replay_run):
    got = statuses(replay_run)
    assert {n for n, s in got.items() if s != "ok"} == PARITY_CHECKS  # no parity slice asked for
    assert all(got[n] == "skipped" for n in PARITY_CHECKS)
    run = RunFiles(replay_run)
    counts = section.counts(run)
    assert counts["num_requests"] == 40 and counts["num_replay_arms"] == 2
    assert counts["replay/qwen2.5-7b/0.5GiB: num_cached_tokens"] > 0
    pools = run.results["pools"]
    assert [p["stock"] for p in pools].count("replayed") == 1
    assert all(p["num_compulsory_tokens"] <= p["ideal_prefill_tokens"] <= p["lru_prefill_tokens"] for p in pools)
    (conc,) = run.results["concurrent"]
    assert conc["num_blocks"] == pools[-1]["num_blocks"] and conc["ideal_prefill_tokens"] <= conc["stock_prefill_tokens"]
    assert conc["ttft_s"]["p50"] > 0 and conc["span_s"] > 0
    tier = run.results["tiers"][0]
    assert set(tier["saved_ms_per_request"]) == {"mean", "p50", "p90", "p99", "max"}
    assert tier["cost_run"] == "gpu-20261201-224722-442e"


def test_headline_answer_and_public_results(replay_run):
    run = RunFiles(replay_run)
    head = section.headline(run)
    assert 2 <= len(head) <= 6 and head["trace"].startswith("synthetic: 40 requests")
    text = section.answer(run)
    assert "stock vLLM" in text and "gpu-20261201-224722-442e" in text and "sequential" in text
    public = section.public_results(run)
    assert find_private_keys(public) == [] and "hash_ids" not in json.dumps(public)
    (said,) = section.verdict(run)
    replayed = next(r for r in run.results["pools"] if r["stock"] == "replayed")
    share = replayed["reuse_share_of_bound"]
    word = "None left" if replayed["headroom_tokens"] <= 0 else "Most left" if share < 0.5 else "Some left"
    assert said.startswith(f"{word}: on synthetic (40 requests) stock vLLM with a 0.5 GiB") and len(said) <= 600
    assert f"{replayed['ideal_cached_share']:.1%}" in said and "deterministic" in said


def edit_jsonl(path: Path, line: int, change) -> None:
    """Edits record ``line`` of the capture (after its schema header)."""
    lines = path.read_text().splitlines()
    line += 1 if lines and is_header(json.loads(lines[0])) else 0
    rec = json.loads(lines[line])
    change(rec)
    lines[line] = json.dumps(rec)
    path.write_text("\n".join(lines) + "\n")


def edit_results(run_dir: Path, change) -> None:
    results = json.loads((run_dir / "results.json").read_text())
    change(results)
    (run_dir / "results.json").write_text(json.dumps(results))


def bump_cached(arm):
    cached = arm["requests"]["num_cached_tokens"]
    i = next(i for i, c in enumerate(cached) if c)
    cached[i] -= 16


@pytest.mark.parametrize("tamper, expect", [
    (lambda d: edit_jsonl(d / "raw" / REPLAY, 0, bump_cached), "stock vLLM's cached tokens equal the LRU"),
    (lambda d: edit_jsonl(d / "raw" / REPLAY, 0, lambda a: a["requests"]["num_output_tokens"].__setitem__(0, 1000)),
     "every replay arm ran every request"),
    (lambda d: edit_jsonl(d / "raw" / TRACE, 5, lambda r: r.update(output_length=r["output_length"] + 1)),
     "the trace in raw/ is the pinned file's"),
    (lambda d: edit_jsonl(d / "raw" / TRACE, 0, lambda r: r.update(hash_ids=[99999] + r["hash_ids"][1:])),
     "hash ids are chained"),
    (lambda d: edit_results(d, lambda r: r["pools"][0].update(ideal_prefill_tokens=r["pools"][0]["ideal_prefill_tokens"] - 1)),
     "pool sweep recomputed"),
    (lambda d: edit_results(d, lambda r: r["tiers"][0]["saved_ms_per_request"].update(p90=123.0)), "tier table"),
    (lambda d: edit_results(d, lambda r: r["engines"][0].update(load_imbalance=1.0)), "several-engine table"),
    (lambda d: edit_jsonl(d / "raw" / REPLAY, 1, lambda a: a["requests"]["num_scheduled_tokens"].__setitem__(0, 1)),
     "concurrent rows recomputed"),
    (lambda d: edit_jsonl(d / "raw" / "costs.jsonl", 0, lambda c: c.update(ttft_ms=c["ttft_ms"] * 2)), "costs in raw/"),
])
def test_tampering_fails_the_check_that_covers_it(copy, tamper, expect):
    tamper(copy)
    failed = [n for n, s in statuses(copy).items() if s == "failed"]
    assert any(n.startswith(expect) for n in failed), failed


def test_captures_are_typed_with_a_header_and_an_arm_holds_its_modes_fields(replay_run, tmp_path):
    """raw/ starts each capture with its schema header; a sequential arm without its engine limits, or a
    concurrent one without its clock columns, is refused as it is written (naming what it lacks)."""
    run = RunFiles(replay_run)
    for name, cls in section.CAPTURES.items():
        if run.has_raw(name):
            assert json.loads((replay_run / "raw" / name).read_text().splitlines()[0]) == cls.header()
    sequential, concurrent = (a.as_recorded() for a in run.records(REPLAY))
    assert (sequential["mode"], concurrent["mode"]) == ("sequential", "concurrent")
    (tmp_path / "raw").mkdir()
    record = RunRecord(tmp_path, section.KEY)
    with pytest.raises(CaptureError, match="a sequential arm records max_tokens"):
        record.append_jsonl(REPLAY, {k: v for k, v in sequential.items() if k != "max_tokens"})
    cols = {k: v for k, v in concurrent["requests"].items() if k != "t_arrival_s"}
    with pytest.raises(CaptureError, match=r"a concurrent arm records requests\.t_arrival_s"):
        record.append_jsonl(REPLAY, {**concurrent, "requests": cols})
    with pytest.raises(CaptureError, match="field 'arms': not declared"):
        record.append_jsonl(REPLAY, {**sequential, "arms": 2})


def test_the_tables_are_built_once_per_content_of_raw_and_params(replay_run, tmp_path, monkeypatch):
    """One build serves the checks and the declared tables, and an unchanged copy of the run; an edit to
    raw/ or to the params builds again (the tables come from the files, never from a cached result of others)."""
    built = []
    real = tables.access_trace
    monkeypatch.setattr(tables, "access_trace", lambda *a: built.append(1) or real(*a))
    derived.forget()
    first, second = (Path(shutil.copytree(replay_run, tmp_path / name)) for name in ("first", "second"))
    assert statuses(first) == statuses(second) == statuses(replay_run)
    assert [table.build(first) for table in (section.TABLES["pools"], section.TABLES["engines"])]
    assert len(built) == 1
    edit_jsonl(second / "raw" / TRACE, 5, lambda r: r.update(output_length=r["output_length"] + 1))
    assert statuses(second) != statuses(first) and len(built) == 2
    params = second / "params.resolved.yaml"
    params.write_text(params.read_text().replace("LOAD_SLACK: 0.25", "LOAD_SLACK: 0.5"))
    statuses(second)
    assert len(built) == 3


def test_missing_replay_arms_are_skipped_never_ok(copy):
    (copy / "raw" / REPLAY).unlink()
    got = statuses(copy)
    assert got["every replay arm ran every request of the trace to its real output length"] == "skipped"
    assert got["stock vLLM's cached tokens equal the LRU reference's, request by request"] == "skipped"
    assert got["pool sweep recomputed from raw/ equals results.json"] == "failed"  # its stock column is gone


# -- parameters, plan and data --

@pytest.mark.parametrize("overrides, match", [
    (dict(BLOCK_SIZE=24), "must divide"), (dict(TRACE_FILE="nowhere.jsonl"), "no file at"),
    (dict(POOL_GIB=[1.0, 1.0]), "name each value once"), (dict(SHAPES=["qwen3"]), "SHAPES")])
def test_bad_parameters_stop_before_anything_runs(overrides, match):
    with pytest.raises(ParamError, match=match):
        ProductionTraceParams(**{**SMALL, **overrides})


GOOD_LINES = [json.dumps({"timestamp": t, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}) for t in (0, 5)]
BAD_TRACES = {  # a file's bytes -> what the one line says (each was accepted by `kmesh plan`, then failed the notebook)
    "truncated": ("\n".join(GOOD_LINES) + '\n{"timestamp": 9, "input_len', "t.jsonl:3: not a Mooncake request"),
    "empty": ("", "t.jsonl: holds no request"),
    "a list": ("\n".join(GOOD_LINES) + "\n[1, 2, 3]\n", "t.jsonl:3: not a Mooncake request"),
    "not utf-8": ("\n".join(GOOD_LINES).encode() + b"\n\xff\xfe\n", "t.jsonl:3: not UTF-8 text"),
    "nested": ("[" * 100_000 + "]" * 100_000 + "\n", "t.jsonl:1: not a Mooncake request (nested deeper"),
    "a huge line": ('{"hash_ids": [' + "1, " * 400_000 + "1]}\n", "t.jsonl:1: a line longer than"),
    "time backwards": ("\n".join(GOOD_LINES[::-1]) + "\n", "t.jsonl:2: timestamp 0 is before the request before's"),
    "not chained": ("\n".join(GOOD_LINES[:1] + [json.dumps({"timestamp": 7, "input_length": 600, "output_length": 4,
                                                             "hash_ids": [2, 1]})]) + "\n",
                    "hash ids are not chained (request 1: id 2 at (None, 0), earlier at (1, 1))"),
    "too long a request": (json.dumps({"timestamp": 0, "input_length": 5_000_000, "output_length": 1,
                                       "hash_ids": list(range(9766))}) + "\n", "a request of 5,000,001 tokens"),
}


@pytest.mark.parametrize("kind", BAD_TRACES)
def test_a_bad_trace_file_is_named_with_its_line_before_anything_runs(tmp_path, kind):
    text, match = BAD_TRACES[kind]
    path = tmp_path / "t.jsonl"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ParamError, match=r"TRACE_FILE=.*" + __import__("re").escape(match)):
        ProductionTraceParams(**{**SMALL, "TRACE_FILE": str(path)})
    path.write_text("\n".join(GOOD_LINES) + "\n")
    assert ProductionTraceParams(**{**SMALL, "TRACE_FILE": str(path)}).TRACE_FILE == str(path)


def test_only_the_requests_a_run_replays_are_read(tmp_path):
    """NUM_REQUESTS=2 reads two lines: a damaged third line is not the run's input."""
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(GOOD_LINES) + "\nnot json\n")
    assert ProductionTraceParams(**{**SMALL, "TRACE_FILE": str(path), "NUM_REQUESTS": 2}).NUM_REQUESTS == 2
    with pytest.raises(ParamError, match="t.jsonl:3"):
        ProductionTraceParams(**{**SMALL, "TRACE_FILE": str(path), "NUM_REQUESTS": 3})


@pytest.mark.parametrize("overrides, match", [
    (dict(NUM_REQUESTS=0), "NUM_REQUESTS=0: must be >= 1"),  # load_trace read none, then max() of nothing
    (dict(TRACE_FILE="/etc/passwd"), "under /etc, a system folder"),
    (dict(CROSSOVER_RUNS=["/nonexistent"]), "CROSSOVER_RUNS='/nonexistent': no such folder"),
    (dict(CROSSOVER_RUNS=["outputs/retention/gpu-20261204-184736-6282"]), "a run of retention, not of crossover"),
    (dict(CROSSOVER_RUNS=["tests"]), "no such public-results.json"),
    (dict(REPLAY_SHAPE="tiny", REPLAY_POOL_GIB=[100000.0]), "REPLAY_POOL_GIB: 100000 GiB of tiny is 13,107,200,000"),
    (dict(CONCURRENT_POOL_GIB=[1e6]), "CONCURRENT_POOL_GIB: 1e\\+06 GiB"),
])
def test_inputs_the_notebook_failed_on_stop_at_validation(overrides, match):
    """Each of these passed `kmesh plan` and failed in the notebook (FileNotFoundError, KeyError 'model', ParamError
    from the replay engine's own params, max() of an empty trace)."""
    with pytest.raises(ParamError, match=match):
        ProductionTraceParams(**{**SMALL, **overrides})


@pytest.mark.requires_data("mooncake-traces")
def test_plan_for_the_cpu_profile_names_the_pools_without_importing_vllm():
    code = ("import sys; from kmesh_lib.app.cli import main; rc = main(['plan', '23', '--profile', 'cpu']); "
            "print('VLLM_IMPORTED', 'vllm' in sys.modules); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "qwen2.5-7b 16 GiB = 18,724 blocks" in out.stdout and "57,344" in out.stdout
    assert "VLLM_IMPORTED False" in out.stdout


def test_the_mooncake_traces_are_pinned():
    ds = data.DATA_SETS["mooncake-traces"]
    assert ds.revision == "3b5a594133958449a1feaf1c9e0fc1b553e34a28" and ds.license == "Apache-2.0"
    assert ds.manifest() == {
        "conversation_trace.jsonl": "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
        "synthetic_trace.jsonl": "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131"}
    assert ds.url("conversation_trace.jsonl") == (
        "https://raw.githubusercontent.com/kvcache-ai/Mooncake/3b5a594133958449a1feaf1c9e0fc1b553e34a28/"
        "FAST25-release/traces/conversation_trace.jsonl")


@pytest.mark.requires_data("mooncake-traces")
def test_fetch_from_a_mirror_verifies_the_traces_and_refuses_a_changed_one(tmp_path: Path, capsys):
    assert main(["data", "fetch", "mooncake-traces", "--from", str(data.data_root()), "--data-root",
                 str(tmp_path / "root")]) == 0
    assert "2 fetched" in capsys.readouterr().out and data.check_data_set("mooncake-traces", tmp_path / "root").ok
    mirror = tmp_path / "mirror" / "mooncake-traces"
    shutil.copytree(data.data_root() / "mooncake-traces", mirror)
    (mirror / "synthetic_trace.jsonl").chmod(0o644)
    with open(mirror / "synthetic_trace.jsonl", "a") as f:
        f.write("\n")
    assert main(["data", "fetch", "mooncake-traces", "--from", str(tmp_path / "mirror"), "--data-root",
                 str(tmp_path / "other")]) == 1
    assert "does not match the manifest" in capsys.readouterr().out


def test_the_tier_sentence_says_lifts_only_where_the_tier_adds_reuse_and_rounds_its_milliseconds():
    from kmesh_lib.sections.production_trace import report

    row = {"gpu_reused_tokens": 566, "tier_restored_tokens": 0, "num_prompt_tokens": 1000, "reused_share": 0.566}
    assert report._lift(row).startswith("leaves reuse at 56.6% of prompt tokens")
    assert report._lift({**row, "tier_restored_tokens": 84, "reused_share": 0.65}) == \
        "lifts reuse from 56.6% to 65.0% of prompt tokens"
    assert [report._ms(v) for v in (None, 0.0, 257.3, 1863.88, 12.345, -0.02, -3.3)] == [
        "n/a", "0.0", "257", "1,864", "12.3", "0.0", "-3.3"]


def test_the_answer_says_where_the_saved_times_are_extrapolated_past_section_21s_lengths():
    """The saved times extend section 21's TTFTs linearly past its longest context (``sim.interp_ms``); the
    answer said only 'interpolated' while the standing run's restores reach 190,976 tokens against 32,512
    measured. A run whose restores stay within the measured lengths keeps 'interpolated'."""
    from kmesh_lib.base.paths import OUTPUTS
    from kmesh_lib.sections.production_trace import report

    whole = report.answer(RunFiles(OUTPUTS / "production_trace" / "cpu-20261205-001932-4f23"))
    assert ("interpolated between the lengths it measured and extended linearly past its longest (32,512 tokens) "
            "for longer restores (up to 190,976 tokens here)") in whole
    small = report.answer(RunFiles(OUTPUTS / "production_trace" / "cpu-20261204-221647-d17f"))
    assert "whole-context TTFTs interpolated, not measured on this trace" in small


def test_a_tier_whose_restores_cost_more_than_recomputing_says_so_beside_its_negative_saving():
    from kmesh_lib.sections.production_trace.report import _net_cost

    assert _net_cost(-3.3) == " (its restores cost more than recomputing, on average)"
    assert _net_cost(-0.01) == "" and _net_cost(12.0) == "" and _net_cost(None) == ""


def test_the_verdict_says_where_its_saved_times_reach_past_section_21s_lengths():
    """4f23 prices restores up to 190,976 tokens against 21's longest 32,512: its verdict's saving says it is extended
    past that length; d17f's restores stay within and its verdict says nothing of it."""
    from kmesh_lib.base import paths
    from kmesh_lib.base.records import RunFiles
    from kmesh_lib.sections.production_trace.report import verdict

    root = paths.OUTPUTS / "production_trace"
    if not (root / "cpu-20261205-001932-4f23").is_dir():
        pytest.skip("the published runs are not in this checkout")
    assert "section 21's median TTFTs, extended linearly past its longest 32,512 tokens)" in verdict(
        RunFiles(root / "cpu-20261205-001932-4f23"))[0]
    assert "extended" not in verdict(RunFiles(root / "cpu-20261204-221647-d17f"))[0]


def test_the_verdict_says_how_much_of_its_mean_saving_rests_on_restores_longer_than_section_21_measured():
    """Review finding (6 Dec 2026): 4f23's verdict gave 257 ms saved per request on average and said the TTFTs were
    extended past section 21's longest 32,512 tokens, but not that 156 ms of that mean (60%) comes from the 431
    restores longer than that, priced by the extension alone. ``sim.past_measured`` counts them; the verdict says it
    beside the mean, and a tier whose restores stay within the lengths says nothing more."""
    rows = [CostRow(run_id="r", status="passed", shape="s", arm=arm, context_tokens=n, ttft_ms=ms, n=8, device="d")
            for arm, points in (("recompute", ((1024, 10.0), (2048, 20.0))), ("dram", ((1024, 2.0), (2048, 3.0))))
            for n, ms in points]
    restored = [0, 1024, 2048, 4096]
    saved = sim.saved_ms(rows, "s", "dram", restored)
    assert saved.tolist() == [0.0, 8.0, 17.0, 35.0]
    past = sim.past_measured(rows, "s", restored, saved)
    assert past == {"cost_max_tokens": 2048, "num_restores_past_measured": 1, "saved_ms_mean_past_measured": 8.75}
    assert sim.past_measured(rows, "s", restored[:3], saved[:3])["num_restores_past_measured"] == 0

    from kmesh_lib.base import paths
    from kmesh_lib.sections.production_trace.report import _mean_past, verdict

    tier = {"saved_ms_per_request": {"mean": 257.3}, "num_restores_past_measured": 431,
            "saved_ms_mean_past_measured": 155.61}
    assert _mean_past(tier) == ", 156 ms of it (60%) from the 431 restores longer than section 21 measured"
    assert _mean_past({**tier, "num_restores_past_measured": 0}) == "" and _mean_past({}) == ""
    root = paths.OUTPUTS / "production_trace"
    if not (root / "cpu-20261205-001932-4f23").is_dir():
        pytest.skip("the published runs are not in this checkout")
    assert ("an estimated 257 ms of prefill saved per request on average, 156 ms of it (60%) from the 431 restores "
            "longer than section 21 measured (p99 1,864 ms;") in verdict(RunFiles(root / "cpu-20261205-001932-4f23"))[0]
    assert "longer than section 21 measured" not in verdict(RunFiles(root / "cpu-20261204-221647-d17f"))[0]


def test_the_parity_sentence_says_where_the_slice_exercised_no_eviction():
    """Review finding (6 Dec 2026): 4f23's verdict gave its parity slice, real vLLM and the replay engine equal request
    by request, beside the stock-vs-ideal figures that turn on LRU eviction; but its 50 requests could write at most
    21,900 blocks into a 32,768-block pool, so nothing was ever evicted there. The sentence says so where the pool
    holds every block the slice could write, and nothing more where it does not (b5a9: 43,780 of 32,768)."""
    from kmesh_lib.base import paths
    from kmesh_lib.sections.production_trace.report import parity_sentence, slice_blocks, verdict

    rows = {"parity": [{"engine": e, "model": "tiny", "block_size": 32, "num_blocks": 100, "num_requests": 2,
                        "num_prompt_tokens": 640, "num_cached_tokens": 64, "drain_ok": True} for e in ("real", "replay")]}
    assert parity_sentence(rows, "cpu", 40).endswith(
        "(its 100-block pool holds all 40 blocks the slice could write: no eviction was exercised).")
    assert "eviction" not in parity_sentence(rows, "cpu", 101) and "eviction" not in parity_sentence(rows, "cpu")
    root = paths.OUTPUTS / "production_trace"
    if not (root / "cpu-20261205-001932-4f23").is_dir():
        pytest.skip("the published runs are not in this checkout")
    assert slice_blocks(RunFiles(root / "cpu-20261205-001932-4f23")) == 21900
    assert "no eviction was exercised" in verdict(RunFiles(root / "cpu-20261205-001932-4f23"))[1]
    assert slice_blocks(RunFiles(root / "gpu-20261205-053059-b5a9")) == 43780
    assert "eviction" not in verdict(RunFiles(root / "gpu-20261205-053059-b5a9"))[1]


@pytest.mark.requires_data("mooncake-traces")
def test_a_damaged_local_copy_of_the_pinned_trace_is_not_the_runs_fault(tmp_path, monkeypatch):
    """With this machine's synthetic_trace.jsonl cut mid-line, kmesh verify of the published 4f23 stopped on
    'production_trace.checks raised TraceFormatError: synthetic_trace.jsonl:18'; the run read the pinned file (its
    recorded hash is the pinned one), so the check says n/a here, as where the data set is absent."""
    run_dir = Path(__file__).resolve().parents[1] / "outputs" / "production_trace" / "cpu-20261205-001932-4f23"
    if not run_dir.is_dir():
        pytest.skip("the published run 4f23 is not in this checkout")
    pinned = data.resolve_path("$KMESH_DATA_ROOT/mooncake-traces/synthetic_trace.jsonl")
    (tmp_path / "mooncake-traces").mkdir()
    (tmp_path / "mooncake-traces" / "synthetic_trace.jsonl").write_bytes(pinned.read_bytes()[:5000])
    monkeypatch.setenv("KMESH_DATA_ROOT", str(tmp_path))
    (source,) = [c for c in section.checks(RunFiles(run_dir)) if c.name.startswith("the trace in raw/")]
    assert source.status == "skipped" and source.outside_input
    assert "differs from data/mooncake-traces.sha256" in source.detail
