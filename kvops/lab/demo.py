"""`kvops lab demo` (what `make lab` runs): the whole provision-validate-prove path on the lab.

Why one command: an operator (or a reviewer) should see the reference procedure end to end on
real Ansible targets before any GPU is bought - two hosts up, `playbooks/site.yml` converged,
`playbooks/deploy.yml` putting the offload variant on kvlab-1 (baseline on kvlab-2), `kvops
validate` on both, `kvops smoke --host` reading the chunk files over SSH, and `kvops ab-test
--deploy` switching kvlab-1 between variants on `multi-shared-prefix`, scaled - with the
commands printed as they run, so each can be repeated by hand.

The lab's role settings come from this checkout's tests/lab/*_vars.yml (the same files the lab
tests use: the engine is `kvops sim serve`, installed by the role's own pip task from a
wheelhouse served on the lab bridge, kvops.lab.wheelhouse). The plan is pure (`demo_steps`);
`run_demo` does the I/O. Needs root (namespaces, a bridge, mounts).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kvops.errors import RC, KvopsError
from kvops.lab.config import LabConfig
from kvops.lab.lab import Lab, slot_lock
from kvops.lab.wheelhouse import WheelhouseError, build_wheelhouse, serve_directory

OFFLOAD_HOST, BASELINE_HOST = "kvlab-1", "kvlab-2"
HOST_VARS: dict[str, dict[str, Any]] = {
    OFFLOAD_HOST: {"vllm_lmcache_variant": "offload", "kvops_role": "offload"},
    BASELINE_HOST: {"vllm_lmcache_variant": "baseline", "kvops_role": "baseline"},
}
# systemd in the lab is the service-manager double: it runs the role's real unit file.
HOST_VARIANTS = {name: {"SYSTEMD": "double"} for name in HOST_VARS}
SCENARIO = "multi-shared-prefix"
# The scaled GPU of `kvops ab-test --scale 0.05` (kvops.abtest.embedded), so the deployed
# engine's KV cache is as small as the scaled prefixes: they overflow it, as in production.
SCALE = 0.05
AB_ENGINE_ARGS = [
    "--gpu", "h100-sxm-80gb", "--storage", "ontap-nfs-rdma-200g",
    "--time-scale", "0.5", "--kv-capacity-scale", str(SCALE),
]  # fmt: skip
TRIALS = 2
STEP_TIMEOUT_S = 1800.0


class DemoStepFailed(KvopsError):
    """A step of the demo failed (its own output is above); exit 1."""

    rc = RC.FAIL


@dataclass(frozen=True)
class DemoPaths:
    root: Path  # the kvops checkout
    inventory: Path  # the lab's hosts.yml
    out: Path  # the ab-test run directory

    @property
    def lab_tests(self) -> Path:
        return self.root / "tests" / "lab"

    @property
    def site_vars(self) -> Path:
        return self.lab_tests / "site_lab_vars.yml"

    @property
    def deploy_vars(self) -> Path:
        return self.lab_tests / "deploy_lab_vars.yml"

    @property
    def validate_vars(self) -> Path:
        return self.lab_tests / "validate_lab_vars.yml"


@dataclass(frozen=True)
class Step:
    title: str
    argv: list[str]


def _sources(*paths: Path) -> list[str]:
    return [arg for p in paths for arg in ("-i", str(p))]


def service_ids(deploy_vars: Path) -> tuple[int, int]:
    """The service user's fixed uid/gid from the lab's deploy variables."""
    doc = yaml.safe_load(deploy_vars.read_text())
    group = doc["all"]["children"]["gpu_hosts"]["vars"]
    return int(group["vllm_lmcache_service_uid"]), int(group["vllm_lmcache_service_gid"])


def demo_steps(
    paths: DemoPaths, bin_dir: Path, wheel_vars: Mapping[str, Any], ids: tuple[int, int]
) -> list[Step]:
    """The commands, in order (pure: tests check the plan, `run_demo` runs it)."""
    p = paths
    hosts = ",".join(HOST_VARS)
    deploy_sources = _sources(p.inventory, p.site_vars, p.deploy_vars)
    all_sources = _sources(p.inventory, p.site_vars, p.validate_vars, p.deploy_vars)
    uid, gid = ids
    ansible = [str(bin_dir / "ansible"), "gpu_hosts", *deploy_sources, "--become"]
    playbook = str(bin_dir / "ansible-playbook")
    ab_vars = {**wheel_vars, "vllm_lmcache_extra_args": AB_ENGINE_ARGS}
    ab_test = [
        str(bin_dir / "kvops"), "ab-test", "--deploy", "--limit", OFFLOAD_HOST, *deploy_sources,
        *[arg for k, v in ab_vars.items() for arg in ("--deploy-var", f"{k}={json.dumps(v)}")],
        "--scenario", SCENARIO, "--scale", str(SCALE), "--trials", str(TRIALS),
        "--out", str(p.out), "--overwrite",
    ]  # fmt: skip
    return [
        # The service account with its fixed ids before site.yml, as production creates it
        # (nfs_rdma_mount gives the GDS directory to these ids on the shared export).
        Step(
            "service group with its fixed gid",
            [*ansible, "-m", "ansible.builtin.group", "-a", f"name=vllm gid={gid} system=true"],
        ),
        Step(
            "service user with its fixed uid",
            [
                *ansible,
                "-m",
                "ansible.builtin.user",
                "-a",
                f"name=vllm uid={uid} group=vllm system=true create_home=false "
                "shell=/usr/sbin/nologin",
            ],
        ),
        Step(
            "converge playbooks/site.yml (host stack)",
            [playbook, *deploy_sources, str(p.root / "playbooks" / "site.yml"), "--limit", hosts],
        ),
        Step(
            f"deploy playbooks/deploy.yml ({OFFLOAD_HOST} offload, {BASELINE_HOST} baseline)",
            [
                playbook,
                *deploy_sources,
                str(p.root / "playbooks" / "deploy.yml"),
                "--limit",
                hosts,
                "-e",
                json.dumps(dict(wheel_vars)),
            ],
        ),
        Step("kvops validate (both hosts)", [str(bin_dir / "kvops"), "validate", *all_sources]),
        Step(
            f"kvops smoke --host {OFFLOAD_HOST} (chunk files read over SSH)",
            [
                str(bin_dir / "kvops"),
                "smoke",
                "--host",
                OFFLOAD_HOST,
                *all_sources,
                "--prompt-tokens",
                "1024",
                "--prompts",
                "2",
            ],
        ),
        Step(f"kvops ab-test --deploy on {SCENARIO} (scale {SCALE}, {TRIALS} trials)", ab_test),
    ]


def ansible_env(root: Path, bin_dir: Path) -> dict[str, str]:
    """The checkout's ansible.cfg and this virtualenv's tools first on PATH."""
    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=str(root / "ansible.cfg"),
        ANSIBLE_HOST_KEY_CHECKING="True",
        ANSIBLE_RETRY_FILES_ENABLED="0",
        PATH=str(bin_dir) + os.pathsep + env.get("PATH", ""),
    )
    return env


def run_demo(root: Path, out: Path, say: Callable[[str], None]) -> Path:
    """Bring lab slot 0 up (replacing one there), run every step, return the run directory.
    Raises DemoStepFailed at the first step that exits non-zero, LabError when the lab or the
    wheelhouse cannot be set up. The hosts stay up for inspection (`kvops lab down`)."""
    bin_dir = Path(sys.executable).parent
    cfg = LabConfig(slot=0, hosts=len(HOST_VARS), packages_spec=root / "tests/lab/packages.yml")
    started = time.monotonic()
    with slot_lock(cfg.lab_dir, cfg.slot):
        say("lab: starting hosts " + ", ".join(HOST_VARS))
        state = Lab(cfg, log=lambda m: say(f"lab: {m}")).up(
            variants=HOST_VARIANTS, host_vars=HOST_VARS
        )
        inventory = Path(state.inventory_dir) / "hosts.yml"
        paths = DemoPaths(root, inventory, out.resolve())
        with tempfile.TemporaryDirectory(prefix="kvops-wheelhouse-") as tmp:
            say("lab: building the engine wheelhouse (kvops from this checkout)")
            try:
                house = build_wheelhouse(Path(tmp), root)
            except WheelhouseError as exc:
                raise DemoStepFailed(f"wheelhouse: {exc}") from exc
            server, url = serve_directory(house.directory, state.gateway_ip)
            try:
                wheel_vars = wheelhouse_vars(url, state.gateway_ip, house.pip_wheel)
                wheel_vars["vllm_lmcache_packages"] = house.requirements
                steps = demo_steps(paths, bin_dir, wheel_vars, service_ids(paths.deploy_vars))
                env = ansible_env(root, bin_dir)
                for number, step in enumerate(steps, 1):
                    _run_step(number, len(steps), step, env, root, say)
            finally:
                server.shutdown()
    say(f"lab demo: done in {time.monotonic() - started:.0f} s")
    return paths.out


def wheelhouse_vars(url: str, gateway_ip: str, pip_wheel: str) -> dict[str, Any]:
    """The role variables that point its pip at the wheelhouse on the lab bridge (no index)."""
    return {
        "vllm_lmcache_pip_bootstrap_url": f"{url}/{pip_wheel}",
        "vllm_lmcache_pip_index_url": f"{url}/",
        "vllm_lmcache_pip_env": {
            "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": f"{url}/",
            "PIP_TRUSTED_HOST": gateway_ip,
            "PIP_NO_DEPS": "1",
        },
    }


def _run_step(
    number: int,
    total: int,
    step: Step,
    env: Mapping[str, str],
    cwd: Path,
    say: Callable[[str], None],
) -> None:
    say(f"\n== step {number}/{total}: {step.title}\n$ {shlex.join(_short(step.argv, cwd))}")
    t0 = time.monotonic()
    try:
        proc = subprocess.run(step.argv, env=dict(env), cwd=cwd, timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise DemoStepFailed(f"step {number} ({step.title}) timed out") from exc
    if proc.returncode != 0:
        raise DemoStepFailed(
            f"step {number} ({step.title}) failed with exit {proc.returncode} (output above)"
        )
    say(f"== step {number}/{total} passed in {time.monotonic() - t0:.0f} s")


def _short(argv: list[str], root: Path) -> list[str]:
    """The command as printed: paths under the checkout relative to it, long JSON cut."""
    out = []
    for arg in argv:
        text = arg.replace(str(root) + "/", "")
        out.append(text if len(text) <= 160 else text[:150] + "...")
    return out
