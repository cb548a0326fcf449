"""A fleet sharing one KV store: two simulated offload engines on one GDS directory.

The engine reads the shared directory as LMCache's GDS backend does (a miss looks for the
chunk's metadata file on disk), so a prefix sent to instance A and then to instance B is a hit
on B - B's own counters show it. `kvops ab-test --arm offload=A,B` then measures the
cross-instance hit share under two routes: prefix-affinity never reuses a prefix across
instances (share 0), prefix-handoff moves every reuse to the other instance (share > 0)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from sim_server import sim_server

from kvops.abtest.engine_counters import counter_delta, read_counters

FAST = ("--time-scale", "0.2")
WORKLOAD = Path(__file__).parents[1] / "fixtures" / "workloads" / "fleet-small.yaml"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return str(resp.read().decode())


def _complete(url: str, prompt: list[int]) -> dict[str, Any]:
    model = json.loads(_get(url + "/v1/models"))["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 2}).encode()
    req = urllib.request.Request(
        url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


def _chunk_files(gds: Path) -> int:
    return sum(1 for _ in gds.rglob("*.kvcache.safetensors.metadata"))


@pytest.mark.timeout(300)
def test_a_prefix_stored_by_one_instance_hits_on_the_other(tmp_path: Path) -> None:
    gds = tmp_path / "gds"
    with (
        sim_server(gds, tmp_path / "a.log", *FAST) as a,
        sim_server(gds, tmp_path / "b.log", *FAST) as b,
    ):
        prompt = [1000 + i for i in range(1280)]  # five 256-token chunks
        before_b = read_counters(_get(b + "/metrics"))
        _complete(a, prompt)
        deadline = time.monotonic() + 30  # A writes its chunk files after the step
        while _chunk_files(gds) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _chunk_files(gds) >= 4, "instance A wrote no chunk files"
        answer = _complete(b, prompt)
        got = counter_delta(before_b, read_counters(_get(b + "/metrics")))
    assert got["external_hit_tokens"] >= 4 * 256, got  # loaded from A's files
    assert got["lmcache_hit_tokens"] >= 4 * 256, got
    assert got["gpu_hit_tokens"] == 0, got  # B never computed it
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] >= 4 * 256


def _ab_test(tmp_path: Path, name: str, base: str, fleet: str, route: str) -> dict[str, Any]:
    workload = WORKLOAD
    out = tmp_path / name
    proc = subprocess.run(
        [sys.executable, "-m", "kvops", "ab-test", "--arm", f"baseline={base}",
         "--arm", f"offload={fleet}", "--route", route, "--workload", str(workload),
         "--trials", "2", "--warmup-iterations", "0", "--out", str(out)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc: dict[str, Any] = json.loads((out / "results.json").read_text())
    doc["report_md"] = (out / "report.md").read_text()
    return doc


@pytest.mark.timeout(600)
def test_routes_set_the_measured_cross_instance_hit_share(tmp_path: Path) -> None:
    gds = tmp_path / "gds"
    with (
        sim_server(None, tmp_path / "base.log", *FAST) as base,
        sim_server(gds, tmp_path / "a.log", *FAST) as a,
        sim_server(gds, tmp_path / "b.log", *FAST) as b,
    ):
        docs = {
            route: _ab_test(tmp_path, route, base, f"{a},{b}", route)
            for route in ("prefix-affinity", "prefix-handoff")
        }
    for route, doc in docs.items():
        arms = doc["scenarios"]["fleet"]["arms"]
        assert "instances" not in arms["baseline"], route  # one URL: the document as before
        offload = arms["offload"]
        instances = offload["instances"]
        assert [i["url"] for i in instances] == [a, b], route
        # 2 trials x 2 iterations x 4 requests, all measured, spread over both instances
        assert sum(i["requests"] for i in instances) == 16, route
        assert all(i["requests"] > 0 and i["errors"] == 0 for i in instances), route
        assert sum(i["offload_hit_tokens"] for i in instances) > 0, route  # trial 2 loads
        assert doc["options"]["route"] == route
        assert "cross-instance hit share" in doc["report_md"]
    affinity = docs["prefix-affinity"]["scenarios"]["fleet"]["arms"]["offload"]
    handoff = docs["prefix-handoff"]["scenarios"]["fleet"]["arms"]["offload"]
    assert affinity["cross_instance_hit_share"] == 0.0
    assert handoff["cross_instance_hit_share"] > 0.0
    # the handed-off instance loaded what the other computed: its own counters say so
    assert any(i["cross_instance_hit_tokens"] > 0 for i in handoff["instances"])
