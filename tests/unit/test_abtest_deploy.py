"""`kvops ab-test --deploy`: each arm's deploy is recorded in the run directory with what the
role reports as deployed, a failed play stops the run with the play's own error (exit 2), and
the option combinations that cannot work are refused with one line.

ansible-runner is replaced by a test double that feeds the deployer the events a real run
emits (event names and fields as in ansible-runner's artifacts/job_events)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ansible_runner
import pytest
from click.testing import CliRunner

from kvops.abtest.arms import Arm
from kvops.abtest.deploy import ArmDeployer, DeployError, DeploySettings, variant_of
from kvops.cli import main

ROOT = Path(__file__).resolve().parents[2]
DEPLOYED = {"variant": "offload", "lmcache_version": "0.5.6", "packages": ["vllm==0.32.0"]}


def _double(events: list[dict[str, Any]], status: str, calls: list[dict[str, Any]]) -> Any:
    def run(**kwargs: Any) -> Any:
        calls.append(kwargs)
        for event in events:
            kwargs["event_handler"](event)
        return SimpleNamespace(status=status, rc=0 if status == "successful" else 2)

    return run


def _settings() -> DeploySettings:
    return DeploySettings(ROOT, ["inv.yml"], "gpu1", {"vllm_lmcache_model": "m"})


def test_a_successful_deploy_is_recorded_with_what_was_deployed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[dict[str, Any]] = []
    events = [
        {"event": "playbook_on_task_start", "event_data": {"task": "present | Write the unit"}},
        {"event": "runner_on_ok", "event_data": {"host": "gpu1", "res": {"changed": True}}},
        {"event": "runner_on_ok", "event_data": {
            "host": "gpu1", "res": {"ansible_facts": {"vllm_lmcache_deployed": DEPLOYED}}}},
    ]  # fmt: skip
    monkeypatch.setattr(ansible_runner, "run", _double(events, "successful", calls))
    progress: list[str] = []
    record = ArmDeployer(_settings(), tmp_path, progress.append).deploy(Arm("offload", "http://x"))
    assert calls[0]["extravars"] == {
        "vllm_lmcache_model": "m",
        "vllm_lmcache_variant": "offload",
        "vllm_lmcache_clear_gds_dir": True,
    }
    assert calls[0]["limit"] == "gpu1"
    assert calls[0]["playbook"] == str(ROOT / "playbooks" / "deploy.yml")
    assert progress == ["deploy offload on gpu1: present | Write the unit"]
    saved = [json.loads(line) for line in (tmp_path / "deploys.jsonl").read_text().splitlines()]
    assert saved == [record]
    assert record["status"] == "successful"
    assert record["deployed"] == {"gpu1": DEPLOYED}
    assert record["changed_tasks"] == 1


def test_a_failed_play_stops_with_the_plays_error_and_keeps_the_record(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    failure = {"event": "runner_on_failed", "event_data": {
        "host": "gpu1", "task": "wait_healthy | Fail with the service's own log lines",
        "res": {"msg": "vllm_lmcache: kvops-vllm did not become healthy ... | boom"}}}  # fmt: skip
    monkeypatch.setattr(ansible_runner, "run", _double([failure], "failed", []))
    deployer = ArmDeployer(_settings(), tmp_path, lambda _m: None)
    with pytest.raises(DeployError, match="did not become healthy") as info:
        deployer.deploy(Arm("baseline", "http://x"))
    assert int(info.value.rc) == 2
    saved = json.loads((tmp_path / "deploys.jsonl").read_text())
    assert saved["status"] == "failed"
    assert "boom" in saved["errors"][0]


def test_arms_must_be_named_after_variants() -> None:
    assert variant_of("offload_cpu_gds") == "offload_cpu_gds"
    with pytest.raises(DeployError, match="names no deploy variant"):
        variant_of("lmcache")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--deploy"], "--deploy needs the host(s) (--limit HOST[,HOST...])"),
        (["--limit", "gpu1"], "-i/--limit/--deploy-var belong to --deploy"),
        (
            [
                "--deploy",
                "-i",
                "x.yml",
                "--limit",
                "g",
                "--arm",
                "a=http://h:1",
                "--arm",
                "b=http://h:2",
            ],
            "--deploy names its arms by --deploy-variants, not --arm",
        ),
    ],
)
def test_impossible_deploy_options_are_one_line_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["ab-test", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_run_json_keeps_no_secret_deploy_var_and_resume_asks_for_it_again(
    tmp_path: Path,
) -> None:
    """`--deploy-var vllm_lmcache_hf_token=...` reaches the play, not run.json (an ordinary
    0644 file): --resume then needs it given again, and only it."""
    from kvops.abtest.session import AbTestRequest, prepare
    from kvops.workload import load_preset

    extra = {"vllm_lmcache_hf_token": "hf_Secret123", "vllm_lmcache_port": 8001}
    first = AbTestRequest(
        out=tmp_path / "run",
        arms=[Arm("baseline", "http://h:8001"), Arm("offload", "http://h:8001")],
        scenarios=[load_preset("unique-one-shot")],
        deploy=DeploySettings(ROOT, ["inv.yml"], "gpu1", extra),
    )
    prepare(first)
    stored = (tmp_path / "run" / "run.json").read_text()
    assert "hf_Secret123" not in stored
    assert json.loads(stored)["deploy"]["secret_extra_vars"] == ["vllm_lmcache_hf_token"]

    with pytest.raises(DeployError, match="give vllm_lmcache_hf_token again with --deploy-var"):
        prepare(AbTestRequest(out=tmp_path / "run", resume=True))
    with pytest.raises(DeployError, match="not vllm_lmcache_port"):
        prepare(
            AbTestRequest(
                out=tmp_path / "run",
                resume=True,
                resume_deploy_vars={"vllm_lmcache_hf_token": "x", "vllm_lmcache_port": 1},
            )
        )
    again = AbTestRequest(
        out=tmp_path / "run", resume=True, resume_deploy_vars={"vllm_lmcache_hf_token": "hf_x"}
    )
    prepare(again)
    assert again.deploy is not None
    assert again.deploy.extra_vars == {"vllm_lmcache_port": 8001, "vllm_lmcache_hf_token": "hf_x"}


def test_resume_takes_the_secret_deploy_vars_on_the_command_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["ab-test", "--resume", str(tmp_path), "--deploy-var", "broken"]
    )
    assert result.exit_code == 2
    assert "--deploy-var 'broken': expected KEY=VALUE" in result.output
