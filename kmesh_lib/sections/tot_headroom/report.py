"""What section 19 reports about a run: counts, headline, the closing answer, the public aggregates.

Every figure comes from the run's files (``raw/`` directly where it is cheap, otherwise the
``results.json`` tables that ``checks`` recompute from ``raw/``). Every table and label carries
the policy ("scripted ..." when outputs were forced).
"""
from __future__ import annotations

from collections import Counter

from kmesh_lib.base.records import RunFiles
from kmesh_lib.bounds.ideal import count_exact_prefix_edges
from kmesh_lib.sections.tot_headroom.params import (
    BLOCK_EVENTS,
    CAPTURE,
    ENGINE_TRACE,
    OUTCOMES,
    STOCK_SWEEP,
)


def policy_name(run) -> str:
    """Short label: "scripted" or "model"."""
    return RunFiles.of(run).params.POLICY


def counts(run) -> dict[str, int | str]:
    """Deterministic facts of the run (the smoke golden pins them; no timings)."""
    run = RunFiles.of(run)
    records = run.records(CAPTURE)
    kinds = Counter(r.kind for r in records)
    ops = Counter()
    for event in run.records(BLOCK_EVENTS):
        ops[event.op] += len(event.block_ids)
    search = run.results.get("search", {}).get("counts", {})
    arms = run.records(STOCK_SWEEP)
    return {
        "policy": policy_name(run),
        "num_calls": len(records), "num_proposal_calls": kinds["proposal"], "num_value_calls": kinds["value"],
        "num_avoided_value_calls": search.get("num_avoided_value_calls", "not recorded"),
        "num_solved": sum(o.status == "solved" for o in run.records(OUTCOMES)),
        "num_exact_prefix_edges": count_exact_prefix_edges(records) if records else 0,
        "num_prompt_tokens": sum(len(r.prompt_token_ids) for r in records),
        "num_output_tokens": sum(len(r.output_token_ids) for r in records),
        "num_cached_tokens": sum(r.num_cached_tokens for r in records),
        **{f"num_{op}_blocks": ops[op] for op in ("alloc", "touch", "free", "evict")},
        "num_replay_arms": len(arms),
        "num_scale_calls": sum(len(a.calls.invocation_id) for a in arms if a.trace != ENGINE_TRACE),
    }


def _tokens(n) -> str:
    return f"{n:,}" if isinstance(n, int) else str(n)


def stock_rows(results: dict, trace: str) -> list[dict]:
    return [r for r in results.get("stock_sweep", []) if r["trace"] == trace and "stock_total_tokens" in r]


def headroom_span(rows: list[dict]) -> str:
    """The retention headroom over the observed pool sizes, in words."""
    if not rows:
        return "not observed"
    rows = sorted(rows, key=lambda r: r["num_blocks"])
    worst = max(rows, key=lambda r: (r["headroom_share"], -r["num_blocks"]))
    if worst["headroom_tokens"] == 0:
        return f"zero at every observed pool size ({rows[0]['num_blocks']} to {rows[-1]['num_blocks']} blocks)"
    text = (f"up to {worst['headroom_share']:.1%} of stock's prefill ({_tokens(worst['headroom_tokens'])} tokens at "
            f"{worst['num_blocks']} blocks)")
    zero_from = next((r["num_blocks"] for i, r in enumerate(rows) if all(x["headroom_tokens"] == 0 for x in rows[i:])),
                     None)
    return text + (f", zero from {zero_from} blocks up" if zero_from is not None else "")


def headline(run) -> dict[str, str]:
    """Two to six key figures, for people."""
    run = RunFiles.of(run)
    results = run.results
    search = results.get("search", {})
    c = search.get("counts", {})
    b = results.get("bound", {})
    out = {"policy": results.get("policy", policy_name(run)),
           "search": (f"{c.get('num_calls', 0)} calls ({c.get('num_value_calls', 0)} value, "
                      f"{c.get('num_avoided_value_calls', 0)} more avoided by memo), "
                      f"{b.get('num_exact_prefix_edges', 0)} exact-prefix producer edges"
                      + (f"; partial: {search.get('limit_hit')}" if search.get("partial") else ""))}
    if b:
        out[f"stock vs ideal at the run's pool ({b['num_blocks']} blocks)"] = (
            f"{_tokens(b['observed_prefill_tokens'])} vs {_tokens(b['ideal_prefill_tokens'])} prefill tokens "
            f"(of {_tokens(b['num_prompt_tokens'])} prompt tokens)")
    engine_rows = stock_rows(results, ENGINE_TRACE)
    if engine_rows:
        out["headroom across pool sizes (engine trace)"] = headroom_span(engine_rows)
    scale = results.get("scale_searches", [])
    if scale:
        worst, zero_from = scale_summary(results, scale)
        ends = set(zero_from.values())
        out[f"headroom at scale ({scale[0]['num_puzzles']} puzzles, scripted), worst by error rate"] = (
            ", ".join(f"{k:g}: {v:.1%}" for k, v in worst.items())
            + (f"; zero from {max(ends)} blocks up at every rate" if None not in ends else ""))
    return out


def answer(run) -> str:
    """The closing paragraph: the section's question answered from this run's numbers."""
    run = RunFiles.of(run)
    results = run.results
    cfg = run.params
    search = results.get("search", {})
    c, b = search.get("counts", {}), results.get("bound", {})
    label = results.get("policy", cfg.POLICY)
    if not b:
        return "This run recorded no capture, so it answers nothing."
    if search.get("partial"):
        return (f"This run is **partial** (limit `{search.get('limit_hit')}` after {c.get('num_calls')} calls), so it "
                "does not answer the question: the bound comparison needs the whole search's trace.")
    if not (c.get("num_value_calls") and c.get("num_avoided_value_calls") and b.get("num_exact_prefix_edges")):
        return (f"This run made {c.get('num_calls')} calls, {c.get('num_value_calls')} of them value calls, with "
                f"{b.get('num_exact_prefix_edges')} exact-prefix producer edges: the search did not branch, so it cannot "
                "show whether branching leaves headroom. (With random or dummy weights no proposal parses; use "
                "`POLICY: scripted` or a real model.)")
    engine_rows = stock_rows(results, ENGINE_TRACE)
    tight = min(engine_rows, key=lambda r: r["num_blocks"]) if engine_rows else None
    parts = [f"With the {label} policy, the search made {c['num_calls']} calls ({c['num_value_calls']} value calls, "
             f"{c['num_avoided_value_calls']} more avoided by memoization) and {b['num_exact_prefix_edges']} producer edges "
             f"whose child keeps its parent's whole prompt and output as its exact prefix."]
    parts.append(f"At the run's pool of {b['num_blocks']} blocks stock vLLM prefilled "
                 f"{_tokens(b['observed_prefill_tokens'])} of {_tokens(b['num_prompt_tokens'])} prompt tokens against an "
                 f"ideal of {_tokens(b['ideal_prefill_tokens'])}"
                 + (": it already reaches the bound there." if b['observed_prefill_tokens'] == b['ideal_prefill_tokens']
                    else f", {_tokens(b['headroom_tokens'])} tokens of headroom."))
    if tight is not None:
        parts.append(f"Replayed on vLLM's own scheduler at every pool size that holds a request, the retention "
                     f"headroom (stock's prefill minus the ideal) is {headroom_span(engine_rows)}.")
        if tight["recomputed_tokens"]:
            parts.append(f"Apart from it, at the tightest pool ({tight['num_blocks']} blocks) the scheduler preempted "
                         f"{tight['num_preempted_calls']} calls and computed {_tokens(tight['recomputed_tokens'])} tokens "
                         f"again: a cost of admitting more calls than the pool holds, which keeping more blocks would "
                         f"not remove.")
        else:
            parts.append("No call was preempted at any of these sizes.")
    scale = results.get("scale_searches", [])
    if scale:
        parts.append(scale_sentence(results, scale))
    parts.append("Where the evidence is weak: the outputs are scripted (a weak model's text, not a model's), so the "
                 "request order is realistic but the proposals are not a model's; stock is observed on the real engine "
                 "only at the run's pool size and on the replay engine elsewhere, and the ideal bound ignores the pins "
                 "of running requests, so it is a lower bound that no real scheduler need reach."
                 if cfg.POLICY == "scripted" else
                 "Where the evidence is weak: stock is observed on the real engine only at the run's pool size and on "
                 "the replay engine elsewhere; the ideal bound ignores the pins of running requests.")
    return " ".join(parts)


def scale_summary(results: dict, scale: list[dict]) -> tuple[dict, dict]:
    """Per script error rate: the worst retention headroom share, and the pool size from which it is
    zero at every larger observed size (None: it never is)."""
    spans = {row["error_rate"]: sorted(stock_rows(results, row["trace"]), key=lambda r: r["num_blocks"])
             for row in scale}
    worst = {k: max((r["headroom_share"] for r in rows), default=0.0) for k, rows in spans.items()}
    zero_from = {k: next((r["num_blocks"] for i, r in enumerate(rows) if all(x["headroom_tokens"] == 0
                                                                              for x in rows[i:])), None)
                 for k, rows in spans.items()}
    return worst, zero_from


def scale_sentence(results: dict, scale: list[dict]) -> str:
    """Whether the answer holds at every script error rate: where headroom exists, and how large."""
    worst, zero_from = scale_summary(results, scale)
    calls = ", ".join(str(row["num_calls"]) for row in scale)
    text = (f"On {scale[0]['num_puzzles']} puzzles, scripted at proposal error rates "
            f"{', '.join(f'{k:g}' for k in worst)} ({calls} calls), the worst retention headroom over the pool sizes "
            f"is {', '.join(f'{v:.1%}' for v in worst.values())}")
    if None in zero_from.values():
        return text + "; at some error rate it persists up to the largest pool observed."
    return text + (f", and it is zero from {max(zero_from.values())} blocks up at every error rate: where headroom "
                   f"exists does not depend on search quality, how much of it does."
                   if max(worst.values()) > 0 else ": none at any error rate.")


def public_results(run) -> dict:
    """The aggregates section 19 publishes: an explicit allow-list (numbers, counts, labels, hashes)."""
    run = RunFiles.of(run)
    results = run.results
    search = results.get("search", {})
    row_keys = ("trace", "outputs", "error_rate", "num_blocks", "num_calls", "num_prompt_tokens", "num_compulsory_tokens",
                "ideal_prefill_tokens", "lru_prefill_tokens", "stock_prefill_tokens", "recomputed_tokens",
                "stock_total_tokens", "headroom_tokens", "headroom_share", "num_preempted_calls", "num_evicted_blocks",
                "drain_ok", "engine_prefill_tokens")
    scale_keys = ("trace", "outputs", "error_rate", "num_puzzles", "num_calls", "num_value_calls", "num_avoided_value_calls",
                  "num_valid_proposals", "num_invalid_proposals", "num_unparsed_proposal_lines", "num_solved",
                  "num_exact_prefix_edges")
    bound_keys = ("num_blocks", "block_size", "num_invocations", "num_prompt_tokens", "observed_prefill_tokens",
                  "lru_prefill_tokens", "ideal_prefill_tokens", "num_compulsory_tokens", "headroom_tokens",
                  "num_producer_edges", "num_exact_prefix_edges")
    return {
        "policy": results.get("policy"),
        "partial": search.get("partial"), "limit_hit": search.get("limit_hit"),
        "counts": counts(run),
        "search_counts": dict(search.get("counts", {})),
        "puzzle_status": dict(Counter(o["status"] for o in search.get("outcomes", []))),
        "bound": {k: results.get("bound", {}).get(k) for k in bound_keys},
        "stock_sweep": [{k: r[k] for k in row_keys if k in r} for r in results.get("stock_sweep", [])],
        "scale_searches": [{k: r[k] for k in scale_keys} for r in results.get("scale_searches", [])],
        "input_hashes": [{"input": k, "sha256": v} for k, v in results.get("inputs", {}).items()],
        "seconds": {"engine_start_s": search.get("engine_start_s"), "search_s": search.get("search_s"),
                    "arms_s": results.get("arms_s")},
    }


# -- the notebook's tables (rows for pandas.DataFrame) --
def run_summary(run) -> dict[str, str]:
    """How the engine run went: policy, engine, sizes, partial or not, timings."""
    run = RunFiles.of(run)
    results = run.results
    search = results.get("search", {})
    b = results.get("bound", {})
    return {"policy": results.get("policy", ""), "calls": str(search.get("counts", {}).get("num_calls")),
            "partial": f"{search.get('partial')} (limit hit: {search.get('limit_hit')})",
            "engine start / search / replay arms": f"{search.get('engine_start_s')} s / {search.get('search_s')} s / "
                                                   f"{results.get('arms_s')} s",
            "pool": f"{b.get('num_blocks')} usable blocks of {b.get('block_size')} tokens"}


def search_table(run) -> list[dict]:
    """The engine run's search counters."""
    run = RunFiles.of(run)
    counts_ = run.results.get("search", {}).get("counts", {})
    return [{"outputs": policy_name(run), "counter": k, "count": v} for k, v in counts_.items()]


def outcomes_table(run) -> list[dict]:
    run = RunFiles.of(run)
    return [{"outputs": policy_name(run), **o.table_row()} for o in run.records(OUTCOMES)]


STOCK_COLUMNS = ("trace", "outputs", "num_blocks", "num_calls", "num_prompt_tokens", "stock_prefill_tokens", "recomputed_tokens",
                 "lru_prefill_tokens", "ideal_prefill_tokens", "num_compulsory_tokens", "headroom_tokens",
                 "headroom_share", "num_preempted_calls", "num_evicted_blocks", "drain_ok", "engine_prefill_tokens")


def stock_table(run, scale: bool = False) -> list[dict]:
    """Stock vLLM against LRU and ideal across pool sizes: the engine trace, or the scale traces.
    Sizes too small for one request have LRU and ideal only (vLLM refuses such a pool)."""
    rows = [r for r in RunFiles.of(run).results.get("stock_sweep", []) if (r["trace"] != ENGINE_TRACE) == scale]
    return [{k: r.get(k, "") for k in STOCK_COLUMNS} for r in rows]


def scale_table(run) -> list[dict]:
    """What each scripted scale search did, by error rate."""
    return list(RunFiles.of(run).results.get("scale_searches", []))


def verdict(run) -> list[str]:
    """One sentence: the headroom of ideal retention over stock vLLM at the run's pool (prefill tokens,
    deterministic for the scripted policy: no interval), and across pool sizes and error rates."""
    run = RunFiles.of(run)
    results = run.results
    b = results.get("bound", {})
    if not b:
        return ["No verdict: this run recorded no capture."]
    observed, ideal = b["observed_prefill_tokens"], b["ideal_prefill_tokens"]
    share = (observed - ideal) / observed if observed else 0.0
    word = "No" if observed == ideal else "Some"
    text = (f"{word}: at the run's pool ({b['num_blocks']} blocks) stock vLLM prefills {_tokens(observed)} tokens and "
            f"ideal retention {_tokens(ideal)} ({share:.1%} headroom, a share of stock's prefill; "
            f"{_tokens(b['num_prompt_tokens'])} prompt tokens in all)")
    scale = results.get("scale_searches", [])
    if scale:
        worst, zero_from = scale_summary(results, scale)
        ends = set(zero_from.values())
        rate, top = max(worst.items(), key=lambda kv: kv[1]) if worst else (None, 0.0)
        if rate is not None:
            text += (f"; over {scale[0]['num_puzzles']} scripted puzzles and smaller pools the most headroom is {top:.1%} "
                     f"of stock's prefill (proposal error rate {rate:g})"
                     + (f", zero from {max(ends)} blocks up" if None not in ends else ""))
    return [text + "."]


def findings(run) -> list[dict]:
    """The key figures, one row each."""
    return [{"what": k, "figure": v} for k, v in headline(run).items()]
