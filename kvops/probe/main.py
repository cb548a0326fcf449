"""Order of collection and the evidence document (schema_version 1, see `kvops.evidence`).

Cheap local reads come first and the HTTP calls and the optional gdsio run last, so that a slow
endpoint or storage spends the end of the time budget, not the platform evidence.
"""

from __future__ import annotations

import datetime
import json
import signal
import sys
from typing import Any, Dict

from .core import Probe
from .service import collect_http, collect_lmcache_server, collect_service
from .storage import collect_gds
from .system import collect_platform

SCHEMA_VERSION = 1


def collect(config: Dict[str, Any]) -> Dict[str, Any]:
    """Run every collector under one time budget and return the evidence document."""
    settings = dict(config.get("settings") or {})
    probe = Probe(config)
    doc: Dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "host": config.get("host") or _hostname(),
        "collected_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "probe_version": str(config.get("probe_version") or "unknown"),
        "error": None,
        "settings": settings,
        "items": probe.items,
    }
    try:
        collect_platform(probe)
        service = collect_service(probe, settings)
        collect_gds(probe, settings, service)
        collect_http(probe, settings)
        collect_lmcache_server(probe, settings)
    finally:
        probe.close()  # the private tool directory, whatever happened
    return doc


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _hostname() -> str:
    import socket

    return socket.gethostname()


def run(config: Dict[str, Any]) -> int:
    """Print one JSON document on stdout; always exit 0 once a document was printed.

    SIGTERM/SIGHUP (the client's `timeout`, a dropped SSH session) become SystemExit, so the
    `finally` blocks remove the bench and tool directories before the probe ends."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on_signal)
    doc = collect(config)
    sys.stdout.write(json.dumps(doc, sort_keys=True))
    sys.stdout.write("\n")
    sys.stdout.flush()
    return 0
