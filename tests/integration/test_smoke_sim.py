"""`kvops smoke` against the simulated engine (`kvops sim serve`) over real HTTP, offload on and
off: the same judge that runs against a real vLLM must pass an LMCache-shaped engine with GDS
chunk files and fail one without offload for the right reason."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from doubles.fixed_delay_server import running
from sim_server import sim_server

from kvops.abtest.embedded import free_port


def smoke(*args: str) -> tuple[int, dict[str, dict[str, str]], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "kvops", "smoke", "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    return proc.returncode, {i["name"]: i for i in doc.get("items", [])}, proc.stdout


def test_smoke_passes_on_the_sim_with_lmcache_gds_offload(tmp_path: Path) -> None:
    gds = tmp_path / "gds"
    gds.mkdir()
    log = tmp_path / "sim.log"
    with sim_server(gds, log) as url:
        code, items, out = smoke("--url", url, "--gds-dir", str(gds), "--service-log", str(log))
    assert code == 0, out
    assert {name: i["status"] for name, i in items.items()} == {
        "offload": "PASS",
        "service_log": "PASS",
        "eviction": "PASS",
        "stored_tokens": "PASS",
        "external_hits": "PASS",
        "retrieved_tokens": "PASS",
        "kv_correct": "PASS",
        "ttft": "PASS",
        "chunk_files": "PASS",
    }
    assert (
        "8 greedy tokens identical, logprobs within 0.05 (largest difference 0)"
        in (items["kv_correct"]["message"])
    )
    assert "LMCache chunk files (*.kvcache.safetensors)" in items["chunk_files"]["message"]
    assert list(gds.rglob("*.kvcache.safetensors"))


def test_smoke_fails_when_the_kv_from_offload_gives_another_answer(tmp_path: Path) -> None:
    """The sim behind a proxy double that changes the third greedy token of every answer whose
    prompt came from cache (tests/doubles/wrong_kv_proxy.py): every counter still rises, the
    correctness check alone sees it and names the token."""
    gds = tmp_path / "gds"
    gds.mkdir()
    port = free_port()
    with sim_server(gds, tmp_path / "sim.log") as upstream:
        double = Path(__file__).parents[1] / "doubles" / "wrong_kv_proxy.py"
        proxy = subprocess.Popen(
            [sys.executable, str(double), "--port", str(port), "--upstream", upstream],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(url + "/health", timeout=1).close()
                    break
                assert time.monotonic() < deadline, "the proxy double did not start"
                time.sleep(0.1)
            code, items, out = smoke("--url", url, "--gds-dir", str(gds))
        finally:
            proxy.terminate()
            proxy.wait(10)
    assert code == 1, out
    item = items["kv_correct"]
    assert item["status"] == "FAIL"
    assert "token 3 differs: recomputed id " in item["message"], item
    assert "(logprob -" in item["message"] and "from offload id " in item["message"]
    assert items["retrieved_tokens"]["status"] == "PASS"  # the counters cannot tell
    doc = json.loads(out)
    [finding] = [f for f in doc["hosts"][url]["findings"] if f["check_id"] == "GDS-207"]
    assert "gds_path" in finding["remedy"]


def test_smoke_fails_on_the_sim_without_offload(tmp_path: Path) -> None:
    with sim_server(None, tmp_path / "sim.log") as url:
        code, items, out = smoke("--url", url, "--gds-dir", str(tmp_path))
    assert code == 1, out
    assert items["offload"]["status"] == "FAIL"
    assert items["offload"]["message"].startswith("offload not configured")
    assert items["stored_tokens"]["message"] == "no LMCache metrics: not an LMCache engine"
    assert items["chunk_files"]["status"] == "FAIL"


def test_smoke_against_an_unreachable_url_exits_2_without_traceback() -> None:
    code, items, out = smoke("--url", f"http://127.0.0.1:{free_port()}")
    assert code == 2
    assert items == {}
    assert "cannot reach" in json.loads(out)["error"]


@pytest.mark.parametrize("extra", [[], ["--evict", "fillers"]])
def test_plain_output_names_the_verdict(extra: list[str], tmp_path: Path) -> None:
    # A small KV cache (512 blocks x 16 = 8,192 tokens) keeps the filler prompts few.
    small = ("--num-gpu-blocks-override", "512", "--max-model-len", "4096")
    with sim_server(tmp_path / "gds", tmp_path / "sim.log", *small) as url:
        proc = subprocess.run(
            [sys.executable, "-m", "kvops", "smoke", "--url", url, *extra],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "smoke: PASS" in proc.stdout


def _event_log_requests(log: Path) -> int:
    if not log.exists():
        return 0
    return sum(json.loads(line)["event"] == "request" for line in log.read_text().splitlines())


@pytest.mark.parametrize(
    ("double_args", "smoke_args", "reason"),
    [
        (["--no-metrics"], [], "/metrics answered HTTP 404"),
        (["--fault", "http500"], [], "failed"),
        ([], ["--model", "not-served"], "model 'not-served' not served (served: fixed-delay)"),
    ],
    ids=["no-metrics", "failed-request", "unserved-model"],
)
def test_smoke_that_cannot_judge_exits_2_with_the_reason(
    double_args: list[str], smoke_args: list[str], reason: str
) -> None:
    """Against the fixed-delay double (tests/doubles): no /metrics, a request the server fails,
    a model it does not serve — each is "could not run" (2) with a one-line reason."""
    with running(*double_args) as (url, _):
        code, items, out = smoke("--url", url, *smoke_args)
    assert code == 2, out
    assert items == {}
    assert reason in json.loads(out)["error"], out


def test_smoke_ctrl_c_exits_130_without_traceback(tmp_path: Path) -> None:
    """Interrupted while a request is in flight (the double stalls it), smoke stops at once."""
    log = tmp_path / "events.jsonl"
    with running("--fault", "stall", "--event-log", str(log)) as (url, _):
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvops", "smoke", "--url", url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while _event_log_requests(log) == 0 and proc.poll() is None:
            assert time.monotonic() < deadline, "smoke never sent a request"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
