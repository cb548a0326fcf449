"""The lab network: one private bridge per slot and a network namespace + veth per host.

Only a private range created on this machine is used, and ``net.ipv4.ip_forward`` is never
touched (it stays 0), so a lab host can reach the bridge address and its sibling hosts and
nothing else: nothing leaves the machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from kvops.lab.config import LabConfig
from kvops.lab.errors import LabError, run


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def address_conflicts(ip_addr_output: str, bridge: str, subnet_prefix: str) -> list[str]:
    """Interfaces other than ``bridge`` holding an address in the lab subnet (pure)."""
    found = []
    for line in ip_addr_output.splitlines():
        fields = line.split()
        is_other = len(fields) >= 4 and fields[2] == "inet" and fields[1] != bridge
        if is_other and fields[3].startswith(subnet_prefix):
            found.append(f"{fields[1]} {fields[3]}")
    return found


def ensure_bridge(cfg: LabConfig) -> None:
    """Create the slot's bridge with its gateway address (idempotent).

    Forwarding is switched off for packets arriving on the bridge (per interface, so the
    machine's global ``ip_forward`` is left as it is): even on a machine that routes, lab hosts
    reach the bridge address and each other, never beyond.
    """
    prefix = cfg.gateway_ip.rsplit(".", 1)[0] + "."
    conflicts = address_conflicts(
        run(["ip", "-o", "-4", "addr", "show"]).stdout, cfg.bridge, prefix
    )
    if conflicts:
        raise LabError(f"the lab subnet {prefix}0/24 is already used here: {', '.join(conflicts)}")
    if not link_exists(cfg.bridge):
        run(["ip", "link", "add", "name", cfg.bridge, "type", "bridge"])
    Path(f"/proc/sys/net/ipv4/conf/{cfg.bridge}/forwarding").write_text("0\n")
    v6 = Path(f"/proc/sys/net/ipv6/conf/{cfg.bridge}/disable_ipv6")
    if v6.exists():
        v6.write_text("1\n")
    addrs = run(["ip", "-o", "-4", "addr", "show", "dev", cfg.bridge]).stdout
    if f" {cfg.gateway_ip}/" not in addrs:
        run(["ip", "addr", "add", f"{cfg.gateway_ip}/{cfg.prefix_len}", "dev", cfg.bridge])
    run(["ip", "link", "set", cfg.bridge, "up"])


def remove_bridge(cfg: LabConfig) -> None:
    if link_exists(cfg.bridge):
        run(["ip", "link", "del", cfg.bridge])


def list_netns() -> list[str]:
    """Names of all network namespaces (``ip netns list`` prints ``name (id: N)``)."""
    out = run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def add_host_link(cfg: LabConfig, index: int) -> None:
    """Namespace + veth pair: one end in the bridge, ``eth0`` with the host's address inside."""
    ns, veth, ip = cfg.netns(index), cfg.veth(index), cfg.host_ip(index)
    remove_host_link(cfg, index)
    run(["ip", "netns", "add", ns])
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
    run(["ip", "link", "set", veth, "master", cfg.bridge, "up"])
    run(["ip", "-n", ns, "addr", "add", f"{ip}/{cfg.prefix_len}", "dev", "eth0"])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    run(["ip", "-n", ns, "link", "set", "eth0", "up"])
    run(["ip", "-n", ns, "route", "add", "default", "via", cfg.gateway_ip])


def netns_pids(ns: str) -> list[int]:
    proc = run(["ip", "netns", "pids", ns], check=False)
    return [int(tok) for tok in proc.stdout.split() if tok.isdigit()]


def kill_netns_processes(ns: str, timeout_s: float = 5.0) -> None:
    """SIGKILL every process still inside the lab's namespace (all started by the lab)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pids = netns_pids(ns)
        if not pids:
            return
        if time.monotonic() > deadline:
            raise LabError(f"processes {pids} in network namespace {ns} survive SIGKILL")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def remove_netns(ns: str) -> None:
    if ns in list_netns():
        kill_netns_processes(ns)
        run(["ip", "netns", "del", ns])


def remove_host_link(cfg: LabConfig, index: int) -> None:
    """Deleting the namespace destroys ``eth0`` and with it the bridge-side veth."""
    remove_netns(cfg.netns(index))
    if link_exists(cfg.veth(index)):
        run(["ip", "link", "del", cfg.veth(index)])
