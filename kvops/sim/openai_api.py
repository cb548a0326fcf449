"""Request parsing and response shapes of vLLM's OpenAI-compatible API, for the simulated server.

Only what the simulator needs: prompts as text or token ids, `max_tokens`, streaming with
`stream_options.include_usage`, and usage with `prompt_tokens_details.cached_tokens` (vLLM sends
these only with `--enable-prompt-tokens-details`; the simulator always does). Errors use
OpenAI's `{"error": {...}}` body, as vLLM does.

`logprobs` (non-streaming completions): each generated token with a log-probability, named
`token_id:<n>` with vLLM's `return_tokens_as_token_ids`. The simulator's tokens are seeded draws,
not a language model's; their log-probabilities are a fixed function of the prompt, the position
and the token (`token_logprob`), so they are the same whether the prompt's KV was computed or
came from the offload tier, as a correct offload makes them (`kvops smoke`'s correctness check).
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kvops.sim.tokenizer import WordTokenizer

TokenIds = list[int] | npt.NDArray[np.int64]
_PROMPT_KEY = b'"prompt":['
_INT_LIST_BYTES = b"0123456789, \t\r\n"
_HUGE_ID = 10**18  # far above any vocabulary; int64 parsing is exact below it


class ApiError(Exception):
    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError"):
        super().__init__(message)
        self.message, self.status, self.err_type = message, status, err_type

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.err_type,
                "param": None,
                "code": self.status,
            }
        }


def decode_body(raw: bytes) -> Any:
    """The JSON body, with a token-id `prompt` decoded straight into an int64 array.

    Why: the real-time server must keep up with the model's clock, and `json.loads` of a
    30K-token id list (a Python int per token, then type checks and copies) costs the event
    loop milliseconds per request, which delay every other request's tokens. The fast path
    applies only to a top-level `"prompt":[...]` made of plain non-negative integers; the rest
    of the body is parsed normally, and anything else (text, nested lists, floats, a `prompt`
    key elsewhere) falls back to `json.loads` of the whole body, so the result is the same."""
    start = raw.find(_PROMPT_KEY)
    if start >= 0:
        first = start + len(_PROMPT_KEY)
        end = raw.find(b"]", first)
        ids_text = raw[first:end]
        if ids_text.strip() and not ids_text.translate(None, _INT_LIST_BYTES):
            try:
                with warnings.catch_warnings():  # numpy warns when it stops early: counted below
                    warnings.simplefilter("ignore", DeprecationWarning)
                    ids = np.fromstring(ids_text, dtype=np.int64, sep=",")
            except ValueError:
                return json.loads(raw)
            # an empty item ("1,,2"), a trailing comma or a huge number (strtoll saturates):
            # json.loads judges it
            if ids.shape[0] != ids_text.count(b",") + 1 or int(ids.max()) >= _HUGE_ID:
                return json.loads(raw)
            rest = json.loads(raw[:start] + b'"prompt":null' + raw[end + 1 :])
            if isinstance(rest, dict) and "prompt" in rest and rest["prompt"] is None:
                rest["prompt"] = ids
                return rest
    return json.loads(raw)


@dataclass
class ParsedRequest:
    prompt_ids: TokenIds
    max_tokens: int
    stream: bool
    include_usage: bool
    chat: bool
    logprobs: int | None = None  # completions' `logprobs` (how many alternatives; 0 = none)
    tokens_as_ids: bool = False  # vLLM's `return_tokens_as_token_ids`


def prompt_key(seed: int, prompt_ids: TokenIds) -> int:
    """What a request's generated tokens depend on: the server's seed and the prompt (its length
    and first 64 ids: the simulator never reads a whole 30K-token prompt for this)."""
    head = tuple(int(t) for t in prompt_ids[:64])
    return hash((seed, len(prompt_ids), head))


def token_logprob(key: int, position: int, token: int) -> float:
    """A log-probability in (-4, 0] for the token generated at `position` of the request with
    `prompt_key` `key`: deterministic (hashes of ints do not vary between processes)."""
    return -4.0 * ((hash((key, position, token)) & 0xFFFFFFFF) / 2**32)


def _int_field(body: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = body.get(name)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ApiError(f"{name} must be a non-negative integer")
            return value
    return None


def chat_text(messages: Any) -> str:
    """A plain chat template: `role: content` lines, then `assistant:`."""
    if not isinstance(messages, list) or not messages:
        raise ApiError("messages must be a non-empty list")
    lines = []
    for msg in messages:
        if not isinstance(msg, dict):
            raise ApiError("each message must be an object")
        content = msg.get("content", "")
        if isinstance(content, list):  # OpenAI content parts
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        lines.append(f"{msg.get('role', 'user')}: {content}")
    lines.append("assistant:")
    return "\n".join(lines)


def parse_request(
    body: Any, chat: bool, tokenizer: WordTokenizer, served_name: str, max_model_len: int
) -> ParsedRequest:
    if not isinstance(body, dict):
        raise ApiError("request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != served_name:
        raise ApiError(f"The model `{model}` does not exist.", 404, "NotFoundError")
    ids: TokenIds
    if chat:
        ids = tokenizer.encode(chat_text(body.get("messages")))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, np.ndarray):
            ids = prompt  # from `decode_body`: already checked to be integers
        elif isinstance(prompt, str):
            ids = tokenizer.encode(prompt)
        elif isinstance(prompt, list) and prompt and set(map(type, prompt)) == {int}:
            ids = prompt  # checked with C-level passes: 30K-token prompts arrive often
        else:
            raise ApiError("prompt must be a string or a non-empty list of token ids (one prompt)")
    if len(ids) == 0:
        raise ApiError("The prompt is empty.")
    arr = ids if isinstance(ids, np.ndarray) else None
    lo, hi = (int(arr.min()), int(arr.max())) if arr is not None else (min(ids), max(ids))
    if lo < 0 or hi >= tokenizer.vocab_size:
        bad = next(int(t) for t in ids if t < 0 or t >= tokenizer.vocab_size)
        raise ApiError(f"Token id {bad} is out of vocabulary")
    max_tokens = _int_field(body, "max_completion_tokens", "max_tokens") if chat else None
    if not chat:
        max_tokens = _int_field(body, "max_tokens")
        if max_tokens is None:
            max_tokens = 16  # OpenAI completions default
    if max_tokens is None:  # chat: vLLM uses the rest of the context; capped for a simulator
        max_tokens = max(1, min(max_model_len - len(ids), 4096))
    max_tokens = max(1, max_tokens)
    if len(ids) + max_tokens > max_model_len:
        raise ApiError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion."
        )
    options = body.get("stream_options") or {}
    logprobs = None if chat else _int_field(body, "logprobs")
    stream = bool(body.get("stream", False))
    if logprobs is not None and stream:
        raise ApiError("the simulator answers logprobs only without streaming")
    return ParsedRequest(
        prompt_ids=ids if isinstance(ids, np.ndarray) else list(ids),
        max_tokens=max_tokens,
        stream=stream,
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        chat=chat,
        logprobs=logprobs,
        tokens_as_ids=bool(body.get("return_tokens_as_token_ids", False)),
    )


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class ChunkMaker:
    """SSE chunks and final bodies for one request, shaped like vLLM's."""

    def __init__(self, request_id: str, model: str, chat: bool) -> None:
        self.id = request_id
        self.model = model
        self.chat = chat
        self.created = int(time.time())
        self._template: list[bytes] | None = None

    def _envelope(self, choices: list[dict[str, Any]], usage_: dict[str, Any] | None) -> bytes:
        doc: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage_ is not None or not self.chat:
            doc["usage"] = usage_
        return b"data: " + json.dumps(doc).encode() + b"\n\n"

    def role_chunk(self) -> bytes:
        delta = {"role": "assistant", "content": ""}
        return self._envelope(
            [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}], None
        )

    def token_chunk(self, text: str, finish_reason: str | None) -> bytes:
        """One token's chunk. The common case (no finish reason) is a template with the text
        spliced in: serialising a whole dict per token costs the real-time server CPU it needs
        to keep up with the model's clock."""
        if finish_reason is None:
            if self._template is None:
                marker = "\x00"
                self._template = self._token_doc(marker, None).split(json.dumps(marker).encode())
            head, tail = self._template
            return head + json.dumps(text).encode() + tail
        return self._token_doc(text, finish_reason)

    def _token_doc(self, text: str, finish_reason: str | None) -> bytes:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "stop_reason": None}
        choice["finish_reason"] = finish_reason
        return self._envelope([choice], None)

    def usage_chunk(self, usage_: dict[str, Any]) -> bytes:
        return self._envelope([], usage_)

    def full_body(
        self, text: str, usage_: dict[str, Any], logprobs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "length",
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": "length",
                      "stop_reason": None}  # fmt: skip
            obj = "text_completion"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage_,
        }


def completion_logprobs(
    key: int, tokens: list[int], pieces: list[str], as_ids: bool
) -> dict[str, Any]:
    """OpenAI completions' `logprobs` object for generated `tokens` (their text `pieces`): the
    chosen token of each position with its log-probability; its `top_logprobs` entry holds only
    that token (the simulator has no alternatives to offer)."""
    names = [f"token_id:{t}" for t in tokens] if as_ids else pieces
    values = [token_logprob(key, i, t) for i, t in enumerate(tokens)]
    offsets, at = [], 0
    for piece in pieces:
        offsets.append(at)
        at += len(piece)
    return {
        "text_offset": offsets,
        "token_logprobs": values,
        "tokens": names,
        "top_logprobs": [{name: value} for name, value in zip(names, values, strict=True)],
    }
