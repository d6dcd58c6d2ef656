"""Section 20's checks and counts, computed from ``raw/groups.jsonl``, ``raw/blocks.jsonl`` and the params.

    - every planned engine run (PATHS x GROUP_SIZES x ENGINE_RUNS; GPUBUF_ENGINE_RUNS for the GPU buffer)
      finished ok, and every recorded group belongs to one (a crashed run's partial groups are not results);
    - every arm has MEASURED_GROUPS measured groups; none had a tier error or an unplaced control;
      every follow-up produced MAX_TOKENS tokens; every early group has a readiness record;
    - every prepared group (ready early, dram, buffer, engine) read the context from the disk tier
      exactly once (to within half a chunk), and so did every on-arrival group with the singleflight
      on (MP) or on the GPU buffer; a group with no disk count is no evidence (skipped);
    - the independent byte counters agree (MP: to the byte); on MP launcher servers the lookup trace's
      load bytes equal the hook's, its contended keys LMCache's ``l1_contended`` chunks, and with the
      singleflight on no overlapping lookup loaded or was refused; every further singleflight
      setting ran CONTRAST_GROUPS on-arrival groups (MP, run 0);
    - a group in which a follow-up recomputed the context is recorded ``recomputed`` (it leaves the
      paired tables); the confirmation used the pilot's shortest all-ready lead;
    - listeners on 127.0.0.1 only and nothing left behind (skipped where unrecorded);
    - every table results.json states is recomputed from raw/ and compared; intervals only when the
      run names the resampling this code uses (``stats.BOOTSTRAP``), since another gives others.

The strict statement "every follow-up found the shared context cached", over every group of every
arm and phase (on-arrival included), is a measurement (``measured_lines``, and a count in ``counts``):
on the MP path concurrent on-arrival lookups can leave a follow-up without the context.
"""
from __future__ import annotations

from kmesh_lib.base.checks import Check, all_of, check
from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections.prefetch import stats as ps
from kmesh_lib.workloads.context_checks import (
    NOT_AVAILABLE,
    cleaned_up,
    every,
    figures_match,
    listeners_local,
    runs_finished,
    topology_rows,
)

EARLY = ("early", "early_fixed")
CI_KEYS = ("95% CI", "above floor 95% CI")




def groups_of(run: RunFiles) -> list[dict]:
    """The run's groups, each with its status (``recomputed`` derived for runs recorded before it existed)."""
    return ps.classify(run.raw("groups.jsonl"), run.params.get("BLOCK_SIZE"))


RUN_ORDER = {"mp": 0, "mp-striped": 1, "inproc": 2, "native": 3, "gpubuf": 4}
# paths whose lookups of a load in flight wait for it by design (the GPU buffer's index; vLLM's tiers answer
# HIT_PENDING for a block being promoted), so an on-arrival group reads the context once without a singleflight
READS_ONCE_PATHS = ("gpubuf", "native")


def engine_runs(params: dict, path: str) -> int:
    """Fresh engine runs of ``path``'s confirmation (GPUBUF_ENGINE_RUNS for the GPU buffer, where set)."""
    if path == "gpubuf" and params.get("GPUBUF_ENGINE_RUNS"):
        return params["GPUBUF_ENGINE_RUNS"]
    return params.get("ENGINE_RUNS") or 0


def plan_runs(params: dict) -> list[tuple[str, int, int]]:
    """(path, group size, run index) of every engine run, in run order: the MP paths first, the GPU
    buffer last (its CUDA code runs in its own engine runs, so a failure there cannot cost the others)."""
    return [(p, n, r) for p in sorted(params.get("PATHS") or [], key=lambda x: RUN_ORDER.get(x, 9))
            for n in params.get("GROUP_SIZES") or [] for r in range(engine_runs(params, p))]


def planned_runs(params: dict, blocks: list[dict]) -> list[str]:
    unavailable = {b.get("path") for b in blocks if b.get("status") == NOT_AVAILABLE}
    return [f"{p}-N{n}-r{r}" for p, n, r in plan_runs(params) if p not in unavailable]


def pairs_per_run(params: dict) -> int:
    return -(-(params.get("MEASURED_GROUPS") or 1) // (params.get("ENGINE_RUNS") or 1))


def confirmation_leads(blocks: list[dict]) -> dict[str, float]:
    return {f"{b['path']} N={b['group_size']}": b["lead_ms"] for b in blocks if b.get("lead_ms") is not None}


def checks(run) -> list[Check]:
    run = RunFiles.of(run)
    params, raw_groups, blocks = run.params, run.raw("groups.jsonl"), run.raw("blocks.jsonl")
    groups = ps.classify(raw_groups, params.get("BLOCK_SIZE"))
    measured = [g for g in groups if g.get("measured")]
    pilot = [g for g in groups if g.get("phase") == "pilot"]
    finished = {b.get("block") for b in blocks if b.get("status") == "ok"}
    out = [check("groups recorded in raw/groups.jsonl", True, f"{len(groups)} groups", groups,
                 missing="raw/groups.jsonl is missing or empty"),
           runs_finished("every planned engine run finished ok", blocks, planned_runs(params, blocks)),
           all_of("every group belongs to an engine run that finished ok", groups, lambda g: g["block"] in finished,
                  lambda g: f"{g['block']} pair {g['pair']}", missing="no groups")]
    for path, n in ps.cases(groups):
        out.append(_arm_counts(path, n, measured, params))
        if path in ("mp", "mp-striped") and len(params.get("SINGLEFLIGHT") or []) > 1 and params.get("CONTRAST_GROUPS"):
            out.append(_contrast(path, n, groups, params))
    out += [
        all_of("no measured group had a tier error or an unplaced control", measured,
               lambda g: g["status"] in ("ok", "recomputed"), lambda g: f"{g['block']} pair {g['pair']} {g['arm']}: "
                                                                        f"{g['status']} {g.get('detail', '')}"),
        all_of("every follow-up produced its MAX_TOKENS tokens", measured + pilot + [g for g in groups
                                                                                  if g.get("phase") == "contrast"],
               lambda g: all(x == params.get("MAX_TOKENS") for x in g["num_output_tokens"]),
               lambda g: f"{g['block']} pair {g['pair']} {g['arm']}: {g['num_output_tokens']}"),
        all_of("every early group has a readiness record", [g for g in groups if g.get("arm") in EARLY],
               lambda g: bool(g.get("readiness")) and g.get("ready") is not None, lambda g: f"{g['block']} pair {g['pair']}"),
        _read_once(groups, params),
        *([_arrival_once(groups, params)] if _reads_once_on_arrival(params) else []),
        every("the independent byte counters agree in every group (MP: to the byte)",
              [g for g in groups if g.get("measured") or g.get("phase") in ("pilot", "contrast")],
              lambda g: len(_counters(g)) >= 2,
              lambda g: max(_counters(g).values()) - min(_counters(g).values()) <= _tolerance(g, params),
              lambda g: f"{g['block']} pair {g['pair']} {g['arm']}: {_counters(g)}"),
        *(_trace(groups, params) if _mp_launcher(params) else []),
        all_of("every group in which a follow-up recomputed the context is recorded as recomputed (out of the paired "
               "tables)", raw_groups, lambda g: not (g.get("status") == "ok" and ps.recomputed(g, params.get("BLOCK_SIZE"))),
               lambda g: f"{g['block']} pair {g['pair']} {g['arm']}: cached {g['num_cached_tokens']}, status ok")]
    for path, n in ps.cases(pilot):
        out += _lead(path, n, groups, params)
    out += [listeners_local(blocks), cleaned_up(blocks)]
    return out + figure_checks(run.readable_results, groups, blocks, params)


def _arm_counts(path: str, n: int, measured: list[dict], params: dict) -> Check:
    mine = [g for g in measured if g["path"] == path and g["group_size"] == n]
    leads = {g["lead_ms"] for g in mine if g["arm"] == "early"}
    arms = ["on_arrival", "early"] + (["early_fixed"] if leads and leads != {params.get("FIXED_LEAD_MS")} else []) + \
        [ps.placement_arm(path, c) for c in params.get("CONTROLS") or []]
    want = min(params.get("MEASURED_GROUPS", 1), pairs_per_run(params) * engine_runs(params, path))
    got = {arm: sum(g["arm"] == arm for g in mine) for arm in arms}
    return Check(f"{path} N={n}: at least MEASURED_GROUPS measured groups in every arm"
                 + ("" if want == params.get("MEASURED_GROUPS", 1) else f" (scaled: {want}, GPUBUF_ENGINE_RUNS)"),
                 all(v >= want for v in got.values()), f"want {want}: {got}")


def _contrast(path: str, n: int, groups: list[dict], params: dict) -> Check:
    """Run 0 of an MP path ran CONTRAST_GROUPS on-arrival groups under every further singleflight setting."""
    settings = [bool(x) for x in (params.get("SINGLEFLIGHT") or [False])[1:]]
    mine = [g for g in groups if g["path"] == path and g["group_size"] == n and g.get("phase") == "contrast"]
    got = {("on" if sf else "off"): sum(g.get("singleflight") == sf for g in mine) for sf in settings}
    want = params.get("CONTRAST_GROUPS", 0)
    return Check(f"{path} N={n}: CONTRAST_GROUPS on-arrival groups under every further singleflight setting",
                 all(v >= want for v in got.values()), f"want {want}: {got}")


def _half_chunk(g: dict, params: dict) -> int:
    chunk = params.get("CHUNK_SIZE")
    return g["context_bytes"] * chunk // g["context_tokens"] // 2 if chunk else 0


def _arrival_once(groups: list[dict], params: dict) -> Check:
    """Issue 12's precondition for the on-arrival arm: one read per group where nothing rereads."""
    gs = [g for g in groups if g.get("arm") == "on_arrival" and (g.get("measured") or g.get("phase") == "contrast")
          and g.get("status") in ("ok", "recomputed") and (g.get("singleflight") is True or g.get("path") in READS_ONCE_PATHS)]
    # the name published runs carry, widened only where vLLM's own tiers ran (``kmesh verify`` matches by name)
    where = ", on the GPU buffer or on vLLM's own tiers" if "native" in (params.get("PATHS") or []) else " or on the GPU buffer"
    return every(f"every on-arrival group with the singleflight on (MP){where} read the context from the "
                 "disk tier exactly once", gs, lambda g: g.get("disk_bytes") is not None,
                 lambda g: abs(g["disk_bytes"] - g["context_bytes"]) <= _half_chunk(g, params),
                 lambda g: f"{g['block']} pair {g['pair']}: {g['disk_bytes'] / g['context_bytes']:.2f} contexts",
                 missing=f"no on-arrival group ran with the singleflight on{where}")


def _counters(g: dict) -> dict[str, int]:
    r = g.get("reads") or {}
    return {k: r[f"{k}_bytes"] for k in ("device", "hook", "metric") if r.get(f"{k}_bytes") is not None}


def _tolerance(g: dict, params: dict) -> int:
    recorded = (g.get("reads") or {}).get("tolerance_bytes")
    half = _half_chunk(g, params)
    return half if recorded is None else min(int(recorded), half)


def _mp_launcher(params: dict) -> bool:
    """The run has MP paths on kmesh's launcher server (a stock server keeps no lookup trace)."""
    return bool(set(params.get("PATHS") or []) & {"mp", "mp-striped"}) and params.get("LMCACHE_SERVER") != "stock"


def _reads_once_on_arrival(params: dict) -> bool:
    """Some on-arrival groups are to read the context once: MP with the singleflight on, the GPU buffer, vLLM's tiers."""
    paths = set(params.get("PATHS") or [])
    return (bool(paths & {"mp", "mp-striped"} and True in (params.get("SINGLEFLIGHT") or []))
            or bool(paths & set(READS_ONCE_PATHS)))


def _trace(groups: list[dict], params: dict) -> list[Check]:
    """MP launcher servers: the lookup trace against the byte hook and LMCache's own counts."""
    traced = [g for g in groups if "lookup_summary" in g and (g.get("measured") or g.get("phase") in ("pilot", "contrast"))]
    phases = lambda g: [g["lookup_summary"]] + ([g["placement_lookup_summary"]] if "placement_lookup_summary" in g else [])
    by = lambda g: g["lookup_summary"]["by_mechanism"]
    out = [every("every traced group: the lookups' load bytes equal the byte hook's", traced,
                 lambda g: (g.get("reads") or {}).get("hook_bytes") is not None,
                 lambda g: sum(p["load_bytes"] for p in phases(g)) == g["reads"]["hook_bytes"],
                 lambda g: f"{g['block']} pair {g['pair']} {g['arm']}: {sum(p['load_bytes'] for p in phases(g))} vs "
                           f"{g['reads']['hook_bytes']}", missing="no group with a lookup trace"),
           every("every traced group: the trace's contended keys equal LMCache's l1_contended chunks", traced,
                 lambda g: g.get("reads") is not None,
                 lambda g: sum(p["contended_keys"] for p in phases(g)) == g["reads"]["contended_chunks"],
                 lambda g: f"{g['block']} pair {g['pair']} {g['arm']}: {sum(p['contended_keys'] for p in phases(g))} vs "
                           f"{g['reads']['contended_chunks']}", missing="no group with a lookup trace"),
           ]
    if True in (params.get("SINGLEFLIGHT") or []):
        out.append(every("with the singleflight on, no lookup loaded or was refused while an overlapping load was in "
                         "flight", [g for g in traced if g.get("singleflight") is True], lambda g: True,
                         lambda g: not (by(g).get("concurrent_load") or by(g).get("contended_in_flight")),
                         lambda g: f"{g['block']} pair {g['pair']} {g['arm']}: {by(g)}",
                         missing="no traced group ran with the singleflight on"))
    return out


def _read_once(groups: list[dict], params: dict) -> Check:
    """Prepared groups read the context once: the prefetch or warm-up loaded it, the follow-ups found it."""
    prepared = [g for g in groups if (g.get("phase") == "pilot" or g.get("measured"))
                and (g["arm"] in ("dram", "buffer", "engine") or g.get("ready"))]

    def once(g) -> bool:
        return abs(g["disk_bytes"] - g["context_bytes"]) <= _half_chunk(g, params)

    return every("every prepared group (ready early, dram, buffer, engine) read the context from the disk tier exactly once",
                 prepared, lambda g: g.get("disk_bytes") is not None, once,
                 lambda g: f"{g['block']} pair {g['pair']} {g['arm']}: {g['disk_bytes'] / g['context_bytes']:.2f} contexts",
                 missing="no prepared group")


def _lead(path: str, n: int, groups: list[dict], params: dict) -> list[Check]:
    mine = [g for g in groups if g.get("path") == path and g.get("group_size") == n]
    pilot = [g for g in mine if g.get("phase") == "pilot"]
    leads = [float(x) for x in params.get("LEADS_MS") or sorted({g["lead_ms"] for g in pilot})]
    per_lead = {lead: sum(g["lead_ms"] == round(lead, 3) for g in pilot) for lead in leads}
    chosen = ps.choose_lead(pilot, leads)
    used = {g["lead_ms"] for g in mine if g.get("arm") == "early" and g.get("phase") != "pilot"}
    return [Check(f"{path} N={n}: every pilot lead ran PILOT_GROUPS groups",
                  all(v == params.get("PILOT_GROUPS") for v in per_lead.values()), f"{per_lead}"),
            check(f"{path} N={n}: the confirmation used the pilot's shortest all-ready lead", used == {chosen},
                  f"chosen {chosen} ms, used {sorted(used)}", used, missing="no confirmation groups")]


def _strip_intervals(rows):
    if isinstance(rows, list):
        return [{k: v for k, v in r.items() if not any(k.endswith(c) for c in CI_KEYS)} for r in rows]
    return rows


def figure_checks(results: dict, groups: list[dict], blocks: list[dict], params: dict) -> list[Check]:
    """Every table results.json states, recomputed from raw/ (an edited figure or raw line fails)."""
    resamples, seed = params.get("BOOTSTRAP_RESAMPLES", 10000), params.get("SEED", 0)
    same_resampling = (results.get("bootstrap") or {}).get("method") == ps.BOOTSTRAP
    recorded = results if same_resampling else {k: _strip_intervals(v) for k, v in results.items()}
    out = [Check("results intervals recomputed with the run's own resampling", "ok" if same_resampling else "skipped",
                 ps.BOOTSTRAP if same_resampling else
                 "the run names no resampling or another one: its means are compared, its intervals are not")]
    tables = {
        "all_cases": lambda: ps.all_cases(groups, resamples, seed),
        "all_cases_with_recomputed": lambda: ps.all_cases(groups, resamples, seed, with_recomputed=True),
        "placement": lambda: ps.placement(groups, resamples, seed),
        "example_4": lambda: ps.example(groups, sorted({g["path"] for g in groups})[0], 4) if groups else {},
        "pilot_readiness": lambda: ps.pilot_table(groups),
        "disk_reads": lambda: ps.disk_reads(groups),
        "driver_overhead": lambda: ps.overhead(groups),
        "recomputed_groups": lambda: ps.recomputed_groups(groups),
        "singleflight": lambda: ps.singleflight_table(groups),
        "restore_split": lambda: ps.restore_rows(groups),
        "topology": lambda: topology_rows(blocks),
        "lead_sweep": lambda: ps.lead_sweep(groups),
        "confirmation_lead_ms": lambda: confirmation_leads(blocks),
    }
    for name, recompute in tables.items():
        stated = recorded.get(name)
        fresh = None if stated is None else recompute() if same_resampling else _strip_intervals(recompute())
        out.append(figures_match(f"results {name} recomputed from raw/ matches", stated, fresh))
    return out


def measured_lines(run) -> list[str]:
    """The strict statement, over every group of every arm and phase, reported as a measurement."""
    groups = groups_of(RunFiles.of(run))
    ran = [g for g in groups if g.get("phase") == "pilot" or g.get("measured")]
    bad = [g for g in ran if g.get("status") == "recomputed"]
    line = (f"every follow-up found the shared context cached, in every arm (on-arrival included): in "
            f"{len(ran) - len(bad)} of {len(ran)} groups")
    if bad:
        line += "; recomputed in " + ", ".join(f"{g['block']} pair {g['pair']} {g['arm']} ({g.get('phase')})"
                                               for g in bad[:5]) + (" ..." if len(bad) > 5 else "")
    out = [line] if ran else []
    for row in ps.singleflight_table(groups):  # on arrival, per singleflight setting (the contrast included)
        if row["singleflight"] != "n/a":
            out.append(f"{row['path']} N={row['group_size']} on arrival, singleflight {row['singleflight']} "
                       f"({row['phase']}): every follow-up found the context cached in "
                       f"{row['groups'] - row['groups in which a follow-up recomputed']} of {row['groups']} groups; "
                       f"{row['context reads/group (mean)']} context reads per group; lookups: {row['mechanisms']}")
    return out


def counts(run) -> dict[str, int | str]:
    """Deterministic facts the smoke golden pins: record counts, bytes and cached tokens.

    Left out on purpose: the chosen lead, readiness, the on-arrival groups' disk reads on the MP
    path (concurrent lookups) and every latency: they depend on timing.
    """
    run = RunFiles.of(run)
    groups, blocks = groups_of(run), run.raw("blocks.jsonl")
    ran = [g for g in groups if g.get("phase") == "pilot" or g.get("measured")]
    out: dict[str, int | str] = {
        "engine runs ok": sum(b.get("status") == "ok" for b in blocks),
        "groups in which a follow-up recomputed the shared context (every arm)": sum(
            g.get("status") == "recomputed" for g in ran)}
    for path, n in ps.cases(groups):
        mine = [g for g in groups if g["path"] == path and g["group_size"] == n]
        out[f"{path} N={n}: pilot groups"] = sum(g.get("phase") == "pilot" for g in mine)
        if any(g.get("phase") == "contrast" for g in mine):
            out[f"{path} N={n}: singleflight contrast groups"] = sum(g.get("phase") == "contrast" for g in mine)
        for arm in ("on_arrival", "early", "dram", "buffer", "engine"):
            if any(g["arm"] == arm for g in mine):
                out[f"{path} N={n} {arm}: measured groups"] = sum(g["arm"] == arm and g.get("measured") for g in mine)
        placed = [g for g in mine if g.get("measured") and g["arm"] in ("dram", "buffer", "engine")]
        if placed:
            out[f"{path} N={n} placement controls: disk bytes per group"] = _one(g["disk_bytes"] for g in placed)
        once = [g for g in mine if g.get("measured") and g["arm"] == "on_arrival"
                and (g.get("singleflight") is True or path in READS_ONCE_PATHS)]
        if once:
            label = "vLLM's tiers" if path == "native" else "singleflight on or GPU buffer"
            out[f"{path} N={n} on_arrival ({label}): disk bytes per group"] = _one(
                g["disk_bytes"] for g in once)
        ok = [g for g in mine if g.get("measured") and g.get("status") == "ok"]
        if ok:
            out[f"{path} N={n}: fewest cached tokens of a follow-up (groups ok)"] = min(min(g["num_cached_tokens"])
                                                                                      for g in ok)
    return out


def _one(values) -> int | str:
    distinct = sorted(set(values), key=str)
    return distinct[0] if len(distinct) == 1 else ", ".join(map(str, distinct))
