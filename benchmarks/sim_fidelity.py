"""How late a busy host delivers the simulated server's tokens: two closed-loop batches of 8
prompts of 2,000 tokens over HTTP (time scale 1), the client's mean TTFT against the model's own
(the reference, computed in the same run in virtual time), and the server's mean emission lag
per step (`kvops:sim_emission_lag_seconds`). On a quiet machine the ratio is near 1.00 and the
lag a few ms; on a loaded one both grow, which is why the test tier judges the server's own
instants instead (tests/integration/test_sim_fidelity.py). Reports; never asserts.

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
from kvops.sim.server import ServerConfig, SimServer

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


def main() -> None:
    measured, lag_sum, steps = asyncio.run(_measure())
    want = float(np.mean(_model_ttfts_s())) * TIME_SCALE
    got = float(np.mean(measured))
    print(f"mean TTFT: client {got * 1e3:.1f} ms, model (reference) {want * 1e3:.1f} ms, "
          f"ratio {got / want:.2f}")  # fmt: skip
    print(f"emission lag: mean {1e3 * lag_sum / max(steps, 1):.1f} ms per step over {steps:g}")


if __name__ == "__main__":
    main()
