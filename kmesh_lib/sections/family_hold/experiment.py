"""Section 18: does holding a parent's blocks for its child pay under cache pressure?

One sample, on one synchronous engine, each request submitted after the previous one finished:

    parent   PARENT_TOKENS random tokens -> MAX_TOKENS greedy output tokens
    noise    NUM_PASSES passes over NUM_NOISE unrelated NOISE_TOKENS-token prompts (later passes can
             hit the first pass's blocks: these are the competing cache hits)
    child    parent input + parent output + CHILD_SUFFIX_TOKENS new tokens

The stock arm is vLLM as is. The held arm attaches a ``FamilyHoldController`` that holds the
parent's hashed blocks from its finish until the child is scheduled. Arms alternate per sample
on the same engine and the same seeded prompts; the prefix cache is reset and the pool drained
between arm-samples, so neither arm sees the other's blocks.

    saved      child's cached tokens (held) - (stock)
    displaced  parent's and noise's cached tokens (stock) - (held)
    net        saved - displaced = all cached tokens (held) - (stock)
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

from kmesh_lib.engine import costs
from kmesh_lib.engine.requests import RequestResult, RequestSpec, run_group
from kmesh_lib.engine.vllm_engine import make_engine
from kmesh_lib.kv.capture import BlockPoolCapture, drain_check
from kmesh_lib.kv.family_hold import FamilyHoldController
from kmesh_lib.sections.family_hold.params import ARMS, FamilyHoldParams, hashed_blocks, held_cap, kv_blocks


@dataclass
class SampleWorkload:
    parent: list[int]
    noise: list[list[int]]
    tail: list[int]


def make_workload(cfg: FamilyHoldParams, sample: int, vocab_size: int) -> SampleWorkload:
    """Fresh prompts per sample, identical across arms: a seeded RNG per (SEED, sample)."""
    rng = random.Random(cfg.SEED * 1_000_003 + sample)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(4, vocab_size) for _ in range(n)]  # ids 0-3 are special

    return SampleWorkload(tokens(cfg.PARENT_TOKENS), [tokens(cfg.NOISE_TOKENS) for _ in range(cfg.NUM_NOISE)],
                          tokens(cfg.CHILD_SUFFIX_TOKENS))


@dataclass
class ArmRun:
    """One arm of one sample: results in submission order, with each request's capture steps."""

    mode: str
    arm: str
    sample: int
    block_size: int
    num_gpu_blocks: int
    roles: list[str] = field(default_factory=list)  # parent, noise<i>/pass<p>, child
    results: list[RequestResult] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)  # first and last capture step
    events: list[dict] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    controller: dict[str, int] = field(default_factory=dict)
    edges: list = field(default_factory=list)  # FamilyEdge, held arm
    clean_start: bool = False
    drain_ok: bool = False
    drain_text: str = ""
    reset_ok: bool = False

    @property
    def family_id(self) -> str:
        return f"{self.arm}-s{self.sample}"

    def request_id(self, role: str) -> str:
        return f"{self.family_id}-{role.replace('/', '-')}"

    def result(self, role: str) -> RequestResult:
        return self.results[self.roles.index(role)]


def run_arm(engine, cfg: FamilyHoldParams, arm: str, sample: int) -> ArmRun:
    """Runs one arm of one sample on ``engine.vllm_engine.vllm_engine``, then drains and resets its prefix cache."""
    pool = engine.block_pool
    block_size, num_gpu_blocks = engine.params.BLOCK_SIZE, engine.params.NUM_GPU_BLOCKS
    run = ArmRun(engine.mode, arm, sample, block_size, num_gpu_blocks)
    run.clean_start = drain_check(pool).ok and len(pool.cached_block_hash_to_block) == 0
    work = make_workload(cfg, sample, engine.spec.config["vocab_size"])
    capture = BlockPoolCapture(pool)
    controller = None
    if arm == "held":
        controller = FamilyHoldController(engine, capture, max_held_blocks=held_cap(cfg, block_size, num_gpu_blocks),
                                          max_families=cfg.MAX_FAMILIES, expiry_s=cfg.EXPIRY_S)
        controller.expect_child(run.request_id("parent"), run.family_id, run.request_id("child"))
    max_steps = 4 * (cfg.child_len + cfg.MAX_TOKENS) + 64  # a request that can never be scheduled stops here

    def step_guard(step: int) -> None:
        capture.mark_step(step)
        if capture.step - run.spans[-1][0] > max_steps:
            raise RuntimeError(f"{run.roles[-1]} of {run.family_id} unfinished after {max_steps} steps")

    def send(role: str, prompt: list[int]) -> RequestResult:
        if controller is not None:
            controller.expire()  # deadlines are checked at invocation boundaries
        run.roles.append(role)
        run.spans.append((capture.step, capture.step))
        result = run_group(engine, [RequestSpec(run.request_id(role), prompt, max_tokens=cfg.MAX_TOKENS)],
                           on_step=step_guard)[0]
        run.spans[-1] = (run.spans[-1][0], capture.step - 1)
        run.results.append(result)
        return result

    try:
        parent = send("parent", work.parent)
        for p in range(cfg.NUM_PASSES):
            for i, prompt in enumerate(work.noise):
                send(f"noise{i}/pass{p}", prompt)
        send("child", work.parent + parent.output_token_ids + work.tail)
    finally:
        if controller is not None:
            controller.close()
            run.controller, run.edges = controller.stats(), list(controller.edges)
        report = drain_check(pool)
        run.drain_ok, run.drain_text = report.ok, str(report)
        capture.close()
        run.events, run.counts = capture.to_records(), capture.counts()
        run.reset_ok = engine.reset_prefix_cache()
    return run


def run_mode(engine, cfg: FamilyHoldParams, num_samples: int | None = None) -> list[ArmRun]:
    """Stock and held arms alternating, ``num_samples`` (NUM_SAMPLES) samples each, one engine."""
    return [run_arm(engine, cfg, arm, s) for s in range(num_samples or cfg.NUM_SAMPLES) for arm in ARMS]


def replay_params(cfg: FamilyHoldParams, block_size: int, num_gpu_blocks: int) -> FamilyHoldParams:
    """The replay engine at a given block size and pool (no forward pass; any block size)."""
    max_len = min(max(cfg.MAX_MODEL_LEN, cfg.child_len + cfg.MAX_TOKENS), (num_gpu_blocks - 1) * block_size)
    return dataclasses.replace(cfg, ENGINE="replay", BLOCK_SIZE=block_size, NUM_GPU_BLOCKS=num_gpu_blocks,
                               MAX_MODEL_LEN=max_len,
                               SWEEP_NUM_GPU_BLOCKS=[num_gpu_blocks])  # the engine's own pool: no sweep of its own


def sweep(cfg: FamilyHoldParams) -> list[list[ArmRun]]:
    """One replay sample per pool in SWEEP_NUM_GPU_BLOCKS: the parent's share of the pool varies."""

    out = []
    for n in cfg.SWEEP_NUM_GPU_BLOCKS:
        engine = make_engine(replay_params(cfg, cfg.REPLAY_BLOCK_SIZE, n))
        try:
            out.append(run_mode(engine, cfg, num_samples=1))
        finally:
            engine.close()
    return out


def plan(cfg: FamilyHoldParams) -> dict:
    """What ``kmesh plan 18`` prints: no engine is started."""
    lines = {}
    for label, b, n in (("real engine", cfg.BLOCK_SIZE, cfg.NUM_GPU_BLOCKS),
                        ("replay engine", cfg.REPLAY_BLOCK_SIZE, cfg.REPLAY_NUM_GPU_BLOCKS)):
        lines[label] = (f"BLOCK_SIZE={b}, NUM_GPU_BLOCKS={n} ({n - 1} usable); parent holds "
                        f"{hashed_blocks(cfg.PARENT_TOKENS, cfg.MAX_TOKENS, b)} blocks "
                        f"({hashed_blocks(cfg.PARENT_TOKENS, cfg.MAX_TOKENS, b) / (n - 1):.0%} of the pool), cap "
                        f"{held_cap(cfg, b, n)}; each noise request occupies {kv_blocks(cfg.NOISE_TOKENS, cfg.MAX_TOKENS, b)}")
    per_arm = 1 + cfg.NUM_NOISE * cfg.NUM_PASSES + 1
    lines["requests"] = (f"{per_arm} per arm-sample, sequential: parent {cfg.PARENT_TOKENS}, {cfg.NUM_PASSES} x "
                         f"{cfg.NUM_NOISE} noise of {cfg.NOISE_TOKENS}, child {cfg.child_len} tokens; {cfg.MAX_TOKENS} "
                         f"greedy output tokens each")
    lines["arms"] = f"stock, held alternating; {cfg.NUM_SAMPLES} samples each on one {cfg.DEVICE} engine ({cfg.MODEL})"
    lines["sweep"] = f"replay pools {cfg.SWEEP_NUM_GPU_BLOCKS} at BLOCK_SIZE={cfg.REPLAY_BLOCK_SIZE}"
    duration, note = expected_duration(cfg)
    lines["expected duration"] = f"{duration}" + (f"; {note}" if note else "")
    lines[costs.GPU_TIME] = costs.gpu_time(cfg.DEVICE, duration)
    return lines


def expected_duration(cfg: FamilyHoldParams) -> tuple[costs.Span, str]:
    """The real mode's requests and engine start, the replay modes and the sweep, from the sizes.

    Prefill counts the tokens a request may compute: at least the parent, one pass of unrelated
    prompts and the child's own tail (every later token a hit), at most every prompt token.
    """
    device = "cuda" if cfg.DEVICE == "cuda" else "cpu"
    num_requests = 2 + cfg.NUM_NOISE * cfg.NUM_PASSES
    least = cfg.PARENT_TOKENS + cfg.NUM_NOISE * cfg.NOISE_TOKENS + cfg.CHILD_SUFFIX_TOKENS + cfg.MAX_TOKENS
    most = cfg.PARENT_TOKENS + cfg.NUM_NOISE * cfg.NUM_PASSES * cfg.NOISE_TOKENS + cfg.child_len
    arm_samples = 2 * cfg.NUM_SAMPLES
    low, note = costs.prefill_s(device, cfg.MODEL, least * arm_samples)
    high, _ = costs.prefill_s(device, cfg.MODEL, most * arm_samples)
    decode, _ = costs.decode_s(device, cfg.MODEL, num_requests * cfg.MAX_TOKENS * arm_samples)
    start = costs.ENGINE_START_S[device] if cfg.ENGINE == "real" else costs.REPLAY_START_S
    replays = 2 + len(cfg.SWEEP_NUM_GPU_BLOCKS)  # replay mode, its twin at the real sizes, one per sweep pool
    return (costs.NOTEBOOK_S + start + costs.Span(low.low, high.high) + decode + costs.REPLAY_START_S * replays), note
