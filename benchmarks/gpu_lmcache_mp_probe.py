"""Probe of the LMCache server path on one engine and one server: prints figures, judges nothing.

    python3 benchmarks/gpu_lmcache_mp_probe.py [--profile gpu|cpu] [--out DIR]

On the H200 (vLLM 0.26.0 + LMCache 0.5.3, the stage of ../shared/device/README.md):

    sh .device-stage/call2/install.sh && . /tmp/site/env.sh && timeout 300 python3 benchmarks/gpu_lmcache_mp_probe.py --out $OUT

What it does, all through the library the sections use:
  1. the machine's topology (``base.topology``) and package versions;
  2. ``kmesh_lib.lmcache.launcher`` starts a ``lmcache server`` on 127.0.0.1 (L1 512 MiB arena, ``fs``
     L2 with O_DIRECT, ``--l2-store-policy skip_l1``) with kmesh's hooks; vLLM with
     ``LMCacheMPConnector`` (``gpu_memory_utilization`` sized from the free GPU memory) stores the
     shared context (gpu profile: 4,096 tokens of the Qwen2.5-0.5B shape = 48 MiB, dummy weights);
     the L1 arena's bytes and the disk tier's file bytes are printed after the store;
  3. section 16's groups (``workloads.context_groups.Block.run_group``): retain and discard on the
     one server through the retention switch, N = 4 and 8, follow-ups together / 2 ms apart / one
     token step apart; per group the disk bytes of the preparation and follow-up phases by the
     three counts (server ``/proc/<pid>/io``, the adapter hook, LMCache's metrics) and what each
     follow-up's lookup did (``lmcache.lookups``);
  4. section 20's on-arrival groups (no warm-up, retention on, vLLM's prefix cache reset) with the
     singleflight off and on, N = 4 and 8, follow-ups together;
  5. cleanup: engine and server stopped, and no server process, SHM segment or disk-tier file left.

Writes ``probe.jsonl`` (one line per record) and ``probe.log`` under ``--out``. Ends with ``os._exit``
(LMCache 0.5.3 leaves non-daemon threads behind).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MIB = 1 << 20


class Out:
    def __init__(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = open(out_dir / "probe.jsonl", "a", buffering=1)

    def rec(self, kind: str, **data) -> None:
        self.jsonl.write(json.dumps({"kind": kind, **data}, default=str) + "\n")

    def say(self, msg: str) -> None:
        print(msg, flush=True)


def gpu_memory_utilization(min_gib: float = 10.0) -> float:
    """A fraction of the GPU's total memory that the free memory can hold (at least ``min_gib``)."""
    import torch

    free, total = torch.cuda.mem_get_info()
    want = min_gib * (1 << 30)
    if free < want + (1 << 30):
        raise SystemExit(f"only {free / (1 << 30):.1f} GiB of {total / (1 << 30):.1f} GiB GPU memory free; "
                         f"the probe needs {min_gib + 1:.0f} GiB")
    return round(want / total, 3)


def phase_line(g: dict, phase: str) -> str:
    r = g[f"{phase}_reads"]
    return (f"{phase} dev {r['device_bytes'] / MIB:.1f} hook {r['hook_bytes'] / MIB:.1f} "
            f"metrics {r['metric_bytes'] / MIB:.1f} MiB agree={r['agree']}")


def section16_groups(cfg, out: Out, engine, tier, workload, pairs: int) -> None:
    from kmesh_lib.workloads.context_arms import ARMS, pair_order
    from kmesh_lib.workloads.context_groups import Block
    from kmesh_lib.workloads.context_params import ArrivalPattern

    for n in (4, 8):
        blk = Block(cfg, "mp", n, log=out.say)
        blk.engine, blk.tier, blk.workload = engine, tier, workload
        for a_index, arrival in enumerate(("together", "2ms", "1step")):
            pattern = ArrivalPattern.parse(arrival)
            for p in range(pairs):
                pair = n * 1000 + a_index * 100 + p  # distinct suffixes per group (Workload seeds by pair)
                for order, arm in enumerate(pair_order(("retain", "discard"), p)):
                    g = blk.run_group(ARMS[arm], pair, order, measured=p > 0, arrival=pattern)
                    out.rec("group16", **g)
                    s = g.get("followup_lookup_summary", {})
                    out.say(f"16 N={n} {arrival:8s} {arm:7s} {g['status']:9s} A {g['ttft_a_s'] * 1e3:6.1f} ms "
                            f"all {g['makespan_s'] * 1e3:6.1f} ms | {phase_line(g, 'prep')} | {phase_line(g, 'followup')} "
                            f"| reads/follow-up {g.get('followup_disk_reads')} {s.get('by_mechanism')} "
                            f"submit {g['submit_ms']} L1 at follow-ups {g['memory_tier_bytes_at_followups'] / MIB:.0f} MiB")


def on_arrival_groups(cfg, out: Out, engine, tier, workload, chunk_bytes: int) -> None:
    from kmesh_lib.lmcache.disk_accounting import PhaseReads
    from kmesh_lib.lmcache.lookups import READS, summarize
    from kmesh_lib.workloads.context_groups import run_arrivals
    from kmesh_lib.workloads.context_params import ArrivalPattern

    for rep in range(2):
        for n in (4, 8):
            for sf in (False, True):
                if not engine.reset_prefix_cache():
                    raise RuntimeError("vLLM refused to reset its prefix cache")
                tier.drop_memory_copy()
                tier.set_retention(True)
                tier.set_singleflight(sf)
                tier.settle()
                a = tier.meter.snapshot()
                specs = workload.followups(f"oa{rep}-N{n}-sf{int(sf)}", 50_000 + rep, n)
                res = run_arrivals(engine, specs, ArrivalPattern())
                engine.drain()
                tier.settle()
                b = tier.meter.snapshot()
                reads = PhaseReads.between(a, b, chunk_bytes)
                roles = {s.request_id: s.request_id.rsplit("-", 1)[-1] for s in specs}
                lks = tier.lookups(a, b, roles)
                t0 = res[0].t_submit_ns
                rec = {"n": n, "singleflight": sf, "rep": rep, "reads": reads.to_dict(),
                       "first_token_ms": [round((r.t_token_ns[0] - t0) / 1e6, 2) for r in res],
                       "makespan_ms": round((max(r.t_token_ns[-1] for r in res) - t0) / 1e6, 2),
                       "num_cached_tokens": [r.num_cached_tokens for r in res],
                       "lookups": [lk.to_dict(t0) for lk in lks], "summary": summarize(lks),
                       "disk_reads_per_followup": {lk.role: int(lk.mechanism in READS) for lk in lks}}
                out.rec("on_arrival", **rec)
                out.say(f"20 on-arrival N={n} singleflight={'on ' if sf else 'off'} dev {reads.device_bytes / MIB:.1f} "
                        f"hook {reads.hook_bytes / MIB:.1f} metrics {reads.metric_bytes / MIB:.1f} MiB "
                        f"agree={reads.agree()} | A {rec['first_token_ms'][0]} ms all-first {max(rec['first_token_ms'])} ms "
                        f"makespan {rec['makespan_ms']} ms | cached {rec['num_cached_tokens']} | "
                        f"{rec['summary']['by_mechanism']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="gpu")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/kmesh-probe"))
    ap.add_argument("--pairs", type=int, default=2, help="pairs per (N, arrival) in the section 16 groups")
    args = ap.parse_args()
    out = Out(Path(args.out))
    t_start = time.monotonic()

    from importlib.metadata import version

    from kmesh_lib.app import registry as sections
    from kmesh_lib.base import topology
    from kmesh_lib.base.params import resolve_params
    from kmesh_lib.base.processes import RUNTIME_ROOT, RuntimeDir, group_alive, listening_sockets
    from kmesh_lib.engine.requests import run_group
    from kmesh_lib.engine.vllm_engine import make_engine
    from kmesh_lib.lmcache.connect import MPTier, keep_engine_rendezvous_local
    from kmesh_lib.lmcache.disk_accounting import dir_bytes
    from kmesh_lib.workloads.context_groups import Workload

    cfg, _, _ = resolve_params(sections.get("16"), args.profile, [], ["PATHS=[mp]"])
    versions = {p: version(p) for p in ("vllm", "lmcache", "torch", "psutil", "prometheus_client")
                if _has(p)}
    out.rec("env", versions=versions, profile=args.profile, model=cfg.MODEL, context_tokens=cfg.CONTEXT_TOKENS)
    out.say(f"versions {versions}")
    runtime = RuntimeDir.create("probe-mp", root=RUNTIME_ROOT)
    topo = topology.describe(runtime.path)
    out.rec("topology", **topo, striped=topology.striped_store(topo))
    out.say(f"topology: nvme={topo['nvme_count']} devices={[d['name'] for d in topo['block_devices'] if not d['virtual']]} "
            f"md={ {k: topo['md'][k] for k in ('raid0_personality', 'mdadm', 'root')} } disk tier {topo.get('disk_tier')}")
    out.say(f"gpu pcie: {topo['gpu_pcie']}")
    out.say(f"striped row: {topology.striped_store(topo)}")

    llm_kwargs = {}
    if cfg.DEVICE == "cuda":
        llm_kwargs["gpu_memory_utilization"] = gpu_memory_utilization()
    tier, engine, pgid = MPTier(cfg.ARENA_MIB, cfg.CHUNK_SIZE, runtime, device=cfg.DEVICE), None, None
    try:
        t0 = time.monotonic()
        tier.start()
        pgid = tier.server.pid
        out.say(f"server up in {time.monotonic() - t0:.1f} s via {tier.server.command()[:3]}: {tier.describe()} "
                f"listeners {tier.server.listeners()}")
        out.rec("server", describe=tier.describe(), listeners=tier.server.listeners(), start_s=time.monotonic() - t0)
        keep_engine_rendezvous_local()
        t0 = time.monotonic()
        engine = make_engine(dataclasses.replace(cfg, MAX_NUM_SEQS=max(cfg.MAX_NUM_SEQS, 9)),
                             **tier.llm_kwargs(cfg.DEVICE), **llm_kwargs)
        out.say(f"engine up in {time.monotonic() - t0:.1f} s ({llm_kwargs}); engine listeners "
                f"{listening_sockets(pids=[os.getpid()])}")
        workload = Workload(cfg, engine.spec.config["vocab_size"])
        kv_token = engine.spec.kv_bytes_per_token(cfg.DTYPE)
        ctx_bytes, chunk_bytes = cfg.CONTEXT_TOKENS * kv_token, cfg.CHUNK_SIZE * kv_token

        # -- the store: the context on the disk tier only --
        tier.set_retention(False)
        s0 = tier.meter.snapshot()
        t0 = time.monotonic()
        run_group(engine, [workload.store_request()])
        engine.drain()
        tier.settle()
        s1 = tier.meter.snapshot()
        store = {"context_bytes": ctx_bytes, "bytes_written_hook": s1.hook_write_bytes - s0.hook_write_bytes,
                 "l1_bytes_after_store": s1.memory_tier_bytes, "disk_tier_file_bytes": dir_bytes(tier.disk_dir),
                 "seconds": round(time.monotonic() - t0, 3)}
        out.rec("store", **store)
        out.say(f"store: context {ctx_bytes / MIB:.1f} MiB, written {store['bytes_written_hook'] / MIB:.1f} MiB, "
                f"L1 after store {store['l1_bytes_after_store']} B, "
                f"disk-tier files {store['disk_tier_file_bytes'] / MIB:.1f} MiB "
                f"({store['disk_tier_file_bytes']} B) in {store['seconds']} s")
        tier.drop_memory_copy()

        section16_groups(cfg, out, engine, tier, workload, args.pairs)
        on_arrival_groups(cfg, out, engine, tier, workload, chunk_bytes)
    except BaseException:  # noqa: BLE001 - report, clean up, exit
        traceback.print_exc()
        out.rec("error", traceback=traceback.format_exc())
    finally:
        if engine is not None:
            try:
                engine.close()
            except Exception:  # noqa: BLE001
                traceback.print_exc()
        tier.close()
        shm = list(Path("/dev/shm").glob(f"*{tier.server.shm_name}*"))
        left = {"server_alive": pgid is not None and group_alive(pgid), "runtime_dir": runtime.path.exists(),
                "shm": [p.name for p in shm]}
        out.rec("cleanup", **left)
        out.say(f"cleanup: {left}; probe took {time.monotonic() - t_start:.0f} s")
    return 0


def _has(dist: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(dist)
        return True
    except PackageNotFoundError:
        return False


if __name__ == "__main__":
    try:
        code = main()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
