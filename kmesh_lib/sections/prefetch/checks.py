"""Section 20's checks and counts, computed from ``raw/groups.jsonl``, ``raw/blocks.jsonl`` and the params
(read once, as ``PrefetchParams``: each parameter's one default).

    - every engine run that finished ok recorded the groups its plan gives (``groups_recorded``);
    - every planned engine run (PATHS x GROUP_SIZES x ENGINE_RUNS; GPUBUF_ENGINE_RUNS for the GPU buffer)
      finished ok, and every recorded group belongs to one (a crashed run's partial groups are not results);
    - every arm has MEASURED_GROUPS measured groups; none had a tier error or an unplaced control;
      every follow-up produced MAX_TOKENS tokens; every early group has a readiness record;
    - every prepared group (ready early, dram, buffer, resident) read the context from the disk tier
      exactly once (to within half a chunk), and so did every on-arrival group with the singleflight
      on (MP) or on the GPU buffer; a group with no disk count is no evidence (skipped);
    - the independent byte counters agree (MP: to the byte); on MP launcher servers the lookup trace's
      load bytes equal the hook's, its contended keys LMCache's ``l1_contended`` chunks, and with the
      singleflight on no overlapping lookup loaded or was refused; every further singleflight
      setting ran CONTRAST_GROUPS on-arrival groups (MP, run 0);
    - a group in which a follow-up recomputed the context is recorded ``recomputed`` (it leaves the
      paired tables); the confirmation used the pilot's shortest all-ready lead;
    - listeners on 127.0.0.1 only and nothing left behind (skipped where unrecorded);
    - every table results.json states is built again from raw/ by the declared ``TABLES`` and compared,
      intervals included (recomputed with the run's own BOOTSTRAP_RESAMPLES and SEED); a run whose results
      name another resampling fails the resampling check and its interval tables, never skips them.

The strict statement "every follow-up found the shared context cached", over every group of every
arm and phase (on-arrival included), is a measurement (``measured_lines``, and a count in ``counts``):
on the MP path concurrent on-arrival lookups can leave a follow-up without the context.
"""
from __future__ import annotations

from kmesh_lib.base.checks import Check, all_of, check
from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections.prefetch import stats as ps
from kmesh_lib.sections.prefetch.captures import PrefetchEngineRun, PrefetchGroup
from kmesh_lib.sections.prefetch.params import PrefetchParams
from kmesh_lib.sections.prefetch.protocol import confirm_arms
from kmesh_lib.sections.prefetch.tables import TABLES, groups_of
from kmesh_lib.workloads.context_checks import (
    NOT_AVAILABLE,
    cleaned_up,
    every,
    figures_match,
    listeners_local,
    runs_finished,
)
from kmesh_lib.workloads.context_params import MP_PATHS

EARLY = ("early", "early_fixed")

RUN_ORDER = {"mp": 0, "mp-striped": 1, "inproc": 2, "native": 3, "gpubuf": 4}
# paths whose lookups of a load in flight wait for it by design (the GPU buffer's index; vLLM's tiers answer
# HIT_PENDING for a block being promoted), so an on-arrival group reads the context once without a singleflight
READS_ONCE_PATHS = ("gpubuf", "native")


def plan_runs(cfg: PrefetchParams) -> list[tuple[str, int, int]]:
    """(path, group size, run index) of every engine run, in run order: the MP paths first, the GPU
    buffer last (its CUDA code runs in its own engine runs, so a failure there cannot cost the others)."""
    return [(p, n, r) for p in sorted(cfg.PATHS, key=lambda x: RUN_ORDER.get(x, 9))
            for n in cfg.GROUP_SIZES for r in range(cfg.pilot_only_runs + cfg.engine_runs(p))]


def planned_runs(cfg: PrefetchParams, blocks: list[PrefetchEngineRun]) -> list[str]:
    unavailable = {b.path for b in blocks if b.status == NOT_AVAILABLE}
    return [f"{p}-N{n}-r{r}" for p, n, r in plan_runs(cfg) if p not in unavailable]


def groups_recorded(cfg: PrefetchParams, groups: list[PrefetchGroup], blocks: list[PrefetchEngineRun]) -> Check:
    """Every engine run that finished ok recorded the groups its plan gives (``protocol.run_engine``): WARMUP_PAIRS
    + MEASURED_GROUPS / ENGINE_RUNS pairs of the arms its lead gives (``confirm_arms``), and, in the one run of its
    path and group size that chose the lead, PILOT_GROUPS groups per lead in LEADS_MS and (MP) CONTRAST_GROUPS
    on-arrival groups per further SINGLEFLIGHT setting; nothing else. With a single lead in LEADS_MS the lead may be
    given instead of chosen (the live panel's runs: ``live.live_params``), so no run need have run the pilot. A run
    the params do not plan fails; a summary without its lead is no evidence."""
    planned = set(planned_runs(cfg, blocks))
    finished = [b for b in blocks if b.status == "ok"]
    if cfg.pilot_only_runs:
        return _groups_recorded_pilot_runs(cfg, groups, finished, planned)
    pilot_runs: dict[tuple, list[str]] = {}
    for b in finished:
        if any(g.engine_run == b.engine_run and g.phase == "pilot" for g in groups):
            pilot_runs.setdefault((b.path, b.group_size), []).append(b.engine_run)

    def found(b) -> dict:
        mine = [g for g in groups if g.engine_run == b.engine_run]
        phases = {phase: sum(g.phase == phase for g in mine) for phase in sorted({g.phase for g in mine},
                                                                                      key=str)}
        return {**phases, "pilot runs of its path and group size": len(pilot_runs.get((b.path, b.group_size), []))}

    def want(b) -> dict:
        pairs = {"warmup": cfg.WARMUP_PAIRS, "confirm": cfg.pairs_per_run}
        arms = len(confirm_arms(cfg, b.lead_ms, b.path))
        out = {phase: n * arms for phase, n in pairs.items()}
        if b.engine_run in pilot_runs.get((b.path, b.group_size), []):
            out["pilot"] = len(cfg.LEADS_MS) * cfg.PILOT_GROUPS
            if b.path in MP_PATHS:
                out["contrast"] = cfg.CONTRAST_GROUPS * (len(cfg.SINGLEFLIGHT) - 1)
        return {**{k: v for k, v in sorted(out.items()) if v}, "pilot runs of its path and group size": pilots}

    pilots = "1" if len(cfg.LEADS_MS) > 1 else "0 or 1"

    def holds(b) -> bool:
        key = "pilot runs of its path and group size"
        got, planned_groups = found(b), want(b)
        return (b.engine_run in planned and str(got[key]) in pilots.split(" or ")
                and {k: v for k, v in got.items() if k != key} == {k: v for k, v in planned_groups.items() if k != key})

    def describe(b) -> str:
        if b.engine_run not in planned:
            return f"{b.engine_run}: not an engine run the params plan ({', '.join(sorted(planned)) or 'none'})"
        return f"{b.engine_run}: recorded {found(b)}, the plan gives {want(b)}"

    return every("groups recorded in raw/groups.jsonl", finished, lambda b: b.lead_ms is not None, holds,
                 describe, missing="no engine run finished ok")


def checks(run) -> list[Check]:
    run = RunFiles.of(run)
    cfg, raw_groups, blocks = run.params, run.records("groups.jsonl"), run.records("blocks.jsonl")
    groups = ps.classify(raw_groups)
    measured = [g for g in groups if g.measured]
    pilot = [g for g in groups if g.phase == "pilot"]
    finished = {b.engine_run for b in blocks if b.status == "ok"}
    out = [groups_recorded(cfg, groups, blocks),
           runs_finished("every planned engine run finished ok", blocks, planned_runs(cfg, blocks)),
           all_of("every group belongs to an engine run that finished ok", groups, lambda g: g.engine_run in finished,
                  lambda g: f"{g.engine_run} pair {g.pair}", missing="no groups")]
    for path, n in ps.cases(groups):
        out.append(_arm_counts(path, n, measured, cfg))
        if path in MP_PATHS and len(cfg.SINGLEFLIGHT) > 1 and cfg.CONTRAST_GROUPS:
            out.append(_contrast(path, n, groups, cfg))
    out += [
        all_of("no measured group had a tier error or an unplaced control", measured,
               lambda g: g.status in ("ok", "recomputed"), lambda g: f"{g.engine_run} pair {g.pair} {g.arm}: "
                                                                        f"{g.status} {g.detail}"),
        all_of("every follow-up produced its MAX_TOKENS tokens", measured + pilot + [g for g in groups
                                                                                  if g.phase == "contrast"],
               lambda g: all(x == cfg.MAX_TOKENS for x in g.num_output_tokens),
               lambda g: f"{g.engine_run} pair {g.pair} {g.arm}: {g.num_output_tokens}"),
        all_of("every early group has a readiness record", [g for g in groups if g.arm in EARLY],
               lambda g: bool(g.readiness) and g.ready is not None, lambda g: f"{g.engine_run} pair {g.pair}"),
        _read_once(groups, cfg),
        *([_arrival_once(groups, cfg)] if _reads_once_on_arrival(cfg) else []),
        every("the independent byte counters agree in every group (MP: to the byte)",
              [g for g in groups if g.measured or g.phase in ("pilot", "contrast")],
              lambda g: len(_counters(g)) >= 2,
              lambda g: max(_counters(g).values()) - min(_counters(g).values()) <= _tolerance(g, cfg),
              lambda g: f"{g.engine_run} pair {g.pair} {g.arm}: {_counters(g)}"),
        *(_trace(groups, cfg) if _mp_launcher(cfg) else []),
        all_of("every group in which a follow-up recomputed the context is recorded as recomputed (out of the paired "
               "tables)", raw_groups, lambda g: not (g.status == "ok" and ps.recomputed(g)),
               lambda g: f"{g.engine_run} pair {g.pair} {g.arm}: cached {g.num_cached_tokens}, status ok")]
    for path, n in ps.cases(pilot):
        out += _lead(path, n, groups, cfg)
    out += [listeners_local(blocks), cleaned_up(blocks)]
    return out + figure_checks(run)


def _arm_counts(path: str, n: int, measured: list[PrefetchGroup], cfg: PrefetchParams) -> Check:
    mine = [g for g in measured if g.path == path and g.group_size == n]
    leads = {g.lead_ms for g in mine if g.arm == "early"}
    arms = ["on_arrival", "early"] + (["early_fixed"] if leads and leads != {cfg.FIXED_LEAD_MS} else []) + \
        [ps.placement_arm(path, c) for c in cfg.CONTROLS]
    want = min(cfg.MEASURED_GROUPS, cfg.pairs_per_run * cfg.engine_runs(path))
    got = {arm: sum(g.arm == arm for g in mine) for arm in arms}
    return Check(f"{path} N={n}: at least MEASURED_GROUPS measured groups in every arm"
                 + ("" if want == cfg.MEASURED_GROUPS else f" (scaled: {want}, GPUBUF_ENGINE_RUNS)"),
                 all(v >= want for v in got.values()), f"want {want}: {got}")


def _contrast(path: str, n: int, groups: list[PrefetchGroup], cfg: PrefetchParams) -> Check:
    """Run 0 of an MP path ran CONTRAST_GROUPS on-arrival groups under every further singleflight setting."""
    settings = [bool(x) for x in cfg.SINGLEFLIGHT[1:]]
    mine = [g for g in groups if g.path == path and g.group_size == n and g.phase == "contrast"]
    got = {("on" if sf else "off"): sum(g.singleflight == sf for g in mine) for sf in settings}
    want = cfg.CONTRAST_GROUPS
    return Check(f"{path} N={n}: CONTRAST_GROUPS on-arrival groups under every further singleflight setting",
                 all(v >= want for v in got.values()), f"want {want}: {got}")


def _half_chunk(g: PrefetchGroup, cfg: PrefetchParams) -> int:
    return g.context_bytes * cfg.CHUNK_SIZE // g.context_tokens // 2


def _arrival_once(groups: list[PrefetchGroup], cfg: PrefetchParams) -> Check:
    """Issue 12's precondition for the on-arrival arm: one read per group where nothing rereads."""
    gs = [g for g in groups if g.arm == "on_arrival" and (g.measured or g.phase == "contrast")
          and g.status in ("ok", "recomputed") and (g.singleflight is True or g.path in READS_ONCE_PATHS)]
    # the name published runs carry, widened only where vLLM's own tiers ran (``kmesh verify`` matches by name)
    where = ", on the GPU buffer or on vLLM's own tiers" if "native" in cfg.PATHS else " or on the GPU buffer"
    return every(f"every on-arrival group with the singleflight on (MP){where} read the context from the "
                 "disk tier exactly once", gs, lambda g: g.disk_bytes is not None,
                 lambda g: abs(g.disk_bytes - g.context_bytes) <= _half_chunk(g, cfg),
                 lambda g: f"{g.engine_run} pair {g.pair}: {g.disk_bytes / g.context_bytes:.2f} contexts",
                 missing=f"no on-arrival group ran with the singleflight on{where}")


def _counters(g: PrefetchGroup) -> dict[str, int]:
    r = g.reads or {}
    return {k: r[f"{k}_bytes"] for k in ("device", "hook", "metric") if r.get(f"{k}_bytes") is not None}


def _tolerance(g: PrefetchGroup, cfg: PrefetchParams) -> int:
    recorded = (g.reads or {}).get("tolerance_bytes")
    half = _half_chunk(g, cfg)
    return half if recorded is None else min(int(recorded), half)


def _mp_launcher(cfg: PrefetchParams) -> bool:
    """The run has MP paths on kmesh's launcher server (a stock server keeps no lookup trace)."""
    return bool(set(cfg.PATHS) & set(MP_PATHS)) and cfg.LMCACHE_SERVER != "stock"


def _reads_once_on_arrival(cfg: PrefetchParams) -> bool:
    """Some on-arrival groups are to read the context once: MP with the singleflight on, the GPU buffer, vLLM's tiers."""
    paths = set(cfg.PATHS)
    return (bool(paths & set(MP_PATHS) and True in cfg.SINGLEFLIGHT)
            or bool(paths & set(READS_ONCE_PATHS)))


def _trace(groups: list[PrefetchGroup], cfg: PrefetchParams) -> list[Check]:
    """MP launcher servers: the lookup trace against the byte hook and LMCache's own counts."""
    traced = [g for g in groups if g.lookup_summary is not None and (g.measured or g.phase in ("pilot", "contrast"))]
    phases = lambda g: [g.lookup_summary] + ([g.placement_lookup_summary] if g.placement_lookup_summary is not None else [])
    by = lambda g: g.lookup_summary["by_mechanism"]
    out = [every("every traced group: the lookups' load bytes equal the byte hook's", traced,
                 lambda g: (g.reads or {}).get("hook_bytes") is not None,
                 lambda g: sum(p["load_bytes"] for p in phases(g)) == g.reads["hook_bytes"],
                 lambda g: f"{g.engine_run} pair {g.pair} {g.arm}: {sum(p['load_bytes'] for p in phases(g))} vs "
                           f"{g.reads['hook_bytes']}", missing="no group with a lookup trace"),
           every("every traced group: the trace's contended keys equal LMCache's l1_contended chunks", traced,
                 lambda g: g.reads is not None,
                 lambda g: sum(p["contended_keys"] for p in phases(g)) == g.reads["contended_chunks"],
                 lambda g: f"{g.engine_run} pair {g.pair} {g.arm}: {sum(p['contended_keys'] for p in phases(g))} vs "
                           f"{g.reads['contended_chunks']}", missing="no group with a lookup trace"),
           ]
    if True in cfg.SINGLEFLIGHT:
        out.append(every("with the singleflight on, no lookup loaded or was refused while an overlapping load was in "
                         "flight", [g for g in traced if g.singleflight is True], lambda g: True,
                         lambda g: not (by(g).get("concurrent_load") or by(g).get("contended_in_flight")),
                         lambda g: f"{g.engine_run} pair {g.pair} {g.arm}: {by(g)}",
                         missing="no traced group ran with the singleflight on"))
    return out


def _read_once(groups: list[PrefetchGroup], cfg: PrefetchParams) -> Check:
    """Prepared groups read the context once: the prefetch or warm-up loaded it, the follow-ups found it."""
    prepared = [g for g in groups if (g.phase == "pilot" or g.measured)
                and (g.arm in ("dram", "buffer", "resident") or g.ready)]

    def once(g) -> bool:
        return abs(g.disk_bytes - g.context_bytes) <= _half_chunk(g, cfg)

    return every("every prepared group (ready early, dram, buffer, resident) read the context from the disk tier exactly once",
                 prepared, lambda g: g.disk_bytes is not None, once,
                 lambda g: f"{g.engine_run} pair {g.pair} {g.arm}: {g.disk_bytes / g.context_bytes:.2f} contexts",
                 missing="no prepared group")


def _groups_recorded_pilot_runs(cfg: PrefetchParams, groups: list[PrefetchGroup], finished: list[PrefetchEngineRun],
                                planned: set) -> Check:
    """LEAD_RULE=lower_bound: runs 0 .. PILOT_ENGINE_RUNS-1 of each path and group size recorded PILOT_GROUPS /
    PILOT_ENGINE_RUNS pilot groups per lead (and run 0, on MP, the contrast groups) and nothing else, without a lead;
    every later run WARMUP_PAIRS + MEASURED_GROUPS / ENGINE_RUNS pairs of the arms its lead gives, and no pilot."""
    def index(b) -> int:
        return int(b.engine_run.rsplit("-r", 1)[1])

    def found(b) -> dict:
        mine = [g for g in groups if g.engine_run == b.engine_run]
        return {phase: sum(g.phase == phase for g in mine) for phase in sorted({g.phase for g in mine}, key=str)}

    def want(b) -> dict:
        if index(b) < cfg.pilot_only_runs:
            out = {"pilot": len(cfg.LEADS_MS) * cfg.PILOT_GROUPS // cfg.PILOT_ENGINE_RUNS}
            if index(b) == 0 and b.path in MP_PATHS:
                out["contrast"] = cfg.CONTRAST_GROUPS * (len(cfg.SINGLEFLIGHT) - 1)
        else:
            arms = len(confirm_arms(cfg, b.lead_ms, b.path)) if b.lead_ms is not None else 0
            out = {"warmup": cfg.WARMUP_PAIRS * arms, "confirm": cfg.pairs_per_run * arms}
        return {k: v for k, v in sorted(out.items()) if v}

    def holds(b) -> bool:
        lead_ok = (b.lead_ms is None) if index(b) < cfg.pilot_only_runs else (b.lead_ms is not None)
        return b.engine_run in planned and lead_ok and found(b) == want(b)

    def describe(b) -> str:
        if b.engine_run not in planned:
            return f"{b.engine_run}: not an engine run the params plan ({', '.join(sorted(planned)) or 'none'})"
        return f"{b.engine_run}: recorded {found(b)} (lead {b.lead_ms}), the plan gives {want(b)}"

    return every("groups recorded in raw/groups.jsonl", finished, lambda b: True, holds, describe,
                 missing="no engine run finished ok")


LOWER_BOUND_RULE = "the shortest lead whose pilot readiness has a one-sided 95 % lower bound of at least 95 %"


def _lead(path: str, n: int, groups: list[PrefetchGroup], cfg: PrefetchParams) -> list[Check]:
    mine = [g for g in groups if g.path == path and g.group_size == n]
    pilot = [g for g in mine if g.phase == "pilot"]
    leads = [float(x) for x in cfg.LEADS_MS]
    per_lead = {lead: sum(g.lead_ms == round(lead, 3) for g in pilot) for lead in leads}
    chosen = ps.choose_lead(pilot, leads, cfg.LEAD_RULE)
    used = {g.lead_ms for g in mine if g.arm == "early" and g.phase != "pilot"}
    rule = "the pilot's shortest all-ready lead" if cfg.LEAD_RULE == "all_ready" else LOWER_BOUND_RULE
    out = [Check(f"{path} N={n}: every pilot lead ran PILOT_GROUPS groups",
                 all(v == cfg.PILOT_GROUPS for v in per_lead.values()), f"{per_lead}"),
           check(f"{path} N={n}: the confirmation used {rule}", used == {chosen},
                 f"chosen {chosen} ms, used {sorted(used)}", used, missing="no confirmation groups")]
    if cfg.pilot_only_runs:
        runs = {g.engine_run for g in pilot}
        out.append(check(f"{path} N={n}: the pilot ran over PILOT_ENGINE_RUNS={cfg.PILOT_ENGINE_RUNS} engine runs",
                         len(runs) == cfg.PILOT_ENGINE_RUNS, f"pilot groups from {sorted(runs)}", pilot,
                         missing="no pilot groups"))
    return out


# the tables the figure checks compare, by the names published runs record them under
FIGURE_TABLES = ("all_cases", "all_cases_with_recomputed", "placement", "example_4", "pilot_readiness", "disk_reads",
                 "driver_overhead", "recomputed_groups", "singleflight", "restore_split", "topology", "lead_sweep",
                 "confirmation_lead_ms")


def resampling_check(stated, built: dict) -> Check:
    """The resampling results.json names is the one the intervals are recomputed with (this code's method, the
    run's BOOTSTRAP_RESAMPLES and SEED). The intervals are compared either way: under another resampling they
    differ, and those tables fail with this check."""
    name = "results intervals recomputed with the run's own resampling"
    how = f"{built['method']}, {built['resamples']} resamples, seed {built['seed']}"
    if stated is None:
        return Check(name, "skipped", f"results.json names no resampling; its intervals are compared with {how}")
    if stated != built:
        return Check(name, "failed", f"results.json names {stated}; recomputed with {how}: its intervals cannot match")
    return Check(name, "ok", how)


def figure_checks(run: RunFiles) -> list[Check]:
    """Every table results.json states, built again from raw/ by the section's declared ``TABLES`` and compared,
    intervals included, by the one comparator (an edited figure or raw line fails). ``kmesh verify`` holds every
    declared table (``scaled``, ``bootstrap`` and ``engine_runs`` too) to the record the same way."""
    results = run.readable_results
    out = [resampling_check(results.get("bootstrap"), TABLES["bootstrap"].build(run))]
    for name in FIGURE_TABLES:
        stated = results.get(name)
        out.append(figures_match(f"results {name} recomputed from raw/ matches", stated,
                                 None if stated is None else TABLES[name].build(run)))
    return out


def measured_lines(run) -> list[str]:
    """The strict statement, over every group of every arm and phase, reported as a measurement."""
    groups = groups_of(RunFiles.of(run))
    ran = [g for g in groups if g.phase == "pilot" or g.measured]
    bad = [g for g in ran if g.status == "recomputed"]
    line = (f"every follow-up found the shared context cached, in every arm (on-arrival included): in "
            f"{len(ran) - len(bad)} of {len(ran)} groups")
    if bad:
        line += "; recomputed in " + ", ".join(f"{g.engine_run} pair {g.pair} {g.arm} ({g.phase})"
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
    groups, blocks = groups_of(run), run.records("blocks.jsonl")
    ran = [g for g in groups if g.phase == "pilot" or g.measured]
    out: dict[str, int | str] = {
        "engine runs ok": sum(b.status == "ok" for b in blocks),
        "groups in which a follow-up recomputed the shared context (every arm)": sum(
            g.status == "recomputed" for g in ran)}
    for path, n in ps.cases(groups):
        mine = [g for g in groups if g.path == path and g.group_size == n]
        out[f"{path} N={n}: pilot groups"] = sum(g.phase == "pilot" for g in mine)
        if any(g.phase == "contrast" for g in mine):
            out[f"{path} N={n}: singleflight contrast groups"] = sum(g.phase == "contrast" for g in mine)
        for arm in ("on_arrival", "early", "dram", "buffer", "resident"):
            if any(g.arm == arm for g in mine):
                out[f"{path} N={n} {arm}: measured groups"] = sum(g.arm == arm and g.measured for g in mine)
        placed = [g for g in mine if g.measured and g.arm in ("dram", "buffer", "resident")]
        if placed:
            out[f"{path} N={n} placement controls: disk bytes per group"] = _one(g.disk_bytes for g in placed)
        once = [g for g in mine if g.measured and g.arm == "on_arrival"
                and (g.singleflight is True or path in READS_ONCE_PATHS)]
        if once:
            label = "vLLM's tiers" if path == "native" else "singleflight on or GPU buffer"
            out[f"{path} N={n} on_arrival ({label}): disk bytes per group"] = _one(
                g.disk_bytes for g in once)
        ok = [g for g in mine if g.measured and g.status == "ok"]
        if ok:
            out[f"{path} N={n}: fewest cached tokens of a follow-up (groups ok)"] = min(min(g.num_cached_tokens)
                                                                                      for g in ok)
    return out


def _one(values) -> int | str:
    distinct = sorted(set(values), key=str)
    return distinct[0] if len(distinct) == 1 else ", ".join(map(str, distinct))
