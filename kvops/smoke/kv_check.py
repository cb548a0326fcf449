"""Does offload return the right KV? Two greedy answers to one prompt, compared token by token.

Why: an offload tier can store and retrieve bytes, raise every counter and cut TTFT, and still
hand vLLM the wrong KV (a layout mismatch between the connector and vLLM's paged cache, a chunk
keyed to the wrong prompt, a torn file). vLLM then generates from it without any error. The only
way to see it from outside is the output: at temperature 0 the tokens vLLM picks, and their
log-probabilities, depend on every KV value of the prompt.

The smoke sends one fresh prompt twice (`kvops.smoke.run`): first cold — nothing anywhere can hold
it, so vLLM computes every KV value itself (the reference, and what the offload tier stores) —
then after the GPU prefix cache was emptied, when its KV comes back from the offload tier. Both
ask for greedy tokens with their log-probabilities (OpenAI completions `logprobs: 1`; vLLM's
`return_tokens_as_token_ids` names tokens `token_id:<n>`, so distinct ids never compare equal by
their text).

Tolerance. The token ids must be identical. Log-probabilities may differ by
`DEFAULT_LOGPROB_TOLERANCE` (0.05 nats) at most, because the loaded KV is a bit-exact copy of the
stored one but the re-send's prefill is a different computation: attention over a cached prefix
rather than one pass over the whole prompt, so floating-point sums run in another order. In
float32 on a CPU that moves them by about 1e-5 (identical to 4 decimals: the engine tier measures
it); in bfloat16, whose 8-bit mantissa rounds a logit of magnitude 10 to steps of 0.04-0.06, it
can reach a few hundredths (vLLM's own tests allow for it: vllm-project/vllm
`tests/samplers/test_logprobs.py` compares half-precision logprobs with `atol=1e-2, rtol=1e-2`,
`tests/models/utils.py` `check_logprobs_close` lets greedy runs part only where the other's token
is among the top logprobs). Wrong KV moves them by tenths to whole
nats and usually changes the tokens (the engine tier's zeroed-V control). The option
`--logprob-tolerance` sets another bound.

Pure: parsing a completion body and comparing two; the requests are `kvops.smoke.run`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_LOGPROB_TOLERANCE = 0.05
# Greedy tokens compared per answer: enough that a wrong KV shows, few enough to cost nothing.
CHECK_OUTPUT_TOKENS = 8


class CompletionShapeError(ValueError):
    """A completion body without the fields the comparison reads."""


@dataclass(frozen=True)
class Completion:
    """One greedy answer: its tokens (`token_id:<n>` where the server names them so), each
    token's log-probability (None where the server sent none) and the prompt tokens the server
    reported as cached (None when it does not report them)."""

    tokens: Sequence[str]
    logprobs: Sequence[float | None]
    cached_tokens: int | None = None

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Completion:
        cached = data.get("cached_tokens")
        return Completion(
            tokens=tuple(str(t) for t in data["tokens"]),
            logprobs=tuple(None if x is None else float(x) for x in data["logprobs"]),
            cached_tokens=None if cached is None else int(cached),
        )


@dataclass(frozen=True)
class KvCheck:
    """The correctness prompt's two answers: `reference` computed from scratch (its first, storing
    send), `offloaded` after the prefix-cache eviction (its KV from the offload tier)."""

    prompt_tokens: int
    reference: Completion
    offloaded: Completion

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> KvCheck:
        return KvCheck(
            prompt_tokens=int(data["prompt_tokens"]),
            reference=Completion.from_dict(data["reference"]),
            offloaded=Completion.from_dict(data["offloaded"]),
        )


def completion_body(model: str, prompt: list[int]) -> dict[str, Any]:
    """The request: greedy, exactly `CHECK_OUTPUT_TOKENS` tokens (vLLM honours `min_tokens` and
    `ignore_eos`), each with its log-probability and its token id."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": CHECK_OUTPUT_TOKENS,
        "min_tokens": CHECK_OUTPUT_TOKENS,
        "ignore_eos": True,
        "temperature": 0.0,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
    }


def parse_completion(doc: Any) -> Completion:
    """Tokens and log-probabilities of a non-streaming `/v1/completions` answer (OpenAI's shape:
    `choices[0].logprobs.tokens` / `token_logprobs`); a server that answers without logprobs
    gives empty lists. Raises CompletionShapeError for a body that is not a completion."""
    try:
        choice = doc["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise CompletionShapeError("the answer has no choices[0]") from None
    if not isinstance(choice, dict):
        raise CompletionShapeError("choices[0] is not an object")
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    cached_tokens = cached if isinstance(cached, int) and not isinstance(cached, bool) else None
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return Completion((), (), cached_tokens)
    tokens = logprobs.get("tokens")
    values = logprobs.get("token_logprobs")
    if not isinstance(tokens, list) or not isinstance(values, list) or len(tokens) != len(values):
        raise CompletionShapeError("logprobs.tokens and logprobs.token_logprobs do not pair up")
    return Completion(
        tuple(str(t) for t in tokens), tuple(_logprob(v) for v in values), cached_tokens
    )


def _logprob(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass(frozen=True)
class Difference:
    """The first position where the two answers disagree, and how."""

    position: int  # 0-based index of the generated token
    reference_token: str | None  # None: that answer ended before this position
    offloaded_token: str | None
    reference_logprob: float | None
    offloaded_logprob: float | None
    tokens_differ: bool

    def describe(self) -> str:
        what = "token" if self.tokens_differ else "logprob"
        return (
            f"{what} {self.position + 1} differs: recomputed "
            f"{_token(self.reference_token, self.reference_logprob)}, from offload "
            f"{_token(self.offloaded_token, self.offloaded_logprob)}"
        )


def _token(token: str | None, logprob: float | None) -> str:
    if token is None:
        return "(no token: the answer ended)"
    shown = f"id {token[len('token_id:') :]}" if token.startswith("token_id:") else repr(token)
    return f"{shown} (logprob {'?' if logprob is None else f'{logprob:.5f}'})"


def first_difference(
    reference: Completion, offloaded: Completion, tolerance: float
) -> Difference | None:
    """The first token whose id differs, or whose log-probabilities differ by more than
    `tolerance`; None when the answers agree."""
    for i in range(max(len(reference.tokens), len(offloaded.tokens))):
        ref_tok = reference.tokens[i] if i < len(reference.tokens) else None
        off_tok = offloaded.tokens[i] if i < len(offloaded.tokens) else None
        ref_lp = reference.logprobs[i] if i < len(reference.logprobs) else None
        off_lp = offloaded.logprobs[i] if i < len(offloaded.logprobs) else None
        if ref_tok != off_tok:
            return Difference(i, ref_tok, off_tok, ref_lp, off_lp, tokens_differ=True)
        if (ref_lp is None) != (off_lp is None) or (
            ref_lp is not None and off_lp is not None and abs(ref_lp - off_lp) > tolerance
        ):
            return Difference(i, ref_tok, off_tok, ref_lp, off_lp, tokens_differ=False)
    return None


def largest_logprob_gap(reference: Completion, offloaded: Completion) -> float:
    """The largest |difference| of paired log-probabilities (0.0 when none pair up)."""
    gaps = [
        abs(a - b)
        for a, b in zip(reference.logprobs, offloaded.logprobs, strict=False)
        if a is not None and b is not None
    ]
    return max(gaps, default=0.0)
