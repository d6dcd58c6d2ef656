"""Trace audit: throughput, and memory and output on a file of a million distinct keys.

    python3 benchmarks/bench_trace_audit.py [--root DIR] [--synthetic-mb 200] [--keys 1000000] [--repeat 3]

1. The real corpus (the data root's lmcache-agent-trace, or --root): records/s and MB/s.
2. A synthetic corpus imitating agent traces (8 sources, records of a few KB with a shared system
   prompt, a timestamp and a session id) with what the audit must count mixed in: an empty file,
   malformed lines, exact duplicates and one 20 MB oversize line.
3. Issue 18's hostile file: about 27 MB holding a million distinct keys, in two shapes (10,000
   records of 100 keys; 22 records of 45,455 keys, the shape that once gave a share of 45,268.5).
   Each is audited by section 17's ``audit_run`` into a run folder in a child process, which
   reports its peak RSS (the interpreter and imports included), the time, and the sizes of
   ``results.json``, ``raw/`` and ``section.public_results`` as JSON. Targets: peak RSS under 500 MB,
   public results under 1 MB.

Throughput figures are the best of ``--repeat`` runs (the page cache is warm after the first).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kmesh_lib.base.data import DATA_SETS  # noqa: E402
from kmesh_lib.traces.audit import audit_tree  # noqa: E402


def build_synthetic(root: Path, target_mb: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    words = ["kv", "cache", "block", "agent", "tool", "patch", "file", "test", "error", "step"]
    system = " ".join(rng.choice(words) for _ in range(1200))  # ~6 KB shared preamble
    target = target_mb << 20
    written, index = 0, 0
    for source_no in range(8):
        (root / f"source{source_no}").mkdir(parents=True)
    (root / "source0" / "empty.jsonl").write_bytes(b"")
    while written < target:
        path = root / f"source{index % 8}" / f"trace{index // 8:04d}.jsonl"
        lines = []
        for turn in range(40):
            rec = {"timestamp": 1_760_000_000_000_000 + index * 10_000_000 + turn * 100_000,
                   "session_id": f"s{index}", "input": f"{system}\nturn {turn} of {index}: "
                   + " ".join(rng.choice(words) for _ in range(rng.randint(50, 400))),
                   "output": " ".join(rng.choice(words) for _ in range(rng.randint(20, 200)))}
            lines.append(json.dumps(rec))
            if turn % 13 == 0:
                lines.append(lines[-1])  # an exact duplicate
        lines.append('{"timestamp": 1, "input": "unterminated')  # a malformed line
        data = ("\n".join(lines) + "\n").encode()
        path.write_bytes(data)
        written += len(data)
        index += 1
    with open(root / "source1" / "oversize.jsonl", "wb") as fh:  # one 20 MB line
        fh.write(b'{"x": "' + b"a" * (20 << 20) + b'"}\n')


def build_keys(path: Path, num_keys: int, keys_per_record: int) -> None:
    """``num_keys`` distinct keys, ``keys_per_record`` to a record; half of them time-like."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for start in range(0, num_keys, keys_per_record):
            rec = {f"key{j:07d}_{'at' if j % 2 else 'xx'}": 1_700_000_000 + j
                   for j in range(start, min(num_keys, start + keys_per_record))}
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")


def measure(root: Path, repeat: int, label: str) -> None:
    best = None
    for _ in range(repeat):
        start = time.perf_counter()
        audit = audit_tree(root)
        elapsed = time.perf_counter() - start
        best = elapsed if best is None else min(best, elapsed)
    s = audit.summary()
    mb = s["num_bytes"] / 1e6
    print(f"{label}: {s['num_files']} files, {mb:.1f} MB, {s['num_records']} records, "
          f"{s['num_malformed_lines']} malformed lines, {s['num_duplicate_copies']} duplicate copies")
    print(f"{label}: best of {repeat}: {best:.3f} s -> {s['num_records'] / best:,.0f} records/s, {mb / best:.1f} MB/s")


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM). Not ru_maxrss: that survives exec, so a child
    would report its parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_audit(corpus: Path, run_dir: Path) -> None:
    """In a fresh process: section 17's audit_run into ``run_dir``, then the sizes, as JSON."""
    from kmesh_lib.base import params
    from kmesh_lib.base.records import RunRecord
    from kmesh_lib.sections import trace_audit as section

    cfg = params.build(section.Params, {"TRACE_ROOT": str(corpus), "RUN_DIR": str(run_dir)})
    run_dir.mkdir(parents=True)
    record = RunRecord(run_dir, section.KEY)  # not RunRecord.open: its environment probe imports torch
    start = time.perf_counter()
    audit, _ = section.audit_run(record, cfg)
    elapsed = time.perf_counter() - start
    public = json.dumps(section.public_results(record.files()))
    raw_bytes = sum(p.stat().st_size for p in (run_dir / "raw").rglob("*") if p.is_file())
    fields = audit.source_fields.get(".")
    print(json.dumps({
        "elapsed_s": elapsed, "peak_rss_mb": peak_rss_mb(),
        "public_bytes": len(public), "results_bytes": (run_dir / "results.json").stat().st_size,
        "raw_bytes": raw_bytes, "num_records": audit.num_records, "malformed": audit.malformed,
        "num_fields_tracked": len(fields.fields) if fields else 0,
        "num_untracked_keys": fields.num_untracked_keys if fields else 0,
        "max_share": max((r["share"] for r in audit.coverage_rows()), default=0)}))


def measure_keys(num_keys: int, keys_per_record: int) -> None:
    with tempfile.TemporaryDirectory(prefix="kmesh-bench-keys-") as tmp:
        corpus = Path(tmp) / "corpus"
        build_keys(corpus / "keys.jsonl", num_keys, keys_per_record)
        size_mb = (corpus / "keys.jsonl").stat().st_size / 1e6
        out = subprocess.run([sys.executable, __file__, "--child", str(corpus), str(Path(tmp) / "run")],
                             capture_output=True, text=True, timeout=1800)
        if out.returncode:
            print(f"keys ({num_keys:,} in records of {keys_per_record:,}): child failed\n{out.stderr[-2000:]}")
            return
        r = json.loads(out.stdout.strip().splitlines()[-1])
    label = f"{num_keys:,} distinct keys, {keys_per_record:,} per record, {size_mb:.1f} MB"
    print(f"{label}: {r['num_records']:,} records in {r['elapsed_s']:.1f} s, peak RSS {r['peak_rss_mb']:.0f} MB "
          f"(target < 500), public results {r['public_bytes'] / 1e3:.1f} kB (target < 1,000), "
          f"results.json {r['results_bytes'] / 1e3:.1f} kB, raw/ {r['raw_bytes'] / 1e3:.1f} kB")
    print(f"{label}: {r['num_fields_tracked']:,} fields tracked, {r['num_untracked_keys']:,} keys counted as other, "
          f"largest coverage share {r['max_share']:.3g}, unparsed: "
          + (", ".join(f"{k} {v}" for k, v in r["malformed"].items() if v) or "none"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=DATA_SETS["lmcache-agent-trace"].path())
    parser.add_argument("--synthetic-mb", type=int, default=200)
    parser.add_argument("--keys", type=int, default=1_000_000, help="distinct keys in the hostile file (0: skip)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child_audit(*args.child)
    if args.root.is_dir():
        measure(args.root, args.repeat, f"real corpus ({args.root.name})")
    else:
        print(f"real corpus not found at {args.root}; skipped (kmesh data fetch)")
    if args.synthetic_mb > 0:
        with tempfile.TemporaryDirectory(prefix="kmesh-bench-audit-") as tmp:
            start = time.perf_counter()
            build_synthetic(Path(tmp), args.synthetic_mb)
            print(f"synthetic corpus built in {time.perf_counter() - start:.1f} s")
            measure(Path(tmp), args.repeat, f"synthetic ({args.synthetic_mb} MB target)")
    if args.keys > 0:
        for keys_per_record in (100, 45_455):
            measure_keys(args.keys, keys_per_record)


if __name__ == "__main__":
    main()
