"""Section 20 on a CUDA GPU: the measuring half, self-contained (no papermill, pandas or matplotlib).

On the H200 device machine (vLLM 0.26.0 + LMCache 0.5.3, in-process LMCacheConnectorV1; the stage
and its two steps are in ../shared/device/README.md), from the repo root:

    sh .device-stage/call2/install.sh && . /tmp/site/env.sh && \\
        timeout 540 python3 -m kmesh_lib.prefetch_device --out $OUT/prefetch-gpu [--set KEY=VALUE ...]

Every engine run is a child process (LMCache 0.5.3 keeps a process-wide config singleton and
leaves non-daemon threads behind: each child ends with ``os._exit``). Run 0 of each group size
runs the pilot and writes the chosen lead; later runs read it. The parent writes params,
env.json, raw/groups.jsonl, raw/blocks.jsonl and results.json (tables + checks). Back here:

    cp -r <fetched>/prefetch-gpu outputs/prefetch/gpu-<date>
    .venv/bin/kmesh verify 20 --run-dir outputs/prefetch/gpu-<date>
    .venv/bin/kmesh run 20 --profile gpu --set SOURCE_RUN=outputs/prefetch/gpu-<date>   # report, plots, publish
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def child(run_dir: Path, path: str, n: int, r: int, lead: float | None) -> int:
    import yaml

    from .params import build
    from .prefetch_experiment import PrefetchParams
    from .prefetch_protocol import run_engine
    from .run_record import RunRecord

    cfg = build(PrefetchParams, yaml.safe_load((run_dir / "params.resolved.yaml").read_text()))
    _, summary = run_engine(cfg, path, n, r, lead, RunRecord(run_dir, "prefetch"), log=lambda m: print(m, flush=True))
    print("SUMMARY " + json.dumps({k: summary.get(k) for k in ("block", "lead_ms", "seconds", "engine_start_s")}), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", default="gpu")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--child", nargs=4, metavar=("PATH", "N", "RUN", "LEAD"), help=argparse.SUPPRESS)
    ap.add_argument("--run-timeout", type=int, default=240)
    args = ap.parse_args()
    run_dir = Path(args.out).resolve()
    if args.child:
        p, n, r, lead = args.child
        code = child(run_dir, p, int(n), int(r), None if lead == "none" else float(lead))
        sys.stdout.flush()
        os._exit(code)

    import yaml

    from . import params as params_mod
    from . import prefetch_stats as ps
    from . import sections
    from .cli import resolve_params
    from .run_record import RunRecord
    from .verify import read_jsonl

    cfg, _, _ = resolve_params(sections.get("20"), args.profile, [], args.set)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "params.resolved.yaml").write_text(yaml.safe_dump({**params_mod.to_dict(cfg), "RUN_DIR": str(run_dir)}))
    record = RunRecord.open("prefetch", cfg, str(run_dir))
    t0 = time.monotonic()
    for path in cfg.PATHS:
        for n in cfg.GROUP_SIZES:
            lead = None
            for r in range(cfg.ENGINE_RUNS):
                print(f"== {path} N={n} run {r} lead {lead} ({time.monotonic() - t0:.0f} s)", flush=True)
                proc = subprocess.run([sys.executable, "-m", "kmesh_lib.prefetch_device", "--out", str(run_dir), "--child",
                                       path, str(n), str(r), "none" if lead is None else str(lead)],
                                      capture_output=True, text=True, timeout=args.run_timeout)
                with open(run_dir / "runs.log", "a") as f:
                    f.write(proc.stdout[-20000:] + proc.stderr[-4000:])
                for line in proc.stdout.splitlines():
                    if line.startswith("SUMMARY "):
                        lead = json.loads(line[8:])["lead_ms"]
                        print(line, flush=True)
                if proc.returncode != 0:
                    print(f"run failed ({proc.returncode}):\n{proc.stderr[-3000:]}", flush=True)
    groups = read_jsonl(run_dir / "raw" / "groups.jsonl") if (run_dir / "raw" / "groups.jsonl").exists() else []
    record.save("engine_runs", read_jsonl(run_dir / "raw" / "blocks.jsonl") if (run_dir / "raw" / "blocks.jsonl").exists() else [])
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
    print(f"done in {time.monotonic() - t0:.0f} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
