"""Engine runs as pipelined child processes: how the GPU drivers of sections 16 and 20 measure.

Every engine run is a child process (LMCache 0.5.3 keeps process-wide state and leaves non-daemon
threads behind: each child ends with ``os._exit``). The children are pipelined:

    child r     holds ``gpu.lock``: engine start, store, every group, close    (the GPU phase, until
                it exits: vLLM asserts that no other process frees GPU memory while it profiles at
                start, so the next engine starts only once this process and its server are gone)
    child r+1   spawns its lmcache server, imports vLLM/LMCache, then waits for ``gpu.lock``

so the next run's imports and server boot overlap this run's measurement, while the GPU and the
engine belong to one run at a time (a waiting server is idle: it has no engine yet; each run has
a disk tier of its own). A child prints
``GPU_PHASE`` once it holds the lock; the parent starts the next child then.

Resumable: a run folder's ``raw/blocks.jsonl`` says which engine runs finished. Only a summary
with status ``ok`` (or a recorded outcome that is not a failure: ``not available``, ``disk_full``)
is finished; a run that raised (``failed``), was killed, or never wrote a summary is run again, its
summary moved to ``raw/blocks.unfinished.jsonl`` and its groups to ``raw/groups.unfinished.jsonl``
(kept, never counted). So a call that runs out of time loses at most the engine runs in flight.

Time: ``Pipeline(budget_s=...)`` starts a child only when it can end within the budget: the
child starts after the one holding the GPU ends, so it needs about two run lengths (the median GPU
phase seen so far in this call, never less than ``run_estimate_s``). A child whose GPU phase
outlasts ``run_timeout_s`` is killed (its server and disk tier go with its process group's
janitor) and counts as unfinished.

Section 21's driver (``sections.crossover.gpu``) runs its (model, tier) children one at a time (``overlap=False``:
a child's imports and server boot would load the host whose first tokens another measures), each unit named by its
records' model and tier. Section 22's driver (``sections.multi_engine.gpu``) runs its units one at a time (``overlap=False``: a
fleet's own start would load the host another fleet measures on) and stops at the first that fails (its traces
must run in their drawn order); its units are fleet starts, set aside by ``set_aside_unfinished`` like engine runs.

A driver (``sections.retention.gpu``, ``sections.prefetch.gpu``) is its children and its own flags around
the parts here: ``driver_parser`` -> ``prepare`` -> ``record_not_available`` -> ``Pipeline.run`` ->
``check_run`` -> ``verdict``, inside ``exit_driver``.
"""
from __future__ import annotations

import argparse
import fcntl
import importlib
import json
import os
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kmesh_lib.base import params as params_mod
from kmesh_lib.base.checks import show
from kmesh_lib.base.paths import repo_relative
from kmesh_lib.base.records import RunRecord, read_capture

GPU_PHASE = "GPU_PHASE"  # a child prints this once it holds gpu.lock: the parent may start the next
FINISHED = ("ok", "not available", "disk_full")  # recorded outcomes; anything else is run again


def preimport(modules=("lmcache.v1.cache_engine", "vllm",
                       "vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector")) -> None:
    """The heavy imports, done while the previous run measures (kmesh imports these lazily)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:  # a module this vLLM/LMCache lacks: the run imports what it needs itself
            pass


def hold_gpu(run_dir: Path):
    """Blocks until this process holds ``gpu.lock`` (released when the process exits), then says so."""
    lock = open(Path(run_dir) / "gpu.lock", "w")  # noqa: SIM115 - held until os._exit
    fcntl.flock(lock, fcntl.LOCK_EX)
    print(GPU_PHASE, flush=True)
    return lock


def _write_jsonl(path: Path, records: list[dict], mode: str = "w", header: dict | None = None) -> None:
    """Writes (or appends) records; a file that starts here starts with the capture's schema header, where the
    capture it came from had one (``base.captures``)."""
    with open(path, mode) as f:
        if header is not None and f.tell() == 0:
            f.write(json.dumps(header) + "\n")
        f.writelines(json.dumps(r) + "\n" for r in records)


def set_aside_unfinished(run_dir: Path, summaries: str = "blocks.jsonl", key: str | tuple[str, ...] = "block",
                         parts: tuple[str, ...] = ("groups.jsonl",), finished: tuple[str, ...] = FINISHED) -> set:
    """The units (``key`` of a summary in ``raw/<summaries>``) that finished, status in ``finished``; every record
    of any other unit moves aside.

    A summary that is ``failed`` (it raised) or ``running`` (never ended), a unit with no summary
    (killed) and the records of all of these in ``parts`` (each tagged with ``key``) move to
    ``raw/*.unfinished.jsonl``: they are kept, never counted, and the unit is measured again.
    A ``key`` of several fields (section 21's records name their unit by model and tier) names a unit by
    the tuple of their values.
    """
    unit = (lambda r: tuple(r.get(k) for k in key)) if isinstance(key, tuple) else (lambda r: r.get(key))
    raw = Path(run_dir) / "raw"
    read = {name: read_capture(raw / name) for name in (summaries, *parts) if (raw / name).exists()}
    done = {unit(u) for u in read.get(summaries, (None, [], []))[2] if u.get("status") in finished}
    for name, (header, _, records) in read.items():
        unfinished = [r for r in records if unit(r) not in done]
        if unfinished:
            aside = raw / name.replace(".jsonl", ".unfinished.jsonl")
            _write_jsonl(aside, unfinished, "a", header)
            _write_jsonl(raw / name, [r for r in records if unit(r) in done], "w", header)
    return done


def finished_blocks(run_dir: Path) -> set[str]:
    """Engine runs that finished (``set_aside_unfinished`` over ``raw/blocks.jsonl`` and ``raw/groups.jsonl``);
    ``lead-*.json`` files chosen by an unfinished run are removed too."""
    done = set_aside_unfinished(run_dir)
    for lf in Path(run_dir).glob("lead-*.json"):  # a lead chosen by a run that did not finish is not a result
        if json.loads(lf.read_text()).get("block") not in done:
            lf.unlink()
    return done


def prepare(section, out: Path, profile: str, overrides: list[str], finished=finished_blocks):
    """The run folder for this call: new, or resumed with the same parameters (unfinished runs set aside by
    ``finished(out)``, which names the units that finished).

    Returns (params, the run's record, the names of the engine runs that finished in earlier calls).
    """
    cfg, _, _ = params_mod.resolve_params(section, profile, [], overrides)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    values = {**params_mod.to_dict(cfg), "RUN_DIR": repo_relative(out)}
    params_file = out / "params.resolved.yaml"
    if params_file.exists():  # a resumed run (maybe copied to another --out): the same parameters or nothing
        before = params_mod.current_names(yaml.safe_load(params_file.read_text()))
        if {k: v for k, v in before.items() if k != "RUN_DIR"} != {k: v for k, v in values.items() if k != "RUN_DIR"}:
            raise SystemExit(f"{out} holds a run with other parameters: resume with the same --profile/--set, or a new --out")
    params_file.write_text(yaml.safe_dump(values, sort_keys=True))
    done = finished(out)
    return cfg, RunRecord.open(section.KEY, cfg, str(out), resume=True), done  # continues its own run


def load_params(section, run_dir: Path):
    """A child's parameters: the run folder's ``params.resolved.yaml``, validated again."""
    values = yaml.safe_load((Path(run_dir) / "params.resolved.yaml").read_text())
    return params_mod.build(section.Params, params_mod.current_names(values))


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log: Path
    started: float
    gpu_since: float | None = None


@dataclass
class Pipeline:
    """At most two children: one holding the GPU, the next importing (then waiting on gpu.lock).

    Args:
        run_dir: the run folder (``logs/<name>.log`` per child, ``gpu.lock``).
        budget_s: start no child that could not end within this many seconds of ``t0``.
        run_estimate_s: a GPU phase's length before this call has seen one end (and the least any item's estimate is).
        run_timeout_s: a GPU phase longer than this is killed.
        overlap: False: one child at a time, the next started once the last ended (a child whose own start
            would load the host while another measures: section 22's fleets).
        stop_on_failure: start nothing after a child that failed (units that must run in their order).
    """

    run_dir: Path
    budget_s: float = float("inf")
    run_estimate_s: float = 60.0
    run_timeout_s: float = 400.0
    margin_s: float = 20.0
    overlap: bool = True
    stop_on_failure: bool = False
    t0: float = field(default_factory=time.monotonic)
    say: object = print
    live: list[Child] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    phases: list[float] = field(default_factory=list)  # GPU-phase seconds of the children that ended

    def __post_init__(self) -> None:
        (Path(self.run_dir) / "logs").mkdir(parents=True, exist_ok=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def estimate(self, own_s: float | None = None) -> float:
        """A GPU phase's length: the item's own estimate where it has one (units of different sizes), else the
        median of those seen in this call (a first run with a pilot is longer than the rest); never below
        ``run_estimate_s``."""
        if own_s is not None:
            return max(self.run_estimate_s, own_s)
        if not self.phases:
            return self.run_estimate_s
        seen = sorted(self.phases)
        return max(self.run_estimate_s, seen[len(seen) // 2])

    def can_start(self, own_s: float | None = None) -> bool:
        """Whether one more child would end in the budget: it runs after the one holding the GPU."""
        ahead = self.estimate() if self.live else 0.0
        return self.elapsed() + ahead + self.estimate(own_s) + self.margin_s <= self.budget_s

    def run(self, items: list[tuple]) -> list[str]:
        """Runs ``(name, argv)`` or ``(name, argv, estimate_s)`` children in order, pipelined (or one at a time);
        returns the names it did not start. ``estimate_s`` may be a function, asked when the child is due."""
        left = list(items)
        while left:
            if self.live:
                self.wait_gpu_phase()
            self.reap(block=not self.overlap)
            if self.stop_on_failure and self.failed:
                self.say(f"stopping after {self.failed[-1]} failed: {len(left)} unit(s) left for a later call")
                break
            own = left[0][2] if len(left[0]) > 2 else None
            own = own() if callable(own) else own  # an estimate from what the run measured so far
            if not self.can_start(own):
                self.say(f"stopping: {len(left)} left for a later call ({self.elapsed():.0f} s used, "
                         f"about {self.estimate(own):.0f} s for the next, budget {self.budget_s:.0f} s)")
                break
            self.start(*left.pop(0)[:2])
        self.reap(block=True)
        return [item[0] for item in left]

    def start(self, name: str, argv: list[str]) -> None:
        log = Path(self.run_dir) / "logs" / f"{name}.log"
        with open(log, "w") as f:
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
        self.live.append(Child(name, proc, log, time.monotonic()))
        self.say(f"== {name} started ({self.elapsed():.0f} s)")

    def _note_phase(self, child: Child) -> None:
        if child.gpu_since is None and GPU_PHASE in child.log.read_text(errors="replace"):
            child.gpu_since = time.monotonic()

    def wait_gpu_phase(self) -> None:
        """Until the newest child holds the lock (or has ended)."""
        newest = self.live[-1]
        while newest.proc.poll() is None and newest.gpu_since is None:
            self.reap(block=False)
            time.sleep(0.5)

    def _overdue(self, child: Child) -> bool:
        self._note_phase(child)
        if child.gpu_since is not None:
            return time.monotonic() - child.gpu_since > self.run_timeout_s
        return time.monotonic() - child.started > 3 * self.run_timeout_s  # stuck before the GPU

    def reap(self, block: bool) -> None:
        while True:
            for child in list(self.live):
                if child.proc.poll() is None:
                    if not self._overdue(child):
                        continue
                    self.say(f"{child.name}: killed after {self.run_timeout_s:.0f} s of GPU phase")
                    child.proc.kill()
                    child.proc.wait()
                self._end(child)
            if not block or not self.live:
                return
            time.sleep(0.5)

    def _end(self, child: Child) -> None:
        self.live.remove(child)
        self._note_phase(child)
        if child.gpu_since is not None:
            self.phases.append(time.monotonic() - child.gpu_since)
        text = child.log.read_text(errors="replace")
        summary = [line for line in text.splitlines() if line.startswith("SUMMARY ")]
        self.say(summary[-1] if summary else f"{child.name}: no summary")
        if child.proc.returncode != 0:
            self.failed.append(child.name)
            self.say(f"{child.name} failed ({child.proc.returncode}); last lines of {child.log.name}:\n"
                     + "\n".join(text.splitlines()[-8:]))


def record_not_available(record: RunRecord | None, rows: list[dict], done: set[str] = frozenset(), log=print) -> None:
    """Says and records (where there is a ``record``) each row for what cannot run here (a section's
    ``not_available_here``), once: rows already in ``done`` were recorded by an earlier call."""
    for row in rows:
        if row["block"] not in done:
            if record is not None:
                record.append_jsonl("blocks.jsonl", row)
            log(f"{row['block']}: not available: {row['detail']}")


def check_run(section, record: RunRecord, save_tables) -> bool:
    """The tables (``save_tables()``) and the section's checks over every finished engine run in the folder, all
    calls; True when no check failed. Tables that need a package the device lacks (scipy) are left to the render,
    which computes them from ``raw/``, and so are checks that rebuild such a table (section 21's): the run then
    stays ``running`` until the render finishes it."""
    try:
        save_tables()
    except ImportError as e:
        print(f"tables left to the render: {e}", flush=True)
    try:
        report = section.checks(record.files())
    except ImportError as e:  # a check that rebuilds a table with a package the device lacks: the render checks
        print(f"checks left to the render: {e}", flush=True)
        return False
    record.save_checks(report)
    show(report, section.counts(record.files()))
    record.finish(report)
    return all(c.status != "failed" for c in report)


def driver_parser(doc: str, unit: str) -> argparse.ArgumentParser:
    """A GPU driver's command line: ``--out``, ``--profile``, ``--set`` and the time limits, ``unit`` naming what
    its children run ("engine run", "block")."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the run folder (new, or one to resume)")
    ap.add_argument("--profile", default="gpu")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--budget", type=float, default=float("inf"),
                    help=f"seconds this call may take: no {unit} starts that could not end within it")
    ap.add_argument("--run-timeout", type=float, default=400, help=f"seconds a {unit} may hold the GPU")
    ap.add_argument("--run-estimate", type=float, default=60,
                    help=f"seconds a {unit} holds the GPU, until this call has seen one end")
    return ap


def verdict(passed: bool, t0: float, out) -> int:
    """A driver call's last line, and its exit code."""
    print(f"{'NO CHECK FAILED' if passed else 'NOT FINISHED OR SOME CHECKS FAILED'} in {time.monotonic() - t0:.0f} s "
          f"-> {out}")
    return 0 if passed else 1


def exit_driver(main, name: str) -> None:
    """A GPU driver's entry point: runs ``main`` and ends the process hard with its exit code.

    A parameter error is one line (exit 2); anything else that raised is printed (exit 1). The
    process ends with ``os._exit``, because LMCache 0.5.3 leaves non-daemon threads behind.
    """
    try:
        code = main()
    except params_mod.ParamError as e:
        print(f"{name}: {e}", file=sys.stderr)
        code = 2
    except Exception:  # noqa: BLE001 - a child that raised: its summary says failed; report and exit hard
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

