"""Role `ontap_export` (playbooks/ontap.yml) against the ONTAP REST test double.

Runs the real `ansible-playbook` from the venv as the control node; the netapp.ontap modules
talk HTTPS (verified against the run's test CA) to the double, which records every write.
The cluster starts as a fresh SVM: NFS on with v4.1 and RDMA off, data LIFs without RoCE, no
volume, no export policy.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "doubles"))

from ontap_rest_double import STATES, Cluster, DoublePki, OntapRestDouble, make_test_pki

# Runs in the lab-own group's process (tests/tiers.py): Ansible runs, no timing verdict.
pytestmark = pytest.mark.beside_lab_own

REPO = Path(__file__).parents[2]
PLAYBOOK = REPO / "playbooks" / "ontap.yml"
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"


def fresh_state() -> dict[str, Any]:
    state = json.loads((STATES / "good.json").read_text(encoding="utf-8"))
    state.pop("storage/volumes")
    state.pop("protocols/nfs/export-policies")
    nfs = state["protocols/nfs/services"][0]
    nfs["transport"]["rdma_enabled"] = False
    nfs["protocol"]["v40_enabled"] = False
    nfs["protocol"]["v41_features"]["pnfs_enabled"] = False
    for lif in state["network/ip/interfaces"]:
        lif["rdma_protocols"] = []
    return state  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DoublePki:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def double(pki: DoublePki) -> Iterator[OntapRestDouble]:
    with OntapRestDouble(Cluster.from_state(fresh_state()), pki) as served:
        yield served


def inventory(tmp_path: Path, double: OntapRestDouble, **overrides: Any) -> Path:
    host_vars: dict[str, Any] = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "ontap_export_hostname": double.host,
        "ontap_export_ca_file": str(double.pki.ca_file),
        "ontap_export_svm": "svm_kv",
        "ontap_export_aggregate": "aggr1_kv01",
        "ontap_export_size_gib": 1024,
        "ontap_export_clients": ["192.168.10.30", "192.168.10.31"],
        "ontap_export_volume_uid": 990,
        "ontap_export_volume_gid": 990,
        "ontap_export_nfs_versions": ["4.1"],
        "ontap_export_pnfs": True,
        "ontap_export_rdma_lifs": ["lif_kv01_rdma", "lif_kv02_rdma"],
        "ontap_export_no_log": False,
    }
    host_vars.update(overrides)
    path = tmp_path / "hosts.json"
    data = {"all": {"children": {"ontap": {"hosts": {"kvcluster": host_vars}}}}}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def play(inv: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVOPS_ONTAP", "ANSIBLE_"))}
    env.update(
        KVOPS_ONTAP_USERNAME="admin",
        KVOPS_ONTAP_PASSWORD="netapp1!",
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
    )
    cmd = [str(ANSIBLE_PLAYBOOK), "-i", str(inv), str(PLAYBOOK), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)


def recap(proc: subprocess.CompletedProcess[str]) -> dict[str, int]:
    line = re.search(r"kvcluster\s*:\s*(ok=.*)", proc.stdout)
    assert line, proc.stdout[-3000:] + proc.stderr[-2000:]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line.group(1))}


def test_role_converges_then_changes_nothing(double: OntapRestDouble, tmp_path: Path) -> None:
    inv = inventory(tmp_path, double)
    first = play(inv)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    assert recap(first)["changed"] > 0
    state = double.cluster.state()
    volume = state["storage/volumes"][0]
    assert volume["nas"]["path"] == "/kvcache"
    assert volume["nas"]["export_policy"]["name"] == "kvcache"
    assert volume["size"] == 1024 * 1024**3
    rules = state["protocols/nfs/export-policies"][0]["rules"]
    assert [c["match"] for c in rules[0]["clients"]] == ["192.168.10.30", "192.168.10.31"]
    # Root squashed by default, and no set-uid or device files whatever a client mounts with.
    assert (rules[0]["rw_rule"], rules[0]["superuser"]) == (["sys"], ["none"])
    assert (rules[0]["allow_suid"], rules[0]["allow_device_creation"]) == (False, False)
    # The volume root belongs to the service user: it, not root, creates the GDS directory.
    assert (volume["nas"]["uid"], volume["nas"]["gid"]) == (990, 990)
    assert str(volume["nas"]["unix_permissions"]).lstrip("0") == "755"
    nfs = state["protocols/nfs/services"][0]
    assert nfs["transport"]["rdma_enabled"] is True
    assert nfs["protocol"]["v41_features"]["pnfs_enabled"] is True
    lifs = {lif["name"]: lif["rdma_protocols"] for lif in state["network/ip/interfaces"]}
    assert lifs == {"lif_kv01_rdma": ["roce"], "lif_kv02_rdma": ["roce"], "lif_kv01_mgmt": []}
    writes = len(double.cluster.writes)

    second = play(inv)
    assert second.returncode == 0, second.stdout[-4000:]
    assert recap(second)["changed"] == 0, second.stdout[-4000:]
    assert double.cluster.writes[writes:] == []
    assert "netapp1!" not in first.stdout + first.stderr + second.stdout + second.stderr


def test_check_diff_writes_nothing_and_shows_the_change(
    double: OntapRestDouble, tmp_path: Path
) -> None:
    before = copy.deepcopy(double.cluster.state())
    proc = play(inventory(tmp_path, double), "--check", "--diff")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert double.cluster.writes == []
    assert double.cluster.state() == before
    assert recap(proc)["changed"] > 0
    assert re.search(r'^-\s*"transport.rdma_enabled": false$', proc.stdout, re.M), proc.stdout
    assert re.search(r'^\+\s*"transport.rdma_enabled": true$', proc.stdout, re.M)
    assert re.search(r'^-\s*"lif_kv01_rdma": \[\],?$', proc.stdout, re.M)
    assert re.search(r'^\+\s*"lif_kv01_rdma": \[\n\+\s*"roce"$', proc.stdout, re.M)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"ontap_export_clients": ["gpu-01 storage"]}, "ontap_export_clients must be IP"),
        (
            {"ontap_export_nfs_versions": ["4.2"]},
            "value of ontap_export_nfs_versions must be one or more of: 3, 4.0, 4.1",
        ),
        ({"ontap_export_pnfs": True, "ontap_export_nfs_versions": ["3"]}, "needs '4.1'"),
        ({"ontap_export_volume_uid": 0}, "ontap_export_volume_uid/gid must be the service user's"),
        (
            {"ontap_export_superuser": ["any"]},
            "value of ontap_export_superuser must be one or more of: none, sys",
        ),
    ],
    ids=[
        "client-not-an-address",
        "unknown-nfs-version",
        "pnfs-without-4.1",
        "volume-root-owned-by-root",
        "superuser-any",
    ],
)
def test_a_wrong_variable_fails_before_any_write(
    double: OntapRestDouble, tmp_path: Path, override: dict[str, Any], message: str
) -> None:
    proc = play(inventory(tmp_path, double, **override))
    assert proc.returncode != 0
    assert message in proc.stdout, proc.stdout[-3000:]
    assert double.cluster.writes == []


def test_root_is_squashed_unless_the_operator_opts_out(
    double: OntapRestDouble, tmp_path: Path
) -> None:
    proc = play(inventory(tmp_path, double, ontap_export_superuser=["sys"]))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    [rule] = double.cluster.state()["protocols/nfs/export-policies"][0]["rules"]
    assert rule["superuser"] == ["sys"]
    again = play(inventory(tmp_path, double))  # back to the default: squashed again
    assert again.returncode == 0, again.stdout[-4000:]
    [rule] = double.cluster.state()["protocols/nfs/export-policies"][0]["rules"]
    assert rule["superuser"] == ["none"]


def test_too_old_a_release_fails_before_any_write(pki: DoublePki, tmp_path: Path) -> None:
    state = fresh_state()
    state["version"] = "9.13.1"  # NFSv4.1 over RDMA needs 9.14.1
    with OntapRestDouble(Cluster.from_state(state), pki) as old:
        proc = play(inventory(tmp_path, old))
        assert old.cluster.writes == []
    assert proc.returncode != 0
    assert "NFS 4.1 over RDMA needs ONTAP 9.14.1; the cluster runs 9.13.1" in proc.stdout
