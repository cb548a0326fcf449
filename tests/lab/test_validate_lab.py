"""`kvops validate` on lab hosts after `playbooks/site.yml`: provision, then prove.

Real SSH with the lab's real host keys (the inventory's UserKnownHostsFile), become via the lab
user's sudo, the files the roles wrote (fstab mount, cufile.json, modprobe options), and the
lab's /proc and /sys stand-ins through the probe's `kvops_probe_roots` seam. A host switched to
the recorded compat-only `gdscheck` must FAIL the gdscheck check while the other passes it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from lab_harness import PROBE_ROOTS, LabHosts
from site_lab import MOUNT_PATH, SITE_VARS, converge_hosts, converged


def validate(lab: LabHosts, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    probe_vars = tmp_path / "kvops_vars.yml"
    group_vars = {
        "kvops_probe_roots": PROBE_ROOTS,
        "kvops_gds_dir": MOUNT_PATH,
        "ansible_become": True,
        "kvops_vllm_url": "http://127.0.0.1:8000",  # no vLLM in the lab's site.yml yet
    }
    probe_vars.write_text(
        yaml.safe_dump({"all": {"children": {"gpu_hosts": {"vars": group_vars}}}})
    )
    cmd = [sys.executable, "-m", "kvops", "validate", "-i", str(lab.inventory_path)]
    cmd += ["-i", str(SITE_VARS), "-i", str(probe_vars), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=lab.env(), timeout=600)


def severities(report: dict[str, Any], host: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for item in report["hosts"][host]["findings"]:
        out.setdefault(item["check_id"], set()).add(item["severity"])
    return out


def test_validate_converged_hosts_and_a_compat_only_host(lab: LabHosts, tmp_path: Path) -> None:
    converged(lab)
    healthy, compat = converge_hosts(lab)
    lab.set_variant(compat, GDSCHECK="compat")
    try:
        proc = validate(
            lab, tmp_path, "--limit", f"{healthy},{compat}", "--json", "--timeout", "90",
            "--save-evidence", str(tmp_path / "ev"),
        )  # fmt: skip
    finally:
        lab.set_variant(compat, GDSCHECK="healthy")
    assert proc.stdout, proc.stderr
    report = json.loads(proc.stdout)
    for name in (healthy, compat):
        assert report["transport"][name]["status"] == "ok", report["transport"]
    good = severities(report, healthy)
    checks = (
        "GDS-010",
        "GDS-020",
        "GDS-021",
        "GDS-023",
        "GDS-026",
        "GDS-030",
        "GDS-033",
        "GDS-040",
    )
    for check_id in checks:
        assert good[check_id] == {"PASS"}, (check_id, report["hosts"][healthy])
    assert "FAIL" in severities(report, compat)["GDS-040"]
    assert proc.returncode == 1  # checks FAILed (no vLLM yet); every host was probed
    evidence = json.loads((tmp_path / "ev" / f"{healthy}.json").read_text())
    mounts = evidence["items"]["mounts"]
    assert mounts["source"] == f"{PROBE_ROOTS['proc']}/mounts"
    assert f" {MOUNT_PATH} " in mounts["stdout"] and "proto=rdma" in mounts["stdout"]
