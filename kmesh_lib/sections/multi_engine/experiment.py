"""Section 22: several engines, one LMCache server: does shared KV beat routing and recomputation?

Per model, two fleets of NUM_ENGINES engine processes each, one after the other:

    fleet    engines                                   policies it serves
    local    no KV connector; prefix caching on        recompute (requests skip reading the prefix
                                                       cache), round_robin, prefix_aware
    shared   LMCacheMPConnector to one lmcache server  shared (round-robin routing)

Each policy serves the same trace (``workload.make_trace``) per repeat. The order is drawn per
repeat from SEED (``policy_order``): which fleet goes first is a seeded coin, and the policies within
each fleet a seeded shuffle (a block-randomized order: the two fleets cannot hold one GPU's memory at
once, so a fleet is started when the order needs it and closed when the order moves to the other).
Every engine's pool is drained and its prefix cache reset before each policy, so each starts on
empty pools. What a run writes, as it goes:

    raw/orders.jsonl     one line per (model, repeat): the order drawn and the seed it came from
    raw/requests.jsonl   one line per request: routing, stamps, cached-token split, outputs
    raw/arms.jsonl       one line per (model, repeat, policy): makespan, pools before, the server's
                         counters before and after ('shared'), the host's load average at the
                         trace's start and end, a kill if one was injected
    raw/probes.jsonl     one line per idle-engine probe child (``probe.py``): recomputed, local, restored
    raw/fleets.jsonl     one line per fleet: engines (pids, listeners, start), server, the cleanup
                         evidence measured after it closed

A fleet start with its traces and probes is a ``Unit`` (``units``, ``run_unit``): the notebook runs them all in
one process; the GPU driver (``gpu.py``) runs each in a child of its own, over as many calls as the run needs,
tagging each record with the unit and writing ``raw/units.jsonl`` (one summary per unit, the host it ran on).
"""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass

from kmesh_lib.engine import costs
from kmesh_lib.engine.model_spec import resolve
from kmesh_lib.sections.multi_engine.fleet import Fleet, stored_tokens, visible_gpus
from kmesh_lib.sections.multi_engine.params import POLICIES, MultiEngineParams, kv_bytes_per_token
from kmesh_lib.sections.multi_engine.probe import probe
from kmesh_lib.sections.multi_engine.router import Router
from kmesh_lib.sections.multi_engine.workload import make_trace

FLEETS = (("local", False), ("shared", True))

# Rough costs for ``plan`` (2-core CPU machine under load; one H200): an engine process's import and
# start, and prefill tokens per second per engine.
START_S = {("cpu", "tiny"): 30, ("cpu", "kvheavy"): 35, ("cpu", "qwen2.5-0.5b"): 45,
           ("cuda", "qwen2.5-0.5b"): 50, ("cuda", "qwen2.5-1.5b"): 60, ("cuda", "qwen2.5-7b"): 90}
PREFILL_TOKENS_PER_S = {("cpu", "tiny"): 20000, ("cpu", "kvheavy"): 1000, ("cpu", "qwen2.5-0.5b"): 150,
                        ("cuda", "qwen2.5-0.5b"): 30000, ("cuda", "qwen2.5-1.5b"): 12000, ("cuda", "qwen2.5-7b"): 2500}
# Measured on the H200 at the gpu profile's trace shape (MEASURED_SHAPE), from the published one-repeat runs'
# raw/fleets.jsonl (start_s) and raw/arms.jsonl (wall_s per policy): 0.5B gpu-20261201-123342-6615, 7B
# gpu-20261201-123346-16c1 and -123349-2d77 (low, high over them). Those notebooks took 842, 725 and 458 s in all,
# 239-731 s more than their fleet starts, traces and probes: one run's kernel, imports, fleet closes and whatever
# else held that machine (the three ran at once), counted once per run as NOTEBOOK_OVERHEAD_S.
MEASURED = {
    ("cuda", "qwen2.5-0.5b"): {"start_s": (38.8, 48.0), "probes_s": (3.0, 3.1),
                               "trace_s": {"recompute": (5.8, 5.9), "round_robin": (5.0, 5.1),
                                           "prefix_aware": (4.7, 4.8), "shared": (5.0, 5.1)}},
    ("cuda", "qwen2.5-7b"): {"start_s": (32.4, 46.9), "probes_s": (11.6, 12.0),
                             "trace_s": {"recompute": (42.1, 43.6), "round_robin": (33.4, 33.9),
                                         "prefix_aware": (21.2, 21.3), "shared": (19.1, 19.3)}},
}
MEASURED_SHAPE = {"NUM_ENGINES": 2, "NUM_FAMILIES": 6, "NUM_CHILDREN": 3, "PARENT_TOKENS": 4096, "CHILD_SUFFIX_TOKENS": 128,
                  "NUM_NOISE": 12, "NOISE_TOKENS": 2048, "MAX_TOKENS": 16, "DTYPE": "float32", "NUM_PROBES": 2}
NOTEBOOK_OVERHEAD_S = (0.0, 731.0)
# The GPU driver's unit beyond its fleet start, traces and probes: the child's Python start and the fleet's close
# (engines and server stopped, their files removed). A guess, wide.
UNIT_OVERHEAD_S = (5.0, 20.0)
# Seconds of units a device call of ~540 s gives the driver: scripts/device_16_20.sh's budget of 500-530 s less 45 s
# (the driver's tables and checks after its last unit, the tar) less the driver's margin of 20 s
CALL_BUDGET_S = 435.0


def fleet_policies(cfg: MultiEngineParams) -> list[tuple[str, bool, list[str]]]:
    """(fleet, with a server, its policies in cfg.POLICIES order) for the fleets that serve any."""
    out = []
    for kind, server in FLEETS:
        mine = [p for p in cfg.POLICIES if POLICIES[p][1] == server]
        if mine:
            out.append((kind, server, mine))
    return out


def rotate(policies: list[str], repeat: int) -> list[str]:
    """The order of runs recorded before the orders were drawn (no raw/orders.jsonl): a rotation within each fleet."""
    k = repeat % len(policies)
    return policies[k:] + policies[:k]


def order_seed(cfg: MultiEngineParams, repeat: int) -> str:
    return f"multi-engine-order-{cfg.SEED}-{repeat}"


def policy_order(cfg: MultiEngineParams, repeat: int) -> list[str]:
    """Repeat ``repeat``'s order of the policies: the fleets in a seeded random order, each fleet's policies shuffled."""
    rng = random.Random(order_seed(cfg, repeat))
    blocks = [list(mine) for _, _, mine in fleet_policies(cfg)]
    rng.shuffle(blocks)
    for b in blocks:
        rng.shuffle(b)
    return [p for b in blocks for p in b]


def fleet_of(policy: str) -> str:
    return "shared" if POLICIES[policy][1] else "local"


def schedule(cfg: MultiEngineParams) -> list[tuple[str, list[tuple[int, str]]]]:
    """Per model, the fleet starts in order: (fleet, [(repeat, policy), ...] it serves). A fleet stays up
    across a repeat boundary where the next repeat's order begins with its policies."""
    out: list[tuple[str, list[tuple[int, str]]]] = []
    for repeat in range(cfg.NUM_REPEATS):
        for policy in policy_order(cfg, repeat):
            kind = fleet_of(policy)
            if not out or out[-1][0] != kind:
                out.append((kind, []))
            out[-1][1].append((repeat, policy))
    return out


def load_avg() -> list[float]:
    """The host's 1, 5 and 15 minute load averages (its run queue: other work competing for the cores)."""
    return [round(x, 2) for x in os.getloadavg()]


def trace_tokens(cfg: MultiEngineParams) -> int:
    """Prompt tokens in one trace (what the recompute control computes)."""
    return (cfg.NUM_FAMILIES * (cfg.PARENT_TOKENS + cfg.NUM_CHILDREN * cfg.child_tokens)
            + cfg.NUM_NOISE * cfg.NOISE_TOKENS)


def unit_costs(cfg: MultiEngineParams, model: str) -> dict:
    """Seconds (low, high) a fleet start, each policy's trace and a fleet's probes take for ``model``: the published
    H200 runs' figures where the parameters have their shape (``MEASURED``), else the rough rates above."""
    key = (cfg.DEVICE, model)
    m = MEASURED.get(key) if all(getattr(cfg, k) == v for k, v in MEASURED_SHAPE.items()) else None
    if m is not None:
        return {"start_s": m["start_s"], "probes_s": m["probes_s"], "trace_s": dict(m["trace_s"])}
    arrivals = (cfg.NUM_FAMILIES + cfg.NUM_NOISE) * cfg.MEAN_ARRIVAL_GAP_S + 2 * cfg.MEAN_CHILD_GAP_S
    # engines on one GPU share its compute; on the CPU each has its own cores
    parallel = cfg.NUM_ENGINES if cfg.DEVICE == "cpu" else max(1, min(cfg.NUM_ENGINES, len(visible_gpus())))
    per_trace = arrivals + trace_tokens(cfg) / (PREFILL_TOKENS_PER_S.get(key, 2000) * parallel)
    probes = cfg.NUM_PROBES * (2 * cfg.PARENT_TOKENS + 2 * cfg.child_tokens) / PREFILL_TOKENS_PER_S.get(key, 2000)
    start = START_S.get(key, 60)
    return {"start_s": (start, start), "probes_s": (probes, probes), "trace_s": {p: (per_trace, per_trace)
                                                                               for p in POLICIES}}


def unit_span(cfg: MultiEngineParams, unit: Unit, costs_: dict) -> costs.Span:
    """A unit's seconds (low, high) from ``unit_costs``: its fleet start, its traces, its probes, its close."""
    span = costs.Span(*costs_["start_s"]) + costs.Span(*UNIT_OVERHEAD_S)
    for _, policy in unit.served:
        span += costs.Span(*costs_["trace_s"][policy])
    return span + (costs.Span(*costs_["probes_s"]) if unit.probes else 0.0)


def device_calls(cfg: MultiEngineParams, budget_s: float = CALL_BUDGET_S) -> tuple[int, float]:
    """The GPU driver's calls for the whole run (``gpu.py``): its units in order, each call starting a unit only while
    the unit's high estimate still ends within ``budget_s``; (calls, seconds of units at the high estimate)."""
    calls, used, total = 0, budget_s, 0.0
    per_model = {m: unit_costs(cfg, m) for m in cfg.models}
    for unit in units(cfg):
        seconds = unit_span(cfg, unit, per_model[unit.model]).high
        total += seconds
        if used + seconds > budget_s or calls == 0:
            calls, used = calls + 1, 0.0
        used += seconds
    return calls, total


def plan(cfg: MultiEngineParams) -> dict:
    """What ``kmesh plan 22`` prints: sizes, arms and an expected duration; starts nothing."""
    lines = {}
    usable = (cfg.NUM_GPU_BLOCKS - 1) * cfg.BLOCK_SIZE
    lines["fleet"] = (f"{cfg.NUM_ENGINES} engines ({cfg.DEVICE}, {cfg.DTYPE}), one process and one pool each: "
                      f"NUM_GPU_BLOCKS={cfg.NUM_GPU_BLOCKS} x BLOCK_SIZE={cfg.BLOCK_SIZE} = {usable} tokens")
    lines["trace"] = (f"{cfg.num_requests} requests per policy and repeat: {cfg.NUM_FAMILIES} parents of {cfg.PARENT_TOKENS} "
                      f"tokens, {cfg.NUM_CHILDREN} children each ({cfg.child_tokens} tokens, mean {cfg.MEAN_CHILD_GAP_S} s "
                      f"after the parent), {cfg.NUM_NOISE} unrelated of {cfg.NOISE_TOKENS}; Poisson arrivals, mean gap "
                      f"{cfg.MEAN_ARRIVAL_GAP_S} s; {cfg.MAX_TOKENS} output tokens each")
    family = cfg.PARENT_TOKENS + cfg.MAX_TOKENS
    lines["pressure"] = (f"the families' contexts are {cfg.NUM_FAMILIES * family} tokens and the unrelated requests "
                         f"{cfg.NUM_NOISE * cfg.NOISE_TOKENS}, against {cfg.NUM_ENGINES} x {usable} tokens of pools")
    lines["policies"] = ", ".join(f"{p} ({'server, ' if POLICIES[p][1] else ''}{POLICIES[p][0]})" for p in cfg.POLICIES)
    total = 0.0
    span = costs.Span(0.0, 0.0)
    measured_shape = all(getattr(cfg, k) == v for k, v in MEASURED_SHAPE.items())
    gpus = max(1, min(cfg.NUM_ENGINES, len(visible_gpus())))  # one engine per GPU where several are lent
    for model in cfg.models:
        kvt = kv_bytes_per_token(cfg, model)
        mine = [u for u in units(cfg) if u.model == model]
        c = unit_costs(cfg, model)
        part = (costs.Span(*c["start_s"]) * len(mine) + (costs.Span(*c["probes_s"]) if mine else 0.0)
                + sum((costs.Span(*c["trace_s"][p]) * cfg.NUM_REPEATS for p in cfg.POLICIES), costs.Span(0, 0)))
        seconds = (part.low + part.high) / 2
        span += part
        total += seconds
        lines[f"model {model}"] = (f"KV {kvt // 1024} KiB/token; a parent's context is {family * kvt / 2**20:.1f} MiB; "
                                   f"{len(mine)} fleet start(s); about {seconds / 60:.1f} min")
    if "shared" in cfg.POLICIES:
        disk = ", ".join(f"{m} {stored_tokens(cfg) * kv_bytes_per_token(cfg, m) / 2**30:.2f} GiB" for m in cfg.models)
        lines["server"] = (f"one lmcache server on 127.0.0.1: L1 arena {cfg.ARENA_MIB} MiB, store policy {cfg.STORE_POLICY}, "
                           f"chunks of {cfg.CHUNK_SIZE} tokens, O_DIRECT disk tier of at most {disk}")
    if cfg.KILL_ENGINE is not None:
        lines["fault"] = f"engine {cfg.KILL_ENGINE} is SIGKILLed after {cfg.KILL_AFTER_REQUESTS} dispatched requests"
    lines["order"] = ("per repeat, drawn from SEED: " + "; ".join(f"r{r} " + " > ".join(policy_order(cfg, r))
                                                                  for r in range(min(cfg.NUM_REPEATS, 3)))
                      + ("; ..." if cfg.NUM_REPEATS > 3 else ""))
    if measured_shape and all((cfg.DEVICE, m) in MEASURED for m in cfg.models):
        span += costs.Span(*NOTEBOOK_OVERHEAD_S)
        lines["expected duration"] = (f"{span} ({cfg.NUM_REPEATS} repeat(s)): fleet starts, traces and probes as the "
                                      "published H200 runs measured them, plus 0-731 s of notebook overhead")
    else:
        span = costs.Span(total, total)
        lines["expected duration"] = f"about {total / 60:.0f} min ({cfg.NUM_REPEATS} repeat(s))"
    lines[costs.GPU_TIME] = costs.gpu_time(cfg.DEVICE, span, gpus=gpus)
    if cfg.DEVICE == "cuda":
        calls, seconds = device_calls(cfg)
        lines["device calls"] = (f"the GPU driver (python -m kmesh_lib.sections.multi_engine.gpu, docs/gpu.md): "
                                 f"{len(units(cfg))} units (one fleet start each) in {calls} call(s) of ~540 s "
                                 f"(at most {CALL_BUDGET_S:.0f} s of units each, at their high estimate: "
                                 f"{seconds / 60:.1f} min in all), no notebook overhead")
        per_model = {m: unit_costs(cfg, m) for m in cfg.models}
        longest = max(units(cfg), key=lambda u: unit_span(cfg, u, per_model[u.model]).high)
        high = unit_span(cfg, longest, per_model[longest.model]).high
        if high > CALL_BUDGET_S:  # Pipeline.can_start would never start it: no number of calls finishes the run
            lines["device calls"] += (f"; but unit {longest.name}'s high estimate, {high:.0f} s, exceeds a call's "
                                      f"{CALL_BUDGET_S:.0f} s: the driver would never start it (fewer repeats per fleet "
                                      "start: a smaller shape or fewer policies)")
    return lines


@dataclass(frozen=True)
class Unit:
    """One fleet start of ``schedule`` for one model: the (repeat, policy) traces it serves, and on its kind's last
    start the probes. The GPU driver's unit of work (``gpu.py``): it finishes whole or is measured again."""

    model: str
    start: int  # its place in schedule(cfg)
    fleet: str  # local | shared
    served: tuple[tuple[int, str], ...]
    probes: bool

    @property
    def name(self) -> str:
        return f"{self.model}-s{self.start}-{self.fleet}"


def units(cfg: MultiEngineParams) -> list[Unit]:
    """Every model's fleet starts, in the order they run."""
    plan_ = schedule(cfg)
    last = {kind: i for i, (kind, _) in enumerate(plan_)}
    return [Unit(model, i, kind, tuple(served), cfg.KILL_ENGINE is None and last[kind] == i)
            for model in cfg.models for i, (kind, served) in enumerate(plan_)]


def order_records(cfg: MultiEngineParams, model: str) -> list[dict]:
    """raw/orders.jsonl's lines for ``model``: each repeat's order, drawn from SEED."""
    return [{"model": model, "repeat": r, "seed": order_seed(cfg, r), "order": policy_order(cfg, r)}
            for r in range(cfg.NUM_REPEATS)]


def run_policy(fleet: Fleet, cfg: MultiEngineParams, policy: str, repeat: int, order: int, record, log=print,
               unit: str | None = None) -> dict:
    router_name, _, reads_prefix_cache = POLICIES[policy]
    pools = fleet.reset()
    before = fleet.snapshot()
    roots = make_trace(cfg, repeat, resolve(fleet.model).config["vocab_size"])
    kill = (cfg.KILL_ENGINE, cfg.KILL_AFTER_REQUESTS) if cfg.KILL_ENGINE is not None else None
    meta = {"model": fleet.model, "repeat": repeat, "policy": policy, **({"unit": unit} if unit else {})}
    load_start = load_avg()
    t0 = time.monotonic()
    router = Router(fleet.engines, router_name, cfg, meta, skip_prefix_cache=not reads_prefix_cache, kill=kill)
    summary = router.run(roots, record)
    arm = {**summary, "order": order, "fleet": fleet.kind, "router": router_name, "wall_s": round(time.monotonic() - t0, 3),
           "pools_before": pools, "server_before": before, "server_after": fleet.snapshot(),
           "server_alive": fleet.server.alive() if fleet.server is not None else None,
           "kv_bytes_per_token": kv_bytes_per_token(cfg, fleet.model), "chunk_size": cfg.CHUNK_SIZE,
           "load_avg_start": load_start, "load_avg_end": load_avg(),
           "load_1m": round(os.getloadavg()[0], 2)}  # the host's run queue: other work competing for cores
    record.append_jsonl("arms.jsonl", arm)
    ms = f"{summary['makespan_s']:.2f} s" if summary["makespan_s"] is not None else "-"
    log(f"{fleet.model} r{repeat} {policy}: {summary['num_ok']}/{summary['num_requests']} ok, makespan {ms}")
    return arm


def recorded(record) -> list[dict]:
    """A run measured elsewhere (``SOURCE_RUN``): its arm records as raw/arms.jsonl holds them; starts nothing."""
    return record.files().raw("arms.jsonl")


def make_fleet(cfg: MultiEngineParams, model: str, kind: str, log=print) -> Fleet:
    return Fleet(cfg, model, kind == "shared", log)


def run_unit(cfg: MultiEngineParams, unit: Unit, record, log=print, fleet_factory=make_fleet,
             tag: str | None = None) -> list[dict]:
    """One fleet start: its traces in the drawn order, then its probes where it is its kind's last start; the fleet's
    record goes to raw/fleets.jsonl also when something raised. ``tag`` (the GPU driver's unit name) is written into
    every record, so a unit that did not finish can be set aside whole."""
    fleet = fleet_factory(cfg, unit.model, unit.fleet, log)
    arms = []
    try:
        fleet.start()
        log(f"{unit.model} {unit.fleet} fleet ready in {fleet.info.get('start_s', 0):.0f} s")
        for repeat, policy in unit.served:
            arms.append(run_policy(fleet, cfg, policy, repeat, policy_order(cfg, repeat).index(policy), record, log,
                                   unit=tag))
        if unit.probes:
            probe(fleet, cfg, record, log, unit=tag)
    except Exception as e:
        fleet.info.update(error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        raise
    finally:
        record.append_jsonl("fleets.jsonl", {**fleet.close(), **({"unit": tag} if tag else {})})
    return arms


def run(cfg: MultiEngineParams, record, log=print, fleet_factory=make_fleet) -> list[dict]:
    """Every model, repeat and policy in the drawn order (``units``); returns the arm records (also in
    raw/arms.jsonl). Each fleet's probes run on its last start, after its last trace."""
    arms = []
    for model in cfg.models:
        record.append_jsonl("orders.jsonl", order_records(cfg, model))
        for unit in (u for u in units(cfg) if u.model == model):
            arms += run_unit(cfg, unit, record, log, fleet_factory)
    return arms
