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

pytestmark = [pytest.mark.lab, pytest.mark.own_lab, pytest.mark.own_lab_b]

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


NVSWITCHES_FILE = "/etc/kvops-test-doubles/nvswitches"  # read by the modprobe double's nvidia
FABRICMANAGER = "nvidia-fabricmanager-580"


def _installed(lab: LabHosts, package: str) -> str:
    """The installed version of ``package``, "" when it is not installed."""
    proc = lab.ssh(HOST, ["dpkg-query", "-W", "-f=${Status} ${Version}", package], check=False)
    status = proc.stdout.split()
    return status[-1] if proc.returncode == 0 and "installed" in status[:3] else ""


def test_fabric_manager_follows_the_nvswitches_the_driver_found(
    svc: LabHosts, tmp_path: Path
) -> None:
    """Without an NVSwitch (the converge: fabricmanager auto) nothing is installed; once the
    nvidia driver lists NVSwitches, the branch's Fabric Manager is installed at the driver's
    version, held with it, enabled and started (the double starts only with its own driver
    version loaded and NVSwitches listed)."""
    assert _installed(svc, FABRICMANAGER) == ""
    assert _systemctl(svc, "is-enabled", "nvidia-fabricmanager") != "enabled"
    # An HGX H100 baseboard's NVSwitches, found by the driver when it loads.
    svc.write_file(HOST, NVSWITCHES_FILE, "0000:05:00.0\n0000:06:00.0\n")
    svc.ssh(HOST, ["rmmod", "nvidia"], sudo=True)
    try:
        proc = run_role(svc, tmp_path, "nvidia_driver", limit=HOST, extra_vars=SERVICES)
        assert proc.returncode == 0, explain(proc)
        assert (
            "2 NVSwitch(es) found by the nvidia driver (0000:05:00.0, 0000:06:00.0)" in proc.stdout
        )
        assert _installed(svc, FABRICMANAGER) == "580.82.07-0ubuntu1"  # the driver's pin
        held = svc.ssh(HOST, ["dpkg", "--get-selections", FABRICMANAGER]).stdout.split()
        assert held == [FABRICMANAGER, "hold"]
        assert _systemctl(svc, "is-enabled", "nvidia-fabricmanager") == "enabled"
        assert _systemctl(svc, "is-active", "nvidia-fabricmanager") == "active"
        assert svc.doubles_log(HOST, "nv-fabricmanager"), "the daemon never started"
    finally:
        _systemctl(svc, "disable", "--now", "nvidia-fabricmanager")
        svc.ssh(
            HOST,
            ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-y", "-q",
             "--allow-change-held-packages", "purge", FABRICMANAGER],
            sudo=True,
        )  # fmt: skip
        svc.ssh(HOST, ["rm", "-f", NVSWITCHES_FILE], sudo=True)
        svc.ssh(HOST, ["rmmod", "nvidia"], sudo=True, check=False)
        svc.ssh(HOST, ["modprobe", "nvidia"], sudo=True)  # as loaded before: no NVSwitch
