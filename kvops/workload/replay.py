"""A trace as `kvops ab-test` replays it: concrete prompts for one trial, sessions in order.

The trace (`kvops.workload.trace`) gives the structure: which prompts share which blocks, when
each request or session starts, how long each turn waits after the previous answer. This module
gives the tokens, under the same rules as generated workloads (`kvops.workload.generate`):
- prompts are identical in every arm of a trial, so the arms' figures pair;
- every trial gets fresh tokens (a per-trial shift of every id, fresh unique parts), so a
  persistent KV tier never serves a trial the prompts of another whole (GDS files survive
  `/reset_prefix_cache`), while the trace's own sharing is kept exactly within a trial;
- a hash block is the same tokens wherever it occurs; tokens past a line's blocks, and the
  answers standing in a session's later prompts, are unique.
Token ids and text words of the trace are mapped into the prompt alphabet (ids the served model
accepts), so the replay shows the trace's reuse, not its exact words. A session's answer in its
later prompts is tokens of the answer's recorded length rather than the engine's own answer:
both arms must send the same prompts, and with them vLLM's prefix cache can reuse the earlier
prompt but not the answer's own KV (AIPerf threads the live answer instead:
https://github.com/ai-dynamo/aiperf/blob/main/docs/reference/conversation-context-mode.md).

`--scale` multiplies every length of the trace (blocks, prompts, answers), so a trace keeps its
shape on engines whose KV capacity shrinks alike.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvops.workload.generate import Alphabet, PlannedRequest, SampleRequest, render_picks
from kvops.workload.spec import WorkloadSpec, WorkloadSpecError
from kvops.workload.trace import (
    Conversation,
    Trace,
    TraceError,
    TraceOptions,
    TraceTurn,
    bounded_lines,
    read_trace,
)

# Every prompt of one replay (a trial of one arm) is built before the first is sent, as for
# generated workloads; past this many prompt tokens in all, the client's memory is the limit.
MAX_REPLAY_PROMPT_TOKENS = 20_000_000
_SALT, _TAIL, _ANSWER = 0, 1, 2


def word_ids(text: str) -> list[int]:
    """A text prompt as ids: one per whitespace-separated word, equal words equal ids (the
    replay maps them into the alphabet; exact counts would need the model's tokenizer)."""
    return [zlib.crc32(word.encode()) for word in text.split()]


def load_trace(path: Path, hash_block_tokens: int = 512) -> Trace:
    """A trace file read strictly: a replay that skipped lines would not be the traffic the
    operator meant to test. TraceError names the first problem."""
    options = TraceOptions(strict=True, hash_block_tokens=hash_block_tokens)
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            trace = read_trace(bounded_lines(fh), str(path), options, word_ids)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
    if not trace.conversations:
        raise TraceError(f"{path}: no requests to replay")
    return trace


def _scaled(n: int, scale: float, floor: int) -> int:
    return n if scale == 1.0 else max(floor, round(n * scale))


def turn_lengths(turn: TraceTurn, scale: float) -> tuple[int, int]:
    """(new prompt tokens, output tokens) of a turn at `scale` (outputs keep 2 tokens, so
    TPOT and ITL exist, as `WorkloadSpec.scaled` does)."""
    return _scaled(turn.new_tokens, scale, 1), _scaled(turn.output_tokens, scale, 2)


@dataclass(frozen=True)
class TraceShape:
    requests: int
    sessions: int
    max_prompt_tokens: int
    max_output_tokens: int
    total_prompt_tokens: int


def trace_shape(trace: Trace, scale: float = 1.0) -> TraceShape:
    """The sizes a replay will send, without building a token."""
    longest = longest_out = total = 0
    for conv in trace.conversations:
        context = 0
        for turn in conv.turns:
            new, out = turn_lengths(turn, scale)
            prompt = context + new
            longest, longest_out = max(longest, prompt), max(longest_out, out)
            total += prompt
            context = prompt + out
    return TraceShape(trace.num_requests, trace.num_sessions, longest, longest_out, total)


def trace_spec(path: Path, trace: Trace, scale: float, name: str | None = None) -> WorkloadSpec:
    """The scenario of a trace replay: named after the file; its prompt and output lengths are
    the longest the replay sends (what the arms' context length must hold)."""
    shape = trace_shape(trace, scale)
    if shape.total_prompt_tokens > MAX_REPLAY_PROMPT_TOKENS:
        raise WorkloadSpecError(
            f"{path}: {shape.total_prompt_tokens:,} prompt tokens in all (sessions resend their "
            f"context) exceed the {MAX_REPLAY_PROMPT_TOKENS:,} one replay builds; cut the trace "
            "or give --scale"
        )
    sessions = f" in {shape.sessions} sessions" if shape.sessions else ""
    return WorkloadSpec(
        name=name or path.stem,
        description=f"trace {path.name}: {shape.requests} requests{sessions}",
        prompt_tokens=shape.max_prompt_tokens,
        output_tokens=shape.max_output_tokens,
        requests_per_iteration=shape.requests,
        trace=str(path),
        hash_block_tokens=trace.hash_block_tokens,
        trace_scale=scale,
    )


@dataclass(frozen=True)
class ReplayTurn:
    """A turn to send: released `delay_s` after the previous turn's answer completed (a first
    turn: at its session's start), and not before `at_s` after the replay's start."""

    planned: PlannedRequest
    delay_s: float | None = None
    at_s: float | None = None


@dataclass(frozen=True)
class ReplaySession:
    """A session's turns in order (a request outside any session: one turn)."""

    start_s: float
    turns: tuple[ReplayTurn, ...]


class _Tokens:
    """Alphabet indices of one trial's prompt parts (see the module docstring)."""

    def __init__(self, size: int, block: int, run_seed: int, trial: int) -> None:
        self.size, self.block = size, block
        self.key = (run_seed, trial)
        self.salt = int(np.random.default_rng([*self.key, _SALT]).integers(0, size))
        self.filler = (np.arange(block, dtype=np.int64) * 7919 + self.salt) % size

    def unique(self, n: int, role: int, line: int) -> np.ndarray:
        return np.random.default_rng([*self.key, role, line]).integers(0, self.size, n)

    def new_part(self, turn: TraceTurn, n: int) -> np.ndarray:
        if turn.token_ids is not None:
            return (turn.token_ids[:n] + self.salt) % self.size
        ids = np.asarray(turn.hash_ids or (), dtype=np.int64)[: -(-n // self.block)]
        blocks = np.empty((ids.shape[0], self.block), dtype=np.int64)
        blocks[:] = self.filler
        if ids.shape[0]:
            blocks[:, 0] = (ids + self.salt) % self.size
            if self.block > 1:
                blocks[:, 1] = (ids // self.size + self.salt) % self.size
        flat = blocks.reshape(-1)[:n]
        if flat.shape[0] == n:
            return flat
        return np.concatenate((flat, self.unique(n - flat.shape[0], _TAIL, turn.line)))


def plan_trace(
    trace: Trace,
    alphabet: Alphabet,
    *,
    trial: int,
    run_seed: int = 0,
    scale: float = 1.0,
    id_prefix: str = "",
) -> list[ReplaySession]:
    """Every session of the trace with its prompts for this trial, in order of start."""
    specials = alphabet.special_tokens if alphabet.is_text else 0
    block = _scaled(trace.hash_block_tokens, scale, 1)
    tokens = _Tokens(alphabet.size, block, run_seed, trial)
    return [
        _session(conv, tokens, alphabet, scale, specials, f"{id_prefix}t{trial}")
        for conv in trace.conversations
    ]


def _session(
    conv: Conversation, tokens: _Tokens, alphabet: Alphabet, scale: float, specials: int, tag: str
) -> ReplaySession:
    context: list[np.ndarray] = []
    turns: list[ReplayTurn] = []
    for k, turn in enumerate(conv.turns):
        new, out = turn_lengths(turn, scale)
        if k:
            prev = conv.turns[k - 1]
            context.append(tokens.unique(turn_lengths(prev, scale)[1], _ANSWER, prev.line))
        # a text prompt's server adds its special tokens (BOS) once, in front
        part = tokens.new_part(turn, new)
        context.append(part[specials:] if k == 0 and part.shape[0] > specials else part)
        picks = np.concatenate(context)
        request = SampleRequest(
            request_id=f"{tag}-l{turn.line}",
            prompt=render_picks(alphabet, picks),
            output_tokens=out,
            intended_prompt_tokens=int(picks.shape[0]) + specials,
        )
        planned = PlannedRequest(iteration=0, batch=k, index=turn.line, request=request)
        if k == 0:
            turns.append(ReplayTurn(planned))
        else:
            turns.append(ReplayTurn(planned, turn.delay_s or 0.0, turn.at_s))
    return ReplaySession(conv.start_s, tuple(turns))
