"""The host->device copy floor on this machine, each way ``kv.floors.PairFloor`` times it, at a context's sizes.

    python3 benchmarks/bench_link_floor.py [--mib 235 940] [--repeats 30] [--json PATH]

For each size: one ``PairFloor("copy", ...)`` (its buffers allocated once, as beside a point's restores), then
``repeats`` rounds of ``time_ways`` (each way once per round, in a fixed order); prints each way's median and 95%
bootstrap interval in ms and GB/s, and the paired ratio uva_read / memcpy with its interval (below 1: a kernel reading
pinned memory moves the bytes faster than the copy engine, so a restore by such a kernel can beat a cudaMemcpy floor).
On a machine without CUDA the one way is a host memcpy. Prints; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kmesh_lib.base.intervals import median_of_differences  # noqa: E402
from kmesh_lib.kv.floors import MIB, PairFloor  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, nargs="+", default=[235.0, 940.0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--json", type=Path, default=None, help="also write every timing here")
    args = ap.parse_args(argv)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "sizes": []}
    print(f"device: {out['device']}")
    for mib in args.mib:
        nbytes = int(mib * MIB)
        floor = PairFloor("copy", nbytes, device)
        try:
            rounds = [floor.time_ways() for _ in range(args.repeats)]
            errors = dict(floor.errors)
        finally:
            floor.close()
        print(f"{mib:,.0f} MiB ({nbytes:,} bytes), {args.repeats} rounds" + (f"; not timed: {errors}" if errors else ""))
        for way in rounds[0]:
            ms = [1e3 * r[way] for r in rounds]
            med, low, high = median_of_differences(ms)
            print(f"  {way:<9} {med:9.3f} ms [{low:.3f}, {high:.3f}]  {nbytes / med / 1e6:6.1f} GB/s")
        if "uva_read" in rounds[0]:
            med, low, high = median_of_differences([r["uva_read"] / r["memcpy"] for r in rounds])
            print(f"  uva_read / memcpy, paired: {med:.3f} [{low:.3f}, {high:.3f}]")
        out["sizes"].append({"bytes": nbytes, "rounds": rounds, "errors": errors})
    if args.json:
        args.json.write_text(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
