"""TEST DOUBLE: an engine whose offload tier returns the wrong KV, as seen from its HTTP API.

A reverse proxy in front of a real engine (`kvops sim serve` in the integration tier). Everything
passes through unchanged except the non-streaming `/v1/completions` answers whose prompt came
(partly) from cache — `usage.prompt_tokens_details.cached_tokens` > 0 — and that carry logprobs:
in those, the third generated token is replaced by another id and its log-probability lowered,
which is what a greedy answer computed from wrong KV looks like. Answers computed from scratch
(0 cached tokens) are left alone, so the smoke's reference stays right.

Run: python tests/doubles/wrong_kv_proxy.py --port P --upstream http://127.0.0.1:Q
It is a test double, named as such; production code never imports it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import aiohttp
from aiohttp import web

CORRUPTED_POSITION = 2  # 0-based: the third generated token


def corrupt(doc: dict[str, Any]) -> bool:
    """Change the answer in place if its KV came from cache; True when it did."""
    usage = doc.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    choices = doc.get("choices") or []
    logprobs = choices[0].get("logprobs") if choices else None
    if cached <= 0 or not isinstance(logprobs, dict):
        return False
    tokens, values = logprobs["tokens"], logprobs["token_logprobs"]
    if len(tokens) <= CORRUPTED_POSITION:
        return False
    old = str(tokens[CORRUPTED_POSITION])
    if old.startswith("token_id:"):
        tokens[CORRUPTED_POSITION] = f"token_id:{int(old.split(':', 1)[1]) + 1}"
    else:
        tokens[CORRUPTED_POSITION] = old + "x"
    values[CORRUPTED_POSITION] = float(values[CORRUPTED_POSITION]) - 1.5
    return True


def make_app(upstream: str) -> web.Application:
    async def forward(request: web.Request) -> web.StreamResponse:
        session: aiohttp.ClientSession = request.app["session"]
        body = await request.read()
        async with session.request(
            request.method,
            upstream + request.path_qs,
            data=body or None,
            headers={"Content-Type": request.headers.get("Content-Type", "application/json")},
        ) as resp:
            payload = await resp.read()
            ctype = resp.headers.get("Content-Type", "application/octet-stream")
        if request.path == "/v1/completions" and ctype.startswith("application/json"):
            doc = json.loads(payload)
            if corrupt(doc):
                payload = json.dumps(doc).encode()
        return web.Response(body=payload, status=resp.status, headers={"Content-Type": ctype})

    async def start(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession()

    async def stop(app: web.Application) -> None:
        await app["session"].close()

    app = web.Application(client_max_size=64 * 1024**2)
    app.router.add_route("*", "/{tail:.*}", forward)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    ns = parser.parse_args(sys.argv[1:])
    web.run_app(make_app(ns.upstream.rstrip("/")), host="127.0.0.1", port=ns.port, print=None)
