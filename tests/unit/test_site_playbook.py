"""playbooks/site.yml as Ansible reads it: fleet safety and the role order the GDS stack needs.

A rollout over a fleet must go in batches and stop at the first broken host, and handlers that
reboot hosts or restart the inference service must not hit every host of a batch at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "playbooks" / "site.yml"


def _play() -> dict[str, Any]:
    [play] = yaml.safe_load(SITE.read_text())
    assert isinstance(play, dict)
    return play


def _handlers(role: str) -> list[dict[str, Any]]:
    handlers = yaml.safe_load((REPO / "roles" / role / "handlers" / "main.yml").read_text())
    assert isinstance(handlers, list)
    return handlers


def _rendered(value: Any, **extra_vars: Any) -> Any:
    templar = Templar(loader=DataLoader(), variables=extra_vars)
    return templar.template(trust_as_template(value) if isinstance(value, str) else value)


def test_the_rollout_goes_in_batches_and_stops_at_the_first_failed_host() -> None:
    play = _play()
    assert _rendered(play["serial"]) == 10
    assert _rendered(play["max_fail_percentage"]) == 0
    # An operator widens or narrows the batches without editing the playbook.
    assert _rendered(play["serial"], kvops_site_serial="25%") == "25%"


def test_reboots_and_service_restarts_run_a_few_hosts_at_a_time() -> None:
    reboot = [h for h in _handlers("kernel_gate") if "ansible.builtin.reboot" in h]
    assert reboot and all(0 < int(h["throttle"]) <= 2 for h in reboot)
    restart = [h for h in _handlers("cufile") if "ansible.builtin.service" in h]
    assert restart and all(int(h["throttle"]) == 1 for h in restart)


def test_the_kernel_gate_comes_first_and_the_kernel_roles_depend_on_it() -> None:
    roles = [r["role"] for r in _play()["roles"]]
    assert roles == [
        "kernel_gate",
        "nvidia_driver",
        "rdma_client",
        "nvidia_fs",
        "nfs_rdma_mount",
        "cufile",
    ]
    for role in ("nvidia_driver", "rdma_client", "nvidia_fs"):
        meta = yaml.safe_load((REPO / "roles" / role / "meta" / "main.yml").read_text())
        assert {"role": "kernel_gate"} in meta["dependencies"], role
