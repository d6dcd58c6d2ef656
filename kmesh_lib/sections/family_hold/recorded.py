"""Section 18's arm-samples as ``raw/`` holds them: the one shape every table and check reads.

    raw/requests.jsonl        one row per request: mode, arm, sample, role, request_id, prompt and
                              output token ids, logprobs, num_cached_tokens, finish_reason
    raw/block_events.jsonl    the capture of every arm-sample (arm = "<mode>/<arm>/s<sample>")
    raw/capture.<mode>.jsonl  kmesh.capture/1: one record per request with the block events of its
                              engine steps (this is where a request's events are read from)
    raw/sweep.jsonl           one line per sweep arm-sample: pool, the controller's counters and its
                              requests (token counts, not token ids) with their block events

Each is read as its record class (``captures``); an arm-sample's requests are ``FamilyHoldRequest`` (a run
mode) or ``SweepRequest`` (the sweep), both with ``num_prompt_tokens``, ``num_output_tokens`` and
``num_cached_tokens``, and its events ``kv.capture_records.BlockEventRecord``.

The notebook writes these files and computes its summaries from what it reads back here;
``checks`` reads them again and recomputes the same summaries.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kmesh_lib.base.records import RunFiles
from kmesh_lib.kv.capture_records import BlockEventRecord
from kmesh_lib.sections.family_hold.captures import ControllerCounters, FamilyHoldRequest, SweepRequest

Request = FamilyHoldRequest | SweepRequest

OPS = ("alloc", "touch", "free", "evict", "hold", "release")
MODES = ("real", "replay", "replay_at_real")


@dataclass
class ArmRecord:
    """One arm of one sample: requests in submission order, each with its block events."""

    mode: str
    arm: str
    sample: int
    block_size: int
    num_gpu_blocks: int
    roles: list[str] = field(default_factory=list)  # parent, noise<i>/pass<p>, child
    requests: list[Request] = field(default_factory=list)
    request_events: list[list[BlockEventRecord]] = field(default_factory=list)
    controller: ControllerCounters | None = None  # the sweep records the held arm's counters with its requests

    @property
    def events(self) -> list[BlockEventRecord]:
        return [e for events in self.request_events for e in events]

    @property
    def counts(self) -> dict[str, int]:
        """Block-level operations per kind (a touch of 3 blocks counts 3), as ``BlockPoolCapture.counts``."""
        return {op: sum(len(e.block_ids) for e in self.events if e.op == op) for op in OPS}

    def request(self, role: str) -> Request:
        return self.requests[self.roles.index(role)]

    def events_of(self, role: str) -> list[BlockEventRecord]:
        return self.request_events[self.roles.index(role)] if role in self.roles else []


def prompt_token_ids(row: Request) -> list[int] | None:
    """A run mode's request's prompt ids; None for a sweep request (it records token counts only)."""
    return row.prompt_token_ids if isinstance(row, FamilyHoldRequest) else None


def mode_sizes(params, mode: str) -> tuple[int, int]:
    """(block size, pool with the null block) of a run mode, from the run's parameters."""
    if mode == "replay":
        return params.REPLAY_BLOCK_SIZE, params.REPLAY_NUM_GPU_BLOCKS
    return params.BLOCK_SIZE, params.NUM_GPU_BLOCKS


def twin_mode(params) -> str:
    """The replay mode run at the real engine's block size and pool (section 3 of the notebook)."""
    return "replay" if mode_sizes(params, "real") == mode_sizes(params, "replay") else "replay_at_real"


def modes(run: RunFiles) -> list[str]:
    present = {r.mode for r in run.records("requests.jsonl")}
    return [m for m in MODES if m in present]


def read_mode(run: RunFiles, mode: str) -> list[ArmRecord]:
    """The arm-samples of one run mode, in the order they ran; a request's events come from its
    capture record (an absent capture record leaves its event list empty: the checks say so)."""
    block_size, num_gpu_blocks = mode_sizes(run.params, mode)
    events = {rec.invocation_id: rec.block_events or [] for rec in run.records(f"capture.{mode}.jsonl")}
    arms: dict[tuple[int, str], ArmRecord] = {}
    for row in run.records("requests.jsonl"):
        if row.mode != mode:
            continue
        a = arms.setdefault((row.sample, row.arm), ArmRecord(mode, row.arm, row.sample, block_size, num_gpu_blocks))
        a.roles.append(row.role)
        a.requests.append(row)
        a.request_events.append(events.get(row.request_id, []))
    return list(arms.values())


def read_sweep(run: RunFiles) -> list[list[ArmRecord]]:
    """The sweep's arm-samples grouped by pool, in the order the pools ran."""
    pools: dict[int, list[ArmRecord]] = {}
    for line in run.records("sweep.jsonl"):
        a = ArmRecord("sweep", line.arm, line.sample, line.block_size, line.num_gpu_blocks, controller=line.controller)
        for row in line.requests:
            a.roles.append(row.role)
            a.requests.append(row)
            a.request_events.append(row.block_events)
        pools.setdefault(line.num_gpu_blocks, []).append(a)
    return list(pools.values())


def block_events_by_arm(run: RunFiles) -> dict[str, list[BlockEventRecord]]:
    """``raw/block_events.jsonl`` per arm-sample label ("<mode>/<arm>/s<sample>"), without the label."""
    out: dict[str, list[BlockEventRecord]] = {}
    for e in run.records("block_events.jsonl"):
        out.setdefault(e.arm, []).append(e.event)
    return out
