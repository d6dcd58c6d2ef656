"""Section 19's checks: every statement recomputed from ``raw/`` and ``params.resolved.yaml``.

Nothing the notebook printed is trusted. From the run's files:

* the engine run's capture (``raw/tot_capture.jsonl``) validates against ``kmesh.capture/1``;
* the whole search is replayed on the captured outputs (each call's prompt, producer, kind and
  seed must be the captured ones) and must give the recorded outcomes and counters; a scripted
  run's outputs must be exactly the script's tokens for each call;
* the run is complete, or the check says which limit stopped it (a partial run fails that one
  check; the statements that need a whole search are skipped with that reason, the others are
  still checked on what was captured);
* answers are regraded with exact fractions, the puzzles are the puzzle file's rows (found by
  its content hash under the data root, skipped where the file is not here);
* the bound, the LRU reference and the sweep are recomputed from the capture with
  ``bounds.ideal``; every replay arm's trace is re-derived (the capture, or the script) and
  compared call by call, and the stock-versus-ideal tables are recomputed from the arms' columns;
* block events: per-invocation events drain and are exactly the engine run's whole capture;
  the replay arms' drains were observed at run time (``recorded_only``).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kmesh_lib.base.checks import Check, all_of, check, differences
from kmesh_lib.base.derived import once_per_content
from kmesh_lib.base.records import RunFiles, sha256_file
from kmesh_lib.bounds.ideal import count_exact_prefix_edges
from kmesh_lib.engine.model_spec import resolve, tokenizer_for
from kmesh_lib.engine.requests import RequestResult
from kmesh_lib.kv.capture import net_references
from kmesh_lib.kv.capture_contract import validate_capture
from kmesh_lib.sections.tot_headroom import bound
from kmesh_lib.sections.tot_headroom.arms import token_sha
from kmesh_lib.sections.tot_headroom.captures import StockSweepArm, TotInvocation, TotOutcome
from kmesh_lib.sections.tot_headroom.params import (
    BLOCK_EVENTS,
    CAPTURE,
    ENGINE_TRACE,
    OUTCOMES,
    STOCK_SWEEP,
    bound_pool_sizes,
    data_root,
    scale_search_config,
    scale_trace_name,
    scripted_policy,
    search_config,
)
from kmesh_lib.workloads import game24
from kmesh_lib.workloads.tot_search import COUNT_NAMES, SearchRun, TotSearch

DONE = ("solved", "failed")


def capture_generator(records: list[TotInvocation]):
    """``generate(calls)`` that serves captured outputs; None once the capture has no such call."""
    by_id = {r.invocation_id: r for r in records}

    def generate(calls):
        results = []
        for call in calls:
            rec = by_id.get(call.invocation_id)
            if rec is None:
                return None
            got = (rec.prompt_token_ids, rec.parent_id, rec.kind, rec.extra.seed)
            if got != (list(call.prompt_token_ids), call.parent_id, call.kind, call.seed):
                raise ValueError(f"{call.invocation_id}: the replayed call differs from the captured one")
            results.append(RequestResult(call.invocation_id, rec.prompt_token_ids, rec.output_token_ids,
                                         num_cached_tokens=rec.num_cached_tokens, t_submit_ns=rec.t_submit_ns,
                                         finish_reason=rec.status))
        return results

    return generate


def script_generator(policy):
    """``generate(calls)`` with no engine: each call's output is the script's (for re-deriving a trace)."""
    def generate(calls):
        return [RequestResult(c.invocation_id, list(c.prompt_token_ids), policy.token_ids(c), finish_reason="length")
                for c in calls]

    return generate


def recorded_puzzles(outcomes: list[TotOutcome]) -> list[game24.Puzzle]:
    return [game24.Puzzle(o.puzzle_index, tuple(o.numbers), 0) for o in outcomes]


def find_puzzle_file(cfg, inputs: dict) -> tuple[Path | None, str | None, str]:
    """The puzzle file the run read, found by its recorded path under the data root (or PUZZLES_CSV)."""
    recorded = [(k.split(":", 1)[1], v) for k, v in inputs.items() if k.startswith("puzzles:")]
    if not recorded:
        return None, None, "results.json records no puzzle file hash"
    relative, digest = recorded[0]
    # runs before the data-root paths recorded the file name alone: one folder down is where data sets live
    candidates = [p for p in (data_root() / relative, game24.repo_path(cfg.PUZZLES_CSV),
                              *sorted(data_root().glob(f"*/{relative}"))) if p.is_file()]
    if not candidates:
        return None, digest, f"{relative} is not under the data root {data_root()} (KMESH_DATA_ROOT) here"
    path = next((p for p in candidates if sha256_file(p) == digest), candidates[0])
    return path, digest, str(path)


@dataclass
class Replay:
    """The search replayed on the captured outputs (``search`` None: why, or the replay's error)."""

    tokenizer: Any
    search: SearchRun | None
    why: str = ""
    error: str = ""


def replay_search(run: RunFiles, cfg) -> Replay:
    """The whole search replayed on ``raw/`` 's captured outputs, with the model's tokenizer."""
    records, outcomes = run.records(CAPTURE), run.records(OUTCOMES)
    tokenizer, why = None, ""
    try:
        tokenizer = tokenizer_for(resolve(cfg.MODEL))
    except ValueError as e:
        why = f"the model's tokenizer is not here: {e}"
    puzzles = recorded_puzzles(outcomes)
    if not records:
        return Replay(tokenizer, None, why or f"raw/{CAPTURE} holds no records")
    if not puzzles:
        return Replay(tokenizer, None, why or f"raw/{OUTCOMES} holds no puzzle outcomes (the search did not end)")
    if tokenizer is None:
        return Replay(tokenizer, None, why)
    try:
        return Replay(tokenizer, TotSearch(capture_generator(records), tokenizer, search_config(cfg),
                                           clock=lambda: 0.0).run(puzzles))
    except ValueError as e:  # a captured call is not the call the search makes: evidence, not absence
        return Replay(tokenizer, None, str(e), str(e))


def checks(run) -> list[Check]:
    """Section 19's statements about a run, each computed from its files (see the module docstring)."""
    run = RunFiles.of(run)
    cfg = run.params
    results = run.results
    records, outcomes, arms = run.records(CAPTURE), run.records(OUTCOMES), run.records(STOCK_SWEEP)
    out: list[Check] = []

    report = validate_capture(run.raw(CAPTURE)) if records else None  # the contract's rules, on the lines as stored
    out.append(check("capture validates against kmesh.capture/1", bool(report and report.ok),
                     "; ".join(report.errors[:3]) if report else "", evidence=records,
                     missing=f"raw/{CAPTURE} holds no records"))

    # -- the search, replayed on the captured outputs --
    replay = replay_search(run, cfg)
    tokenizer, replayed, why, replay_error = replay.tokenizer, replay.search, replay.why, replay.error
    recorded_counts = results.get("search", {}).get("counts")
    if replayed is not None:
        got = [(o.puzzle_index, o.status, o.expression, list(o.steps), o.num_calls) for o in replayed.outcomes]
        want = [(o.puzzle_index, o.status, o.expression, o.steps, o.num_calls) for o in outcomes]
        diff = differences({k: replayed.counts[k] for k in COUNT_NAMES}, recorded_counts, "search.counts")
        out.append(Check("search replayed from the capture gives the recorded outcomes and counts",
                         got == want and not diff and len(replayed.invocations) == len(records),
                         f"{len(replayed.invocations)} of {len(records)} records replayed; counts differing: {diff[:3]}; "
                         f"outcomes equal: {got == want}"))
        complete = replayed.limit_hit is None and all(o.status in DONE for o in outcomes)
        out.append(Check("the run is complete (no limit stopped the search)", complete,
                         "every puzzle solved or failed" if complete else
                         f"partial: limit {results.get('search', {}).get('limit_hit') or replayed.limit_hit} "
                         f"after {len(records)} calls; the statements that need a whole search are skipped"))
    else:
        out.append(check("search replayed from the capture gives the recorded outcomes and counts", False,
                         replay_error, evidence=replay_error or None, missing=why))
        out.append(check("the run is complete (no limit stopped the search)", False, evidence=None, missing=why))
        complete = False
    invocations = replayed.invocations if replayed is not None else []

    if cfg.POLICY == "scripted":
        policy = scripted_policy(cfg, tokenizer) if tokenizer is not None else None

        def as_scripted(inv) -> bool:
            script = policy.token_ids(inv.call)
            got = list(inv.result.output_token_ids)
            return got == script if inv.result.finish_reason != "timeout" else got == script[:len(got)]

        out.append(all_of("every output is exactly the script's tokens for its call", invocations, as_scripted,
                          lambda inv: inv.call.invocation_id, missing=why or "no replayed calls"))
    edges = count_exact_prefix_edges(records) if records else 0
    exercised = replayed is not None and replayed.counts["num_value_calls"] > 0 and \
        replayed.counts["num_avoided_value_calls"] > 0 and edges > 0
    out.append(check("the search made value calls, memo-avoided calls and exact-prefix producer edges", exercised,
                     (f"{replayed.counts['num_value_calls']} value calls, {replayed.counts['num_avoided_value_calls']} "
                      f"avoided, {edges} exact-prefix edges") if replayed is not None else "", evidence=replayed,
                     missing=why))

    # -- the puzzles and the answers --
    path, digest, where = find_puzzle_file(cfg, results.get("inputs", {}))
    if path is not None and outcomes:
        rows = {p.index: p.numbers for p in game24.load_puzzles(path)}
        used = [(o.puzzle_index, o.numbers) for o in outcomes] + [p for a in arms for p in a.puzzles]
        same = sha256_file(path) == digest and all(rows.get(index) == tuple(numbers) for index, numbers in used)
        out.append(Check("puzzle file matches its recorded hash and holds the run's puzzles", same, where))
    elif path is None and digest is not None:  # the data set is not on this machine: the run's files are intact
        out.append(Check("puzzle file matches its recorded hash and holds the run's puzzles", "skipped", where,
                         outside_input="the Game of 24 puzzles under the data root (`kmesh data fetch`)"))
    else:
        out.append(check("puzzle file matches its recorded hash and holds the run's puzzles", False, evidence=None,
                         missing=where if path is None else "no puzzle outcomes recorded"))
    graded = [o for o in outcomes if o.status in DONE and o.expression is not None]
    out.append(all_of("grades recomputed with exact fractions agree with the recorded status", graded,
                      lambda o: game24.grade(o.numbers, o.expression).ok == (o.status == "solved"),
                      lambda o: o.puzzle_index, missing="no answer reached the grader"))

    # -- the bound at the run's pool size, and the sweep on the engine trace --
    usable = cfg.NUM_GPU_BLOCKS - 1
    recomputed = bound.compare_bound(records, cfg.BLOCK_SIZE, usable) if records else None
    found = differences(recomputed, results.get("bound"), "bound")
    out.append(check("bound at the run's pool size recomputed from the capture equals results.json", not found,
                     "; ".join(found[:3]) or f"recomputed {recomputed}", evidence=recomputed, missing="no capture"))
    out.append(check("ideal <= stock vLLM's observed prefill on the engine at the run's pool size",
                     bool(recomputed) and recomputed["ideal_prefill_tokens"] <= recomputed["observed_prefill_tokens"],
                     f"ideal {recomputed and recomputed['ideal_prefill_tokens']}, observed "
                     f"{recomputed and recomputed['observed_prefill_tokens']}", evidence=recomputed, missing="no capture"))
    if records:
        sweep = bound.sweep(records, cfg.BLOCK_SIZE, bound_pool_sizes(cfg), {usable: recomputed["observed_prefill_tokens"]})
        found = differences(sweep, results.get("sweep"), "sweep")
        out.append(Check("pool-size sweep recomputed from the capture equals results.json", not found,
                         "; ".join(found[:3]) or f"{len(sweep)} pool sizes"))
    else:
        out.append(check("pool-size sweep recomputed from the capture equals results.json", False, evidence=None,
                         missing="no capture"))

    # -- physical events of the engine run --
    per_record = [e for r in records for e in r.block_events or []]
    whole = run.records(BLOCK_EVENTS)
    key = lambda e: (e.step, e.op, tuple(e.block_ids), tuple(e.ref_cnts))  # noqa: E731
    leaked = {b: n for b, n in net_references([e.as_event() for e in whole]).items() if n}
    out.append(check("engine run's block events drain, and each belongs to exactly one invocation",
                     not leaked and Counter(map(key, per_record)) == Counter(map(key, whole)),
                     f"{len(per_record)} attributed, {len(whole)} captured, leaked {sorted(leaked)[:5]}",
                     evidence=whole, missing=f"raw/{BLOCK_EVENTS} holds no events"))
    scheduled = [r for r in records if r.extra.num_scheduled_tokens is not None and r.status != "timeout"
                 and r.extra.num_preemptions == 0]
    out.append(all_of("calls never preempted scheduled exactly their prefill and decode tokens", scheduled,
                      lambda r: r.extra.num_scheduled_tokens == len(r.prompt_token_ids) - r.num_cached_tokens
                      + max(len(r.output_token_ids) - 1, 0), lambda r: r.invocation_id,
                      missing="no scheduled-token counts recorded"))

    out += arm_checks(cfg, results, records, arms, complete, tokenizer, why, arm_tables_of(run, cfg, tokenizer))
    return out


def arm_checks(cfg, results: dict, records: list[TotInvocation], arms: list[StockSweepArm], complete: bool, tokenizer,
               why: str, derived: ArmTables) -> list[Check]:
    """The replay arms: traces re-derived and compared call by call, tables recomputed."""
    out: list[Check] = []
    engine_arms = [a for a in arms if a.trace == ENGINE_TRACE]
    captured = [r for r in records if r.status != "timeout"]
    want = {"invocation_id": [r.invocation_id for r in captured], "parent_id": [r.parent_id for r in captured],
            "prompt_sha": [token_sha(r.prompt_token_ids) for r in captured],
            "output_sha": [token_sha(r.output_token_ids) for r in captured]}
    out.append(all_of("engine-trace arms replayed the engine run's exact calls", engine_arms,
                      lambda a: all(getattr(a.calls, k) == v for k, v in want.items()), lambda a: a.arm,
                      missing=f"raw/{STOCK_SWEEP} holds no engine-trace arm"))
    at_run_pool = [a for a in engine_arms if a.num_blocks == cfg.NUM_GPU_BLOCKS - 1]
    if cfg.ENGINE == "replay":
        out.append(check("the replay engine reproduces the engine's prefix hits call for call at the run's pool size",
                         False, evidence=None, missing="the run itself is on the replay engine: no real-engine "
                                                       "observation to compare"))
    else:
        cached = [r.num_cached_tokens for r in captured]
        out.append(all_of("the replay engine reproduces the engine's prefix hits call for call at the run's pool size",
                          at_run_pool, lambda a: a.calls.num_cached_tokens == cached,
                          lambda a: f"{a.arm}: {first_difference(a.calls.num_cached_tokens, cached)}",
                          missing="no engine-trace arm at the run's pool size"))
    out.append(all_of("every engine-trace arm ran the whole search", engine_arms if complete else [],
                      lambda a: a.limit_hit is None, lambda a: f"{a.arm}: {a.limit_hit}",
                      missing="the engine run is partial: its trace is not a whole search" if not complete
                      else "no engine-trace arm"))

    # the scale traces, re-derived from the script
    scale_arms = [a for a in arms if a.trace != ENGINE_TRACE]
    rows, search_rows, traces, mismatched = derived.stock_sweep, derived.scale_searches, derived.traces, derived.mismatched
    expected_scale = cfg.NUM_SCALE_PUZZLES > 0
    out.append(check("scale traces re-derived from the script match every scale arm call by call",
                     not mismatched and len(traces) == len(cfg.SCRIPT_ERROR_RATES),
                     f"{len(scale_arms)} arms over {len(traces)} traces; mismatched: {mismatched[:5]}",
                     evidence=scale_arms if expected_scale and tokenizer is not None else None,
                     missing=(why if tokenizer is None else "NUM_SCALE_PUZZLES is 0: no scale traces")
                     if not (expected_scale and tokenizer is not None) else f"raw/{STOCK_SWEEP} holds no scale arm"))
    out.append(all_of("every scale arm ran the whole search", scale_arms, lambda a: a.limit_hit is None,
                      lambda a: f"{a.arm}: {a.limit_hit}", missing="no scale arm"))

    found = differences({"stock_sweep": rows, "scale_searches": search_rows},
                        {"stock_sweep": results.get("stock_sweep"), "scale_searches": results.get("scale_searches", [])})
    out.append(check("stock-versus-ideal tables recomputed from the arms equal results.json", not found,
                     f"{len(rows)} rows" + (f"; {'; '.join(found[:3])}" if found else ", both tables equal"),
                     evidence=arms, missing=f"raw/{STOCK_SWEEP} holds no arm"))
    observed = [r for r in rows if "stock_prefill_tokens" in r]
    out.append(all_of("compulsory <= ideal <= LRU, and ideal <= stock, at every pool size of every trace", observed,
                      lambda r: r["num_compulsory_tokens"] <= r["ideal_prefill_tokens"] <= r["lru_prefill_tokens"]
                      and r["ideal_prefill_tokens"] <= r["stock_prefill_tokens"] <= r["stock_total_tokens"],
                      lambda r: f"{r['trace']} at {r['num_blocks']} blocks", missing="no arm observed stock vLLM"))
    out.append(Check("every replay arm's pool drained, as observed when it ended",
                     "ok" if arms and all(a.drain_ok for a in arms) else "failed" if arms else "skipped",
                     f"{sum(a.drain_ok for a in arms)} of {len(arms)}" if arms else "no arm", recorded_only=True))
    return out


@dataclass
class ArmTables:
    """The stock-versus-ideal rows and the scale searches, recomputed from the arms and the traces."""

    stock_sweep: list[dict]
    scale_searches: list[dict]
    traces: dict[str, list[bound.TraceCall]]  # scale trace -> its calls, re-derived from the script
    mismatched: list[str]  # scale arms whose calls, puzzles or counts differ from the re-derived trace


def arm_tables_of(run: RunFiles, cfg, tokenizer) -> ArmTables:
    """``arm_tables`` of the run's capture and arms, built once per their content in a process (``base.derived``):
    the checks and the declared tables of one verify, and unchanged copies of the run, share one build."""
    return once_per_content(run, "tot_headroom.arm_tables", (CAPTURE, STOCK_SWEEP),
                            lambda: arm_tables(cfg, run.records(CAPTURE), run.records(STOCK_SWEEP), tokenizer))


def arm_tables(cfg, records: list[TotInvocation], arms: list[StockSweepArm], tokenizer) -> ArmTables:
    """Each scale trace re-derived from the script (needs the tokenizer), then the tables ``bound`` builds from
    the arms' columns: the engine trace's rows first, then each scale trace's."""
    scale_arms = [a for a in arms if a.trace != ENGINE_TRACE]
    traces, rows, search_rows, mismatched = {}, [], [], []
    for error_rate in (cfg.SCRIPT_ERROR_RATES if tokenizer is not None else []):
        trace = scale_trace_name(error_rate)
        mine = [a for a in scale_arms if a.trace == trace]
        if not mine:
            continue
        puzzles = [game24.Puzzle(index, tuple(numbers), 0) for index, numbers in mine[0].puzzles]
        search = TotSearch(script_generator(scripted_policy(cfg, tokenizer, error_rate)), tokenizer,
                           scale_search_config(cfg)).run(puzzles)
        trace_records = [bound.trace_record(inv) for inv in search.invocations]
        traces[trace] = trace_records
        derived = arm_columns(trace_records)
        num_solved = sum(o.status == "solved" for o in search.outcomes)
        mismatched += [a.arm for a in mine if any(getattr(a.calls, k) != v for k, v in derived.items())
                       or a.puzzles != mine[0].puzzles or a.counts != dict(search.counts)
                       or a.num_solved != num_solved]
        rows += bound.trace_rows(trace, "scripted", error_rate, trace_records, mine, bound_pool_sizes(cfg), cfg.BLOCK_SIZE)
        search_rows.append(bound.search_row(trace, error_rate, mine[0], trace_records))
    engine_arms = [a for a in arms if a.trace == ENGINE_TRACE]
    if engine_arms:
        captured = [r for r in records if r.status != "timeout"]
        rows = bound.trace_rows(ENGINE_TRACE, cfg.POLICY, None, captured, engine_arms, bound_pool_sizes(cfg),
                                cfg.BLOCK_SIZE, engine_records=captured, engine_num_blocks=cfg.NUM_GPU_BLOCKS - 1) + rows
    return ArmTables(rows, search_rows, traces, mismatched)


def arm_columns(trace_records: list[bound.Call]) -> dict[str, list]:
    """The per-call columns an arm records (``captures.ArmCalls``) that depend only on its trace."""
    return {"invocation_id": [r.invocation_id for r in trace_records],
            "parent_id": [r.parent_id for r in trace_records],
            "prompt_sha": [token_sha(r.prompt_token_ids) for r in trace_records],
            "output_sha": [token_sha(r.output_token_ids) for r in trace_records],
            "num_prompt_tokens": [len(r.prompt_token_ids) for r in trace_records],
            "num_output_tokens": [len(r.output_token_ids) for r in trace_records]}


def first_difference(got: list, want: list) -> str:
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return f"call {i}: {a} vs {b}"
    return f"lengths {len(got)} vs {len(want)}" if len(got) != len(want) else "equal"
