"""The stall limit without aiohttp's per-read timer (kvops.loadgen.client._StallWatch).

A stream silent for longer than `stall_timeout_s` ends as an error record, whether the silence
is before the answer or between chunks; a stream that keeps talking is never cut, however
long it lasts; and a cancel from the caller (Ctrl-C, the grace period's end) still cancels.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kvops.loadgen import CompletionRequest, Endpoint, RequestRecord, make_session, send_request

CHUNK = b"data: " + json.dumps({"choices": [{"index": 0, "text": "a"}]}).encode() + b"\n\n"


async def _silent(request: web.Request) -> web.StreamResponse:
    """No answer at all."""
    await request.read()
    await asyncio.sleep(3600)
    return web.StreamResponse()


async def _talks_then_stops(request: web.Request) -> web.StreamResponse:
    """One chunk, then silence."""
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(CHUNK)
    await asyncio.sleep(3600)
    return resp


async def _keeps_talking(request: web.Request) -> web.StreamResponse:
    """12 chunks 0.05 s apart: 0.6 s in all, each gap well under a 0.3 s stall limit."""
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for _ in range(12):
        await resp.write(CHUNK)
        await asyncio.sleep(0.05)
    await resp.write(b"data: [DONE]\n\n")
    return resp


def _run(path: str, stall_s: float, cancel_after_s: float | None = None) -> RequestRecord | str:
    async def main() -> RequestRecord | str:
        app = web.Application()
        app.router.add_post("/stops/v1/completions", _talks_then_stops)
        app.router.add_post("/talks/v1/completions", _keeps_talking)
        app.router.add_post("/silent/v1/completions", _silent)
        async with TestServer(app, host="127.0.0.1") as srv, make_session() as session:
            endpoint = Endpoint(str(srv.make_url(path)).rstrip("/"), "m")
            req = CompletionRequest("r", [1, 2, 3], 16)
            coro = send_request(session, endpoint, req, timeout_s=30.0, stall_timeout_s=stall_s)
            task = asyncio.create_task(coro)
            if cancel_after_s is not None:
                await asyncio.sleep(cancel_after_s)
                task.cancel()
            try:
                return await task
            except asyncio.CancelledError:
                return "cancelled"

    return asyncio.run(main())


def test_silence_between_chunks_ends_the_stream_as_a_stall() -> None:
    rec = _run("/stops", 0.3)
    assert isinstance(rec, RequestRecord)
    assert rec.error == "timeout: no data for 0.3 s (stream stalled)"
    assert len(rec.chunk_offsets_ms) == 1 and rec.end_perf_s >= rec.send_perf_s


def test_silence_before_the_answer_is_a_stall_too() -> None:
    rec = _run("/silent", 0.3)
    assert isinstance(rec, RequestRecord)
    assert rec.error == "timeout: no data for 0.3 s (stream stalled)" and rec.http_status is None


def test_a_stream_that_keeps_talking_is_never_cut() -> None:
    rec = _run("/talks", 0.3)
    assert isinstance(rec, RequestRecord)
    assert rec.ok, rec.error
    assert len(rec.chunk_offsets_ms) == 12


def test_the_callers_cancel_still_cancels() -> None:
    assert _run("/stops", 30.0, cancel_after_s=0.2) == "cancelled"


@pytest.mark.parametrize("stall_s", [None, 0.0])
def test_no_limit_means_no_watch(stall_s: float | None) -> None:
    """None (and 0) turn the limit off: the caller's cancel is then the only way out."""
    assert _run("/stops", stall_s, cancel_after_s=0.3) == "cancelled"  # type: ignore[arg-type]
