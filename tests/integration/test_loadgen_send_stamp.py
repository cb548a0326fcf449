"""Where a request's send is stamped: the moment it is written, not before the client's own set-up.

`vllm bench serve` times TTFT from the request's send. A stamp taken before the POST also counts
the client's steps before the write (building the request, a connection from the pool, and on
Python < 3.12 a whole event-loop turn before aiohttp's body-writing task starts) as the
server's time. These tests put a known step of the client's own between the POST and the write
(an aiohttp trace hook that runs at request start) and check the order of the stamps, never a
duration: the record's send is after that step, the dispatch lag holds it, and a session
without kvops' hook keeps vLLM's stamp before the POST.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import socket
import time
import types
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kvops.loadgen import CompletionRequest, Endpoint, RequestRecord, make_session, send_request
from kvops.loadgen.client import send_stamp_trace

ARRIVED = web.AppKey("arrived", list[float])


async def _stream(request: web.Request) -> web.StreamResponse:
    """Two token chunks, usage, [DONE]; stamps the instant the whole request had arrived."""
    await request.read()
    request.app[ARRIVED].append(time.perf_counter())
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for _ in range(2):
        chunk = {"choices": [{"index": 0, "text": "a"}]}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    usage = {"prompt_tokens": 3, "completion_tokens": 2}
    await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp


def _served(test: Callable[[str, list[float]], Awaitable[None]]) -> None:
    """Runs `test(base URL, arrival instants)` against the streaming server, in one loop."""

    async def main() -> None:
        app = web.Application()
        arrived: list[float] = []
        app[ARRIVED] = arrived
        app.router.add_post("/v1/completions", _stream)
        async with TestServer(app, host="127.0.0.1") as srv:
            await test(str(srv.make_url("/")).rstrip("/"), arrived)

    asyncio.run(main())


def _slow_start(marks: list[float]) -> aiohttp.TraceConfig:
    """A client step between the POST and the write: 20 ms of work at request start (the
    client's own, as building a large request or a busy loop would be); its end is marked."""

    async def on_start(
        _s: aiohttp.ClientSession, _ctx: types.SimpleNamespace, _p: aiohttp.TraceRequestStartParams
    ) -> None:
        time.sleep(0.02)
        marks.append(time.perf_counter())

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_start)
    return trace


async def _send(session: aiohttp.ClientSession, url: str) -> tuple[RequestRecord, float]:
    rec = RequestRecord(request_id="r1", scheduled_perf_s=time.perf_counter())
    called = time.perf_counter()
    await send_request(
        session,
        Endpoint(url, "m"),
        CompletionRequest("r1", [1, 2, 3], 2),
        record=rec,
    )
    return rec, called


def test_the_send_is_stamped_when_the_request_is_written() -> None:
    marks: list[float] = []
    got: list[tuple[RequestRecord, float, float]] = []

    async def test(url: str, arrivals: list[float]) -> None:
        traces = [_slow_start(marks), send_stamp_trace()]
        async with aiohttp.ClientSession(trace_configs=traces) as s:
            rec, called = await _send(s, url)
        got.append((rec, called, arrivals[0]))

    _served(test)
    ((rec, called, arrived),) = got
    assert rec.ok, rec.error
    (step_done,) = marks
    assert called < step_done <= rec.send_perf_s <= arrived  # after the client's own step
    # the client's step is dispatch lag (the client's), not TTFT (the server's)
    assert rec.scheduled_perf_s is not None and rec.dispatch_lag_ms is not None
    assert rec.dispatch_lag_ms == pytest.approx((rec.send_perf_s - rec.scheduled_perf_s) * 1e3)
    assert rec.dispatch_lag_ms >= (step_done - rec.scheduled_perf_s) * 1e3
    # chunk offsets count from the write: the first chunk came after the request arrived
    assert rec.ttft_ms is not None and rec.send_perf_s + rec.ttft_ms / 1e3 >= arrived
    assert len(rec.chunk_offsets_ms) == 2 and rec.output_tokens == 2


def test_a_session_without_the_hook_keeps_the_stamp_before_the_post() -> None:
    """Callers with a session of their own get vLLM's bench stamp: the instant before the POST."""
    marks: list[float] = []
    got: list[tuple[RequestRecord, float]] = []

    async def test(url: str, _arrivals: list[float]) -> None:
        async with aiohttp.ClientSession(trace_configs=[_slow_start(marks)]) as s:
            got.append(await _send(s, url))

    _served(test)
    ((rec, called),) = got
    assert rec.ok, rec.error
    assert called <= rec.send_perf_s < marks[0]


def test_make_session_stamps_at_the_write_and_an_unsent_request_still_has_a_send() -> None:
    async def test(url: str, arrivals: list[float]) -> None:
        async with make_session() as s:
            rec, called = await _send(s, url)
            assert rec.ok, rec.error
            assert called <= rec.send_perf_s <= arrivals[0]
            # a port nobody listens on: never written, still stamped (before the POST)
            with socket.socket() as free:
                free.bind(("127.0.0.1", 0))
                port = free.getsockname()[1]
            failed, called = await _send(s, f"http://127.0.0.1:{port}")
        assert not failed.ok and "connection failed" in str(failed.error)
        assert called <= failed.send_perf_s <= failed.end_perf_s

    _served(test)


def test_the_stamp_hook_runs_inside_the_body_write() -> None:
    """The hook is aiohttp's `on_request_chunk_sent`, awaited in StreamWriter.write just before
    the headers and body go to the transport (aiohttp/http_writer.py): the instant of the write."""
    trace = send_stamp_trace()
    assert len(trace.on_request_chunk_sent) == 1
    assert inspect.iscoroutinefunction(trace.on_request_chunk_sent[0])
