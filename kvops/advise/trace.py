"""Reading what `kvops advise` replays: a JSONL trace, an ab-test `records.jsonl`, or a workload
spec (YAML file or preset name).

Trace lines (one JSON object per request; keys in any order):
- arrival: `arrival_s` (seconds) or `timestamp` (milliseconds, as in the Mooncake traces);
  missing means 0 (all at once);
- prompt, one of: `prompt_token_ids` (list of ints); `prompt` or `text` (a string, tokenized with
  the model's Hugging Face tokenizer when `transformers` and the tokenizer files are available
  locally, else one token per whitespace-separated word, and the report says so); `hash_ids`
  (prefix-block hash ids, `--hash-block-tokens` each, 512 in Mooncake traces) with
  `input_length` (or `prompt_len`) tokens;
- output: `output_tokens`, `output_length` (Mooncake) or `max_tokens`.
A line that is not a JSON object of that shape is reported with its number and skipped, or,
with `strict`, fails the whole read.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvops.advise.workload import Group, TraceRequest, Workload
from kvops.errors import KvopsError
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

MAX_SHOWN_SKIPS = 20


class TraceError(KvopsError, ValueError):
    """The input cannot be replayed at all (unreadable, empty, or a bad line under --strict)."""


class LineError(ValueError):
    """One malformed line: the message names what is wrong with it."""


Tokenize = Callable[[str], list[int]]


@dataclass(frozen=True)
class ReadOptions:
    strict: bool = False
    hash_block_tokens: int = 512
    default_output_tokens: int | None = None


def _number(obj: dict[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        if key in obj:
            value = obj[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise LineError(f"{key} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise LineError(f"{key} must be a finite number >= 0, got {value!r}")
            return float(value)
    return None


def _count(obj: dict[str, Any], keys: tuple[str, ...], minimum: int) -> int | None:
    value = _number(obj, keys)
    if value is None:
        return None
    if value != int(value) or value < minimum:
        raise LineError(f"{'/'.join(keys)} must be an integer >= {minimum}, got {value:g}")
    return int(value)


def parse_trace_line(obj: Any, line: int, options: ReadOptions, tokenize: Tokenize) -> TraceRequest:
    """One trace line (already JSON-decoded) as a request; LineError says what is wrong."""
    if not isinstance(obj, dict):
        raise LineError(f"expected a JSON object, got {type(obj).__name__}")
    arrival_s = _number(obj, ("arrival_s",))
    if arrival_s is None:
        ms = _number(obj, ("timestamp",))
        arrival_s = 0.0 if ms is None else ms / 1e3
    output = _count(obj, ("output_tokens", "output_length", "max_tokens"), 1)
    if output is None:
        if options.default_output_tokens is None:
            raise LineError("no output length (output_tokens, output_length or max_tokens)")
        output = options.default_output_tokens
    if "prompt_token_ids" in obj:
        ids = obj["prompt_token_ids"]
        if not isinstance(ids, list) or not ids:
            raise LineError("prompt_token_ids must be a non-empty list of integers")
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**62 for t in ids):
            raise LineError("prompt_token_ids must hold integers in [0, 2**62) only")
        array = np.asarray(ids, dtype=np.int64)
        return TraceRequest(arrival_s, len(ids), output, token_ids=array, line=line)
    for key in ("prompt", "text"):
        if key in obj:
            text = obj[key]
            if not isinstance(text, str):
                raise LineError(f"{key} must be a string")
            tokens = tokenize(text)
            if not tokens:
                raise LineError(f"{key} is empty: a prompt needs at least one token")
            array = np.asarray(tokens, dtype=np.int64)
            return TraceRequest(arrival_s, len(tokens), output, token_ids=array, line=line)
    if "hash_ids" in obj:
        hashes = obj["hash_ids"]
        if not isinstance(hashes, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 2**62 for h in hashes
        ):
            raise LineError("hash_ids must be a list of integers in [0, 2**62)")
        length = _count(obj, ("input_length", "prompt_len"), 1)
        if length is None:
            raise LineError("hash_ids needs input_length (the prompt's length in tokens)")
        # Fewer ids than blocks is allowed (the rest is unique); more ids than fit is not.
        if len(hashes) > -(-length // options.hash_block_tokens):
            raise LineError(
                f"{len(hashes)} hash_ids of {options.hash_block_tokens} tokens do not fit "
                f"input_length {length} (wrong --hash-block-tokens?)"
            )
        return TraceRequest(arrival_s, length, output, hash_ids=tuple(hashes), line=line)
    raise LineError("no prompt: give prompt_token_ids, prompt/text, or hash_ids + input_length")


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
    requests: list[TraceRequest] = []
    records: list[tuple[int, dict[str, Any]]] = []
    skipped: list[str] = []
    used_text = False
    for number, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text:
            continue
        try:
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise LineError(f"not JSON ({exc.msg} at column {exc.colno})") from None
            except RecursionError:
                raise LineError("not JSON (nested too deeply)") from None
            if _is_abtest_record(obj):
                records.append((number, obj))
                continue
            req = parse_trace_line(obj, number, options, tokenize)
            used_text = used_text or ("prompt" in obj or "text" in obj)
        except LineError as exc:
            message = f"{source}:{number}: {exc}"
            if options.strict:
                raise TraceError(message + " (--strict)") from None
            skipped.append(message)
            continue
        requests.append(req)
    if records:
        if requests:
            raise TraceError(f"{source}: mixes ab-test records and trace lines")
        return records_workload(records, source, skipped, options)
    if not requests:
        why = f"; {len(skipped)} malformed line(s), first: {skipped[0]}" if skipped else ""
        raise TraceError(f"{source}: no requests to replay{why}")
    start = min(r.arrival_s for r in requests)
    ordered = sorted(requests, key=lambda r: (r.arrival_s, r.line))
    shifted = [_shift(r, start) for r in ordered]
    notes = [tokenizer_note] if used_text and tokenizer_note else []
    return Workload(source, "trace", [Group(shifted)], options.hash_block_tokens, notes, skipped)


def _shift(req: TraceRequest, start_s: float) -> TraceRequest:
    if not start_s:
        return req
    return TraceRequest(
        req.arrival_s - start_s, req.prompt_len, req.output_tokens, req.token_ids, req.hash_ids,
        req.line,
    )  # fmt: skip


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
    prefix_len = _run_prefix_lengths(Path(source).parent)
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


def hash_key(text: str) -> int:
    """A stable (process-independent) integer for a string."""
    return zlib.crc32(text.encode())


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
            return read_lines(fh, str(path), options, tokenize, note)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
