"""The kvops.gds collection against the lab, used as an operator would: the tarball built with
`ansible-galaxy collection build`, installed into an empty collections path, run from a folder
outside the checkout with the operator's own ansible.cfg.

Named to run among the site tests: it converges the shared lab, which test_lab_harness.py must
see as booted (pytest runs a folder's files in name order).

One test, in order (the shared lab, converged once per session by the checkout's site.yml):
1. `ansible-playbook kvops.gds.site` from the installed collection converges the two site hosts
   with nothing left to change: the collection is the checkout's roles, filters and files (the
   same run is test_site_converge.py's second run);
2. `ansible-playbook kvops.gds.validate` with the probe configs kvops derives from the inventory
   writes one evidence document per host, `kvops validate --from-evidence` judges it, and the
   direct SSH path (`kvops validate -i ...`) finds the same per host (same check ids, severities
   and messages apart from the probe's timestamp; the same evidence items);
3. `kvops validate --via ansible` from that folder (the installed collection through
   ansible-runner) judges the same again;
4. a host that does not answer (a closed port on the lab bridge) is a result on both paths:
   GDS-000 FAIL with Ansible's reason, never dropped.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from installed_collection import BIN, REPO, Installed
from lab_harness import LabHosts
from site_lab import SITE_VARS, converge_hosts, converged, explain, gate_env, recap, run_site
from test_validate_lab import VALIDATE_VARS

from kvops.remote.inventory import load_inventory, probe_options, probe_settings
from kvops.validate.collect import probe_config

GHOST = "kvlab-ghost"


def _message(text: str) -> str:
    """GDS-000's PASS names the probe's time, its FAIL the transport's own words."""
    for prefix in ("probed at", "not probed:"):
        if text.startswith(prefix):
            return prefix
    return text


def _findings(report: dict[str, Any]) -> dict[str, list[tuple[str, str, str]]]:
    """{host: [(check id, severity, message)]}."""
    return {
        host: [(f["check_id"], f["severity"], _message(f["message"])) for f in row["findings"]]
        for host, row in report["hosts"].items()
    }


def _items(directory: Path) -> dict[str, dict[str, tuple[Any, Any, Any]]]:
    """{host: {item: (kind, source, exit code)}} of an evidence bundle."""
    out = {}
    for path in directory.glob("*.json"):
        doc = json.loads(path.read_text())
        out[doc["host"]] = {
            k: (v.get("kind"), v.get("source"), v.get("exit_code")) for k, v in doc["items"].items()
        }
    return out


def test_installed_collection_converges_and_validates_the_lab(
    lab: LabHosts,
    operator_collection: Installed,
    installed_site_second_run: subprocess.CompletedProcess[str],
    tmp_path: Path,
) -> None:
    names = converge_hosts(lab)
    user = operator_collection.user_dir  # the operator's own configuration, not the checkout's
    env = operator_collection.env(lab.env({"PYTHONPATH": str(REPO)}))
    ghost = tmp_path / "ghost.yml"
    ghost_vars = {"ansible_host": lab.gateway_ip, "ansible_port": 1, "ansible_user": lab.user}
    ghost.write_text(
        yaml.safe_dump({"all": {"children": {"gpu_hosts": {"hosts": {GHOST: ghost_vars}}}}})
    )
    sources = ["-i", str(lab.inventory_path), "-i", str(SITE_VARS)]
    validate_sources = [*sources, "-i", str(VALIDATE_VARS), "-i", str(ghost)]

    def run(*argv: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, cwd=user, env=env, capture_output=True, text=True, timeout=timeout
        )

    # 1. the installed collection's site playbook converges the lab (conftest.py's
    # installed_site_second_run, also test_site_converge.py's second run): nothing left to change
    site = installed_site_second_run
    assert site.returncode == 0, explain(site)
    counts = recap(site)
    for name in names:
        assert counts[name]["failed"] == 0 and counts[name]["unreachable"] == 0, counts
        assert counts[name]["changed"] == 0, explain(site)
    assert "kvops.gds.nfs_rdma_mount : " in site.stdout  # the collection's roles ran
    assert str(REPO / "roles") not in site.stdout

    # 2. validate.yml's evidence, judged offline, against the direct path
    hosts = load_inventory(
        [str(lab.inventory_path), str(SITE_VARS), str(VALIDATE_VARS), str(ghost)]
    )
    configs = {h.name: probe_config(h, probe_settings(h), probe_options(h), 120.0) for h in hosts}
    configs_file = tmp_path / "configs.json"
    configs_file.write_text(json.dumps({"kvops_probe_configs": configs}))
    evidence = tmp_path / "evidence"
    play = run(
        str(BIN / "ansible-playbook"), *validate_sources, "kvops.gds.validate",
        "-e", f"@{configs_file}", "-e", f"kvops_validate_evidence_dir={evidence}",
    )  # fmt: skip
    assert play.returncode == 0, explain(play)
    assert (evidence.stat().st_mode & 0o777) == 0o700
    assert sorted(p.stem for p in evidence.glob("*.json")) == sorted(h.name for h in hosts)

    kvops = [sys.executable, "-m", "kvops", "validate", "--json"]
    offline = run(*kvops, "--from-evidence", str(evidence))
    direct_dir = tmp_path / "direct"
    direct = run(*kvops, *validate_sources, "--save-evidence", str(direct_dir), "--timeout", "60")
    via = run(*kvops, *validate_sources, "--via", "ansible", "--timeout", "60")
    for proc in (offline, direct, via):
        assert proc.stdout.strip(), explain(proc)
    by_path = {
        "playbook + --from-evidence": json.loads(offline.stdout),
        "direct": json.loads(direct.stdout),
        "--via ansible": json.loads(via.stdout),
    }
    want = _findings(by_path["direct"])
    assert set(want) == {h.name for h in hosts}
    assert any(sev == "PASS" for _, sev, _ in want[names[0]][1:]), want[names[0]]
    for path, report in by_path.items():
        assert _findings(report) == want, path
        assert report["exit_code"] == by_path["direct"]["exit_code"], path
    assert _items(evidence) == _items(direct_dir)

    # 4. the host that does not answer: a result with the transport's reason on every path
    for path, report in by_path.items():
        (finding,) = report["hosts"][GHOST]["findings"]
        assert (finding["check_id"], finding["severity"]) == ("GDS-000", "FAIL"), path
        assert "refused" in finding["message"].lower(), (path, finding["message"])
    transport = json.loads(via.stdout)["transport"][GHOST]
    assert transport["status"] == "unreachable"
    # Ansible's own words (its ssh connection plugin's), with OpenSSH's reason
    assert (
        f"ssh: connect to host {lab.gateway_ip} port 1: Connection refused" in transport["reason"]
    )


def test_the_gate_stops_a_site_rollout_at_the_batch_of_a_broken_host(
    lab: LabHosts, tmp_path: Path
) -> None:
    """site.yml with kvops_site_gate, one host per batch: the first host, its rpcrdma unloaded
    by hand (rdma_client's work undone), FAILs GDS-025 in its batch; the play stops there (the
    second host never runs), the finding is in the play's output and in the JUnit file of
    Ansible's junit callback. Healthy again, both batches pass the gate."""
    converged(lab)
    first, second = converge_hosts(lab)
    junit = tmp_path / "junit"
    env = gate_env(junit)
    args = ["-i", str(VALIDATE_VARS), "--tags", "kvops_gate"]
    gate = {"kvops_site_gate": True, "kvops_site_serial": 1}
    with lab.module_unloaded(first, "rpcrdma"):
        broken = run_site(lab, *args, extra_vars=gate, env=env)
    assert broken.returncode != 0, explain(broken)
    counts = recap(broken)
    assert counts[first]["failed"] == 1, explain(broken)
    assert second not in counts, explain(broken)  # its batch never started
    assert "validation FAILed: GDS-025" in broken.stdout, explain(broken)
    recap_text = broken.stdout.split("PLAY RECAP", 1)[1]  # the findings under the recap too
    assert "CUSTOM STATS" in recap_text and "GDS-025" in recap_text, explain(broken)
    (report,) = junit.glob("*.xml")
    xml = report.read_text()
    assert "GDS-025" in xml and first in xml, xml[-3000:]

    healthy = run_site(lab, *args, extra_vars=gate, env=env)
    assert healthy.returncode == 0, explain(healthy)
    counts = recap(healthy)
    assert counts[first]["failed"] == 0 and counts[second]["failed"] == 0, counts
    assert healthy.stdout.count("TASK [Kvops | Gate the batch on kvops validation]") == 2
