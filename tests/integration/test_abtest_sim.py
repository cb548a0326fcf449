"""The demo's claim, on the embedded simulated engines: offload pays for many shared long
prefixes that overflow the GPU cache, and not for unique prompts or one resident prefix."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml


@pytest.mark.timeout(700)
def test_three_seed_outcomes_on_embedded_engines(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "kvops", "ab-test", "--scenario", "all", "--scale", "0.1",
         "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=680,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    verdicts = {name: sc["verdict"] for name, sc in doc["scenarios"].items()}
    multi_cs = doc["scenarios"]["multi-shared-prefix"]["comparisons"]
    assert verdicts["multi-shared-prefix"] == "helps", (verdicts, multi_cs[0], doc["warnings"])
    assert verdicts["unique-one-shot"] != "helps", verdicts
    assert verdicts["single-shared-prefix"] != "helps", verdicts
    multi = doc["scenarios"]["multi-shared-prefix"]
    tput = next(c for c in multi["comparisons"] if c["metric"] == "total_token_throughput_tok_s")
    assert tput["ci95_low_pct"] > 0
    # shuffled order (as vllm bench serve): the baseline's GPU cache keeps some prefixes between
    # uses, offload serves nearly all of them
    shares = {a: multi["arms"][a]["metrics"]["cached_token_share"] for a in multi["arms"]}
    assert shares["offload"] > 0.8 and shares["offload"] > shares["baseline"] + 0.2, shares
    assert multi["workload"]["request_order"] == "shuffled"
    assert "requests shuffled" in (out / "report.md").read_text()
    assert doc["embedded_engines"] is True
    # The offload engine ran LMCache's GDS backend on the run folder with no CPU tier, and its
    # chunks really went there: the reused prefixes came from storage.
    config = yaml.safe_load((out / "lmcache-offload.yaml").read_text())
    assert config["local_cpu"] is False, config
    assert Path(config["gds_path"]) == (out / "gds-offload").resolve(), config
    assert any(p.is_file() and p.stat().st_size > 0 for p in (out / "gds-offload").rglob("*"))


def _engine_pids(parent: int) -> list[int]:
    """The embedded `kvops sim serve` engines `parent` started (its children, by /proc)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and b"sim" in cmd and b"serve" in cmd:
            pids.append(int(proc.name))
    return pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _start_embedded_run(out: Path) -> tuple[subprocess.Popen[str], list[int]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvops", "ab-test", "--scenario", "multi-shared-prefix",
         "--scale", "0.1", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    records = out / "records.jsonl"
    while not (records.exists() and records.read_text().count("\n") >= 2):
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "no records after 120 s"
        time.sleep(0.1)
    engines = _engine_pids(proc.pid)
    assert len(engines) == 2, engines  # baseline and offload, running
    return proc, engines


def test_ctrl_c_stops_the_embedded_engines(tmp_path: Path) -> None:
    proc, engines = _start_embedded_run(tmp_path / "run")
    for pid in engines:
        # a process group of their own: a terminal's Ctrl-C reaches kvops, which stops them ...
        assert os.getpgid(pid) == pid != os.getpgid(proc.pid)
        # ... in kvops's session: one job for a scheduler that groups CPU time by session
        assert os.getsid(pid) == os.getsid(proc.pid)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    assert [pid for pid in engines if _alive(pid)] == []  # stopped before kvops exited


def test_a_failed_run_stops_the_embedded_engines(tmp_path: Path) -> None:
    """The offload engine dies mid-run (killed): ab-test ends with an error exit, and the
    surviving baseline engine is stopped too — nothing is left running."""
    proc, engines = _start_embedded_run(tmp_path / "run")
    cmdlines = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in engines}
    [offload] = [pid for pid, cmd in cmdlines.items() if b"--kv-transfer-config" in cmd]
    os.killpg(offload, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode in (1, 2), stderr[-2000:]
    assert "Traceback" not in stderr
    assert [pid for pid in engines if _alive(pid)] == []
