"""TEST DOUBLE of a vLLM OpenAI server's read-only endpoints, for probe tests.

Serves canned bodies for /health, /version, /v1/models and /metrics on 127.0.0.1 from a thread.
It is not a model of vLLM (that is `kvops sim serve`); it only lets the probe's HTTP recorder
meet real sockets, real status codes and a real listening process.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BODIES: dict[str, tuple[int, str]] = {
    "/health": (200, ""),
    "/version": (200, json.dumps({"version": "0.0.0-double"})),
    "/v1/models": (200, json.dumps({"object": "list", "data": [{"id": "double-model"}]})),
    "/metrics": (200, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"),
}


class VllmHttpDouble:
    def __init__(self, health_status: int = 200) -> None:
        bodies = dict(BODIES)
        bodies["/health"] = (health_status, "")

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = bodies.get(self.path, (404, "not found"))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> VllmHttpDouble:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
