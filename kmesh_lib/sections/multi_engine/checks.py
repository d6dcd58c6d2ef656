"""Section 22's statements about a run, recomputed from ``raw/`` and ``params.resolved.yaml``.

- the run is the one the parameters describe: every (model, repeat, policy) trace ran, each with
  exactly its requests (ids and prompt lengths from the trace shape);
- every request completed with MAX_TOKENS tokens (a fault run instead: only the killed engine's
  requests and their children failed, and the rest was served by the engines still alive);
- the policies saw the same prompts and produced the same tokens (logprobs within LOGPROB_TOLERANCE);
- each policy started on empty pools; recompute read no cached token; only 'shared' restored any,
  and there each request's cached tokens are its pool's plus the server's;
- the routers did what they say (rotation; longest indexed prefix, then fewest in flight);
- the server's byte counters agree (disk-tier writes: hook = stored chunks; reads: hook = device
  = loaded chunks; the files on disk = the server's L2 gauge), and the engines restored no more
  tokens than the server's lookups hit;
- every listener was on 127.0.0.1; every engine and server process was gone and every disk-tier
  file and SHM segment removed once a fleet closed;
- results.json's tables are what the raw records give (``tables.TABLES``, by the one comparator).

The parameters are read once, as ``MultiEngineParams`` (``RunFiles.params``): each with its one default.
"""
from __future__ import annotations

from collections import Counter, defaultdict

from kmesh_lib.base.checks import Check, all_of, check, differences
from kmesh_lib.base.declared import ABSENT, json_value
from kmesh_lib.base.records import RunFiles
from kmesh_lib.sections.multi_engine import compare, report
from kmesh_lib.sections.multi_engine.captures import (
    ArmRecord,
    FleetRecord,
    OrderRecord,
    ProbeRecord,
    RequestRecord,
    UnitRecord,
)
from kmesh_lib.sections.multi_engine.experiment import fleet_policies, order_seed, policy_order, schedule, units
from kmesh_lib.sections.multi_engine.params import POLICIES, MultiEngineParams
from kmesh_lib.sections.multi_engine.probe import STEPS
from kmesh_lib.sections.multi_engine.tables import EMPTY, NO_ORDERS, TABLES

NO_ROWS = "raw/requests.jsonl holds no requests"
NO_ARMS = "raw/arms.jsonl holds no traces"


def trace_ids(cfg: MultiEngineParams, repeat: int) -> dict[str, int]:
    """request id -> prompt tokens, for one trace of the parameters' shape."""
    child = cfg.PARENT_TOKENS + cfg.MAX_TOKENS + cfg.CHILD_SUFFIX_TOKENS
    ids = {f"r{repeat}-n{n}": cfg.NOISE_TOKENS for n in range(cfg.NUM_NOISE)}
    for f in range(cfg.NUM_FAMILIES):
        ids[f"r{repeat}-f{f}-parent"] = cfg.PARENT_TOKENS
        ids.update({f"r{repeat}-f{f}-c{c}": child for c in range(cfg.NUM_CHILDREN)})
    return ids


def by_arm(rows: list[RequestRecord]) -> dict[tuple, list[RequestRecord]]:
    out = defaultdict(list)
    for r in rows:
        out[r.arm].append(r)
    return out


def across_policies(rows: list[RequestRecord], field: str) -> list[list[RequestRecord]]:
    """Groups of the same request (model, repeat, id) under two or more policies, with ``field`` set."""
    groups = defaultdict(list)
    for r in rows:
        if getattr(r, field) is not None and r.status == "ok":
            groups[(r.model, r.repeat, r.request_id)].append(r)
    return [g for g in groups.values() if len({r.policy for r in g}) > 1]


def logprob_delta(group: list[RequestRecord]) -> float:
    ref = group[0].logprobs
    return max((abs(x - y) for r in group[1:] for x, y in zip(ref, r.logprobs)), default=0.0)


def workload_checks(cfg: MultiEngineParams, rows: list[RequestRecord], arms: list[ArmRecord]) -> list[Check]:
    planned = [(m, rep, pol) for m in cfg.models for rep in range(cfg.NUM_REPEATS) for pol in cfg.POLICIES]
    times = Counter(a.arm for a in arms)  # a resumed GPU driver run counts each trace once (gpu.py sets the rest aside)
    ran = set(times)
    grouped = by_arm(rows)

    def shape_problem(key) -> str:
        want = trace_ids(cfg, key[1])
        got = [r.request_id for r in grouped.get(key, [])]
        if sorted(got) != sorted(want):
            return f"{len(got)} records for {len(want)} requests"
        bad = [r.request_id for r in grouped[key] if r.prompt_sha and r.num_prompt_tokens != want[r.request_id]]
        return f"prompt lengths of {bad[:3]}" if bad else ""

    return [
        all_of("every planned trace ran (model x repeat x policy)", planned, lambda k: times[k] == 1,
               lambda k: f"{k} missing" if k not in ran else f"{k} recorded {times[k]} times", "no traces planned"),
        all_of("each trace recorded each of its requests once, with the prompt length of its role", sorted(ran),
               lambda k: not shape_problem(k), lambda k: f"{k}: {shape_problem(k)}", NO_ARMS),
    ]


def completion_checks(cfg: MultiEngineParams, rows: list[RequestRecord], arms: list[ArmRecord]) -> list[Check]:
    def complete(r: RequestRecord) -> bool:
        return r.status == "ok" and r.num_output_tokens == cfg.MAX_TOKENS and r.finish_reason == "length"

    describe = lambda r: f"{r.policy} {r.request_id}: {r.status} {r.error} {r.num_output_tokens} tokens"  # noqa: E731
    if cfg.KILL_ENGINE is None:
        return [all_of(f"every request completed with MAX_TOKENS={cfg.MAX_TOKENS} tokens", rows, complete, describe, NO_ROWS)]
    killed = cfg.KILL_ENGINE
    kills = [a.killed for a in arms if a.killed]
    failed = {(*r.arm, r.request_id) for r in rows if r.status != "ok"}

    def explained(r: RequestRecord) -> bool:
        if complete(r):
            return True
        if r.error == "engine_died":
            return r.engine == killed
        parent = r.request_id.rsplit("-c", 1)[0] + "-parent"
        return r.error == "parent_failed" and (*r.arm, parent) in failed

    after = [r for r in rows for k in kills[:1] if r.dispatch_s is not None and r.dispatch_s > k.at_s]
    return [
        check(f"fault: engine {killed} was killed mid-trace", len(kills) == 1 and kills[0].engine == killed,
              f"{[k.as_recorded() for k in kills]}", arms, NO_ARMS),
        all_of("fault: every request completed except those in flight on the killed engine and their children",
               rows, explained, describe, NO_ROWS),
        check("fault: the killed engine's in-flight requests are recorded as failed",
              all(any(r.request_id == rid and r.error == "engine_died" for r in rows) for k in kills
                  for rid in k.in_flight), f"in flight at the kill: {[k.in_flight for k in kills]}", kills,
              "no kill recorded"),
        all_of("fault: every request routed after the kill completed on a surviving engine", after,
               lambda r: complete(r) and r.engine != killed, describe, "no request was routed after the kill"),
        all_of("fault: the server kept serving to the end of the trace", [a for a in arms if a.server_after],
               lambda a: a.server_alive, lambda a: a.arm, "no server in this run"),
    ]


def agreement_checks(cfg: MultiEngineParams, rows: list[RequestRecord], arms: list[ArmRecord]) -> list[Check]:
    prompts = across_policies(rows, "prompt_sha")
    outputs = across_policies(rows, "output_token_ids")
    tol = cfg.LOGPROB_TOLERANCE
    worst = max((logprob_delta(g) for g in outputs), default=0.0)
    ident = lambda g: f"{g[0].model} r{g[0].repeat} {g[0].request_id}"  # noqa: E731
    return [
        all_of("every request had the same prompt under every policy", prompts,
               lambda g: len({r.prompt_sha for r in g}) == 1, ident, "no request ran under two policies"),
        all_of("every request generated the same tokens under every policy", outputs,
               lambda g: all(r.output_token_ids == g[0].output_token_ids for r in g), ident,
               "no request ran under two policies"),
        check(f"chosen-token logprobs agree across policies within LOGPROB_TOLERANCE={tol}", worst <= tol,
              f"max |delta| {worst:.3g} over {len(outputs)} requests", outputs, "no request ran under two policies"),
    ]


def cache_checks(cfg: MultiEngineParams, rows: list[RequestRecord], arms: list[ArmRecord]) -> list[Check]:
    usable = cfg.NUM_GPU_BLOCKS - 1
    ok = [r for r in rows if r.status == "ok"]
    recompute = [r for r in ok if r.policy == "recompute"]
    local_only = [r for r in ok if not POLICIES[r.policy][1]]
    shared = [r for r in ok if POLICIES[r.policy][1]]

    def empty(a: ArmRecord) -> bool:
        return all(x.dead or (x.ok and x.free_blocks == usable and x.cached_blocks == 0) for x in a.pools_before)

    def split(r: RequestRecord) -> bool:
        local, external = r.num_local_cached_tokens, r.num_external_tokens
        return local is not None and external is not None and local + external == r.num_cached_tokens

    return [
        all_of(f"every policy started on empty pools ({usable} free blocks, nothing cached)", arms, empty,
               lambda a: f"{a.arm}: {[x.as_recorded() for x in a.pools_before]}", NO_ARMS),
        all_of("recompute: no request found a cached token", recompute, lambda r: r.num_cached_tokens == 0,
               lambda r: f"{r.request_id}: {r.num_cached_tokens}", "no recompute requests"),
        all_of("policies without the server restored nothing", local_only, lambda r: r.num_external_tokens == 0,
               lambda r: f"{r.policy} {r.request_id}: {r.num_external_tokens}", "no requests without the server"),
        all_of("shared: each request's cached tokens = its pool's + the server's", shared, split,
               lambda r: f"{r.request_id}: {r.num_local_cached_tokens} + {r.num_external_tokens} vs "
                         f"{r.num_cached_tokens}", "no shared requests"),
    ]


def routing_checks(cfg: MultiEngineParams, rows: list[RequestRecord], arms: list[ArmRecord]) -> list[Check]:
    n = cfg.NUM_ENGINES
    routed = [r for r in rows if r.engine is not None]
    aware = [r for r in routed if POLICIES[r.policy][0] == "prefix_aware"]

    def longest(r: RequestRecord) -> bool:
        live = [i for i in range(n) if r.live[i]]
        best = max(r.matched_tokens[i] for i in live)
        ties = [i for i in live if r.matched_tokens[i] == best]
        return r.engine == min(ties, key=lambda i: (r.in_flight[i], i))

    grouped = by_arm(routed)
    rotating = [k for k in grouped if POLICIES[k[2]][0] == "round_robin" and all(all(r.live) for r in grouped[k])]

    def rotation(k) -> bool:
        engines = [r.engine for r in sorted(grouped[k], key=lambda r: r.dispatch_s)]
        return engines == [i % n for i in range(len(engines))]

    return [
        all_of("prefix_aware: each request went to a live engine with the longest indexed prefix (ties: fewest in flight)",
               aware, longest, lambda r: f"{r.request_id}: engine {r.engine}, matched {r.matched_tokens}",
               "no prefix_aware requests"),
        all_of("round-robin policies rotated over the engines in dispatch order", rotating, rotation,
               lambda k: f"{k}", "no round-robin trace with every engine alive"),
    ]


def byte_checks(cfg: MultiEngineParams, rows: list[RequestRecord], arms: list[ArmRecord],
                probes: list[ProbeRecord]) -> list[Check]:
    table = report.bytes_table(arms, rows)
    placed = [(f"{t['model']} r{t['repeat']} trace", t["l1_oom_chunks"]) for t in table]
    placed += [(f"{r.model} probe {r.probe} {r.kind}", report.oom_chunks(r.server_start, r.server_after))
               for r in probes if r.server_start and r.server_after]
    reads = [t for t in table if t["l2_read_bytes_hook"] is not None]
    ident = lambda t: f"{t['model']} r{t['repeat']}: {t}"  # noqa: E731
    return [
        all_of("server: disk-tier writes agree (byte hook = stored chunks x chunk bytes), no write errors", table,
               lambda t: t["l2_write_bytes_hook"] == t["l2_write_bytes_metrics"] and t["l2_write_errors"] == 0, ident,
               "no shared trace with server counters"),
        # NOTE: the server creates chunk files while it serves, and creating files with O_DIRECT makes
        # the kernel read file-system metadata for the process (benchmarks/bench_odirect_metadata.py),
        # which /proc/<pid>/io counts and a payload hook cannot. So the device count is not a third count
        # of payload bytes here: the statement "device = hook" is kept as a measured line
        # (``measured_lines``: both figures, every trace), and the checks are the two payload counts
        # agreeing to the byte, and the device having seen at least that payload.
        all_of("server: disk-tier payload reads agree (byte hook = loaded chunks x chunk bytes)", reads,
               lambda t: t["l2_read_bytes_hook"] == t["l2_read_bytes_metrics"], ident,
               "no shared trace with a byte hook"),
        all_of("server: the device counter saw at least the payload the hook read", reads,
               lambda t: t["l2_read_bytes_device"] is not None and t["l2_read_bytes_device"] >= t["l2_read_bytes_hook"],
               ident, "no shared trace with a byte hook"),
        all_of("server: the disk tier's files hold what the server's L2 gauge says", table,
               lambda t: t["disk_tier_bytes"] == t["l2_usage_bytes"], ident, "no shared trace with server counters"),
        all_of("server: every chunk found L1 space (no store or load dropped for want of arena)", placed,
               lambda x: x[1] == 0, lambda x: f"{x[0]}: {x[1]} chunks dropped", "no shared trace or probe with server counters"),
        all_of("server: the engines restored no more tokens than the server's lookups hit", table,
               lambda t: t["engine_restored_bytes"] <= t["lookup_hit_tokens"] * kv_bytes(arms, t), ident,
               "no shared trace with server counters"),
    ]


def kv_bytes(arms: list[ArmRecord], t: dict) -> int:
    """KV bytes per token of the trace a bytes-table row describes."""
    return next(a.kv_bytes_per_token for a in arms if a.arm == (t["model"], t["repeat"], t["policy"]))


def process_checks(cfg: MultiEngineParams, fleets: list[FleetRecord], drawn_orders: bool = False) -> list[Check]:
    listeners = [(f.fleet, addr) for f in fleets for e in f.engines for addr in e.listeners]
    listeners += [(f.fleet + " server", addr) for f in fleets if f.server for addr in f.server.listeners]
    # a run that drew its orders starts a fleet each time the order moves to the other; before, one per kind
    want = len(cfg.models) * (len(schedule(cfg)) if drawn_orders else len({POLICIES[pol][1] for pol in cfg.POLICIES}))

    def gone(f: FleetRecord) -> bool:
        c = f.cleanup
        return (f.status == "closed" and c.engine_groups_gone is True and c.runtime_dir_removed is True
                and (not f.server or (c.server_group_gone is True and c.disk_tier_files_left == 0
                                      and c.shm_segment_removed is True)))

    return [
        check(f"every fleet started and closed ({want} planned)", len(fleets) == want and all(f.status == "closed"
              for f in fleets), f"{[(f.model, f.fleet, f.status) for f in fleets]}", fleets,
              "raw/fleets.jsonl holds no fleets"),
        all_of("every engine and server socket listened on 127.0.0.1 only", listeners,
               lambda x: x[1].startswith("127.0.0.1:"), repr, "no listeners recorded"),
        all_of("every engine and server process gone, the runtime dir, disk tier and SHM segment removed at close",
               fleets, gone, lambda f: f"{f.model} {f.fleet}: {f.cleanup.as_recorded()}", "raw/fleets.jsonl holds no fleets"),
    ]


def order_checks(cfg: MultiEngineParams, orders: list[OrderRecord], rows: list[RequestRecord],
                 arms: list[ArmRecord]) -> list[Check]:
    """The drawn order and the host's load (runs that recorded raw/orders.jsonl; before: skipped, NO_ORDERS)."""
    if not orders:
        return [Check(name, "skipped", NO_ORDERS) for name in (
            "each repeat's order is the one drawn from SEED, and its traces ran in that order",
            "the host's load average was recorded at each trace's start and end",
            "every two policies were compared on makespan over NUM_REPEATS paired traces")]
    ran = defaultdict(list)
    for a in arms:  # raw/arms.jsonl is appended as the traces finish
        ran[(a.model, a.repeat)].append(a.policy)

    def as_drawn(o: OrderRecord) -> bool:
        want = policy_order(cfg, o.repeat)
        return o.seed == order_seed(cfg, o.repeat) and o.order == want and ran[(o.model, o.repeat)] == want

    planned = [(m, r) for m in cfg.models for r in range(cfg.NUM_REPEATS)]
    recorded = {(o.model, o.repeat) for o in orders}
    loaded = lambda a: all(x is not None and len(x) == 3 for x in (a.load_avg_start, a.load_avg_end))  # noqa: E731
    table = [t for t in compare.comparison_table(rows) if t["metric"] == "makespan"] if rows else []
    return [
        all_of("each repeat's order is the one drawn from SEED, and its traces ran in that order",
               orders + [k for k in planned if k not in recorded],  # a (model, repeat) tuple: no recorded order
               lambda o: isinstance(o, OrderRecord) and as_drawn(o),
               lambda o: f"{o} has no recorded order" if not isinstance(o, OrderRecord) else
               f"{o.model} r{o.repeat}: drawn {o.order}, ran {ran[(o.model, o.repeat)]}", "no orders"),
        all_of("the host's load average was recorded at each trace's start and end", arms, loaded,
               lambda a: f"{a.arm}", NO_ARMS),
        all_of("every two policies were compared on makespan over NUM_REPEATS paired traces", table,
               lambda t: t["pairs"] == cfg.NUM_REPEATS, lambda t: f"{t['model']} {t['a']} vs {t['b']}: {t['pairs']} pairs",
               "fewer than two policies ran"),
    ]


def figure_checks(run: RunFiles, rows: list[RequestRecord], arms: list[ArmRecord]) -> list[Check]:
    spans = report.makespans(rows)
    return [all_of("each trace's makespan in raw/arms.jsonl equals the one recomputed from its requests",
                   [a for a in arms if a.makespan_s is not None],
                   lambda a: abs(spans.get(a.arm, -1) - a.makespan_s) < 1e-6,
                   lambda a: f"{a.arm}: {a.makespan_s} vs {spans.get(a.arm)}", NO_ARMS),
            *table_checks(run)]


def table_checks(run: RunFiles) -> list[Check]:
    """Each declared table (``tables.TABLES``) rebuilt from raw/ against results.json, by the one comparator
    (``base.checks.differences``, the table's tolerance): failed where they differ or results.json lacks it, skipped
    where raw/ gives an empty table and results.json holds the same (its evidence missing: ``tables.EMPTY``)."""
    results = run.readable_results
    out = []
    for key, table in TABLES.items():
        name = f"results.json '{key}' table equals the one recomputed from raw/"
        built = table.build(run)
        if built is ABSENT:
            out.append(Check(name, "failed", f"results.json holds a {key!r} table this run's files do not give")
                       if key in results else Check(name, "skipped", NO_ORDERS))
            continue
        built = json_value(built)
        if key not in results:
            out.append(Check(name, "failed", f"results.json has no {key!r} table"))
            continue
        diffs = differences(built, results[key], key, table.rel_tol)
        out.append(Check(name, "failed", "; ".join(diffs[:2])) if diffs else
                   Check(name, "ok", f"{len(built)} rows") if built else Check(name, "skipped", EMPTY[key]))
    return out


def as_files(run) -> RunFiles:
    """The run as ``RunFiles``; a run directory (the ``kmesh verify`` of before the section interface) works too."""
    return run if isinstance(run, RunFiles) else RunFiles(run)


def probe_checks(cfg: MultiEngineParams, probes: list[ProbeRecord]) -> list[Check]:
    parent_blocks = (cfg.PARENT_TOKENS + cfg.MAX_TOKENS - 1) // cfg.BLOCK_SIZE * cfg.BLOCK_SIZE
    chunks = cfg.PARENT_TOKENS // cfg.CHUNK_SIZE * cfg.CHUNK_SIZE
    want = {"recompute": lambda r: r.num_cached_tokens == 0,
            "local": lambda r: r.num_cached_tokens >= parent_blocks and r.num_external_tokens == 0,
            "restore": lambda r: r.num_local_cached_tokens == 0 and (r.num_external_tokens or 0) >= chunks}
    groups = defaultdict(list)
    for r in probes:
        groups[(r.model, r.probe)].append(r)
    same = [g for g in groups.values() if len(g) > 1]
    # where some were recorded, every (model, probe, kind) the fleets plan is there (a driver's resumed run included)
    kinds = [k for fleet, _, _ in fleet_policies(cfg) for k, _, _ in STEPS[fleet]] if cfg.KILL_ENGINE is None else []
    have = {(r.model, r.probe, r.kind) for r in probes}
    missing = [k for k in ((m, i, kind) for m in cfg.models for i in range(cfg.NUM_PROBES) for kind in kinds)
               if k not in have] if probes else []
    return [
        all_of(f"probe: the child found what its step sets up (recompute: nothing; local: the parent's {parent_blocks} "
               f"tokens of full blocks; restore: at least {chunks} tokens from the server)", probes + missing,
               lambda r: isinstance(r, ProbeRecord) and want[r.kind](r),
               lambda r: f"{r[0]} probe {r[1]} {r[2]}: not recorded" if not isinstance(r, ProbeRecord) else
               f"{r.model} probe {r.probe} {r.kind}: {r.num_cached_tokens} cached, {r.num_external_tokens} from the server",
               "no probes recorded"),
        all_of("probe: the child generated the same tokens recomputed, from a local hit and restored", same,
               lambda g: all(r.output_token_ids == g[0].output_token_ids for r in g),
               lambda g: f"{g[0].model} probe {g[0].probe}", "no probe ran two ways"),
    ]


UNIT_TAGGED = ("requests.jsonl", "arms.jsonl", "probes.jsonl", "fleets.jsonl")  # the records a driver's unit tags


def driver_checks(cfg: MultiEngineParams, run: RunFiles) -> list[Check]:
    """``unit_checks`` where the run is a GPU driver's: it has raw/units.jsonl, or any record names a unit (so a
    driver run whose units.jsonl went missing fails them, rather than losing them); none for a notebook's run."""
    tagged = any(r.unit is not None for name in UNIT_TAGGED for r in run.records(name))
    if run.raw_path("units.jsonl") is None and not tagged:
        return []
    return unit_checks(cfg, run, run.records("units.jsonl"))


def unit_checks(cfg: MultiEngineParams, run: RunFiles, done: list[UnitRecord]) -> list[Check]:
    """A GPU driver's run (``gpu.py``, raw/units.jsonl): each planned unit finished ok exactly once, and every record
    counted is one of theirs (a unit that did not finish was set aside in raw/*.unfinished.jsonl, and ran again)."""
    times = Counter(u.unit for u in done if u.status == "ok")
    ok = set(times)
    tagged = [(name, r) for name in UNIT_TAGGED for r in run.records(name)]
    return [
        all_of("GPU driver: every unit (fleet start) finished ok once", [u.name for u in units(cfg)],
               lambda name: times[name] == 1,
               lambda name: f"{name}: finished ok {times[name]} times", "no units planned"),
        all_of("GPU driver: every record counted comes from a unit that finished ok", tagged, lambda x: x[1].unit in ok,
               lambda x: f"{x[0]}: a record of unit {x[1].unit}", "no records"),
    ]


def checks(run: RunFiles) -> list[Check]:
    """Every statement section 22 makes about a run, from its raw records and parameters."""
    run = as_files(run)
    cfg = run.params
    rows, arms, fleets = run.records("requests.jsonl"), run.records("arms.jsonl"), run.records("fleets.jsonl")
    orders = run.records("orders.jsonl")
    return (workload_checks(cfg, rows, arms) + completion_checks(cfg, rows, arms) + agreement_checks(cfg, rows, arms)
            + cache_checks(cfg, rows, arms) + routing_checks(cfg, rows, arms)
            + byte_checks(cfg, rows, arms, run.records("probes.jsonl"))
            + probe_checks(cfg, run.records("probes.jsonl")) + process_checks(cfg, fleets, bool(orders))
            + order_checks(cfg, orders, rows, arms) + figure_checks(run, rows, arms)
            + driver_checks(cfg, run))


def counts(run: RunFiles) -> dict[str, int | str]:
    """Deterministic facts of the run (the smoke golden pins them); nothing timing-dependent."""
    run = as_files(run)
    cfg = run.params
    rows, arms, fleets = run.records("requests.jsonl"), run.records("arms.jsonl"), run.records("fleets.jsonl")
    out: dict[str, int | str] = {"engines": cfg.NUM_ENGINES, "traces": len(arms), "fleets closed":
                                 sum(f.status == "closed" for f in fleets)}
    for policy in cfg.POLICIES:
        mine = [r for r in rows if r.policy == policy]
        out[f"{policy}: requests ok / recorded"] = f"{sum(r.status == 'ok' for r in mine)} / {len(mine)}"
        out[f"{policy}: prompt tokens"] = sum(r.num_prompt_tokens for r in mine)
        out[f"{policy}: output tokens"] = sum(r.num_output_tokens for r in mine)
    out["recompute: cached tokens"] = sum(r.num_cached_tokens or 0 for r in rows if r.policy == "recompute")
    out["probe children"] = len(run.records("probes.jsonl"))
    return out


def measured_lines(run) -> list[str]:
    """Strict statements reported as measurements, never a pass or a fail: device reads against the hook."""
    rows = [t for t in report.bytes_table(run.records("arms.jsonl"), run.records("requests.jsonl"))
            if t["l2_read_bytes_hook"] is not None and t["l2_read_bytes_device"] is not None]
    out = []
    for t in rows:
        device, hook = t["l2_read_bytes_device"], t["l2_read_bytes_hook"]
        out.append(f"{t['model']} trace {t['repeat']}: the server's device counter read {device:,} bytes, the byte hook "
                   f"{hook:,} (device - hook = {device - hook:+,})")
    return out

