"""Requests from a workload spec: exact-length prompts, deterministic for a seed.

Token-id prompts (the default) make lengths exact without trusting a tokenizer round trip; ids
come from an alphabet known to be valid for the served model (ids seen when tokenizing sample
text through `/tokenize`, or a range below `--vocab-size`). Servers that refuse token ids get
text built from words that each tokenize to exactly one token (see `kvops.loadgen.calibrate`,
which asks the server: calibration is the client's job, this module knows no HTTP).

Every random draw uses a local generator keyed by (spec seed, run seed, role, ...) so a prefix is
identical in every arm and trial, suffixes are identical across arms within a trial, and a
different trial gets fresh suffixes (a repeated whole prompt would be an unfair full-cache hit).
The run seed is fresh for every `kvops ab-test` run (recorded in run.json, reusable with
`--seed`): a persistent KV tier (LMCache's GDS directory survives restarts and
`/reset_prefix_cache`) must never hold a previous run's "unique" prompts.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvops.workload.spec import WorkloadSpec

_PREFIX, _SUFFIX, _ORDER = 0, 1, 2


def _salt(spec: WorkloadSpec) -> int:
    """Different workloads draw different prompts even with the same seed."""
    return zlib.crc32(spec.name.encode())


@dataclass(frozen=True)
class Alphabet:
    """What a prompt is made of: token ids (`ids`), or one-token words joined by spaces
    (`words`, with `special_tokens` added by the server's tokenizer, e.g. BOS)."""

    ids: tuple[int, ...] = ()
    words: tuple[str, ...] = ()
    special_tokens: int = 0
    id_range: tuple[int, int] | None = None

    @property
    def is_text(self) -> bool:
        return bool(self.words)

    @property
    def size(self) -> int:
        if self.id_range is not None:
            return self.id_range[1] - self.id_range[0]
        return len(self.words) if self.is_text else len(self.ids)

    def id_at(self, i: int) -> int:
        return self.id_range[0] + i if self.id_range is not None else self.ids[i]

    def to_dict(self) -> dict[str, object]:
        return {
            "ids": list(self.ids),
            "words": list(self.words),
            "special_tokens": self.special_tokens,
            "id_range": list(self.id_range) if self.id_range else None,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Alphabet:
        rng = d.get("id_range")
        return cls(
            ids=tuple(d.get("ids") or ()),
            words=tuple(d.get("words") or ()),
            special_tokens=int(d.get("special_tokens") or 0),
            id_range=(int(rng[0]), int(rng[1])) if rng else None,
        )

    @classmethod
    def from_vocab_size(cls, vocab_size: int) -> Alphabet:
        """Ids in [low, vocab_size): the lowest ids are often control/special tokens."""
        if vocab_size < 2:
            raise ValueError("vocabulary size must be at least 2")
        low = 16 if vocab_size > 64 else 0
        return cls(id_range=(low, vocab_size))


@dataclass(frozen=True)
class SampleRequest:
    """What to ask the server, in plain values: no HTTP here (the load generator builds the wire
    request, as vLLM's benchmark maps its datasets' `SampleRequest`s to request-function inputs:
    https://github.com/vllm-project/vllm/blob/main/vllm/benchmarks/datasets.py).
    `prompt` is token ids (exact length) or text; `intended_prompt_tokens` is the spec's length."""

    request_id: str
    prompt: list[int] | str
    output_tokens: int
    prefix_id: int | None = None
    intended_prompt_tokens: int | None = None


@dataclass
class PlannedRequest:
    """A request with its place in the workload (iteration, batch within the iteration)."""

    iteration: int
    batch: int
    index: int
    request: SampleRequest


def _draw(alphabet: Alphabet, n: int, key: Sequence[int]) -> np.ndarray:
    rng = np.random.default_rng(list(key))
    return rng.integers(0, alphabet.size, n)


def _render(alphabet: Alphabet, picks: np.ndarray) -> list[int] | str:
    """Vectorised: a 30K-token prompt must not cost the client noticeable time."""
    if alphabet.is_text:
        return "".join(" " + alphabet.words[i] for i in picks.tolist())
    if alphabet.id_range is not None:
        return (picks + alphabet.id_range[0]).tolist()  # type: ignore[no-any-return]
    return np.asarray(alphabet.ids)[picks].tolist()  # type: ignore[no-any-return]


def render_picks(alphabet: Alphabet, picks: np.ndarray) -> list[int] | str:
    """Alphabet indices as a prompt: token ids, or one-token words joined by spaces."""
    return _render(alphabet, picks)


def _join(head: list[int] | str, tail: list[int] | str) -> list[int] | str:
    if isinstance(head, str) and isinstance(tail, str):
        return head + tail
    if isinstance(head, list) and isinstance(tail, list):
        return head + tail
    raise TypeError("prefix and suffix must both be text or both be token ids")


def make_prefixes(
    spec: WorkloadSpec, alphabet: Alphabet, run_seed: int = 0
) -> list[list[int] | str]:
    """The shared prefixes; text prefixes leave room for the tokenizer's special tokens."""
    n = spec.prefix_tokens - (alphabet.special_tokens if alphabet.is_text else 0)
    return [
        _render(alphabet, _draw(alphabet, n, (spec.seed, run_seed, _salt(spec), _PREFIX, p)))
        for p in range(spec.num_prefixes)
    ]


def send_order(spec: WorkloadSpec, *, trial: int, iteration: int, run_seed: int = 0) -> list[int]:
    """Request indices of one iteration in send order: shuffled with a generator keyed by
    (seeds, trial, iteration), so both arms of a trial get the same order; or cyclic."""
    n = spec.per_iteration
    if spec.request_order == "cyclic":
        return list(range(n))
    rng = np.random.default_rng([spec.seed, run_seed, _salt(spec), _ORDER, trial, iteration])
    return [int(j) for j in rng.permutation(n)]


def plan_iteration(
    spec: WorkloadSpec,
    alphabet: Alphabet,
    prefixes: Sequence[list[int] | str],
    *,
    trial: int,
    iteration: int,
    id_prefix: str = "",
    run_seed: int = 0,
) -> list[PlannedRequest]:
    """The requests of one iteration, in send order (see `send_order`), with their batch
    numbers. Request j keeps prefix j mod N and its own suffix whatever its place."""
    planned: list[PlannedRequest] = []
    specials = alphabet.special_tokens if alphabet.is_text else 0
    order = send_order(spec, trial=trial, iteration=iteration, run_seed=run_seed)
    for position, j in enumerate(order):
        prefix_id = j % spec.num_prefixes if spec.num_prefixes else None
        n_suffix = spec.suffix_tokens - (specials if prefix_id is None else 0)
        key = (spec.seed, run_seed, _salt(spec), _SUFFIX, trial, iteration, j)
        suffix = _render(alphabet, _draw(alphabet, n_suffix, key))
        prompt = suffix if prefix_id is None else _join(prefixes[prefix_id], suffix)
        req = SampleRequest(
            request_id=f"{id_prefix}t{trial}-i{iteration}-r{j}",
            prompt=prompt,
            output_tokens=spec.output_tokens,
            prefix_id=prefix_id,
            intended_prompt_tokens=spec.prompt_tokens,
        )
        planned.append(PlannedRequest(iteration, position // spec.batch_size, j, req))
    return planned
