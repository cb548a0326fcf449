"""inventories/example, read the way Ansible reads it: vault, per-OS groups, shared service ids.

The example is what an operator copies. Its vault must open with the documented demo password,
each OS group must give its hosts the versions spelt for that OS's package manager, and the GDS
directory's owner ids must be the one shared value the vllm_lmcache role's service user gets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.parsing.vault import VaultSecret
from ansible.template import Templar
from ansible.vars.manager import VariableManager

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "inventories" / "example"
DEMO_VAULT_PASSWORD = b"kvops-demo"  # documented in group_vars/all/main.yml and README


def _host_vars(host: str) -> dict[str, Any]:
    loader = DataLoader()
    loader.set_vault_secrets([("default", VaultSecret(DEMO_VAULT_PASSWORD))])
    inventory = InventoryManager(loader=loader, sources=[str(EXAMPLE)])
    manager = VariableManager(loader=loader, inventory=inventory)
    variables = manager.get_vars(host=inventory.get_host(host))
    templar = Templar(loader=loader, variables=variables)
    return {k: templar.template(v) for k, v in variables.items() if not k.startswith("ansible_")}


@pytest.fixture(scope="module")
def ubuntu() -> dict[str, Any]:
    return _host_vars("gpu-node-01")


@pytest.fixture(scope="module")
def rhel() -> dict[str, Any]:
    return _host_vars("gpu-node-02")


def test_the_vault_is_encrypted_and_opens_with_the_demo_password(
    ubuntu: dict[str, Any],
) -> None:
    raw = (EXAMPLE / "group_vars" / "all" / "vault.yml").read_text()
    assert raw.startswith("$ANSIBLE_VAULT;1.1;AES256")
    assert "vault_" not in raw  # nothing readable without the password
    assert ubuntu["vault_ontap_password"]


def test_gds_directory_owner_and_service_user_share_one_fixed_id(
    ubuntu: dict[str, Any], rhel: dict[str, Any]
) -> None:
    for host in (ubuntu, rhel):
        uid, gid = host["kvops_service_uid"], host["kvops_service_gid"]
        assert isinstance(uid, int) and uid > 0
        assert host["nfs_rdma_mount_gds_dir_uid"] == uid == host["vllm_lmcache_service_uid"]
        assert host["nfs_rdma_mount_gds_dir_gid"] == gid == host["vllm_lmcache_service_gid"]
        assert host["nfs_rdma_mount_gds_dir_owner"] == host["kvops_service_user"]


def test_each_os_group_spells_versions_for_its_package_manager(
    ubuntu: dict[str, Any], rhel: dict[str, Any]
) -> None:
    assert ubuntu["nvidia_driver_version"].endswith("ubuntu1")  # apt's Debian revision
    assert "ubuntu" not in rhel["nvidia_driver_version"]
    assert ubuntu["nvidia_driver_version"].startswith(ubuntu["nvidia_driver_branch"] + ".")
    assert rhel["nvidia_driver_version"].startswith(rhel["nvidia_driver_branch"] + ".")


def test_every_required_role_variable_is_set(ubuntu: dict[str, Any]) -> None:
    for role in ("nvidia_driver", "rdma_client", "nvidia_fs", "nfs_rdma_mount", "cufile"):
        spec = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())
        options = spec["argument_specs"]["main"]["options"]
        required = [name for name, opt in options.items() if opt.get("required")]
        assert all(name in ubuntu for name in required), (role, required)
    assert ubuntu["rdma_client_stack"] == "doca-ofed"  # GDS needs it
    assert ubuntu["nvidia_fs_require_peerdirect"] is True
