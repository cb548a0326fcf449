"""`kvops smoke --url` against real vLLM engines: passes on the role's offload variant (the real
LMCache, its GDS backend writing chunk files; the correctness prompt's greedy answer from LMCache's
KV is the one computed from scratch; no degraded mode in the engine's log), and fails with
"offload not configured" on the role's prefix-caching-only baseline. Smoke's FAILs on wrong KV and
on LMCache's degraded mode are proven in test_lmcache_engine.py, on its control engines."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from measuring import ahead_of_the_lab_groups, weighed_as_this_session

if TYPE_CHECKING:
    from conftest import Engine

pytestmark = pytest.mark.timeout(1500)  # the first test may pay for the engine install

Cli = Callable[..., subprocess.CompletedProcess[str]]
RUNS = Path(__file__).resolve().parents[2] / "runs" / "engine"


def _items(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    doc = json.loads(proc.stdout)
    return {i["name"]: i for i in doc["items"]}


@pytest.mark.timing  # its exit status includes the TTFT drop
def test_smoke_passes_on_the_offload_engine(offload_engine: Engine, kvops_cli: Cli) -> None:
    assert offload_engine.kv_dir is not None
    with ahead_of_the_lab_groups(), weighed_as_this_session(offload_engine.proc.pid):
        proc = kvops_cli(
            "smoke",
            "--url",
            offload_engine.url,
            "--gds-dir",
            str(offload_engine.kv_dir),
            "--service-log",
            str(offload_engine.log_path),
            "--json",
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
    # the correctness prompt: greedy tokens and logprobs from LMCache's KV = computed from scratch
    kv = items["kv_correct"]
    assert kv["status"] == "PASS", kv
    assert "8 greedy tokens identical" in kv["message"]
    doc = json.loads(proc.stdout)["evidence"]["kv_check"]
    assert doc["reference"]["cached_tokens"] == 0  # computed from scratch
    assert doc["offloaded"]["cached_tokens"] >= 1536  # its KV came back from LMCache
    assert all(t.startswith("token_id:") for t in doc["reference"]["tokens"])
    # float32 on the CPU: far inside the 0.05 tolerance (kvops/smoke/kv_check.py)
    gaps = [
        abs(a - b)
        for a, b in zip(doc["reference"]["logprobs"], doc["offloaded"]["logprobs"], strict=True)
    ]
    assert max(gaps) < 1e-3, gaps
    assert items["service_log"]["status"] == "PASS", items["service_log"]


@pytest.mark.timing  # its exit status includes the TTFT drop
def test_smoke_evicts_with_fillers_sized_from_the_metrics(
    offload_engine: Engine, kvops_cli: Cli
) -> None:
    with ahead_of_the_lab_groups(), weighed_as_this_session(offload_engine.proc.pid):
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


def test_a_storage_fault_mid_run_loses_no_request_and_smoke_reports_the_failed_loads(
    offload_engine: Engine, baseline_engine: Engine, kvops_cli: Cli
) -> None:
    """The file tier loses every chunk file LMCache writes during the run (deleted as soon as it
    appears: what a lost or swapped export does to a running service). The role renders
    `kv_load_failure_policy: recompute`, so vLLM recomputes what LMCache fails to load and every
    request is answered (smoke ran: exit 1, not 2), and smoke says why it is not a pass: the
    failed loads in this start's log. Then a short ab-test on prefixes that overflow the KV cache,
    the fault still on: no request fails, and the offload arm's failed loads, read from the same
    log per segment, are in results.json with the warning that the verdict includes them. Last
    in the tier: the offload engine keeps LMCache's index of the deleted chunks (only this
    test's fresh prompts, which nothing later sends)."""
    args = offload_engine.args
    kv_config = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert kv_config["kv_load_failure_policy"] == "recompute", kv_config
    gds = offload_engine.kv_dir
    assert gds is not None
    before = set(gds.rglob("*.kvcache.safetensors"))
    deleted: list[Path] = []
    stop = threading.Event()

    def lose_new_chunks() -> None:
        while not stop.wait(0.05):
            for path in set(gds.rglob("*.kvcache.safetensors")) - before:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    deleted.append(path)

    thief = threading.Thread(target=lose_new_chunks, daemon=True)
    thief.start()
    spec = RUNS / "workload-storage-fault.yaml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    # four 1,920-token prefixes in cyclic order against the 5,120-token KV cache: every measured
    # request loads its prefix from LMCache, whose files are gone (JSON is valid YAML)
    spec.write_text(json.dumps({
        "name": "storage-fault", "num_prefixes": 4, "prefix_tokens": 1920, "prompt_tokens": 1984,
        "output_tokens": 4, "batch_size": 1, "requests_per_iteration": 4, "iterations": 2,
        "request_order": "cyclic", "seed": 7,
    }) + "\n")  # fmt: skip
    try:
        proc = kvops_cli(
            "smoke",
            "--url",
            offload_engine.url,
            "--service-log",
            str(offload_engine.log_path),
            "--prompts",
            "1",
            "--prompt-tokens",
            "1024",
            "--json",
        )
        ab = kvops_cli(
            "ab-test", "--arm", f"baseline={baseline_engine.url}",
            "--arm", f"offload={offload_engine.url}", "--workload", str(spec), "--trials", "1",
            "--warmup-iterations", "1", "--out", str(RUNS / "ab-storage-fault"), "--overwrite",
            "--service-log", f"offload={offload_engine.log_path}", "--json",
            timeout_s=900,
        )  # fmt: skip
    finally:
        stop.set()
        thief.join()
    assert deleted, "no chunk file was written, so none could be lost"
    assert proc.returncode == 1, proc.stdout + proc.stderr  # judged, not "could not run"
    doc = json.loads(proc.stdout)
    evidence = doc["evidence"]
    assert len(evidence["resends"]) == 1 and evidence["kv_check"]["offloaded"]["tokens"]
    items = _items(proc)
    log_item = items["service_log"]
    assert log_item["status"] == "FAIL", log_item
    assert (
        "a KV load from the offload tier failed and vLLM recomputed those tokens"
        in (log_item["message"])
    )
    # recomputed, so the answer is still right (or, where vLLM reports the prompt uncached,
    # there was no offloaded KV to compare)
    assert items["kv_correct"]["status"] in ("PASS", "SKIP"), items["kv_correct"]
    # the ab-test leg: zero failed requests, the failed loads counted from the log
    assert ab.returncode == 0, ab.stderr[-3000:]
    scenario = json.loads(ab.stdout)["scenarios"]["storage-fault"]
    for arm in ("baseline", "offload"):
        assert scenario["arms"][arm]["errors_total"] == 0, scenario["arms"][arm]
    failed = scenario["arms"]["offload"]["failed_loads"]
    assert failed["failed_loads"] >= 1, failed
    assert failed["sources"][-1] == f"service log {offload_engine.log_path}", failed
    warnings = json.loads(ab.stdout)["warnings"]
    assert any("failed KV load" in w and "arm offload" in w for w in warnings), warnings
