"""A server kvops talks to (a vLLM port anyone can bind, a hostile host) cannot make the client
hold an endless answer: plain answers are read up to a bound, then refused or cut."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import aiohttp
import pytest
from aiohttp import web

from kvops.abtest.arms import Arm, ArmUnreachable, fetch_arm_info
from kvops.loadgen.client import ResponseTooLarge, read_text
from kvops.smoke.run import SmokeError, _Server

T = TypeVar("T")
CHUNK = b"x" * 65536


async def _endless(request: web.Request) -> web.StreamResponse:
    """TEST DOUBLE of a server whose answer never ends."""
    resp = web.StreamResponse(status=200)
    await resp.prepare(request)
    try:
        while True:
            await resp.write(CHUNK)
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        pass
    return resp


@asynccontextmanager
async def _server() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/{tail:.*}", _endless)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _run(job: Callable[[str, aiohttp.ClientSession], Awaitable[T]]) -> T:
    async def main() -> T:
        async with _server() as url, aiohttp.ClientSession() as session:
            return await job(url, session)

    return asyncio.run(asyncio.wait_for(main(), 60))


def test_read_text_refuses_past_its_bound_or_cuts_when_asked() -> None:
    async def refused(url: str, session: aiohttp.ClientSession) -> None:
        async with session.get(url + "/metrics") as resp:
            await read_text(resp, 1024 * 1024)

    with pytest.raises(ResponseTooLarge, match="longer than 1048576 bytes"):
        _run(refused)

    async def cut(url: str, session: aiohttp.ClientSession) -> str:
        async with session.get(url + "/error") as resp:
            return await read_text(resp, 4096, truncate=True)

    assert _run(cut) == "x" * 4096


def test_smoke_and_ab_test_stop_reading_an_endless_answer() -> None:
    async def smoke(url: str, session: aiohttp.ClientSession) -> None:
        await _Server(session, url).call("GET", "/metrics")

    with pytest.raises(SmokeError, match="longer than"):
        _run(smoke)

    async def arm(url: str, session: aiohttp.ClientSession) -> None:
        await fetch_arm_info(session, Arm("offload", url))

    with pytest.raises(ArmUnreachable, match="longer than"):
        _run(arm)
