"""`kvops validate` on lab hosts after `playbooks/site.yml`: provision, then prove.

Real SSH with the lab's real host keys (the inventory's UserKnownHostsFile), become via the lab
user's sudo, the files the roles wrote (fstab mount, cufile.json, modprobe options, the GDS
directory), and the lab's /proc and /sys stand-ins through the probe's `kvops_probe_roots` seam.
The lab declares what it is in `validate_lab_vars.yml` (no inference service yet:
`kvops_role: none`; the GDS directory and its owner; the export stand-in's size).

One validate run over the shared lab's three hosts:
- kvlab-1, converged by site.yml: no FAIL (exit 0 when judged alone);
- kvlab-2, converged, then broken as a host loses its fast path: cufile.json allows compat mode
  and rpcrdma is unloaded; the gdscheck double, which answers from that state, reports NFS in
  compat only: GDS-040 and GDS-025 (rpcrdma) FAIL, GDS-032 WARNs;
- kvlab-3, provisioned wrong: site.yml with `nvidia_driver_open: false` (the proprietary
  `nvidia-driver-580` double), then the export remounted by hand over TCP, as an operator
  would (`mount -t nfs4 -o ...,proto=tcp`): GDS-002 and GDS-021 FAIL.
kvlab-2 gets its cufile.json and rpcrdma back afterwards; kvlab-3 stays wrong (no other test
uses it), and then loses its RDMA stack too (DOCA-OFED purged, rpcrdma unloaded): GDS-025 and
GDS-040 FAIL as well.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from ci_rule import unavailable
from lab_harness import PROBE_ROOTS, LabHosts
from site_lab import (
    EXPORT,
    HERE,
    MOUNT_PATH,
    SITE,
    SITE_VARS,
    STACK,
    converge_hosts,
    converged,
    explain,
    recap,
    run_site,
)

VALIDATE_VARS = HERE / "validate_lab_vars.yml"
WRONG = "kvlab-3"
CUFILE = "/etc/cufile.json"
GDS_DIR = f"{MOUNT_PATH}/gds"
TCP_OPTIONS = "vers=4.1,proto=tcp,hard,rsize=262144,wsize=262144,timeo=600,retrans=2"
# The GDS stack, judged on every provisioned host (vLLM/LMCache SKIP: kvops_role none).
STACK_CHECKS = (
    "GDS-001", "GDS-002", "GDS-010", "GDS-011", "GDS-012", "GDS-020", "GDS-021", "GDS-022",
    "GDS-023", "GDS-024", "GDS-025", "GDS-026", "GDS-030", "GDS-031", "GDS-032", "GDS-033",
    "GDS-034", "GDS-040", "GDS-041", "GDS-042", "GDS-080", "GDS-081", "GDS-082",
)  # fmt: skip
INFERENCE_CHECKS = (
    "GDS-060", "GDS-061", "GDS-062", "GDS-063", "GDS-064", "GDS-065", "GDS-066",
    "GDS-070", "GDS-071", "GDS-072", "GDS-073",
)  # fmt: skip


def expected_stack_severity(check_id: str, host: str) -> set[str]:
    """Every stack check PASSes on a converged host, except PeerDirect (GDS-012) on the host
    with the distribution's rdma-core: nvidia-fs gets PeerDirect only from OFED's kernel stack
    (GDS troubleshooting guide), so kvops WARNs there."""
    if check_id == "GDS-012" and STACK.get(host) == "rdma-core":
        return {"WARN"}
    return {"PASS"}


def validate(lab: LabHosts, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "kvops", "validate", "-i", str(lab.inventory_path)]
    cmd += ["-i", str(SITE_VARS), "-i", str(VALIDATE_VARS), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=lab.env(), timeout=600)


def by_check(report: dict[str, Any], host: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for item in report["hosts"][host]["findings"]:
        out.setdefault(item["check_id"], []).append(item)
    return out


def severities(report: dict[str, Any], host: str) -> dict[str, set[str]]:
    return {k: {f["severity"] for f in v} for k, v in by_check(report, host).items()}


def failed(report: dict[str, Any], host: str) -> set[str]:
    return {k for k, sev in severities(report, host).items() if "FAIL" in sev}


_wrong_done: set[int] = set()


def provision_wrong_host(lab: LabHosts, tmp_path: Path) -> None:
    """kvlab-3: site.yml with the proprietary driver, then the export remounted over TCP."""
    if lab.slot in _wrong_done:
        return
    host_vars = tmp_path / "wrong_host_vars.yml"
    wrong = {WRONG: {"nvidia_driver_open": False}}
    host_vars.write_text(yaml.safe_dump({"all": {"hosts": wrong}}))
    proc = run_site(lab, "-i", str(host_vars), limit=WRONG)
    assert proc.returncode == 0, explain(proc)
    # The operator's hand mount: the same export, TCP. A kernel refuses to change proto on a
    # remount, so it is unmounted first; the export's files persist on a real NFS server (the
    # tmpfs stand-in starts empty), so the role's GDS directory is made again as it was.
    script = (
        f"umount {MOUNT_PATH} && mount -t nfs4 -o {TCP_OPTIONS} {EXPORT} {MOUNT_PATH}"
        f" && install -d -o vllm -g vllm -m 0750 {GDS_DIR}"
    )
    lab.ssh(WRONG, ["sh", "-c", script], sudo=True)
    _wrong_done.add(lab.slot)


def test_validate_vars_match_the_lab_and_the_roles() -> None:
    data = yaml.safe_load(VALIDATE_VARS.read_text())["all"]["children"]["gpu_hosts"]["vars"]
    site = yaml.safe_load(SITE_VARS.read_text())["all"]["children"]["gpu_hosts"]["vars"]
    assert data["kvops_probe_roots"] == PROBE_ROOTS
    assert site["nfs_rdma_mount_path"] == MOUNT_PATH and data["kvops_gds_dir"] == GDS_DIR
    role_defaults = HERE.parents[1] / "roles" / "nfs_rdma_mount" / "defaults" / "main.yml"
    defaults = yaml.safe_load(role_defaults.read_text())
    assert defaults["nfs_rdma_mount_gds_dir"] == "{{ nfs_rdma_mount_path }}/gds"
    assert defaults["nfs_rdma_mount_gds_dir_owner"] == data["kvops_service_user"]


def test_validate_healthy_and_deliberately_wrong_hosts(lab: LabHosts, tmp_path: Path) -> None:
    if WRONG not in lab.names:
        unavailable(f"needs a third lab host {WRONG} (KVOPS_LAB_HOSTS >= 3), has {lab.names}")
    converged(lab)
    healthy, compat = converge_hosts(lab)
    provision_wrong_host(lab, tmp_path)
    evidence = tmp_path / "ev"
    cufile = lab.read_file(compat, CUFILE)
    allow = 's/"allow_compat_mode": *false/"allow_compat_mode": true/'
    lab.ssh(compat, ["sed", "-i", allow, CUFILE], sudo=True)  # sed -i keeps owner and mode
    assert lab.read_file(compat, CUFILE) != cufile, cufile
    try:
        with lab.module_unloaded(compat, "rpcrdma"):
            proc = validate(
                lab, "--limit", f"{healthy},{compat},{WRONG}", "--json", "--timeout", "90",
                "--save-evidence", str(evidence),
            )  # fmt: skip
    finally:
        forbid = 's/"allow_compat_mode": *true/"allow_compat_mode": false/'
        lab.ssh(compat, ["sed", "-i", forbid, CUFILE], sudo=True)
    assert lab.read_file(compat, CUFILE) == cufile
    assert proc.stdout, proc.stderr
    report = json.loads(proc.stdout)
    for name in (healthy, compat, WRONG):
        assert report["transport"][name]["status"] == "ok", report["transport"]
    assert proc.returncode == 1, proc.stderr  # the wrong hosts FAILed; every host was probed

    # The healthy host: the whole GDS stack PASSes, inference checks SKIP with the reason.
    good = by_check(report, healthy)
    assert report["hosts"][healthy]["status"] in {"PASS", "WARN"}, report["hosts"][healthy]
    for check_id in STACK_CHECKS:
        expected = expected_stack_severity(check_id, healthy)
        assert {f["severity"] for f in good[check_id]} == expected, (check_id, good[check_id])
    for check_id in INFERENCE_CHECKS:
        [item] = good[check_id]
        assert item["severity"] == "SKIP", item
        assert "kvops_role none" in item["message"], item

    # Each wrong host FAILs exactly the checks of its mistakes, with the cause in the message.
    assert failed(report, compat) == {"GDS-025", "GDS-040"}, by_check(report, compat)
    [compat_only] = by_check(report, compat)["GDS-040"]
    assert "compat" in compat_only["message"], compat_only
    assert severities(report, compat)["GDS-032"] == {"WARN"}  # compat allowed, not forced
    assert failed(report, WRONG) == {"GDS-002", "GDS-021"}, by_check(report, WRONG)
    [driver] = by_check(report, WRONG)["GDS-002"]
    assert "proprietary kernel module" in driver["message"], driver
    [tcp] = by_check(report, WRONG)["GDS-021"]
    assert "NFS over tcp" in tcp["message"] and "proto=tcp" in tcp["evidence"], tcp

    # Judged alone, the healthy host's evidence exits 0 (the same judges, offline).
    alone = tmp_path / "healthy-only"
    alone.mkdir()
    shutil.copy(evidence / f"{healthy}.json", alone)
    offline = subprocess.run(
        [sys.executable, "-m", "kvops", "validate", "--from-evidence", str(alone), "--json"],
        capture_output=True, text=True, env=lab.env(), timeout=120,
    )  # fmt: skip
    assert offline.returncode == 0, offline.stdout[-4000:] + offline.stderr

    # What was judged is what the roles and the operator left on the hosts.
    mounts = json.loads((evidence / f"{healthy}.json").read_text())["items"]["mounts"]
    assert mounts["source"] == f"{PROBE_ROOTS['proc']}/mounts"
    assert f" {MOUNT_PATH} " in mounts["stdout"] and "proto=rdma" in mounts["stdout"]
    wrong_items = json.loads((evidence / f"{WRONG}.json").read_text())["items"]
    assert "proto=tcp" in wrong_items["mounts"]["stdout"]
    assert "x86_64 Kernel Module" in wrong_items["nvidia_driver_version"]["stdout"]
    license_ = lab.ssh(WRONG, ["/usr/sbin/modinfo", "-F", "license", "nvidia"]).stdout.strip()
    assert license_ == "NVIDIA"


# The RDMA stack rdma_client installs (DOCA-OFED, its NFS-RDMA modules, DOCA's userspace).
RDMA_STACK = (
    "doca-ofed", "mlnx-nfsrdma-dkms", "mlnx-ofed-kernel-dkms", "mlnx-ofed-kernel-utils",
    "mlnx-tools", "rdma-core", "ibverbs-utils",
)  # fmt: skip


def test_validate_fails_a_host_whose_rdma_stack_is_missing(lab: LabHosts, tmp_path: Path) -> None:
    """The wrong host (proprietary driver, TCP mount) loses its RDMA stack too: DOCA-OFED purged,
    rpcrdma no longer loaded at boot nor now. validate FAILs the NFS/RDMA client (GDS-025) and
    gdscheck's NFS support (GDS-040: without rpcrdma there is no fast path, and cufile.json
    forbids compat), on top of the host's earlier mistakes, and nothing else."""
    if WRONG not in lab.names:
        unavailable(f"needs a third lab host {WRONG} (KVOPS_LAB_HOSTS >= 3), has {lab.names}")
    converged(lab)
    provision_wrong_host(lab, tmp_path)
    env = ["env", "DEBIAN_FRONTEND=noninteractive"]
    purge = ["apt-get", "-y", "-q", "--allow-change-held-packages", "purge", *RDMA_STACK]
    lab.ssh(WRONG, [*env, *purge], sudo=True, timeout_s=300)
    lab.ssh(WRONG, ["rm", "-f", "/etc/modules-load.d/rpcrdma.conf"], sudo=True)
    lab.ssh(WRONG, ["modprobe", "-r", "rpcrdma"], sudo=True)
    proc = validate(lab, "--limit", WRONG, "--json", "--timeout", "90")
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr
    report = json.loads(proc.stdout)
    assert failed(report, WRONG) == {"GDS-002", "GDS-021", "GDS-025", "GDS-040"}, by_check(
        report, WRONG
    )
    [rpcrdma] = by_check(report, WRONG)["GDS-025"]
    assert "rpcrdma" in rpcrdma["message"], rpcrdma


def test_the_operator_path_needs_only_the_lab_inventory(
    lab_factory: Callable[..., LabHosts],
) -> None:
    """`kvops lab up` writes the lab's vars files into hosts.yml, so the README's path works
    with no other inventory source: site.yml converges, `kvops validate -i inventories/lab`
    passes the host."""
    lab = lab_factory(hosts=1, name_prefix="kvlab", vars_files=(SITE_VARS, VALIDATE_VARS))
    [name] = lab.names
    site = lab.ansible_playbook(SITE)
    assert site.returncode == 0, explain(site)
    assert recap(site)[name]["failed"] == 0
    proc = subprocess.run(
        [sys.executable, "-m", "kvops", "validate", "-i", str(lab.inventory_path), "--json",
         "--timeout", "90"],
        capture_output=True, text=True, env=lab.env(), timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    report = json.loads(proc.stdout)
    assert failed(report, name) == set()
    for check_id in STACK_CHECKS:
        severities_seen = {f["severity"] for f in by_check(report, name)[check_id]}
        assert severities_seen == expected_stack_severity(check_id, name), check_id
