"""Section 22's parameters: the fleet, the trace (families and unrelated traffic), the policies."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kmesh_lib.base.params import (
    Count,
    Mib,
    PathText,
    PositiveCount,
    Seconds,
    Tokens,
    check,
    params_dataclass,
)
from kmesh_lib.engine.config import SourceRunParams, cpu_pool_bytes, machine_memory_bytes
from kmesh_lib.engine.model_spec import check_loadable, resolve
from kmesh_lib.lmcache.tier_params import CHUNK_TOKENS, ChunkTokens, DiskTierRoot

MIB = 1 << 20
MAX_ENGINES = 16

# policy -> (router, LMCache server attached, the engines' prefix cache read)
POLICIES = {
    "recompute": ("round_robin", False, False),  # the control: every prompt token computed
    "round_robin": ("round_robin", False, True),  # children land wherever the rotation puts them
    "prefix_aware": ("prefix_aware", False, True),  # to the engine holding the longest cached prefix
    "shared": ("round_robin", True, True),  # round-robin; a child's engine restores from the server
}
PolicyName = Literal["recompute", "round_robin", "prefix_aware", "shared"]


MAX_REPEATS = 1000


@params_dataclass
class MultiEngineParams(SourceRunParams):
    """NUM_ENGINES engines, each in its own process with its own pool of NUM_GPU_BLOCKS, serve one
    trace per policy: NUM_FAMILIES parents (PARENT_TOKENS each), NUM_CHILDREN children per parent
    (parent input + parent output + CHILD_SUFFIX_TOKENS, each arriving a while after its parent
    finished) and NUM_NOISE unrelated requests (NOISE_TOKENS each) that keep the pools under pressure."""

    NUM_ENGINES: Annotated[int, Field(ge=2, le=MAX_ENGINES)] = Field(
        2, description="engines, one process and one KV pool each, all attached to one LMCache server in 'shared'")
    POLICIES: list[PolicyName] = Field(
        default_factory=lambda: list(POLICIES), min_length=1,
        description="routing policies, one trace each: recompute (the control), round_robin, prefix_aware, shared")
    MODELS: list[PathText] = Field(
        default_factory=list, description="model shapes run one after the other (one fleet each); empty: MODEL alone")
    NUM_FAMILIES: PositiveCount = Field(6, description="parents per trace")
    NUM_CHILDREN: PositiveCount = Field(2, description="children per parent")
    PARENT_TOKENS: Tokens = Field(1024, description="a parent's prompt tokens (its family's shared context)")
    CHILD_SUFFIX_TOKENS: Tokens = Field(
        64, description="new tokens a child adds after the parent's input + output (section 18's family shape)")
    NUM_NOISE: Count = Field(8, description="unrelated requests per trace (pressure on the pools)")
    NOISE_TOKENS: Tokens = Field(512, description="tokens of each unrelated request")
    MAX_TOKENS: Tokens = Field(8, description="greedy output tokens per request")
    MEAN_ARRIVAL_GAP_S: Seconds = Field(
        0.5, description="parents and unrelated requests arrive as a seeded Poisson process with this mean gap")
    MEAN_CHILD_GAP_S: Seconds = Field(
        0.5, description="each child arrives a seeded exponential time (this mean) after its parent finished")
    # A repeat is one trace per policy, minutes of engine time each: 1,000 repeats is weeks. Past that the plan's
    # per-repeat schedule alone took 33 s to print (1,000,000 repeats).
    NUM_REPEATS: Annotated[int, Field(ge=1, le=MAX_REPEATS)] = Field(
        1, description="traces per policy; fresh families per repeat, the same in every policy")
    NUM_PROBES: Count = Field(
        2, description="after the traces, idle-engine probes of one child: recomputed, from a local hit, restored")
    CHUNK_SIZE: ChunkTokens = CHUNK_TOKENS
    ARENA_MIB: Mib = Field(
        256, description="the server's L1 DRAM arena; LRU evicts to the disk tier at 80 %, once a second, so a store "
                         "burst beyond that finds no space and is dropped (checked)")
    STORE_POLICY: Literal["default", "skip_l1"] = Field(
        "default", description="server store policy: default (L1 and the disk tier) or skip_l1 (disk tier only)")
    DISK_TIER_ROOT: DiskTierRoot = ""
    # A chosen-token logprob 10 nats off means the policies disagree; a larger tolerance would make the
    # equality check vacuous.
    LOGPROB_TOLERANCE: float = Field(
        0.001, ge=0, le=10,
        description="largest |difference| of a chosen-token logprob between policies (batch composition differs)")
    ENGINE_START_TIMEOUT_S: Seconds = Field(900.0, description="seconds for a fleet's engines to import and start")
    TRACE_TIMEOUT_S: Seconds = Field(
        1800.0, description="ceiling for one trace; requests unfinished then are recorded as failed (timeout)")
    KILL_ENGINE: Annotated[int, Field(ge=0, lt=MAX_ENGINES)] | None = Field(
        None, description="fault test: SIGKILL this engine's process group mid-trace (one policy, one repeat)")
    KILL_AFTER_REQUESTS: PositiveCount = Field(
        4, description="fault test: the kill comes once this many requests were dispatched and the engine has one in flight")

    def check_rules(self) -> None:
        super().check_rules()
        check(self.ENGINE == "real", "ENGINE=replay: the engines run in their own processes with real vLLM; use real")
        check(len(set(self.POLICIES)) == len(self.POLICIES), f"POLICIES={self.POLICIES}: each policy once")
        for m in self.models:
            check_loadable(resolve(m, "MODELS"), "MODELS")  # a shape, or a model directory real vLLM loads
            check(not (m == "qwen2.5-7b" and self.WEIGHTS == "random" and self.DEVICE == "cpu"),
                  "MODELS: qwen2.5-7b with WEIGHTS=random would write a 15 GB checkpoint; use WEIGHTS: dummy")
        check(self.CHUNK_SIZE % self.BLOCK_SIZE == 0,
              f"CHUNK_SIZE={self.CHUNK_SIZE}: must be a multiple of BLOCK_SIZE={self.BLOCK_SIZE}")
        check(self.child_tokens + self.MAX_TOKENS <= self.MAX_MODEL_LEN,
              f"a child needs {self.child_tokens} prompt + {self.MAX_TOKENS} output tokens, more than "
              f"MAX_MODEL_LEN={self.MAX_MODEL_LEN}")
        check(self.NOISE_TOKENS + self.MAX_TOKENS <= self.MAX_MODEL_LEN,
              f"NOISE_TOKENS + MAX_TOKENS = {self.NOISE_TOKENS + self.MAX_TOKENS} exceeds MAX_MODEL_LEN={self.MAX_MODEL_LEN}")
        check(self.PARENT_TOKENS >= self.CHUNK_SIZE,
              f"PARENT_TOKENS={self.PARENT_TOKENS}: shorter than one LMCache chunk (CHUNK_SIZE={self.CHUNK_SIZE}), so "
              "the server would store nothing of it")
        if "shared" in self.POLICIES:
            for m in self.models:
                need = -(-self.child_tokens // self.CHUNK_SIZE) * self.CHUNK_SIZE * kv_bytes_per_token(self, m) / MIB
                check(need <= self.ARENA_MIB,
                      f"ARENA_MIB={self.ARENA_MIB}: one child's chunks of {m} are {need:.1f} MiB of KV; the arena "
                      "must hold at least one request's chunks")
        if self.KILL_ENGINE is not None:
            check(self.KILL_ENGINE < self.NUM_ENGINES,
                  f"KILL_ENGINE={self.KILL_ENGINE}: there are only NUM_ENGINES={self.NUM_ENGINES} engines (0-based)")
            check(len(self.POLICIES) == 1 and self.NUM_REPEATS == 1 and len(self.models) == 1,
                  "KILL_ENGINE: the fault test runs one policy, one repeat and one model (a killed engine stays dead)")
            check(self.KILL_AFTER_REQUESTS < self.num_requests,
                  f"KILL_AFTER_REQUESTS={self.KILL_AFTER_REQUESTS}: the trace has only {self.num_requests} requests")

    def check_runnable(self) -> None:
        super().check_runnable()
        memory = machine_memory_bytes()
        if self.DEVICE == "cpu" and self.starts_engine and memory:  # the fleet's pools, held at once, model by model
            for m in self.models:
                need = self.NUM_ENGINES * cpu_pool_bytes(self, m)
                check(need <= memory, f"NUM_ENGINES={self.NUM_ENGINES} x NUM_GPU_BLOCKS={self.NUM_GPU_BLOCKS}: the fleet's "
                                      f"pools of {m} are {need / (1 << 30):,.1f} GiB of KV; this machine has "
                                      f"{memory / (1 << 30):,.1f} GiB of memory")

    @property
    def models(self) -> list[str]:
        return list(self.MODELS) or [self.MODEL]

    @property
    def child_tokens(self) -> int:
        return self.PARENT_TOKENS + self.MAX_TOKENS + self.CHILD_SUFFIX_TOKENS

    @property
    def num_requests(self) -> int:
        """Requests in one trace: parents, children and unrelated requests."""
        return self.NUM_FAMILIES * (1 + self.NUM_CHILDREN) + self.NUM_NOISE


def kv_bytes_per_token(cfg: MultiEngineParams, model: str) -> int:
    return resolve(model).kv_bytes_per_token(cfg.DTYPE)

