"""Bring a lab slot up, tear it down, report its state.

``up`` is build-or-reuse (base image, test repo) + per host: prepare the files to copy in,
namespace + veth, start, then wait for SSH and write the client files. The state file is written
after each host starts, so a crash half-way still leaves enough for ``down`` to clean up; ``down``
also sweeps anything named after the slot (namespaces ``kvopsN-*``, veths ``kvNh*``) that a
lost state file would otherwise leak.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

from kvops.lab import aptrepo, host, inventory, net, rootfs
from kvops.lab.config import LAB_USER, LabConfig
from kvops.lab.errors import LabError, run
from kvops.lab.inject import VARIANT_FILE, prepare_inject, render_variant
from kvops.lab.state import (
    STATE_FILE,
    HostState,
    LabState,
    claim_free_slot,
    has_live_hosts,
    slot_lock,
)

__all__ = [
    "STATE_FILE",
    "HostState",
    "Lab",
    "LabState",
    "claim_free_slot",
    "has_live_hosts",
    "missing_prerequisites",
    "slot_lock",
]


def missing_prerequisites() -> list[str]:
    """Why the lab cannot run here (empty when it can): root, tools, overlayfs, netns."""
    reasons = []
    if os.geteuid() != 0:
        reasons.append("not root (the lab creates namespaces, a bridge and mounts)")
    for tool in ("ip", "unshare", "setpriv", "chroot", "ssh-keygen", "tar", "zstd"):
        if shutil.which(tool) is None:
            reasons.append(f"`{tool}` not found")
    try:
        if "overlay" not in Path("/proc/filesystems").read_text():
            reasons.append("overlayfs not available")
    except OSError:
        reasons.append("/proc/filesystems unreadable")
    if not reasons and not Path("/var/run/netns").exists() and not Path("/run/netns").exists():
        probe = f"kvops-probe-{os.getpid()}"
        if run(["ip", "netns", "add", probe], check=False).returncode != 0:
            reasons.append("`ip netns add` fails (no network namespaces)")
        else:
            run(["ip", "netns", "del", probe], check=False)
    return reasons


class Lab:
    """One lab slot. Not thread-safe; one process drives a slot at a time (see slot_lock)."""

    def __init__(self, cfg: LabConfig, *, log: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self._log = log or (lambda _msg: None)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def state_path(self) -> Path:
        return self.cfg.state_dir / STATE_FILE

    def state(self) -> LabState | None:
        return LabState.load(self.state_path)

    # ---- up ---------------------------------------------------------------------------------
    def up(
        self,
        *,
        variants: Mapping[str, Mapping[str, str]] | None = None,
        host_vars: Mapping[str, Mapping[str, Any]] | None = None,
        group_vars: Mapping[str, Any] | None = None,
        ready_timeout_s: float = 60.0,
    ) -> LabState:
        """Start ``cfg.hosts`` fresh hosts (a running lab in this slot is replaced)."""
        reasons = missing_prerequisites()
        if reasons:
            raise LabError("the lab cannot run here: " + "; ".join(reasons))
        cfg = self.cfg
        started = time.monotonic()
        names = [cfg.host_name(i) for i in range(1, cfg.hosts + 1)]
        for label, mapping in (("variants", variants), ("host_vars", host_vars)):
            unknown = sorted(set(mapping or {}) - set(names))
            if unknown:
                raise LabError(f"{label} for hosts not in the lab: {', '.join(unknown)}")
        try:  # before anything starts: a bad vars file must not leave a half-made lab
            declarations = inventory.read_declarations(cfg.vars_files)
        except ValueError as exc:
            raise LabError(str(exc)) from exc
        if self.state_path.exists() or any(
            ns.startswith(cfg.netns_prefix) for ns in net.list_netns()
        ):
            self._log(f"slot {cfg.slot}: replacing the lab already there")
            self.down()
        base = rootfs.ensure_base(cfg.cache_dir, log=True)
        spec, repo_dir = self._ensure_repo()
        inv_dir = cfg.resolved_inventory_dir()
        key = self._ensure_client_key(inv_dir)
        net.ensure_bridge(cfg)
        init = host.write_init(cfg.state_dir / "host-init.sh")
        state = LabState(
            slot=cfg.slot,
            name_prefix=cfg.name_prefix,
            bridge=cfg.bridge,
            gateway_ip=cfg.gateway_ip,
            inventory_dir=str(inv_dir),
            base_dir=str(base),
            repo_dir=str(repo_dir) if repo_dir else None,
            started_at=time.time(),
        )
        etc_hosts = "127.0.0.1\tlocalhost\n" + "".join(
            f"{cfg.host_ip(i)}\t{cfg.host_name(i)}\n" for i in range(1, cfg.hosts + 1)
        )
        for index in range(1, cfg.hosts + 1):
            name = cfg.host_name(index)
            host_dir = cfg.state_dir / "hosts" / name
            if host_dir.exists():
                shutil.rmtree(host_dir)
            host_key = prepare_inject(
                host_dir / "inject",
                base=base,
                name=name,
                etc_hosts=etc_hosts,
                authorized_key=key.with_suffix(".pub").read_text(),
                spec=spec,
                spec_dir=cfg.packages_spec.parent if cfg.packages_spec else None,
                variant=dict((variants or {}).get(name, {})),
            )
            net.add_host_link(cfg, index)
            proc = host.start(
                netns=cfg.netns(index),
                name=name,
                init=init,
                host_dir=host_dir,
                lower=base,
                repo_dir=repo_dir,
            )
            self._procs[name] = proc
            state.hosts.append(
                HostState(
                    name=name,
                    index=index,
                    ip=cfg.host_ip(index),
                    netns=cfg.netns(index),
                    veth=cfg.veth(index),
                    pid=proc.pid,
                    pid_start=host.proc_start_time(proc.pid),
                    dir=str(host_dir),
                    host_key=host_key,
                )
            )
            state.save(self.state_path)
        for h in state.hosts:
            host.wait_ready(
                h.ip, self._procs.get(h.name), Path(h.dir) / "console.log", ready_timeout_s
            )
        clients = [inventory.ClientHost(h.name, h.ip, h.host_key) for h in state.hosts]
        inventory.write_client_files(
            inv_dir,
            clients,
            host_vars=host_vars,
            group_vars=group_vars,
            declarations=declarations,
        )
        self._log(
            f"slot {cfg.slot}: {len(state.hosts)} hosts up in {time.monotonic() - started:.1f} s; "
            f"inventory {inv_dir / inventory.HOSTS_FILE}"
        )
        return state

    def _ensure_repo(self) -> tuple[aptrepo.RepoSpec | None, Path | None]:
        spec_path = self.cfg.packages_spec
        if spec_path is None:
            return None, None
        try:
            spec = aptrepo.load_spec(spec_path)
        except aptrepo.PackageSpecError as exc:
            raise LabError(str(exc)) from exc
        sources = spec_sources(spec_path)
        try:
            key = aptrepo.digest(spec_path, spec, sources)
        except aptrepo.PackageSpecError as exc:
            raise LabError(f"test package list: {exc}") from exc
        repo = self.cfg.cache_dir / f"repo-{key}"
        if not (repo / "Packages.gz").exists():
            with slot_lock(self.cfg.cache_dir, 99):
                if not (repo / "Packages.gz").exists():
                    t0 = time.monotonic()
                    partial = repo.with_name(repo.name + ".partial")
                    aptrepo.build_repo(spec, sources, partial)
                    partial.rename(repo)
                    self._log(f"test apt repo built in {time.monotonic() - t0:.1f} s: {repo}")
                    prune_repos(self.cfg.cache_dir, self.cfg.lab_dir, keep=repo)
        return spec, repo

    @staticmethod
    def _ensure_client_key(inv_dir: Path) -> Path:
        key = inv_dir / inventory.KEY_FILE
        key.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
        if not key.exists() or not key.with_suffix(".pub").exists():
            key.unlink(missing_ok=True)
            key.with_suffix(".pub").unlink(missing_ok=True)
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "kvops-lab", "-f", str(key)])
        return key

    # ---- restart ("reboot") -----------------------------------------------------------------
    def restart_host(self, name: str, ready_timeout_s: float = 60.0) -> HostState:
        """Kill one host and start it again on the same disk (upper layer): a reboot.

        Everything in memory (mounts, processes, the modprobe double's loaded modules) is
        gone; files persist; /etc/modules-load.d is replayed through the modprobe double.
        """
        state = self.state()
        if state is None:
            raise LabError(f"slot {self.cfg.slot}: no lab is up")
        matches = [h for h in state.hosts if h.name == name]
        if not matches:
            raise LabError(f"no host {name!r} in the lab")
        h = matches[0]
        host.kill(h.pid, h.pid_start)
        self._reap(h.name)
        net.kill_netns_processes(h.netns)
        proc = host.start(
            netns=h.netns,
            name=h.name,
            init=self.cfg.state_dir / "host-init.sh",
            host_dir=Path(h.dir),
            lower=Path(state.base_dir),
            repo_dir=Path(state.repo_dir) if state.repo_dir else None,
        )
        self._procs[h.name] = proc
        h.pid, h.pid_start = proc.pid, host.proc_start_time(proc.pid)
        state.save(self.state_path)
        host.wait_ready(h.ip, proc, Path(h.dir) / "console.log", ready_timeout_s)
        return h

    def set_variant(self, name: str, variant: Mapping[str, str]) -> str:
        """Record a host's variant switch for its next starts; returns the file's content.

        The running host gets the same content from the caller (over SSH), so the switch acts
        at once and survives a restart (the inject tree is copied in at every start).
        """
        state = self.state()
        hosts = [h for h in state.hosts if h.name == name] if state else []
        if not hosts:
            raise LabError(f"no host {name!r} in the lab")
        content = render_variant(variant)
        (Path(hosts[0].dir) / "inject" / VARIANT_FILE).write_text(content)
        return content

    # ---- down -------------------------------------------------------------------------------
    def down(self) -> list[str]:
        """Remove every host, namespace, veth and the bridge of this slot; returns what went."""
        cfg = self.cfg
        removed: list[str] = []
        state = self.state()
        for h in state.hosts if state else []:
            host.kill(h.pid, h.pid_start)
            self._reap(h.name)
            removed.append(h.name)
        for ns in net.list_netns():
            if ns.startswith(cfg.netns_prefix):
                net.remove_netns(ns)
        for link in Path("/sys/class/net").glob(f"kv{cfg.slot}h*"):
            run(["ip", "link", "del", link.name], check=False)
        net.remove_bridge(cfg)
        leftover = mounts_under(cfg.state_dir)
        if leftover:
            raise LabError(f"mounts left under {cfg.state_dir}: {', '.join(leftover)}")
        shutil.rmtree(cfg.state_dir / "hosts", ignore_errors=True)
        inv_dir = Path(state.inventory_dir) if state else cfg.resolved_inventory_dir()
        inventory.remove_client_files(inv_dir)
        self.state_path.unlink(missing_ok=True)
        (cfg.state_dir / "host-init.sh").unlink(missing_ok=True)
        return removed

    def _reap(self, name: str) -> None:
        proc = self._procs.pop(name, None)
        if proc is not None:
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    # ---- status -----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """A JSON-ready report: per host, is its process alive and does SSH answer."""
        state = self.state()
        if state is None:
            return {"slot": self.cfg.slot, "up": False, "hosts": []}
        hosts = []
        for h in state.hosts:
            alive = host.proc_start_time(h.pid) == h.pid_start and h.pid_start is not None
            hosts.append(
                {
                    "name": h.name,
                    "ip": h.ip,
                    "netns": h.netns,
                    "pid": h.pid,
                    "alive": alive,
                    "ssh": alive and ssh_answers(h.ip),
                }
            )
        return {
            "slot": state.slot,
            "up": True,
            "bridge": state.bridge,
            "gateway_ip": state.gateway_ip,
            "inventory": str(Path(state.inventory_dir) / inventory.HOSTS_FILE),
            "user": LAB_USER,
            "started_at": state.started_at,
            "hosts": hosts,
        }


def prune_repos(cache_dir: Path, lab_dir: Path, keep: Path) -> None:
    """Remove test repos of older package lists that no lab state (live or not) refers to."""
    used = {str(keep)}
    for state_file in lab_dir.glob(f"slot*/{STATE_FILE}"):
        state = LabState.load(state_file)
        if state is not None and state.repo_dir:
            used.add(state.repo_dir)
    for repo in cache_dir.glob("repo-*"):
        if repo.is_dir() and str(repo) not in used and not repo.name.endswith(".partial"):
            shutil.rmtree(repo, ignore_errors=True)


def ssh_answers(ip: str, timeout_s: float = 1.0) -> bool:
    try:
        with socket.create_connection((ip, 22), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def mounts_under(path: Path) -> list[str]:
    """Mount points below ``path`` visible in this mount namespace (must be none)."""
    prefix = str(path.resolve()) + "/"
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix):
            found.append(point)
    return found


def spec_sources(spec_path: Path) -> aptrepo.Sources:
    """The package list sits in tests/lab/: doubles and files next to it, fixtures in tests/."""
    here = spec_path.resolve().parent
    return aptrepo.Sources(
        doubles=here / "doubles", fixtures=here.parent / "fixtures", files=here / "files"
    )
