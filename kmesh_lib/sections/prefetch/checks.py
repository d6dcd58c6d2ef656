"""Section 20's checks and counts, computed from ``raw/groups.jsonl``, ``raw/blocks.jsonl`` and the params.

    - every planned engine run (PATHS x GROUP_SIZES x ENGINE_RUNS) finished ok, and every recorded
      group belongs to one (a crashed run's partial groups are not results);
    - every arm has MEASURED_GROUPS measured groups; none had a tier error or an unplaced control;
      every follow-up produced MAX_TOKENS tokens; every early group has a readiness record;
    - every prepared group (ready early, dram, engine) read the context from the disk tier exactly
      once (to within half a chunk); a group with no disk count is no evidence (skipped);
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

from pathlib import Path

from kmesh_lib.base.checks import Check, all_of, check
from kmesh_lib.base.records import RunFileError, RunFiles
from kmesh_lib.sections.prefetch import stats as ps
from kmesh_lib.workloads.context_checks import (
    NOT_AVAILABLE,
    cleaned_up,
    every,
    figures_match,
    listeners_local,
    runs_finished,
)

EARLY = ("early", "early_fixed")
CI_KEYS = ("95% CI", "above floor 95% CI")


def as_run(run) -> RunFiles:
    return run if isinstance(run, RunFiles) else RunFiles(Path(run))


def results_of(run: RunFiles) -> dict:
    try:
        return run.results
    except RunFileError:
        return {}


def groups_of(run: RunFiles) -> list[dict]:
    """The run's groups, each with its status (``recomputed`` derived for runs recorded before it existed)."""
    return ps.classify(run.raw("groups.jsonl"), run.params.get("BLOCK_SIZE"))


def planned_runs(params: dict, blocks: list[dict]) -> list[str]:
    unavailable = {b.get("path") for b in blocks if b.get("status") == NOT_AVAILABLE}
    return [f"{p}-N{n}-r{r}" for p in params.get("PATHS") or [] if p not in unavailable
            for n in params.get("GROUP_SIZES") or [] for r in range(params.get("ENGINE_RUNS") or 0)]


def confirmation_leads(blocks: list[dict]) -> dict[str, float]:
    return {f"{b['path']} N={b['group_size']}": b["lead_ms"] for b in blocks if b.get("lead_ms") is not None}


def checks(run) -> list[Check]:
    run = as_run(run)
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
    out += [
        all_of("no measured group had a tier error or an unplaced control", measured,
               lambda g: g["status"] in ("ok", "recomputed"), lambda g: f"{g['block']} pair {g['pair']} {g['arm']}: "
                                                                        f"{g['status']} {g.get('detail', '')}"),
        all_of("every follow-up produced its MAX_TOKENS tokens", measured + pilot,
               lambda g: all(x == params.get("MAX_TOKENS") for x in g["num_output_tokens"]),
               lambda g: f"{g['block']} pair {g['pair']} {g['arm']}: {g['num_output_tokens']}"),
        all_of("every early group has a readiness record", [g for g in groups if g.get("arm") in EARLY],
               lambda g: bool(g.get("readiness")) and g.get("ready") is not None, lambda g: f"{g['block']} pair {g['pair']}"),
        _read_once(groups, params),
        all_of("every group in which a follow-up recomputed the context is recorded as recomputed (out of the paired "
               "tables)", raw_groups, lambda g: not (g.get("status") == "ok" and ps.recomputed(g, params.get("BLOCK_SIZE"))),
               lambda g: f"{g['block']} pair {g['pair']} {g['arm']}: cached {g['num_cached_tokens']}, status ok")]
    for path, n in ps.cases(pilot):
        out += _lead(path, n, groups, params)
    out += [listeners_local(blocks), cleaned_up(blocks)]
    return out + figure_checks(results_of(run), groups, blocks, params)


def _arm_counts(path: str, n: int, measured: list[dict], params: dict) -> Check:
    mine = [g for g in measured if g["path"] == path and g["group_size"] == n]
    leads = {g["lead_ms"] for g in mine if g["arm"] == "early"}
    arms = ["on_arrival", "early"] + (["early_fixed"] if leads and leads != {params.get("FIXED_LEAD_MS")} else []) + \
        list(params.get("CONTROLS") or [])
    want = params.get("MEASURED_GROUPS", 1)
    got = {arm: sum(g["arm"] == arm for g in mine) for arm in arms}
    return Check(f"{path} N={n}: at least MEASURED_GROUPS measured groups in every arm",
                 all(v >= want for v in got.values()), f"want {want}: {got}")


def _read_once(groups: list[dict], params: dict) -> Check:
    """Prepared groups read the context once: the prefetch or warm-up loaded it, the follow-ups found it."""
    prepared = [g for g in groups if (g.get("phase") == "pilot" or g.get("measured"))
                and (g["arm"] in ("dram", "engine") or g.get("ready"))]
    chunk = params.get("CHUNK_SIZE")

    def once(g) -> bool:
        half_chunk = g["context_bytes"] * chunk // g["context_tokens"] // 2 if chunk else 0
        return abs(g["disk_bytes"] - g["context_bytes"]) <= half_chunk

    return every("every prepared group (ready early, dram, engine) read the context from the disk tier exactly once",
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
    groups = groups_of(as_run(run))
    ran = [g for g in groups if g.get("phase") == "pilot" or g.get("measured")]
    bad = [g for g in ran if g.get("status") == "recomputed"]
    line = (f"every follow-up found the shared context cached, in every arm (on-arrival included): in "
            f"{len(ran) - len(bad)} of {len(ran)} groups")
    if bad:
        line += "; recomputed in " + ", ".join(f"{g['block']} pair {g['pair']} {g['arm']} ({g.get('phase')})"
                                               for g in bad[:5]) + (" ..." if len(bad) > 5 else "")
    return [line] if ran else []


def counts(run) -> dict[str, int | str]:
    """Deterministic facts the smoke golden pins: record counts, bytes and cached tokens.

    Left out on purpose: the chosen lead, readiness, the on-arrival groups' disk reads on the MP
    path (concurrent lookups) and every latency: they depend on timing.
    """
    run = as_run(run)
    groups, blocks = groups_of(run), run.raw("blocks.jsonl")
    ran = [g for g in groups if g.get("phase") == "pilot" or g.get("measured")]
    out: dict[str, int | str] = {
        "engine runs ok": sum(b.get("status") == "ok" for b in blocks),
        "groups in which a follow-up recomputed the shared context (every arm)": sum(
            g.get("status") == "recomputed" for g in ran)}
    for path, n in ps.cases(groups):
        mine = [g for g in groups if g["path"] == path and g["group_size"] == n]
        out[f"{path} N={n}: pilot groups"] = sum(g.get("phase") == "pilot" for g in mine)
        for arm in ("on_arrival", "early", "dram", "engine"):
            out[f"{path} N={n} {arm}: measured groups"] = sum(g["arm"] == arm and g.get("measured") for g in mine)
        placed = [g for g in mine if g.get("measured") and g["arm"] in ("dram", "engine")]
        if placed:
            out[f"{path} N={n} dram, engine: disk bytes per group"] = _one(g["disk_bytes"] for g in placed)
        ok = [g for g in mine if g.get("measured") and g.get("status") == "ok"]
        if ok:
            out[f"{path} N={n}: fewest cached tokens of a follow-up (groups ok)"] = min(min(g["num_cached_tokens"])
                                                                                      for g in ok)
    return out


def _one(values) -> int | str:
    distinct = sorted(set(values), key=str)
    return distinct[0] if len(distinct) == 1 else ", ".join(map(str, distinct))
