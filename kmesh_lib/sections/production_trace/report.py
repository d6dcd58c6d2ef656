"""What section 23 reports about a run: counts, headline, the closing answer, the public aggregates.

Figures come from ``raw/`` where cheap, else from the ``results.json`` tables that ``checks``
recompute from ``raw/``.
"""
from __future__ import annotations

from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections.production_trace.checks import PARITY_CHECK
from kmesh_lib.sections.production_trace.params import COSTS, PARITY, REPLAY, TRACE


def _tokens(n) -> str:
    return f"{n:,}" if isinstance(n, int) else str(n)


def counts(run) -> dict[str, int | str]:
    """Deterministic facts of the run (the smoke golden pins them; no timings)."""
    run = RunFiles.of(run)
    trace = run.records(TRACE)
    arms, parity = run.records(REPLAY), run.records(PARITY)
    results = run.results
    out: dict[str, int | str] = {
        "num_requests": len(trace), "num_prompt_tokens": sum(r.input_length for r in trace),
        "num_output_tokens": sum(r.output_length for r in trace),
        "num_distinct_hash_blocks": len({h for r in trace for h in r.hash_ids}),
        "num_replay_arms": len(arms)}
    for arm in arms:
        out[f"{arm.arm}: num_cached_tokens"] = sum(arm.requests.num_cached_tokens)
    for row in results.get("pools", []):
        out[f"{row['shape']} {row['pool_gib']:g} GiB: ideal / LRU prefill tokens"] = (
            f"{row['ideal_prefill_tokens']} / {row['lru_prefill_tokens']}")
    for p in parity:
        out[f"parity {p.engine}: num_cached_tokens"] = sum(p.requests.num_cached_tokens)
    return out


def stock_share(row: dict) -> float:
    """Stock vLLM's reused share of prompt tokens in a replayed pool row."""
    return 1 - row["stock_prefill_tokens"] / row["num_prompt_tokens"] if row["num_prompt_tokens"] else 0.0


def replayed_rows(results: dict) -> list[dict]:
    return [r for r in results.get("pools", []) if r["stock"] == "replayed"]


def largest_pool(results: dict, shape: str) -> dict | None:
    rows = [r for r in results.get("pools", []) if r["shape"] == shape]
    return max(rows, key=lambda r: r["num_blocks"]) if rows else None


def headline(run) -> dict[str, str]:
    run = RunFiles.of(run)
    results = run.results
    t = results.get("trace", {})
    out = {"trace": f"{t.get('name')}: {t.get('num_requests', 0):,} requests, {_tokens(t.get('num_prompt_tokens', 0))} "
                    f"prompt tokens, {t.get('num_distinct_hash_blocks', 0):,} distinct 512-token blocks"}
    for r in replayed_rows(results)[:1]:
        out[f"stock vLLM ({r['shape']}, {r['pool_gib']:g} GiB pool)"] = (
            f"cached {stock_share(r):.1%} of prompt tokens vs ideal {r['ideal_cached_share']:.1%}: headroom "
            f"{_tokens(r['headroom_tokens'])} tokens ({r['headroom_share_of_stock']:.1%} of stock's prefill)")
    tiers = results.get("tiers", [])
    if tiers:
        best = best_tier(tiers)
        saved = best.get("saved_ms_per_request", {})
        out["external tier (most time saved)"] = (
            f"{best['shape']} {best['tier']} {best['tier_gib']:g} GiB restores {_tokens(best['tier_restored_tokens'])} "
            f"tokens ({best['reused_share']:.1%} reused in all); saved per request mean {_ms(saved.get('mean'))} ms, "
            f"p90 {_ms(saved.get('p90'))} ms, p99 {_ms(saved.get('p99'))} ms")
    engines = results.get("engines", [])
    if engines:
        n = max(r["num_engines"] for r in engines)
        rows = {r["route"]: r for r in engines if r["num_engines"] == n}
        out[f"{n} engines: reused share / busiest over mean"] = ", ".join(
            f"{k} {v['reused_share']:.1%} / {v['load_imbalance']:.2f}" for k, v in rows.items())
    return out


def answer(run) -> str:
    run = RunFiles.of(run)
    results = run.results
    t = results.get("trace", {})
    pools = results.get("pools", [])
    if not pools:
        return "This run recorded no pool sweep, so it answers nothing."
    replayed = replayed_rows(results)
    parts = [lead(results)]
    if replayed:
        r = replayed[0]
        parts.append(f"On {t.get('name')} ({t.get('num_requests'):,} requests), stock vLLM with a {r['pool_gib']:g} GiB "
                     f"{r['shape']} pool reused {stock_share(r):.1%} of prompt tokens where an ideal "
                     f"exact-prefix cache of the same pool would reuse {r['ideal_cached_share']:.1%}: it leaves "
                     f"{_tokens(r['headroom_tokens'])} prefill tokens ({r['headroom_share_of_stock']:.1%} of what it "
                     f"computes) on the table, and reaches {r['reuse_share_of_bound']:.1%} of the reachable reuse.")
    else:
        parts.append(f"On {t.get('name')} no pool was replayed through vLLM's scheduler (see `replay_not_run`); the "
                     "LRU reference stands in for stock below.")
    for shape in dict.fromkeys(r["shape"] for r in pools):
        big = largest_pool(results, shape)
        small = min((r for r in pools if r["shape"] == shape), key=lambda r: r["num_blocks"])
        parts.append(f"For {shape}, from {small['pool_gib']:g} to {big['pool_gib']:g} GiB of KV, LRU reuses "
                     f"{small['lru_cached_share']:.1%} to {big['lru_cached_share']:.1%} of prompt tokens and the ideal "
                     f"{small['ideal_cached_share']:.1%} to {big['ideal_cached_share']:.1%}.")
    for c in results.get("concurrent", []):
        parts.append(f"Arriving at the trace's timestamps (at most {c['max_num_seqs']} running, a modelled step time), "
                     f"stock vLLM with {c['pool_gib']:g} GiB reused {c['stock_cached_share']:.1%} when each request was "
                     f"first scheduled, preempted {c['num_preempted_requests']:,} requests and computed "
                     f"{_tokens(c['recomputed_tokens'])} tokens again; first tokens came p50 {c['ttft_s'].get('p50')} s, "
                     f"p99 {c['ttft_s'].get('p99')} s after arrival on that clock.")
    tiers = results.get("tiers", [])
    for shape in dict.fromkeys(r["shape"] for r in tiers):
        rows = [r for r in tiers if r["shape"] == shape]
        text = "; ".join(
            f"{r['tier']} {r['tier_gib']:g} GiB: {r['reused_share']:.1%} reused (ideal {r['ideal_reused_share']:.1%}), "
            "saving mean / p50 / p90 / p99 " + " / ".join(str(r.get("saved_ms_per_request", {}).get(q))
                                                          for q in ("mean", "p50", "p90", "p99"))
            + " ms per request" for r in rows)
        parts.append(f"Behind a {rows[0]['pool_blocks']:,}-block {shape} pool, an external tier gives {text} (priced "
                     f"with section 21 run {rows[0]['cost_run']}).")
    engines = results.get("engines", [])
    if engines:
        text = "; ".join(f"{r['num_engines']} {r['route'].replace('_', ' ')}: {r['reused_share']:.1%} reused, busiest "
                         f"{r['load_imbalance']:.2f}x the mean" for r in engines)
        parts.append(f"Several engines: {text}.")
    parity = results.get("parity", [])
    if len(parity) == 2:
        parts.append(f"On the first {parity[0]['num_requests']} requests the real engine ({parity[0]['model']}, "
                     f"{parity[0]['block_size']}-token blocks) cached {parity[0]['num_cached_tokens']:,} tokens and the "
                     f"replay engine {parity[1]['num_cached_tokens']:,}.")
    parts.append("Where the evidence is weak: the pool sweep's stock figures are sequential replays (one request at a "
                 "time: no pins or preemption from concurrency), the concurrent arms (where run) use a modelled step "
                 "time, not a GPU; the tier and several-engine figures are the "
                 "LRU access model (checked equal to the replay request by request where replayed), not vLLM's "
                 "scheduler; the saved times are section 21's whole-context TTFTs " + priced_range(run, tiers)
                 + ", not measured on this trace, and ignore queueing.")
    return " ".join(parts)


def _past_measured(run: RunFiles, tiers: list[dict]) -> tuple[int, float] | None:
    """(section 21's longest measured length, the longest restore ``tiers`` price) where that restore is longer, so
    its saving is extended linearly past the measurements (``sim.interp_ms``); None where every restore is within."""
    measured = [c.context_tokens for c in run.records(COSTS)]
    longest = max((t.get("restored_tokens_per_request", {}).get("max") or 0 for t in tiers), default=0)
    return (max(measured), longest) if measured and longest > max(measured) else None


def priced_range(run: RunFiles, tiers: list[dict]) -> str:
    """How the saved times stand to section 21's measured lengths: interpolated between them, and extended
    linearly past the longest where a restore is longer, with the longest restore named."""
    past = _past_measured(run, tiers)
    if past is None:
        return "interpolated"
    return (f"interpolated between the lengths it measured and extended linearly past its longest ({past[0]:,} "
            f"tokens) for longer restores (up to {past[1]:,.0f} tokens here)")


def _extended(run: RunFiles, tiers: list[dict]) -> str:
    """The verdict's note where its saved times reach past section 21's longest measured length."""
    past = _past_measured(run, tiers)
    return f", extended linearly past its longest {past[0]:,} tokens" if past else ""


def _mean_past(tier: dict) -> str:
    """Where some of a tier's restores are longer than section 21 measured, how much of the mean saving they give
    (``sim.past_measured``): a mean that rests mostly on the linear extension must say so beside it. Empty where
    none is, or for a row recorded before the column."""
    n, part = tier.get("num_restores_past_measured"), tier.get("saved_ms_mean_past_measured")
    mean = (tier.get("saved_ms_per_request") or {}).get("mean")
    if not n or part is None or not mean:
        return ""
    return (f", {_ms(part)} ms of it ({part / mean:.0%}) from the {n:,} restore{'s' * (n != 1)} longer than "
            f"section 21 measured")


def best_tier(tiers: list[dict]) -> dict:
    """The tier row that saves the most prefill time on average (most restored tokens where unpriced)."""
    return max(tiers, key=lambda t: (t.get("saved_ms_per_request", {}).get("mean", float("-inf")),
                                     t["tier_restored_tokens"]))


def verdict(run) -> list[str]:
    """The findings table's sentence: how much of the reachable reuse stock vLLM leaves at the replayed pool
    (token counts, deterministic: no interval), and what the tier that saves the most adds."""
    run = RunFiles.of(run)
    results = run.results
    rows = replayed_rows(results)
    if not rows:
        return ["No verdict: no pool was replayed through vLLM's scheduler (see replay_not_run)."]
    r, t = rows[0], results.get("trace", {})
    word = "None left" if r["headroom_tokens"] <= 0 else "Most left" if r["reuse_share_of_bound"] < 0.5 else "Some left"
    text = (f"{word}: on {t.get('name')} ({t.get('num_requests', 0):,} requests) stock vLLM with a {r['pool_gib']:g} GiB "
            f"{r['shape']} pool reuses {stock_share(r):.1%} of prompt tokens where an ideal cache of the same pool reuses "
            f"{r['ideal_cached_share']:.1%} ({r['reuse_share_of_bound']:.1%} of the reachable reuse; token counts, "
            f"deterministic)")
    tiers = [x for x in results.get("tiers", []) if x["shape"] == r["shape"]]
    if tiers:
        best = best_tier(tiers)
        saved = best.get("saved_ms_per_request", {})
        text += (f"; a {best['tier_gib']:g} GiB {best['tier']} tier behind the {best['pool_blocks']:,}-block pool "
                 + _lift(best) + f" (ideal {best['ideal_reused_share']:.1%})"
                 + (f", an estimated {_ms(saved['mean'])} ms of prefill saved per request on average"
                    + _mean_past(best) + f" (p99 {_ms(saved['p99'])} ms; section 21's median TTFTs"
                    + f"{_extended(run, [best])})" if saved else ""))
    parity = parity_sentence(results, run.params.DEVICE, slice_blocks(run))
    return [text + "."] + ([parity] if parity else [])


def slice_blocks(run: RunFiles) -> int | None:
    """The most blocks the parity slice could have written: each request's prompt and capped output in whole blocks,
    as if none were shared (None without a slice). Where the slice's pool holds that many, it never evicted, and
    its equality says nothing of eviction, which the stock-vs-ideal figures turn on (review finding, 6 Dec 2026:
    4f23's slice of 50 requests could fill at most 21,900 of its 32,768 blocks)."""
    parity = run.records(PARITY)
    if not parity:
        return None
    n, size = len(parity[0].requests.num_cached_tokens), parity[0].block_size
    cap = run.params.PARITY_MAX_TOKENS
    return sum(-(-(r.input_length + min(r.output_length, cap)) // size) for r in run.records(TRACE)[:n])


def parity_sentence(results: dict, device: str, most_blocks: int | None = None) -> str | None:
    """The parity slice in one sentence: the two engines' cached tokens, and whether they are equal request by
    request (the recorded check); where the slice's pool holds every block it could write (``most_blocks``,
    ``slice_blocks``), that it exercised no eviction; None where the run has no slice."""
    rows = {r["engine"]: r for r in results.get("parity") or []}
    real, replay = rows.get("real"), rows.get("replay")
    if not (real and replay):
        return None
    status = ((results.get("checks") or {}).get(PARITY_CHECK) or {}).get("status")
    return (f"Parity slice: real vLLM ({device}, {real['model']}) and the replay engine cached "
            f"{real['num_cached_tokens']:,} and {replay['num_cached_tokens']:,} of {real['num_prompt_tokens']:,} "
            f"prompt tokens over the first {real['num_requests']} requests"
            + (", equal request by request" if status == "ok" else f"; the request-by-request check: {status}")
            + (f" (its {real['num_blocks']:,}-block pool holds all {most_blocks:,} blocks the slice could write: no "
               "eviction was exercised)" if most_blocks is not None and most_blocks <= real["num_blocks"] else "")
            + ("; no prefix was reused in the slice, so that compares zeros." if not real["num_cached_tokens"] else "."))


def findings(run) -> list[dict]:
    """The first screen's table (at most ~10 rows), for the replayed shape: each pool's reused share of prompt
    tokens (stock vLLM where replayed, LRU, the ideal), the DRAM and disk tier that save the most behind the
    replayed pool, and each route at the largest engine count."""
    results = RunFiles.of(run).results
    rows = replayed_rows(results) or results.get("pools", [])[:1]
    if not rows:
        return []
    shape = rows[0]["shape"]
    out = []
    for r in sorted((r for r in results.get("pools", []) if r["shape"] == shape), key=lambda r: r["num_blocks"]):
        stock = f"stock vLLM {stock_share(r):.1%} · " if r["stock"] == "replayed" else ""
        out.append({"what": f"{shape} pool {r['pool_gib']:g} GiB ({r['num_blocks']:,} blocks)",
                    "reused share of prompt tokens": f"{stock}LRU {r['lru_cached_share']:.1%} · ideal "
                                                     f"{r['ideal_cached_share']:.1%}",
                    "detail": f"headroom {_tokens(r['headroom_tokens'])} tokens" if r["stock"] == "replayed" else ""})
    for kind in ("dram", "disk"):
        tiers = [t for t in results.get("tiers", []) if t["shape"] == shape and t["tier"] == kind]
        if tiers:
            t = best_tier(tiers)
            saved = t.get("saved_ms_per_request", {})
            out.append({"what": f"+ {kind} tier {t['tier_gib']:g} GiB behind {t['pool_blocks']:,} blocks",
                        "reused share of prompt tokens": f"{t['reused_share']:.1%} · ideal {t['ideal_reused_share']:.1%}",
                        "detail": (f"prefill saved per request: mean {_ms(saved['mean'])} ms{_net_cost(saved['mean'])}, "
                                   f"p90 {_ms(saved['p90'])} ms, p99 {_ms(saved['p99'])} ms" if saved else "not priced")})
    engines = results.get("engines", [])
    if engines:
        n = max(r["num_engines"] for r in engines)
        for r in (r for r in engines if r["num_engines"] == n):
            out.append({"what": f"{n} engines, {r['route'].replace('_', ' ')}",
                        "reused share of prompt tokens": f"{r['reused_share']:.1%}",
                        "detail": f"busiest engine's prefill over the mean {r['load_imbalance']:.2f}"})
    return out


def lead(results: dict) -> str:
    """The answer's first sentence: how much of the reachable reuse stock gets, and what the largest tier adds."""
    rows = replayed_rows(results) or results.get("pools", [])[:1]
    if not rows:
        return "No pool was measured."
    r = rows[0]
    who = "Stock vLLM" if r["stock"] == "replayed" else "The LRU model of stock vLLM"
    text = (f"**{who} reuses {r['reuse_share_of_bound']:.0%} of the prefix reuse an ideal cache of the same "
            f"{r['pool_gib']:g} GiB {r['shape']} pool would find")
    tiers = [t for t in results.get("tiers", []) if t["shape"] == r["shape"]]
    if tiers:
        best = best_tier(tiers)
        saved = best.get("saved_ms_per_request", {})
        text += (f"; a {best['tier_gib']:g} GiB {best['tier']} tier behind a {best['pool_blocks']:,}-block pool "
                 + _lift(best) + f", saving an estimated {_ms(saved.get('mean'))} ms of prefill per "
                 f"request on average{_mean_past(best)} (p99 {_ms(saved.get('p99'))} ms)")
    return text + ".**"


def _net_cost(saved_ms: float | None) -> str:
    """Where a tier's mean saving is below zero (its restores, from disk, cost more than the recomputes they replace,
    on average), say so beside the negative figure."""
    return " (its restores cost more than recomputing, on average)" if saved_ms is not None and saved_ms < -0.05 else ""


def _ms(value: float | None) -> str:
    """Milliseconds as a reader takes them in: whole above 100, one decimal below; n/a where not priced. A saving that
    rounds to nothing reads 0.0, not -0.0 (a tier that restores next to nothing saves a hair less than zero)."""
    if value is None:
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{round(value, 1) or 0.0:,.1f}"  # -0.0 is falsy


def _lift(tier: dict) -> str:
    """What the tier does to the reused share of prompt tokens: lifts it from the pool's own share, or leaves it."""
    gpu = tier["gpu_reused_tokens"] / tier["num_prompt_tokens"] if tier["num_prompt_tokens"] else 0.0
    if tier["reused_share"] > gpu:
        return f"lifts reuse from {gpu:.1%} to {tier['reused_share']:.1%} of prompt tokens"
    return f"leaves reuse at {gpu:.1%} of prompt tokens (it restores nothing the pool did not already hold)"


def public_results(run) -> dict:
    """The aggregates section 23 publishes (an allow-list: numbers, labels, hashes)."""
    run = RunFiles.of(run)
    results = run.results
    pool_keys = ("shape", "pool_gib", "num_blocks", "pool_tokens", "num_prompt_tokens", "num_compulsory_tokens",
                 "ideal_prefill_tokens", "lru_prefill_tokens", "ideal_cached_share", "lru_cached_share", "stock",
                 "stock_prefill_tokens", "headroom_tokens", "headroom_share_of_stock", "reuse_share_of_bound")
    tier_keys = ("shape", "tier", "tier_gib", "pool_blocks", "tier_blocks", "gpu_reused_tokens", "tier_restored_tokens",
                 "ideal_reused_tokens", "reused_share", "ideal_reused_share", "num_restoring_requests",
                 "restored_tokens_per_request", "saved_ms_per_request", "saved_ms_per_restoring_request",
                 "saved_s_total", "cost_run", "cost_max_tokens", "num_restores_past_measured",
                 "saved_ms_mean_past_measured")
    engine_keys = ("num_engines", "route", "pool_blocks", "tier_blocks", "gpu_reused_tokens", "tier_restored_tokens",
                   "reused_share", "max_engine_prefill_tokens", "load_imbalance")
    return {
        "trace": dict(results.get("trace", {})),
        "counts": counts(run),
        "pools": [{k: r.get(k) for k in pool_keys} for r in results.get("pools", [])],
        "replays": list(results.get("replays", [])),
        "concurrent": list(results.get("concurrent", [])),
        "tiers": [{k: r.get(k) for k in tier_keys} for r in results.get("tiers", [])],
        "engines": [{k: r.get(k) for k in engine_keys} for r in results.get("engines", [])],
        "parity": list(results.get("parity", [])),
        "input_hashes": [{"input": k, "sha256": v} for k, v in results.get("inputs", {}).items()],
        "seconds": dict(results.get("seconds", {})),
    }


# -- the notebook's tables --
POOL_COLUMNS = ("shape", "pool_gib", "num_blocks", "stock", "stock_prefill_tokens", "lru_prefill_tokens",
                "ideal_prefill_tokens", "num_compulsory_tokens", "lru_cached_share", "ideal_cached_share",
                "headroom_tokens", "headroom_share_of_stock", "reuse_share_of_bound")


def pool_rows(run) -> list[dict]:
    return [{k: r.get(k) for k in POOL_COLUMNS} for r in RunFiles.of(run).results.get("pools", [])]


def tier_rows(run) -> list[dict]:
    out = []
    for r in RunFiles.of(run).results.get("tiers", []):
        row = {k: r.get(k) for k in ("shape", "tier", "tier_gib", "gpu_reused_tokens", "tier_restored_tokens",
                                     "reused_share", "ideal_reused_share", "num_restoring_requests", "saved_s_total")}
        for q, v in r.get("saved_ms_per_request", {}).items():
            row[f"saved_ms {q}"] = v
        out.append(row)
    return out


def engine_rows(run) -> list[dict]:
    return [{k: r.get(k) for k in ("num_engines", "route", "gpu_reused_tokens", "tier_restored_tokens", "reused_share",
                                   "max_engine_prefill_tokens", "load_imbalance")}
            for r in RunFiles.of(run).results.get("engines", [])]
