"""Section 18 for people: headline figures, the closing answer, the public aggregates.

Figures come from the run's raw records through ``report`` (the functions ``checks`` uses). A run
recorded before ``raw/sweep.jsonl`` existed has its sweep only in results.json; the answer then
says that its sweep figures are the recorded ones.
"""
from __future__ import annotations

from kmesh_lib.base.checks import verdict as checks_verdict
from kmesh_lib.base.records import RunFiles, recorded_packages
from kmesh_lib.sections.family_hold import report
from kmesh_lib.sections.family_hold.checks import checks
from kmesh_lib.sections.family_hold.params import hashed_blocks
from kmesh_lib.sections.family_hold.recorded import OPS, mode_sizes, modes, read_mode, read_sweep


def _mode(run: RunFiles, mode: str) -> dict | None:
    arms = read_mode(run, mode)
    if not report.pairs(arms):
        return None
    block_size, num_gpu_blocks = mode_sizes(run.params, mode)
    samples = report.sample_rows(arms)
    return {"mode": mode, "block_size": block_size, "num_gpu_blocks": num_gpu_blocks, "samples": samples,
            "first": samples[0], "same": len({(s["saved"], s["displaced"]) for s in samples}) == 1,
            "arms": report.arm_rows(arms), "pairs": len(report.pairs(arms)),
            "requests": sum(len(s.requests) for s, _ in report.pairs(arms)),
            "token_mismatches": len(report.output_mismatches(arms, float("inf"))),
            "max_logprob_delta": report.summarize_mode(arms, 0.0)["max_logprob_delta"]}


def _sweep(run: RunFiles) -> tuple[list[dict], bool]:
    """Sweep rows from raw/sweep.jsonl, or the recorded rows of a run that kept none in raw/ (False)."""
    rows = report.sweep_rows(read_sweep(run))
    return (rows, True) if rows else (run.results.get("sweep") or [], False)


def _tokens(n: int) -> str:
    return f"{n:,}".replace("-", "\u2212")


def _verdict(net: int) -> str:
    return "loses" if net < 0 else "pays" if net > 0 else "breaks even"


def _bracket(rows: list[dict], cross: float | None) -> str:
    """The two sweep pools whose parent shares enclose the crossing."""
    for a, b in zip(rows, rows[1:]):
        if cross is not None and a["parent_share"] <= cross <= b["parent_share"]:
            return f"between {b['num_gpu_blocks']} and {a['num_gpu_blocks']} blocks"
    return ""


def headline(run: RunFiles) -> dict[str, str]:
    out = {}
    for mode in ("replay", "real"):
        m = _mode(run, mode)
        if m:
            s = m["first"]
            out[f"{mode}, {m['num_gpu_blocks']} blocks of {m['block_size']}: saved / displaced / net"] = (
                f"{_tokens(s['saved'])} / {_tokens(s['displaced'])} / {_tokens(s['net'])} tokens")
    rows, _ = _sweep(run)
    cross = report.crossing(rows)
    if rows:
        out["saved and displaced cross at a parent share of"] = (f"{cross} of the pool ({_bracket(rows, cross)})"
                                                                 if cross is not None else "no crossing in the sweep")
    real = _mode(run, "real")
    if real:
        out["real engine outputs between arms"] = (f"tokens equal in {real['requests'] - real['token_mismatches']} of "
                                                   f"{real['requests']} requests; "
                                                   f"max |logprob delta| {real['max_logprob_delta']:.2g}")
    out["checks"] = checks_verdict(checks(run))
    return out


def answer(run: RunFiles) -> str:
    p, env = run.params, run.env
    replay, real = _mode(run, "replay"), _mode(run, "real")
    if replay is None and real is None:
        return "No arm-sample pair was recorded, so this run cannot answer the question."
    report_ = checks(run)
    failed = [c for c in report_ if c.status == "failed"]
    text = []
    main = replay or real
    s = main["first"]
    k = hashed_blocks(p.PARENT_TOKENS, p.MAX_TOKENS, main["block_size"])
    engine = ("the replay engine (vLLM's scheduler and block pool, no forward pass)" if main["mode"] == "replay"
              else "the real engine")
    text.append(f"**At a {main['num_gpu_blocks']}-block pool of {main['block_size']}-token blocks the held arm "
                f"{_verdict(s['net'])}.** On {engine}, holding the parent's {k} hashed blocks saves its child "
                f"{_tokens(s['saved'])} prompt tokens of prefill but displaces {_tokens(s['displaced'])} tokens of the "
                f"unrelated requests' cache hits: net {_tokens(s['net'])} tokens per sample"
                + (f", the same in all {main['pairs']} samples." if main["same"] else
                   f" in sample 0 (samples differ: {[x['net'] for x in main['samples']]})."))
    if real and main is not real:
        r = real["first"]
        parity = next((c for c in report_ if c.name.startswith("real engine counts equal")), None)
        first_mode = "The real engine" if run.params.ENGINE == "real" else "The first run mode (replay engine)"
        same = "too" if _verdict(r["net"]) == _verdict(s["net"]) else "instead"
        text.append(f"{first_mode} (vLLM {recorded_packages(env).get('vllm', '?')}, {p.MODEL}, {p.DTYPE} on "
                    f"{p.DEVICE}, {real['block_size']}-token blocks, {real['num_gpu_blocks']}-block pool) "
                    f"{_verdict(r['net'])} {same}: saved {_tokens(r['saved'])}, displaced {_tokens(r['displaced'])}, "
                    f"net {_tokens(r['net'])}"
                    + ("; its cached tokens and block operations equal the replay engine's at the same sizes."
                       if parity is not None and parity.ok else "."))
    rows, from_raw = _sweep(run)
    cross = report.crossing(rows)
    if rows and cross is not None:
        pays = [r for r in rows if r["parent_share"] > cross]
        loses = [r for r in rows if r["parent_share"] < cross and r["net"] < 0]
        idle = [r for r in rows if r["net"] == 0 and r["displaced"] == 0 and r["saved"] == 0]
        text.append(f"Sweeping the pool ({len(rows)} pools, one sample each on the replay engine), saved and displaced "
                    f"cross at a parent share of **{cross}** of the usable pool ({_bracket(rows, cross)}): in smaller pools "
                    f"the hold pays (net up to +{_tokens(max((r['net'] for r in pays), default=0))} tokens)"
                    + (f", from {min(r['num_gpu_blocks'] for r in loses)} to {max(r['num_gpu_blocks'] for r in loses)} "
                       f"blocks it loses (down to {_tokens(min(r['net'] for r in loses))})" if loses else "")
                    + (f", and from {min(r['num_gpu_blocks'] for r in idle)} blocks up the hold changes nothing (net 0)"
                       if idle else "") + "."
                    + ("" if from_raw else " These sweep figures are the ones results.json recorded: this run kept no "
                       "raw/sweep.jsonl to recompute them from."))
    elif rows:
        text.append(f"The sweep ({len(rows)} pools) shows no crossing: net is {_tokens(rows[0]['net'])} to "
                    f"{_tokens(rows[-1]['net'])} tokens from the smallest to the largest parent share.")
    if real:
        delta = real["max_logprob_delta"]
        text.append(f"Outputs between arms on the real engine: tokens equal in {real['requests'] - real['token_mismatches']} "
                    f"of {real['requests']} requests, " + ("chosen-token logprobs identical." if delta == 0 else
                                                          f"chosen-token logprobs at most {delta:.2g} apart."))
    text.append("Where the evidence is weak: one parent-child family with synthetic random-token prompts and a fixed "
                "competing workload; the counts are exact, but the share at which a hold pays depends on that workload."
                + (f" {len(failed)} check(s) failed: " + "; ".join(c.name for c in failed[:3]) + "." if failed else ""))
    return " ".join(text)


def public_results(run: RunFiles) -> dict:
    """Section 18's aggregates: per mode and arm, cached tokens and block operations; per sample,
    saved, displaced and net; output agreement counts; the sweep rows and the crossing. The check
    statuses are the public document's own ``checks`` list (check names are longer than a public key)."""
    out: dict = {"section": "family_hold", "run_id": run.results.get("run_id"), "status": run.results.get("status"),
                 "modes": []}
    for mode in modes(run):
        m = _mode(run, mode)
        if m is None:
            continue
        out["modes"].append({
            "mode": mode, "block_size": m["block_size"], "num_gpu_blocks": m["num_gpu_blocks"],
            "arms": [{"arm": a["arm"], "cached_tokens_per_request": list(a["cached_tokens_per_request"]),
                      **{op: a[op] for op in OPS}, "same_in_every_sample": a["same_in_every_sample"]} for a in m["arms"]],
            "samples": [{k: s[k] for k in ("sample", "saved", "displaced", "net", "child_cached_stock", "child_cached_held",
                                           "evict_stock", "evict_held", "edges_stock", "edges_held")} for s in m["samples"]],
            "num_requests_compared": m["requests"], "num_token_mismatches": m["token_mismatches"],
            "max_logprob_delta": m["max_logprob_delta"]})
    rows, from_raw = _sweep(run)
    out["sweep"] = [{k: r[k] for k in ("num_gpu_blocks", "parent_share", "saved", "displaced", "net", "refused",
                                       "evict_stock", "evict_held")} for r in rows]
    out["sweep_from_raw"] = from_raw
    out["sweep_crossing_parent_share"] = report.crossing(rows)
    return out


def verdict(run: RunFiles) -> list[str]:
    """One sentence: whether holding pays at the run's pressure, in tokens (block counts are
    deterministic: no interval), and where saved and displaced cross in the sweep."""
    run = RunFiles.of(run)
    main = _mode(run, "replay") or _mode(run, "real")
    if main is None:
        return ["No verdict: no arm-sample pair was recorded."]
    s = main["first"]
    word = {"loses": "No", "pays": "Yes", "breaks even": "It breaks even"}[_verdict(s["net"])]
    text = (f"{word}: in a pool of {main['num_gpu_blocks']} blocks of {main['block_size']}, holding the parent "
            f"saves its child {_tokens(s['saved'])} prompt tokens but displaces {_tokens(s['displaced'])} "
            f"(net {_tokens(s['net'])}; block counts, deterministic)")
    rows, _ = _sweep(run)
    cross = report.crossing(rows) if rows else None
    if cross is not None:
        text += (f"; in the pool sweep saved and displaced tokens cross where the parent fills {cross} of the pool "
                 f"({_bracket(rows, cross)})")
    return [text + "."]


def findings(run: RunFiles) -> list[dict]:
    """Per engine mode: the pool, saved, displaced and net tokens; then the sweep's crossing and the outputs check."""
    run = RunFiles.of(run)
    out = []
    for mode in ("replay", "real"):
        m = _mode(run, mode)
        if m:
            s = m["first"]
            out.append({"what": f"{mode} engine, {m['num_gpu_blocks']} blocks of {m['block_size']}",
                        "figure": f"saved {_tokens(s['saved'])} / displaced {_tokens(s['displaced'])} / net "
                                  f"{_tokens(s['net'])} tokens",
                        "basis": f"{m['pairs']} arm pairs" + (", every sample the same" if m["same"] else "")})
    rows, raw = _sweep(run)
    if rows:
        cross = report.crossing(rows)
        out.append({"what": "saved = displaced at a parent share of",
                    "figure": f"{cross} of the pool ({_bracket(rows, cross)})" if cross is not None else "no crossing",
                    "basis": f"{len(rows)} pool sizes" + ("" if raw else " (recorded, not in raw/)")})
    real = _mode(run, "real")
    if real:
        out.append({"what": "real engine outputs, hold vs no hold",
                    "figure": f"tokens equal in {real['requests'] - real['token_mismatches']} of {real['requests']} "
                              f"requests; max |logprob delta| {real['max_logprob_delta']:.2g}",
                    "basis": f"LOGPROB_TOLERANCE {run.params.LOGPROB_TOLERANCE}"})
    return out
