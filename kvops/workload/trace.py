"""Traces: JSONL request logs, read as conversations and placed in time.

One JSON object per line, keys in any order:
- time: `timestamp` (milliseconds, Mooncake FAST'25 and AIPerf) or `arrival_s` (seconds) for a
  request or the first turn of a session; `delay` (milliseconds) for a later turn of a session:
  sent that long after the previous turn's answer completed (closed loop);
- `session_id` (string or integer): the line is a turn of that conversation, turns in file order;
- prompt, one of: `prompt_token_ids` (list of ints); `prompt`, `text` or `text_input` (a string,
  tokenized by the caller); `hash_ids` (ids of `hash_block_tokens`-token blocks, equal ids mean an
  equal block) with `input_length` (or `prompt_len`) tokens, or `input_length` alone (a prompt
  shared with no other);
- output: `output_tokens`, `output_length` (Mooncake) or `max_tokens`.

A session turn's prompt fields describe only its NEW tokens; the prompt actually sent is the
whole context so far: every earlier turn's new tokens and answer, then this turn's new tokens.
That is how AIPerf replays Mooncake traces with `session_id` (its `deltas_without_responses`
context mode: https://github.com/ai-dynamo/aiperf/blob/main/docs/reference/conversation-context-mode.md).
Reading a session trace as independent short prompts would make multi-turn traffic, where
offload pays most, look like unique one-shot traffic.

Why every line must be placed in time: a turn without a time used to arrive at 0 beside the
trace's first request, silently turning a paced conversation into a burst. So in a trace that
has times at all, a line without one is an error naming its line, as is a `delay` with no earlier
turn to follow; a trace with no time anywhere is sent all at once, and says so. A field kvops
does not use is a warning naming it: the replay differs from what the trace describes there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from kvops.errors import KvopsError

TokenArray = npt.NDArray[np.int64]
Tokenize = Callable[[str], Sequence[int]]

# A 100,000-token `prompt_token_ids` line is about 0.7 MB; a text prompt of the longest
# contexts served today a few MB. A line past this is refused, never held whole in memory.
MAX_LINE_CHARS = 16 * 1024 * 1024
MAX_SESSION_ID_CHARS = 256
# A replay waits for every time the trace gives; one past this is a unit mistake or a hostile
# line, not traffic to wait for.
MAX_TIME_S = 30 * 86_400.0
# No model serves a context this long (the longest are about 1M tokens); a session growing past
# it is refused rather than replayed, as its turns' prompts would be built over and over.
MAX_CONTEXT_TOKENS = 1 << 22
MAX_FIELD_WARNINGS = 20
MAX_LINES_NAMED = 5

TEXT_KEYS = ("prompt", "text", "text_input")
OUTPUT_KEYS = ("output_tokens", "output_length", "max_tokens")
LENGTH_KEYS = ("input_length", "prompt_len")


class TraceError(KvopsError, ValueError):
    """The trace cannot be replayed as written (unreadable, empty, a line that cannot be placed
    in time, or a bad line under --strict); the message names the line."""


class LineError(ValueError):
    """One malformed line: the message names what is wrong with it."""


@dataclass(frozen=True)
class TraceOptions:
    strict: bool = False
    hash_block_tokens: int = 512
    default_output_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class TraceTurn:
    """One line: a request, or one turn of a session. Exactly one of `token_ids` and `hash_ids`
    is set; `new_tokens` is the length of the tokens this line adds (its whole prompt when it
    belongs to no session). `at_s` is its time in the trace (a later turn's shifted so the trace
    starts at 0; a first turn's start is its conversation's `start_s`), `delay_s` its wait
    after the previous turn's answer."""

    line: int
    new_tokens: int
    output_tokens: int
    token_ids: TokenArray | None = None
    hash_ids: tuple[int, ...] | None = None
    session_id: str | None = None
    at_s: float | None = None
    delay_s: float | None = None
    from_text: bool = False


@dataclass(frozen=True, slots=True)
class Conversation:
    """A session's turns in order (or one request alone), starting at `start_s`."""

    key: str
    start_s: float
    turns: tuple[TraceTurn, ...]
    session: bool = False

    def context_tokens(self, k: int) -> int:
        """Turn k's whole prompt: the new tokens and answers of turns 0..k-1, then its own."""
        earlier = sum(t.new_tokens + t.output_tokens for t in self.turns[:k])
        return earlier + self.turns[k].new_tokens


@dataclass
class Trace:
    """Everything to replay, in order of first arrival, and what the reader had to say."""

    source: str
    conversations: list[Conversation]
    hash_block_tokens: int = 512
    warnings: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    timed: bool = True

    @property
    def num_requests(self) -> int:
        return sum(len(c.turns) for c in self.conversations)

    @property
    def num_sessions(self) -> int:
        return sum(1 for c in self.conversations if c.session)

    @property
    def used_text(self) -> bool:
        return any(t.from_text for c in self.conversations for t in c.turns)


def _number(obj: dict[str, Any], key: str) -> float | None:
    if key not in obj:
        return None
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LineError(f"{key} must be a number, got {_short(value)}")
    if not math.isfinite(value) or value < 0:
        raise LineError(f"{key} must be a finite number >= 0, got {_short(value)}")
    return float(value)


def _first(obj: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        if key in obj:
            return key
    return None


def _count(obj: dict[str, Any], key: str | None, minimum: int) -> int | None:
    value = None if key is None else _number(obj, key)
    if value is None:
        return None
    if value != int(value) or value < minimum:
        raise LineError(f"{key} must be an integer >= {minimum}, got {value:g}")
    return int(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _ids(value: Any, key: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 2**62 for h in value
    ):
        raise LineError(f"{key} must be a list of integers in [0, 2**62)")
    return value


def _session(obj: dict[str, Any]) -> str | None:
    if "session_id" not in obj:
        return None
    value = obj["session_id"]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise LineError(f"session_id must be a string or an integer, got {_short(value)}")
    text = str(value)
    if not text or len(text) > MAX_SESSION_ID_CHARS:
        raise LineError(f"session_id must be 1 to {MAX_SESSION_ID_CHARS} characters")
    return text


def parse_line(
    obj: Any, line: int, options: TraceOptions, tokenize: Tokenize
) -> tuple[TraceTurn, set[str]]:
    """One decoded line as a turn, with the keys it used; LineError says what is wrong."""
    if not isinstance(obj, dict):
        raise LineError(f"expected a JSON object, got {type(obj).__name__}")
    used: set[str] = set()
    at_s = _number(obj, "arrival_s")
    if at_s is not None:
        used.add("arrival_s")
    else:
        ms = _number(obj, "timestamp")
        at_s = None if ms is None else ms / 1e3
        used.add("timestamp")
    delay_ms = _number(obj, "delay")
    used |= {"delay", "session_id"}
    for value_s in (at_s, None if delay_ms is None else delay_ms / 1e3):
        if value_s is not None and value_s > MAX_TIME_S:
            raise LineError(f"a time or delay of {value_s:,.0f} s is past the 30 days kvops waits")
    session = _session(obj)
    out_key = _first(obj, OUTPUT_KEYS)
    output = _count(obj, out_key, 1)
    if output is None:
        if options.default_output_tokens is None:
            raise LineError("no output length (output_tokens, output_length or max_tokens)")
        output = options.default_output_tokens
    used.add(out_key or "")
    common: dict[str, Any] = {
        "line": line, "output_tokens": output, "session_id": session, "at_s": at_s,
        "delay_s": None if delay_ms is None else delay_ms / 1e3,
    }  # fmt: skip
    if "prompt_token_ids" in obj:
        ids = obj["prompt_token_ids"]
        if not isinstance(ids, list) or not ids:
            raise LineError("prompt_token_ids must be a non-empty list of integers")
        array = np.asarray(_ids(ids, "prompt_token_ids"), dtype=np.int64)
        used.add("prompt_token_ids")
        return TraceTurn(new_tokens=len(ids), token_ids=array, **common), used
    text_key = _first(obj, TEXT_KEYS)
    if text_key is not None:
        text = obj[text_key]
        if not isinstance(text, str):
            raise LineError(f"{text_key} must be a string")
        tokens = tokenize(text)
        if not tokens:
            raise LineError(f"{text_key} is empty: a prompt needs at least one token")
        array = np.asarray(tokens, dtype=np.int64)
        used.add(text_key)
        return TraceTurn(new_tokens=len(tokens), token_ids=array, from_text=True, **common), used
    length_key = _first(obj, LENGTH_KEYS)
    if "hash_ids" in obj or length_key is not None:
        # input_length alone (as AIPerf reads it): a prompt of that length shared with none
        hashes = _ids(obj.get("hash_ids", []), "hash_ids")
        length = _count(obj, length_key, 1)
        if length is None:
            raise LineError("hash_ids needs input_length (the prompt's length in tokens)")
        # Fewer ids than blocks is allowed (the rest is unique); more ids than fit is not.
        if len(hashes) > -(-length // options.hash_block_tokens):
            raise LineError(
                f"{len(hashes)} hash_ids of {options.hash_block_tokens} tokens do not fit "
                f"input_length {length} (wrong --hash-block-tokens?)"
            )
        used |= {"hash_ids", length_key or ""}
        return TraceTurn(new_tokens=length, hash_ids=tuple(hashes), **common), used
    raise LineError(
        "no prompt: give prompt_token_ids, prompt/text/text_input, or hash_ids + input_length"
    )


def bounded_lines(fh: IO[str], limit: int = MAX_LINE_CHARS) -> Iterator[tuple[int, str | None]]:
    """(line number, text) per line; text is None for a line longer than `limit` characters,
    whose rest is read past in pieces rather than held."""
    number = 0
    while True:
        text = fh.readline(limit + 1)
        if not text:
            return
        number += 1
        if len(text) <= limit or text.endswith("\n"):
            yield number, text
            continue
        while text and not text.endswith("\n"):
            text = fh.readline(limit)
        yield number, None


@dataclass
class _UnusedFields:
    """Keys a line carried that kvops did not use, with the lines they were on."""

    lines: dict[str, list[int]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, obj: dict[str, Any], used: set[str], line: int) -> None:
        for key in obj:
            if key in used:
                continue
            if key not in self.counts and len(self.counts) >= MAX_FIELD_WARNINGS:
                self.counts["..."] = self.counts.get("...", 0) + 1
                continue
            self.counts[key] = self.counts.get(key, 0) + 1
            named = self.lines.setdefault(key, [])
            if len(named) < MAX_LINES_NAMED:
                named.append(line)

    def warnings(self, source: str) -> list[str]:
        out = []
        for key, count in self.counts.items():
            if key == "...":
                out.append(
                    f"{source}: {count} more uses of other unused fields (only the first "
                    f"{MAX_FIELD_WARNINGS} field names are shown)"
                )
                continue
            named = self.lines[key]
            where = ", ".join(str(n) for n in named)
            more = f" and {count - len(named)} more" if count > len(named) else ""
            out.append(
                f"{source}: field {_short(key)} is not used by kvops (line {where}{more}): "
                "the replay ignores it"
            )
        return out


def read_trace(
    lines: Iterable[tuple[int, str | None]],
    source: str,
    options: TraceOptions,
    tokenize: Tokenize,
    divert: Callable[[int, Any], bool] | None = None,
) -> Trace:
    """Numbered lines (`bounded_lines`) as a trace. A malformed line is reported by number and
    skipped, or under `strict` raises TraceError; a line that cannot be placed in time always
    raises. `divert(number, obj)` may claim a decoded line for the caller (it then is not a
    turn): `kvops advise` takes ab-test records that way. The trace may be empty (the caller
    says whether that is an error)."""
    turns: list[TraceTurn] = []
    skipped: list[str] = []
    unused = _UnusedFields()
    for number, raw in lines:
        try:
            if raw is None:
                raise LineError(f"longer than {MAX_LINE_CHARS:,} characters, not read")
            text = raw.strip()
            if not text:
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise LineError(f"not JSON ({exc.msg} at column {exc.colno})") from None
            except RecursionError:
                raise LineError("not JSON (nested too deeply)") from None
            if divert is not None and divert(number, obj):
                continue
            turn, used = parse_line(obj, number, options, tokenize)
        except LineError as exc:
            message = f"{source}:{number}: {exc}"
            if options.strict:
                raise TraceError(message + " (--strict)") from None
            skipped.append(message)
            continue
        unused.add(obj, used, number)
        turns.append(turn)
    trace = assemble(turns, source, options.hash_block_tokens)
    trace.warnings = unused.warnings(source) + trace.warnings
    trace.skipped = skipped
    return trace


def assemble(turns: list[TraceTurn], source: str, hash_block_tokens: int = 512) -> Trace:
    """Turns (in file order) as conversations placed in time; TraceError names the first line
    that cannot be placed."""
    timed = any(t.at_s is not None or t.delay_s is not None for t in turns)

    def fail(turn: TraceTurn, why: str) -> TraceError:
        return TraceError(f"{source}:{turn.line}: {why}")

    sessions: dict[str, list[TraceTurn]] = {}
    grown: dict[str, int] = {}  # each session's context so far, answers included
    ordered: list[list[TraceTurn]] = []  # conversations in order of their first line
    for t in turns:
        if t.at_s is not None and t.delay_s is not None:
            raise fail(t, "has both a time (timestamp/arrival_s) and a delay: give one")
        if t.session_id is None:
            if t.delay_s is not None:
                raise fail(
                    t, "delay without session_id: a delay counts from the previous turn's "
                    "answer, and this line belongs to no session"
                )  # fmt: skip
            if t.at_s is None and timed:
                raise fail(t, "no timestamp (or arrival_s): kvops cannot place it in time")
            ordered.append([t])
            continue
        earlier = sessions.get(t.session_id)
        if earlier is None:
            if t.delay_s is not None:
                raise fail(
                    t, f"session {_short(t.session_id)} starts with a delay, but its first "
                    "turn has no earlier answer to wait for: give it a timestamp"
                )  # fmt: skip
            if t.at_s is None and timed:
                raise fail(
                    t, f"the first turn of session {_short(t.session_id)} has no timestamp "
                    "(or arrival_s): kvops cannot place it in time"
                )  # fmt: skip
            sessions[t.session_id] = earlier = [t]
            grown[t.session_id] = t.new_tokens + t.output_tokens
            ordered.append(earlier)
            continue
        if t.at_s is None and t.delay_s is None:
            raise fail(
                t, f"turn {len(earlier) + 1} of session {_short(t.session_id)} has neither "
                "a delay (after the previous answer) nor a timestamp"
            )  # fmt: skip
        earlier.append(t)
        context = grown[t.session_id] + t.new_tokens
        grown[t.session_id] = context + t.output_tokens
        if context > MAX_CONTEXT_TOKENS:
            raise fail(
                t, f"session {_short(t.session_id)} reaches a context of {context:,} tokens "
                f"at this turn, past the {MAX_CONTEXT_TOKENS:,} kvops replays"
            )  # fmt: skip
    origin = min((c[0].at_s or 0.0 for c in ordered), default=0.0)
    # a first turn's time is its conversation's start; only later turns keep their own
    conversations = [_conversation(c, origin) for c in ordered]
    # stable: equal starts keep file order
    conversations.sort(key=_start_s)
    notes = []
    if turns and not timed:
        notes.append(
            f"{source}: no line has a timestamp, arrival_s or delay: every request (every "
            "session's first turn) is sent at once"
        )
    return Trace(source, conversations, hash_block_tokens, notes, timed=timed)


def _conversation(turns: list[TraceTurn], origin_s: float) -> Conversation:
    first = turns[0]
    key = first.session_id or f"line {first.line}"
    start_s = (first.at_s or 0.0) - origin_s
    return Conversation(key, start_s, _shift_later(turns, origin_s), first.session_id is not None)


def _start_s(conv: Conversation) -> float:
    return conv.start_s


def _shift_later(turns: list[TraceTurn], origin_s: float) -> tuple[TraceTurn, ...]:
    if len(turns) == 1 or not origin_s:
        return tuple(turns)
    return (turns[0], *(_shift(t, origin_s) for t in turns[1:]))


def _shift(turn: TraceTurn, origin_s: float) -> TraceTurn:
    if turn.at_s is None:
        return turn
    return TraceTurn(
        turn.line, turn.new_tokens, turn.output_tokens, turn.token_ids, turn.hash_ids,
        turn.session_id, turn.at_s - origin_s, turn.delay_s, turn.from_text,
    )  # fmt: skip
