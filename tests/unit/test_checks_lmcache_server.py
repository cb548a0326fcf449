"""`kvops validate` on an offload_mp host (vLLM with LMCacheMPConnector, LMCache as its own
`lmcache server` unit): the probe reads the server's journal, /healthcheck and /metrics where
settings name them; the in-process LMCache config checks step aside; GDS-066 judges the
server's log with its own failure texts and GDS-073 its health and lmcache_mp_* metrics.

The server's log and metrics lines are LMCache 0.5.6's own, as the engine tier's run of the
role's offload_mp variant printed them (tests/engine/test_lmcache_mp_engine.py).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from evidence_builders import MODEL, command, findings_for, healthy, http_item, with_items

from kvops import evidence as ev
from kvops.probe.main import collect

pytestmark = pytest.mark.unit

MP_CONNECTOR = json.dumps(
    {
        "kv_connector": "LMCacheMPConnector",
        "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "lmcache.mp.host": "tcp://127.0.0.1",
            "lmcache.mp.port": 5555,
        },
    },
    separators=(",", ":"),
)
SERVER_LOG = (
    "LMCache INFO: Supported transfer mode: auto (server.py:244)\n"
    "LMCache INFO: LMCache zmq cache server is running on 127.0.0.1:5555 (server.py:495)\n"
    "LMCache INFO: Stored 1536 tokens in 0.019 seconds (engine_driven_transfer.py:447)\n"
    "LMCache INFO: Prefetch request completed (L1+L2): 6/6 retained keys (0 L1, 6 L2) in 40.2 ms\n"
    "LMCache INFO: Retrieved 1536 tokens in 0.018 seconds (engine_driven_transfer.py:514)\n"
)
SERVER_METRICS = (
    'lmcache_mp_l1_memory_usage_bytes{backend="dram",l1_tag="_default"} 0.0\n'
    'lmcache_mp_l2_store_adapters{l1_tag="_default",state="active"} 1.0\n'
    'lmcache_mp_l2_store_adapters{l1_tag="_default",state="draining"} 0.0\n'
    'lmcache_mp_l2_usage_bytes{l2_name="fs"} 1.2e+07\n'
)
SERVER_URL = "http://127.0.0.1:8080"
JOURNAL = ["journalctl", "--no-pager", "-o", "cat", "-n", "3000", "_SYSTEMD_INVOCATION_ID=ab12"]


def mp_host(**items: dict[str, Any] | None) -> dict[str, Any]:
    """The healthy recorded host redeployed as offload_mp (role vllm_lmcache)."""
    doc = healthy()
    doc["settings"].update(lmcache_server_service="lmcache.service", lmcache_server_url=SERVER_URL)
    doc["items"]["vllm_process"]["data"]["argv"] = [
        "/opt/vllm/bin/vllm",
        "serve",
        MODEL,
        "--kv-transfer-config",
        MP_CONNECTOR,
    ]
    doc["items"]["vllm_unit"]["stdout"] = (
        f"[Service]\nExecStart=/opt/vllm/bin/vllm serve {MODEL} --kv-transfer-config "
        f"'{MP_CONNECTOR}'\n"
    )
    del doc["items"]["vllm_env"]["data"]["env"]["LMCACHE_CONFIG_FILE"]
    doc["items"]["lmcache_config"] = {
        "kind": "file",
        "source": "",
        "error": "no LMCache config path",
        "duration_s": 0.0,
    }
    doc["items"]["lmcache_server_journal"] = command(JOURNAL, SERVER_LOG)
    doc["items"]["lmcache_server_journal_problems"] = command([*JOURNAL, "--grep", "..."], "")
    doc["items"]["lmcache_server_health"] = http_item(f"{SERVER_URL}/healthcheck", 200, "{}")
    doc["items"]["lmcache_server_metrics"] = http_item(f"{SERVER_URL}/metrics", 200, SERVER_METRICS)
    return with_items(doc, items)


LMCACHE_CONFIG_CHECKS = ("GDS-060", "GDS-061", "GDS-062", "GDS-063", "GDS-064", "GDS-065")


def test_an_offload_mp_host_passes_with_the_servers_log_and_metrics() -> None:
    doc = mp_host()
    for check_id in LMCACHE_CONFIG_CHECKS:
        [(severity, message)] = findings_for(doc, check_id)
        assert severity == "SKIP" and "multiprocess server" in message, check_id
    [(severity, message)] = findings_for(doc, "GDS-072")
    assert severity == "PASS" and "LMCacheMPConnector" in message
    [(severity, message)] = findings_for(doc, "GDS-066")
    assert severity == "PASS" and "+ 5 log lines" in message
    [(severity, message)] = findings_for(doc, "GDS-073")
    assert severity == "PASS", message
    assert "lmcache_mp_* present, 1 active L2 adapter(s)" in message


@pytest.mark.parametrize(
    ("tail", "problems", "needle"),
    [
        (
            SERVER_LOG + "LMCache ERROR: No handler registered for operation "
            "register_kv_cache_engine_driven_context\n",
            "",
            "--supported-transfer-mode auto",
        ),
        # scrolled out of the tail, kept by journalctl --grep
        (SERVER_LOG, "ERROR:    Application startup failed. Exiting.\n", "failed to start"),
        (
            SERVER_LOG,
            "LMCache WARNING: Insufficient /dev/shm capacity: need 1 bytes, have 0 bytes. "
            "Disabling SHM, falling back to pickle.\n",
            "pickle",
        ),
    ],
)
def test_a_failure_in_the_servers_log_fails_gds_066(tail: str, problems: str, needle: str) -> None:
    doc = mp_host(
        lmcache_server_journal=command(JOURNAL, tail),
        lmcache_server_journal_problems=command([*JOURNAL, "--grep", "..."], problems),
    )
    [(severity, message)] = findings_for(doc, "GDS-066")
    assert severity == "FAIL" and message.startswith("LMCache server: 1x") and needle in message


def test_a_server_that_does_not_answer_fails_gds_073() -> None:
    down = http_item(f"{SERVER_URL}/healthcheck", None, "")
    down["error"] = "URLError: [Errno 111] Connection refused"
    [(severity, message)] = findings_for(mp_host(lmcache_server_health=down), "GDS-073")
    assert severity == "FAIL" and "LMCache server not healthy" in message
    no_mp = http_item(f"{SERVER_URL}/metrics", 200, "python_info 1.0\n")
    [(severity, message)] = findings_for(mp_host(lmcache_server_metrics=no_mp), "GDS-073")
    assert severity == "WARN" and "no lmcache_mp_*" in message


def test_an_mp_connector_without_the_server_declared_asks_for_it() -> None:
    doc = mp_host()
    for key in ("lmcache_server_service", "lmcache_server_url"):
        del doc["settings"][key]
    for item_id in ev.ITEM_IDS:
        if item_id.startswith("lmcache_server_"):
            doc["items"][item_id] = {"kind": "http", "source": "", "error": "no LMCache server"}
    [(severity, message)] = findings_for(doc, "GDS-073")
    assert severity == "WARN" and "URL is not declared" in message
    [(severity, _)] = findings_for(doc, "GDS-066")
    assert severity == "SKIP"
    # the in-process host of the recorded bundle is not judged as a server
    [(severity, message)] = findings_for(healthy(), "GDS-066")
    assert severity == "PASS" and "+" not in message


class _ServerDouble(BaseHTTPRequestHandler):
    """A test double of the LMCache server's HTTP frontend: /healthcheck and /metrics."""

    def do_GET(self) -> None:
        body = {"/healthcheck": b"{}", "/metrics": SERVER_METRICS.encode()}.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture
def server_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ServerDouble)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def _probe(**settings: str) -> dict[str, Any]:
    config = {
        "host": "gpu-test",
        "probe_version": "test",
        "deadline_s": 30,
        "settings": {"vllm_url": "http://127.0.0.1:9", "role": "offload", **settings},
    }
    return dict(collect(config)["items"])


def test_the_probe_reads_the_server_only_where_settings_name_it(server_url: str) -> None:
    items = _probe(lmcache_server_service="lmcache.service", lmcache_server_url=server_url)
    assert items["lmcache_server_health"]["http_status"] == 200
    assert "lmcache_mp_l2_store_adapters" in items["lmcache_server_metrics"]["stdout"]
    journal = items["lmcache_server_journal"]["source"]
    assert Path(journal[0]).name == "journalctl" and journal[1] == "--no-pager"
    assert "lmcache.service" in journal or any("INVOCATION" in a for a in journal)
    grep = items["lmcache_server_journal_problems"]["source"]
    assert r"No\ handler\ registered\ for\ operation" in grep[grep.index("--grep") + 1]
    other = _probe()
    for item_id in ev.ITEM_IDS:
        if item_id.startswith("lmcache_server_"):
            assert "not offload_mp" in other[item_id]["error"], item_id


def test_smoke_reads_the_servers_counters_as_lmcaches() -> None:
    """`kvops smoke --lmcache-server-url`: L1 chunk writes x chunk size stand for stored tokens
    (only full chunks are stored), lookup hit tokens for retrieved ones; a counter the server
    has not published yet (it appears at its first increment) reads zero, and a server without
    lmcache_mp_* (observability off) stands for nothing."""
    from kvops.parse.prometheus import parse_prometheus_text
    from kvops.smoke.judge import LMCACHE_HIT, LMCACHE_STORED
    from kvops.smoke.run import lmcache_server_counters

    after = parse_prometheus_text(
        SERVER_METRICS
        + 'lmcache_mp_l1_write_chunks_total{l1_tag="_default"} 6.0\n'
        + "lmcache_mp_lookup_hit_tokens_total 1536.0\n"
    )
    samples = {s.name: s.value for s in lmcache_server_counters(after, 256)}
    assert samples[LMCACHE_STORED] == 6 * 256 and samples[LMCACHE_HIT] == 1536
    assert samples["lmcache_mp_l2_usage_bytes"] == 1.2e07
    fresh = {
        s.name: s.value for s in lmcache_server_counters(parse_prometheus_text(SERVER_METRICS), 256)
    }
    assert fresh[LMCACHE_STORED] == fresh[LMCACHE_HIT] == 0
    assert lmcache_server_counters(parse_prometheus_text("python_info 1.0\n"), 256) == []
