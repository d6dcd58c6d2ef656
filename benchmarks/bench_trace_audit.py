"""Throughput of the trace audit (records/s and MB/s), on the real corpus and a synthetic one.

    python3 benchmarks/bench_trace_audit.py [--root DIR] [--synthetic-mb 200] [--repeat 3]

The synthetic corpus imitates agent traces (8 sources, records of a few KB with a shared system
prompt, a timestamp and a session id) and mixes in what the audit must count: an empty file,
malformed lines, exact duplicates and one oversize line. Figures are the best of ``--repeat``
runs (the page cache is warm after the first), printed as plain text.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kmesh_lib.traces.audit import audit_tree  # noqa: E402

REAL_CORPUS = Path("/work/shared/data/lmcache-agent-trace")


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


def measure(root: Path, repeat: int, label: str) -> None:
    best = None
    for _ in range(repeat):
        start = time.perf_counter()
        audit = audit_tree(root)
        elapsed = time.perf_counter() - start
        best = elapsed if best is None else min(best, elapsed)
    mb = audit.num_bytes / 1e6
    print(f"{label}: {audit.num_files} files, {mb:.1f} MB, {audit.num_records} records, "
          f"{audit.num_malformed_lines} malformed lines, {audit.num_duplicate_copies} duplicate copies")
    print(f"{label}: best of {repeat}: {best:.3f} s -> {audit.num_records / best:,.0f} records/s, "
          f"{mb / best:.1f} MB/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=REAL_CORPUS)
    parser.add_argument("--synthetic-mb", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.root.is_dir():
        measure(args.root, args.repeat, f"real corpus ({args.root.name})")
    else:
        print(f"real corpus not found at {args.root}; skipped")
    if args.synthetic_mb > 0:
        with tempfile.TemporaryDirectory(prefix="kmesh-bench-audit-") as tmp:
            start = time.perf_counter()
            build_synthetic(Path(tmp), args.synthetic_mb)
            print(f"synthetic corpus built in {time.perf_counter() - start:.1f} s")
            measure(Path(tmp), args.repeat, f"synthetic ({args.synthetic_mb} MB target)")


if __name__ == "__main__":
    main()
