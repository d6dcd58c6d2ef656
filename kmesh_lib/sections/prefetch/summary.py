"""Section 20 for people: the headline figures, the closing answer, and what the section publishes.

All three are computed from the run's raw records with the same functions the checks compare with
results.json. The savings are given without the groups in which a follow-up recomputed the context
(the paired tables) and, where there were any, with them, so the difference is visible.
"""
from __future__ import annotations

from kmesh_lib.base.declared import ABSENT
from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections.prefetch import readiness
from kmesh_lib.sections.prefetch import stats as ps
from kmesh_lib.sections.prefetch.captures import PrefetchEngineRun
from kmesh_lib.sections.prefetch.checks import measured_lines
from kmesh_lib.sections.prefetch.params import PAPER, scaled
from kmesh_lib.sections.prefetch.tables import TABLES, bootstrap, confirmation_leads, groups_of
from kmesh_lib.workloads.context_params import MP_PATHS


def _tables(run):
    params = run.params
    groups = groups_of(run)
    resamples, seed = params.BOOTSTRAP_RESAMPLES, params.SEED
    rows = {(r["path"], r["group_size"], r["comparison"]): r for r in ps.all_cases(groups, resamples, seed)}
    with_ = {(r["path"], r["group_size"], r["comparison"]): r
             for r in ps.all_cases(groups, resamples, seed, with_recomputed=True)}
    return params, groups, rows, with_


def _saving(row: dict, label: str) -> str:
    lo, hi = row[f"{label} 95% CI ms"]
    return f"{row[f'{label} saving ms']:.1f} ms [{lo:.1f}, {hi:.1f}]"


def headline(run) -> dict[str, str]:
    run = RunFiles.of(run)
    params, groups, rows, with_ = _tables(run)
    out = {}
    for (path, n, comparison), row in rows.items():
        if comparison != "on_arrival - early":
            continue
        text = f"{_saving(row, 'A first token')} at lead {row.get('lead_ms')} ms, ready {row['ready']}"
        w = with_.get((path, n, comparison))
        if w and w["pairs"] != row["pairs"]:
            text += f" ({w['A first token saving ms']:.1f} ms with the {w['pairs'] - row['pairs']} recomputing pair(s))"
        out[f"{path} N={n}: early saves on A's first token"] = text
        out[f"{path} N={n}: early saves on all done"] = _saving(row, "all done")
    reads = {(r["path"], r["group_size"], r["arm"]): r for r in ps.disk_reads(groups)}
    for path, n in sorted({(p, n) for p, n, _ in reads}):
        arms = [(label, reads[(path, n, arm)]) for arm, label in (("on_arrival", "on arrival"), ("early", "early"))
                if (path, n, arm) in reads]
        out[f"{path} N={n}: context reads per group (the lookups that read)"] = "; ".join(
            f"{label} {r['context reads/group (mean)']:.2f} ({r['reads by lookup']})" for label, r in arms)
    recomputing = [g for g in groups if g.status == "recomputed"]
    contrast = sum(g.phase == "contrast" for g in recomputing)  # singleflight off: a refused concurrent load recomputes
    out["groups in which a follow-up recomputed the context"] = str(len(recomputing)) + (
        f" ({'all' if contrast == len(recomputing) else contrast} of them singleflight-off contrast groups, outside "
        "the paired tables)" if contrast else "")
    for (path, n), rows_ in _lead_rows(run).items():  # runs with LEAD_RULE only (the published runs before keep theirs)
        c = next((r for r in rows_ if r["chosen"]), None)
        if c is not None and c["confirm_groups"]:
            out[f"{path} N={n}: chosen lead, ready at T"] = (
                f"{c['lead_ms']:g} ms ({c['rule']}); pilot {c['pilot_ready']}/{c['pilot_groups']} (lower bound "
                f"{c['ready_lower_bound']:.1%}); confirmation {c['confirm_ready']}/{c['confirm_groups']} "
                f"[{c['confirm_ready_low']:.1%}, {c['confirm_ready_high']:.1%}]")
    return out


def _lead_rows(run) -> dict[tuple, list[dict]]:
    built = TABLES["lead_choice"].build(run)
    out: dict[tuple, list[dict]] = {}
    for r in [] if built is ABSENT else built:
        out.setdefault((r["path"], r["group_size"]), []).append(r)
    return out


def lead_text(rows: list[dict]) -> str:
    """Which lead was chosen and why (each pilot lead's readiness and bound), and the chosen lead's ready-at-T."""
    c = next((r for r in rows if r["chosen"]), None)
    if c is None:
        return ""
    pilot = ", ".join(f"{r['lead_ms']:g} ms {r['pilot_ready']}/{r['pilot_groups']} (bound {r['ready_lower_bound']:.1%})"
                      for r in rows)
    runs = f" over {c['pilot_engine_runs']} engine runs" if c["pilot_engine_runs"] > 1 else ""
    if c["rule"] == "lower_bound":
        why = (f"the shortest whose pilot readiness has a one-sided 95 % Clopper-Pearson lower bound of at least "
               f"{readiness.READY_FLOOR:.0%}" if c["qualifies"] else
               f"the longest: no lead's one-sided 95 % lower bound reached {readiness.READY_FLOOR:.0%}")
    else:
        why = ("the shortest at which every pilot group was ready" if c["qualifies"] else
               "the longest: no lead had every group ready")
    text = f" The lead, {c['lead_ms']:g} ms, is {why} (pilot ready{runs}: {pilot})."
    if c["confirm_groups"]:
        text += (f" In the confirmation {c['confirm_ready']} of {c['confirm_groups']} early groups were ready at T "
                 f"({c['confirm_ready'] / c['confirm_groups']:.1%}, 95 % interval [{c['confirm_ready_low']:.1%}, "
                 f"{c['confirm_ready_high']:.1%}]).")
    return text


def answer(run) -> str:
    """The closing paragraph: does early preparation help here, from this run's own numbers."""
    run = RunFiles.of(run)
    params, groups, rows, with_ = _tables(run)
    main = [(k, r) for k, r in rows.items() if k[2] == "on_arrival - early"]
    if not main:
        return ("**No answer from this run:** no path and group size has paired on-arrival and early groups "
                "(see the checks).")
    place = {(r["path"], r["group_size"], r["arm"]): r for r in ps.placement(groups, params.BOOTSTRAP_RESAMPLES,
                                                                               params.SEED)}
    reads = {(r["path"], r["group_size"], r["arm"]): r for r in ps.disk_reads(groups)}
    contrast: dict[tuple, list[dict]] = {}
    for row in ps.singleflight_table(groups):
        if "contrast" in row["phase"]:
            contrast.setdefault((row["path"], row["group_size"]), []).append(row)
    parts = []
    leads = _lead_rows(run)
    for (path, n, _), r in main:
        lo, hi = r["A first token 95% CI ms"]
        verdict = "**helps**" if lo > 0 else ("**costs time**" if hi < 0 else "**shows no clear saving**")
        text = (f"On the {path} path with groups of {n}, preparing the context {r.get('lead_ms')} ms early {verdict}: "
                f"A's first token {r['A first token on_arrival ms']:.1f} -> {r['A first token early ms']:.1f} ms "
                f"(saving {_saving(r, 'A first token')} over {_pairs(r)}), every follow-up done "
                f"{_saving(r, 'all done')} sooner; {r['ready']} early groups were ready at T.")
        text += lead_text(leads.get((path, n), []))
        above = place.get((path, n, "early"))
        if above and "A first token above resident ms" in above:
            alo, ahi = above["A first token above resident 95% CI"]
            text += (f" Early ends {above['A first token above resident ms']:.1f} ms [{alo:.1f}, {ahi:.1f}] above "
                     "the resident arm (the context already in vLLM's KV).")
        arrival, early = reads.get((path, n, "on_arrival")), reads.get((path, n, "early"))
        per_group = {arm: row["context reads/group (mean)"] for arm, row in (("on arrival", arrival), ("early", early))
                     if row}
        if per_group and all(v <= 1.01 for v in per_group.values()):
            text += (" Both arms read the context once per group ("
                     + ", ".join(f"{arm} {v:.2f}" for arm, v in per_group.items())
                     + ("" if not arrival or arrival["singleflight"] == "n/a"
                        else f"; singleflight {arrival['singleflight']}") + ").")
        elif per_group:
            text += (" **Repeat reads are not gone here**: the arms read the context "
                     + ", ".join(f"{v:.2f} times per group {arm}" for arm, v in per_group.items())
                     + (" (on arrival: concurrent lookups)" if arrival and per_group["on arrival"] > 1.01 else "")
                     + (" (early: its preparation read the context again before T)" if early and per_group["early"] > 1.01
                        else "") + ".")
        traced = {arm: row["lookups"] for arm, row in (("on arrival", arrival), ("early", early))
                  if row and row.get("lookups", "no lookup trace") != "no lookup trace"}
        if traced:
            text += " Lookups, from the server's trace: " + "; ".join(f"{arm}: {m}" for arm, m in traced.items()) + "."
        if early and per_group.get("early", 0) > 1.01 and early["reads by lookup"] != "no lookup trace":
            text += f" The early arm's disk reads, by lookup: {early['reads by lookup']}."
        if "reread_after_store_drop" in traced.get("early", ""):
            text += (" reread_after_store_drop: LMCache 0.5.3 handed the warm prefetch's keys to its store "
                     "controller as new writes, which stored them again (the disk tier had them: nothing written) "
                     "and, under skip_l1, deleted them from L1 before the warm-up's lookup locked them.")
        for row in contrast.get((path, n), []):
            text += (f" With the singleflight {row['singleflight']} ({row['groups']} on-arrival groups) they read it "
                     f"{row['context reads/group (mean)']:.2f} times per group and {row['follow-ups that recomputed']} "
                     f"follow-up(s) recomputed it ({row['mechanisms']}); A's first token {row['A first token ms (mean)']:.1f} "
                     "ms.")
        split = {r["arm"]: r for r in ps.restore_rows(groups) if r["path"] == path and r["group_size"] == n
                 and r["kind"] == "restore"}
        if split.get("on_arrival") and split.get("early"):
            a, e = split["on_arrival"], split["early"]
            text += (f" The GPU buffer's restore after T: on arrival {a['restore ms']} ms from the {a['source']} (disk read "
                     f"{a['disk_read ms']}, staging {a['staging ms']}, copy {a['copy ms']} ms), early {e['restore ms']} ms "
                     f"from the {e['source']} (copy {e['copy ms']} ms).")
        w = with_.get((path, n, "on_arrival - early"))
        if w and w["pairs"] != r["pairs"]:
            text += (f" With the {w['pairs'] - r['pairs']} pair(s) in which a follow-up recomputed the context, the "
                     f"saving would read {_saving(w, 'A first token')}.")
        parts.append(text)
    guard = guard_note(run.records("blocks.jsonl"))
    if guard:
        parts.append(guard)
    weak = []
    below = scaled(params)
    gpubuf_runs = below.pop("GPUBUF_ENGINE_RUNS", None)
    if gpubuf_runs is not None:
        weak.append(f"The GPU-buffer rows are scaled to {gpubuf_runs} "
                    "engine run(s) per group size (GPUBUF_ENGINE_RUNS), so their intervals are wider than the MP rows'.")
    if below:
        weak.append(f"This run is scaled ({', '.join(f'{k}={v}' for k, v in below.items())}; the paper values are "
                    f"{', '.join(f'{k}={v}' for k, v in PAPER.items())}), so its intervals are wide.")
    if "inproc" in {p for (p, _, _), _ in main}:
        weak.append("On the in-process path the early arm is the one-token warm-up alone (LMCacheConnectorV1 has no "
                    "application prefetch API).")
    if "native" in {p for (p, _, _), _ in main}:
        weak.append("On vLLM's own tiers the early arm is the one-token warm-up alone (vLLM has no prefetch call; the "
                    "warm-up's lookup promotes the context from its filesystem tier).")
    weak += [f"Measured, not assumed: {line}." for line in measured_lines(run)]
    return " ".join(parts) + ("\n\n" + " ".join(weak) if weak else "")


def guard_note(blocks: list[PrefetchEngineRun]) -> str:
    """The warm-store guard in the run's MP engine runs: its setting and whether the server installed it
    (``lmcache_server.hooks``); empty for runs recorded before the guard existed."""
    servers = [b.lmcache_server for b in blocks if b.path in MP_PATHS
               and isinstance(b.lmcache_server, dict) and "warm_store_guard" in b.lmcache_server]
    if not servers:
        return ""
    settings = sorted({"on" if s["warm_store_guard"] else "off" for s in servers})
    reports = [(s.get("hooks") or {}).get("warm_store_guard") or {} for s in servers]
    installed = sum(bool(r.get("installed")) for r in reports)
    text = f"The warm-store guard was {'/'.join(settings)} in the {len(servers)} MP engine run(s)"
    if installed == len(servers):
        return text + " and installed in every server (its LMCache has PrefetchMode.WARM)."
    details = sorted({r.get("detail", "no install report") for r in reports if not r.get("installed")})
    return text + f"; installed in {installed} of {len(servers)} servers (not installed: {'; '.join(details)})."


def _numbers(row: dict) -> dict:
    """A table row with only numbers, short labels and lists of numbers."""
    return {k: v for k, v in row.items() if v is None or isinstance(v, (int, float, str))
            or (isinstance(v, list) and all(isinstance(x, (int, float)) or x is None for x in v))}


def public_results(run) -> dict:
    """The aggregates section 20 publishes: an allow-list of numbers, counts, short labels and hashes."""
    run = RunFiles.of(run)
    params, groups, rows, with_ = _tables(run)
    resamples, seed = params.BOOTSTRAP_RESAMPLES, params.SEED
    out = {
        "bootstrap": bootstrap(params),
        "confirmation_lead_ms": confirmation_leads(run.records("blocks.jsonl")),
        "all_cases": [_numbers(r) for r in rows.values()],
        "all_cases_with_recomputed": [_numbers(r) for r in with_.values()],
        "placement": [_numbers(r) for r in ps.placement(groups, resamples, seed)],
        "pilot_readiness": [_numbers(r) for r in ps.pilot_table(groups)],
        "disk_reads": [_numbers(r) for r in ps.disk_reads(groups)],
        "singleflight": [_numbers(r) for r in ps.singleflight_table(groups)],
        "restore_split": [_numbers(r) for r in ps.restore_rows(groups)],
        "recomputed_groups": [_numbers(r) for r in ps.recomputed_groups(groups)],
        "groups_recorded": len(groups),
        "raw_sha256": {name: run.raw_sha256(name) for name in run.raw_names()},
    }
    lead_choice = TABLES["lead_choice"].build(run)
    if lead_choice is not ABSENT:  # runs with LEAD_RULE only: the published runs before keep their document
        out["lead_choice"] = lead_choice
    return out


def _ci(row: dict, label: str) -> str:
    lo, hi = row[f"{label} 95% CI ms"]
    return f"{row[f'{label} saving ms']:.1f} ms (95% CI {lo:.1f} to {hi:.1f})"


def _pairs(row: dict) -> str:
    """How many pairs an interval stands on, and from how many engine runs where it resampled them run by run
    (``stats.paired_saving``): "200 pairs in 10 engine runs". A row recorded before the count says pairs alone."""
    runs = row.get("engine_runs")
    text = f"{row['pairs']} pair{'s' * (row['pairs'] != 1)}"
    return text + (f" in {runs} engine runs, resampled by run" if runs and runs >= ps.MIN_CLUSTERS else "")


def _case(row: dict) -> str:
    return f"{row['path']} N={row['group_size']}"


def verdict(run) -> list[str]:
    """One sentence: where preparing early saves time on A's first token, with the saving and its 95% CI."""
    run = RunFiles.of(run)
    _, _, rows, _ = _tables(run)
    main = [r for k, r in rows.items() if k[2] == "on_arrival - early"]
    if not main:
        return ["No verdict: no path and group size has paired on-arrival and early groups."]
    reads = {(r["path"], r["group_size"], r["arm"]): r["context reads/group (mean)"]
             for r in ps.disk_reads(groups_of(run))}
    once = all(v <= 1.01 for v in reads.values())
    helps = [r for r in main if r["A first token 95% CI ms"][0] > 0]
    unclear = [r for r in main if r not in helps]
    name = ", ".join
    if helps:
        best = min(helps, key=lambda r: r["A first token saving ms"])
        text = (f"Yes on {name(_case(r) for r in helps)}" + (" (each group reads the context once in both arms)"
                                                              if once and reads else "") + ": loading the context "
                + f"{best['lead_ms']:.0f} ms early saves {_ci(best, 'A first token')} on A's first token, the mean "
                "of the paired differences "
                + (f"(the smallest of {len(helps)} savings; " if len(helps) > 1 else "(") + _pairs(best) + ")")
    else:
        text = "No clear saving on any path"
    if unclear:
        text += ("; no clear saving on " if helps else ": ") + name(
            f"{_case(r)} ({_ci(r, 'A first token')})" for r in unclear)
    return [text + "."]


def findings(run) -> list[dict]:
    """Per path and group size: the paired savings on A's first token and on all done, with 95% CIs."""
    run = RunFiles.of(run)
    _, groups, rows, _ = _tables(run)
    reads = {(r["path"], r["group_size"], r["arm"]): r["context reads/group (mean)"] for r in ps.disk_reads(groups)}
    out = []
    for (path, n, comparison), r in rows.items():
        if comparison != "on_arrival - early":
            continue
        out.append({"path": path, "group": n, "lead": f"{r['lead_ms']:.0f} ms",
                    "A's first token, on arrival → early": f"{r['A first token on_arrival ms']:.1f} → "
                                                          f"{r['A first token early ms']:.1f} ms",
                    "saving (95% CI)": _ci(r, "A first token"), "all done saving (95% CI)": _ci(r, "all done"),
                    "context reads/group, on arrival / early": " / ".join(
                        f"{reads[(path, n, arm)]:.2f}" if (path, n, arm) in reads else "–" for arm in ("on_arrival", "early")),
                    "pairs": r["pairs"]})
    return out[:10]
