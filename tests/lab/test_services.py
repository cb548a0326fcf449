"""Services through a service manager: nvidia-persistenced, and the cufile restart handler.

A private host with the lab's service manager double (SYSTEMD=double): Ansible sees systemd,
the real unit files run. The inference service is a test-only unit (a sleeping shell) named
like the real one, so the cufile handler's behaviour is observable: restart when cufile.json
changes and the service runs, nothing otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from lab_harness import LabHosts
from site_lab import changed_tasks, explain, recap, run_role, run_site

HOST = "kvsvc-1"
SERVICES = {"nvidia_driver_manage_services": True}
VLLM_UNIT = """\
# kvops lab TEST DOUBLE unit: stands in for the vLLM service (it only sleeps).
[Unit]
Description=kvops lab test double of the vLLM inference service

[Service]
Type=simple
ExecStart=/bin/sleep infinity

[Install]
WantedBy=multi-user.target
"""
RESTART = (
    "cufile : Cufile | Restart the running inference service so that cuFile rereads its "
    "configuration"
)


@pytest.fixture(scope="module")
def svc(lab_factory: Callable[..., LabHosts]) -> LabHosts:
    lab = lab_factory(hosts=1, name_prefix="kvsvc", variants={HOST: {"SYSTEMD": "double"}})
    proc = run_site(lab, limit=HOST, extra_vars=SERVICES)
    assert proc.returncode == 0, explain(proc)
    return lab


def _systemctl(lab: LabHosts, *argv: str) -> str:
    return lab.ssh(HOST, ["systemctl", *argv], sudo=True, check=False).stdout.strip()


def test_nvidia_persistenced_is_enabled_and_started(svc: LabHosts) -> None:
    assert _systemctl(svc, "is-enabled", "nvidia-persistenced") == "enabled"
    assert svc.doubles_log(HOST, "nvidia-persistenced"), "the daemon never started"
    query = ["nvidia-smi", "--query-gpu=persistence_mode", "--format=csv,noheader"]
    assert svc.ssh(HOST, query).stdout.strip() == "Enabled"


def test_with_services_a_second_run_changes_nothing(svc: LabHosts) -> None:
    proc = run_site(svc, limit=HOST, extra_vars=SERVICES)
    assert proc.returncode == 0, explain(proc)
    assert recap(proc)[HOST]["changed"] == 0, explain(proc)


def test_cufile_change_restarts_the_running_inference_service(
    svc: LabHosts, tmp_path: Path
) -> None:
    svc.write_file(HOST, "/etc/systemd/system/vllm.service", VLLM_UNIT)
    _systemctl(svc, "daemon-reload")
    _systemctl(svc, "start", "vllm")
    assert _systemctl(svc, "is-active", "vllm") == "active"
    pid_before = _systemctl(svc, "show", "-p", "MainPID", "--value", "vllm")

    changed = {"cufile_overrides": {"logging": {"level": "INFO"}}}
    proc = run_role(svc, tmp_path, "cufile", limit=HOST, extra_vars=changed)
    assert proc.returncode == 0, explain(proc)
    assert RESTART in changed_tasks(proc, HOST), explain(proc)
    assert _systemctl(svc, "is-active", "vllm") == "active"
    assert _systemctl(svc, "show", "-p", "MainPID", "--value", "vllm") != pid_before

    # Unchanged file: no restart.
    again = run_role(svc, tmp_path, "cufile", limit=HOST, extra_vars=changed)
    assert again.returncode == 0, explain(again)
    assert changed_tasks(again, HOST) == [], explain(again)


def test_a_stopped_inference_service_is_not_started_by_a_cufile_change(
    svc: LabHosts, tmp_path: Path
) -> None:
    svc.write_file(HOST, "/etc/systemd/system/vllm.service", VLLM_UNIT)
    _systemctl(svc, "daemon-reload")
    _systemctl(svc, "stop", "vllm")
    proc = run_role(
        svc,
        tmp_path,
        "cufile",
        limit=HOST,
        extra_vars={"cufile_overrides": {"logging": {"level": "DEBUG"}}},
    )
    assert proc.returncode == 0, explain(proc)
    assert changed_tasks(proc, HOST) == ["cufile : Cufile | Write the cuFile configuration"]
    assert _systemctl(svc, "is-active", "vllm") != "active"
