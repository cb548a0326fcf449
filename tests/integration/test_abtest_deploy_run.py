"""`kvops ab-test --deploy` end to end with the deploy step doubled: real HTTP to an engine
double, a real inventory read through ansible-inventory, real run directory and reports; only
`ansible_runner.run` is replaced (the lab tier runs the real playbook: tests/lab/test_deploy.py).

What is proven here: each arm's deploy outcome, versions and rendered config reach results.json,
report.md and report.html with secrets redacted; a failed deploy stops the run with exit 2 and
the reports written; `--resume` continues after the last complete segment, deploying the arm
each remaining segment needs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ansible_runner
import pytest
from click.testing import CliRunner
from doubles.fixed_delay_server import running

from kvops.cli import main

REPO = Path(__file__).resolve().parents[2]
HOST = "gpu1"
SECRET_URL_CREDENTIALS = "admin:hunter2"
SECRET_API_KEY = "sk-deploy-test-1"
GDS_DIR = "/mnt/kvcache/gds"
WORKLOAD = """\
num_prefixes: 2
prefix_tokens: 16
prompt_tokens: 24
output_tokens: 4
batch_size: 4
iterations: 2
"""
PER_SEGMENT = 2 * 4  # iterations x batch


class DeployPlayDouble:
    """TEST DOUBLE of `ansible_runner.run` for playbooks/deploy.yml: feeds the deployer the
    events a real run emits (names and fields as in ansible-runner's job_events) with the
    `vllm_lmcache_deployed` fact the role sets for the requested variant, and appends a
    `deploy` line to the engine double's event log so a test can see where deploys fell
    between requests. Fails the play at call number `fail_at` (1-based) when given."""

    def __init__(self, event_log: Path, fail_at: int | None = None) -> None:
        self.event_log = event_log
        self.fail_at = fail_at
        self.calls: list[dict[str, Any]] = []

    def deployed(self, variant: str) -> dict[str, Any]:
        offload = variant != "baseline"
        return {
            "variant": variant,
            "service": "vllm",
            "install_method": "virtualenv",
            "image": "",
            "packages": {"vllm": "0.32.0", "lmcache": "0.5.6", "torch": "2.9.0", "six": "1"},
            "lmcache_version": "0.5.6",
            "lmcache_config": (
                {"chunk_size": 256, "gds_path": GDS_DIR, "local_cpu": False,
                 "remote_url": f"redis://{SECRET_URL_CREDENTIALS}@cache:6379"}
                if offload else {}
            ),
            "kv_transfer_config": (
                {"kv_connector": "LMCacheConnectorV1Dynamic", "kv_role": "kv_both"}
                if offload else {}
            ),
            "exec_start": f"/opt/kvops/vllm-venv/bin/vllm serve m --api-key {SECRET_API_KEY}",
            "environment": {"PYTHONHASHSEED": "0", "VLLM_NO_USAGE_STATS": "1"},
        }  # fmt: skip

    def __call__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        variant = kwargs["extravars"]["vllm_lmcache_variant"]
        handler = kwargs["event_handler"]
        handler({"event": "playbook_on_task_start", "event_data": {"task": "present | Start"}})
        if self.fail_at == len(self.calls):
            msg = f"vllm did not become healthy; HF_TOKEN={SECRET_API_KEY}"
            failed = {"host": HOST, "task": "wait_healthy | Fail", "res": {"msg": msg}}
            handler({"event": "runner_on_failed", "event_data": failed})
            return SimpleNamespace(status="failed", rc=2)
        with self.event_log.open("a") as log:
            log.write(json.dumps({"event": "deploy", "variant": variant}) + "\n")
        facts = {"vllm_lmcache_deployed": self.deployed(variant)}
        ok = {"host": HOST, "res": {"ansible_facts": facts}}
        handler({"event": "runner_on_ok", "event_data": ok})
        return SimpleNamespace(status="successful", rc=0)


def _inventory(tmp_path: Path, url: str) -> Path:
    port = int(url.rsplit(":", 1)[1])
    path = tmp_path / "inventory.yml"
    path.write_text(
        f"all:\n  hosts:\n    {HOST}:\n      ansible_host: 127.0.0.1\n"
        f"      vllm_lmcache_port: {port}\n"
    )
    return path


def _ab_test(*args: str) -> Any:
    cwd = os.getcwd()
    os.chdir(REPO)  # --deploy runs the checkout's playbooks/deploy.yml
    try:
        return CliRunner().invoke(main, ["ab-test", *args], catch_exceptions=False)
    finally:
        os.chdir(cwd)


def _start(tmp_path: Path, inventory: Path, out: Path) -> Any:
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    return _ab_test(
        "--deploy", "-i", str(inventory), "--limit", HOST, "--workload", str(workload),
        "--trials", "2", "--out", str(out), "--deploy-var", 'vllm_lmcache_model="m"',
    )  # fmt: skip


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _segments_between_deploys(events: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """(variant deployed, completions that followed it before the next deploy)."""
    out: list[tuple[str, int]] = []
    for ev in events:
        if ev["event"] == "deploy":
            out.append((ev["variant"], 0))
        elif ev["event"] == "request" and out:
            out[-1] = (out[-1][0], out[-1][1] + 1)
    return out


@pytest.mark.timeout(120)
def test_deploy_records_reach_results_and_reports_redacted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log = tmp_path / "engine-events.jsonl"
    double = DeployPlayDouble(log)
    monkeypatch.setattr(ansible_runner, "run", double)
    out = tmp_path / "run"
    with running("--event-log", str(log)) as (url, _):
        result = _start(tmp_path, _inventory(tmp_path, url), out)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "results.json").read_text())
    deploy = doc["deploy"]
    assert deploy["limit"] == HOST and deploy["clear_gds_dir"] is True
    # one deploy per arm for its info, the arm measured first (baseline) last: the alphabet's
    # one-prompt probe goes to the arm deployed first, so baseline's first segment uses its
    # info deploy as it is (nothing was served since); then ABBA over two trials
    assert [(o["arm"], o["status"]) for o in deploy["outcomes"]] == [
        (arm, "successful") for arm in ("offload", "baseline", "offload", "offload", "baseline")
    ]
    assert _segments_between_deploys(_events(log)) == [
        ("offload", 1), ("baseline", PER_SEGMENT), ("offload", PER_SEGMENT),
        ("offload", PER_SEGMENT), ("baseline", PER_SEGMENT),
    ]  # fmt: skip
    offload = deploy["arms"]["offload"]["deployed"][HOST]
    assert offload["vllm_version"] == "0.32.0"
    assert offload["lmcache_version_installed"] == "0.5.6"
    assert offload["packages"] == {"vllm": "0.32.0", "lmcache": "0.5.6", "torch": "2.9.0"}
    assert offload["lmcache_config"]["gds_path"] == GDS_DIR
    assert offload["lmcache_config"]["remote_url"] == "redis://<redacted>@cache:6379"
    assert offload["kv_transfer_config"]["kv_connector"] == "LMCacheConnectorV1Dynamic"
    baseline = deploy["arms"]["baseline"]
    assert baseline["deploys"] == 2 and baseline["failed"] == 0
    assert baseline["deployed"][HOST]["lmcache_config"] == {}
    report_md = (out / "report.md").read_text()
    report_html = (out / "report.html").read_text()
    for text in (report_md, report_html):
        assert "Deploys" in text and "LMCacheConnectorV1Dynamic" in text
        assert f"gds_path: {GDS_DIR}" in text
        assert "vLLM 0.32.0" in text and "LMCache 0.5.6 (config rendered for 0.5.6)" in text
    assert "### arm offload: variant offload" in report_md
    for path in ("results.json", "report.md", "report.html", "deploys.jsonl"):
        text = (out / path).read_text()
        assert SECRET_URL_CREDENTIALS not in text and SECRET_API_KEY not in text, path


@pytest.mark.timeout(120)
def test_resume_after_a_failed_deploy_redeploys_the_arms_it_needs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log = tmp_path / "engine-events.jsonl"
    out = tmp_path / "run"
    with running("--event-log", str(log)) as (url, _):
        inventory = _inventory(tmp_path, url)
        # deploys: info offload, info baseline (trial 1 baseline measured on it), trial 1
        # offload, trial 2 offload: fails
        monkeypatch.setattr(ansible_runner, "run", DeployPlayDouble(log, fail_at=4))
        first = _start(tmp_path, inventory, out)
        assert first.exit_code == 2, first.output
        assert "deploy of arm offload (variant offload) on gpu1 failed" in first.output
        assert SECRET_API_KEY not in first.output
        stopped = json.loads((out / "results.json").read_text())
        assert stopped["status"] == "incomplete"
        assert "stopped at a failed deploy 4 (arm offload" in stopped["status_detail"]
        assert stopped["deploy"]["outcomes"][-1]["status"] == "failed"
        assert "did not become healthy" in (out / "report.md").read_text()
        assert len((out / "segments.jsonl").read_text().splitlines()) == 2

        resumed_double = DeployPlayDouble(log)
        monkeypatch.setattr(ansible_runner, "run", resumed_double)
        resumed = _ab_test("--resume", str(out))
    assert resumed.exit_code == 0, resumed.output
    # the resumed attempt reads each arm's info (offload, measured first, deployed last and
    # used as deployed), then runs trial 2 (reversed: offload first) with the arm's variant
    # deployed (and its GDS directory cleared) before each segment
    assert [c["extravars"]["vllm_lmcache_variant"] for c in resumed_double.calls] == [
        "baseline", "offload", "baseline",
    ]  # fmt: skip
    assert all(c["extravars"]["vllm_lmcache_clear_gds_dir"] for c in resumed_double.calls)
    assert all(c["extravars"]["vllm_lmcache_model"] == "m" for c in resumed_double.calls)
    assert all(c["limit"] == HOST for c in resumed_double.calls)
    after_resume = _segments_between_deploys(_events(log))[-2:]
    assert after_resume == [("offload", PER_SEGMENT), ("baseline", PER_SEGMENT)]
    doc = json.loads((out / "results.json").read_text())
    assert doc["status"] == "complete" and doc["status_detail"] == ""
    for arm in ("baseline", "offload"):
        # 2 trials x 1 measured iteration x 4 requests
        assert doc["scenarios"]["custom"]["arms"][arm]["metrics"]["completed"] == 2 * 4
    assert [o["status"] for o in doc["deploy"]["outcomes"]].count("failed") == 1
    assert len(doc["deploy"]["outcomes"]) == 4 + 3
    assert doc["deploy"]["arms"]["offload"]["failed"] == 1
    assert doc["deploy"]["arms"]["offload"]["last_status"] == "successful"
