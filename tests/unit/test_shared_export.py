"""The shared KV-cache export trusts no single host's root: the mount is nosuid,nodev, the export
squashes root, and the GDS directory is created by the service user where root may not.

The roles' expressions are rendered with Ansible's own templar, no host needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from role_files import role_vars_file

ROLES = Path(__file__).resolve().parents[2] / "roles"

pytestmark = pytest.mark.unit


def _render(role: str, expr: str, **role_vars: Any) -> Any:
    variables: dict[str, Any] = {}
    for part in ("defaults", "vars"):
        variables.update(role_vars_file(ROLES / role / part / "main.yml"))
    variables.update(role_vars)
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(trust_as_template(expr))


MOUNT = {
    "nfs_rdma_mount_export_address": "192.0.2.10",
    "nfs_rdma_mount_gds_dir_uid": 990,
    "nfs_rdma_mount_gds_dir_gid": 990,
}


def _options(**role_vars: Any) -> list[str]:
    return str(
        _render("nfs_rdma_mount", "{{ _nfs_rdma_mount_options }}", **MOUNT, **role_vars)
    ).split(",")


def test_the_export_is_mounted_nosuid_nodev_by_default() -> None:
    options = _options()
    assert "nosuid" in options and "nodev" in options
    assert "suid" not in options and "dev" not in options
    opted_out = _options(nfs_rdma_mount_nosuid=False, nfs_rdma_mount_nodev=False)
    assert "suid" in opted_out and "dev" in opted_out and "nosuid" not in opted_out


@pytest.mark.parametrize(
    ("root_stat", "creator"),
    [
        ({"stat": {"exists": True, "uid": 990}}, "vllm"),  # ontap_export's volume root
        ({"stat": {"exists": True, "uid": 0}}, "root"),  # superuser sys (the opt-out)
        ({"skipped": True}, "root"),  # state absent / nothing looked at
    ],
)
def test_the_owner_of_the_export_root_creates_the_gds_directory(
    root_stat: dict[str, Any], creator: str
) -> None:
    got = _render(
        "nfs_rdma_mount",
        "{{ _nfs_rdma_mount_gds_creator }}",
        **MOUNT,
        _nfs_rdma_mount_root_stat=root_stat,
    )
    assert got == creator
    tasks = yaml.safe_load((ROLES / "nfs_rdma_mount" / "tasks" / "main.yml").read_text())
    [task] = [
        t
        for t in tasks
        if t["name"] == "Nfs_rdma_mount | Create the GDS directory for the service user"
    ]
    assert task["become_user"] == "{{ _nfs_rdma_mount_gds_creator }}" and task["become"] is True


def _ontap_task(name: str) -> dict[str, Any]:
    tasks = yaml.safe_load((ROLES / "ontap_export" / "tasks" / "main.yml").read_text())
    [block] = [t for t in tasks if "block" in t]
    [task] = [t for t in block["block"] if t["name"].startswith(name)]
    return dict(task)


def test_the_export_squashes_root_and_refuses_suid_and_devices() -> None:
    rule = _ontap_task("Ontap_export | Export rule for the GPU hosts")[
        "netapp.ontap.na_ontap_export_policy_rule"
    ]
    assert _render("ontap_export", rule["super_user_security"]) == ["none"]
    assert _render("ontap_export", rule["super_user_security"], ontap_export_superuser=["sys"]) == [
        "sys"
    ]
    assert rule["allow_suid"] is False and rule["allow_device_creation"] is False
    volume = _ontap_task("Ontap_export | Volume")["netapp.ontap.na_ontap_volume"]
    owner = {"ontap_export_volume_uid": 990, "ontap_export_volume_gid": 991}
    assert _render("ontap_export", volume["user_id"], **owner) == 990
    assert _render("ontap_export", volume["group_id"], **owner) == 991
    assert _render("ontap_export", volume["unix_permissions"]) == "0755"


def test_the_service_user_clears_the_gds_directory() -> None:
    """Root squashed may not list the service user's 0750 directory: the clearing runs as it."""
    path = ROLES / "vllm_lmcache" / "tasks" / "clear_gds_dir.yml"
    tasks = [
        t
        for t in yaml.safe_load(path.read_text())
        if "systemd_service" not in str(t) and "ansible.builtin.assert" not in t  # on the host
    ]
    assert len(tasks) >= 3  # list, delete, list what is left
    for task in tasks:
        assert task.get("become_user") == "{{ vllm_lmcache_service_user }}", task["name"]
