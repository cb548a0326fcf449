"""Incremental parser for OpenAI-style server-sent events, with `vllm bench serve` rules.

Why its own module: the rules decide what a "token event" is, hence TTFT and ITL. They are
those of vLLM's `endpoint_request_func.py`: events split on a blank line, lines starting with
`:` are comments, `data: ` is stripped, `[DONE]` ends the stream, and every JSON chunk with a
non-empty `choices` list is one token event even when its text is empty.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


class MalformedStreamError(ValueError):
    """The stream broke the SSE/JSON framing; the request is recorded as an error."""


@dataclass
class SseEvents:
    """What one network read contributed."""

    token_events: int = 0
    usage: dict[str, Any] | None = None
    done: bool = False
    error: str | None = None


@dataclass
class SseParser:
    _buffer: bytes = b""
    saw_done: bool = False
    payloads: list[dict[str, Any]] = field(default_factory=list)

    def feed(self, data: bytes) -> SseEvents:
        """Consume bytes; return the complete events they finished. Raises MalformedStreamError
        for a `data:` payload that is not JSON."""
        out = SseEvents()
        self._buffer += data.replace(b"\r\n", b"\n")
        while b"\n\n" in self._buffer:
            raw, self._buffer = self._buffer.split(b"\n\n", 1)
            self._event(raw, out)
        return out

    def _event(self, raw: bytes, out: SseEvents) -> None:
        for line in raw.split(b"\n"):
            line = line.strip()
            if not line or line.startswith(b":"):
                continue
            if not line.startswith(b"data:"):
                continue  # `event:`/`id:` fields carry nothing the metrics use
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.saw_done = True
                out.done = True
                continue
            try:
                obj = json.loads(payload)
            except ValueError as exc:
                snippet = payload[:80].decode("utf-8", "replace")
                raise MalformedStreamError(f"malformed SSE data ({exc}): {snippet!r}") from None
            if not isinstance(obj, dict):
                raise MalformedStreamError(f"SSE data is not a JSON object: {payload[:80]!r}")
            if "error" in obj and not obj.get("choices"):
                err = obj["error"]
                msg = err.get("message", err) if isinstance(err, dict) else err
                out.error = f"server error in stream: {msg}"
            if obj.get("choices"):
                out.token_events += 1
            if isinstance(obj.get("usage"), dict):
                out.usage = obj["usage"]

    @property
    def leftover(self) -> bytes:
        return self._buffer.strip()
