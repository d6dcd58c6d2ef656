"""A fleet: NUM_ENGINES engine processes for one model, and for 'shared' one LMCache server.

    RuntimeDir  multi-engine-<pid>-<hex>/     the fleet's run-scoped directory (owner: the router)
        engine<i>.log                         each engine process's own log
        disk/, server.log, l2_io.jsonl        the server's disk tier and logs ('shared' only)

Invariants:
    - every engine process and the server lead their own process groups, recorded in the
      RuntimeDir: ``close()``, the router's exit or signal, or the router's death (the janitor) kills
      them and removes the directory, the disk tier and the server's SHM segment;
    - ``close()`` returns the evidence that this happened (groups gone, directory, disk tier and SHM
      segment removed), measured after the fact, for ``raw/fleets.jsonl``;
    - the server binds 127.0.0.1 only; each engine reports its own listening sockets.
"""
from __future__ import annotations

import glob
import os
import time
from dataclasses import asdict
from pathlib import Path

from kmesh_lib.base.params import to_dict
from kmesh_lib.base.processes import RUNTIME_ROOT, RuntimeDir, group_alive
from kmesh_lib.engine.config import EngineParams
from kmesh_lib.engine.model_spec import materialize, resolve
from kmesh_lib.lmcache.disk_accounting import ServerMeter
from kmesh_lib.lmcache.server import LMCacheServer, ServerConfig, transfer_mode_for
from kmesh_lib.sections.multi_engine.engine_process import EngineProcess
from kmesh_lib.sections.multi_engine.params import MultiEngineParams, kv_bytes_per_token

# Server counters beyond ServerMeter's, summed over label sets (chunks, tokens)
EXTRA_METRICS = {
    "l1_write_chunks": "lmcache_mp_l1_write_chunks_total",
    "l1_read_chunks": "lmcache_mp_l1_read_chunks_total",
    "l1_evicted_chunks": "lmcache_mp_l1_evicted_chunks_total",
    "lookup_hit_tokens": "lmcache_mp_lookup_hit_tokens_total",
    "lookup_requested_tokens": "lmcache_mp_lookup_requested_tokens_total",
}


def server_config(cfg: MultiEngineParams) -> ServerConfig:
    # On CUDA the worker's transfer mode resolves to LMCache-driven CUDA IPC and must not be forced
    # to engine_driven (the device README); the CPU worker needs engine_driven.
    return ServerConfig(arena_mib=cfg.ARENA_MIB, chunk_size=cfg.CHUNK_SIZE, store_policy=cfg.STORE_POLICY,
                        transfer_mode=transfer_mode_for(cfg.DEVICE))


def stored_tokens(cfg: MultiEngineParams) -> int:
    """An upper bound on the tokens the server stores over the run: every family's parent (input +
    output) and each child's own tokens, every unrelated request, per repeat; and the probes."""
    family = cfg.PARENT_TOKENS + cfg.MAX_TOKENS + cfg.NUM_CHILDREN * (cfg.CHILD_SUFFIX_TOKENS + cfg.MAX_TOKENS)
    trace = cfg.NUM_FAMILIES * family + cfg.NUM_NOISE * (cfg.NOISE_TOKENS + cfg.MAX_TOKENS)
    return cfg.NUM_REPEATS * trace + cfg.NUM_PROBES * family


def visible_gpus() -> list[str]:
    """GPU ids this process may use, without importing torch (CUDA_VISIBLE_DEVICES or /dev/nvidia*)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip()]
    return sorted((Path(p).name[len("nvidia"):] for p in glob.glob("/dev/nvidia[0-9]*")), key=int)


def placement(cfg: MultiEngineParams) -> list[dict]:
    """Per engine: its environment (one GPU each where several are lent) and its share of that
    device's free memory (cuda) or of the host's cores (cpu)."""
    n = cfg.NUM_ENGINES
    if cfg.DEVICE == "cuda":
        gpus = visible_gpus() or ["0"]
        on = [gpus[i % len(gpus)] for i in range(n)]
        return [{"env": {"CUDA_VISIBLE_DEVICES": g} if len(gpus) > 1 else {}, "gpu": g,
                 "memory_share": 1 / on.count(g), "threads": None} for g in on]
    threads = max(1, (os.cpu_count() or 1) // n)  # n engines on the host's cores, not n x all of them
    return [{"env": {"OMP_NUM_THREADS": str(threads)}, "gpu": None, "memory_share": 1 / n, "threads": threads}
            for _ in range(n)]


def engine_values(cfg: MultiEngineParams, model: str) -> dict:
    values = {k: v for k, v in to_dict(cfg).items() if k in EngineParams.__dataclass_fields__}
    return {**values, "MODEL": model}


def server_snapshot(meter: ServerMeter) -> dict:
    """ServerMeter's counts (disk-tier bytes by hook and device, /metrics) plus EXTRA_METRICS."""
    from prometheus_client.parser import text_string_to_metric_families

    snap = asdict(meter.snapshot())
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(meter.server.metrics_text()):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    snap["metrics"].update({k: sums.get(name, 0.0) for k, name in EXTRA_METRICS.items()})
    return snap


class Fleet:
    def __init__(self, cfg: MultiEngineParams, model: str, with_server: bool, log=print) -> None:
        self.cfg, self.model, self.with_server, self.log = cfg, model, with_server, log
        self.kind = "shared" if with_server else "local"
        self.runtime: RuntimeDir | None = None
        self.server: LMCacheServer | None = None
        self.meter: ServerMeter | None = None
        self.engines: list[EngineProcess] = []
        self.info: dict = {"model": model, "fleet": self.kind, "status": "starting"}

    def start(self) -> Fleet:
        cfg = self.cfg
        self.runtime = RuntimeDir.create("multi-engine", root=Path(cfg.DISK_TIER_ROOT or RUNTIME_ROOT))
        t0 = time.monotonic()
        server_extra = None
        if self.with_server:
            from kmesh_lib.kv.disk_tier import check_disk_tier

            self.server = LMCacheServer(server_config(cfg), self.runtime)
            kvt = kv_bytes_per_token(cfg, self.model)
            self.info["disk_tier"] = check_disk_tier(self.server.disk_dir, cfg.CHUNK_SIZE * kvt, stored_tokens(cfg) * kvt)
            self.server.start()
            self.meter = ServerMeter(self.server)
            server_extra = self.server.connector_extra_config()
            self.info["server"] = {"pid": self.server.pid, "listeners": [f"{a}:{p}" for a, p in self.server.listeners()],
                                   "start_s": round(time.monotonic() - t0, 2), "arena_mib": cfg.ARENA_MIB,
                                   "store_policy": cfg.STORE_POLICY, "chunk_size": cfg.CHUNK_SIZE}
        # The engines would otherwise race to write the same seeded checkpoint on first use.
        materialize(resolve(self.model), cfg.WEIGHTS, cfg.DTYPE, cfg.SEED)
        places = placement(cfg)
        for i, p in enumerate(places):
            spec = {"engine": engine_values(cfg, self.model), "server": server_extra, "threads": p["threads"], "env": p["env"]}
            self.engines.append(EngineProcess(i, self.runtime, spec).start())
        for e in self.engines:  # every engine imports vLLM at once, then each builds
            e.expect("imported", cfg.ENGINE_START_TIMEOUT_S)
        for e, p in zip(self.engines, places):
            e.conn.send({"op": "build", "memory_share": p["memory_share"]})
        for e, p in zip(self.engines, places):
            e.ready = e.expect("ready", cfg.ENGINE_START_TIMEOUT_S)
            e.ready.update(gpu=p["gpu"], memory_share=p["memory_share"])
        self.info.update(status="ready", start_s=round(time.monotonic() - t0, 2),
                         engines=[{"engine": e.index, **e.ready} for e in self.engines])
        return self

    def reset(self) -> list[dict]:
        """Drains every live engine and resets its prefix cache: each policy starts on empty pools."""
        return [{"engine": e.index, **e.reset()} if e.alive() else {"engine": e.index, "ok": False, "dead": True}
                for e in self.engines]

    def snapshot(self) -> dict | None:
        if self.server is None:
            return None
        self.settle()
        return server_snapshot(self.meter)

    def settle(self, timeout_s: float = 60.0) -> None:
        """Waits until the server has no store or prefetch in flight (its /status queues are empty)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                sm = self.server.status()["storage_manager"]
                pc, sc = sm["prefetch_controller"], sm["store_controller"]
                if not (pc["in_flight_request_count"] or pc["pending_queue_size"] or pc["submission_queue_size"]
                        or sc["pending_keys_count"] or sc["in_flight_task_count"]):
                    return
            except (KeyError, TypeError, OSError):  # a server whose /status lacks these queues
                time.sleep(1.0)
                return
            time.sleep(0.05)

    def close(self) -> dict:
        """Stops the engines and the server, removes the runtime directory; returns the evidence."""
        stops = [e.stop() for e in self.engines if e.proc is not None]
        shm = None
        server_pid = self.server.pid if self.server is not None and self.server.proc is not None else None
        disk_files = len([p for p in self.server.disk_dir.rglob("*") if p.is_file()]) if self.server else None
        if self.server is not None:
            shm = Path("/dev/shm") / f"lmcache_l1_pool_{self.server.shm_name}"
            self.server.stop()  # kills the server's group, then closes the runtime dir
        if self.runtime is not None:
            self.runtime.close()
        groups = [s["pid"] for s in stops] + ([server_pid] if server_pid else [])
        self.info.update(status="closed", stops=stops, cleanup={
            "engine_groups_gone": all(not group_alive(s["pid"]) for s in stops) if stops else None,
            "server_group_gone": (not group_alive(server_pid)) if server_pid else None,
            "runtime_dir_removed": (not self.runtime.path.exists()) if self.runtime else None,
            "disk_tier_files_at_close": disk_files,
            "disk_tier_files_left": (len(list(self.server.disk_dir.rglob("*"))) if self.server.disk_dir.exists() else 0)
            if self.server else None,
            "shm_segment_removed": (not shm.exists()) if shm is not None else None,
            "pgids": groups})
        return self.info
