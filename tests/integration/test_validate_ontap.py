"""`kvops validate --ontap` against the ONTAP REST test double over real HTTPS.

The cluster is read by the real client (TLS verified against a CA made for this run, basic
auth); the GPU hosts' side is the recorded ONTAP NFSv4.1/RDMA mount (tests/fixtures/misc/
mount-nfs4-rdma-netapp-ontap.txt) with its export path replaced by the volume's junction
path and its clientaddr set per host. Each case edits the cluster's state the way an
operator's mistake would, and asserts the check id a user would be pointed at.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

sys.path[:0] = [str(Path(__file__).parents[1]), str(Path(__file__).parents[1] / "doubles")]

from evidence_builders import edited, file_item  # noqa: E402
from ontap_rest_double import STATES, Cluster, DoublePki, OntapRestDouble, make_test_pki  # noqa: E402

from kvops.checks.ontap import judge_ontap  # noqa: E402
from kvops.ontap.client import Credentials  # noqa: E402
from kvops.ontap.collect import collect  # noqa: E402
from kvops.ontap.target import OntapTarget  # noqa: E402

# Runs in the lab-own group's process (tests/tiers.py): no timing verdict.
pytestmark = pytest.mark.beside_lab_own

GOOD = json.loads((STATES / "good.json").read_text(encoding="utf-8"))
ADMIN = Credentials("admin", "netapp1!")
HOSTS = {"gpu-01": "192.168.10.30", "gpu-02": "192.168.10.31"}
# The recorded mount line's options, export path /kvcache (the volume's junction).
MOUNT_OPTIONS = (
    "rw,relatime,vers={vers},rsize=262144,wsize=262144,namlen=255,hard,proto=rdma,"
    "max_connect=16,port=20049,timeo=600,retrans=2,sec=sys,clientaddr={client},"
    "local_lock=none,write=eager,addr=192.168.10.101"
)


def host_document(host: str, client: str, vers: str = "4.1") -> dict[str, Any]:
    doc = edited()
    line = (
        f"192.168.10.101:/kvcache /mnt nfs4 {MOUNT_OPTIONS.format(vers=vers, client=client)} 0 0\n"
    )
    doc["items"]["mounts"] = file_item("/proc/mounts", line)
    # /proc/self/mountstats block in the kernel's format (fs/nfs/super.c nfs_show_stats).
    stats = (
        "device 192.168.10.101:/kvcache mounted on /mnt with fstype nfs4 statvers=1.1\n"
        f"\topts:\t{MOUNT_OPTIONS.format(vers=vers, client=client)}\n"
        "\tnfsv4:\tbm0=0xfdffbfff,bm1=0x40f9be3e,bm2=0x803,acl=0x3,sessions,"
        "pnfs=LAYOUT_NFSV4_1_FILES,lease_time=90,lease_expired=0\n"
    )
    doc["items"]["mountstats"] = file_item("/proc/self/mountstats", stats, synthetic=True)
    doc["host"] = host
    return doc


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DoublePki:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@contextmanager
def serve(
    pki: DoublePki, edit: Callable[[dict[str, Any]], None] | None = None
) -> Iterator[OntapRestDouble]:
    state = copy.deepcopy(GOOD)
    if edit is not None:
        edit(state)
    with OntapRestDouble(Cluster.from_state(state), pki) as double:
        yield double


def judged(
    pki: DoublePki, edit: Callable[[dict[str, Any]], None] | None = None, vers: str = "4.1"
) -> tuple[dict[str, Any], dict[str, list[tuple[str, str, str]]]]:
    with serve(pki, edit) as double:
        target = OntapTarget("kvcluster", double.host, "svm_kv", "kvcache", pki.ca_file, ADMIN)
        import asyncio

        evidence = asyncio.run(collect(target))
        assert double.cluster.writes == [], "validate must only read"
    hosts = [host_document(h, a, vers) for h, a in HOSTS.items()]
    findings = judge_ontap(evidence, hosts)
    return evidence, {
        host: [(f.check_id, str(f.severity), f.message) for f in items]
        for host, items in findings.items()
    }


def severities(findings: dict[str, list[tuple[str, str, str]]], check_id: str) -> dict[str, str]:
    return {host: s for host, items in findings.items() for cid, s, _ in items if cid == check_id}


def nfs(state: dict[str, Any]) -> dict[str, Any]:
    return state["protocols/nfs/services"][0]  # type: ignore[no-any-return]


def volume(state: dict[str, Any]) -> dict[str, Any]:
    return state["storage/volumes"][0]  # type: ignore[no-any-return]


def rule(state: dict[str, Any]) -> dict[str, Any]:
    return state["protocols/nfs/export-policies"][0]["rules"][0]  # type: ignore[no-any-return]


def test_good_cluster_passes_every_check(pki: DoublePki) -> None:
    evidence, findings = judged(pki)
    problems = [(h, f) for h, items in findings.items() for f in items if f[1] != "PASS"]
    assert problems == []
    assert set(findings) == {"kvcluster", "gpu-01", "gpu-02"}
    cluster_ids = [cid for cid, _, _ in findings["kvcluster"]]
    assert cluster_ids == [
        "ONT-000",
        "ONT-001",
        "ONT-002",
        "ONT-003",
        "ONT-005",
        "ONT-031",
        "ONT-010",
    ]
    assert [cid for cid, _, _ in findings["gpu-02"]] == ["ONT-011", "ONT-020", "ONT-030", "ONT-040"]
    # 9.15.1 has no volume `nodes` field: the owning node came through the aggregate.
    assert evidence["volume_nodes"] == ["kv-01"]
    assert evidence["volume_nodes_source"] == "the volume's aggregates"


def _rdma_off(state: dict[str, Any]) -> None:
    nfs(state)["transport"]["rdma_enabled"] = False


def _too_old(state: dict[str, Any]) -> None:
    state["version"] = "9.13.1"  # NFSv4.1 over RDMA needs 9.14.1


def _export_misses_gpu02(state: dict[str, Any]) -> None:
    rule(state)["clients"] = [{"match": "192.168.10.30"}]


def _read_only(state: dict[str, Any]) -> None:
    rule(state)["rw_rule"] = ["never"]


def _nearly_full(state: dict[str, Any]) -> None:
    space = volume(state)["space"]
    space["available"] = space["size"] // 50  # 2 % free


def _other_junction(state: dict[str, Any]) -> None:
    volume(state)["nas"]["path"] = "/kvcache2"


@pytest.mark.parametrize(
    ("edit", "check_id", "expected"),
    [
        (_rdma_off, "ONT-002", {"kvcluster": "FAIL"}),
        (_too_old, "ONT-001", {"kvcluster": "FAIL"}),
        (_export_misses_gpu02, "ONT-020", {"gpu-01": "PASS", "gpu-02": "FAIL"}),
        (_read_only, "ONT-020", {"gpu-01": "FAIL", "gpu-02": "FAIL"}),
        (_nearly_full, "ONT-031", {"kvcluster": "FAIL"}),
        (_other_junction, "ONT-030", {"gpu-01": "FAIL", "gpu-02": "FAIL"}),
    ],
    ids=["rdma-disabled", "ontap-too-old", "export-missing-host", "read-only-rule",
         "nearly-full", "junction-mismatch"],
)  # fmt: skip
def test_misconfigured_cluster_fails_with_the_right_id(
    pki: DoublePki, edit: Callable[[dict[str, Any]], None], check_id: str, expected: dict[str, str]
) -> None:
    _, findings = judged(pki, edit)
    assert severities(findings, check_id) == expected
    failed = {cid for items in findings.values() for cid, s, _ in items if s == "FAIL"}
    assert failed == {check_id}


def test_read_only_and_missing_messages_name_the_address(pki: DoublePki) -> None:
    _, findings = judged(pki, _export_misses_gpu02)
    message = next(m for cid, _, m in findings["gpu-02"] if cid == "ONT-020")
    assert message == "export policy kvcache admits no rule for 192.168.10.31"


def test_lif_on_another_node_than_the_volume_warns(pki: DoublePki) -> None:
    def move_volume(state: dict[str, Any]) -> None:
        volume(state)["aggregates"] = [
            {"name": "aggr1_kv02", "uuid": "33333333-0000-11ee-9000-00a098000002"}
        ]

    _, findings = judged(pki, move_volume)
    assert severities(findings, "ONT-011") == {"gpu-01": "WARN", "gpu-02": "WARN"}
    assert severities(findings, "ONT-010") == {"kvcluster": "PASS"}
    assert not any(s == "FAIL" for items in findings.values() for _, s, _ in items)


def test_9_10_1_cluster_is_read_without_the_fields_it_lacks(pki: DoublePki) -> None:
    """On 9.10.1 the double answers 400/262197 for transport.rdma_enabled: collection must
    not ask for it, and the RDMA setting is reported as unreadable (WARN), not guessed."""

    def old(state: dict[str, Any]) -> None:
        state["version"] = "9.10.1"
        del nfs(state)["transport"]["rdma_enabled"]

    evidence, findings = judged(pki, old, vers="4.0")
    assert evidence["unreadable_fields"]["transport.rdma_enabled"].endswith("before 9.12.1")
    assert severities(findings, "ONT-002") == {"kvcluster": "WARN"}
    assert severities(findings, "ONT-001") == {"kvcluster": "PASS"}


def test_9_17_1_cluster_names_the_volume_nodes_directly(pki: DoublePki) -> None:
    def new(state: dict[str, Any]) -> None:
        state["version"] = "9.17.1"
        volume(state)["nodes"] = [{"name": "kv-02", "uuid": "11111111-0000-11ee-9000-00a098000002"}]

    evidence, findings = judged(pki, new)
    assert evidence["volume_nodes"] == ["kv-02"]
    assert evidence["volume_nodes_source"] == "volume nodes"
    assert severities(findings, "ONT-011") == {"gpu-01": "WARN", "gpu-02": "WARN"}


# ---------------------------------------------------------------- the CLI
def write_inventory(tmp_path: Path, double: OntapRestDouble) -> Path:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  children:\n    ontap:\n      hosts:\n        kvcluster:\n"
        "          ansible_connection: local\n"
        f"          ontap_export_hostname: '{double.host}'\n"
        "          ontap_export_svm: svm_kv\n          ontap_export_volume_name: kvcache\n",
        encoding="utf-8",
    )
    return inventory


def run_validate(
    inventory: Path, ca_file: Path, password: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVOPS_ONTAP")}
    env.update(KVOPS_ONTAP_USERNAME="admin", KVOPS_ONTAP_PASSWORD=password)
    cmd = [sys.executable, "-m", "kvops", "validate", "-i", str(inventory), "--ontap"]
    cmd += ["--ontap-ca-file", str(ca_file), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def test_cli_reads_the_cluster_into_the_fleet_report(pki: DoublePki, tmp_path: Path) -> None:
    with serve(pki) as double:
        inventory = write_inventory(tmp_path, double)
        junit = tmp_path / "v.xml"
        proc = run_validate(
            inventory, pki.ca_file, "netapp1!", "--json", "--junit", str(junit),
            "--save-evidence", str(tmp_path / "ev"),
        )  # fmt: skip
        assert double.cluster.writes == []
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    ids = {f["check_id"]: f["severity"] for f in report["hosts"]["kvcluster"]["findings"]}
    assert ids["ONT-002"] == "PASS" and ids["ONT-031"] == "PASS"
    assert 'classname="kvcluster"' in junit.read_text(encoding="utf-8")
    saved = json.loads((tmp_path / "ev" / "kvcluster.json").read_text(encoding="utf-8"))
    assert saved["kind"] == "ontap" and "netapp1!" not in json.dumps(saved)
    offline = [sys.executable, "-m", "kvops", "validate", "--from-evidence", str(tmp_path / "ev")]
    again = subprocess.run([*offline, "--json"], capture_output=True, text=True, timeout=120)
    assert json.loads(again.stdout)["hosts"]["kvcluster"]["status"] == "PASS"


def test_wrong_password_is_one_line_and_exit_2(pki: DoublePki, tmp_path: Path) -> None:
    with serve(pki) as double:
        proc = run_validate(write_inventory(tmp_path, double), pki.ca_file, "wrong-secret")
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and "refused the credentials of user 'admin' (HTTP 401)" in lines[0]
    assert "wrong-secret" not in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr


def test_unverifiable_certificate_is_one_line_and_exit_2(pki: DoublePki, tmp_path: Path) -> None:
    other = make_test_pki(tmp_path / "other", label="not-the-cluster")
    with serve(pki) as double:
        proc = run_validate(write_inventory(tmp_path, double), other.ca_file, "netapp1!")
        assert double.cluster.writes == []
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and "TLS certificate not verified" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
