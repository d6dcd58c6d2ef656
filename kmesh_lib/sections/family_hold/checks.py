"""Section 18's statements about a run, recomputed from ``raw/`` and ``params.resolved.yaml``.

Per run mode (real, replay, replay_at_real) the arm-samples are read back (``recorded``) and:

- the workload is the one the parameters describe (roles, prompt lengths, the child extends its
  parent, both arms see the same prompts), and every request produced MAX_TOKENS tokens;
- each arm-sample's block events replay from a drained pool to the logged ref_cnts and drain
  again; each request's cached tokens are the blocks it touched times BLOCK_SIZE;
- held arm: the parent's hashed blocks are held at its finish and released in the child's first
  step, the child touches exactly those physical blocks (the parent-to-child edges), none of them
  is evicted in between, and their ref_cnt runs 2, 1, 2, 1, 0;
- outputs agree between arms (tokens exactly, logprobs within LOGPROB_TOLERANCE);
- every figure results.json keeps for the mode is recomputed (``report.summarize_mode``) and compared.

Across modes, the real engine's counts must equal the replay engine's at the same block size and
pool; the sweep's rows and crossing are recomputed from ``raw/sweep.jsonl`` where the run has one
(runs recorded before it kept the sweep only in results.json: those figures are recorded-only).
"""
from __future__ import annotations

from kmesh_lib.base.checks import Check, all_of, check, differences
from kmesh_lib.base.records import RunFiles
from kmesh_lib.kv.capture import replay_references
from kmesh_lib.kv.capture_contract import validate_capture
from kmesh_lib.sections.family_hold import report
from kmesh_lib.sections.family_hold.captures import FamilyHoldRequest
from kmesh_lib.sections.family_hold.params import ARMS, FamilyHoldParams, hashed_blocks, held_cap
from kmesh_lib.sections.family_hold.recorded import (
    OPS,
    ArmRecord,
    block_events_by_arm,
    modes,
    prompt_token_ids,
    read_mode,
    read_sweep,
    twin_mode,
)

SUMMARY_GROUPS = {  # results.json keys compared per mode, grouped so a failure names what differs
    "per-arm cached tokens and block operations": ("arms",),
    "per-sample saved, displaced and net": ("samples",),
    "edges and held-block ref_cnts": ("edges", "ref_cnts_of_held_blocks"),
    "output mismatch lists, max logprob delta and record count": ("token_mismatches", "logprob_mismatches",
                                                                  "max_logprob_delta", "capture_records"),
}


def roles(params: FamilyHoldParams) -> list[str]:
    return (["parent"] + [f"noise{i}/pass{p}" for p in range(params.NUM_PASSES) for i in range(params.NUM_NOISE)]
            + ["child"])


def workload_problems(a: ArmRecord, params: FamilyHoldParams) -> list[str]:
    """How an arm-sample differs from the workload the parameters describe (empty: it is that workload)."""
    if a.roles != roles(params):
        return [f"roles {a.roles[:3]}... are not parent, {params.NUM_PASSES} x {params.NUM_NOISE} noise, child"]
    want = {"parent": params.PARENT_TOKENS, "child": params.PARENT_TOKENS + params.MAX_TOKENS
            + params.CHILD_SUFFIX_TOKENS}
    out = [f"{role}: {r.num_prompt_tokens} prompt tokens" for role, r in zip(a.roles, a.requests)
           if r.num_prompt_tokens != want.get(role, params.NOISE_TOKENS)]
    parent, child = a.request("parent"), a.request("child")
    if isinstance(child, FamilyHoldRequest) and isinstance(parent, FamilyHoldRequest):  # a sweep keeps no token ids
        head = parent.prompt_token_ids + parent.output_token_ids
        if child.prompt_token_ids[:len(head)] != head:
            out.append("the child's prompt does not start with the parent's input and output")
    return out


def cached_by_touch(a: ArmRecord) -> list[str]:
    """Requests whose num_cached_tokens is not the number of blocks they touched times BLOCK_SIZE."""
    return [f"{role}: {r.num_cached_tokens} cached, {n} blocks touched" for role, r, events in
            zip(a.roles, a.requests, a.request_events)
            if r.num_cached_tokens != (n := sum(len(e.block_ids) for e in events if e.op == "touch")) * a.block_size]


def hold_problems(a: ArmRecord) -> list[str]:
    """Held arm: one hold of the parent's hashed blocks at its finish, one release in the child's first step."""
    holds = [e for e in a.events_of("parent") if e.op == "hold"]
    child = a.events_of("child")
    releases = [e for role in a.roles for e in a.events_of(role) if e.op == "release"]
    out = []
    if len(holds) != 1 or sorted(holds[0].block_ids) != sorted(report.parent_block_ids(a)):
        out.append(f"{len(holds)} holds in the parent's steps, not one of its {len(report.parent_block_ids(a))} hashed blocks")
    if (len(releases) != 1 or releases[0] not in child or releases[0].step != child[0].step
            or holds and sorted(releases[0].block_ids) != sorted(holds[0].block_ids)):
        out.append(f"{len(releases)} releases; wanted one of the held blocks in the child's first step")
    return out


def _stock_held_prompts_equal(arms: list[ArmRecord]) -> list[str]:
    return [f"sample {s.sample} {role}: prompts differ between arms"
            for s, h in report.pairs(arms) for role, x, y in zip(s.roles, s.requests, h.requests)
            if role != "child" and prompt_token_ids(x) != prompt_token_ids(y)]


def mode_checks(run: RunFiles, mode: str) -> list[Check]:
    p = run.params
    arms = read_mode(run, mode)
    held = [a for a in arms if a.arm == "held"]
    requests = [r for a in arms for r in a.requests]
    by_label = block_events_by_arm(run)
    no_arms = f"raw/requests.jsonl has no {mode} requests"
    out = []

    capture = f"capture.{mode}.jsonl"
    validation = validate_capture(run.raw(capture)) if run.raw(capture) else None
    out.append(check(f"{mode}: {capture} follows kmesh.capture/1", validation is not None and validation.ok,
                     "; ".join(validation.errors[:3]) if validation else "", validation, f"raw/{capture} is missing or empty"))
    split = [f"{a.arm}/s{a.sample}" for a in arms if a.events != by_label.get(f"{mode}/{a.arm}/s{a.sample}")]
    out.append(check(f"{mode}: the capture records hold exactly block_events.jsonl's events, request by request",
                     not split, f"differ for {split[:3]}", arms, no_arms))
    ran = {(a.sample, a.arm) for a in arms}
    want = {(s, arm) for s in range(p.NUM_SAMPLES) for arm in ARMS}
    out.append(check(f"{mode}: stock and held ran NUM_SAMPLES={p.NUM_SAMPLES} samples each",
                     ran == want and len(arms) == len(want), f"{len(arms)} arm-samples", arms, no_arms))
    out.append(all_of(f"{mode}: every arm-sample ran the workload of the parameters", arms,
                      lambda a: not workload_problems(a, p), lambda a: f"{a.arm}/s{a.sample}: {workload_problems(a, p)[:2]}",
                      no_arms))
    out.append(check(f"{mode}: parent and unrelated prompts are the same in both arms", not _stock_held_prompts_equal(arms),
                     "; ".join(_stock_held_prompts_equal(arms)[:3]), report.pairs(arms), no_arms))
    out.append(all_of(f"{mode}: every request completed with MAX_TOKENS={p.MAX_TOKENS} tokens", requests,
                      lambda r: r.num_output_tokens == p.MAX_TOKENS and r.finish_reason == "length",
                      lambda r: f"{r.request_id}: {r.num_output_tokens} tokens, {r.finish_reason}", no_arms))
    out.append(all_of(f"{mode}: every arm-sample started with nothing cached", arms,
                      lambda a: a.requests[0].num_cached_tokens == 0, lambda a: f"{a.arm}/s{a.sample}", no_arms))
    out += replay_checks(mode, arms)

    tokens = report.output_mismatches(arms, float("inf"))
    out.append(check(f"{mode}: generated tokens match between arms, request by request", not tokens,
                     f"{len(tokens)} of {sum(len(s.requests) for s, _ in report.pairs(arms))} differ; {tokens[:2]}",
                     report.pairs(arms), no_arms))
    tolerance = run.params.LOGPROB_TOLERANCE
    logprobs = report.output_mismatches(arms, tolerance)
    delta = report.summarize_mode(arms, tolerance)["max_logprob_delta"] if arms else 0.0
    out.append(check(f"{mode}: chosen logprobs match between arms within LOGPROB_TOLERANCE={tolerance}", not logprobs,
                     f"max |delta| {delta:.3g}; {len(logprobs)} requests outside", report.pairs(arms), no_arms))

    out.append(all_of(f"{mode}: each held parent's hashed blocks were held until the child's first step", held,
                      lambda a: not hold_problems(a), lambda a: f"s{a.sample}: {hold_problems(a)}", no_arms))
    out.append(all_of(f"{mode}: each held child reuses the parent's exact physical blocks", held,
                      lambda a: report.edges(a)["child_reuses_held_blocks"]
                      and report.edges(a)["edges"] == report.edges(a)["parent_hashed_blocks"],
                      lambda a: f"s{a.sample}: {report.edges(a)}", no_arms))
    out.append(all_of(f"{mode}: no held block was evicted", held, lambda a: report.edges(a)["parent_blocks_evicted"] == 0,
                      lambda a: f"s{a.sample}: {report.edges(a)['parent_blocks_evicted']} evicted", no_arms))
    out.append(all_of(f"{mode}: held blocks' ref_cnt 2, 1, 2, 1, 0 through hold, parent free, child hit, release, child free",
                      held, lambda a: report.ref_trace(a) == report.HELD_REF_CNTS,
                      lambda a: f"s{a.sample}: {report.ref_trace(a)}", no_arms))
    rows = report.arm_rows(arms)
    out.append(all_of(f"{mode}: cached tokens and block operations identical in every sample", rows,
                      lambda r: r["same_in_every_sample"], lambda r: r["arm"], no_arms))
    out += summary_checks(run, mode, report.summarize_mode(arms, tolerance) if arms else {})
    recorded = run.results.get(mode, {})
    out.append(Check(f"{mode}: the live pool started clean, drained and reset after every arm-sample",
                     {True: "ok", False: "failed"}.get(recorded.get("all_drained"), "skipped"),
                     "the live drain checks, kept in results.json", recorded_only=True))
    controller = recorded.get("controller") or []
    out.append(Check(f"{mode}: the controller released every hold once and refused or expired none",
                     "skipped" if not controller else all(c.get("num_released") == 1 and not c.get("num_expired")
                                                          and not c.get("num_refused_blocks_cap")
                                                          and not c.get("num_refused_families_cap") for c in controller),
                     f"{len(controller)} controller records in results.json", recorded_only=True))
    return out


def replay_checks(label: str, arms: list[ArmRecord]) -> list[Check]:
    """Each arm-sample's events replayed from a drained pool; cached tokens against touched blocks."""
    replays = {(a.arm, a.sample): replay_references([e.as_event() for e in a.events]) for a in arms}
    return [
        all_of(f"{label}: logged ref_cnts equal the replayed reference counts", arms,
               lambda a: a.events and not replays[(a.arm, a.sample)][1],
               lambda a: f"{a.arm}/s{a.sample}: " + (replays[(a.arm, a.sample)][1] or ["no block events recorded"])[0],
               f"no {label} arm-samples recorded"),
        all_of(f"{label}: every arm-sample drained (every reference released)", arms,
               lambda a: a.events and not any(replays[(a.arm, a.sample)][0].values()),
               lambda a: f"{a.arm}/s{a.sample}: still referenced "
                         f"{sorted(b for b, n in replays[(a.arm, a.sample)][0].items() if n)[:8]}",
               f"no {label} arm-samples recorded"),
        all_of(f"{label}: each request's cached tokens are the blocks it touched x BLOCK_SIZE", arms,
               lambda a: not cached_by_touch(a), lambda a: f"{a.arm}/s{a.sample}: {cached_by_touch(a)[:2]}",
               f"no {label} arm-samples recorded"),
    ]


def summary_checks(run: RunFiles, mode: str, recomputed: dict) -> list[Check]:
    recorded = run.results.get(mode)
    out = []
    for name, keys in SUMMARY_GROUPS.items():
        diffs = differences({k: recomputed.get(k) for k in keys}, {k: (recorded or {}).get(k) for k in keys})
        out.append(check(f"{mode}: results.json {name} equal the raw", not diffs, "; ".join(diffs[:2]),
                         recomputed and recorded, f"results.json has no {mode} summary" if recomputed else "no raw records"))
    return out


def parity_checks(run: RunFiles) -> list[Check]:
    twin = twin_mode(run.params)
    real, other = read_mode(run, "real"), read_mode(run, twin)
    recomputed = report.same_counts(real, other)
    evidence = real and other and len(real) == len(other)
    out = [all_of("real engine counts equal the replay engine's at the same block size and pool",
                  recomputed if evidence else [], lambda r: r["cached_equal"] and r["block_ops_equal"],
                  lambda r: f"{r['arm']}/s{r['sample']}", f"no real and {twin} arm-samples to compare")]
    diffs = differences(recomputed, run.results.get("parity_real_vs_replay"))
    out.append(check("results.json real-vs-replay parity equals the raw", not diffs, "; ".join(diffs[:2]),
                     evidence and "parity_real_vs_replay" in run.results, "no parity in results.json or raw"))
    return out


def sweep_checks(run: RunFiles) -> list[Check]:
    p, results = run.params, run.results
    pools = read_sweep(run)
    rows = report.sweep_rows(pools)
    if not pools:  # a run recorded before raw/sweep.jsonl: the sweep exists only as results.json rows
        recorded = results.get("sweep") or []
        cross = report.crossing(recorded)
        found = differences(cross, results.get("sweep_crossing_parent_share"), "sweep_crossing_parent_share")
        return [Check("sweep: crossing recomputed from results.json's sweep rows",
                      "skipped" if not recorded else not found,
                      f"{cross} vs {results.get('sweep_crossing_parent_share')}; raw/sweep.jsonl absent", recorded_only=True),
                Check("sweep: every pool drained", "skipped",
                      "raw/sweep.jsonl absent: the sweep's live drain checks were not kept (a check's own recorded "
                      "status is no evidence of it)", recorded_only=True)]
    arms = [a for pool in pools for a in pool]
    out = [check("sweep: ran every pool of SWEEP_NUM_GPU_BLOCKS, stock and held",
                 sorted(pool[0].num_gpu_blocks for pool in pools) == sorted(p.SWEEP_NUM_GPU_BLOCKS)
                 and all(len(report.pairs(pool)) == 1 for pool in pools),
                 f"{len(pools)} pools", pools)]
    out.append(all_of("sweep: every arm-sample ran the workload of the parameters", arms,
                      lambda a: not workload_problems(a, p),
                      lambda a: f"{a.num_gpu_blocks}/{a.arm}: {workload_problems(a, p)[:2]}"))
    out += replay_checks("sweep", arms)
    parent = hashed_blocks(p.PARENT_TOKENS, p.MAX_TOKENS, p.REPLAY_BLOCK_SIZE)
    cap = {r["num_gpu_blocks"]: held_cap(p, p.REPLAY_BLOCK_SIZE, r["num_gpu_blocks"]) for r in rows}
    out.append(all_of("sweep: the hold was refused exactly where the parent's blocks exceed the cap", rows,
                      lambda r: bool(r["refused"]) == (parent > cap[r["num_gpu_blocks"]]),
                      lambda r: f"{r['num_gpu_blocks']} blocks: refused {r['refused']}"))
    diffs = differences(rows, results.get("sweep"))
    out.append(check("sweep: results.json rows equal the raw", not diffs, "; ".join(diffs[:2]), rows))
    cross = report.crossing(rows)
    found = differences(cross, results.get("sweep_crossing_parent_share"), "sweep_crossing_parent_share")
    out.append(check("sweep: results.json crossing equals the one recomputed from raw", not found,
                     f"{cross} vs {results.get('sweep_crossing_parent_share')}", rows))
    return out


def checks(run: RunFiles) -> list[Check]:
    """Section 18's checks, every one recomputed from the run's files."""
    present = modes(run)
    out = [check("raw requests recorded for the real and replay modes", {"real", "replay"} <= set(present),
                 f"modes {present}", run.records("requests.jsonl"), "raw/requests.jsonl is missing or empty")]
    for mode in present:
        out += mode_checks(run, mode)
    return out + parity_checks(run) + sweep_checks(run)


def counts(run: RunFiles) -> dict[str, int | str]:
    """Deterministic facts for the smoke golden: per mode and arm, cached tokens and block operations."""
    out: dict[str, int | str] = {}
    for mode in modes(run):
        arms = read_mode(run, mode)
        for row in report.arm_rows(arms):
            out[f"{mode} {row['arm']} num_cached_tokens per request"] = " ".join(map(str, row["cached_tokens_per_request"]))
            out[f"{mode} {row['arm']} block ops"] = ", ".join(f"{op} {row[op]}" for op in OPS)
        for s in report.sample_rows(arms)[:1]:
            out[f"{mode} saved, displaced, net"] = f"{s['saved']}, {s['displaced']}, {s['net']}"
        out[f"{mode} requests"] = sum(len(a.requests) for a in arms)
    rows = report.sweep_rows(read_sweep(run))
    if rows:
        by_pool = sorted(rows, key=lambda r: r["num_gpu_blocks"])
        out["sweep net by pool"] = " ".join(f"{r['num_gpu_blocks']}:{r['net']}" for r in by_pool)
        out["sweep crossing parent share"] = str(report.crossing(rows))
    return out
