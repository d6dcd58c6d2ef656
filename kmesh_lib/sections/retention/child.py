"""One retention block in a fresh Python process, appending to the run's ``raw/`` files.

In-process LMCache (``LMCacheConnectorV1``) keeps process-wide state a second engine in the same
process would inherit: a config loaded once (``lmcache_get_or_create_config``), an engine registry
(``LMCacheEngineBuilder``) and, in 0.5.3, non-daemon threads that keep the process alive. So each
in-process block runs in its own child, which reads the run's ``params.resolved.yaml``, runs the
block exactly as the notebook would, and ends with ``os._exit``.

    python -m kmesh_lib.sections.retention.child RUN_DIR BLOCK      (BLOCK: a name from blocks.plan_blocks)
"""
from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

from kmesh_lib.base.params import build, current_names
from kmesh_lib.base.paths import REPO_ROOT
from kmesh_lib.base.records import RunRecord, read_jsonl
from kmesh_lib.sections.retention.blocks import PlannedBlock, plan_blocks
from kmesh_lib.sections.retention.params import RetentionParams
from kmesh_lib.workloads.context_groups import Block

REPO = REPO_ROOT


def run_block_in_child(run_dir: Path, name: str, log=print, timeout_s: float = 900.0) -> tuple[dict, list[dict]]:
    """Runs the planned block ``name`` in a child; returns its (summary, groups) as the child recorded them.

    The child's output goes to ``RUN_DIR/blocks.log``. A child that fails or times out leaves a
    ``failed`` block summary (its last output line as the detail), which fails the section's checks.
    """

    run_dir = Path(run_dir)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    try:
        child = subprocess.run([sys.executable, "-m", "kmesh_lib.sections.retention.child", str(run_dir), name],
                               capture_output=True, text=True, timeout=timeout_s, cwd=REPO, env=env)
        output, code = child.stdout + child.stderr, child.returncode
    except subprocess.TimeoutExpired as e:
        output = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
        output, code = output + f"\nblock timed out after {timeout_s:.0f} s", -9
    with open(run_dir / "blocks.log", "a") as f:
        f.write(f"===== block {name}, exit {code}\n{output}\n")
    for line in output.splitlines():
        if line.startswith(f"{name} pair") or line.startswith(f"{name}:"):
            log(line)
    raw = run_dir / "raw"
    summaries = [b for b in read_jsonl(raw / "blocks.jsonl") if b["block"] == name] if (raw / "blocks.jsonl").exists() else []
    last_summary = summaries[-1] if summaries else {}
    if last_summary.get("status") in ("failed", "disk_full") or (code == 0 and last_summary.get("status") == "ok"):
        summary = last_summary  # the child recorded how its block ended (a raised block: failed, with its error)
    else:  # killed, timed out, or it died before recording: the parent records the failure
        last = [line for line in output.splitlines() if line.strip()][-1:] or ["no output"]
        summary = {"block": name, "path": name.split("-N")[0], "group_size": None, "status": "failed",
                   "detail": f"exit {code}: {last[0]}"}
        RunRecord(run_dir, "retention").append_jsonl("blocks.jsonl", summary)
    groups = [g for g in read_jsonl(raw / "groups.jsonl") if g["block"] == name] if (raw / "groups.jsonl").exists() else []
    return summary, groups


def planned(cfg: RetentionParams, name: str) -> PlannedBlock:
    """The planned block called ``name`` (ValueError naming the plan when there is none)."""
    plan = plan_blocks(cfg)
    found = [b for b in plan if b.name == name]
    if not found:
        raise ValueError(f"unknown block {name!r}: the params plan {', '.join(b.name for b in plan) or 'none'}")
    return found[0]


def run_planned(cfg: RetentionParams, run_dir: Path, name: str, log=print, before_gpu=None) -> dict:
    """Runs the planned block ``name`` into ``run_dir``; ``before_gpu`` runs after its tier began
    (the MP server spawns) and before the engine starts (the GPU driver waits for the GPU there)."""
    b = planned(cfg, name)
    block = Block(cfg, b.path, b.group_size, log=log, arms=b.arms, name=b.name)
    try:
        block.begin()
        if before_gpu is not None:
            before_gpu()
    except Exception as e:  # recorded like any block that raised: failed, with its error
        block.summary.update(status="failed", error=f"{type(e).__name__}: {e}")
        block.close()
        RunRecord(Path(run_dir), "retention").append_jsonl("blocks.jsonl", block.summary)
        raise
    return block.run(RunRecord(Path(run_dir), "retention")).summary


def main(run_dir: str, name: str) -> int:
    import yaml


    values = yaml.safe_load((Path(run_dir) / "params.resolved.yaml").read_text())
    cfg = build(RetentionParams, current_names(values))
    summary = run_planned(cfg, Path(run_dir), name, log=lambda msg: print(msg, flush=True))
    return 0 if summary["status"] in ("ok", "disk_full") else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    try:
        code = main(*sys.argv[1:])
    except BaseException:  # noqa: BLE001 - report, then exit hard: LMCache threads would keep us alive
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # LMCache 0.5.3 leaves non-daemon threads behind
