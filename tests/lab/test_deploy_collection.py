"""The validation gate of deploy.yml and site.yml on the deploy lab (kvlab-1 offload, kvlab-2
baseline; site.yml, then deploy.yml, as tests/lab/test_deploy.py prepares it). `kvops ab-test
--deploy` from the installed kvops.gds collection, outside the checkout, is tested on the
shared-store fleet (tests/lab/test_shared_store_lab.py).

1. A rollout of deploy.yml with ``kvops_deploy_gate=true``, one host per ``serial`` batch and
   the playbook's ``max_fail_percentage`` (0): the first batch's host, its rpcrdma unloaded by
   hand (rdma_client's work undone), gets the rolled-out change, FAILs GDS-025 at the gate and
   stops the rollout there - the second batch's host never runs and keeps its old environment
   file; the finding is in the play's output and in the JUnit file of Ansible's junit callback
   (https://docs.ansible.com/ansible/latest/collections/ansible/builtin/junit_callback.html).
   Healthy again, both batches pass the gate and the change reaches both hosts.
2. site.yml's gate (the same action, the same place in the play) judges each batch after the
   handlers its roles notified: here cufile's restart of the running inference service.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_lab import (
    BASELINE,
    DEPLOY_VARS,
    OFFLOAD,
    run_deploy,
)
from installed_collection import REPO
from lab_harness import LabHosts
from site_lab import SITE_VARS, explain, gate_env, recap, run_site
from test_validate_lab import VALIDATE_VARS

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

ENV_FILE = "/etc/kvops/vllm.env"
GATE_TASK = "TASK [Kvops | Gate the batch on kvops validation]"


def _env_lines(lab: LabHosts, host: str) -> list[str]:
    return lab.read_file(host, ENV_FILE).splitlines()


def test_the_gate_stops_a_deploy_rollout_at_the_batch_of_a_broken_host(
    deploy_lab: LabHosts, wheel_vars: dict[str, Any], deployed: None, tmp_path: Path
) -> None:
    marker = "KVOPS_ROLLOUT=gate-test"
    rollout = {
        "kvops_deploy_gate": True,
        "kvops_deploy_serial": 1,
        # the change being rolled out: one more line in the service's environment file
        "vllm_lmcache_env": {"KVOPS_ROLLOUT": "gate-test"},
    }
    junit = tmp_path / "junit"
    env = gate_env(junit)
    assert marker not in _env_lines(deploy_lab, OFFLOAD) + _env_lines(deploy_lab, BASELINE)
    with deploy_lab.module_unloaded(OFFLOAD, "rpcrdma"):
        broken = run_deploy(
            deploy_lab, wheel_vars, "-i", str(VALIDATE_VARS), extra_vars=rollout, env=env
        )
    assert broken.returncode != 0, explain(broken)
    counts = recap(broken)
    assert counts[OFFLOAD]["failed"] == 1, explain(broken)
    assert BASELINE not in counts, explain(broken)  # its batch never started
    assert broken.stdout.count(GATE_TASK) == 1, explain(broken)
    assert f"{OFFLOAD}: validation FAILed: GDS-025" in broken.stdout, explain(broken)
    # and under the play recap, per host (custom stats: the gate's own result is ok, a later
    # task fails the host)
    recap_text = broken.stdout.split("PLAY RECAP", 1)[1]
    assert "CUSTOM STATS" in recap_text and "GDS-025" in recap_text, explain(broken)
    assert marker in _env_lines(deploy_lab, OFFLOAD)  # the first batch was deployed ...
    assert marker not in _env_lines(deploy_lab, BASELINE)  # ... the second never was
    (report,) = junit.glob("*.xml")
    # the failed task as a JUnit <error> (ansible-core 2.19 writes a failed action's result with
    # its exception summary so) or <failure>: either fails the CI job that reads the file
    failures = [
        (case.get("name", ""), failure.get("message", "") + (failure.text or ""))
        for case in ET.parse(report).getroot().iter("testcase")
        for failure in case
        if failure.tag in ("failure", "error")
    ]
    assert len(failures) == 1, failures
    ((name, text),) = failures
    assert OFFLOAD in name and "Gate the batch" in name, name
    assert "GDS-025" in text, text[-3000:]

    healthy = run_deploy(
        deploy_lab, wheel_vars, "-i", str(VALIDATE_VARS), extra_vars=rollout, env=env
    )
    assert healthy.returncode == 0, explain(healthy)
    counts = recap(healthy)
    assert counts[OFFLOAD]["failed"] == 0 and counts[BASELINE]["failed"] == 0, counts
    assert healthy.stdout.count(GATE_TASK) == 2, explain(healthy)
    assert marker in _env_lines(deploy_lab, BASELINE)


# cufile's handler, as the play's output names it (the role's prefix differs between the checkout's
# playbook and the installed collection's)
CUFILE_RESTART = "Cufile | Restart the running inference service so that cuFile rereads its"


def test_the_site_gate_judges_each_batch_after_its_handlers(
    deploy_lab: LabHosts, deployed: None
) -> None:
    """site.yml with the gate, one host per batch, a cufile.json change on hosts whose inference
    service runs: cufile's handler restarts the service, and only after that may the gate probe
    the host - a gate that ran first would judge the service still running the old
    configuration, and pass a batch whose restart it never saw. (Ansible runs the handlers the
    roles notified at the end of the roles-and-tasks section, before post_tasks:
    https://docs.ansible.com/ansible/latest/playbook_guide/playbooks_handlers.html#controlling-when-handlers-run.)
    Last in this module: it leaves cufile.json changed (logging level INFO)."""
    site_vars = yaml.safe_load(SITE_VARS.read_text())["all"]["children"]["gpu_hosts"]["vars"]
    overrides = {**site_vars["cufile_overrides"], "logging": {"level": "INFO"}}
    proc = run_site(
        deploy_lab,
        "-i", str(DEPLOY_VARS), "-i", str(VALIDATE_VARS),
        extra_vars={"cufile_overrides": overrides, "kvops_site_gate": True, "kvops_site_serial": 1},
        env={"PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.returncode == 0, explain(proc)
    order = [
        line
        for line in proc.stdout.splitlines()
        if line.startswith(("PLAY [", "TASK [", "RUNNING HANDLER ["))
    ]
    # per batch (one host each): its restart, then its gate
    seen = [
        "restart" if CUFILE_RESTART in line else "gate"
        for line in order
        if CUFILE_RESTART in line or line.startswith(GATE_TASK)
    ]
    assert seen == ["restart", "gate"] * 2, "\n".join(order[-60:])
