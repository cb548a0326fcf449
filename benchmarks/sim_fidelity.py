"""How late a busy host delivers the simulated server's tokens: two closed-loop batches of 8
prompts of 2,000 tokens over HTTP (time scale 1), the client's mean TTFT against the model's own
(the reference, computed in the same run in virtual time), and the server's mean emission lag
per step (`kvops:sim_emission_lag_seconds`). On a quiet machine the ratio is near 1.00 and the
lag a few ms; on a loaded one both grow, which is why the test tier judges the server's own
instants instead (tests/integration/test_sim_fidelity.py, test_sim_server.py). Second figure:
how long the rest of a 100-token stream takes while another client's upload hangs (time scale
0.05: ~50 ms of modelled decode plus at most one held step, ARRIVAL_WAIT_CAP_S = 0.25 s), and
the server's own held time (`kvops:sim_arrival_wait_seconds`). Reports; never asserts.

    .venv/bin/python benchmarks/sim_fidelity.py
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import numpy as np
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from kvops.sim.model import EngineSettings, build_engine
from kvops.sim.records import Request
from kvops.sim.server import ARRIVAL_WAIT_CAP_S, ServerConfig, SimServer
from kvops.sim.server_metrics import ARRIVAL_WAIT

TIME_SCALE = 1.0
BATCH = 8
PROMPT_TOKENS = 2_000
OUTPUT_TOKENS = 4
LAG = "kvops:sim_emission_lag_seconds"


def _prompts(batch: int) -> list[list[int]]:
    rng = np.random.default_rng(batch)
    return [rng.integers(16, 128_000, PROMPT_TOKENS).tolist() for _ in range(BATCH)]


async def _ttft_s(session: aiohttp.ClientSession, url: str, ids: list[int]) -> float:
    body = json.dumps({"prompt": ids, "max_tokens": OUTPUT_TOKENS, "stream": True}).encode()
    start = time.perf_counter()
    first: float | None = None
    async with session.post(url, data=body) as resp:
        async for _ in resp.content.iter_any():
            first = time.perf_counter() if first is None else first
    return (first or time.perf_counter()) - start


def _model_ttfts_s() -> list[float]:
    engine = build_engine(settings=EngineSettings())
    out: list[float] = []
    for batch in range(2):
        reqs = [Request(f"b{batch}-{i}", engine.now_s, ids, OUTPUT_TOKENS)
                for i, ids in enumerate(_prompts(batch))]  # fmt: skip
        out += [r.ttft_s or 0.0 for r in engine.run(reqs)]
    return out


async def _measure() -> tuple[list[float], float, float]:
    server = SimServer(ServerConfig(settings=EngineSettings(), time_scale=TIME_SCALE))
    test_server = TestServer(server.app(), host="127.0.0.1")
    await test_server.start_server()
    base = str(test_server.make_url("")).rstrip("/")
    measured: list[float] = []
    try:
        async with aiohttp.ClientSession() as session:
            for batch in range(2):
                jobs = [_ttft_s(session, base + "/v1/completions", ids) for ids in _prompts(batch)]
                measured += await asyncio.gather(*jobs)
            async with session.get(base + "/metrics") as resp:
                text = await resp.text()
    finally:
        await test_server.close()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
              if s.name.startswith(LAG)}  # fmt: skip
    return measured, values[LAG + "_sum"], values[LAG + "_count"]


def _metric(text: str, name: str) -> float:
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == name)  # fmt: skip


async def _slow_upload() -> tuple[float, float]:
    """(wall seconds for the rest of a 100-token stream after another client's upload began
    to hang, wall seconds the server held a step for it)."""
    server = SimServer(ServerConfig(settings=EngineSettings(), time_scale=0.05))
    test_server = TestServer(server.app(), host="127.0.0.1")
    await test_server.start_server()
    base = str(test_server.make_url("")).rstrip("/")
    assert test_server.port is not None
    try:
        async with aiohttp.ClientSession() as session:
            body = {"prompt": _prompts(0)[0][:500], "max_tokens": 100, "stream": True}
            async with session.post(base + "/v1/completions", json=body) as resp:
                await resp.content.readany()
                _, writer = await asyncio.open_connection("127.0.0.1", test_server.port)
                writer.write(
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    b'application/json\r\nContent-Length: 1000\r\n\r\n{"prompt":'
                )
                await writer.drain()
                start = time.perf_counter()
                await resp.read()
                rest_s = time.perf_counter() - start
            async with session.get(base + "/metrics") as resp:
                held_s = _metric(await resp.text(), ARRIVAL_WAIT + "_sum")
            writer.close()
    finally:
        await test_server.close()
    return rest_s, held_s


def main() -> None:
    measured, lag_sum, steps = asyncio.run(_measure())
    want = float(np.mean(_model_ttfts_s())) * TIME_SCALE
    got = float(np.mean(measured))
    print(f"mean TTFT: client {got * 1e3:.1f} ms, model (reference) {want * 1e3:.1f} ms, "
          f"ratio {got / want:.2f}")  # fmt: skip
    print(f"emission lag: mean {1e3 * lag_sum / max(steps, 1):.1f} ms per step over {steps:g}")
    rest_s, held_s = asyncio.run(_slow_upload())
    print(
        f"a hung upload: the other stream's last 99 tokens took {rest_s * 1e3:.0f} ms "
        f"(model ~50 ms + at most one hold of {ARRIVAL_WAIT_CAP_S * 1e3:.0f} ms); "
        f"the server held {held_s * 1e3:.0f} ms"
    )


if __name__ == "__main__":
    main()
