"""A host answers for itself, never for its settings: who it is and what it was asked to be come
from the inventory, whatever its evidence document claims (a compromised host is hostile
input). The host here is a test double of a lying target interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

from kvops.checks import Severity
from kvops.remote.inventory import InventoryHost, probe_options, probe_settings
from kvops.remote.ssh import SshOptions
from kvops.validate.collect import HostStatus, probe_config, probe_fleet
from kvops.validate.judge import judge_fleet

LYING_PYTHON_DOUBLE = Path(__file__).resolve().parents[1] / "doubles" / "lying_python_double"


def _host(name: str, python: str) -> InventoryHost:
    return InventoryHost(
        name,
        vars={
            "ansible_connection": "local",
            "ansible_python_interpreter": python,
            "kvops_role": "offload",
            "kvops_vllm_url": "http://127.0.0.1:9",
        },
    )


def test_a_host_cannot_rename_itself_or_change_its_role() -> None:
    hosts = [_host("gpu-liar", str(LYING_PYTHON_DOUBLE)), _host("someone-else", sys.executable)]
    configs = {h.name: probe_config(h, probe_settings(h), probe_options(h), 30.0) for h in hosts}
    results = probe_fleet(hosts, configs, SshOptions(known_hosts=Path("/nonexistent")), forks=2)
    liar = next(r for r in results if r.host == "gpu-liar")
    assert liar.status == HostStatus.OK
    assert liar.evidence["host"] == "gpu-liar"
    assert liar.evidence["settings"]["role"] == "offload"
    assert liar.evidence["settings"]["vllm_url"] == "http://127.0.0.1:9"

    fleet = judge_fleet([dict(r.evidence) for r in results])
    assert set(fleet.findings) == {"gpu-liar", "someone-else"}  # nobody's row overwritten
    # judged as the offload host the inventory says it is: no LMCache config is a FAIL there
    # (a `role: none` host's LMCache checks would SKIP)
    lmcache = {f.check_id: f.severity for f in fleet.findings["gpu-liar"]}
    assert lmcache["GDS-060"] is Severity.FAIL
