"""Test double: an OpenAI-style streaming server with fixed, known timing.

First chunk 50 ms after the request arrives, then one chunk every 10 ms, on absolute
deadlines (t0 + 50 ms + k x 10 ms) so the server's own sleep jitter does not accumulate: what
a client measures beyond these figures is client (or network stack) error.

Run: python tests/doubles/fixed_delay_server.py --port P [--fault http500|malformed|stall]
     [--text-only] [--vocab-size N] [--first-ms 50] [--gap-ms 10] [--timing-log DIR]
     [--event-log FILE] [--no-metrics]

With --event-log, one JSON line per POST /v1/completions ({"event": "request", "prompt": ...})
and per POST /reset_prefix_cache ({"event": "reset"}) is appended in the order the server got
them (tests/integration/test_abtest_faults.py counts the resets before each segment).
With --no-metrics the server has no /metrics (404), like an engine with metrics turned off.

With --timing-log, each process appends one JSON line per streamed request to DIR/<pid>.jsonl:
the prompt (a token-id prompt by its last id), the CLOCK_MONOTONIC instant the request had
arrived (its last byte read) and those at which each chunk was written. That is the truth a
client's timing is judged against: on a busy 2-core host the double's sleeps fire late, and a
client that reports the lateness is right, not wrong; arrival - the client's send stamp is the
request's way in (benchmarks/loadgen_ttft_error.py).
It is a test double, named as such; production code never imports it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from aiohttp import web

BOS = 1


def _count_text_tokens(text: str) -> int:
    """The double's tokenizer: one token per whitespace-separated word."""
    return len(text.split())


class FixedDelay:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.requests = 0
        self.generated = 0

    def log_event(self, event: dict[str, object]) -> None:
        if self.args.event_log:
            with open(self.args.event_log, "a") as log:
                log.write(json.dumps(event) + "\n")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        # the request's arrival: its last byte read (aiohttp starts the handler on the headers;
        # a client that writes its body late is late, and a server cannot start before it)
        raw = await request.read()
        arrived_s = time.monotonic()
        t0 = asyncio.get_running_loop().time()  # the first chunk is due 50 ms after this
        body = json.loads(raw)
        self.requests += 1
        prompt = body.get("prompt")
        if prompt is None and "messages" in body:
            prompt = " ".join(m.get("content", "") for m in body["messages"])
        self.log_event({"event": "request", "prompt": prompt})
        if isinstance(prompt, list):
            if self.args.text_only:
                return web.json_response(
                    {"error": {"message": "token ids not accepted"}}, status=400
                )
            if any(not isinstance(t, int) or t >= self.args.vocab_size for t in prompt):
                return web.json_response(
                    {"error": {"message": "token id out of range"}}, status=400
                )
            prompt_tokens = len(prompt)
        else:
            prompt_tokens = _count_text_tokens(str(prompt)) + 1
        if self.args.fault == "http500":
            return web.json_response({"error": {"message": "injected failure"}}, status=500)
        n = int(body.get("max_tokens") or 16)
        loop = asyncio.get_running_loop()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        written_s: list[float] = []
        for k in range(n):
            delay = t0 + (self.args.first_ms + k * self.args.gap_ms) / 1000.0 - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if k == 2 and self.args.fault == "malformed":
                await resp.write(b"data: {this is not json\n\n")
                return resp
            if k == 2 and self.args.fault == "stall":
                await asyncio.sleep(3600)
            chunk = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": "a"}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            written_s.append(time.monotonic())
            self.generated += 1
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n,
            "total_tokens": prompt_tokens + n,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        if self.args.timing_log:
            # a token-id prompt is logged by its last id only (what read_timing_log pairs on):
            # encoding 640 ids per request would be the double's own CPU, charged to its
            # lateness under load, and more than a text prompt's one string costs
            line = json.dumps(
                {
                    "prompt": prompt[-1:] if isinstance(prompt, list) else prompt,
                    "arrived_monotonic_s": arrived_s,
                    "chunk_written_monotonic_s": written_s,
                }
            )
            with open(Path(self.args.timing_log) / f"{os.getpid()}.jsonl", "a") as log:
                log.write(line + "\n")
        return resp

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": "fixed-delay", "object": "model", "max_model_len": 65536}],
            }
        )

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        text = body.get("prompt", "")
        specials = 1 if body.get("add_special_tokens", True) else 0
        n = _count_text_tokens(text) + specials
        return web.json_response(
            {"count": n, "max_model_len": 65536, "tokens": list(range(2, n + 2))}
        )

    async def version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": "fixed-delay-double"})

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(self, _: web.Request) -> web.Response:
        text = (
            "# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{model_name="fixed-delay"}} {self.requests}\n'
            "# TYPE vllm:cache_config_info gauge\n"
            'vllm:cache_config_info{block_size="16",enable_prefix_caching="True"} 1.0\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def reset(self, _: web.Request) -> web.Response:
        self.log_event({"event": "reset"})
        return web.json_response({"success": True})


def build_app(args: argparse.Namespace) -> web.Application:
    srv = FixedDelay(args)
    app = web.Application()
    app.router.add_post("/v1/completions", srv.completions)
    app.router.add_post("/v1/chat/completions", srv.completions)
    app.router.add_get("/v1/models", srv.models)
    app.router.add_post("/tokenize", srv.tokenize)
    app.router.add_get("/version", srv.version)
    app.router.add_get("/health", srv.health)
    if not args.no_metrics:
        app.router.add_get("/metrics", srv.metrics)
    app.router.add_post("/reset_prefix_cache", srv.reset)
    return app


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--first-ms", type=float, default=50.0)
    p.add_argument("--gap-ms", type=float, default=10.0)
    p.add_argument("--fault", choices=["none", "http500", "malformed", "stall"], default="none")
    p.add_argument("--text-only", action="store_true")
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--timing-log", help="directory for per-request chunk write instants")
    p.add_argument("--event-log", help="file: one line per completion request and cache reset")
    p.add_argument("--no-metrics", action="store_true", help="serve no /metrics")
    p.add_argument("--reuse-port", action="store_true", help="share the port with siblings")
    return p.parse_args(argv)


def read_timing_log(log_dir: Path, wanted: set[int], wait_s: float = 5.0) -> dict[int, list[float]]:
    """The chunk write instants of each logged request, keyed by its prompt's last token id
    (callers give each measured request its own). Waits briefly for lines still being written:
    the double logs a request after its last write, when the client may already be done."""
    deadline = time.monotonic() + wait_s
    while True:
        written: dict[int, list[float]] = {}
        for log in log_dir.glob("*.jsonl"):
            for line in log.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line being appended right now
                key = entry["prompt"][-1]
                if key in wanted:
                    written[key] = entry["chunk_written_monotonic_s"]
        if len(written) == len(wanted) or time.monotonic() > deadline:
            return written
        time.sleep(0.1)


@contextlib.contextmanager
def running(*args: str, processes: int = 1) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Start the double on a free port (several processes sharing it with SO_REUSEPORT when
    `processes` > 1, so the server side is not the bottleneck); yield (base URL, process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    extra = ["--reuse-port"] if processes > 1 else []
    procs = [
        subprocess.Popen(
            [sys.executable, str(Path(__file__)), "--port", str(port), *extra, *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(processes)
    ]
    proc = procs[0]
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1):
                    break
            except OSError:
                time.sleep(0.05)
        yield url, proc
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


if __name__ == "__main__":
    ns = parse_args(sys.argv[1:])
    try:
        import uvloop  # type: ignore[import-not-found]

        uvloop.install()
    except ImportError:
        pass
    web.run_app(
        build_app(ns),
        host=ns.host,
        port=ns.port,
        print=None,
        access_log=None,
        reuse_port=ns.reuse_port or None,
    )
