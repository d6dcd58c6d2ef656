"""The standard arms: how a shared context can reach a group of follow-up requests.

    arm         engine                 the context before the follow-ups arrive          preparation
    retain      with an external tier  vLLM + LMCache's in-memory copy (kept)            one-token warm-up loads it from disk
    discard     with an external tier  vLLM only (LMCache dropped its copy after loading) one-token warm-up loads it from disk
    recompute   plain vLLM             nowhere: vLLM's prefix cache is reset             none
    resident    plain vLLM             vLLM's prefix cache (already in vLLM's KV)        a full prefill computes it

``retain`` and ``discard`` differ only in LMCache's retention decision; ``recompute`` and ``resident``
bracket them (nothing cached / everything already in the engine). Sections 16 and 20 build their
tables from these rows, so every row names where the data started and how it reached the engine.
An external tier in GPU memory is a separate arm; where the installed stack has none it is a row
marked not available, never the host path relabelled.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arm:
    name: str
    external: bool  # runs on an engine with an LMCache connector
    retain: bool | None  # LMCache keeps its in-memory copy after loading vLLM (external arms)
    warm_up: bool  # a warm-up request puts the context into vLLM before the follow-ups
    data_start: str = ""  # where the shared context starts (external arms: the tier's)
    route: str = ""  # how it reaches the engine (external arms: the tier's)
    head_start_bound: bool = False  # the warm-up must finish within the head start

    def describe(self, tier=None) -> dict[str, str]:
        """The row labels: the tier's data start and route for external arms, the arm's own otherwise."""
        if self.external and tier is not None:
            return {"data_start": tier.data_start, "route": tier.route}
        return {"data_start": self.data_start, "route": self.route}


RETAIN = Arm("retain", external=True, retain=True, warm_up=True, head_start_bound=True)
DISCARD = Arm("discard", external=True, retain=False, warm_up=True, head_start_bound=True)
RECOMPUTE = Arm("recompute", external=False, retain=None, warm_up=False,
                data_start="nowhere (no external cache; vLLM prefix cache reset)",
                route="recomputed by the follow-ups' prefill")
RESIDENT = Arm("resident", external=False, retain=None, warm_up=True,
               data_start="vLLM prefix cache (engine-resident)", route="none: already in the engine's KV")

ARMS = {a.name: a for a in (RETAIN, DISCARD, RECOMPUTE, RESIDENT)}
EXTERNAL_ARMS = ("retain", "discard")
CONTROL_ARMS = ("recompute", "resident")


def pair_order(arms: tuple[str, ...] | list[str], pair_index: int) -> list[str]:
    """Arm order inside pair ``pair_index``: as given for even pairs, reversed for odd ones."""
    return list(arms) if pair_index % 2 == 0 else list(reversed(arms))
