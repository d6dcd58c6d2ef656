"""Section 23's checks: every statement recomputed from ``raw/`` and ``params.resolved.yaml``.

From the run's files: the trace in ``raw/trace.jsonl`` is the pinned file's first N requests (found
under the data root by its recorded hash; skipped where the data is not here) or the synthetic trace
regenerated from its seed; its ids are chained; every table (pool sweep, replay rows, tiers,
engines, parity) is computed again from ``raw/`` (``tables.derived``: once per content in a process) and
compared with ``results.json``; the replay's
cached tokens equal the LRU reference's request by request; the real engine's equal the replay's on
the parity slice; the costs are the cited published runs' measurements. Pool drains were observed
at run time (``recorded_only``).
"""
from __future__ import annotations

from kmesh_lib.base.checks import Check, all_of, check, differences
from kmesh_lib.base.data import DATA_SETS, data_root
from kmesh_lib.base.paths import REPO_ROOT
from kmesh_lib.base.records import RunFiles, sha256_file
from kmesh_lib.sections.production_trace import tables
from kmesh_lib.sections.production_trace.captures import CostRow
from kmesh_lib.sections.production_trace.params import COSTS, PARITY, REPLAY, TRACE
from kmesh_lib.sections.production_trace.trace import (
    TraceFormatError,
    chained,
    load_trace,
    synthetic_trace,
    trace_digest,
    trace_stats,
)

PARITY_CHECK = "parity slice: the real engine's cached tokens equal the replay engine's, request by request"


def _equal(name: str, recomputed, recorded, evidence=True, missing: str = "") -> Check:
    diff = differences(recomputed, recorded)
    return check(name, not diff, "; ".join(diff[:3]) or "equal", evidence=evidence, missing=missing)


def trace_source_check(cfg, results: dict, requests) -> Check:
    name = "the trace in raw/ is the pinned file's first requests (or the synthetic trace of its seed)"
    if not requests:
        return check(name, False, evidence=None, missing=f"raw/{TRACE} holds no requests")
    if cfg.TRACE_FILE is None:
        want = synthetic_trace(cfg.NUM_SYNTHETIC_REQUESTS, cfg.SEED)
        return Check(name, trace_digest(want) == trace_digest(requests), f"synthetic, seed {cfg.SEED}")
    recorded = [(k.split(":", 1)[1], v) for k, v in results.get("inputs", {}).items() if k.startswith("trace:")]
    if not recorded:
        return check(name, False, evidence=None, missing="results.json records no trace file hash")
    relative, digest = recorded[0]
    path = data_root() / relative
    if not path.is_file():
        return Check(name, "skipped", f"{relative} is not under the data root {data_root()} here",
                     outside_input="the Mooncake traces under the data root (`kmesh data fetch mooncake-traces`)")
    pinned = DATA_SETS["mooncake-traces"].manifest().get(path.name)
    file_digest = sha256_file(path)
    if file_digest != pinned and digest == pinned:  # the run read the pinned file; this machine's copy is another
        return Check(name, "skipped", f"{relative} here differs from data/mooncake-traces.sha256 (`kmesh data verify`); "
                                      "the run's recorded hash is the pinned one",
                     outside_input="the Mooncake traces under the data root (`kmesh data fetch mooncake-traces`)")
    same_requests = load_trace(path, len(requests)) == requests  # field by field: what their digests would say
    ok = file_digest == digest == pinned and same_requests
    return Check(name, ok, f"{relative}: sha256 {'matches' if file_digest == pinned else 'differs from'} "
                           f"data/mooncake-traces.sha256; first {len(requests)} requests "
                           f"{'equal' if same_requests else 'differ'}")


def checks(run) -> list[Check]:
    run = RunFiles.of(run)
    cfg = run.params
    results = run.results
    out: list[Check] = []
    try:
        requests = tables.requests_of(run.records(TRACE))
        bad_trace = ""
    except TraceFormatError as e:
        requests, bad_trace = [], str(e)
    arms, parity, costs = run.records(REPLAY), run.records(PARITY), run.records(COSTS)
    if bad_trace:
        out.append(Check(f"raw/{TRACE} reads as a Mooncake trace", False, bad_trace))
    out.append(trace_source_check(cfg, results, requests))
    ok, detail = chained(requests) if requests else (False, "")
    out.append(check("hash ids are chained (each id always follows the same id at the same position)", ok, detail,
                     evidence=requests, missing=f"raw/{TRACE} holds no requests"))
    stats = {"name": results.get("trace", {}).get("name"), **trace_stats(requests)} if requests else None
    out.append(_equal("trace figures recomputed from raw/ equal results.json", stats, results.get("trace"),
                      evidence=stats, missing="no trace"))

    # -- stock vLLM on the replay engine --
    prompts = [r.num_prompt_tokens for r in requests]
    outputs = [r.num_output_tokens for r in requests]
    out.append(all_of("every replay arm ran every request of the trace to its real output length", arms,
                      lambda a: a.requests.num_prompt_tokens == prompts and a.requests.num_output_tokens == outputs,
                      lambda a: a.arm,
                      missing=f"raw/{REPLAY} holds no replay arm"
                              + (f" ({len(results.get('replay_not_run', []))} not run: pool too small)"
                                 if results.get("replay_not_run") else "")))
    drained = check("every replay arm's pool drained, as observed when it ended", all(a.drain_ok for a in arms),
                    "; ".join(a.drain for a in arms), evidence=arms, missing=f"raw/{REPLAY} holds no replay arm")
    out.append(Check(drained.name, drained.status, drained.detail, recorded_only=drained.status != "skipped"))

    rebuilt = tables.derived(run) if requests else {"replays": [], "concurrent": [], "pools": None, "tiers": None,
                                                     "engines": None, "lru_alone": {}}
    replays = rebuilt["replays"]
    out.append(all_of("stock vLLM's cached tokens equal the LRU reference's, request by request", replays,
                      lambda r: r["num_requests_differing_from_lru"] == 0,
                      lambda r: f"{r['num_blocks']} blocks: {r['num_requests_differing_from_lru']} differ, first "
                                f"{r['first_differing_request']}", missing="no replay arm"))
    out.append(_equal("replay rows recomputed from raw/ equal results.json", replays, results.get("replays"),
                      evidence=replays, missing="no replay arm"))

    concurrent = rebuilt["concurrent"]
    out.append(_equal("concurrent rows recomputed from raw/ equal results.json", concurrent,
                      results.get("concurrent"), evidence=concurrent, missing="no concurrent arm (CONCURRENT_POOL_GIB)"))
    out.append(all_of("ideal <= stock vLLM's prefill in every concurrent arm", concurrent,
                      lambda r: r["ideal_prefill_tokens"] <= r["stock_prefill_tokens"],
                      lambda r: f"{r['num_blocks']} blocks", missing="no concurrent arm (CONCURRENT_POOL_GIB)"))

    # -- the pool sweep, the tiers, the engines --
    pools = rebuilt["pools"]
    out.append(_equal("pool sweep recomputed from raw/ equals results.json", pools, results.get("pools"),
                      evidence=pools, missing="no trace"))
    out.append(all_of("compulsory <= ideal <= LRU, and ideal <= stock where replayed, at every pool", pools or [],
                      lambda r: r["num_compulsory_tokens"] <= r["ideal_prefill_tokens"] <= r["lru_prefill_tokens"]
                      and (r["stock_prefill_tokens"] is None or r["ideal_prefill_tokens"] <= r["stock_prefill_tokens"]),
                      lambda r: f"{r['shape']} {r['pool_gib']} GiB", missing="no trace"))
    out.append(cost_check(cfg, costs))
    tiers = rebuilt["tiers"]
    out.append(_equal("tier table recomputed from raw/ equals results.json", tiers, results.get("tiers"),
                      evidence=tiers, missing="no trace"))
    lru_alone = rebuilt["lru_alone"]
    out.append(all_of("with a tier, the pool's reuse is unchanged and pool + tier <= the ideal of one pool of both",
                      tiers or [], lambda t: t["gpu_reused_tokens"] == lru_alone[t["pool_blocks"]]
                      and t["gpu_reused_tokens"] + t["tier_restored_tokens"] <= t["ideal_reused_tokens"],
                      lambda t: f"{t['shape']} {t['tier']} {t['tier_gib']}", missing="no trace"))
    engines = rebuilt["engines"]
    out.append(_equal("several-engine table recomputed from raw/ equals results.json", engines,
                      results.get("engines"), evidence=engines, missing="no trace"))

    # -- parity with the real engine --
    real = [r.requests for r in parity if r.engine == "real"]
    rep = [r.requests for r in parity if r.engine == "replay"]
    pairs = list(zip(real, rep))
    out.append(all_of(PARITY_CHECK,
                      pairs, lambda p: p[0].num_cached_tokens == p[1].num_cached_tokens
                      and p[0].num_prompt_tokens == p[1].num_prompt_tokens == prompts[:len(p[0].num_prompt_tokens)],
                      lambda p: f"real {p[0].num_cached_tokens} vs replay {p[1].num_cached_tokens}",
                      missing=f"raw/{PARITY} holds no real-and-replay pair (PARITY_NUM_REQUESTS: 0?)"))
    exercised = [p for p in pairs if sum(p[0].num_cached_tokens) > 0]
    out.append(check("parity slice reused some prefix (the comparison is not of zeros)", bool(exercised),
                     f"{sum(pairs[0][0].num_cached_tokens) if pairs else 0} cached tokens", evidence=pairs,
                     missing="no parity slice"))
    out.append(_equal("parity table recomputed from raw/ equals results.json", tables.parity_table(parity) or None,
                      results.get("parity"), evidence=parity, missing="no parity slice"))
    return out


def cost_check(cfg, costs: list[CostRow]) -> Check:
    """The costs in raw/ are what the cited published runs hold (re-read from outputs/ where it is here)."""
    name = "costs in raw/ are the cited section 21 runs' published TTFTs"
    if not costs:
        return check(name, False, evidence=None, missing=f"raw/{COSTS} holds no cost rows")
    if not all((REPO_ROOT / r / "public-results.json").is_file() for r in cfg.CROSSOVER_RUNS):
        return Check(name, "skipped", "a cited run is not in outputs/ here",
                     outside_input="section 21's published runs under outputs/crossover/")
    from kmesh_lib.sections.production_trace.experiment import crossover_costs
    shapes = sorted({c.shape for c in costs})
    want, _ = crossover_costs(cfg, shapes)
    diff = differences(want, [c.as_recorded() for c in costs])
    return Check(name, not diff and all(c.status == "passed" for c in costs),
                 "; ".join(diff[:3]) or f"{len(costs)} rows, shapes {shapes}, runs {sorted({c.run_id for c in costs})}")
