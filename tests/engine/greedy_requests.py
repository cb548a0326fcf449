"""The engine tier's requests whose answers must not change when KV comes from LMCache: a
greedy completion with the chosen tokens' logprobs, and the comparison of two of them. Shared by
the in-process LMCache tests and the server-mode (offload_mp) ones."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

# float32 on CPU: a prefill over a loaded prefix sums in another order, moving logprobs by
# ~1e-5; wrong KV moves them by tenths (measured on the tier's tiny model)
LOGPROB_TOLERANCE = 1e-3


def post_json(url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """POST `body` as JSON; the answer's JSON object, or {} for an empty or non-object answer
    (vLLM's /reset_prefix_cache answers with no body). urlopen raises on a non-2xx status."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        raw = resp.read()
    return json.loads(raw) if raw.strip().startswith(b"{") else {}


def greedy_completion(url: str, prompt: list[int]) -> dict[str, Any]:
    """Greedy, with the chosen tokens' logprobs, and how many prompt tokens were cached."""
    doc = post_json(
        url + "/v1/completions",
        {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 1},
    )
    choice = doc["choices"][0]
    details = doc["usage"].get("prompt_tokens_details") or {}
    return {
        "id": doc["id"],
        "text": choice["text"],
        "logprobs": choice["logprobs"]["token_logprobs"],
        "cached_tokens": details.get("cached_tokens") or 0,
    }


def same_answer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The same text, and every logprob within LOGPROB_TOLERANCE."""
    return a["text"] == b["text"] and all(
        abs(x - y) < LOGPROB_TOLERANCE for x, y in zip(a["logprobs"], b["logprobs"], strict=True)
    )
