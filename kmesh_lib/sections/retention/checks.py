"""Section 16's checks and counts, computed from ``raw/groups.jsonl``, ``raw/blocks.jsonl`` and the params
(read once, as ``RetentionParams``: each parameter's one default).

Every engine run that finished ok recorded the groups its plan gives (warm-up pairs + measured pairs per
combination + its retried pairs, times its arms; ``groups_recorded``), every planned run finished, every
group belongs to one, and every run measured every combination with each arm.

The read invariants, per block, combination (arrival pattern, singleflight setting) and arm, over
the measured groups that are ``ok``:

    - the preparation reads the shared context exactly once (both arms);
    - retain: the group, preparation included, reads it exactly once (nothing in the follow-ups);
    - discard: LMCache holds no copy when the follow-ups arrive, and then it depends on what a
      lookup does (``lookup_kind``):
        prefetch (MP)       every follow-up lookup rereads the whole context from the disk tier --
                            except one that lands while another follow-up's temporary copy is still
                            in L1 (LMCache counts an L1 hit or an ``l1_contended`` prefetch); that
                            accounting is checked exactly;
        on_demand           the follow-ups read nothing: vLLM holds the context after the warm-up,
        (inproc, gpubuf)    and LMCacheConnectorV1 / the GPU buffer load only the tokens vLLM lacks;
    - the independent byte counters (device, hook, metrics) agree in both phases of every group (MP:
      to the byte); a group with fewer than two counters is no evidence of agreement (skipped);
    - MP launcher servers, from the server-side lookup trace (``trace_checks``): the trace's load
      bytes equal the hook's, its contended keys LMCache's ``l1_contended`` chunks, every lookup is
      placed; singleflight on: every overlap waited. The statements about every follow-up lookup
      (retain: it hit the kept copy; discard: it reread the context or met an in-flight load) take
      their evidence from LMCache's lookup-hit counters (0.5.6) and the trace, whichever were recorded,
      and must hold on each; with neither they are skipped;
    - every finished block ran every arrival pattern and singleflight setting with each arm.

The strict claim "every follow-up lookup reread the context" is a measurement, not a check
(``measured_lines``): a concurrent MP follow-up may find another's in-flight copy and read nothing.
Every table results.json states is built again from raw/ by the declared ``TABLES`` and compared by the one
comparator (``figure_checks``; ``kmesh verify`` holds the whole record to ``TABLES`` too).
"""
from __future__ import annotations

from kmesh_lib.base.checks import Check, all_of
from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections.retention.blocks import PlannedBlock, plan_blocks
from kmesh_lib.sections.retention.captures import RetentionEngineRun, RetentionGroup
from kmesh_lib.sections.retention.params import RetentionParams
from kmesh_lib.sections.retention.report import (
    MIB,
    ORDER,
    arrival_of,
    bytes_agree,
    combo_label,
    counters,
    has_two_counters,
    phase_bytes,
    rereads,
    singleflight_of,
    usable,
)
from kmesh_lib.sections.retention.tables import TABLES
from kmesh_lib.workloads.context_arms import ARMS, CONTROL_ARMS, EXTERNAL_ARMS
from kmesh_lib.workloads.context_checks import (
    NOT_AVAILABLE,
    cleaned_up,
    every,
    figures_match,
    listeners_local,
    runs_finished,
)
from kmesh_lib.workloads.context_groups import on_off
from kmesh_lib.workloads.context_params import MP_PATHS


def lookup_kind(g: RetentionGroup) -> str:
    """``prefetch`` (MP: a lookup loads what the arena lacks) or ``on_demand`` (in-process, GPU buffer)."""
    return g.lookup or ("prefetch" if g.path in MP_PATHS else "on_demand")


def planned_blocks(cfg: RetentionParams, blocks: list[RetentionEngineRun]) -> list[str]:
    """The engine runs the params ask for (``blocks.plan_blocks``), less those recorded as not available here."""
    unavailable = {b.engine_run for b in blocks if b.status == NOT_AVAILABLE}
    return [b.name for b in plan_blocks(cfg) if b.name not in unavailable]


def planned_combos(cfg: RetentionParams, path: str) -> set[tuple[str, str]]:
    """(arrival, singleflight) of every combination a block of ``path`` runs."""
    sfs = [on_off(x) for x in cfg.SINGLEFLIGHT] if path in MP_PATHS else ["n/a"]
    return {(a.label, sf) for a in cfg.arrivals for sf in sfs}


def planned_arms(cfg: RetentionParams, b: PlannedBlock) -> tuple[str, ...]:
    """The arms a planned block alternates (``workloads.context_groups.Block``): the controls on the plain engine,
    the block's own arm with a stock server, both external arms otherwise."""
    if b.arms is not None:
        return b.arms
    return tuple(a for a in CONTROL_ARMS if a in cfg.CONTROL_ARMS) if b.path == "engine" else EXTERNAL_ARMS


def planned_groups(cfg: RetentionParams, b: PlannedBlock, retried: int) -> tuple[int, int]:
    """(pairs, measured pairs) a block runs (``Block.run_pairs``): its warm-up pairs, then the measured pairs of
    every combination, and the ``retried`` pairs that replaced a pair with a group not ok."""
    control = b.path == "engine"
    warmups = cfg.CONTROL_WARMUP_GROUPS if control else cfg.WARMUP_GROUPS
    measured = (cfg.CONTROL_MEASURED_GROUPS if control else cfg.MEASURED_GROUPS) * len(planned_combos(cfg, b.path))
    return warmups + measured + retried, measured + retried


def groups_recorded(cfg: RetentionParams, groups: list[RetentionGroup], blocks: list[RetentionEngineRun]) -> Check:
    """Every engine run that finished ok recorded the groups its plan gives: (warm-up pairs + measured pairs x
    combinations + its retried pairs, at most MAX_RETRY_PAIRS per combination) x its arms, each of its arms. A run
    the params do not plan fails; a summary without its pair counts is no evidence."""
    plan = {b.name: b for b in plan_blocks(cfg)}
    finished = [b for b in blocks if b.status == "ok"]

    def evidence(b) -> bool:
        return isinstance(b.pairs, int) and isinstance(b.retried_pairs, int)

    def found(b) -> dict:
        mine = [g for g in groups if g.engine_run == b.engine_run]
        return {"pairs": b.pairs, "groups": len(mine), "measured": sum(bool(g.measured) for g in mine),
                "arms": sorted({g.arm for g in mine})}

    def want(b) -> dict:
        planned = plan[b.engine_run]
        arms = planned_arms(cfg, planned)
        pairs, measured = planned_groups(cfg, planned, b.retried_pairs)
        return {"pairs": pairs, "groups": pairs * len(arms), "measured": measured * len(arms), "arms": sorted(arms)}

    def holds(b) -> bool:
        if b.engine_run not in plan:
            return False
        retries = cfg.MAX_RETRY_PAIRS * len(planned_combos(cfg, plan[b.engine_run].path))
        return found(b) == want(b) and 0 <= b.retried_pairs <= retries

    def describe(b) -> str:
        if b.engine_run not in plan:
            return f"{b.engine_run}: not an engine run the params plan ({', '.join(plan) or 'none'})"
        return f"{b.engine_run}: recorded {found(b)}, the plan gives {want(b)} ({b.retried_pairs} retried pairs)"

    return every("groups recorded in raw/groups.jsonl", finished, evidence, holds, describe,
                 missing="no engine run finished ok")


def combos_ran(cfg: RetentionParams, groups: list[RetentionGroup], blocks: list[RetentionEngineRun]) -> Check:
    """Every finished block ran every (arrival, singleflight) combination with every one of its arms."""
    finished = [b for b in blocks if b.status == "ok"]

    def missing(b) -> list[str]:
        mine = [g for g in groups if g.engine_run == b.engine_run]
        arms = {g.arm for g in mine}
        ran = {(arrival_of(g), singleflight_of(g), g.arm) for g in mine if g.measured}
        want = {(a, sf, arm) for a, sf in planned_combos(cfg, b.path) for arm in arms}
        return [f"{a}/{sf}/{arm}" for a, sf, arm in sorted(want - ran)]

    return every("every engine run measured every arrival pattern and singleflight setting with each arm", finished,
                 lambda b: any(g.engine_run == b.engine_run for g in groups), lambda b: not missing(b),
                 lambda b: f"{b.engine_run}: missing {missing(b)}", missing="no engine run finished")


def checks(run) -> list[Check]:
    run = RunFiles.of(run)
    cfg, groups, blocks = run.params, run.records("groups.jsonl"), run.records("blocks.jsonl")
    out = [groups_recorded(cfg, groups, blocks),
           runs_finished("every planned engine run finished ok", blocks, planned_blocks(cfg, blocks)),
           all_of("every group belongs to an engine run that finished ok", groups,
                  lambda g: g.engine_run in {b.engine_run for b in blocks if b.status == "ok"},
                  lambda g: f"{g.engine_run} pair {g.pair}", missing="no groups"),
           combos_ran(cfg, groups, blocks)]
    for block in sorted({g.engine_run for g in groups}):
        mine = [g for g in groups if g.engine_run == block]
        for arrival, sf in sorted({(arrival_of(g), singleflight_of(g)) for g in mine}):
            for arm in sorted({g.arm for g in mine}, key=lambda a: ORDER.get(a, 9)):
                gs = [g for g in mine if g.arm == arm and (arrival_of(g), singleflight_of(g)) == (arrival, sf)]
                if gs:
                    out += arm_checks(f"{combo_label(block, arrival, sf)} {arm}", arm, gs, cfg)
    out += [listeners_local(blocks), cleaned_up(blocks)]
    out += figure_checks(run)
    return out


def arm_checks(name: str, arm: str, mine: list[RetentionGroup], cfg: RetentionParams) -> list[Check]:
    gs = usable(mine)
    expected = cfg.MEASURED_GROUPS if ARMS[arm].external else cfg.CONTROL_MEASURED_GROUPS
    out = [Check(f"{name}: at least {expected} measured groups usable", len(gs) >= expected,
                 f"{len(gs)} usable of {sum(g.measured for g in mine)} measured")]
    if not gs:
        return out
    max_tokens = cfg.MAX_TOKENS
    out.append(all_of(f"{name}: every follow-up produced its MAX_TOKENS tokens", gs,
                      lambda g: all(x == max_tokens for x in g.num_output_tokens),
                      lambda g: f"pair {g.pair}: {g.num_output_tokens}"))
    if arm == "recompute":
        out.append(all_of(f"{name}: A found nothing cached", gs, lambda g: g.num_cached_tokens[0] == 0,
                          lambda g: f"pair {g.pair}: {g.num_cached_tokens[0]}"))
    else:
        out.append(all_of(f"{name}: every follow-up found the context in vLLM", gs,
                          lambda g: min(g.num_cached_tokens) >= g.context_tokens,
                          lambda g: f"pair {g.pair}: {g.num_cached_tokens}"))
    if not ARMS[arm].external:
        return out
    out.append(all_of(f"{name}: preparation read the context once", gs,
                      lambda g: phase_bytes(g.prep_reads) == g.context_bytes,
                      lambda g: f"pair {g.pair}: {phase_bytes(g.prep_reads) / MIB:.2f} MiB"))
    out.append(every(f"{name}: the independent byte counters agree in both phases (MP: to the byte)", gs,
                     has_two_counters, bytes_agree, lambda g: f"pair {g.pair}: {counters(g.prep_reads)} / "
                                                              f"{counters(g.followup_reads)}"))
    if lookup_kind(gs[0]) == "prefetch" and cfg.LMCACHE_SERVER != "stock":  # a stock server has no trace
        out += trace_checks(name, gs)
    return out + (_discard(name, gs) if arm == "discard" else _retain(name, gs))


def _phases(g: RetentionGroup) -> list[tuple[dict | None, dict]]:
    """(lookup trace summary, disk reads) of the preparation and of the follow-up phase."""
    return [(g.prep_lookup_summary, g.prep_reads), (g.followup_lookup_summary, g.followup_reads)]


def _traced(g: RetentionGroup) -> bool:
    return all(summary is not None for summary, _ in _phases(g))


def trace_checks(name: str, gs: list[RetentionGroup]) -> list[Check]:
    """MP launcher servers: the server-side lookup trace against LMCache's own counts (``lmcache.lookups``).

    Skipped where no trace was recorded (a stock server, or a run from before the trace).
    """
    out = [every(f"{name}: the lookup trace's load bytes equal the byte hook's, in both phases", gs,
                 lambda g: _traced(g) and all(reads.get("hook_bytes") is not None for _, reads in _phases(g)),
                 lambda g: all(trace["load_bytes"] == reads["hook_bytes"] for trace, reads in _phases(g)),
                 lambda g: f"pair {g.pair}: " + ", ".join(f"{trace['load_bytes']} vs {reads['hook_bytes']}"
                                                             for trace, reads in _phases(g))),
           every(f"{name}: the trace's contended keys equal LMCache's l1_contended chunks, in both phases", gs, _traced,
                 lambda g: all(trace["contended_keys"] == reads["contended_chunks"] for trace, reads in _phases(g)),
                 lambda g: f"pair {g.pair}: " + ", ".join(f"{trace['contended_keys']} vs {reads['contended_chunks']}"
                                                             for trace, reads in _phases(g))),
           every(f"{name}: the trace placed every lookup (none unknown or not found)", gs, _traced,
                 lambda g: not any(trace["by_mechanism"].get(m) for trace, _ in _phases(g) for m in ("unknown", "not_found")),
                 lambda g: f"pair {g.pair}: {g.followup_lookup_summary['by_mechanism']}")]
    if singleflight_of(gs[0]) == "on":
        out.append(every(f"{name}: with the singleflight on, no lookup loaded or was refused while an overlapping load "
                         "was in flight (every overlap waited)", gs, _traced,
                         lambda g: not any(trace["by_mechanism"].get(m) for trace, _ in _phases(g)
                                           for m in ("concurrent_load", "contended_in_flight")),
                         lambda g: f"pair {g.pair}: {g.followup_lookup_summary['by_mechanism']}"))
    return out


def _discard(name: str, gs: list[RetentionGroup]) -> list[Check]:
    out = [all_of(f"{name}: the tier dropped its copy after loading vLLM", gs,
                  lambda g: g.memory_tier_bytes_at_followups == 0 and g.memory_tier_bytes_after == 0,
                  lambda g: f"pair {g.pair}: {g.memory_tier_bytes_at_followups} bytes at the follow-ups, "
                            f"{g.memory_tier_bytes_after} after the group")]
    per_group = lambda g: f"pair {g.pair}: rereads {rereads(g)}"
    if lookup_kind(gs[0]) == "on_demand":
        out.append(all_of(f"{name}: the follow-ups read nothing (vLLM held the context; the connector loads only "
                          "what vLLM lacks)", gs, lambda g: phase_bytes(g.followup_reads) == 0, per_group))
        return out
    out.append(all_of(f"{name}: the follow-ups reread whole contexts from the disk tier", gs,
                      lambda g: rereads(g) >= 1 and rereads(g) == int(rereads(g)), per_group))

    def counted(g) -> bool:  # LMCache's lookup-hit counters (0.5.6; 0.5.3 defines none)
        f = g.followup_reads
        return (f["lookup_hit_l2_tokens"] + f["lookup_hit_l1_tokens"] + f["contended_chunks"] * g.chunk_tokens
                == g.group_size * g.context_tokens
                and phase_bytes(f) * g.context_tokens == f["lookup_hit_l2_tokens"] * g.context_bytes)

    def traced(g) -> bool:  # the launcher's lookup trace: every follow-up lookup read or met the copy
        by = g.followup_lookup_summary["by_mechanism"]
        return (g.followup_lookup_summary["lookups"] >= g.group_size and set(by) <= set(MET_THE_CONTEXT)
                and g.followup_lookup_summary["load_bytes"] == phase_bytes(g.followup_reads))

    out.append(every(f"{name}: every follow-up lookup reread the context or found another follow-up's in-flight copy",
                     gs, lambda g: _has_counters(g) or g.followup_lookup_summary is not None,
                     lambda g: (not _has_counters(g) or counted(g)) and (g.followup_lookup_summary is None or traced(g)),
                     lambda g: f"pair {g.pair}: {g.followup_reads} / {g.followup_lookup_summary}"))
    return out


def _retain(name: str, gs: list[RetentionGroup]) -> list[Check]:
    out = [all_of(f"{name}: the tier kept its copy", gs,
                  lambda g: min(g.memory_tier_bytes_at_followups, g.memory_tier_bytes_after) >= g.context_bytes,
                  lambda g: f"pair {g.pair}: {g.memory_tier_bytes_at_followups} bytes at the follow-ups"),
           all_of(f"{name}: the group read the context exactly once, preparation included", gs,
                  lambda g: phase_bytes(g.prep_reads) == g.context_bytes and phase_bytes(g.followup_reads) == 0,
                  lambda g: f"pair {g.pair}: follow-ups read {phase_bytes(g.followup_reads) / MIB:.2f} MiB")]
    if lookup_kind(gs[0]) != "prefetch":
        return out

    def counted(g) -> bool:
        return g.followup_reads["lookup_hit_l1_tokens"] == g.group_size * g.context_tokens

    def traced(g) -> bool:
        summary = g.followup_lookup_summary
        return summary["lookups"] >= g.group_size and summary["by_mechanism"] == {"l1_resident": summary["lookups"]}

    out.append(every(f"{name}: every follow-up lookup hit the kept copy", gs,
                     lambda g: _has_counters(g) or g.followup_lookup_summary is not None,
                     lambda g: (not _has_counters(g) or counted(g)) and (g.followup_lookup_summary is None or traced(g)),
                     lambda g: f"pair {g.pair}: {g.followup_reads.get('lookup_hit_l1_tokens')} L1 tokens, "
                               f"{(g.followup_lookup_summary or {}).get('by_mechanism')}"))
    return out


def _has_counters(g: RetentionGroup) -> bool:
    """LMCache's own lookup-hit counters were recorded (0.5.6 defines them; 0.5.3 does not: None)."""
    f = g.followup_reads
    return f.get("lookup_hit_l1_tokens") is not None and f.get("lookup_hit_l2_tokens") is not None


# a follow-up lookup that read the disk tier, found L1, or met another's in-flight load: none lost the context
MET_THE_CONTEXT = ("first_load", "reread_after_load", "concurrent_load", "contended_in_flight", "waited_for_in_flight",
                   "l1_resident")


# the figure checks' names, as published runs record them, and the declared table each compares
FIGURE_CHECKS = {"arms": "results arms table recomputed from raw/ matches",
                 "discard_to_retain": "results discard/retain ratios recomputed from raw/ match",
                 "not_run": "results not-run rows recomputed from raw/ match",
                 "rereads": "results rereads recomputed from raw/ match",
                 "arrivals": "results arrival-pattern table recomputed from raw/ matches",
                 "restore_split": "results restore split recomputed from raw/ matches",
                 "topology": "results topology rows recomputed from raw/ match"}


def figure_checks(run: RunFiles) -> list[Check]:
    """Every table results.json states, built again from raw/ by the section's declared ``TABLES`` and compared
    by the one comparator (an edited figure or raw line fails). ``kmesh verify`` holds every declared table
    (``blocks`` too) to the record the same way."""
    results = run.readable_results
    return [figures_match(name, results.get(table), TABLES[table].build(run)) for table, name in FIGURE_CHECKS.items()]


def measured_lines(run) -> list[str]:
    """Strict claims reported as measurements: the count behind each, never a pass or a fail.

    "Every follow-up lookup reread the context" is a claim about lookups that load (MP); a lookup
    that only checks (in-process, GPU buffer) rereads nothing by design, which the checks state."""
    groups = RunFiles.of(run).records("groups.jsonl")
    out = []
    for block in sorted({g.engine_run for g in groups}):
        mine = [g for g in usable(groups) if g.engine_run == block and g.arm == "discard" and lookup_kind(g) == "prefetch"]
        for arrival, sf in sorted({(arrival_of(g), singleflight_of(g)) for g in mine}):
            gs = [g for g in mine if (arrival_of(g), singleflight_of(g)) == (arrival, sf)]
            strict = sum(rereads(g) == g.group_size for g in gs)
            out.append(f"{combo_label(block, arrival, sf)} discard: every follow-up lookup reread the context in {strict} "
                       f"of {len(gs)} groups (rereads per group {sorted(rereads(g) for g in gs)})")
    return out


def counts(run) -> dict[str, int | str]:
    """Deterministic facts the smoke golden pins: group counts, bytes and cached tokens that do not race.

    Left out on purpose: the discard follow-ups' bytes on the MP path (a lookup that lands on
    another's in-flight copy reads nothing, so the count depends on timing), the number of usable
    groups (a pair not warm in time is retried, and its ok group stays usable) and every latency.
    """
    run = RunFiles.of(run)
    groups, blocks = run.records("groups.jsonl"), run.records("blocks.jsonl")
    out: dict[str, int | str] = {
        "engine runs ok": sum(b.status == "ok" for b in blocks),
        "rows not available": sum(b.status == NOT_AVAILABLE for b in blocks),
    }
    for block in sorted({g.engine_run for g in groups}):
        mine = [g for g in usable(groups) if g.engine_run == block]
        for arrival, sf in sorted({(arrival_of(g), singleflight_of(g)) for g in mine}):
            for arm in sorted({g.arm for g in mine}, key=lambda a: ORDER.get(a, 9)):
                gs = [g for g in mine if g.arm == arm and (arrival_of(g), singleflight_of(g)) == (arrival, sf)]
                if not gs:  # how many are usable is not pinned: a pair that was not warm in time is retried
                    continue
                name = f"{combo_label(block, arrival, sf)} {arm}"
                out[f"{name}: fewest cached tokens of a follow-up"] = min(min(g.num_cached_tokens) for g in gs)
                if not ARMS[arm].external:
                    continue
                out[f"{name}: preparation bytes per group"] = _one(phase_bytes(g.prep_reads) for g in gs)
                out[f"{name}: byte counters"] = "=".join(sorted(counters(gs[0].followup_reads))) or "none"
                if arm == "retain" or lookup_kind(gs[0]) == "on_demand":
                    out[f"{name}: follow-up bytes per group"] = _one(phase_bytes(g.followup_reads) for g in gs)
                if gs[0].prep_restores is not None:
                    out[f"{name}: preparation restores per group (source)"] = _one(
                        "+".join(sorted(r["source"] for r in g.prep_restores)) or "none" for g in gs)
    return out


def _one(values) -> int | str:
    """The single value every group had, or the distinct values when they differ."""
    distinct = sorted(set(values))
    return distinct[0] if len(distinct) == 1 else ", ".join(map(str, distinct))
