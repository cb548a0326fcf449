"""Reading what `kvops advise` replays: a JSONL trace, an ab-test `records.jsonl`, or a workload
spec (YAML file or preset name).

Trace lines are read by `kvops.workload.trace` (its docstring lists the fields), the same reader
`kvops ab-test --trace` uses: `timestamp` (ms) or `arrival_s`, a prompt (`prompt_token_ids`, text
tokenized with the model's Hugging Face tokenizer when `transformers` and the tokenizer files are
available locally, else one token per whitespace-separated word, and the report says so; or
`hash_ids` of `--hash-block-tokens` tokens with `input_length`), an output length, and for
session traces `session_id` and `delay`. A session's turns are replayed as a conversation in
closed loop, each prompting with its whole context. A line that is not a JSON object of that
shape is reported with its number and skipped, or, with `strict`, fails the whole read; a line
that cannot be placed in time always fails it; a field kvops does not use is named in a note.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from kvops.advise.workload import ANSWER_LINE_BASE, Group, TraceRequest, Workload
from kvops.sim.tokenizer import WordTokenizer
from kvops.workload.generate import Alphabet, make_prefixes, plan_iteration
from kvops.workload.schedule import arrival_offsets_s, batch_groups
from kvops.workload.spec import (
    PRESET_NAMES,
    WorkloadSpec,
    WorkloadSpecError,
    load_preset,
    load_spec_file,
)
from kvops.workload.trace import (
    Conversation,
    Trace,
    TraceError,
    TraceOptions,
    bounded_lines,
    read_trace,
)

MAX_SHOWN_SKIPS = 20

__all__ = ["ReadOptions", "TraceError", "load_workload", "read_lines", "spec_workload"]

# One set of options for both readers (the name `kvops advise` has always used).
ReadOptions = TraceOptions

Tokenize = Callable[[str], list[int]]


def word_tokenizer(vocab_size: int) -> Tokenize:
    return WordTokenizer(vocab_size).encode


def model_tokenizer(hf_name: str) -> Tokenize | None:
    """The model's own tokenizer when `transformers` and its files are available locally
    (never downloads); None otherwise."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return None
    try:
        tok = AutoTokenizer.from_pretrained(hf_name, local_files_only=True)
    except (OSError, ValueError):
        return None

    def encode(text: str) -> list[int]:
        return list(tok.encode(text))

    return encode


def _is_abtest_record(obj: Any) -> bool:
    return isinstance(obj, dict) and "chunk_offsets_ms" in obj and "request_id" in obj


def read_lines(
    lines: Iterable[str],
    source: str,
    options: ReadOptions,
    tokenize: Tokenize,
    tokenizer_note: str | None = None,
) -> Workload:
    """A JSONL trace (or ab-test records) as a workload. Malformed lines are reported by number
    and skipped; under `strict` the first one raises TraceError."""
    return read_numbered(enumerate(lines, start=1), source, options, tokenize, tokenizer_note)


def read_numbered(
    lines: Iterable[tuple[int, str | None]],
    source: str,
    options: ReadOptions,
    tokenize: Tokenize,
    tokenizer_note: str | None = None,
) -> Workload:
    """`read_lines` over numbered lines (`kvops.workload.trace.bounded_lines`: a line too long
    to read comes as None)."""
    records: list[tuple[int, dict[str, Any]]] = []

    def divert(number: int, obj: Any) -> bool:
        if _is_abtest_record(obj):
            records.append((number, obj))
            return True
        return False

    trace = read_trace(lines, source, options, tokenize, divert)
    if records:
        if trace.conversations:
            raise TraceError(f"{source}: mixes ab-test records and trace lines")
        return records_workload(records, source, trace.skipped, options)
    if not trace.conversations:
        skipped = trace.skipped
        why = f"; {len(skipped)} malformed line(s), first: {skipped[0]}" if skipped else ""
        raise TraceError(f"{source}: no requests to replay{why}")
    notes = [tokenizer_note] if trace.used_text and tokenizer_note else []
    return trace_workload(trace, notes + trace.warnings)


def trace_workload(trace: Trace, notes: list[str]) -> Workload:
    """A trace as one open group of requests and sessions' first turns, the later turns as
    follow-ups (closed loop), each turn prompting with its whole context."""
    heads: list[TraceRequest] = []
    followups: dict[int, TraceRequest] = {}
    for conv in trace.conversations:
        if not conv.session:
            (turn,) = conv.turns
            heads.append(
                TraceRequest(conv.start_s, turn.new_tokens, turn.output_tokens,
                             turn.token_ids, turn.hash_ids, turn.line)
            )  # fmt: skip
            continue
        chain = session_requests(conv)
        heads.append(chain[0])
        for before, after in itertools.pairwise(chain):
            followups[before.line] = after
    if any(c.session for c in trace.conversations):
        notes = [*notes, _session_note(trace)]
    group = Group(heads)
    return Workload(
        trace.source, "trace", [group], trace.hash_block_tokens, notes, trace.skipped, followups
    )


def session_requests(conv: Conversation) -> list[TraceRequest]:
    """A session's turns as requests whose prompts are the whole context so far: the earlier
    turns' new tokens and answers (an answer is unique tokens of the turn's output length: the
    engine's own answer is not known before it is generated), then the turn's new tokens."""
    out: list[TraceRequest] = []
    context = 0
    for k, turn in enumerate(conv.turns):
        new = TraceRequest(
            0.0, turn.new_tokens, turn.output_tokens, turn.token_ids, turn.hash_ids, turn.line
        )
        if k == 0:
            parts: tuple[TraceRequest, ...] = (new,)
            arrival, delay = conv.start_s, None
        else:
            prev = conv.turns[k - 1]
            answer = TraceRequest(0.0, prev.output_tokens, 1, line=ANSWER_LINE_BASE + prev.line)
            parts = (out[-1], answer, new)
            arrival, delay = turn.at_s or 0.0, turn.delay_s or 0.0
        context += turn.new_tokens
        out.append(
            TraceRequest(arrival, context, turn.output_tokens, line=turn.line, context=parts,
                         delay_s=delay)
        )  # fmt: skip
        context += turn.output_tokens
    return out


def _session_note(trace: Trace) -> str:
    turns = sum(len(c.turns) for c in trace.conversations if c.session)
    return (
        f"session trace: {trace.num_sessions} session(s), {turns} turns replayed as "
        "conversations in closed loop (each turn sent its delay after the previous answer, "
        "prompting with the whole context so far; answers stand in as tokens of their length)"
    )


def records_workload(
    records: list[tuple[int, dict[str, Any]]],
    source: str,
    skipped: list[str],
    options: ReadOptions,
) -> Workload:
    """An ab-test `records.jsonl` as a trace: one arm's requests (the first arm recorded; every
    arm sent the same prompts) at their recorded send times. Prompts are not in the records, so
    each becomes its prefix (by `prefix_id`, one shared hash block run per prefix) plus a unique
    rest; the prefix length comes from the run's `workloads/<scenario>.yaml` beside the file."""
    arms = [str(obj.get("arm", "")) for _, obj in records]
    arm = arms[0]
    chosen = [(n, obj) for n, obj in records if str(obj.get("arm", "")) == arm]
    run = Path(source).parent
    prefix_len = _run_prefix_lengths(run)
    notes = [
        f"ab-test records: replaying arm '{arm}' ({len(chosen)} of {len(records)} records) at "
        "the recorded send times (open loop)"
    ]
    block = options.hash_block_tokens
    requests: list[TraceRequest] = []
    unknown_prefix: set[str] = set()
    for number, obj in chosen:
        prompt = obj.get("prompt_tokens") or obj.get("intended_prompt_tokens")
        output = obj.get("output_tokens") or obj.get("intended_output_tokens")
        send = obj.get("send_perf_s")
        if not isinstance(prompt, int) or not isinstance(output, int) or prompt < 1 or output < 1:
            message = f"{source}:{number}: record without prompt/output token counts"
            if options.strict:
                raise TraceError(message + " (--strict)")
            skipped.append(message)
            continue
        scenario = str(obj.get("scenario", ""))
        prefix_id = obj.get("prefix_id")
        hashes: tuple[int, ...] = ()
        if isinstance(prefix_id, int):
            length = prefix_len.get(scenario)
            if length is None:
                unknown_prefix.add(scenario)
            else:
                # A distinct id range per (scenario, prefix): whole blocks of the prefix only.
                base = (abs(hash_key(scenario)) % 1_000_000 * 1000 + prefix_id) * 10_000
                hashes = tuple(base + i for i in range(min(length, prompt) // block))
        arrival = float(send) if isinstance(send, int | float) else 0.0
        requests.append(TraceRequest(arrival, prompt, output, hash_ids=hashes, line=number))
    replayed = sorted({str(o.get("scenario", "")) for _, o in chosen} & set(_run_traces(run)))
    if replayed:
        notes.append(
            f"ab-test records of a trace replay ({', '.join(replayed)}): replayed here as "
            "independent requests at their send times; `kvops advise` on the run's "
            "workloads/<scenario>.trace.jsonl replays the trace itself, sessions included"
        )
    if unknown_prefix:
        notes.append(
            "no workloads/<scenario>.yaml beside the records for "
            f"{', '.join(sorted(unknown_prefix))}: their prompts are treated as unique"
        )
    if not requests:
        raise TraceError(f"{source}: no usable ab-test records")
    start = min(r.arrival_s for r in requests)
    ordered = sorted((_shift(r, start) for r in requests), key=lambda r: (r.arrival_s, r.line))
    return Workload(source, "records", [Group(ordered)], block, notes, skipped)


def _shift(req: TraceRequest, start_s: float) -> TraceRequest:
    if not start_s:
        return req
    return TraceRequest(
        req.arrival_s - start_s, req.prompt_len, req.output_tokens, req.token_ids, req.hash_ids,
        req.line,
    )  # fmt: skip


def hash_key(text: str) -> int:
    """A stable (process-independent) integer for a string."""
    return zlib.crc32(text.encode())


def _run_traces(run_dir: Path) -> set[str]:
    """The scenarios of an ab-test run that replayed a trace (`--trace`)."""
    copies = (run_dir / "workloads").glob("*.trace.jsonl")
    return {path.name.removesuffix(".trace.jsonl") for path in copies}


def _run_prefix_lengths(run_dir: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for path in sorted((run_dir / "workloads").glob("*.yaml")):
        try:
            spec = load_spec_file(path)
        except WorkloadSpecError:
            continue
        if spec.num_prefixes:
            out[path.stem] = spec.prefix_tokens
    return out


def spec_workload(spec: WorkloadSpec, vocab_size: int, source: str) -> Workload:
    """A workload spec as the model sees it from `kvops ab-test`: the same prompts (token ids
    below the model's vocabulary), batch mode as closed groups, rate mode as one open group per
    iteration (each released when the previous iteration finished)."""
    alphabet = Alphabet.from_vocab_size(vocab_size)
    prefixes = make_prefixes(spec, alphabet)
    groups: list[Group] = []
    line = 0
    for iteration in range(spec.iterations):
        planned = plan_iteration(spec, alphabet, prefixes, trial=0, iteration=iteration)
        reqs: list[TraceRequest] = []
        for p in planned:
            line += 1
            ids = np.asarray(p.request.prompt, dtype=np.int64)
            reqs.append(TraceRequest(0.0, int(ids.shape[0]), spec.output_tokens, ids, line=line))
        if spec.rate is None:
            for group in batch_groups(len(reqs), spec.batch_size):
                groups.append(Group([reqs[i] for i in group], closed=True))
        else:
            offsets = arrival_offsets_s(spec, len(reqs), key=(0, iteration))
            timed = [_at(r, t) for r, t in zip(reqs, offsets, strict=True)]
            groups.append(Group(timed, closed=True))
    notes = [f"workload spec '{spec.name}': {spec.description}".rstrip(": ")]
    return Workload(source, "spec", groups, notes=notes)


def _at(req: TraceRequest, arrival_s: float) -> TraceRequest:
    return TraceRequest(arrival_s, req.prompt_len, req.output_tokens, req.token_ids, line=req.line)


def load_workload(
    what: str,
    options: ReadOptions,
    vocab_size: int,
    hf_name: str,
) -> Workload:
    """TRACE as given on the command line: a preset name, a workload YAML, or a JSONL file."""
    if what in PRESET_NAMES:
        return spec_workload(load_preset(what), vocab_size, f"preset {what}")
    path = Path(what)
    if path.suffix in (".yaml", ".yml"):
        try:
            spec = load_spec_file(path)
        except WorkloadSpecError as exc:
            raise TraceError(str(exc)) from None
        return spec_workload(spec, vocab_size, str(path))
    if not path.is_file():
        presets = ", ".join(PRESET_NAMES)
        raise TraceError(
            f"{what}: no such file (give a JSONL trace, a workload YAML, or a preset: {presets})"
        )
    tokenize = model_tokenizer(hf_name)
    note = None
    if tokenize is None:
        tokenize = word_tokenizer(vocab_size)
        note = (
            f"text prompts: the tokenizer of {hf_name} is not available here, so each "
            "whitespace-separated word counts as one token (install transformers and the "
            "tokenizer files for exact counts)"
        )
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            return read_numbered(bounded_lines(fh), str(path), options, tokenize, note)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
