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


# The largest event kvops waits to complete: far above any vLLM completion chunk (a few KB,
# more with logprobs), far below what a hostile or broken server could make a client hold.
MAX_EVENT_BYTES = 16 * 1024 * 1024
# Of a server's error message in a stream, what a record keeps.
MAX_ERROR_CHARS = 300


@dataclass
class SseParser:
    _buffer: bytearray = field(default_factory=bytearray)
    _scanned: int = 0  # bytes of the buffer already searched for an event's end
    saw_done: bool = False
    payloads: list[dict[str, Any]] = field(default_factory=list)

    def feed(self, data: bytes) -> SseEvents:
        """Consume bytes; return the complete events they finished. Raises MalformedStreamError
        for a `data:` payload that is not JSON, or an event that grows past MAX_EVENT_BYTES.

        Linear in what the server sends: the buffer is appended to in place and only its new
        bytes are searched for an event's end."""
        out = SseEvents()
        self._buffer += data
        while (end := self._end_of_event()) >= 0:
            raw = bytes(self._buffer[:end])
            del self._buffer[: end + 2]
            self._scanned = 0
            self._event(raw.replace(b"\r", b""), out)
        if len(self._buffer) > MAX_EVENT_BYTES:
            raise MalformedStreamError(
                f"SSE event longer than {MAX_EVENT_BYTES} bytes without an end: stream refused"
            )
        return out

    def _end_of_event(self) -> int:
        """Index of the blank line ending the first event (CRLF or LF line ends), or -1."""
        buf = self._buffer
        start = max(self._scanned - 3, 0)
        end = buf.find(b"\n\n", start)
        crlf = buf.find(b"\n\r\n", start)
        self._scanned = len(buf)
        if crlf >= 0 and (end < 0 or crlf < end):
            return crlf + 1  # the event ends before "\r\n"; skip 2 more ("\r\n")
        return end

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
                out.error = f"server error in stream: {str(msg)[:MAX_ERROR_CHARS]}"
            if obj.get("choices"):
                out.token_events += 1
            if isinstance(obj.get("usage"), dict):
                out.usage = obj["usage"]

    @property
    def leftover(self) -> bytes:
        return bytes(self._buffer).strip()
