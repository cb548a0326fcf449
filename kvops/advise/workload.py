"""What `kvops advise` replays: requests in release groups, and how each becomes model tokens.

A trace is one open group (every request, or session's first turn, at its own recorded arrival);
a session's later turns follow in closed loop (`Workload.followups`: each is released its
`delay_s` after the previous turn's answer), each prompting with its whole context. A batch-mode
workload spec is a series of closed groups: each is released when the previous one has finished,
the way `kvops ab-test` drives a server. A request's prompt is held in the most compact form its
source gives: token ids, or prefix-block hash ids plus a length (the Mooncake trace format,
FAST'25, github.com/kvcache-ai/Mooncake `FAST25-release/traces`: `hash_ids` name 512-token
blocks, equal ids mean an equal prefix). Hash ids become tokens only when the request is fed to
the model, so a 100,000-request trace never holds every prompt in memory at once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvops.sim.hashing import PromptHasher
from kvops.workload.trace import MAX_CONTEXT_TOKENS

TokenArray = npt.NDArray[np.int64]
# Token ids below this are often control/special tokens; generated ids stay above them.
_LOW_ID = 16


# A session's answers stand in its later prompts as tokens seeded by this plus the turn's line.
ANSWER_LINE_BASE = 1 << 40


@dataclass(frozen=True)
class TraceRequest:
    """One request. At most one of `token_ids`, `hash_ids` and `context` is set (none: a
    unique prompt seeded by `line`); `prompt_len` is the prompt's length in tokens either way.

    A session turn's prompt is its `context`: the conversation so far (`context_parts`: each
    earlier turn's new tokens and answer, then its own new tokens), linked to the session's
    earlier turns rather than copied. `delay_s` (later turns only): released that long after the
    previous turn's answer, and not before `arrival_s` when the trace gave it a time too."""

    arrival_s: float
    prompt_len: int
    output_tokens: int
    token_ids: TokenArray | None = None
    hash_ids: tuple[int, ...] | None = None
    line: int = 0
    context: tuple[TraceRequest, ...] = ()
    delay_s: float | None = None


@dataclass(frozen=True)
class Group:
    """Requests released together. `closed`: released when the previous group finished, with
    arrivals as offsets from that moment; otherwise arrivals are absolute trace times."""

    requests: list[TraceRequest]
    closed: bool = False


@dataclass
class Workload:
    """Everything to replay, where it came from, and what the reader had to assume."""

    source: str
    kind: str  # "trace", "records", "spec"
    groups: list[Group]
    hash_block_tokens: int = 512
    notes: list[str] = field(default_factory=list)
    skipped_lines: list[str] = field(default_factory=list)
    # a session turn's line -> the session's next turn (released after its answer)
    followups: dict[int, TraceRequest] = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return sum(len(g.requests) for g in self.groups) + len(self.followups)

    def requests(self) -> Iterator[TraceRequest]:
        """Every request: the groups' in order, each followed by its session's later turns."""
        for group in self.groups:
            for req in group.requests:
                yield req
                nxt = self.followups.get(req.line)
                while nxt is not None:
                    yield nxt
                    nxt = self.followups.get(nxt.line)


def context_parts(req: TraceRequest) -> list[TraceRequest]:
    """A session turn's prompt parts in order. A turn's `context` is (the previous turn, its
    answer, the new tokens), or (the new tokens) for a first turn: linked, so a session's
    contexts take memory in its number of turns, not its square; walked here without
    recursion, however long the session."""
    stack: list[TraceRequest] = []
    turn = req
    while turn.context and turn.context[0].context:
        stack.extend(reversed(turn.context[1:]))
        turn = turn.context[0]
    stack.extend(reversed(turn.context))
    return stack[::-1]


class PromptBuilder:
    """Token ids the model hashes, for any request; identical prefixes give identical tokens.

    A hash-id block becomes `hash_block_tokens` tokens: the id itself in the first two tokens
    (base vocab), then a fixed filler, so blocks with equal ids are equal token runs and blocks
    with different ids differ, and the model's chained block hashes see exactly the trace's
    prefix sharing. Tokens past the hashed blocks are unique to the request (seeded by its line).
    """

    def __init__(self, vocab_size: int, hash_block_tokens: int, seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.block = hash_block_tokens
        self.seed = seed
        span = vocab_size - _LOW_ID
        self._span = span
        self._filler = (np.arange(hash_block_tokens, dtype=np.int64) * 7919) % span + _LOW_ID

    def tokens(self, req: TraceRequest) -> TokenArray:
        if req.context:
            return np.concatenate([self.tokens(part) for part in context_parts(req)])
        if req.token_ids is not None:
            return req.token_ids
        ids = np.asarray(req.hash_ids or (), dtype=np.int64)
        blocks = np.empty((ids.shape[0], self.block), dtype=np.int64)
        blocks[:] = self._filler
        if ids.shape[0]:
            blocks[:, 0] = ids % self._span + _LOW_ID
            blocks[:, 1] = (ids // self._span) % self._span + _LOW_ID
        flat = blocks.reshape(-1)[: req.prompt_len]
        missing = req.prompt_len - flat.shape[0]
        if missing <= 0:
            return flat
        rng = np.random.default_rng([self.seed, req.line, 1])
        tail = rng.integers(_LOW_ID, self.vocab_size, missing, dtype=np.int64)
        return np.concatenate((flat, tail))


@dataclass(frozen=True)
class Reuse:
    """How much of the traffic repeats earlier prompts, counted in whole chunks (or whole hash
    blocks for hash-id traces): the upper bound on what any prefix cache could serve."""

    prompt_tokens: int
    reusable_tokens: int  # tokens in units some earlier request already had
    shared_working_set_tokens: int  # tokens of the distinct units seen more than once
    distinct_shared_prefixes: int  # distinct first units among requests that share one
    typical_shared_prefix_tokens: int  # median shared length among requests that reuse

    @property
    def reuse_share(self) -> float:
        return self.reusable_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def request_units(
    workload: Workload, builder: PromptBuilder, unit_tokens: int
) -> Iterator[tuple[TraceRequest, list[int], int]]:
    """Each request with the keys of its whole units, in prompt order, and the unit's length:
    `unit_tokens`-token chunks hashed the way LMCache keys them (the simulator's `PromptHasher`,
    chained over the whole prefix), or, for requests given as hash ids, the ids of their full
    blocks directly (one unit per hash block), which needs no tokens at all. Equal keys mean
    equal prefixes up to the unit's end. A trace with sessions is hashed as tokens throughout:
    a session turn's context is not a run of hash ids, and both kinds of key must meet."""
    hasher = PromptHasher(unit_tokens, unit_tokens)
    by_ids = not workload.followups and not any(r.context for r in workload.requests())
    for req in workload.requests():
        if req.hash_ids is not None and by_ids:
            unit = builder.block
            keys = [-1 - h for h in req.hash_ids[: req.prompt_len // unit]]  # full blocks only
        elif req.prompt_len > MAX_CONTEXT_TOKENS:
            unit, keys = unit_tokens, []  # no model takes it: refused unbuilt when replayed
        else:
            unit = unit_tokens
            keys = hasher(builder.tokens(req))[1]
        yield req, keys, unit


def measure_reuse(
    workload: Workload,
    builder: PromptBuilder,
    unit_tokens: int,
    units: Iterable[tuple[TraceRequest, list[int], int]] | None = None,
) -> Reuse:
    """One pass over the prompts' units (`request_units`, or the same already computed)."""
    seen: Counter[int] = Counter()
    first_of: Counter[int] = Counter()
    total = reusable = 0
    shared_tokens = 0
    shared_lengths: list[int] = []
    if units is None:
        units = request_units(workload, builder, unit_tokens)
    for req, keys, unit in units:
        total += req.prompt_len
        hits = 0
        for h in keys:
            if h not in seen:
                break
            hits += 1
        reusable += hits * unit
        if hits:
            shared_lengths.append(hits * unit)
        for h in keys:
            if seen[h] == 1:  # seen once before: now shared
                shared_tokens += unit
            seen[h] += 1
        if keys:
            first_of[keys[0]] += 1
    distinct = sum(1 for c in first_of.values() if c > 1)
    typical = int(np.median(shared_lengths)) if shared_lengths else 0
    return Reuse(total, reusable, shared_tokens, distinct, typical)
