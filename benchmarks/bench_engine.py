"""Engine start time (real vLLM, CPU build or CUDA) and the replay engine's time for 60 requests.

    .venv/bin/python benchmarks/bench_engine.py [--models tiny qwen2.5-0.5b] [--device cpu]

Prints one line per figure. Start time covers vLLM's LLM() (model load, KV-cache set-up) and the
warm-up request; a model's first use also writes its random checkpoint once (reported apart).
"""
import argparse
import os
import random
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from kmesh_lib.engine.config import EngineParams  # noqa: E402
from kmesh_lib.engine.model_spec import materialize, resolve  # noqa: E402
from kmesh_lib.engine.requests import RequestSpec, run_group  # noqa: E402
from kmesh_lib.engine.vllm_engine import make_engine  # noqa: E402


def sixty_requests(vocab_size: int, seed: int = 0) -> list[RequestSpec]:
    """60 requests in 6 families: a 256-token shared context, 64 own tokens, 8 outputs each."""
    rng = random.Random(seed)
    contexts = [[rng.randrange(4, vocab_size) for _ in range(256)] for _ in range(6)]
    return [RequestSpec(f"r{i}", contexts[i % 6] + [rng.randrange(4, vocab_size) for _ in range(64)], max_tokens=8)
            for i in range(60)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=["tiny", "qwen2.5-0.5b"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--block-size", type=int, default=32)
    args = parser.parse_args()
    for model in args.models:
        params = EngineParams(MODEL=model, DEVICE=args.device, BLOCK_SIZE=args.block_size, NUM_GPU_BLOCKS=129,
                              MAX_MODEL_LEN=2048, DTYPE="float32" if args.device == "cpu" else "bfloat16")
        t0 = time.monotonic()
        materialize(resolve(model), params.WEIGHTS, params.DTYPE, params.SEED)
        print(f"checkpoint {model}: {time.monotonic() - t0:.1f} s (once per shape, dtype and seed)", flush=True)
        engine = make_engine(params)
        print(f"engine start {model} on {args.device}: {engine.start_s:.1f} s", flush=True)
        t0 = time.monotonic()
        results = run_group(engine, sixty_requests(engine.spec.config["vocab_size"]))
        print(f"real engine 60 requests {model}: {time.monotonic() - t0:.2f} s, "
              f"{sum(r.num_cached_tokens for r in results)} cached tokens", flush=True)
        engine.close()
    for block_size in (16, 32):
        t0 = time.monotonic()
        engine = make_engine(EngineParams(ENGINE="replay", BLOCK_SIZE=block_size, NUM_GPU_BLOCKS=129, MAX_MODEL_LEN=2048))
        start = time.monotonic() - t0
        t0 = time.monotonic()
        results = run_group(engine, sixty_requests(engine.vocab_size))
        print(f"replay engine B={block_size}: start {start:.2f} s, 60 requests {time.monotonic() - t0:.3f} s, "
              f"{sum(r.num_cached_tokens for r in results)} cached tokens", flush=True)
        engine.close()


if __name__ == "__main__":
    main()
    os._exit(0)
