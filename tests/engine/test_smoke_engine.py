"""`kvops smoke --url` against real vLLM engines: passes on the role's offload variant (the real
LMCache, its GDS backend writing chunk files), and fails with "offload not configured" on the
role's prefix-caching-only baseline."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Engine

pytestmark = pytest.mark.timeout(1500)  # the first test may pay for the engine install

Cli = Callable[..., subprocess.CompletedProcess[str]]


def _items(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    doc = json.loads(proc.stdout)
    return {i["name"]: i for i in doc["items"]}


def test_smoke_passes_on_the_offload_engine(offload_engine: Engine, kvops_cli: Cli) -> None:
    assert offload_engine.kv_dir is not None
    proc = kvops_cli(
        "smoke", "--url", offload_engine.url, "--gds-dir", str(offload_engine.kv_dir), "--json"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    items = _items(proc)
    assert items["offload"]["status"] == "PASS"
    assert items["eviction"]["status"] == "PASS"
    assert "reset_prefix_cache" in items["eviction"]["message"]
    assert items["offload"]["message"] == "LMCache metrics present: an LMCache engine"
    assert items["stored_tokens"]["status"] == "PASS", items["stored_tokens"]
    assert items["retrieved_tokens"]["status"] == "PASS", items["retrieved_tokens"]
    assert items["external_hits"]["status"] == "PASS"
    assert items["ttft"]["status"] == "PASS"
    assert items["chunk_files"]["status"] == "PASS", items["chunk_files"]
    assert "LMCache chunk files (*.kvcache.safetensors)" in items["chunk_files"]["message"]


def test_smoke_evicts_with_fillers_sized_from_the_metrics(
    offload_engine: Engine, kvops_cli: Cli
) -> None:
    proc = kvops_cli("smoke", "--url", offload_engine.url, "--evict", "fillers", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    items = _items(proc)
    assert "KV capacity 5,120 tokens" in items["eviction"]["message"]
    assert items["external_hits"]["status"] == "PASS"
    assert items["chunk_files"]["status"] == "SKIP"


def test_smoke_fails_on_the_baseline_engine(baseline_engine: Engine, kvops_cli: Cli) -> None:
    proc = kvops_cli("smoke", "--url", baseline_engine.url)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "offload not configured" in proc.stdout
    assert "Traceback" not in proc.stderr
    proc = kvops_cli("smoke", "--url", baseline_engine.url, "--json")
    items = _items(proc)
    assert items["offload"]["status"] == "FAIL"
    assert items["offload"]["message"].startswith("offload not configured")
    assert items["external_hits"]["status"] == "FAIL"
    assert items["chunk_files"]["status"] == "SKIP"
