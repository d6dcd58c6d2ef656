"""Mooncake traces: reading them, a seeded synthetic stand-in, their token ids, and their block accesses.

A Mooncake request (FAST'25 release) is ``timestamp`` (ms), ``input_length``, ``output_length`` and
``hash_ids``: one id per 512-token block of the prompt, chained (an id stands for its whole prefix;
the last block may be partial). There is no text, so each id is turned into 512 token ids by a
seeded generator of the id alone (``hash_block_tokens``): the same id gives the same tokens, the
last block is cut to the prompt's length. Two prompts then share exactly as many leading tokens as
their ``hash_ids`` agree on (up to the shorter's cut), which is what the trace says.

Block identities without token ids (``access_trace``): with ``BLOCK_SIZE`` B dividing 512, the
prompt's full B-token block j lies in 512-block ``j // (512 // B)`` at sub-position
``j % (512 // B)``; since ids are chained, ``(hash_id, sub)`` names the block's whole prefix
exactly as vLLM's chained block hash does. Blocks holding output tokens are named by the
prompt they follow (its last id and its length) and their position: the replay engine's
outputs are a function of the prompt (``engine.replay.replay_token``), so equal prompts write
equal output blocks, as in vLLM. The flattened ``bounds.access.AccessTrace`` this gives feeds the
LRU reference and the ideal bound without building a single token list.
"""
from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numba import njit

from kmesh_lib.base.data import data_root, resolve_path
from kmesh_lib.bounds.access import AccessTrace
from kmesh_lib.engine.replay import NUM_SPECIAL_TOKENS

HASH_BLOCK_TOKENS = 512  # Mooncake's block: every hash id stands for 512 prompt tokens (the last may be partial)


@dataclass(frozen=True)
class TraceRequest:
    """One request of a Mooncake trace, as the trace gives it."""

    timestamp_ms: int
    num_prompt_tokens: int
    num_output_tokens: int
    hash_ids: tuple[int, ...]

    def to_dict(self) -> dict:
        return {"timestamp": self.timestamp_ms, "input_length": self.num_prompt_tokens,
                "output_length": self.num_output_tokens, "hash_ids": list(self.hash_ids)}


class TraceFormatError(ValueError):
    """A line that is not a Mooncake request (the message names the line)."""


def parse_request(line: str, where: str) -> TraceRequest:
    try:
        rec = json.loads(line)
        req = TraceRequest(int(rec["timestamp"]), int(rec["input_length"]), int(rec["output_length"]),
                           tuple(int(h) for h in rec["hash_ids"]))
    except (ValueError, KeyError, TypeError) as e:
        raise TraceFormatError(f"{where}: not a Mooncake request ({type(e).__name__}: {str(e)[:80]})") from None
    except RecursionError:
        raise TraceFormatError(f"{where}: not a Mooncake request (nested deeper than Python's parser goes)") from None
    return consistent(req, where)


def consistent(req: TraceRequest, where: str) -> TraceRequest:
    """``req`` when its hash ids cover its prompt (one per 512 tokens, the last maybe partial) and both lengths are
    positive; TraceFormatError naming ``where`` otherwise."""
    want = -(-req.num_prompt_tokens // HASH_BLOCK_TOKENS)
    if req.num_prompt_tokens <= 0 or req.num_output_tokens <= 0 or len(req.hash_ids) != want:
        raise TraceFormatError(f"{where}: {len(req.hash_ids)} hash ids for {req.num_prompt_tokens} prompt tokens "
                               f"(want {want}), output {req.num_output_tokens}")
    return req


def trace_name(cfg) -> str:
    """The trace's file path relative to the data root, or ``synthetic``."""
    if cfg.TRACE_FILE is None:
        return "synthetic"
    path = resolve_path(cfg.TRACE_FILE)
    try:
        return str(path.relative_to(data_root()))
    except ValueError:
        return path.name


MAX_LINE_BYTES = 1 << 20  # a request of 2M tokens has 4,096 hash ids (~40 KB); the traces' longest line is ~3 KB


def load_trace(path: Path, limit: int | None = None) -> list[TraceRequest]:
    """The first ``limit`` requests (all when None) of a Mooncake JSONL trace, in file order.

    Raises TraceFormatError naming the file and line: a line that is not a request, not UTF-8 or longer than
    ``MAX_LINE_BYTES``; a timestamp below 0 or below the line before's (the concurrent replay's clock follows
    them); a file with no request."""
    out, name = [], Path(path).name
    with open(path, "rb") as f:
        for number in itertools.count(1):
            if limit is not None and len(out) >= limit:
                break
            data = f.readline(MAX_LINE_BYTES + 1)
            if not data:
                break
            where = f"{name}:{number}"
            if len(data) > MAX_LINE_BYTES:
                raise TraceFormatError(f"{where}: a line longer than {MAX_LINE_BYTES:,} bytes is no Mooncake request")
            try:
                line = data.decode("utf-8")
            except UnicodeDecodeError as e:
                raise TraceFormatError(f"{where}: not UTF-8 text (byte {e.start})") from None
            if not line.strip():
                continue
            req = parse_request(line, where)
            earlier = out[-1].timestamp_ms if out else 0
            if req.timestamp_ms < earlier:
                raise TraceFormatError(f"{where}: timestamp {req.timestamp_ms} is before "
                                       + (f"the request before's ({earlier})" if out else "0"))
            out.append(req)
    if not out:
        raise TraceFormatError(f"{name}: holds no request")
    return out


def chained(requests) -> tuple[bool, str]:
    """Every hash id is always at the same position after the same id: ids name whole prefixes."""
    where: dict[int, tuple] = {}
    for index, r in enumerate(requests):
        for pos, h in enumerate(r.hash_ids):
            place = (r.hash_ids[pos - 1] if pos else None, pos)
            if where.setdefault(h, place) != place:
                return False, f"request {index}: id {h} at {place}, earlier at {where[h]}"
    return True, f"{len(where)} distinct ids"


def trace_digest(requests: list[TraceRequest]) -> str:
    """SHA-256 of the requests as read (canonical JSON lines): names a synthetic or sliced trace."""
    h = hashlib.sha256()
    for r in requests:
        h.update((json.dumps(r.to_dict(), separators=(",", ":")) + "\n").encode())
    return h.hexdigest()


def synthetic_trace(num_requests: int, seed: int, num_prefixes: int = 4, max_prompt_blocks: int = 6,
                    max_output_tokens: int = 64, mean_gap_ms: float = 200.0) -> list[TraceRequest]:
    """A small seeded trace of Mooncake's format with a shared prefix structure (for smoke and CI).

    ``num_prefixes`` system prompts of 1-2 blocks; each request extends one of them, or (every
    third time, where one exists) continues an earlier conversation of that prefix: the earlier
    request's ids plus new ones, as a next turn does. Ids are chained by construction (a new id
    for every new prefix). Poisson arrivals, partial last blocks, output lengths 1..max.
    """
    rng = np.random.default_rng(seed)
    next_id = 0
    prefixes = []
    for _ in range(num_prefixes):
        n = int(rng.integers(1, 3))
        prefixes.append(tuple(range(next_id, next_id + n)))
        next_id += n
    conversations: list[tuple[int, ...]] = []
    out, t = [], 0.0
    for i in range(num_requests):
        if conversations and i % 3 == 2:
            base = conversations[int(rng.integers(len(conversations)))]
        else:
            base = prefixes[int(rng.integers(num_prefixes))]
        num_new = int(rng.integers(1, max(2, max_prompt_blocks - len(base) + 1)))
        ids = base + tuple(range(next_id, next_id + num_new))
        next_id += num_new
        conversations.append(ids)
        tail = int(rng.integers(1, HASH_BLOCK_TOKENS + 1))
        out.append(TraceRequest(int(t), (len(ids) - 1) * HASH_BLOCK_TOKENS + tail,
                                int(rng.integers(1, max_output_tokens + 1)), ids))
        t += rng.exponential(mean_gap_ms)
    return out


def hash_block_tokens(hash_id: int, vocab_size: int, seed: int) -> np.ndarray:
    """The 512 token ids a hash id stands for: a function of (seed, id) alone; ids 0-3 avoided."""
    rng = np.random.default_rng([seed, hash_id])
    return rng.integers(NUM_SPECIAL_TOKENS, vocab_size, HASH_BLOCK_TOKENS, dtype=np.int64)


def prompt_token_ids(request: TraceRequest, vocab_size: int, seed: int) -> list[int]:
    """The request's prompt: its ids' tokens in order, cut to ``num_prompt_tokens``."""
    parts = [hash_block_tokens(h, vocab_size, seed) for h in request.hash_ids]
    return np.concatenate(parts)[:request.num_prompt_tokens].tolist()


# -- block accesses, from the hash ids --

@dataclass
class TraceAccesses(AccessTrace):
    """An ``AccessTrace`` plus, per request, whether its last KV block is partial.

    vLLM gives the request's last ``(P+O-1) % B`` tokens a block too; it is never cached (no hash), but
    it takes a slot of the pool while the request runs, so the LRU model of ``sim`` evicts one block
    more for it (the ideal need not: it relaxes what running requests hold).

    The per-access fields (``block_hash``, ``is_read``, ``request_index``) are numpy arrays (int64, bool,
    int64), built as such for the compiled passes (a trace is tens of millions of accesses); the per-request
    fields are lists, as in ``AccessTrace``.
    """
    has_partial_block: list[bool] = field(default_factory=list)


def _segments(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For consecutive segments of these lengths, each element's (segment, offset in it): ``[2, 3]`` gives
    ``([0, 0, 1, 1, 1], [0, 1, 0, 1, 2])``."""
    segment = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.cumsum(lengths) - lengths
    return segment, np.arange(len(segment)) - starts[segment]


def _first_seen_numbers(keys: np.ndarray) -> np.ndarray:
    """Each row's number, rows numbered 0, 1, ... as first seen."""
    if not len(keys):
        return np.zeros(0, dtype=np.int64)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    number = np.empty(len(first), dtype=np.int64)
    number[np.argsort(first)] = np.arange(len(first))
    return number[inverse.reshape(-1)]


def access_trace(requests: list[TraceRequest], block_size: int) -> TraceAccesses:
    """``bounds.access.build_access_trace`` for these requests, named from the hash ids (see the module
    docstring). Per request R = (P-1)//B reads, then W = (P+O-1)//B writes.

    Names: hash ids are numbered as first seen (n), so the prompt's full block j is ``n * (512 // B) + sub``
    (sub: its place in its 512-block); a block holding output tokens is numbered after every prompt name, as
    its (last hash id, P, j) is first seen. Both are numbered once over the trace (hash ids in a dict, output
    blocks with ``np.unique``: a few hundred thousand of each), then one compiled pass lays out the accesses
    (tens of millions).
    """
    if HASH_BLOCK_TOKENS % block_size:
        raise ValueError(f"BLOCK_SIZE={block_size} must divide {HASH_BLOCK_TOKENS}")
    per = HASH_BLOCK_TOKENS // block_size
    num_prompt = np.array([r.num_prompt_tokens for r in requests], dtype=np.int64)
    num_output = np.array([r.num_output_tokens for r in requests], dtype=np.int64)
    num_reads = (num_prompt - 1) // block_size
    num_writes = (num_prompt + num_output - 1) // block_size
    num_full_prompt = np.minimum(num_prompt // block_size, num_writes)
    access_start = np.concatenate([[0], np.cumsum(num_reads + num_writes)])

    num_hash_ids = np.array([len(r.hash_ids) for r in requests], dtype=np.int64)
    hash_start = np.cumsum(num_hash_ids) - num_hash_ids
    numbers: dict[int, int] = {}  # hash id -> its number (a dict: the trace's ids are ints of any size)
    hash_numbers = np.fromiter((numbers.setdefault(h, len(numbers)) for r in requests for h in r.hash_ids),
                               dtype=np.int64, count=int(num_hash_ids.sum()))
    num_prompt_names = len(numbers) * per
    owner, k = _segments(num_writes - num_full_prompt)
    last_hash_number = hash_numbers[hash_start + num_hash_ids - 1]
    tail_names = num_prompt_names + _first_seen_numbers(
        np.stack([last_hash_number[owner], num_prompt[owner], num_full_prompt[owner] + k], axis=1))

    block_hash, is_read, request_index = _lay_out_accesses(
        access_start, num_reads, num_full_prompt, per, hash_numbers, hash_start, tail_names,
        np.cumsum(num_writes - num_full_prompt) - (num_writes - num_full_prompt))
    return TraceAccesses(
        block_size=block_size, block_hash=block_hash, is_read=is_read, request_index=request_index,
        num_prompt_tokens=num_prompt.tolist(), num_read_blocks=num_reads.tolist(), access_start=access_start.tolist(),
        has_partial_block=((num_prompt + num_output - 1) % block_size != 0).tolist())


@njit(cache=True)
def _lay_out_accesses(access_start, num_reads, num_full_prompt, per, hash_numbers, hash_start, tail_names,
                      tail_start):
    """(block_hash, is_read, request_index): request r's accesses at ``access_start[r]``, reads of its written
    blocks 0..R-1, then writes of 0..W-1; written block j is the prompt's (its 512-block's number and place)
    below ``num_full_prompt[r]``, then the request's output blocks in order.

    The arrays are numba's: numpy asks the kernel for huge pages for arrays this large, and on this project's
    2-core box faulting those in first took about 0.9 s for 320 MB against 0.14 s for plain pages."""
    num_accesses_total = access_start[-1]
    block_hash = np.empty(num_accesses_total, dtype=np.int64)
    is_read = np.empty(num_accesses_total, dtype=np.bool_)
    request_index = np.empty(num_accesses_total, dtype=np.int64)
    for r in range(len(num_reads)):
        num_accesses = access_start[r + 1] - access_start[r]
        for step in range(num_accesses):
            pos = access_start[r] + step
            j = step if step < num_reads[r] else step - num_reads[r]
            if j < num_full_prompt[r]:
                block_hash[pos] = hash_numbers[hash_start[r] + j // per] * per + j % per
            else:
                block_hash[pos] = tail_names[tail_start[r] + j - num_full_prompt[r]]
            is_read[pos] = step < num_reads[r]
            request_index[pos] = r
    return block_hash, is_read, request_index


def trace_stats(requests: list[TraceRequest]) -> dict:
    """What a trace is: requests, tokens, distinct 512-token blocks, span, and the share of 512-blocks
    a request shares with some earlier request (the trace's reuse with an unbounded cache)."""
    seen: set[int] = set()
    num_blocks = num_seen = 0
    for r in requests:
        for h in r.hash_ids:
            num_blocks += 1
            num_seen += h in seen
            seen.add(h)
    return {"num_requests": len(requests), "num_prompt_tokens": sum(r.num_prompt_tokens for r in requests),
            "num_output_tokens": sum(r.num_output_tokens for r in requests),
            "max_request_tokens": max((r.num_prompt_tokens + r.num_output_tokens for r in requests), default=0),
            "num_hash_blocks": num_blocks, "num_distinct_hash_blocks": len(seen),
            "num_repeated_hash_blocks": num_seen,
            "span_s": round((requests[-1].timestamp_ms - requests[0].timestamp_ms) / 1e3, 3) if requests else 0.0}
