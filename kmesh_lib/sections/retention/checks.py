"""Section 16's checks and counts, computed from ``raw/groups.jsonl``, ``raw/blocks.jsonl`` and the params.

The read invariants, per block and arm, over the measured groups that are ``ok``:

    - the preparation reads the shared context exactly once (both arms);
    - retain: the group, preparation included, reads it exactly once (nothing in the follow-ups);
    - discard: LMCache holds no copy when the follow-ups arrive, and then it depends on what a
      lookup does (``lookup_kind``):
        prefetch (MP)       every follow-up lookup rereads the whole context from the disk tier --
                            except one that lands while another follow-up's temporary copy is still
                            in L1 (LMCache counts an L1 hit or an ``l1_contended`` prefetch); that
                            accounting is checked exactly;
        on_demand (inproc)  the follow-ups read nothing: vLLM holds the context after the warm-up
                            and LMCacheConnectorV1 retrieves only the tokens vLLM lacks;
    - the independent byte counters (device, hook, metrics) agree in both phases of every group;
      a group with fewer than two counters is no evidence of agreement (skipped, never ok).

The strict claim "every follow-up lookup reread the context" is a measurement, not a check
(``measured_lines``): a concurrent MP follow-up may find another's in-flight copy and read nothing.
Every table results.json states (arms, ratios, what did not run, rereads) is recomputed from raw/.
"""
from __future__ import annotations

from pathlib import Path

from kmesh_lib.base.checks import Check, all_of, check
from kmesh_lib.base.records import RunFileError, RunFiles
from kmesh_lib.sections.retention.report import (
    MIB,
    ORDER,
    arm_rows,
    bytes_agree,
    counters,
    has_two_counters,
    phase_bytes,
    ratio_rows,
    rereads,
    rereads_by_block,
    unavailable_rows,
    usable,
)
from kmesh_lib.workloads.context_arms import ARMS
from kmesh_lib.workloads.context_checks import (
    NOT_AVAILABLE,
    cleaned_up,
    every,
    figures_match,
    listeners_local,
    runs_finished,
)


def as_run(run) -> RunFiles:
    return run if isinstance(run, RunFiles) else RunFiles(Path(run))


def results_of(run: RunFiles) -> dict:
    try:
        return run.results
    except RunFileError:
        return {}


def lookup_kind(g: dict) -> str:
    """``prefetch`` (MP: a lookup loads what the arena lacks) or ``on_demand`` (in-process)."""
    return g.get("lookup") or ("prefetch" if g["path"] == "mp" else "on_demand")


def planned_blocks(params: dict, blocks: list[dict]) -> list[str]:
    """The engine runs the params ask for, less the paths recorded as not available on this device."""
    unavailable = {b.get("block") for b in blocks if b.get("status") == NOT_AVAILABLE}
    sizes = params.get("GROUP_SIZES") or []
    names = [f"{p}-N{n}" for p in params.get("PATHS") or [] for n in sizes]
    names += [f"engine-N{n}" for n in sizes] if params.get("CONTROL_ARMS") else []
    return [b for b in names if b not in unavailable]


def checks(run) -> list[Check]:
    run = as_run(run)
    params, groups, blocks = run.params, run.raw("groups.jsonl"), run.raw("blocks.jsonl")
    out = [check("groups recorded in raw/groups.jsonl", True, f"{len(groups)} groups", groups,
                 missing="raw/groups.jsonl is missing or empty"),
           runs_finished("every planned engine run finished ok", blocks, planned_blocks(params, blocks)),
           all_of("every group belongs to an engine run that finished ok", groups,
                  lambda g: g["block"] in {b.get("block") for b in blocks if b.get("status") == "ok"},
                  lambda g: f"{g['block']} pair {g['pair']}", missing="no groups")]
    for block in sorted({g["block"] for g in groups}):
        for arm in sorted({g["arm"] for g in groups if g["block"] == block}, key=lambda a: ORDER.get(a, 9)):
            out += arm_checks(f"{block} {arm}", arm, [g for g in groups if g["block"] == block and g["arm"] == arm],
                              params)
    out += [listeners_local(blocks), cleaned_up(blocks)]
    out += figure_checks(results_of(run), groups, blocks)
    return out


def arm_checks(name: str, arm: str, mine: list[dict], params: dict) -> list[Check]:
    gs = usable(mine)
    expected = params.get("CONTROL_MEASURED_GROUPS" if not ARMS[arm].external else "MEASURED_GROUPS", 1)
    out = [Check(f"{name}: at least {expected} measured groups usable", len(gs) >= expected,
                 f"{len(gs)} usable of {sum(g['measured'] for g in mine)} measured")]
    if not gs:
        return out
    max_tokens = params.get("MAX_TOKENS")
    out.append(all_of(f"{name}: every follow-up produced its MAX_TOKENS tokens", gs,
                      lambda g: all(x == max_tokens for x in g["num_output_tokens"]),
                      lambda g: f"pair {g['pair']}: {g['num_output_tokens']}"))
    if arm == "recompute":
        out.append(all_of(f"{name}: A found nothing cached", gs, lambda g: g["num_cached_tokens"][0] == 0,
                          lambda g: f"pair {g['pair']}: {g['num_cached_tokens'][0]}"))
    else:
        out.append(all_of(f"{name}: every follow-up found the context in vLLM", gs,
                          lambda g: min(g["num_cached_tokens"]) >= g["context_tokens"],
                          lambda g: f"pair {g['pair']}: {g['num_cached_tokens']}"))
    if not ARMS[arm].external:
        return out
    out.append(all_of(f"{name}: preparation read the context once", gs,
                      lambda g: phase_bytes(g["prep_reads"]) == g["context_bytes"],
                      lambda g: f"pair {g['pair']}: {phase_bytes(g['prep_reads']) / MIB:.2f} MiB"))
    out.append(every(f"{name}: the independent byte counters agree in both phases", gs, has_two_counters,
                     bytes_agree, lambda g: f"pair {g['pair']}: {counters(g['prep_reads'])} / "
                                            f"{counters(g['followup_reads'])}"))
    return out + (_discard(name, gs) if arm == "discard" else _retain(name, gs))


def _discard(name: str, gs: list[dict]) -> list[Check]:
    out = [all_of(f"{name}: LMCache dropped its copy after loading vLLM", gs,
                  lambda g: g["memory_tier_bytes_at_followups"] == 0 and g["memory_tier_bytes_after"] == 0,
                  lambda g: f"pair {g['pair']}: {g['memory_tier_bytes_at_followups']} bytes at the follow-ups")]
    per_group = lambda g: f"pair {g['pair']}: rereads {rereads(g)}"
    if lookup_kind(gs[0]) == "on_demand":
        out.append(all_of(f"{name}: the follow-ups read nothing (vLLM held the context; the connector loads only "
                          "what vLLM lacks)", gs, lambda g: phase_bytes(g["followup_reads"]) == 0, per_group))
        return out
    out.append(all_of(f"{name}: the follow-ups reread whole contexts from the disk tier", gs,
                      lambda g: rereads(g) >= 1 and rereads(g) == int(rereads(g)), per_group))

    def accounted(g) -> bool:
        f = g["followup_reads"]
        if f.get("lookup_hit_l1_tokens") is None or f.get("lookup_hit_l2_tokens") is None:
            return False
        return (f["lookup_hit_l2_tokens"] + f["lookup_hit_l1_tokens"] + f["contended_chunks"] * g["chunk_tokens"]
                == g["group_size"] * g["context_tokens"]
                and phase_bytes(f) * g["context_tokens"] == f["lookup_hit_l2_tokens"] * g["context_bytes"])

    out.append(every(f"{name}: every follow-up lookup reread the context or found another follow-up's in-flight copy",
                     gs, lambda g: g["followup_reads"].get("lookup_hit_l2_tokens") is not None, accounted,
                     lambda g: f"pair {g['pair']}: {g['followup_reads']}"))
    return out


def _retain(name: str, gs: list[dict]) -> list[Check]:
    out = [all_of(f"{name}: LMCache kept its copy", gs,
                  lambda g: min(g["memory_tier_bytes_at_followups"], g["memory_tier_bytes_after"]) >= g["context_bytes"],
                  lambda g: f"pair {g['pair']}: {g['memory_tier_bytes_at_followups']} bytes at the follow-ups"),
           all_of(f"{name}: the group read the context exactly once, preparation included", gs,
                  lambda g: phase_bytes(g["prep_reads"]) == g["context_bytes"] and phase_bytes(g["followup_reads"]) == 0,
                  lambda g: f"pair {g['pair']}: follow-ups read {phase_bytes(g['followup_reads']) / MIB:.2f} MiB")]
    if lookup_kind(gs[0]) == "prefetch":
        out.append(every(f"{name}: every follow-up lookup hit the kept copy", gs,
                         lambda g: g["followup_reads"].get("lookup_hit_l1_tokens") is not None,
                         lambda g: g["followup_reads"]["lookup_hit_l1_tokens"] == g["group_size"] * g["context_tokens"],
                         lambda g: f"pair {g['pair']}: {g['followup_reads']['lookup_hit_l1_tokens']} L1 tokens"))
    return out


def figure_checks(results: dict, groups: list[dict], blocks: list[dict]) -> list[Check]:
    """Every table results.json states, recomputed from raw/ (an edited figure or raw line fails)."""
    arms = arm_rows(groups)
    return [figures_match("results arms table recomputed from raw/ matches", results.get("arms"), arms),
            figures_match("results discard/retain ratios recomputed from raw/ match", results.get("discard_to_retain"),
                          ratio_rows(arms)),
            figures_match("results not-run rows recomputed from raw/ match", results.get("not_run"),
                          unavailable_rows(blocks)),
            figures_match("results rereads recomputed from raw/ match", results.get("rereads"), rereads_by_block(groups))]


def measured_lines(run) -> list[str]:
    """Strict claims reported as measurements: the count behind each, never a pass or a fail."""
    groups = as_run(run).raw("groups.jsonl")
    out = []
    for block in sorted({g["block"] for g in groups}):
        gs = [g for g in usable(groups) if g["block"] == block and g["arm"] == "discard"]
        if gs:
            strict = sum(rereads(g) == g["group_size"] for g in gs)
            out.append(f"{block} discard: every follow-up lookup reread the context in {strict} of {len(gs)} groups "
                       f"(rereads per group {sorted(rereads(g) for g in gs)})")
    return out


def counts(run) -> dict[str, int | str]:
    """Deterministic facts the smoke golden pins: group counts, bytes and cached tokens that do not race.

    Left out on purpose: the discard follow-ups' bytes on the MP path (a lookup that lands on
    another's in-flight copy reads nothing, so the count depends on timing), the number of usable
    groups (a pair not warm in time is retried, and its ok group stays usable) and every latency.
    """
    run = as_run(run)
    groups, blocks = run.raw("groups.jsonl"), run.raw("blocks.jsonl")
    out: dict[str, int | str] = {
        "engine runs ok": sum(b.get("status") == "ok" for b in blocks),
        "rows not available": sum(b.get("status") == NOT_AVAILABLE for b in blocks),
    }
    for block in sorted({g["block"] for g in groups}):
        for arm in sorted({g["arm"] for g in groups if g["block"] == block}, key=lambda a: ORDER.get(a, 9)):
            gs = [g for g in usable(groups) if g["block"] == block and g["arm"] == arm]
            if not gs:  # how many are usable is not pinned: a pair that was not warm in time is retried
                continue
            out[f"{block} {arm}: fewest cached tokens of a follow-up"] = min(min(g["num_cached_tokens"]) for g in gs)
            if ARMS[arm].external:
                out[f"{block} {arm}: preparation bytes per group"] = _one(phase_bytes(g["prep_reads"]) for g in gs)
                out[f"{block} {arm}: byte counters"] = "=".join(sorted(counters(gs[0]["followup_reads"]))) or "none"
            if arm == "retain":
                out[f"{block} {arm}: follow-up bytes per group"] = _one(phase_bytes(g["followup_reads"]) for g in gs)
    return out


def _one(values) -> int | str:
    """The single value every group had, or the distinct values when they differ."""
    distinct = sorted(set(values))
    return distinct[0] if len(distinct) == 1 else ", ".join(map(str, distinct))
