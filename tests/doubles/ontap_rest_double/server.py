"""TEST DOUBLE: the ONTAP REST API over HTTPS with basic auth, in a background thread.

HTTPS only (ONTAP's REST API is), with a certificate from a CA made for the test run
(`tls.make_test_pki`); HTTP basic auth against the state file's users (401 + a JSON error
body otherwise). The API itself lives in `api.Cluster`; this is only transport.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import ssl
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

from .api import Cluster
from .tls import DoublePki


def _authorised(cluster: Cluster, header: str) -> bool:
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        user, _, password = base64.b64decode(token).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return False
    return cluster.users.get(user) == password


def make_app(cluster: Cluster) -> web.Application:
    async def handler(request: web.Request) -> web.Response:
        if not _authorised(cluster, request.headers.get("Authorization", "")):
            # The body shape of every ONTAP error; the numeric code is the double's own.
            body = {"error": {"message": "not authorized", "code": "6"}}
            return web.json_response(
                body, status=401, headers={"WWW-Authenticate": 'Basic realm="ONTAP"'}
            )
        payload: Any = None
        raw = await request.read()
        if raw:
            try:
                payload = json.loads(raw)
            except json.JSONDecodeError:
                error = {"message": "Invalid JSON input", "code": "262185"}
                return web.json_response({"error": error}, status=400)
        status, body = cluster.handle(
            request.method, request.path, list(request.query.items()), payload
        )
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    return app


class OntapRestDouble:
    """Start with `with OntapRestDouble(cluster, pki) as double:`; `double.url` is the
    `https://127.0.0.1:<port>` base, `double.cluster.writes` every write it received."""

    def __init__(self, cluster: Cluster, pki: DoublePki) -> None:
        self.cluster = cluster
        self.pki = pki
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _start(self) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(self.pki.cert_file), str(self.pki.key_file))
        self._runner = web.AppRunner(make_app(self.cluster), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        self.port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]

    def __enter__(self) -> OntapRestDouble:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    def __exit__(self, *_: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def save_state(self, path: Path) -> None:
        path.write_text(json.dumps(self.cluster.state(), indent=2), encoding="utf-8")
