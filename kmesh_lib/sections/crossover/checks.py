"""Section 21's statements about a run, recomputed from ``raw/`` and ``params.resolved.yaml``.

    raw/models.jsonl  one record per (model, tier) child process: status, KV bytes per token, connector
    raw/stores.jsonl  one record per (tier, model, context): bytes the tier wrote to its disk tier
    raw/rows.jsonl    one record per (model, context, arm, repeat): cached tokens per follow-up,
                      what the tier read from disk and held in memory, the stopwatches, the components;
                      GPU-buffer rows add their restores (and bytes left in the buffer), vLLM-CPU-tier
                      rows vLLM's own external-hit count

A row's expected cached tokens are recomputed from the parameters (0 for ``recompute``, the whole
context for every other arm), not read from the row. The tables results.json keeps are the section's
declared ``tables.TABLES``, each rebuilt from the rows (and raw/models.jsonl) and compared with the one
comparator (``base.checks.differences``). The physical floors are measured by the notebook and kept
only in results.json, so the floor-distance table is recomputed from the rows and the recorded
floors, and the floors themselves are recorded-only.

Every check is stated for every run: one whose evidence is missing (no GPU-buffer restore, a field a run
recorded before it existed does not hold) is skipped with the reason, never left out.
"""
from __future__ import annotations

from dataclasses import replace
from itertools import product

from kmesh_lib.base.checks import Check, all_of, check, differences
from kmesh_lib.base.declared import ABSENT, json_value
from kmesh_lib.base.public import MAX_STRING_CHARS
from kmesh_lib.base.records import RunFileError, RunFiles
from kmesh_lib.sections.crossover import gaps, report
from kmesh_lib.sections.crossover.arms import (
    GPUBUF_RESTORES,
    HANDOFF_ARMS,
    KIND,
    RESTORE_ARMS,
    STORED_TIERS,
    WAIT_AT_OF,
    tiers_of,
)
from kmesh_lib.sections.crossover.captures import NO_SPLIT, ChildSummary, GridRow, PairRow
from kmesh_lib.sections.crossover.gaps import NO_PAIRS_PLANNED, PAIRED_SINCE, predates_pairs
from kmesh_lib.sections.crossover.params import goal_judges
from kmesh_lib.sections.crossover.tables import TABLES, TITLES


def expected_cached(arm: str, context_tokens: int) -> int:
    """The arm's contract (``arms.RestoreBench.expected_cached``): recompute finds nothing, the others all."""
    return 0 if KIND[arm] == "recompute" else context_tokens


def measured_rows(run: RunFiles) -> list[GridRow]:
    return [r for r in run.records("rows.jsonl") if r.measured]


def kv_bytes(run: RunFiles) -> dict[str, int]:
    return {m.model: m.kv_bytes_per_token for m in run.records("models.jsonl")}


def all_followups(run: RunFiles) -> list:
    """Every follow-up the run measured: the grid's (raw/rows.jsonl) and the paired design's (raw/pairs.jsonl, where
    the run has it), warm-ups included: the evidence of the checks that hold every restore to its copy and its KV."""
    return run.records("rows.jsonl") + (run.records("pairs.jsonl") if run.has_raw("pairs.jsonl") else [])


def checks(run: RunFiles) -> list[Check]:
    """Section 21's checks: the grid ran whole, every follow-up found the context where its arm put
    it, and every table in results.json is what the rows give."""
    p = run.params
    models, grid, arm_names = p.MODELS, p.CONTEXT_TOKENS_GRID, p.ARMS
    children, stores, rows = run.records("models.jsonl"), run.records("stores.jsonl"), run.records("rows.jsonl")
    measured = [r for r in rows if r.measured]
    kvt = kv_bytes(run)
    no_rows = "raw/rows.jsonl holds no measured rows"
    tiers = tiers_of(arm_names)
    single = tiers == ["lmcache"]  # a run of LMCache's arms alone: its records name models only
    name = (lambda m: m.model) if single else (lambda m: f"{m.model} {m.tier}")
    out = [check("every model's child finished ok" if single else "every (model, tier) child finished ok",
                 sorted((m.model, m.tier) for m in children if m.status == "ok")
                 == sorted(product(models, tiers)),
                 "; ".join(f"{name(m)}: {m.status}" + (f" ({m.detail[:80]})" if m.detail else "")
                           for m in children), children, "raw/models.jsonl is missing or empty")]
    want_stores = set(product([t for t in tiers if t in STORED_TIERS], models, grid))
    stored = {(s.tier, s.model, s.context_tokens): s for s in stores}
    out.append(all_of("every context was stored whole on the disk tier" + ("" if single else " of each tier that has one"),
                      sorted(want_stores),
                      lambda k: k in stored and not stored[k].write_errors
                      and stored[k].bytes_written >= k[2] * kvt.get(k[1], float("inf")),
                      lambda k: f"{k[1:] if single else k}: {stored[k].as_recorded() if k in stored else None}",
                      "no model or context to store"))
    out.append(all_of("every row's context bytes are its context tokens x the model's KV bytes per token", rows,
                      lambda r: r.kv_bytes_per_token == kvt.get(r.model)
                      and r.context_bytes == r.context_tokens * r.kv_bytes_per_token,
                      lambda r: r.tag, "raw/rows.jsonl is missing or empty"))
    repeats = range(p.WARMUP_REPEATS, p.WARMUP_REPEATS + p.NUM_REPEATS)
    keys = [(r.model, r.context_tokens, r.arm, r.repeat) for r in measured]
    want = set(product(models, grid, arm_names, repeats))
    out.append(check("every (model, context, arm, repeat) was measured exactly once",
                     set(keys) == want and len(keys) == len(want),
                     f"{len(keys)} measured rows, {len(want)} wanted; missing {sorted(want - set(keys))[:3]}",
                     measured, no_rows))
    out.append(order_check(rows))
    out.append(all_of("warm-up repeats are recorded as not measured", [r for r in rows if r.repeat < p.WARMUP_REPEATS],
                      lambda r: not r.measured, lambda r: r.tag,
                      "no warm-up repeats" if p.WARMUP_REPEATS else "WARMUP_REPEATS=0: no warm-up rows"))
    for arm in arm_names:
        mine = [r for r in measured if r.arm == arm]
        what = "none" if KIND[arm] == "recompute" else "the whole context"
        out.append(all_of(f"{arm}: every measured follow-up hit {what} in cached tokens", mine,
                          lambda r: len(r.num_cached_tokens) == p.NUM_FOLLOWUPS
                          and all(c == expected_cached(r.arm, r.context_tokens) for c in r.num_cached_tokens),
                          lambda r: f"{r.tag}: {r.num_cached_tokens}", f"no measured {arm} rows"))
    out.append(all_of("a row's status is ok exactly when every follow-up hit its expected cached tokens", rows,
                      lambda r: (r.status == "ok") == all(c == expected_cached(r.arm, r.context_tokens)
                                                             for c in r.num_cached_tokens),
                      lambda r: f"{r.tag}: {r.status}, {r.num_cached_tokens}", "raw/rows.jsonl is missing or empty"))
    by_arm = {arm: [r for r in measured if r.arm == arm] for arm in ("recompute", "dram", "disk", "resident")}
    if "dram" in arm_names:
        out.append(all_of("dram: the context was in LMCache's memory tier before every follow-up", by_arm["dram"],
                          lambda r: (r.memory_tier_bytes or 0) >= r.context_bytes,
                          lambda r: f"{r.tag}: {r.memory_tier_bytes} of {r.context_bytes} bytes", "no dram rows"))
    if "disk" in arm_names:
        out.append(all_of("disk: LMCache's memory tier was empty before every follow-up", by_arm["disk"],
                          lambda r: r.memory_tier_bytes == 0,
                          lambda r: f"{r.tag}: {r.memory_tier_bytes} bytes in memory", "no disk rows"))
        out.append(all_of("disk: every follow-up read the context from the disk tier", by_arm["disk"],
                          lambda r: (r.disk_read_bytes or 0) >= r.context_bytes,
                          lambda r: f"{r.tag}: read {r.disk_read_bytes} of {r.context_bytes} bytes", "no disk rows"))
    if "lmcache_mp" in arm_names:
        out.append(all_of("lmcache_mp: the context was in the LMCache server's memory tier (L1) before every follow-up",
                          [r for r in measured if r.arm == "lmcache_mp"],
                          lambda r: (r.memory_tier_bytes or 0) >= r.context_bytes,
                          lambda r: f"{r.tag}: {r.memory_tier_bytes} of {r.context_bytes} bytes",
                          "no lmcache_mp rows"))
    disk_arms = [a for a in arm_names if KIND[a] == "disk"]
    others = [r for r in measured if KIND[r.arm] != "disk"]
    out.append(all_of(f"{memory_arms_named(arm_names, disk_arms)}{NO_DISK_READ}", others,
                      lambda r: r.disk_read_bytes == 0, lambda r: f"{r.tag}: {r.disk_read_bytes} bytes",
                      "no measured rows outside the disk arms"))
    out += tier_checks(measured, arm_names)
    out += launch_checks(measured, children)

    out += table_checks(run)
    crossover = TABLES["crossover"].build(run)
    restores = [a for a in arm_names if a in report.RESTORES]
    out.append(check("a crossover row per model and restore path",
                     sorted((r["model"], r["path"]) for r in crossover) == sorted(product(models, restores)),
                     f"{len(crossover)} rows for {len(models)} models x {len(restores)} paths", measured, no_rows))
    out.append(floor_check(run.results.get("floors") or {}, tiers))
    out += paired_checks(run)
    followups = all_followups(run)
    out.append(copied_context_check(followups, children))
    out.append(kv_digest_check(followups, children))
    return out


NO_DISK_READ = ": no follow-up read the disk tier"  # the check after the memory arms it names


def cached_per_arm(cached: dict[str, list[int]]) -> str:
    """Each arm's cached tokens (``arm 1024``, several values ``0/1024``), in the order the run planned its arms; past
    what a published record holds (base.public.MAX_STRING_CHARS: every tier's arms in one run, 304 characters in
    0248; b298's seven arms took 150) grouped by value, each value's arms named in that order but the largest
    group's, which closes the line as "every other arm" with its count."""
    each = ", ".join(f"{a} {'/'.join(map(str, v))}" for a, v in cached.items())
    if len(each) <= MAX_STRING_CHARS:
        return each
    by_value: dict[str, list[str]] = {}
    for arm, v in cached.items():
        by_value.setdefault("/".join(map(str, v)), []).append(arm)
    largest = max(by_value, key=lambda value: len(by_value[value]))
    named = [f"{value} {', '.join(arms)}" for value, arms in by_value.items() if value != largest]
    return "; ".join(named + [f"{largest} every other arm ({len(by_value[largest])})"])


def memory_arms_named(arm_names: list[str], disk_arms: list[str]) -> str:
    """The arms outside ``disk_arms``, one by one, as the ``NO_DISK_READ`` check names them; where that name would be
    longer than a published record holds (base.public.MAX_STRING_CHARS: every tier's arms in one run, 14 arms in 250
    characters in 0248; the runs of 1-6 Dec named theirs in at most 95), the disk arms they exclude and how many
    they are."""
    named = ", ".join(a for a in arm_names if a not in disk_arms)
    if len(named) + len(NO_DISK_READ) <= MAX_STRING_CHARS:
        return named
    return f"every arm but {', '.join(disk_arms) or 'none'} ({len(arm_names) - len(disk_arms)} arms)"


PAIRED_CHECKS = (
    "every (model, context, restore path) ran its planned restore/resident pairs, in alternating order",
    "every follow-up of a pair found the whole context (the restore in its tier, the resident one in vLLM's cache)",
    "every point of the paired design measured its floors before and after its pairs, each without an error",
    f"the restore span's 95% interval half-width is at most {report.RESOLVE_FRACTION:.0%} of its floor at every point "
    f"of {report.RESOLVE_MIN_TOKENS:,} tokens and more (DRAM, LMCache server, GPU buffer, vLLM's CPU tier)",
    "no restore span's 95% interval lies wholly below its floor's range (a floor that a restore beats is no floor)",
    "every memory restore path's count of pairs is its pilot's own (report.pair_plan of its first pairs against the "
    "floor before the point, as raw/pair_plans.jsonl records it)",
)
# only where a point measured a disk floor (``_pinned_floor_check``), as the disk arms' checks only where there are any
PINNED_FLOOR_CHECK = ("on CUDA every disk floor's sweep read the context into pinned memory as well, where LMCache's "
                      "own reads land")
# disk floors recorded before the sweep named where its reads landed (6 Dec 2026, 7a9fe1a: 0248's disk restores beat
# a floor read into ordinary pages, while LMCache reads into pinned memory)
DESTINATIONS_SINCE = ("this run's disk floors predate the pinned way (no sweep way records its destination: every way "
                      "read into ordinary pages)")
# runs recorded before the two-stage design (issue 42) have no raw/pair_plans.jsonl and no MAX_RESTORES
PLANS_SINCE = ("this run predates the two-stage design (raw/ holds no pair_plans.jsonl and the params no MAX_RESTORES: "
               "each point ran NUM_RESTORES pairs)")


# Why the floor check is skipped off CUDA: the "floor" there is a host memcpy timed in the engine's process beside
# its threads, not a device's transfer; in a fresh clone's CI (5 Dec, golden 21 beside golden 22 on 2 cores) it timed
# 256 KiB at 6.4 ms while the LMCache server's restore of the same context took 2.1-2.8 ms
NO_DEVICE_FLOOR = ("DEVICE is not cuda: the floors are a host memcpy timed beside the engine's threads, no physical "
                   "bound a restore must stay above")


def _resolution_detail(r: dict) -> str:
    """One point of ``report.resolution_table`` for the half-width check's detail: the half-width it judged against
    the floor, and the bootstrap's own where the restores' streaks widened it."""
    half, judged = r["span_half_width_ms"], r.get("span_half_width_serial_ms", r["span_half_width_ms"])
    if r["half_width_x_floor"] is not None:
        against = f"{judged} ms = {r['half_width_x_floor']} x floor {r['floor_ms']}"
    elif not r["floor_ms"]:
        against = f"{half} ms, no floor measured"
    else:
        against = f"unbounded (lag-1 autocorrelation {r.get('span_lag1')}) against floor {r['floor_ms']}"
    widened = f"; {half} ms as independent, widened for lag-1 autocorrelation {r['span_lag1']}" if judged != half else ""
    return f"{r['model']} {r['context_tokens']} {r['path']}: half-width {against} ({r['num_restores']} restores{widened})"


def paired_checks(run: RunFiles) -> list[Check]:
    """The paired design (``arms.RestoreBench.run_pairs``, ``experiment.point_floors``): left out, with the reason, in
    runs recorded before it (``gaps.predates_pairs``: no raw/pairs.jsonl, params that plan none); skipped in runs
    that planned no pairs (NUM_RESTORES=0). A run that planned pairs and measured none (every restore tier's child
    failed: no raw/pairs.jsonl) fails each check whose evidence is missing, naming the children's statuses
    (``gaps.missing_pairs``; their accounts are the restore_resolution table check's), never reads as predating
    the design."""
    p = run.params
    if predates_pairs(run):
        return [Check(name, "skipped", PAIRED_SINCE, predates=PAIRED_SINCE) for name in PAIRED_CHECKS]
    pairs, floors = run.records("pairs.jsonl"), run.records("point_floors.jsonl")
    plans = run.records("pair_plans.jsonl") if run.has_raw("pair_plans.jsonl") else []
    cfg_pairs = {a: (p.NUM_DISK_RESTORES if KIND[a] == "disk" else p.NUM_RESTORES) or 0
                 for a in p.ARMS if a in report.RESIDENT_OF}
    want = {(m, n, a): k for m in p.MODELS for n in p.CONTEXT_TOKENS_GRID for a, k in cfg_pairs.items() if k}
    planned_of = {(r.model, r.context_tokens, r.path): r for r in plans}
    # a point whose pilot recorded its count (``report.pair_plan``) ran that many; the others NUM_RESTORES (runs before
    # the two-stage design, disk paths). Whether each recorded count is the pilot's own is the last check's
    want.update({key: planned_of[key].num_pairs_planned for key in want if key in planned_of})
    got: dict[tuple, list[PairRow]] = {}
    for r in pairs:
        got.setdefault((r.model, r.context_tokens, r.pair_arm), []).append(r)
    # planned, none measured: each check's evidence is missing, which fails it (an empty list would skip it)
    children = "; ".join(f"{g['model']} {g['tier']} child: {g['child']}" for g in gaps.missing_pairs(run))
    unmeasured = f"the params plan {sum(want.values())} pairs and raw/pairs.jsonl holds none ({children})"

    def planned(name: str, needed: bool, records: list, *args) -> Check:
        """``all_of``, failed where the plan ``needed`` the evidence and no pair at all was measured."""
        return Check(name, "failed", unmeasured) if needed and not pairs else all_of(name, records, *args)

    def whole(key) -> bool:
        rs = got.get(key, [])
        by = sorted((r.pair, r.pair_position, r.role, r.arm) for r in rs)
        roles = [("restore", key[2]), ("resident", report.RESIDENT_OF[key[2]])]
        plan = [(k, i, role, arm) for k in range(want[key])
                for i, (role, arm) in enumerate(roles[::-1] if k % 2 else roles)]
        return by == sorted(plan)

    def child_of(model: str, tier: str) -> str:
        """Its child's status (``gaps.child``) where the child did not finish ok: why a point lacks its evidence."""
        summary = gaps.child(run, model, tier)
        status = summary.status if summary else "no summary"
        return "" if status == "ok" else f" (its child: {status})"

    out = [all_of(PAIRED_CHECKS[0], sorted(want), whole, lambda k: f"{k}: {len(got.get(k, []))} rows of {2 * want[k]}"
                  + ("" if got.get(k) else child_of(k[0], report.TIER_OF[k[2]])), NO_PAIRS_PLANNED)]
    out.append(planned(PAIRED_CHECKS[1], bool(want), pairs, lambda r: r.status == "ok" and all(
        c == r.context_tokens for c in r.num_cached_tokens), lambda r: f"{r.tag}: {r.num_cached_tokens}",
        "raw/pairs.jsonl is empty"))
    tier_of = report.TIER_OF
    points = sorted({(m, n, tier_of[a]) for m, n, a in want})
    measured = {}
    for f in floors:  # a measurement with a floor it could not take does not count
        if not f.errors:
            measured.setdefault((f.model, f.context_tokens, f.tier), set()).add(f.when)
    out.append(all_of(PAIRED_CHECKS[2], points, lambda k: measured.get(k) == {"before", "after"},
                      lambda k: f"{k}: {sorted(measured.get(k, []))}" + ("" if measured.get(k) else child_of(k[0], k[2])),
                      "no point planned pairs"))
    table = report.resolution_table(pairs, floors, bound=p.DEVICE == "cuda")
    judged = [r for r in table if goal_judges(r["path"], r["context_tokens"])]
    judged_planned = any(goal_judges(a, n) for _, n, a in want)
    out.append(planned(PAIRED_CHECKS[3], judged_planned, judged, lambda r: bool(r["resolved"]),
                       _resolution_detail,
                       f"no point of {report.RESOLVE_MIN_TOKENS:,} tokens and more on those paths "
                       "(the grid's contexts are shorter)"))
    if p.DEVICE != "cuda":  # the floor is a physical bound only where a device moves the bytes
        out.append(Check(PAIRED_CHECKS[4], "skipped", NO_DEVICE_FLOOR))
    else:
        floored = [r for r in table if r["floor_ms"] and r["span_ci_ms"][1] is not None]
        out.append(planned(PAIRED_CHECKS[4], bool(want), floored, lambda r: r["span_ci_ms"][1] >= r["floor_ms"][0],
                           lambda r: f"{r['model']} {r['context_tokens']} {r['path']}: span {r['span_ci_ms']} ms "
                                     f"below floor {r['floor_ms']} ms",
                           "no restore path had both a span and a floor measured"))
    pinned = _pinned_floor_check(floors, p.DEVICE == "cuda")
    if pinned is not None:  # a run that measured a disk floor (as the disk arms' checks, only where there is one)
        out.append(pinned)
    memory = any(KIND[a] == "memory" for _, _, a in want)
    if not plans and "MAX_RESTORES" not in getattr(run, "recorded_params", {}):
        out.append(Check(PAIRED_CHECKS[5], "skipped", PLANS_SINCE, predates=PLANS_SINCE))
    else:
        out.append(planned(PAIRED_CHECKS[5], memory, *plan_check_args(run, pairs, floors, planned_of)))
    return out


def _pinned_floor_check(floors: list, cuda: bool) -> Check | None:
    """``PINNED_FLOOR_CHECK``: every disk floor measured on CUDA swept the pinned way (``kv.floors``: a way pinning
    could not run goes to the record's ``not_swept`` with why, which fails here; a floor without it is no floor of
    LMCache's reads). None where no point measured a disk floor (a run without disk arms); skipped off CUDA (no
    pinned memory: the way is left out by design) and for records from before the sweep named its ways'
    destinations."""
    disk = [f for f in floors if (f.saturated or {}).get("disk")]
    if not disk:
        return None
    if not cuda:
        return Check(PINNED_FLOOR_CHECK, "skipped", "DEVICE is not cuda: no pinned memory, the way is left out by design")
    if not any("destination" in w for f in disk for w in f.saturated["disk"].get("sweep", [])):
        return Check(PINNED_FLOOR_CHECK, "skipped", DESTINATIONS_SINCE, predates=DESTINATIONS_SINCE)
    return all_of(PINNED_FLOOR_CHECK, disk,
                  lambda f: any(w.get("destination") == "pinned" for w in f.saturated["disk"].get("sweep", [])),
                  lambda f: f"{f.model} {f.context_tokens} {f.tier} {f.when}: "
                            + "; ".join(w.get("why", "?") for w in f.saturated["disk"].get("not_swept", []) or [{}]),
                  "no point measured a disk floor")


def plan_check_args(run: RunFiles, pairs: list[PairRow], floors: list, of: dict) -> tuple:
    """``all_of``'s arguments for the pilot check: every memory point with pairs measured, and every recorded plan, is
    held to ``report.pair_plan`` recomputed from raw/ (its first ``num_pilot`` pairs in raw/pairs.jsonl and the floor
    raw/point_floors.jsonl records before it), at the params' NUM_RESTORES and MAX_RESTORES: ok only where the record
    is there and is what the pilot gives; a point that ran pairs and recorded no plan fails.

    A recorded ``over_time`` (``experiment.stage_fits``: the second stage would not have fit CHILD_TIMEOUT_S, a
    decision on the child's clock that raw/ cannot recompute) passes only where the recomputed plan is ``extended``
    (a time cut is legitimate only where a stage was wanted), with every other field as recomputed, its
    num_pairs_planned the pilot's and the point's pairs exactly the pilot's (no stage ran). ``of``: the recorded
    plans (raw/pair_plans.jsonl) by (model, context, path)."""
    p = run.params
    measured = {(r.model, r.context_tokens, r.pair_arm) for r in pairs if KIND.get(r.pair_arm) == "memory"}
    keys = sorted(measured | set(of))
    bound = p.DEVICE == "cuda"

    def recomputed(key) -> dict | None:
        rec = of.get(key)
        if rec is None:
            return None
        model, n, path = key
        pilot = [r for r in pairs if (r.model, r.context_tokens, r.pair_arm) == key and r.pair < rec.num_pilot]
        before = [f for f in floors if (f.model, f.context_tokens, f.tier, f.when) == (model, n, report.TIER_OF[path],
                                                                                       "before")]
        return report.pair_plan(pilot, before, p.NUM_RESTORES, p.MAX_RESTORES, bound)

    def expected(key) -> dict | None:
        """The recomputed plan, cut for time where the record says so and a stage was wanted."""
        rec, want = of.get(key), recomputed(key)
        if rec is not None and rec.reason == "over_time" and want["reason"] == "extended":
            want = {**want, "reason": "over_time", "num_pairs_planned": want["num_pilot"]}
        return want

    def pairs_of(key) -> list[int]:
        return sorted(r.pair for r in pairs if (r.model, r.context_tokens, r.pair_arm) == key and r.role == "restore")

    def stage_ran(key) -> bool:
        """A time cut whose point's pairs are not exactly the pilot's."""
        rec = of[key]
        return rec.reason == "over_time" and pairs_of(key) != list(range(rec.num_pilot))

    def agrees(key) -> bool:
        rec, want = of.get(key), expected(key)
        return rec is not None and all(getattr(rec, k) == v for k, v in want.items()) and not stage_ran(key)

    def describe(key) -> str:
        rec, want = of.get(key), expected(key)
        if rec is None:
            return f"{key}: pairs measured, no plan recorded"
        differ = {k: (getattr(rec, k), v) for k, v in want.items() if getattr(rec, k) != v}
        ran = pairs_of(key)
        return f"{key}: recorded {rec.reason}, {rec.num_pairs_planned} pairs; " + ", ".join(
            [f"{k} {a} recorded, {b} from the pilot" for k, (a, b) in differ.items()]
            + ([f"{len(ran)} restores measured, the pilot's {rec.num_pilot} wanted"] if stage_ran(key) else []))

    return keys, agrees, describe, "no memory restore path's pairs were measured"


COPIED_CONTEXT_CHECK = ("every in-process LMCache restore copied the whole context into vLLM's blocks (load_bytes = the "
                        "context's bytes, from the rows)")
# runs recorded before the probe hooked LMCache's copy (6 Dec 2026: gpu-20261206-155000-bbf8 the last without it)
COPIES_SINCE = ("this run predates the copy hook (no row records components.load_bytes: the bytes LMCache's retrieve "
                "handed its GPU connector were not counted)")
COPIED_ARMS = ("dram", "disk")  # LMCache's restores on its own tier (the in-process path's, where it ran in-process)


def copied_whole(r) -> bool:
    """A counted in-process restore's copy call was handed the whole context and skipped none of it (``load_bytes`` the
    row's context bytes, ``load_tokens`` its tokens, no ``load_skipped_tokens``): ``copied_context_check``'s figure,
    and the answer's (``summary.copied_by_point``)."""
    c = r.components
    return c.load_bytes == r.context_bytes and c.load_tokens == r.context_tokens and c.load_skipped_tokens == 0


def copied_context_check(rows: list, children: list[ChildSummary]) -> Check:
    """``COPIED_CONTEXT_CHECK``: every in-process LMCache restore (of ``rows``, raw/rows.jsonl's and raw/pairs.jsonl's,
    warm-ups included: those of the arms ``COPIED_ARMS`` on the lmcache tier, path inproc) whose copy was counted
    handed its GPU connector the context and the copy skipped none of it: ``components.load_bytes == context_bytes``,
    ``components.load_tokens == context_tokens`` and ``components.load_skipped_tokens == 0`` exactly, against the
    figures the run recorded in the row (context_bytes: its tokens x the model's KV bytes per token, which another
    check holds to raw/models.jsonl).

    Why these are the figure: the in-process tier stores with save_unfull_chunk off (``lmcache.connect.InprocTier``),
    so a partial tail chunk is never stored and a context that were not whole chunks would copy its whole chunks alone
    (LMCache 0.5.6's engine on the CPU: 768 of 1,000 tokens, tests/test_crossover_copies.py), the stored tokens' bytes
    then the figure; the params make every context whole chunks (CONTEXT_TOKENS_GRID a multiple of CHUNK_SIZE), so the
    stored tokens are the context's. The restore runs into an emptied prefix cache (``RestoreBench.prepare``), so the
    copy should skip none of vLLM's tokens (``vllm_cached_tokens``: a token it skips is handed over, not copied).
    NUM_FOLLOWUPS is 1 in every run recorded so far: a run of more would have to restate the figure (the later
    follow-ups may find the first's blocks in vLLM's cache).

    Ok where every counted row holds and at least one was counted; a row recording 0 (its retrieve called no copy) or a
    part fails. Skipped where the run predates the hook (no row holds the field: ``COPIES_SINCE``, left out of
    ``kmesh verify``), where no restore ran in-process (LMCache's server copies on the MP path, the CPU build's only
    one), or where none was counted (the ``copy_hook`` of the child in ``children`` says why)."""
    if not any(r.components.holds("load_bytes") for r in rows):
        return Check(COPIED_CONTEXT_CHECK, "skipped", COPIES_SINCE, predates=COPIES_SINCE)
    restores = [r for r in rows if r.tier == "lmcache" and r.path == "inproc" and r.arm in COPIED_ARMS]
    if not restores:
        return Check(COPIED_CONTEXT_CHECK, "skipped", "no LMCache restore ran in-process (on the MP path its server "
                                                      "copies: no copy in the engine's process to count)")
    counted = [r for r in restores if r.components.load_bytes is not None]
    if not counted:
        hooks = sorted({m.copy_hook for m in children if m.tier == "lmcache" and m.copy_hook})
        return Check(COPIED_CONTEXT_CHECK, "skipped", f"no in-process restore's copy was counted ({len(restores)} "
                                                      f"restores): {'; '.join(hooks) or 'no child records why'}")
    return all_of(COPIED_CONTEXT_CHECK, counted, copied_whole,
                  lambda r: f"{r.tag}: copied {r.components.load_bytes} of {r.context_bytes} bytes, "
                            f"{r.components.load_tokens} of {r.context_tokens} tokens in {r.components.load_chunks} "
                            f"chunks, {r.components.load_skipped_tokens} of them held by vLLM")


KV_DIGEST_CHECK = ("every restore wrote the context's KV into vLLM's blocks as it was computed (their digest after the "
                   "follow-up = the store's)")
# its name where in-process LMCache restored (the path whose copy the digest was built to catch): the name every run
# with such restores has published since the digest's first (5750)
KV_DIGEST_CHECK_INPROC = KV_DIGEST_CHECK[:-1] + "; in-process LMCache's restores among them)"
# runs recorded before the bench digested the KV (6 Dec 2026: gpu-20261206-190103-861a the last without it)
DIGESTS_SINCE = ("this run predates the KV digest (no row records kv_digest_equal: vLLM's blocks after a restore were "
                 "not compared with the context as computed)")


def kv_digest_check(rows: list, children: list[ChildSummary]) -> Check:
    """``KV_DIGEST_CHECK``: every restore (of ``rows``, raw/rows.jsonl's and raw/pairs.jsonl's, warm-ups included)
    whose blocks were compared (``kv_digest_equal`` not None: ``arms.RestoreBench._kv_check``) wrote into vLLM's blocks
    the bytes the context was computed into when it was stored (``lmcache.probes.KvDigest``: per layer and block two
    exact sums of its words): an in-process LMCache restore whose copy wrote part of the KV, or another
    context's, holds other bytes there when its request finishes. (A copy that finished after its call returned does
    not show here: the digest is taken after the request.)

    A row whose compared blocks all held the same place in an earlier request of the context
    (``kv_digest_reused_tokens`` = ``kv_digest_tokens``) and matched is no evidence (the earlier KV may still be there)
    and is left out (from 7 Dec 2026 the bench zeroes vLLM's KV caches before every restore, ``kv_scrubbed``,
    ``KvDigest.scrub``: no block holds earlier KV, so every row is judged); one with a fresh block shows at least that
    block written; one that differs fails wherever it landed. Ok where every judged row matched and at least one was
    judged. Skipped where the run predates the digest (no row holds the field: ``DIGESTS_SINCE``, left out of
    ``kmesh verify``), where none was compared (the ``kv_digest`` of the children in ``children`` says why) or where
    every match landed wholly on reused blocks. Named ``KV_DIGEST_CHECK_INPROC`` where ``rows`` hold an in-process
    LMCache restore, so the name says that path is covered only where it ran."""
    if not any(r.holds("kv_digest_equal") for r in rows):
        return Check(KV_DIGEST_CHECK, "skipped", DIGESTS_SINCE, predates=DIGESTS_SINCE)
    name = (KV_DIGEST_CHECK_INPROC if any(r.tier == "lmcache" and r.path == "inproc" and r.arm in RESTORE_ARMS
                                          for r in rows) else KV_DIGEST_CHECK)
    compared = [r for r in rows if r.kv_digest_equal is not None]
    if not compared:
        why = sorted({f"{m.tier}: {m.kv_digest}" for m in children if m.kv_digest})
        return Check(name, "skipped", f"no restore's blocks were compared: {'; '.join(why) or 'no child records why'}")
    judged = [r for r in compared if r.kv_digest_equal is False or r.kv_digest_reused_tokens < r.kv_digest_tokens]
    if not judged:
        return Check(name, "skipped", f"every one of {len(compared)} matching restores landed wholly on "
                                                 f"blocks an earlier request of its context had held: no evidence")
    out = all_of(name, judged, lambda r: r.kv_digest_equal is True,
                 lambda r: f"{r.tag}: {r.kv_digest_differing_tokens} of {r.kv_digest_tokens} tokens' KV differs "
                           f"from the context as stored" + held_text(r))
    fresh = sum(r.kv_digest_tokens - r.kv_digest_reused_tokens for r in judged)
    left = len(compared) - len(judged)
    return replace(out, detail=out.detail + f" ({fresh} of {sum(r.kv_digest_tokens for r in judged)} tokens on fresh "
                                            f"blocks" + (f"; {left} matching wholly on reused blocks left out)" if left
                                                         else ")") + uncompared_text(rows))


def uncompared_restores(rows: list) -> dict[str, int]:
    """The restores (memory and disk arms) of ``rows`` whose blocks were not compared, counted by arm: what the KV
    check's 'every restore' does not cover (vLLM's CPU tier before 7 Dec 2026, which had no KV to compare with; a
    digest that could not be taken)."""
    counts: dict[str, int] = {}
    for r in rows:
        if r.arm in RESTORE_ARMS and r.kv_digest_equal is None:
            counts[r.arm] = counts.get(r.arm, 0) + 1
    return dict(sorted(counts.items()))


def uncompared_text(rows: list) -> str:
    """``uncompared_restores`` as the KV check's detail adds it; '' where every restore was compared."""
    counts = uncompared_restores(rows)
    return ("; restores not compared (no digest recorded): " + ", ".join(f"{a} {n}" for a, n in counts.items())
            if counts else "")

def held_text(row) -> str:
    """What a restore's differing blocks held, where the row records it (``lmcache.probes.compare_kv``)."""
    if row.kv_digest_zero_blocks is None:
        return ""
    return (f" ({row.kv_digest_zero_blocks} of its differing blocks all zero, {row.kv_digest_misplaced_blocks} holding "
            f"another place's KV)")


ORDER_CHECK = ("every repeat ran each of its tier's arms once, in the recorded order (position and the arm before it)")


def order_check(rows: list[GridRow]) -> Check:
    """Each repeat of a (model, tier, context) ran its arms at positions 0, 1, ... each after the arm the row names.
    Skipped where no row records its position (runs recorded before the Williams order); a run where some rows
    record one holds every row to it."""
    if rows and not any(r.holds("arm_position") for r in rows):
        return Check(ORDER_CHECK, "skipped", "no row records its position in its repeat (a run before the Williams order)")
    repeats_of: dict[tuple, list[GridRow]] = {}
    for r in rows:
        repeats_of.setdefault((r.model, r.tier, r.context_tokens, r.repeat), []).append(r)

    def ran_in_its_order(key) -> bool:
        rs = repeats_of[key]
        if not all(r.holds("arm_position") for r in rs):
            return False
        rs = sorted(rs, key=lambda r: r.arm_position)
        return ([r.arm_position for r in rs] == list(range(len(rs)))
                and [r.previous_arm for r in rs] == [None] + [r.arm for r in rs[:-1]])

    return all_of(ORDER_CHECK, sorted(repeats_of), ran_in_its_order,
                  lambda k: f"{k}: " + ", ".join(f"{r.arm}@{r.arm_position}" for r in repeats_of[k]),
                  "raw/rows.jsonl is missing or empty")


def table_checks(run: RunFiles) -> list[Check]:
    """Each declared table (``tables.TABLES``) that the rows give, against results.json, by the one comparator
    (``base.checks.differences``, the table's tolerance): failed where they differ or results.json lacks it,
    skipped where the rows give an empty table and results.json holds the same (its evidence missing: the
    children's accounts where they measured less than the plan, ``EMPTY_BECAUSE``, else ``TITLES``)."""
    results = run.readable_results
    out = []
    for key, (name, empty) in TITLES.items():
        try:
            built = TABLES[key].build(run)
            if built is ABSENT:  # a table of raw data this run does not have: it must be absent from results.json too
                out.append(Check(name, "failed", f"results.json has a {key!r} table this run's raw/ cannot give")
                           if key in results else Check(name, "skipped", PAIRED_SINCE, predates=PAIRED_SINCE))
                continue
            built = json_value(built)
        except RunFileError as e:  # floor_distance where results.json records no floors; a damaged file stops here
            if key != "floor_distance":
                raise
            out.append(Check(name, "skipped", f"cannot be built: {e}"))
            continue
        if key not in results:
            out.append(Check(name, "failed", f"results.json has no {key!r} table"))
            continue
        diffs = differences(built, results[key], key, TABLES[key].rel_tol)
        out.append(Check(name, "failed", "; ".join(diffs[:2])) if diffs else
                   Check(name, "ok", f"{len(built)} rows") if built else
                   Check(name, "skipped", (EMPTY_BECAUSE[key](run) if key in EMPTY_BECAUSE else "") or empty))
    return out


# why a table of the rows is empty where its arms or pairs went unmeasured: the children's accounts (``gaps``); a
# row-less grid's static reason (``TITLES``) would say "no measured rows" of a run whose recompute rows stand
EMPTY_BECAUSE = {"arms": gaps.note, "components": gaps.note,
                 "crossover": lambda run: gaps.note(run, report.RESTORES),
                 "floor_distance": lambda run: gaps.note(run, report.RESTORES),
                 "restore_resolution": gaps.pairs_note}


def floor_check(floors: dict, tiers: list[str]) -> Check:
    """The floors every path needs (disk, host->device; device->device where a GPU buffer ran) were measured with a
    positive bandwidth. Recorded only: the notebook measures them live, results.json alone keeps them."""
    name = "the physical floors were measured in the run"
    wanted = ["disk", "copy"] + (["device"] if "gpubuf" in tiers else [])
    if not floors:
        return Check(name, "skipped", "results.json records no floors", recorded_only=True)
    got = [floors.get(k) or {} for k in wanted]
    return Check(name, all((f.get("gib_per_s") or 0) > 0 for f in got),
                 "; ".join(f"{k}: " + (f"{f.get('label')} {f['gib_per_s']:.2f} GiB/s" if f.get("gib_per_s") else "none")
                           for k, f in zip(wanted, got)), recorded_only=True)


def recorded_check(name: str, records: list, recorded: bool, not_recorded: str, predicate, describe,
                   missing: str) -> Check:
    """``all_of(name, records, ...)`` where the run records what ``predicate`` reads (``recorded``: at least one
    record has it, and then every record is held to it); skipped with ``not_recorded`` where records exist and none
    has it (a run recorded before the field was); skipped with ``missing`` where there are no records."""
    if records and not recorded:
        return Check(name, "skipped", not_recorded)
    return all_of(name, records, predicate, describe, missing)


def launch_checks(measured: list[GridRow], children: list[ChildSummary]) -> list[Check]:
    """Where the GPU buffer queued its restores, what each added to its step and how its forward pass
    waited, against the tier's own record (``tier_route.launch_at``/``wait_at`` in raw/models.jsonl), and
    that every follow-up's forward pass was timed. Each check is always stated: skipped where the run has no
    GPU-buffer restore, or records none of what it reads (a run recorded before the tier recorded it)."""
    gpubuf_rows = [r for r in measured if r.tier == "gpubuf"]
    restored = [r for r in measured if r.arm in GPUBUF_RESTORES]
    split = {r.tag: r.split or NO_SPLIT for r in restored}
    no_restores = "no measured GPU-buffer restores"
    route = {m.model: m.tier_route or {} for m in children if m.tier == "gpubuf"}
    configured = {model: r["launch_at"] for model, r in route.items() if "launch_at" in r}
    waits = {model: r["wait_at"] for model, r in route.items() if "wait_at" in r}
    graphs = {model: r["copy_graphs"] for model, r in route.items() if "copy_graphs" in r}
    before = "(a run recorded before the tier recorded it)"

    def waited_as_its_arm_says(r) -> bool:
        s = split[r.tag]
        if s.wait_at != WAIT_AT_OF.get(r.arm, waits.get(r.model)):
            return False
        return s.wait_at != "layer" or s.num_layer_waits == s.num_copy_groups

    def adds_up(r) -> bool:
        s = split[r.tag]
        parts = [s.measure_s, s.host_s, s.forward_wait_s, s.critical_s]
        if any(v is None or v < 0 for v in parts) or (s.schedule_s or 0.0) < 0:
            return False
        # schedule_s: recorded since 2 Dec 2026 (earlier runs' critical_s has no such part)
        return abs((s.lookup_s or 0.0) + (s.schedule_s or 0.0) + sum(parts[:3]) - parts[3]) < 1e-9

    def launched_as_the_tier_says(r) -> bool:
        return (split[r.tag].copy_launch == "graph") == (graphs.get(r.model) == "on")

    def launched_by_its_arm(r) -> bool:
        s = split[r.tag]
        if r.arm not in HANDOFF_ARMS:
            return s.launched_by in ("engine", None)
        return s.launched_by == "thread" and s.thread_lag_s is not None and s.thread_lag_s > 0

    def reached_forward_in_order(r) -> bool:
        to_forward = split[r.tag].to_forward_s
        return to_forward is not None and 0 < to_forward < r.ttft_s

    def stamped(key: str) -> bool:
        return any(getattr(split[r.tag], key) is not None for r in restored)

    return [
        recorded_check("gpubuf: every follow-up's first forward pass was timed on its own", gpubuf_rows,
                       any(r.holds("forward_step_s") for r in gpubuf_rows),
                       f"no GPU-buffer row records forward_step_s {before}",
                       lambda r: (r.forward_step_s or 0) > 0, lambda r: f"{r.tag}: {r.forward_step_s}",
                       "no measured GPU-buffer rows"),
        recorded_check("gpubuf: every restore's forward pass waited as its arm says (wait_at), with layer waits "
                       "once for each copy group", restored, bool(waits),
                       f"no GPU-buffer child records tier_route.wait_at {before}", waited_as_its_arm_says,
                       lambda r: f"{r.tag}: {split[r.tag].wait_at}, waited "
                                 f"{split[r.tag].num_layer_waits} of {split[r.tag].num_copy_groups} "
                                 "groups", no_restores),
        recorded_check("gpubuf: every restore's copy was one graph replay where the tier captured its copies, and "
                       "launched where it did not (copy_graphs)", restored, bool(graphs),
                       f"no GPU-buffer child records tier_route.copy_graphs {before}", launched_as_the_tier_says,
                       lambda r: f"{r.tag}: {split[r.tag].copy_launch} "
                                 f"(copy_graphs {graphs.get(r.model)})", no_restores),
        recorded_check("gpubuf: every restore's graph was launched where its arm says: by the launch thread "
                       f"({', '.join(HANDOFF_ARMS)}, its launch's stamps recorded), else by the engine thread",
                       restored, stamped("launched_by"), f"no restore records launched_by {before}", launched_by_its_arm,
                       lambda r: f"{r.tag}: {split[r.tag].launched_by}, "
                                 f"lag {split[r.tag].thread_lag_s}", no_restores),
        recorded_check("gpubuf: every restore's forward pass reached its first layer after the restore's end and "
                       "before the first token (to_forward, host stamps)", restored,
                       any(split[r.tag].holds("to_forward_s") for r in restored),
                       f"no restore records to_forward_s {before}", reached_forward_in_order,
                       lambda r: f"{r.tag}: to_forward {split[r.tag].to_forward_s}, ttft {r.ttft_s}",
                       no_restores),
        recorded_check(reference_check_name(split[r.tag].reference_at for r in restored),
                       restored, any(split[r.tag].reference_at for r in restored),
                       "no restore records a clock reference (reference_at): the CPU build has no GPU clock to put its "
                       f"events on, or {before[1:-1]}", reference_agrees,
                       lambda r: f"{r.tag}: reference {split[r.tag].reference_at}, {r.reference_clock}",
                       no_restores),
        recorded_check("gpubuf: every restore was queued where the tier says it queues them (launch_at)", restored,
                       bool(configured), f"no GPU-buffer child records tier_route.launch_at {before}",
                       lambda r: split[r.tag].launched_at == configured.get(r.model),
                       lambda r: f"{r.tag}: {split[r.tag].launched_at} (configured {configured.get(r.model)})",
                       no_restores),
        recorded_check("gpubuf: what every restore added to its step is its lookup, timing sync, host calls and the "
                       "forward pass's wait, each recorded and none negative", restored, stamped("critical_s"),
                       f"no restore records critical_s {before}", adds_up,
                       lambda r: f"{r.tag}: " + ", ".join(f"{k} {getattr(split[r.tag], k)}" for k in
                                                             ("lookup_s", "schedule_s", "measure_s", "host_s",
                                                              "forward_wait_s", "critical_s")), no_restores),
    ]


# Two references taken on an idle device agree on the GPU clock's offset to the GPU's pickup latency of their
# events (a few microseconds) plus the clocks' drift between them (parts per million of the interval)
REFERENCE_AGREE_US = 5.0


# Where a restore's events may be put on the host's clock: by a reference kept from before its step
# (``GpuBufferTier.take_reference``), or, for a disk restore (from 6 Dec 2026), by its own taken in the step right
# after its read (``BufferArena.stage``): on the H100 of 6 Dec 2026 a reference from before a 32,512-token 7B disk
# step was ~1 s old at the after-request check, and the clocks drift ~6 us a second apart (-5.95 us/s fitted over
# 216 rows, 0.2 us around the line), so 8 of its 128 restores failed this check at -5.0 to -7.7 us
REFERENCE_POINTS = ("before_step", "after_read")


def reference_check_name(reference_ats) -> str:
    """The reference check's name: as published while no restore used a reference taken after its read, so the
    published runs, which have none, verify under it; naming that reference where one did."""
    after_read = " (a disk restore's: after its read, before its copy)" if "after_read" in set(reference_ats) else ""
    return (f"gpubuf: every restore's events were put on the host's clock by a reference taken before its "
            f"step{after_read}, which one taken after the request confirmed within {REFERENCE_AGREE_US} us")


def reference_agrees(row: GridRow) -> bool:
    """A restore put on the clock by a reference kept from before its step (``GpuBufferTier.take_reference``), or a
    disk restore by its own taken right after its read, whose offset a second reference, taken after the request,
    confirms within ``REFERENCE_AGREE_US``. The confirmation must be of the reference the restore used: a row that
    records which (``reference_clock.reference_at``, from 6 Dec 2026) must name the restore's."""
    split, clock = row.split or NO_SPLIT, row.reference_clock or {}
    if split.reference_at not in REFERENCE_POINTS or (split.reference_at == "after_read" and KIND.get(row.arm) != "disk"):
        return False
    return (clock.get("reference_at", split.reference_at) == split.reference_at and clock.get("drift_us") is not None
            and abs(clock["drift_us"]) <= REFERENCE_AGREE_US)


def tier_checks(measured: list[GridRow], arm_names: list[str]) -> list[Check]:
    """What the GPU buffer and vLLM's CPU tier must show beyond cached tokens, from their rows."""
    out: list[Check] = []
    rows = {a: [r for r in measured if r.arm == a] for a in arm_names}
    for arm in (a for a in GPUBUF_RESTORES if KIND[a] == "memory"):
        if arm in arm_names:
            out.append(all_of(f"{arm}: the buffer held the context before every follow-up, which restored it "
                              "once from the buffer", rows[arm],
                              lambda r: (r.memory_tier_bytes or 0) >= r.context_bytes and r.num_restores == 1,
                              lambda r: f"{r.tag}: {r.memory_tier_bytes} of {r.context_bytes} bytes, "
                                        f"{r.num_restores} restores", f"no measured {arm} rows"))
    if "gpubuf_disk" in arm_names:
        out.append(all_of("gpubuf_disk: the buffer was empty before every follow-up, the restore read the context from "
                          "disk once and freed its copy", rows["gpubuf_disk"],
                          lambda r: r.memory_tier_bytes == 0 and r.num_restores == 1
                          and (r.disk_read_bytes or 0) >= r.context_bytes and r.memory_tier_bytes_after == 0,
                          lambda r: f"{r.tag}: before {r.memory_tier_bytes}, after "
                                    f"{r.memory_tier_bytes_after} bytes in the buffer; read {r.disk_read_bytes}; "
                                    f"{r.num_restores} restores", "no measured gpubuf_disk rows"))
    if "gpubuf_resident" in arm_names:
        out.append(all_of("gpubuf_resident: no follow-up restored from the buffer", rows["gpubuf_resident"],
                          lambda r: r.num_restores == 0, lambda r: f"{r.tag}: {r.num_restores} restores",
                          "no measured gpubuf_resident rows"))
    if "native_offload" in arm_names:
        offload = rows["native_offload"]
        out.append(all_of("native_offload: vLLM counted every context token of every follow-up as an external hit", offload,
                          lambda r: r.external_hit_tokens == r.context_tokens * len(r.num_cached_tokens),
                          lambda r: f"{r.tag}: {r.external_hit_tokens} external hits",
                          "no measured native_offload rows"))
        unread = [r.tag for r in offload if r.memory_tier_bytes is None]
        out.append(Check("native_offload: vLLM's CPU tier held the context before every follow-up", "skipped",
                         f"this vLLM's offloading manager gives no block counts ({len(unread)} rows)")
                   if unread else
                   all_of("native_offload: vLLM's CPU tier held the context before every follow-up", offload,
                          lambda r: r.memory_tier_bytes >= r.context_bytes,
                          lambda r: f"{r.tag}: {r.memory_tier_bytes} of {r.context_bytes} bytes",
                          "no measured native_offload rows"))
    if "native_resident" in arm_names:
        out.append(all_of("native_resident: vLLM counted no external hit", rows["native_resident"],
                          lambda r: r.external_hit_tokens == 0,
                          lambda r: f"{r.tag}: {r.external_hit_tokens} external hits",
                          "no measured native_resident rows"))
    return out


def counts(run: RunFiles) -> dict[str, int | str]:
    """Deterministic facts for the smoke golden: record counts, bytes stored and read, cached tokens per arm."""
    rows, measured = run.records("rows.jsonl"), measured_rows(run)
    out: dict[str, int | str] = {"rows": len(rows), "measured rows": len(measured), "stores": len(run.records("stores.jsonl"))}
    restores = [r.num_restores for r in measured if r.holds("num_restores")]
    if restores:
        out["GPU-buffer restores in measured rows"] = sum(restores)
    if run.has_raw("pairs.jsonl"):  # the paired design (runs recorded before it have none)
        pairs = run.records("pairs.jsonl")
        out["pair rows (restore, resident)"] = (f"{sum(p.role == 'restore' for p in pairs)}, "
                                                f"{sum(p.role == 'resident' for p in pairs)}")
        out["floor measurements around the points"] = len(run.records("point_floors.jsonl"))
    for model, kvt in kv_bytes(run).items():
        out[f"{model} kv bytes per token"] = kvt
    for s in run.records("stores.jsonl"):
        label = "" if s.tier == "lmcache" else f" ({s.tier})"
        out[f"{s.model} {s.context_tokens}: bytes stored{label}"] = s.bytes_written
    groups: dict[tuple, list[GridRow]] = {}
    for r in measured:
        groups.setdefault((r.model, r.context_tokens), []).append(r)
    for (model, n), rs in groups.items():
        cached = {arm: sorted({c for x in rs if x.arm == arm for c in x.num_cached_tokens})
                  for arm in run.params.ARMS if any(x.arm == arm for x in rs)}
        out[f"{model} {n}: cached tokens per arm"] = cached_per_arm(cached)
        for arm in [a for a in run.params.ARMS if KIND[a] == "disk"]:
            disk = sorted({r.disk_read_bytes for r in rs if r.arm == arm})
            if disk:
                label = "disk" if arm == "disk" else arm
                out[f"{model} {n}: disk bytes read per {label} follow-up"] = "/".join(map(str, disk))
    return out
