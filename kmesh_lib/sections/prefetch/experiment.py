"""Section 20: does loading shared context early help, once repeat reads are gone?

A shared context sits on LMCache's disk tier; LMCache keeps its copy once loaded (retention on),
so every arm reads the disk tier once per group. A group of follow-ups (context + own suffix,
MAX_TOKENS each) is due at T. ``on_arrival`` loads the context when they arrive; ``early``
starts preparing it LEAD before T (``app.registry.prefetch.driver``). The pilot runs every lead in LEADS_MS and picks
the shortest lead at which every pilot group was ready; the confirmation compares on_arrival with
early at that lead (and at FIXED_LEAD_MS, section 16's start), beside two placement controls:
the context already in LMCache's memory tier (``dram``) and already in vLLM (``engine.vllm_engine.vllm_engine``, the floor).

Modules: ``app.registry.prefetch.driver`` (the driver, readiness), ``app.registry.prefetch.protocol`` (engine runs, arms),
``app.registry.prefetch.stats`` (bootstrap, tables), ``app.registry.prefetch.widgets`` (the interactive panel).
"""
from __future__ import annotations

from kmesh_lib.lmcache.connect import inproc_support
from kmesh_lib.sections.prefetch.params import MIB, PrefetchParams
from kmesh_lib.sections.prefetch.protocol import run_engine
from kmesh_lib.workloads.context_groups import kv_bytes_per_token
from kmesh_lib.workloads.context_groups import load_source_run as load_context_run


def plan(cfg: PrefetchParams) -> dict:
    """What ``kmesh plan 20`` prints: no engine or server is started."""

    kv = kv_bytes_per_token(cfg)
    arms = 3 + len(cfg.CONTROLS)
    per_run = (cfg.WARMUP_PAIRS + cfg.pairs_per_run) * arms
    out = {
        "question": "Does loading shared context early help, once repeat reads are gone?",
        "shared context": f"{cfg.CONTEXT_TOKENS} tokens of {cfg.MODEL} ({cfg.DTYPE}) = {cfg.CONTEXT_TOKENS * kv / MIB:.1f} MiB "
                          f"of KV in {cfg.CONTEXT_TOKENS // cfg.CHUNK_SIZE} chunks; LMCache keeps its copy (read once per group)",
        "pilot": f"leads {cfg.LEADS_MS} ms x {cfg.PILOT_GROUPS} early groups per path and group size (first engine run)",
        "confirmation": f"{cfg.MEASURED_GROUPS} groups per arm over {cfg.ENGINE_RUNS} fresh engine runs "
                        f"({cfg.pairs_per_run} pairs + {cfg.WARMUP_PAIRS} warm-up per run, alternating order); "
                        f"arms on_arrival, early (chosen lead), early_fixed ({cfg.FIXED_LEAD_MS:.0f} ms), "
                        f"{', '.join(cfg.CONTROLS)}",
        "groups per engine run": f"{per_run} (+ {len(cfg.LEADS_MS) * cfg.PILOT_GROUPS} pilot groups in run 0)",
        "group sizes": str(cfg.GROUP_SIZES),
    }
    for path in cfg.PATHS:
        ok, why = inproc_support(cfg.DEVICE) if path == "inproc" else (True, "LMCacheMPConnector + lmcache server")
        prep = "HTTP prefetch (POST /cache/prefetches) + one-token warm-up" if path == "mp" else \
            "one-token warm-up only (no application prefetch API in-process)"
        out[f"path {path}"] = ("runs: " if ok else "not available: ") + why + (f"; early path = {prep}" if ok else "")
    if cfg.SOURCE_RUN:
        out["source"] = f"analyses {cfg.SOURCE_RUN} (no engine starts)"
    return out


def measure(cfg: PrefetchParams, record=None, log=print) -> tuple[list[dict], list[dict]]:
    """Pilot + confirmation for every path and group size. Returns (groups, engine-run summaries)."""

    groups, runs = [], []
    for path in cfg.PATHS:
        if path == "inproc" and not inproc_support(cfg.DEVICE)[0]:
            runs.append({"block": "inproc", "path": path, "status": "not available", "detail": inproc_support(cfg.DEVICE)[1]})
            if record is not None:
                record.append_jsonl("blocks.jsonl", runs[-1])
            continue
        for n in cfg.GROUP_SIZES:
            lead = None
            for r in range(cfg.ENGINE_RUNS):
                g, s = run_engine(cfg, path, n, r, lead, record, log)
                lead = s.get("lead_ms", lead)
                groups += g
                runs.append(s)
    return groups, runs


def load_source_run(source: str, record=None) -> tuple[list[dict], list[dict]]:
    """Groups and engine runs of a finished run (the GPU run), copied into this run's ``raw/``."""
    return load_context_run(source, record)


