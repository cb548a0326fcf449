"""`kvops sim serve` in a process of its own, for tests on any tier that need a real HTTP engine
(integration tests against this machine, lab tests for the arm that runs beside the lab)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from kvops.abtest.embedded import free_port

OFFLOAD = json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})


@contextlib.contextmanager
def sim_server(gds: Path | None, log: Path, *extra: str) -> Iterator[str]:
    """`kvops sim serve` in its own process group, offload on when `gds` is given.

    Its own group, not its own session: it is stopped with its group, and where the kernel
    shares CPU time between sessions (autogroups) it is weighed with the test that measures it
    rather than as one more job at full weight beside the lab hosts' SSH sessions."""
    port = free_port()
    args = [sys.executable, "-m", "kvops", "sim", "serve", "--port", str(port), *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMCACHE_")}
    if gds is not None:
        args += ["--kv-transfer-config", OFFLOAD]
        env |= {
            "LMCACHE_GDS_PATH": str(gds),
            "LMCACHE_GDS_BUFFER_SIZE": "1024",
            "LMCACHE_LOCAL_CPU": "False",
        }
    with log.open("wb") as fh:
        proc = subprocess.Popen(args, env=env, stdout=fh, stderr=subprocess.STDOUT, process_group=0)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"kvops sim serve exited: {log.read_text()[-2000:]}")
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(url + "/health", timeout=1),
            ):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("kvops sim serve did not become healthy in 60 s")
            time.sleep(0.1)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
