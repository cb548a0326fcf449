"""Sending one streaming request and timing it exactly as `vllm bench serve` does.

`send_request` is the stable entry point that `kvops smoke` and the ab-test runner share. It
never raises for a failed request: HTTP errors, malformed streams, stalls and dropped
connections all come back as a RequestRecord whose `error` says why (errors are results; nothing
is retried silently). Request bodies are serialised ahead of the send instant, so a 30K-token
prompt's JSON encoding does not count as server latency.
"""

from __future__ import annotations

import asyncio
import json
import time
import types
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kvops.loadgen.sse import MalformedStreamError, SseParser
from kvops.workload.record import RequestRecord

# The most of a plain (non-streaming) answer kvops reads: /metrics text, /v1/models, /version,
# /tokenize, an error body. A large vLLM /metrics page is a few MB; a server that answers
# without end (hostile, or broken) must not fill the client's memory.
MAX_BODY_BYTES = 32 * 1024 * 1024


class ResponseTooLarge(aiohttp.ClientPayloadError):
    """An answer longer than the bound it was read with (an aiohttp.ClientError, so every
    caller that handles a failed request handles this one too)."""


async def read_text(
    resp: aiohttp.ClientResponse, limit_bytes: int = MAX_BODY_BYTES, truncate: bool = False
) -> str:
    """The answer's body as text (UTF-8, undecodable bytes replaced), read up to `limit_bytes`:
    past it the rest is never read, and the call raises ResponseTooLarge, or with `truncate`
    returns the first `limit_bytes` (an error body shown in one line)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit_bytes:
        chunk = await resp.content.read(limit_bytes + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    data = b"".join(chunks)
    if size > limit_bytes:
        if not truncate:
            raise ResponseTooLarge(
                f"{resp.method} {resp.url.path}: answer longer than {limit_bytes} bytes, not read"
            )
        data = data[:limit_bytes]
    return data.decode("utf-8", "replace")


@dataclass(frozen=True)
class Endpoint:
    """Where requests go. `api` is "completions" (token-id or text prompts) or "chat"."""

    base_url: str
    model: str
    api: str = "completions"

    @property
    def url(self) -> str:
        path = "/v1/chat/completions" if self.api == "chat" else "/v1/completions"
        return self.base_url.rstrip("/") + path


@dataclass
class CompletionRequest:
    """One request to send. `prompt` is a list of token ids (exact length) or text.

    `ignore_eos` + `min_tokens` = `max_tokens` make the output length exact, as vLLM honours
    both; servers that do not know them ignore unknown fields."""

    request_id: str
    prompt: list[int] | str
    output_tokens: int
    prefix_id: int | None = None
    intended_prompt_tokens: int | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    _body: bytes | None = field(default=None, repr=False)

    def body(self, endpoint: Endpoint) -> bytes:
        """The JSON body, built once and cached (encode before the clock starts)."""
        if self._body is None:
            payload: dict[str, Any] = {
                "model": endpoint.model,
                "max_tokens": self.output_tokens,
                "min_tokens": self.output_tokens,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
                "temperature": 0.0,
            }
            if endpoint.api == "chat":
                text = self.prompt if isinstance(self.prompt, str) else str(self.prompt)
                payload["messages"] = [{"role": "user", "content": text}]
                payload["max_completion_tokens"] = self.output_tokens
            else:
                payload["prompt"] = self.prompt
            payload.update(self.extra_body)
            self._body = json.dumps(payload, separators=(",", ":")).encode()
        return self._body


class _WriteStamp:
    """The `trace_request_ctx` of one request: the instant its body went to the socket."""

    __slots__ = ("perf_s",)

    def __init__(self) -> None:
        self.perf_s: float | None = None


async def _on_body_write(
    _session: aiohttp.ClientSession,
    ctx: types.SimpleNamespace,
    _params: aiohttp.TraceRequestChunkSentParams,
) -> None:
    """Stamps the request's send at its first body write. aiohttp awaits this hook inside
    `StreamWriter.write`, with no await of its own before `transport.write` of the headers and
    body coalesced (aiohttp/http_writer.py), so the stamp is the instant the request is
    written. Before it lie the client's own steps that are not the server's time: building
    the request, taking a connection from the pool (or opening one), and, on Python < 3.12,
    one whole event-loop turn: aiohttp writes the body from a task that only starts eagerly
    on 3.12+ (`eager_start`, ClientRequest.send), so under load the body waits behind every
    other ready callback."""
    stamp = ctx.trace_request_ctx
    if isinstance(stamp, _WriteStamp) and stamp.perf_s is None:
        stamp.perf_s = time.perf_counter()


def make_session(max_connections: int = 0) -> aiohttp.ClientSession:
    """A session whose connection pool never queues requests (limit 0 = unlimited), so the
    client adds no hidden concurrency cap; `max_connections` > 0 sets one deliberately (size
    it to the concurrency, never below: a request waiting for a connection is client time).
    Connections are kept alive between requests (aiohttp's default), so a closed loop reuses
    one connection per stream and opens none on the send path. Its trace hook stamps each
    request at the moment it is written (`send_request`)."""
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, ttl_dns_cache=300)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None),
        headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        trace_configs=[send_stamp_trace()],
    )


def send_stamp_trace() -> aiohttp.TraceConfig:
    """The trace hook that stamps each request's send at its write (`send_request`); give it to
    a session of your own (`aiohttp.ClientSession(trace_configs=[...])`) for the same TTFT."""
    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(_on_body_write)
    return trace


async def send_request(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    request: CompletionRequest,
    *,
    timeout_s: float = 600.0,
    stall_timeout_s: float | None = 60.0,
    record: RequestRecord | None = None,
) -> RequestRecord:
    """POST one streaming request and return its record (never raises for request failures).

    `timeout_s` bounds the whole request; `stall_timeout_s` bounds any silence between reads.
    `record` may carry labels (arm, trial, batch, ...) to be filled in; a fresh one is made
    otherwise. Timestamps are `time.perf_counter()` (CLOCK_MONOTONIC: comparable across
    processes on Linux).

    TTFT counts, as in `vllm bench serve`, from the request's send to its first token; the
    send is stamped the moment aiohttp writes the request to the socket (sessions from
    `make_session`; `_on_body_write`), so the client's own work before it — request set-up,
    a connection from the pool, its event loop's other callbacks — is dispatch lag (the
    client's), not TTFT (the server's). With a session without that hook, or a request that
    never got written, the send is the instant before the POST, as in vLLM's bench."""
    rec = record if record is not None else RequestRecord(request_id=request.request_id)
    rec.url = endpoint.url
    rec.prefix_id = request.prefix_id
    rec.intended_prompt_tokens = request.intended_prompt_tokens
    rec.intended_output_tokens = request.output_tokens
    body = request.body(endpoint)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    parser = SseParser()
    usage: dict[str, Any] | None = None
    token_events = 0
    written = _WriteStamp()
    unix_s = time.time()
    before_s = time.perf_counter()
    _mark_send(rec, before_s, before_s, unix_s)
    offsets = rec.chunk_offsets_ms
    watch = _StallWatch(stall_timeout_s) if stall_timeout_s else None
    try:
        async with session.post(
            endpoint.url, data=body, timeout=timeout, trace_request_ctx=written
        ) as resp:
            st = _mark_send(rec, before_s, written.perf_s, unix_s)
            rec.http_status = resp.status
            if resp.status != 200:
                text = (await read_text(resp, 4096, truncate=True))[:300]
                rec.error = f"HTTP {resp.status}: {text.strip()}"
            else:
                async for data in resp.content.iter_any():
                    now = time.perf_counter()
                    if watch is not None:
                        watch.last_s = now
                    events = parser.feed(data)
                    for _ in range(events.token_events):
                        offsets.append(round((now - st) * 1000.0, 4))
                    token_events += events.token_events
                    if events.usage is not None:
                        usage = events.usage
                    if events.error is not None:
                        rec.error = events.error
                        break
                    if events.done:
                        break
                if rec.error is None and not parser.saw_done:
                    rec.error = "stream ended before [DONE] (connection closed by server)"
    except MalformedStreamError as exc:
        rec.error = str(exc)
    except aiohttp.ServerTimeoutError:
        rec.error = f"timeout: no data for {stall_timeout_s:g} s (stream stalled)"
    except TimeoutError:
        rec.error = f"timeout: request exceeded {timeout_s:g} s"
    except aiohttp.ClientConnectorError as exc:
        rec.error = f"connection failed: {exc.os_error or exc}"
    except (aiohttp.ClientError, ConnectionError, OSError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}".strip()
    except asyncio.CancelledError:
        if watch is None or not watch.ours():
            rec.error = "cancelled (run interrupted)"
            _mark_send(rec, before_s, written.perf_s, unix_s)
            rec.end_perf_s = time.perf_counter()
            _fill_usage(rec, usage, token_events)
            raise
        rec.error = f"timeout: no data for {stall_timeout_s:g} s (stream stalled)"
    finally:
        if watch is not None:
            watch.stop()
    _mark_send(rec, before_s, written.perf_s, unix_s)
    rec.end_perf_s = time.perf_counter()
    _fill_usage(rec, usage, token_events)
    return rec


class _StallWatch:
    """Ends a request silent for `limit_s` (no response, or no data between reads) by
    cancelling its task, checking only when the limit could have passed.

    Why not aiohttp's `ClientTimeout(sock_read=...)`: that re-arms a loop timer on every
    network read (ResponseHandler._reschedule_timeout, aiohttp/client_proto.py), a cancelled
    and a new TimerHandle per chunk: at 20,000 chunks/s, a tenth of the client's CPU, which
    its event loop then lacks to stamp chunks on time. Here a read only records its instant;
    the one timer re-arms itself for the rest of the limit when it fires early."""

    __slots__ = ("_fired", "_handle", "_limit_s", "_loop", "_task", "last_s")

    def __init__(self, limit_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._limit_s = limit_s
        self._fired = False
        self.last_s = time.perf_counter()
        self._handle = self._loop.call_later(limit_s, self._check)

    def _check(self) -> None:
        idle_s = time.perf_counter() - self.last_s
        if idle_s < self._limit_s:
            self._handle = self._loop.call_later(self._limit_s - idle_s, self._check)
        elif self._task is not None:
            self._fired = True
            self._task.cancel()

    def ours(self) -> bool:
        """Whether the CancelledError being handled is this watch's alone; if so it is taken
        back (`Task.uncancel`), so the task goes on to return its record. A cancel of the
        caller's as well (Ctrl-C, the grace period's end) is left standing."""
        return self._fired and self._task is not None and self._task.uncancel() == 0

    def stop(self) -> None:
        self._handle.cancel()


def _mark_send(
    rec: RequestRecord, before_s: float, written_s: float | None, unix_s: float
) -> float:
    """Sets the record's send instant (the write's, else the one before the POST), its wall-
    clock twin and the dispatch lag from the scheduled release to it; returns the instant."""
    st = before_s if written_s is None else written_s
    rec.send_perf_s = st
    rec.send_time_unix_s = unix_s + (st - before_s)
    if rec.scheduled_perf_s is not None:
        rec.dispatch_lag_ms = max(0.0, (st - rec.scheduled_perf_s) * 1000.0)
    return st


def _fill_usage(rec: RequestRecord, usage: dict[str, Any] | None, token_events: int) -> None:
    """Token counts come from the final usage chunk, as in vLLM; the chunk count stands in for
    output tokens only when the server sends no usage (marked so the report can say so).
    `cached_tokens` stays None when the server does not report it — never 0."""
    if usage:
        if isinstance(usage.get("prompt_tokens"), int):
            rec.prompt_tokens = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            rec.output_tokens = usage["completion_tokens"]
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            rec.cached_tokens = details["cached_tokens"]
    if rec.output_tokens is None and token_events:
        rec.output_tokens = token_events
        rec.output_tokens_source = "chunks"
