"""The simulated server over real HTTP on 127.0.0.1: vLLM's stream format, usage, errors,
metrics, and LMCache's GDS files."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from kvops.sim.lmcache_config import LMCacheSettings
from kvops.sim.model import EngineSettings, build_engine
from kvops.sim.records import Request
from kvops.sim.server import ServerConfig, SimServer

OFFLOAD = json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})


def config(gds: Path | None = None, **settings: Any) -> ServerConfig:
    if gds is not None:
        settings["offload"] = True
        settings["lmcache"] = LMCacheSettings(
            local_cpu=False, gds_path=str(gds), gds_buffer_size=1024
        )
    return ServerConfig(settings=EngineSettings(**settings), time_scale=0.01)


Check = Callable[[aiohttp.ClientSession, str], Awaitable[None]]


def run_with_server(cfg: ServerConfig, check: Check) -> SimServer:
    server = SimServer(cfg)

    async def main() -> None:
        test_server = TestServer(server.app(), host="127.0.0.1")
        await test_server.start_server()
        try:
            async with aiohttp.ClientSession() as session:
                await check(session, str(test_server.make_url("")).rstrip("/"))
        finally:
            await test_server.close()

    asyncio.run(main())
    return server


def prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 128_256, n).tolist()


async def stream_events(session: aiohttp.ClientSession, url: str, body: dict) -> list[str]:
    async with session.post(url, json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = (await resp.read()).decode()
    assert raw.endswith("\n\n")
    events = raw.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events)
    return [e.removeprefix("data: ") for e in events]


def test_streaming_completion_like_vllm() -> None:
    async def check(session: aiohttp.ClientSession, base: str) -> None:
        body = {"prompt": prompt(1, 600), "max_tokens": 5, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        events = await stream_events(session, base + "/v1/completions", body)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        tokens = [c for c in chunks if c["choices"]]
        assert len(tokens) == 5
        assert all(c["object"] == "text_completion" for c in chunks)
        assert tokens[-1]["choices"][0]["finish_reason"] == "length"
        assert all(c["choices"][0]["text"].startswith(" ") for c in tokens)
        usage = chunks[-1]["usage"]
        assert chunks[-1]["choices"] == []
        assert usage["prompt_tokens"] == 600 and usage["completion_tokens"] == 5
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        again = await stream_events(session, base + "/v1/completions", body)
        usage2 = json.loads(again[-2])["usage"]
        assert usage2["prompt_tokens_details"]["cached_tokens"] == 592  # 37 full blocks
        no_usage = await stream_events(session, base + "/v1/completions",
                                       {**body, "stream_options": None})  # fmt: skip
        assert all(json.loads(e)["choices"] for e in no_usage[:-1])

    run_with_server(config(), check)


def test_chat_text_tokenize_models_and_non_streaming() -> None:
    async def check(session: aiohttp.ClientSession, base: str) -> None:
        async with session.get(base + "/v1/models") as resp:
            card = (await resp.json())["data"][0]
        assert card["max_model_len"] == 131072 and card["vocab_size"] == 128256
        async with session.post(base + "/tokenize", json={"prompt": "one two three"}) as resp:
            tok = await resp.json()
        assert tok["count"] == 3 and tok["max_model_len"] == 131072
        text_body = {"model": card["id"], "prompt": "one two three", "max_tokens": 4}
        async with session.post(base + "/v1/completions", json=text_body) as resp:
            done = await resp.json()
        assert done["usage"]["prompt_tokens"] == 3 and done["usage"]["completion_tokens"] == 4
        assert len(done["choices"][0]["text"].split()) == 4
        chat = {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3,
                "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        events = await stream_events(session, base + "/v1/chat/completions", chat)
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        contents = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
        assert len(contents) == 3 and chunks[-1]["usage"]["completion_tokens"] == 3
        async with session.post(base + "/detokenize", json={"tokens": tok["tokens"]}) as resp:
            assert len((await resp.json())["prompt"].split()) == 3
        for path in ("/health", "/version", "/load"):
            async with session.get(base + path) as resp:
                assert resp.status == 200

    run_with_server(config(), check)


def test_errors_are_openai_style_400s() -> None:
    async def check(session: aiohttp.ClientSession, base: str) -> None:
        cases = [
            {"prompt": prompt(2, 300), "max_tokens": 10},  # over max_model_len
            {"prompt": [0, 128_256], "max_tokens": 1},  # out of vocabulary
            {"prompt": [], "max_tokens": 1},
        ]
        for body in cases:
            async with session.post(base + "/v1/completions", json=body) as resp:
                assert resp.status == 400
                err = (await resp.json())["error"]
                assert err["code"] == 400 and err["message"]
        async with session.post(base + "/v1/completions", json=cases[0]) as resp:
            assert "maximum context length is 256" in (await resp.json())["error"]["message"]
        body = {"model": "nope", "prompt": "a", "max_tokens": 1}
        async with session.post(base + "/v1/completions", json=body) as resp:
            assert resp.status == 404

    run_with_server(config(max_model_len=256), check)


def test_metrics_parse_and_offload_writes_gds_files_that_survive_restart(tmp_path: Path) -> None:
    gds = tmp_path / "gds"
    body = {"prompt": prompt(3, 1100), "max_tokens": 2}
    seen: dict[str, float] = {}

    async def first(session: aiohttp.ClientSession, base: str) -> None:
        async with session.post(base + "/v1/completions", json=body) as resp:
            assert resp.status == 200
        async with session.get(base + "/metrics") as resp:
            text = await resp.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                seen[sample.name] = sample.value
                if sample.name == "vllm:cache_config_info":
                    assert sample.labels["kv_connector"] == "LMCacheConnectorV1"
                    assert sample.labels["num_gpu_blocks"] == "1000"
                    assert sample.labels["block_size"] == "16"

    run_with_server(config(gds, num_gpu_blocks_override=1000), first)
    for name in ("vllm:prefix_cache_queries_total", "vllm:external_prefix_cache_hits_total",
                 "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
                 "vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_sum",
                 "vllm:inter_token_latency_seconds_count", "vllm:num_preemptions_total",
                 "lmcache:num_retrieve_requests_total"):  # fmt: skip
        assert name in seen, name
    assert seen["lmcache:num_stored_tokens_total"] == 4 * 256  # only full chunks
    data = list(gds.glob("??/??/*.kvcache.safetensors"))
    assert len(data) == 4 and len(list(gds.glob("??/??/*.metadata"))) == 4

    async def second(session: aiohttp.ClientSession, base: str) -> None:
        async with session.post(base + "/v1/completions", json=body) as resp:
            usage = (await resp.json())["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == 1024  # from the files

    restarted = run_with_server(config(gds, num_gpu_blocks_override=1000), second)
    assert restarted.engine.stats.external_prefix_cache_hits == 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cli_serve_subprocess_ready_on_health(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "LMCACHE_GDS_PATH": str(tmp_path), "LMCACHE_GDS_BUFFER_SIZE": "1024"}
    cmd = [sys.executable, "-m", "kvops", "sim", "serve", "--port", str(port),
           "--time-scale", "0.01", "--kv-transfer-config", OFFLOAD,
           "--served-model-name", "tiny"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline
                time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
            assert json.loads(r.read())["data"][0]["id"] == "tiny"
    finally:
        proc.terminate()
        out = proc.communicate(timeout=10)[0].decode()
    assert "LMCache Configuration:" in out and "Traceback" not in out


def test_real_time_follows_the_model_clock() -> None:
    """Four concurrent streams at time_scale 0.5, judged on the server's own instants (no
    wall-clock bound, which a loaded host breaks): each arrival is stamped inside its send
    window; the model's token instants are exactly the pure engine's for those arrivals (the
    model's clock is never stretched to the wall's), with the requests sharing decode steps;
    and no stream's first or last token reaches the client before the model's instant for it
    x time_scale (never compressed). How late a busy host delivers:
    benchmarks/sim_fidelity.py (issue 14 §5)."""
    scale = 0.5
    streams = 4
    sent: list[float] = []
    firsts: list[float] = []
    lasts: list[float] = []

    async def one(session: aiohttp.ClientSession, base: str, i: int) -> None:
        body = {"prompt": prompt(10 + i, 6000), "max_tokens": 20, "stream": True}
        loop = asyncio.get_running_loop()
        sent.append(loop.time())
        seen: list[float] = []
        async with session.post(base + "/v1/completions", json=body) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    seen.append(loop.time())
        firsts.append(seen[0])
        lasts.append(seen[-1])

    async def check(session: aiohttp.ClientSession, base: str) -> None:
        await asyncio.gather(*(one(session, base, i) for i in range(streams)))

    server = run_with_server(ServerConfig(time_scale=scale), check)
    records = sorted(server.recent_records, key=lambda r: r.arrival_s)
    assert len(records) == streams
    # the server's clock: wall instant = _real0 + virtual x scale (the loop's own clock)
    arrivals = [server._real0 + r.arrival_s * scale for r in records]
    assert min(sent) <= min(arrivals) and max(arrivals) <= min(firsts)
    replay = build_engine(settings=EngineSettings()).run(
        Request(f"r{i}", r.arrival_s, prompt(10 + i, 6000), 20) for i, r in enumerate(records)
    )  # random prompts, no shared blocks: which prompt is which record's is moot
    for got, want in zip(records, replay, strict=True):
        assert got.token_times_s == pytest.approx(want.token_times_s, rel=1e-9, abs=1e-9)
    shared = set.intersection(*(set(r.token_times_s) for r in records))
    assert len(shared) >= 10  # concurrent requests decode in the same steps
    assert max(r.ttft_s or 0.0 for r in records) * scale > 0.05  # a prefill long enough to see
    model_firsts = sorted(server._real0 + r.token_times_s[0] * scale for r in records)
    model_lasts = sorted(server._real0 + r.token_times_s[-1] * scale for r in records)
    for got, want in zip(sorted(firsts) + sorted(lasts), model_firsts + model_lasts, strict=True):
        assert got >= want - 1e-3  # never before the model's instant


def test_a_dead_engine_fails_requests_and_health() -> None:
    server = SimServer(config())

    def broken() -> None:
        raise RuntimeError("model bug")

    server.engine.step = broken  # type: ignore[assignment,method-assign]

    async def main() -> None:
        test_server = TestServer(server.app(), host="127.0.0.1")
        await test_server.start_server()
        base = str(test_server.make_url("")).rstrip("/")
        try:
            async with aiohttp.ClientSession() as session:
                body = {"prompt": [1, 2, 3], "max_tokens": 2}
                # the engine dies while serving a stream whose headers went out at admission
                # (as vLLM's StreamingResponse): it ends as vLLM's does, an error event and
                # [DONE]
                stream = {**body, "stream": True}
                async with session.post(base + "/v1/completions", json=stream) as resp:
                    assert resp.status == 200
                    events = (await resp.text()).split("\n\n")
                error = json.loads(events[0].removeprefix("data: "))["error"]
                assert "model bug" in error["message"]
                assert events[1] == "data: [DONE]"
                # a request to the dead engine is refused with 500
                async with session.post(base + "/v1/completions", json=body) as resp:
                    assert resp.status == 500
                    assert "model bug" in (await resp.json())["error"]["message"]
                async with session.get(base + "/health") as resp:
                    assert resp.status == 503
        finally:
            await test_server.close()

    asyncio.run(main())
