"""Section 22's headline figures, closing answer and public aggregates, from the raw records."""
from __future__ import annotations

from kmesh_lib.base.checks import summarize
from kmesh_lib.base.declared import ABSENT
from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections.multi_engine import compare
from kmesh_lib.sections.multi_engine.checks import checks
from kmesh_lib.sections.multi_engine.tables import TABLES

MIB = 1 << 20
ORDER = ("recompute", "round_robin", "prefix_aware", "shared")


def probe_rows(run: RunFiles) -> list[dict]:
    return TABLES["probes"].build(run)


def tables(run: RunFiles) -> tuple[list[dict], list[dict], list[dict]]:
    """The declared policies, bytes and restore tables, rebuilt from the run's files (``tables.TABLES``)."""
    return tuple(TABLES[key].build(run) for key in ("policies", "bytes", "restore"))


def _fmt(x, unit: str = "", digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}{unit}"


def _ratio(a, b) -> str:
    return "-" if a is None or not b else f"x{a / b:.2f}"


def _two(value: float | None) -> str:
    """A load ratio as the tables give it, two decimals ('1.00 vs 1.18', where '1.0' stood beside '1.18')."""
    return "n/a" if value is None else f"{value:.2f}"


def headline(run: RunFiles) -> dict[str, str]:
    """Per model (at most two): makespan per policy, shared against prefix-aware, the idle-engine probe."""
    policies, byte_rows, _ = tables(run)
    probes = {r["model"]: r for r in probe_rows(run)}
    models = run.params.models[:2]
    compared = TABLES["comparisons"].build(run)
    out = {}
    for model in models:
        mine = {t["policy"]: t for t in policies if t["model"] == model}
        present = [p for p in ORDER if p in mine]
        out[f"{model}: makespan (s)"] = " / ".join(f"{p} {_fmt((mine[p]['makespan_ms'] or 0) / 1e3, '', 1)}"
                                                  for p in present)
        if compared is not ABSENT:  # a run with drawn orders and repeats: verdicts with their intervals
            for t in compared:
                if t["model"] == model and (t["a"], t["b"]) == ("shared", "prefix_aware"):
                    out[f"{model}: shared vs prefix_aware, {t['metric']}"] = _verdict_short(t)
        elif "shared" in mine and "prefix_aware" in mine:
            s, a = mine["shared"], mine["prefix_aware"]
            out[f"{model}: shared vs prefix_aware"] = (
                f"makespan {_ratio(s['makespan_ms'], a['makespan_ms'])}, child first token "
                f"{_ratio(s['child_ttft_ms'], a['child_ttft_ms'])}; busiest engine / mean {_two(s['load_imbalance'])} vs "
                f"{_two(a['load_imbalance'])}")
        if model in probes:
            p = probes[model]
            out[f"{model}: idle child first token (ms)"] = (f"recompute {_fmt(p['recompute_ttft_ms'], '', 1)} / restore "
                                                           f"{_fmt(p['restore_ttft_ms'], '', 1)} / local hit "
                                                           f"{_fmt(p['local_ttft_ms'], '', 1)}")
    if byte_rows and len(models) == 1:
        restored = sum(b["engine_restored_bytes"] for b in byte_rows)
        l2 = sum(b["l2_read_bytes_hook"] or 0 for b in byte_rows)
        out["restored through the server"] = (f"{restored / MIB:,.1f} MiB into the engines, {l2 / MIB:,.1f} MiB read "
                                              f"from the disk tier, over {len(byte_rows)} trace(s)")
    return out


def _verdict_short(t: dict) -> str:
    if t["verdict"] == compare.UNRESOLVED:
        return f"not resolved ({t['pairs']} pairs)"
    return (f"{t['verdict']} ({t['statistic']} {t['difference_ms']:+,.0f} ms, 95 % [{t['low_ms']:+,.0f}, "
            f"{t['high_ms']:+,.0f}], {t['pairs']} pairs)")


def _reasons(s: dict, a: dict, probe: dict | None, causal: bool = True) -> list[str]:
    """Why shared KV and prefix-aware routing came out as they did, each reason a comparison of this run's figures."""
    out = []
    if s["recomputed_tokens"] < a["recomputed_tokens"]:
        out.append(f"with the server the engines recomputed {a['recomputed_tokens'] - s['recomputed_tokens']:,} fewer prompt "
                   f"tokens per trace: its children found {s['child_cached_share']:.0%} of their prompts cached (pool or "
                   f"server) against {a['child_cached_share']:.0%} in the pools prefix-aware routing filled, where the "
                   "families piled onto one engine evict each other and the unrelated requests")
    elif s["recomputed_tokens"] > a["recomputed_tokens"]:
        out.append(f"prefix-aware routing recomputed {s['recomputed_tokens'] - a['recomputed_tokens']:,} fewer prompt tokens "
                   f"per trace (children {a['child_cached_share']:.0%} cached against {s['child_cached_share']:.0%})")
    if (s["load_imbalance"] or 0) < (a["load_imbalance"] or 0):
        out.append(f"round-robin kept the engines even (busiest / mean {s['load_imbalance']}) where prefix-aware routing "
                   f"loaded one engine more ({a['load_imbalance']})"
                   + (", whose queue the trace then waited on" if causal else ""))
    if probe and probe.get("restore_ttft_ms") is not None and probe.get("recompute_ttft_ms") is not None:
        cheaper = probe["restore_ttft_ms"] < probe["recompute_ttft_ms"]
        out.append(f"on an idle engine a restore ({_fmt(probe['restore_ttft_ms'], ' ms', 1)} to the first token, "
                   f"{(probe['restore_bytes'] or 0) / MIB:,.1f} MiB moved) {'beats' if cheaper else 'loses to'} recomputing "
                   f"the child ({_fmt(probe['recompute_ttft_ms'], ' ms', 1)})"
                   + (f" and a local hit beats both ({_fmt(probe['local_ttft_ms'], ' ms', 1)})"
                      if (probe.get("local_ttft_ms") or 1e18) < probe["restore_ttft_ms"] else ""))
    return out


def _comparison_text(model: str, compared: list[dict]) -> list[str]:
    """The verdicts, shared against prefix-aware first; every 'wins' or 'loses' has an interval that excludes 0."""
    mine = [t for t in compared if t["model"] == model]
    lead = [t for t in mine if (t["a"], t["b"]) == ("shared", "prefix_aware")]
    rest = [t for t in mine if t not in lead]
    text = ["Paired by repeat (makespan) and by child (first token), 95 % bootstrap intervals of a - b: "
            + "; ".join(compare.phrase(t) for t in lead) + "." if lead else ""]
    decided = [compare.phrase(t) for t in rest if t["verdict"] in (compare.WINS, compare.LOSES)]
    same = [f"{t['a']}/{t['b']} {'makespan' if t['metric'] == 'makespan' else 'child first token'} "
            f"[{t['low_ms']:+,.1f}, {t['high_ms']:+,.1f}] ms ({t['pairs']} pairs)" for t in rest if t["verdict"] == compare.SAME]
    if decided:
        text.append("Among the other policies: " + "; ".join(decided) + ".")
    if same:
        text.append("No difference measured (the 95 % interval of a - b contains 0): " + ", ".join(same) + ".")
    return [t for t in text if t]


def _model_answer(model: str, mine: dict, probe: dict | None, byte_rows: list[dict], num_engines: int,
                  compared=ABSENT) -> str:
    if "shared" not in mine or "prefix_aware" not in mine:
        return " ".join([f"**{model}**: the run lacks shared or prefix_aware, so the two answers to a shared prefix are "
                         "not compared."] + (_comparison_text(model, compared) if compared is not ABSENT else []))
    s, a = mine["shared"], mine["prefix_aware"]
    rc = mine.get("recompute")
    if compared is not ABSENT:
        text = [f"**{model}, {num_engines} engines.**"] + _comparison_text(model, compared)
    else:  # one trace per policy in a fixed order (before the orders were drawn): figures, no verdict
        text = [f"**{model}, {num_engines} engines.** One trace per policy, run in a fixed order: the makespan was "
                f"{_fmt(s['makespan_ms'], ' ms')} with shared KV (round-robin + the server) and "
                f"{_fmt(a['makespan_ms'], ' ms')} with prefix-aware routing"
                + (f" (recompute {_fmt(rc['makespan_ms'], ' ms')})" if rc else "") + ", the children's median first "
                f"token {_fmt(s['child_ttft_ms'], ' ms', 1)} against {_fmt(a['child_ttft_ms'], ' ms', 1)}"
                + (f" (recompute {_fmt(rc['child_ttft_ms'], ' ms', 1)})" if rc else "") + "; a single trace per "
                "policy, with the policy confounded with its place in time, gives no interval, so neither is a verdict."]
    text.append(f"Prefix-aware routing sent {a['children_with_parent']} children to their parent's engine and left "
                f"{a['computed_per_engine']} computed prompt tokens per engine; round-robin with the server put "
                f"{s['children_with_parent']} there and computed {s['computed_per_engine']}.")
    if byte_rows:
        mib = sum(b["engine_restored_bytes"] for b in byte_rows) / MIB / len(byte_rows)
        l2 = sum(b["l2_read_bytes_hook"] or 0 for b in byte_rows) / MIB / len(byte_rows)
        text.append(f"Per trace the server restored {s['restored_tokens']:,} tokens ({mib:,.1f} MiB) into the engines; "
                    + _hit_split(byte_rows) + f"; the byte hook counted {l2:,.1f} MiB read from the disk tier.")
    decided = compared is not ABSENT and any(
        t["model"] == model and (t["a"], t["b"]) == ("shared", "prefix_aware") and t["verdict"] in (compare.WINS, compare.LOSES)
        for t in compared)
    reasons = _reasons(s, a, probe, causal=compared is ABSENT or decided)
    if reasons and (compared is ABSENT or decided):
        text.append("Why, from this run's figures: " + "; ".join(reasons) + ".")
    elif reasons:  # no time difference measured between the two: what differed is not a cause of one
        text.append("What differed between the two, though no time difference between them was measured: "
                    + "; ".join(reasons) + ".")
    return " ".join(text)


def _hit_split(byte_rows: list[dict]) -> str:
    """Where the lookups hit, per trace: by tier where the server counts it (LMCache 0.5.6), else in all."""
    n = len(byte_rows)
    if all(b["l1_hit_tokens"] is not None and b["l2_hit_tokens"] is not None for b in byte_rows):
        return (f"its lookups hit {sum(b['l1_hit_tokens'] for b in byte_rows) // n:,} tokens in L1 and "
                f"{sum(b['l2_hit_tokens'] for b in byte_rows) // n:,} on the disk tier")
    return (f"its lookups hit {sum(b['lookup_hit_tokens'] for b in byte_rows) // n:,} tokens (L1 and the disk tier "
            "together: this LMCache exports no per-tier lookup counters)")


def answer(run: RunFiles) -> str:
    cfg = run.params
    policies, byte_rows, _ = tables(run)
    if not policies:
        return "No request was recorded, so this run answers nothing."
    probes = probe_rows(run)
    compared = TABLES["comparisons"].build(run)
    parts = [_model_answer(m, {t["policy"]: t for t in policies if t["model"] == m},
                           next((r for r in probes if r["model"] == m), None),
                           [b for b in byte_rows if b["model"] == m], cfg.NUM_ENGINES, compared) for m in cfg.models]
    repeats = cfg.NUM_REPEATS
    caveats = [f"The evidence is {repeats} trace(s) per policy and model"
               + (" (one sample: no spread)" if repeats == 1 else
                  ", each repeat in its own order drawn from SEED (the fleets in a random order, the policies within "
                  "each shuffled)" if compared is not ABSENT else f" (medians over {repeats})")]
    loads = [a.load_1m for a in run.records("arms.jsonl")]
    order = TABLES["order"].build(run)
    by_policy = compare.load_by_policy(order) if order is not ABSENT else {}
    if by_policy:
        caveats.append("the host's 1-minute load average at the traces' starts and ends was "
                       + ", ".join(f"{p} {lo:.1f}-{hi:.1f}" for (m, p), (lo, hi) in by_policy.items()
                                   if m == cfg.models[0]) + (f" ({cfg.models[0]})" if len(cfg.models) > 1 else ""))
    if cfg.DEVICE == "cpu":
        caveats.append(f"on a CPU machine with {run.env.get('cpu_count', '?')} cores shared with other work"
                       + (f" (load average {min(loads):.1f}-{max(loads):.1f} at the traces' ends)" if loads and not by_policy
                          else "")
                       + ", where the engines also compete with each other, so the timings carry that machine's noise")
    else:
        caveats.append(f"with {cfg.NUM_ENGINES} engines sharing the GPU(s) the device lends (engines on one GPU share "
                       "its compute, so an idle engine there does not idle the GPU)")
    if cfg.WEIGHTS != "real" and not any("/" in m for m in cfg.models):
        caveats.append(f"with synthetic {cfg.WEIGHTS} weights (outputs are not language; cache accounting and timing are real)")
    if cfg.KILL_ENGINE is not None:
        caveats.append(f"and engine {cfg.KILL_ENGINE} was killed mid-trace (a fault run: timings are not comparable)")
    extra = [(b, b["l2_read_bytes_device"] - b["l2_read_bytes_hook"]) for b in byte_rows
             if b["l2_read_bytes_device"] is not None and b["l2_read_bytes_hook"] is not None
             and b["l2_read_bytes_device"] != b["l2_read_bytes_hook"]]
    measured = []
    if extra:
        # What the device counted beyond the hook is stated here, both figures, with its likely cause
        # (checks.measured_lines keeps the strict statement as a measurement).
        measured.append(
            "The server process's device counter read more than the O_DIRECT hook and LMCache's loaded chunks in "
            + ", ".join(f"{b['model']} trace {b['repeat']} ({d:+,} bytes; hook {b['l2_read_bytes_hook']:,}, "
                        f"device {b['l2_read_bytes_device']:,})" for b, d in extra)
            + ": the likely source is file-system metadata the kernel reads for a process that creates files "
              "with O_DIRECT, which `/proc/<pid>/io` counts and the hook does not (`benchmarks/"
              "bench_odirect_metadata.py` on the CPU machine, reading nothing itself: 48 new 1 MiB files 0 to 20 KiB, "
              "80 new 3 MiB files 4 to 312 KiB, run to run); it is not confirmed inside the server. Both figures stand "
              "as a measured line; the checks hold the two payload counts to the byte and the device count to at "
              "least the payload.")
    return "\n\n".join(parts + measured + ["; ".join(caveats) + "."])


def public_results(run: RunFiles) -> dict:
    """Aggregates only: the tables' numbers and labels, the trace's shape, check counts; no tokens."""
    cfg = run.params
    policies, byte_rows, restores = tables(run)
    keep_policy = ("model", "policy", "repeats", "requests", "ok", "makespan_ms", "ttft_ms", "ttft_p90_ms",
                   "parent_ttft_ms", "child_ttft_ms", "noise_ttft_ms", "local_tokens", "restored_tokens",
                   "recomputed_tokens", "children_with_parent", "requests_per_engine", "computed_per_engine",
                   "child_cached_share", "load_imbalance")
    keep_bytes = ("model", "repeat", "engine_restored_bytes", "l1_hit_tokens", "l2_hit_tokens", "l1_write_bytes",
                  "l1_evicted_bytes", "l2_write_bytes_hook", "l2_read_bytes_hook", "l2_read_bytes_device",
                  "l2_read_bytes_metrics", "l1_oom_chunks")
    keep_restore = ("model", "restored_children", "restored_tokens_median", "shared_ttft_ms", "recompute_ttft_ms",
                    "round_robin_ttft_ms", "prefix_aware_ttft_ms")
    keep_probe = ("model", "probes", "recompute_ttft_ms", "local_ttft_ms", "restore_ttft_ms", "recompute_cached_tokens",
                  "local_cached_tokens", "restore_cached_tokens", "restore_bytes")
    shape = ("NUM_ENGINES", "NUM_FAMILIES", "NUM_CHILDREN", "PARENT_TOKENS", "CHILD_SUFFIX_TOKENS", "NUM_NOISE",
             "NOISE_TOKENS", "MAX_TOKENS", "MEAN_ARRIVAL_GAP_S", "MEAN_CHILD_GAP_S", "NUM_REPEATS", "NUM_PROBES", "BLOCK_SIZE",
             "NUM_GPU_BLOCKS", "CHUNK_SIZE", "ARENA_MIB", "STORE_POLICY", "DEVICE", "DTYPE", "WEIGHTS")
    out = {"section": "multi_engine", "run_id": run.run_dir.name, "models": cfg.models,
           "policies_run": list(cfg.POLICIES), "shape": {k: getattr(cfg, k) for k in shape},
           "policies": [{k: t[k] for k in keep_policy} for t in policies],
           "bytes": [{k: b[k] for k in keep_bytes} for b in byte_rows],
           "restore": [{k: r[k] for k in keep_restore} for r in restores],
           "probes": [{k: r[k] for k in keep_probe} for r in probe_rows(run)],
           "checks": summarize(checks(run)), "headline": headline(run)}
    compared = TABLES["comparisons"].build(run)
    if compared is not ABSENT:  # runs with drawn orders only: the published runs of before keep their document
        out["comparisons"] = compared
        out["order"] = TABLES["order"].build(run)
    return out


def verdict(run: RunFiles) -> list[str]:
    """One sentence per model: shared KV's makespan against prefix-aware routing and recomputation,
    and the idle-engine probe (one trace per policy: no interval)."""
    run = RunFiles.of(run)
    policies, _, _ = tables(run)
    probes = {r["model"]: r for r in probe_rows(run)}
    out = []
    compared = TABLES["comparisons"].build(run)
    for model in run.params.models[:2]:
        mine = {t["policy"]: t for t in policies if t["model"] == model}
        s, a, r = mine.get("shared"), mine.get("prefix_aware"), mine.get("recompute")
        if not (s and a and s["makespan_ms"] and a["makespan_ms"]):
            out.append(f"{model}: no verdict (shared or prefix-aware did not finish a trace).")
            continue
        if compared is not ABSENT:  # repeats in a drawn order: the verdict is the paired interval's
            lead = [t for t in compared if t["model"] == model and (t["a"], t["b"]) == ("shared", "prefix_aware")]
            out.append(f"{model}: " + "; ".join(compare.phrase(t) for t in lead) + ".")
            continue
        # one trace per policy: a difference without an interval is no verdict (issue 42)
        num = s["repeats"]
        text = (f"Not resolved for {model}: {'one' if num == 1 else num} trace{'s' * (num != 1)} per policy, no "
                f"interval; with one LMCache server the engines finished the trace in "
                f"{s['makespan_ms'] / 1e3:.1f} s, against {a['makespan_ms'] / 1e3:.1f} s with prefix-aware routing "
                f"({_ratio(s['makespan_ms'], a['makespan_ms'])})"
                + (f" and {r['makespan_ms'] / 1e3:.1f} s recomputing" if r and r["makespan_ms"] else ""))
        p = probes.get(model)
        if p and p.get("restore_ttft_ms") and p.get("recompute_ttft_ms"):
            text += (f"; an idle engine restores the context in {p['restore_ttft_ms']:.0f} ms against "
                     f"{p['recompute_ttft_ms']:,.0f} ms recomputing")
        out.append(text + ".")
    return out


def findings(run: RunFiles) -> list[dict]:
    """Per model and policy: makespan, children's first token, recomputed tokens, load balance."""
    run = RunFiles.of(run)
    policies, _, _ = tables(run)
    models = run.params.models[:2]
    rows = [{"model": t["model"], "policy": t["policy"].replace("_", " "),
             "makespan": f"{t['makespan_ms'] / 1e3:.1f} s" if t["makespan_ms"] else None,
             "child first token": f"{t['child_ttft_ms']:,.0f} ms" if t.get("child_ttft_ms") is not None else None,
             "first token p90": f"{t['ttft_p90_ms']:,.0f} ms" if t.get("ttft_p90_ms") is not None else None,
             "recomputed tokens": t["recomputed_tokens"],
             "busiest engine / mean": f"{t['load_imbalance']:.2f}" if t.get("load_imbalance") is not None else None,
             "requests ok": f"{t['ok']}/{t['requests']}"}
            for model in models for p in ORDER for t in policies if t["model"] == model and t["policy"] == p]
    return rows[:10]
