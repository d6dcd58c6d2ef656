"""Section 20 on a CUDA GPU: the measuring half, self-contained (no papermill, pandas or matplotlib).

On the H200 device machine (vLLM 0.26.0 + LMCache 0.5.3, in-process LMCacheConnectorV1; the stage
and its two steps are in ../shared/device/README.md), from the repo root:

    sh .device-stage/call2/install.sh && . /tmp/site/env.sh && \\
        timeout 540 python3 -m kmesh_lib.sections.prefetch.gpu --out $OUT/prefetch-gpu [--set KEY=VALUE ...]

Every engine run is a child process (LMCache 0.5.3 keeps a process-wide config singleton and
leaves non-daemon threads behind: each child ends with ``os._exit``). The children are pipelined:
child r+1 starts once child r holds ``gpu.lock`` and spends its ~25 s of Python imports while
child r measures; it takes the lock (engine start, measurement) only when child r has exited. So
the GPU, the disk tier and the engine belong to one run at a time; only CPU-side imports overlap.
The pilot's lead is written to ``lead-<path>-N<n>.json``; a child finding none runs the pilot.

Resumable: rerun with the same ``--out`` (and the same --set) and finished engine runs (status ok
in raw/blocks.jsonl) are skipped; the groups of an unfinished run are set aside in
raw/groups.unfinished.jsonl, so a crash loses at most the engine run in flight. Back here:

    sh scripts/import_device_run.sh ...   or   kmesh run 20 --profile gpu --set SOURCE_RUN=<dir>
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kmesh_lib.base import params as params_mod
from kmesh_lib.base.params import build, resolve_params
from kmesh_lib.base.records import RunRecord, read_jsonl
from kmesh_lib.sections import prefetch as prefetch_section
from kmesh_lib.sections.prefetch import stats as ps
from kmesh_lib.sections.prefetch.experiment import PrefetchParams
from kmesh_lib.sections.prefetch.protocol import run_engine

GPU_PHASE = "GPU_PHASE"      # a child prints this once it holds gpu.lock: the parent may start the next


def lead_file(run_dir: Path, path: str, n: int) -> Path:
    return run_dir / f"lead-{path}-N{n}.json"


def child(run_dir: Path, path: str, n: int, r: int) -> int:
    # The heavy imports, done while the previous run measures (our modules import these lazily).
    import lmcache.v1.cache_engine  # noqa: F401
    import yaml
    from vllm import LLM  # noqa: F401
    from vllm.distributed.kv_transfer.kv_connector.v1 import lmcache_connector  # noqa: F401

    cfg = build(PrefetchParams, yaml.safe_load((run_dir / "params.resolved.yaml").read_text()))
    lock = open(run_dir / "gpu.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)          # released when this process exits (os._exit)
    print(GPU_PHASE, flush=True)
    lf = lead_file(run_dir, path, n)
    lead = json.loads(lf.read_text())["lead_ms"] if lf.exists() else None
    _, summary = run_engine(cfg, path, n, r, lead, RunRecord(run_dir, "prefetch"), log=lambda m: print(m, flush=True))
    if lead is None and summary.get("status") == "ok":
        lf.write_text(json.dumps({"lead_ms": summary["lead_ms"], "block": summary["block"]}))
    print("SUMMARY " + json.dumps({k: summary.get(k) for k in ("block", "status", "lead_ms", "seconds", "engine_start_s")}),
          flush=True)
    return 0 if summary.get("status") == "ok" else 1


def finished_blocks(run_dir: Path) -> set[str]:
    """Blocks whose engine run ended ok; the groups of any other block are moved aside."""

    raw = run_dir / "raw"
    blocks = read_jsonl(raw / "blocks.jsonl") if (raw / "blocks.jsonl").exists() else []
    done = {b["block"] for b in blocks if b.get("status") == "ok"}
    if (raw / "groups.jsonl").exists():
        groups = read_jsonl(raw / "groups.jsonl")
        keep = [g for g in groups if g["block"] in done]
        if len(keep) < len(groups):
            with open(raw / "groups.unfinished.jsonl", "a") as f:
                f.writelines(json.dumps(g) + "\n" for g in groups if g["block"] not in done)
            (raw / "groups.jsonl").write_text("".join(json.dumps(g) + "\n" for g in keep))
        if blocks and len(done) < len(blocks):
            (raw / "blocks.jsonl").write_text("".join(json.dumps(b) + "\n" for b in blocks if b["block"] in done))
    return done


class Pipeline:
    """At most two children: one holding the GPU, the next importing (then waiting on gpu.lock)."""

    def __init__(self, run_dir: Path, run_timeout: float, t0: float) -> None:
        self.run_dir, self.run_timeout, self.t0 = run_dir, run_timeout, t0
        self.live: list[tuple[str, subprocess.Popen, Path, float]] = []
        self.failed: list[str] = []
        (run_dir / "logs").mkdir(exist_ok=True)

    def start(self, path: str, n: int, r: int) -> None:
        block = f"{path}-N{n}-r{r}"
        log = self.run_dir / "logs" / f"{block}.log"
        with open(log, "w") as f:
            proc = subprocess.Popen([sys.executable, "-m", "kmesh_lib.sections.prefetch.gpu", "--out", str(self.run_dir),
                                     "--child", path, str(n), str(r)], stdout=f, stderr=subprocess.STDOUT)
        self.live.append((block, proc, log, time.monotonic()))
        print(f"== {block} started ({time.monotonic() - self.t0:.0f} s)", flush=True)

    def wait_gpu_phase(self) -> None:
        """Until the newest child holds the lock (or has ended)."""
        block, proc, log, _ = self.live[-1]
        while proc.poll() is None and GPU_PHASE not in log.read_text(errors="replace"):
            self.reap(block_until_done=False)
            time.sleep(0.5)

    def reap(self, block_until_done: bool) -> None:
        for item in list(self.live):
            block, proc, log, started = item
            if block_until_done:
                try:
                    proc.wait(timeout=max(1.0, self.run_timeout - (time.monotonic() - started)))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            elif proc.poll() is None:
                if time.monotonic() - started > self.run_timeout:
                    proc.kill()
                    proc.wait()
                else:
                    continue
            self.live.remove(item)
            text = log.read_text(errors="replace")
            summary = [line for line in text.splitlines() if line.startswith("SUMMARY ")]
            print(summary[-1] if summary else f"{block}: no summary", flush=True)
            if proc.returncode != 0:
                self.failed.append(block)
                print(f"{block} failed ({proc.returncode}):\n{text[-3000:]}", flush=True)


def summarize(cfg, run_dir: Path, record) -> bool:
    """Tables and checks over every finished group in ``run_dir`` (all engine runs, all calls)."""

    raw = run_dir / "raw"
    groups = read_jsonl(raw / "groups.jsonl") if (raw / "groups.jsonl").exists() else []
    record.save("engine_runs", read_jsonl(raw / "blocks.jsonl") if (raw / "blocks.jsonl").exists() else [])
    record.save("pilot_readiness", ps.pilot_table(groups))
    record.save("all_cases", ps.all_cases(groups, cfg.BOOTSTRAP_RESAMPLES, cfg.SEED))
    record.save("placement", ps.placement(groups, cfg.BOOTSTRAP_RESAMPLES, cfg.SEED))
    ok = True
    for name, good, detail in ps.invariants(groups):
        record.save_check(name, good, detail)
        ok &= good
        print(f"check: {name}: {good} {detail}")
    for row in record.results["all_cases"]:
        print(json.dumps(row))
    record.finish()
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", default="gpu")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--child", nargs=3, metavar=("PATH", "N", "RUN"), help=argparse.SUPPRESS)
    ap.add_argument("--run-timeout", type=int, default=400, help="seconds per engine run, lock wait included")
    ap.add_argument("--only", default="", help="group sizes to run now, e.g. 4 (the rest on a later call)")
    ap.add_argument("--stop-after", type=float, default=float("inf"),
                    help="start no engine run after this many seconds (the rest resume on a later call)")
    args = ap.parse_args()
    run_dir = Path(args.out).resolve()
    if args.child:
        p, n, r = args.child
        code = child(run_dir, p, int(n), int(r))
        sys.stdout.flush()
        os._exit(code)

    import yaml


    cfg, _, _ = resolve_params(prefetch_section, args.profile, [], args.set)
    run_dir.mkdir(parents=True, exist_ok=True)
    values = params_mod.to_dict(cfg)
    params_file = run_dir / "params.resolved.yaml"
    if params_file.exists():  # a resumed run (maybe copied to another --out): the same parameters or nothing
        before = {k: v for k, v in yaml.safe_load(params_file.read_text()).items() if k != "RUN_DIR"}
        if before != {k: v for k, v in values.items() if k != "RUN_DIR"}:
            sys.exit(f"{run_dir} holds a run with other parameters: resume with the same --profile/--set, or a new --out")
    params_file.write_text(yaml.safe_dump({**values, "RUN_DIR": str(run_dir)}, sort_keys=True))
    done = finished_blocks(run_dir)
    record = RunRecord.open("prefetch", cfg, str(run_dir), resume=True)  # continues its own unfinished run
    sizes = [int(s) for s in args.only.split(",") if s] or cfg.GROUP_SIZES
    todo = [(p, n, r) for p in cfg.PATHS for n in cfg.GROUP_SIZES if n in sizes for r in range(cfg.ENGINE_RUNS)
            if f"{p}-N{n}-r{r}" not in done]
    print(f"{len(done)} engine runs already finished, {len(todo)} to go", flush=True)
    t0 = time.monotonic()
    pipe = Pipeline(run_dir, args.run_timeout, t0)
    for i, (p, n, r) in enumerate(todo):
        if time.monotonic() - t0 > args.stop_after:
            print(f"stopping: {len(todo) - i} engine runs left for a later call (same --out)", flush=True)
            break
        if pipe.live:
            pipe.wait_gpu_phase()
        pipe.reap(block_until_done=False)
        pipe.start(p, n, r)
    pipe.reap(block_until_done=True)
    ok = summarize(cfg, run_dir, record) and not pipe.failed
    print(f"done in {time.monotonic() - t0:.0f} s; failed runs: {pipe.failed or 'none'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
