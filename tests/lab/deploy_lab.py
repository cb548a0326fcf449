"""Helpers of the deploy lab tests: serve the engine wheelhouse on the lab bridge and run
playbooks/deploy.yml (role vllm_lmcache) with the lab's variables.

Not a test module. The engine on lab hosts is `kvops sim serve`, installed by the role's own pip
task from the wheelhouse (kvops.lab.wheelhouse); everything else the role does is real.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lab_harness import LabHosts
from site_lab import SITE_VARS, explain, run_site

from kvops.lab.wheelhouse import build_wheelhouse, serve_directory

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
DEPLOY = REPO_ROOT / "playbooks" / "deploy.yml"
DEPLOY_VARS = HERE / "deploy_lab_vars.yml"
GDS_DIR = "/mnt/kvcache/gds"
SERVICE = "vllm"
UNIT_LOG = f"/var/log/kvops-test-doubles/units/{SERVICE}.service.log"
SERVICE_UID = 990
OFFLOAD, BASELINE = "kvlab-1", "kvlab-2"
# One host prunes the store (roles/vllm_lmcache/README.md, "Pruning the store"): the same
# values on every host, as group_vars would give them.
PRUNE = {"vllm_lmcache_prune_host": OFFLOAD, "vllm_lmcache_prune_max_bytes": "64G"}


@contextmanager
def served_wheelhouse(lab: LabHosts, directory: Path) -> Iterator[dict[str, Any]]:
    """Build and serve the wheelhouse on the lab's bridge address; yields the role variables
    that point the role's pip at it (pass them as extra vars)."""
    house = build_wheelhouse(directory, REPO_ROOT)
    server, url = serve_directory(house.directory, lab.gateway_ip)
    try:
        yield {
            "vllm_lmcache_pip_bootstrap_url": f"{url}/{house.pip_wheel}",
            "vllm_lmcache_pip_index_url": f"{url}/",
            "vllm_lmcache_pip_env": {
                "PIP_NO_INDEX": "1",
                "PIP_FIND_LINKS": f"{url}/",
                "PIP_TRUSTED_HOST": lab.gateway_ip,
                "PIP_NO_DEPS": "1",
            },
            "vllm_lmcache_packages": house.requirements,
        }
    finally:
        server.shutdown()


def run_deploy(
    lab: LabHosts,
    wheel_vars: Mapping[str, Any],
    *args: str,
    extra_vars: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> subprocess.CompletedProcess[str]:
    """ansible-playbook deploy.yml -i <lab> -i site_lab_vars.yml -i deploy_lab_vars.yml."""
    return lab.ansible_playbook(
        DEPLOY,
        "-i",
        str(SITE_VARS),
        "-i",
        str(DEPLOY_VARS),
        *args,
        extra_vars={**wheel_vars, **(extra_vars or {})},
        **kwargs,
    )


def make_service_account(lab: LabHosts, name: str) -> None:
    """The service account with its fixed ids (SERVICE_UID), as production creates it before
    site.yml where nfs_rdma_mount (which owns the GDS directory) does not take the ids from the
    inventory."""
    lab.ssh(name, ["groupadd", "-f", "-g", str(SERVICE_UID), "vllm"], sudo=True)
    useradd = f"id vllm || useradd -r -u {SERVICE_UID} -g vllm -M -s /usr/sbin/nologin vllm"
    lab.ssh(name, ["sh", "-c", useradd], sudo=True)


def site_then_deploy(
    lab: LabHosts, wheel_vars: Mapping[str, Any]
) -> subprocess.CompletedProcess[str]:
    """A fresh deploy lab made ready as an operator would: the service account, site.yml (with
    deploy_lab_vars.yml), then deploy.yml; asserts both plays succeeded."""
    for name in lab.names:
        make_service_account(lab, name)
    site = run_site(lab, "-i", str(DEPLOY_VARS))
    assert site.returncode == 0, explain(site)
    proc = run_deploy(lab, wheel_vars)
    assert proc.returncode == 0, explain(proc)
    return proc


def offload_and_baseline_lab(lab_factory: Callable[..., LabHosts], **common_vars: Any) -> LabHosts:
    """Two hosts on the service-manager double, as an A/B deploys them: OFFLOAD runs the offload
    variant and BASELINE the baseline; `common_vars` go to both (as group_vars would)."""
    return lab_factory(
        hosts=2,
        variants={OFFLOAD: {"SYSTEMD": "double"}, BASELINE: {"SYSTEMD": "double"}},
        host_vars={
            host: {"vllm_lmcache_variant": variant, "kvops_role": variant, **common_vars}
            for host, variant in ((OFFLOAD, "offload"), (BASELINE, "baseline"))
        },
    )
