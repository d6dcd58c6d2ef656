"""Section 22's headline figures, closing answer and public aggregates, from the raw records."""
from __future__ import annotations

from kmesh_lib.base.checks import summarize
from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections.multi_engine import report
from kmesh_lib.sections.multi_engine.checks import checks, models_of

MIB = 1 << 20
ORDER = ("recompute", "round_robin", "prefix_aware", "shared")


def tables(run: RunFiles) -> tuple[list[dict], list[dict], list[dict]]:
    rows, arms = run.raw("requests.jsonl"), run.raw("arms.jsonl")
    return (report.policy_table(rows, run.params["NUM_ENGINES"]), report.bytes_table(arms, rows),
            report.restore_table(rows))


def _fmt(x, unit: str = "", digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}{unit}"


def _ratio(a, b) -> str:
    return "-" if a is None or not b else f"x{a / b:.2f}"


def headline(run: RunFiles) -> dict[str, str]:
    policies, byte_rows, _ = tables(run)
    out = {}
    for model in models_of(run.params)[:2]:
        mine = {t["policy"]: t for t in policies if t["model"] == model}
        present = [p for p in ORDER if p in mine]
        out[f"{model}: makespan (s)"] = " / ".join(f"{p} {_fmt((mine[p]['makespan_ms'] or 0) / 1e3, '', 2)}"
                                                  for p in present)
        out[f"{model}: child first token, median (ms)"] = " / ".join(
            f"{p} {_fmt(mine[p]['child_ttft_ms'], '', 1)}" for p in present)
        if "shared" in mine and "prefix_aware" in mine:
            s, a = mine["shared"], mine["prefix_aware"]
            out[f"{model}: shared vs prefix_aware"] = (
                f"makespan {_ratio(s['makespan_ms'], a['makespan_ms'])}, child first token "
                f"{_ratio(s['child_ttft_ms'], a['child_ttft_ms'])}; busiest engine / mean {s['load_imbalance']} vs "
                f"{a['load_imbalance']}")
    if byte_rows:
        restored = sum(b["engine_restored_bytes"] for b in byte_rows)
        l2 = sum(b["l2_read_bytes_hook"] or 0 for b in byte_rows)
        out["restored through the server"] = (f"{restored / MIB:,.1f} MiB into the engines, {l2 / MIB:,.1f} MiB read "
                                              f"from the disk tier, over {len(byte_rows)} trace(s)")
    return out


def _model_answer(model: str, mine: dict, restore: dict | None, byte_rows: list[dict], num_engines: int) -> str:
    if "shared" not in mine or "prefix_aware" not in mine:
        return f"**{model}**: the run lacks shared or prefix_aware, so the two answers to a shared prefix are not compared."
    s, a = mine["shared"], mine["prefix_aware"]
    rc = mine.get("recompute")
    faster = (s["makespan_ms"] or 0) < (a["makespan_ms"] or 0)
    child_faster = (s["child_ttft_ms"] or 0) < (a["child_ttft_ms"] or 0)
    text = [f"**{model}, {num_engines} engines.** Shared KV (round-robin + the server) "
            f"{'beats' if faster else 'loses to'} prefix-aware routing on the makespan "
            f"({_fmt(s['makespan_ms'], ' ms')} against {_fmt(a['makespan_ms'], ' ms')}"
            + (f"; recompute {_fmt(rc['makespan_ms'], ' ms')}" if rc else "") + ") and "
            f"{'beats' if child_faster else 'loses to'} it on the children's median first token "
            f"({_fmt(s['child_ttft_ms'], ' ms', 1)} against {_fmt(a['child_ttft_ms'], ' ms', 1)}"
            + (f"; recompute {_fmt(rc['child_ttft_ms'], ' ms', 1)}" if rc else "") + ")."]
    text.append(f"Prefix-aware routing sent {a['children_with_parent']} children to their parent's engine and left the "
                f"computed prompt tokens at {a['computed_per_engine']} per engine (busiest / mean {a['load_imbalance']}); "
                f"round-robin with the server spread them {s['computed_per_engine']} (busiest / mean {s['load_imbalance']}), "
                f"with {s['children_with_parent']} children on their parent's engine.")
    if restore:
        mib = sum(b["engine_restored_bytes"] for b in byte_rows) / MIB
        l2 = sum(b["l2_read_bytes_hook"] or 0 for b in byte_rows) / MIB
        l1_tokens = sum(b["l1_hit_tokens"] for b in byte_rows)
        l2_tokens = sum(b["l2_hit_tokens"] for b in byte_rows)
        shared_ms, recompute_ms, local_ms = (restore["shared_ttft_ms"], restore["recompute_ttft_ms"],
                                             restore["prefix_aware_ttft_ms"])
        verdict = "beats" if (shared_ms or 0) < (recompute_ms or 0) else "does not beat"
        local = "beats" if (local_ms or 0) < (shared_ms or 0) else "does not beat"
        text.append(f"The server restored {restore['restored_children']} children (median "
                    f"{_fmt(restore['restored_tokens_median'])} tokens each; {mib:,.1f} MiB into the engines; lookups hit "
                    f"{l1_tokens:,} tokens in L1 and {l2_tokens:,} on the disk tier, {l2:,.1f} MiB read from it). Those "
                    f"children's median first token was {_fmt(shared_ms, ' ms', 1)} restored, against "
                    f"{_fmt(recompute_ms, ' ms', 1)} recomputed and {_fmt(local_ms, ' ms', 1)} from a local hit under "
                    f"prefix-aware routing: restoring {verdict} recomputing here, and a local hit {local} restoring.")
    else:
        text.append("The server restored no child in this run, so restore time is not measured.")
    why = ("shared KV wins where spreading the load matters more than the restore's cost (prefix-aware routing piles "
           "families onto one engine, whose queue grows while the other idles)" if faster else
           "prefix-aware routing wins where a local hit is cheaper than a restore and the load it piles onto one engine "
           "does not queue the trace")
    text.append(f"Why, in this run: {why}.")
    return " ".join(text)


def answer(run: RunFiles) -> str:
    p = run.params
    policies, byte_rows, restores = tables(run)
    if not policies:
        return "No request was recorded, so this run answers nothing."
    parts = [_model_answer(m, {t["policy"]: t for t in policies if t["model"] == m},
                           next((r for r in restores if r["model"] == m), None),
                           [b for b in byte_rows if b["model"] == m], p["NUM_ENGINES"]) for m in models_of(p)]
    repeats = p["NUM_REPEATS"]
    caveats = [f"The evidence is {repeats} trace(s) per policy and model"
               + (" (one sample: no spread)" if repeats == 1 else f" (medians over {repeats})")]
    if p["DEVICE"] == "cpu":
        caveats.append("on a shared 2-core CPU machine, where the engines compete with each other and with other work "
                       "for cores, so time differences of tens of percent are within the noise")
    if p["WEIGHTS"] != "real" and not any("/" in m for m in models_of(p)):
        caveats.append(f"with synthetic {p['WEIGHTS']} weights (outputs are not language; cache accounting and timing are real)")
    if p.get("KILL_ENGINE") is not None:
        caveats.append(f"and engine {p['KILL_ENGINE']} was killed mid-trace (a fault run: timings are not comparable)")
    return "\n\n".join(parts + ["; ".join(caveats) + "."])


def public_results(run: RunFiles) -> dict:
    """Aggregates only: the tables' numbers and labels, the trace's shape, check counts; no tokens."""
    p = run.params
    policies, byte_rows, restores = tables(run)
    keep_policy = ("model", "policy", "repeats", "requests", "ok", "makespan_ms", "ttft_ms", "ttft_p90_ms",
                   "parent_ttft_ms", "child_ttft_ms", "noise_ttft_ms", "local_tokens", "restored_tokens",
                   "recomputed_tokens", "children_with_parent", "requests_per_engine", "computed_per_engine",
                   "load_imbalance")
    keep_bytes = ("model", "repeat", "engine_restored_bytes", "l1_hit_tokens", "l2_hit_tokens", "l1_write_bytes",
                  "l1_evicted_bytes", "l2_write_bytes_hook", "l2_read_bytes_hook", "l2_read_bytes_device",
                  "l2_read_bytes_metrics", "l1_oom_chunks")
    keep_restore = ("model", "restored_children", "restored_tokens_median", "shared_ttft_ms", "recompute_ttft_ms",
                    "round_robin_ttft_ms", "prefix_aware_ttft_ms")
    shape = ("NUM_ENGINES", "NUM_FAMILIES", "NUM_CHILDREN", "PARENT_TOKENS", "CHILD_SUFFIX_TOKENS", "NUM_NOISE",
             "NOISE_TOKENS", "MAX_TOKENS", "MEAN_ARRIVAL_GAP_S", "MEAN_CHILD_GAP_S", "NUM_REPEATS", "BLOCK_SIZE",
             "NUM_GPU_BLOCKS", "CHUNK_SIZE", "ARENA_MIB", "STORE_POLICY", "DEVICE", "DTYPE", "WEIGHTS")
    return {"section": "multi_engine", "run_id": run.run_dir.name, "models": models_of(p),
            "policies_run": list(p["POLICIES"]), "shape": {k: p[k] for k in shape},
            "policies": [{k: t[k] for k in keep_policy} for t in policies],
            "bytes": [{k: b[k] for k in keep_bytes} for b in byte_rows],
            "restore": [{k: r[k] for k in keep_restore} for r in restores],
            "checks": summarize(checks(run)), "headline": headline(run)}
