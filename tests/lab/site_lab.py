"""Helpers of the roles' lab tests: run playbooks/site.yml on the lab, parse the recap.

Not a test module. ``converged(lab)`` converges the first two hosts of a lab once per session
(cached), so the converge test and the testinfra verify tests share one converge. Role
variables for the lab live in ``site_lab_vars.yml`` (a second inventory source).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from lab_harness import LabHosts

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
SITE = REPO_ROOT / "playbooks" / "site.yml"
SITE_VARS = HERE / "site_lab_vars.yml"
ROLES = ("nvidia_driver", "rdma_client", "nvidia_fs", "nfs_rdma_mount", "cufile")

# Pins of site_lab_vars.yml (older than the newest in the test repo, so pinning is exercised).
DRIVER_VERSION = "580.82.07-0ubuntu1"
NVIDIA_FS_VERSION = "2.25.7-1"
GDS_VERSION = "12.9.1-1"
DOCA_VERSION = "2.9.1-1"
EXPORT = "192.0.2.50:/kvcache"
MOUNT_PATH = "/mnt/kvcache"
MOUNT_OPTIONS = (
    "vers=4.1,proto=rdma,port=20049,hard,nosuid,nodev,rsize=262144,wsize=262144,timeo=600,"
    "retrans=2,"
    "max_connect=16,_netdev"
)
# Which host runs which RDMA stack (site_lab_vars.yml): both DOCA-OFED, the GDS stack.
STACK = {"kvlab-1": "doca-ofed", "kvlab-2": "doca-ofed"}
# The DOCA-OFED release each host gets: the newest, or the pin.
DOCA_VERSIONS = {"kvlab-1": "3.1.0-1", "kvlab-2": DOCA_VERSION}

_RECAP = re.compile(r"^(?P<host>\S+)\s+:\s+(?P<counts>(?:\w+=\d+\s*)+)$", re.MULTILINE)
_converged: dict[int, subprocess.CompletedProcess[str]] = {}
# The test doubles' call logs as the first converge left them, per (slot, host, double): later
# tests on the same hosts (e.g. validate's unloaded rpcrdma) add their own calls to the logs.
_converge_logs: dict[tuple[int, str, str], list[str]] = {}
CONVERGE_LOGGED_DOUBLES = ("modprobe", "nvidia-smi", "ibv_devices", "modinfo")


def converge_hosts(lab: LabHosts) -> list[str]:
    """The two hosts the site converge targets (site_lab_vars.yml names them)."""
    names = [n for n in lab.names if n in STACK]
    assert names == list(STACK), f"the lab must have hosts {list(STACK)}, has {lab.names}"
    return names


def run_site(lab: LabHosts, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """ansible-playbook site.yml -i <lab> -i site_lab_vars.yml --limit <the two hosts>."""
    if not kwargs.get("limit"):
        kwargs["limit"] = ",".join(converge_hosts(lab))
    return lab.ansible_playbook(SITE, "-i", str(SITE_VARS), *args, **kwargs)


def recap(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, int]]:
    """PLAY RECAP counts per host: {"kvlab-1": {"ok": 54, "changed": 0, "failed": 0, ...}}."""
    text = proc.stdout.split("PLAY RECAP", 1)[-1]
    out: dict[str, dict[str, int]] = {}
    for m in _RECAP.finditer(text):
        out[m.group("host")] = {
            k: int(v) for k, v in (w.split("=") for w in m.group("counts").split())
        }
    return out


def explain(proc: subprocess.CompletedProcess[str], tail: int = 6000) -> str:
    return (
        f"rc={proc.returncode}\n--- stdout (tail)\n{proc.stdout[-tail:]}\n"
        f"--- stderr\n{proc.stderr[-2000:]}"
    )


def converged(lab: LabHosts) -> subprocess.CompletedProcess[str]:
    """The first converge of this lab (run once per session); asserts it succeeded."""
    if lab.slot not in _converged:
        _converged[lab.slot] = run_site(lab)
        for host in converge_hosts(lab):
            for double in CONVERGE_LOGGED_DOUBLES:
                _converge_logs[(lab.slot, host, double)] = lab.doubles_log(host, double)
    proc = _converged[lab.slot]
    assert proc.returncode == 0, explain(proc)
    return proc


def converge_log(lab: LabHosts, host: str, double: str) -> list[str]:
    """The calls of one test double (one of ``CONVERGE_LOGGED_DOUBLES``) made up to the end of
    the first converge, whatever later tests did on the host."""
    converged(lab)
    return _converge_logs[(lab.slot, host, double)]


def changed_tasks(proc: subprocess.CompletedProcess[str], host: str) -> list[str]:
    """Names of the tasks that reported ``changed`` for ``host`` (handlers included)."""
    names: list[str] = []
    current = ""
    for line in proc.stdout.splitlines():
        m = re.match(r"^(?:TASK|RUNNING HANDLER) \[(.*)\] \**$", line)
        if m:
            current = m.group(1)
        elif line.startswith(f"changed: [{host}]") and (not names or names[-1] != current):
            names.append(current)
    return names


def run_role(
    lab: LabHosts,
    workdir: Path,
    role: str,
    *,
    limit: str,
    extra_vars: dict[str, Any] | None = None,
    site_vars: bool = True,
    then: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """Apply one role (and the roles in ``then`` after it, in one play) to ``limit``, with the
    lab's role variables unless ``site_vars=False``."""
    roles = (role, *then)
    playbook = workdir / f"apply-{'-'.join(roles)}.yml"
    listed = "".join(f"    - role: {r}\n" for r in roles)
    playbook.write_text(
        f"---\n- name: Apply {', '.join(roles)}\n  hosts: gpu_hosts\n  become: true\n"
        f"  gather_facts: true\n  roles:\n{listed}"
    )
    args = ["-i", str(SITE_VARS)] if site_vars else []
    return lab.ansible_playbook(
        playbook,
        *args,
        limit=limit,
        extra_vars=extra_vars,
        env={"ANSIBLE_ROLES_PATH": str(REPO_ROOT / "roles")},
    )


def failure_messages(proc: subprocess.CompletedProcess[str]) -> str:
    """The ``msg`` of every ``fatal:`` result of a play (what the operator reads), one a line."""
    msgs = []
    for line in (proc.stdout + "\n" + proc.stderr).splitlines():
        if line.startswith("[ERROR]: "):
            msgs.append(line)  # one line; a multi-line ``fatal:`` result is not parsed below
        elif line.startswith("fatal:") and "=> " in line:
            try:
                msgs.append(str(json.loads(line.split("=> ", 1)[1]).get("msg", line)))
            except ValueError:
                msgs.append(line)
    return "\n".join(msgs)


def gate_env(junit_dir: Path) -> dict[str, str]:
    """The environment of a play with the rollout gate: the gate judges with this checkout's
    kvops, and Ansible's junit callback writes the play's results under `junit_dir`."""
    return {
        "PYTHONPATH": str(REPO_ROOT),
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.junit",
        "JUNIT_OUTPUT_DIR": str(junit_dir),
    }
