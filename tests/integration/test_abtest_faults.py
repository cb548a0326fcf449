"""`kvops ab-test` end to end over real HTTP against the fixed-delay double, faults included.

Each fault must end as counted errors with their reason (never a traceback), the run must
finish and keep its records, and the exit code must say what happened (1 errors, 2 cannot
start, 130 interrupted)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from doubles.fixed_delay_server import running

WORKLOAD = """\
num_prefixes: 2
prefix_tokens: 16
prompt_tokens: 24
output_tokens: 4
batch_size: 4
iterations: {it}
"""


def _workload(tmp_path: Path, iterations: int = 2) -> Path:
    path = tmp_path / "w.yaml"
    path.write_text(WORKLOAD.format(it=iterations))
    return path


def _cmd(out: Path, workload: Path, base: str, cand: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "kvops", "ab-test", "--arm", f"baseline={base}",
        "--arm", f"offload={cand}", "--workload", str(workload), "--out", str(out),
        "--trials", "2", *extra,
    ]  # fmt: skip


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _results(out: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((out / "results.json").read_text())


def test_clean_run_json_output_and_run_dir(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with running() as (a, _), running() as (b, _):
        proc = _run(_cmd(out, _workload(tmp_path), a, b, "--json"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema_version"] == 1 and "custom" in doc["scenarios"]
    arms = doc["scenarios"]["custom"]["arms"]
    assert (
        arms["baseline"]["metrics"]["completed"] == 8 and arms["offload"]["metrics"]["errors"] == 0
    )
    assert {c["metric"] for c in doc["scenarios"]["custom"]["comparisons"]} >= {"mean_ttft_ms"}
    assert "bottleneck" in doc["client"]
    for name in (
        "run.json",
        "arms.json",
        "workloads/custom.yaml",
        "records.jsonl",
        "report.md",
        "report.html",
    ):
        assert (out / name).exists(), name
    versions = json.loads((out / "arms.json").read_text())
    assert all(i["version"] == "fixed-delay-double" for i in next(iter(versions.values())))
    assert (
        len((out / "records.jsonl").read_text().splitlines()) == 32
    )  # 2 arms x 2 trials x 2 iterations x 4, warm-up included


@pytest.mark.parametrize(
    ("fault", "reason"),
    [("http500", "HTTP 500"), ("malformed", "malformed SSE"), ("stall", "stream stalled")],
)
def test_faults_are_counted_errors_with_reasons(tmp_path: Path, fault: str, reason: str) -> None:
    out = tmp_path / "run"
    with running() as (a, _), running("--fault", fault) as (b, _):
        proc = _run(_cmd(out, _workload(tmp_path), a, b, "--stall-timeout", "0.5"))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    offload = _results(out)["scenarios"]["custom"]["arms"]["offload"]
    assert offload["errors_total"] == 16
    assert all(reason in r for r in offload["errors_by_reason"]), offload["errors_by_reason"]
    assert _results(out)["scenarios"]["custom"]["arms"]["baseline"]["errors_total"] == 0


def test_unreachable_arm_at_start_is_exit_2(tmp_path: Path) -> None:
    with running() as (a, _):
        proc = _run(_cmd(tmp_path / "run", _workload(tmp_path), a, "http://127.0.0.1:9"))
    assert proc.returncode == 2
    assert "cannot reach http://127.0.0.1:9" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_usage_errors_are_exit_2_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("prefix_token: 5\n")
    proc = _run([sys.executable, "-m", "kvops", "ab-test", "--workload", str(bad)])
    assert proc.returncode == 2 and "unknown key(s) prefix_token" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = _run([sys.executable, "-m", "kvops", "ab-test", "--arm", "only=http://x:1"])
    assert proc.returncode == 2 and "two or more --arm" in proc.stderr


def _wait_records(path: Path, n: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} records in {path}")


def test_server_killed_mid_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with running() as (a, _), running() as (b, victim):
        proc = subprocess.Popen(
            _cmd(out, _workload(tmp_path, iterations=6), a, b),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        _wait_records(out / "records.jsonl", 4)
        victim.kill()
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr
    doc = _results(out)
    # the broken arm gets no verdict, and the status says which arm broke and when
    assert doc["status"] == "invalid"
    assert doc["status_detail"].startswith("arm offload broke in custom:")
    verdicts = {c["verdict"] for c in doc["scenarios"]["custom"]["comparisons"]}
    assert len(verdicts) == 1 and verdicts.pop().startswith("invalid: ")
    offload = doc["scenarios"]["custom"]["arms"]["offload"]
    assert offload["errors_total"] > 0
    assert doc["scenarios"]["custom"]["arms"]["baseline"]["errors_total"] == 0
    assert len((out / "records.jsonl").read_text().splitlines()) == 2 * 2 * 6 * 4


def test_ctrl_c_keeps_records_and_resume_finishes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with running() as (a, _), running() as (b, _):
        proc = subprocess.Popen(
            _cmd(out, _workload(tmp_path, iterations=8), a, b),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        _wait_records(out / "records.jsonl", 8)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 130, stderr
        assert "Traceback" not in stderr
        first = _results(out)
        assert first["status"] == "interrupted"
        kept = len((out / "records.jsonl").read_text().splitlines())
        assert kept >= 8
        resumed = _run([sys.executable, "-m", "kvops", "ab-test", "--resume", str(out)])
    assert resumed.returncode == 0, resumed.stderr
    doc = _results(out)
    assert doc["status"] == "complete"
    for arm in ("baseline", "offload"):
        assert doc["scenarios"]["custom"]["arms"][arm]["metrics"]["completed"] == 2 * 7 * 4
    segments = [json.loads(x) for x in (out / "segments.jsonl").read_text().splitlines()]
    assert len(segments) == 4


def test_worker_processes_record_every_request(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with running() as (a, _), running() as (b, _):
        proc = _run(_cmd(out, _workload(tmp_path), a, b, "--workers", "2"))
    assert proc.returncode == 0, proc.stderr
    lines = (out / "records.jsonl").read_text().splitlines()
    assert len(lines) == 32 and len({json.loads(x)["request_id"] for x in lines}) == 32
    assert _results(out)["client"]["workers"] == 2


def _events(log: Path) -> list[str]:
    return [json.loads(line)["event"] for line in log.read_text().splitlines()]


@pytest.mark.parametrize("reset", [True, False], ids=["reset-cache", "no-reset-cache"])
def test_prefix_cache_reset_before_each_segment(tmp_path: Path, reset: bool) -> None:
    """Each arm's server sees POST /reset_prefix_cache, then that segment's requests, once per
    segment (2 trials x 2 iterations x 4 requests per arm); `--no-reset-cache` sends none.
    Requests before the first reset are the start-up probe, not part of any segment."""
    out = tmp_path / "run"
    logs = {arm: tmp_path / f"{arm}.events" for arm in ("baseline", "offload")}
    extra = [] if reset else ["--no-reset-cache"]
    with (
        running("--event-log", str(logs["baseline"])) as (a, _),
        running("--event-log", str(logs["offload"])) as (b, _),
    ):
        proc = _run(_cmd(out, _workload(tmp_path), a, b, *extra))
    assert proc.returncode == 0, proc.stderr
    segment = ["request"] * 2 * 4
    for arm, log in logs.items():
        events = _events(log)
        if reset:
            first = events.index("reset")
            assert set(events[:first]) <= {"request"} and first <= 1, (arm, events)
            assert events[first:] == (["reset", *segment]) * 2, (arm, events)
        else:
            assert "reset" not in events, (arm, events)
            assert events.count("request") >= 2 * len(segment), (arm, events)
