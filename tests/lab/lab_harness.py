"""The object the lab fixtures yield: a running lab slot and helpers to drive it.

Kept apart from conftest.py so lab tests can import the type (``from lab_harness import
LabHosts``). API documented in tests/lab/README.md; keep it stable, the roles' lab tests use it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kvops.lab import inventory
from kvops.lab.config import LAB_USER, LabConfig
from kvops.lab.inject import PROC_TREE, SYS_TREE
from kvops.lab.lab import Lab, LabState, claim_free_slot

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES_SPEC = REPO_ROOT / "tests" / "lab" / "packages.yml"
# sitecustomize + the import scan cache of the Ansible controllers the lab tests start
CONTROLLER_AIDS = REPO_ROOT / "tests" / "lab" / "controller"
DOUBLES_LOG_DIR = "/var/log/kvops-test-doubles"
GPUS_FILE = "/etc/kvops-test-doubles/gpus"  # read by the nvidia-smi double
# For `kvops validate` on lab hosts: host var `kvops_probe_roots: PROBE_ROOTS` points the probe
# at the lab's /proc and /sys stand-ins (kept by the doubles; see README "proc tree").
PROBE_ROOTS = {"proc": PROC_TREE, "sys": SYS_TREE}


@dataclass(frozen=True)
class LabHost:
    name: str
    ip: str


@dataclass
class LabHosts:
    """A running lab: where its client files are, and how to talk to its hosts."""

    slot: int
    hosts: list[LabHost]
    inventory_dir: Path
    inventory_path: Path  # hosts.yml: every host in group gpu_hosts
    known_hosts_path: Path
    ssh_key_path: Path
    ssh_config_path: Path
    gateway_ip: str  # the bridge address: hosts reach services the tests run here
    user: str = LAB_USER
    repo_root: Path = REPO_ROOT
    _lab: Lab | None = field(default=None, repr=False)

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def host(self, name: str) -> LabHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host {name!r} in the lab ({', '.join(self.names)})")

    # ---- Ansible --------------------------------------------------------------------------
    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for ansible-* commands: the repo's ansible.cfg, the venv's bin first, the
        lab's controller aids on PYTHONPATH (``extra`` may add to it)."""
        env = dict(os.environ)
        venv_bin = str(Path(sys.executable).parent)
        env.update(
            {
                "ANSIBLE_CONFIG": str(self.repo_root / "ansible.cfg"),
                "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_FORCE_COLOR": "0",
                "ANSIBLE_HOST_KEY_CHECKING": "True",
                "ANSIBLE_RETRY_FILES_ENABLED": "0",
                "ANSIBLE_DEPRECATION_WARNINGS": "0",
                "PATH": venv_bin + os.pathsep + env.get("PATH", ""),
            }
        )
        env.update(extra or {})
        # the controller's import scan cache (tests/lab/controller/, README: "speed aids"), first
        # on whatever path a test gives
        env["PYTHONPATH"] = os.pathsep.join(
            entry for entry in (str(CONTROLLER_AIDS), env.get("PYTHONPATH", "")) if entry
        )
        return env

    def ansible_playbook(
        self,
        playbook: str | Path,
        *args: str,
        check: bool = False,
        diff: bool = False,
        limit: str | None = None,
        extra_vars: Mapping[str, Any] | None = None,
        inventory_path: Path | None = None,
        timeout_s: float = 900,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ansible-playbook against this lab (never raises on a failed play: check rc)."""
        import json

        argv = [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(inventory_path or self.inventory_path),
            str(playbook),
        ]
        if check:
            argv.append("--check")
        if diff:
            argv.append("--diff")
        if limit:
            argv += ["--limit", limit]
        if extra_vars:
            argv += ["-e", json.dumps(dict(extra_vars))]
        argv += list(args)
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=self.repo_root,
            env=self.env(env),
            check=False,
        )

    # ---- SSH ------------------------------------------------------------------------------
    @contextmanager
    def module_unloaded(self, name: str, module: str) -> Iterator[None]:
        """`modprobe -r MODULE` on host NAME for the block, loaded again however it ends (the
        lab's module double: tests/lab/doubles)."""
        self.ssh(name, ["modprobe", "-r", module], sudo=True)
        try:
            yield
        finally:
            self.ssh(name, ["modprobe", module], sudo=True)

    def ssh(
        self,
        name: str,
        command: Sequence[str],
        *,
        sudo: bool = False,
        check: bool = True,
        input_text: str | None = None,
        timeout_s: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` (an argument list) on a host as the lab user (root with sudo)."""
        self.host(name)
        remote = (["sudo", "-n"] if sudo else []) + list(command)
        argv = ["ssh", "-F", str(self.ssh_config_path), "-o", "BatchMode=yes", name, "--"]
        argv.append(shlex.join(remote))
        proc = subprocess.run(
            argv, capture_output=True, text=True, input=input_text, timeout=timeout_s, check=False
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"ssh {name} {shlex.join(remote)} failed ({proc.returncode}): {proc.stderr}"
            )
        return proc

    def read_file(self, name: str, path: str) -> str:
        return self.ssh(name, ["cat", path], sudo=True).stdout

    def write_file(self, name: str, path: str, content: str, mode: str = "0644") -> None:
        self.ssh(
            name, ["install", "-D", "-m", mode, "/dev/stdin", path], sudo=True, input_text=content
        )

    def doubles_log(self, name: str, tool: str) -> list[str]:
        """Recorded calls of one double (``modprobe``, ``mount.nfs``...): one entry per call."""
        proc = self.ssh(name, ["cat", f"{DOUBLES_LOG_DIR}/{tool}.log"], check=False)
        return proc.stdout.splitlines() if proc.returncode == 0 else []

    def set_variant(self, name: str, **values: str) -> None:
        """Switch a host's doubles now and for later restarts, e.g. ``RDMA="down"``;
        no values = back to healthy."""
        from kvops.lab.inject import VARIANT_FILE, render_variant

        content = self._lab.set_variant(name, values) if self._lab else render_variant(values)
        self.write_file(name, "/" + VARIANT_FILE, content)

    def set_gpus(self, name: str, gpus: Sequence[str] | None) -> None:
        """The GPUs the nvidia-smi double reports on a host (names, one per GPU; [] = none;
        None = back to the default single NVIDIA L40S)."""
        if gpus is None:
            self.ssh(name, ["rm", "-f", GPUS_FILE], sudo=True)
        else:
            self.write_file(name, GPUS_FILE, "".join(f"{gpu}\n" for gpu in gpus))

    def restart(self, name: str) -> None:
        """Reboot a host: same disk, fresh processes/mounts, modules-load.d replayed."""
        if self._lab is None:
            raise RuntimeError("this LabHosts is not attached to a running lab")
        self._lab.restart_host(name)

    def bind_mount(self, name: str, source: Path, target: str) -> None:
        """Bind-mount a directory of this machine onto ``target`` (an existing directory) in a
        running host, e.g. one folder mounted into two hosts standing in for one NFS export
        that both see (the lab kernel has no NFS). Done from this machine in the host's own
        mount namespace (nsenter(1) into the host process, whose mounts the host's chroot
        sees), so it stacks on whatever the host mounted there (the mount.nfs double's tmpfs).
        Like any mount in a host it is gone after ``restart`` and at teardown."""
        if self._lab is None:
            raise RuntimeError("this LabHosts is not attached to a running lab")
        state = self._lab.state()
        found = [h for h in state.hosts if h.name == name] if state else []
        if not found:
            raise KeyError(f"no host {name!r} in the lab ({', '.join(self.names)})")
        merged = Path(found[0].dir) / "merged"
        where = merged / target.lstrip("/")
        argv = ["nsenter", f"--target={found[0].pid}", "--mount", "--"]
        proc = subprocess.run(
            [*argv, "mount", "--bind", str(Path(source).resolve()), str(where)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise AssertionError(f"bind mount of {source} on {name}:{target}: {proc.stderr}")

    def testinfra(self, name: str, *, sudo: bool = True) -> Any:
        """A testinfra Host over ssh:// with this lab's ssh_config (ControlMaster: fast)."""
        import testinfra

        self.host(name)
        return testinfra.get_host(f"ssh://{name}", ssh_config=str(self.ssh_config_path), sudo=sudo)


def from_state(state: LabState, lab: Lab | None = None) -> LabHosts:
    inv_dir = Path(state.inventory_dir)
    return LabHosts(
        slot=state.slot,
        hosts=[LabHost(h.name, h.ip) for h in state.hosts],
        inventory_dir=inv_dir,
        inventory_path=inv_dir / inventory.HOSTS_FILE,
        known_hosts_path=inv_dir / inventory.KNOWN_HOSTS_FILE,
        ssh_key_path=inv_dir / inventory.KEY_FILE,
        ssh_config_path=inv_dir / inventory.SSH_CONFIG_FILE,
        gateway_ip=state.gateway_ip,
        _lab=lab,
    )


class LabSession:
    """Owns one slot for the life of a test session; ``close`` always tears everything down."""

    def __init__(self, lab_dir: Path | None = None) -> None:
        self._lock: IO[str] | None = None
        self._lab: Lab | None = None
        self._lab_dir = lab_dir

    def start(
        self,
        *,
        hosts: int = 2,
        name_prefix: str = "kvlab",
        variants: Mapping[str, Mapping[str, str]] | None = None,
        host_vars: Mapping[str, Mapping[str, Any]] | None = None,
        group_vars: Mapping[str, Any] | None = None,
        vars_files: tuple[Path, ...] = (),
    ) -> LabHosts:
        base = LabConfig()
        lab_dir = self._lab_dir or base.lab_dir
        slot, self._lock = claim_free_slot(lab_dir)
        cfg = LabConfig(
            slot=slot,
            hosts=hosts,
            name_prefix=name_prefix,
            lab_dir=lab_dir,
            packages_spec=PACKAGES_SPEC,
            vars_files=vars_files,
        )
        self._lab = Lab(cfg, log=lambda msg: print(f"lab: {msg}", file=sys.stderr))
        state = self._lab.up(variants=variants, host_vars=host_vars, group_vars=group_vars)
        return from_state(state, self._lab)

    def close(self) -> list[str]:
        try:
            return self._lab.down() if self._lab is not None else []
        finally:
            self._lab = None
            if self._lock is not None:
                self._lock.close()
                self._lock = None
