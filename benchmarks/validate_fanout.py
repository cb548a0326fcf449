"""Fan-out of `kvops validate`: wall time to probe 1, 8 and 32 hosts with forks >= hosts.

Each host is a real OpenSSH server on 127.0.0.1 (its own port and host key, verified against a
known_hosts file); the probe runs on it against a recorded host tree. Printed as a ratio
against one host measured in the same run. Target: 32 hosts under 2x the time of one.

Caveat printed with the result: here every "host" shares this machine's CPUs, so 32 probes
compete for the same cores (real hosts run their probes on their own CPUs); the client-side
CPU time is printed too, since that is the part a real fan-out shares, and the hosts' CPU per
host (sshd, shell, `timeout`, the probe's Python and the tools it runs).

With `--ansible` the same hosts are also probed the other way, in the same run and the same
repeats: `kvops validate --via ansible` (the kvops.gds.validate playbook with the kvops_probe
module, through ansible-runner, this checkout as the collection), and its wall time is printed
as a ratio against the direct path at the same size. Ansible's ssh keeps no connection between
runs (ansible-runner gives each run its own ControlPath folder).

Each measured run starts like a fresh `kvops validate`: the client's per-run caches (parsed
known_hosts, loaded private key) are cleared first. Sizes are interleaved within each repeat,
so load from other processes drifts over all sizes alike; the load average is printed.

    python benchmarks/validate_fanout.py [--sizes 1,8,32] [--repeat 3] [--key-type rsa]
                                         [--known-hosts-others 1000] [--ansible]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "integration"), str(ROOT / "tests" / "doubles")]

from local_sshd import keygen, sshd_available, start_sshd  # noqa: E402
from recorded_host_double import TOOLS_DOUBLE_DIR, build_recorded_tree  # noqa: E402

from kvops.remote import ssh  # noqa: E402
from kvops.remote.inventory import InventoryHost, probe_options, probe_settings  # noqa: E402
from kvops.remote.ssh import SshOptions  # noqa: E402
from kvops.validate.collect import HostResult, probe_config, probe_fleet  # noqa: E402
from kvops.validate.via_ansible import probe_via_ansible  # noqa: E402


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _tree_cpu_s(pids: list[int]) -> float:
    """CPU seconds of these processes plus their reaped descendants (/proc/PID/stat).

    Each sshd listener reaps its sessions, which reap the shell, `timeout` and the probe's
    Python, so utime+stime+cutime+cstime of the listeners is all the CPU the "hosts" used."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


def _wait_reaped(pids: list[int], limit_s: float = 5.0) -> None:
    """Wait until the listeners have reaped their finished sessions: a session's CPU shows in
    the listener's cutime only then (a client that hung up is ahead of sshd's SIGCHLD)."""
    wanted = {str(p) for p in pids}
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        busy = False
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                ppid = stat.read_text().rsplit(")", 1)[1].split()[1]
            except (OSError, IndexError):
                continue
            if ppid in wanted:
                busy = True
                break
        if not busy:
            return
        time.sleep(0.01)


def _machine_busy_s() -> float:
    """CPU seconds all processes on this machine have used (/proc/stat: all but idle, iowait)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = sum(fields[:8]) - fields[3] - fields[4]  # user..steal, less idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8,32")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument(
        "--key-type",
        default="ed25519",
        choices=["ed25519", "ecdsa", "rsa"],
        help="client key type (loading an RSA key is the costly one)",
    )
    parser.add_argument(
        "--known-hosts-others",
        type=int,
        default=0,
        metavar="N",
        help="N entries of other hosts in known_hosts, like an operator's long-lived file",
    )
    parser.add_argument(
        "--ansible",
        action="store_true",
        help="also probe through Ansible (kvops validate --via ansible) and print both paths",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if not sshd_available():
        print("validate_fanout: sshd not installed (apt-get install openssh-server)")
        return 2
    with tempfile.TemporaryDirectory(prefix="kvops-fanout-") as tmp:
        work = Path(tmp)
        client_key = work / "client_key"
        authorized = keygen(client_key, args.key_type)
        host_key = work / "host_key"  # one key for all servers: generation is not measured
        keygen(host_key)
        gds = work / "gds"
        gds.mkdir()
        roots = build_recorded_tree(work / "tree", gds)
        servers = [start_sshd(work / f"s{i}", [authorized], host_key) for i in range(max(sizes))]
        try:
            known = work / "known_hosts"
            other_lines = [
                f"[10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}]:22 "
                + " ".join(servers[0].host_key_line.split()[:2])
                + "\n"
                for i in range(args.known_hosts_others)
            ]
            known.write_text("".join(other_lines + [s.known_hosts_line for s in servers]))
            hosts = [
                InventoryHost(
                    f"h{i:02d}",
                    vars={
                        "ansible_host": "127.0.0.1",
                        "ansible_port": s.port,
                        "ansible_user": os.environ.get("USER", "root"),
                        "ansible_ssh_private_key_file": str(client_key),
                        "kvops_gds_dir": str(gds),
                        "kvops_vllm_url": "http://127.0.0.1:9",
                        "kvops_probe_roots": roots,
                        "kvops_probe_tool_dirs": [str(TOOLS_DOUBLE_DIR)],
                    },
                )
                for i, s in enumerate(servers)
            ]
            opts = SshOptions(known_hosts=known, timeout_s=args.timeout)
            configs = {
                h.name: probe_config(h, probe_settings(h), probe_options(h), args.timeout)
                for h in hosts
            }
            inventory = work / "inventory.yml"
            _write_inventory(inventory, hosts, known)
            ansible_walls: dict[int, list[float]] = {n: [] for n in sizes}
            probe_fleet(hosts[:1], configs, opts, forks=1)  # warm-up (imports, page cache)
            if args.ansible:
                _via_ansible(hosts[:1], configs, inventory, args.timeout)  # warm-up
            load_before = os.getloadavg()[0]
            runs: dict[int, list[tuple[float, float, float, float]]] = {n: [] for n in sizes}
            for _ in range(args.repeat):
                for n in sizes:
                    pids = [s.proc.pid for s in servers[:n]]
                    clear = getattr(ssh, "clear_caches", None)
                    if clear is not None:
                        clear()  # a fresh run parses known_hosts and loads its key once
                    _wait_reaped(pids)
                    all0, cpu0, busy0 = _machine_busy_s(), _cpu_s(), _tree_cpu_s(pids)
                    t0 = time.perf_counter()
                    results = probe_fleet(hosts[:n], configs, opts, forks=n)
                    wall = time.perf_counter() - t0
                    cpu, all1 = _cpu_s() - cpu0, _machine_busy_s()
                    _wait_reaped(pids)
                    busy = _tree_cpu_s(pids) - busy0
                    others = max(0.0, all1 - all0 - cpu - busy)  # the hosts' tail is not others'
                    runs[n].append((wall, cpu, busy, others))
                    bad = [r for r in results if not r.ok]
                    if args.ansible and not bad:
                        t0 = time.perf_counter()
                        results = _via_ansible(hosts[:n], configs, inventory, args.timeout)
                        ansible_walls[n].append(time.perf_counter() - t0)
                        bad = [r for r in results if not r.ok]
                    if bad:
                        print(f"validate_fanout: {bad[0].host}: {bad[0].status} {bad[0].reason}")
                        return 1
            rows: list[tuple[int, float, float, float, float]] = [
                (n, *_medians(runs[n])) for n in sizes
            ]
        finally:
            for s in servers:
                s.stop()
    base = rows[0][1]
    ncpu = os.cpu_count() or 1
    print(
        f"validate fan-out, forks = hosts, median of {args.repeat} runs, {args.key_type} client "
        f"key, {args.known_hosts_others + len(servers)} known_hosts lines, load average "
        f"{load_before:.2f} before the runs"
    )
    print(
        f"{'hosts':>6} {'wall_s':>8} {'ratio_vs_1':>11} {'client_cpu_s':>13} {'hosts_cpu_s':>12} "
        f"{'host_cpu_ms_each':>17} {'others_cpu_s':>13}"
    )
    for n, wall, cpu, busy, others in rows:
        print(
            f"{n:>6} {wall:>8.2f} {wall / base:>11.2f} {cpu:>13.2f} {busy:>12.2f} "
            f"{busy / n * 1000:>17.0f} {others:>13.2f}"
        )
    n, wall, cpu, busy, others = rows[-1]
    floor = (cpu + busy) / ncpu
    verdict = "met" if wall / base < 2 else "NOT met"
    print(f"target: {n} hosts in < 2x the time of one: {verdict} ({wall / base:.2f}x).")
    print(
        f"Here all {n} sshd 'hosts' share this machine's {ncpu} CPUs with the client (and any "
        f"other load): their {cpu + busy:.1f} CPU-s need >= {floor:.1f} s of wall time, so "
        f"{n} hosts cannot beat {floor / base:.2f}x here. On real hosts each probe uses its "
        "own CPUs; only client_cpu_s is shared. others_cpu_s: what other processes used on "
        "this machine during the run (approximate)."
    )
    if args.ansible:
        _print_ansible(rows, ansible_walls, args.repeat)
    return 0


def _write_inventory(path: Path, hosts: list[InventoryHost], known: Path) -> None:
    """The same hosts for Ansible, with the same strict host keys (OpenSSH reads the file)."""
    ssh_args = f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes"
    inventory = {
        "all": {"hosts": {h.name: {**h.vars, "ansible_ssh_common_args": ssh_args} for h in hosts}}
    }
    path.write_text(json.dumps(inventory))


def _via_ansible(
    hosts: list[InventoryHost],
    configs: dict[str, dict[str, object]],
    inventory: Path,
    timeout_s: float,
) -> list[HostResult]:
    return probe_via_ansible(hosts, configs, [str(inventory)], len(hosts), timeout_s, root=ROOT)


def _medians(
    runs: list[tuple[float, float, float, float]],
) -> tuple[float, float, float, float]:
    """Each column's median over the repeats: wall, client CPU, hosts' CPU, others' CPU."""
    wall, cpu, busy, others = (statistics.median(r[i] for r in runs) for i in range(4))
    return wall, cpu, busy, others


def _print_ansible(
    rows: list[tuple[int, float, float, float, float]],
    walls: dict[int, list[float]],
    repeat: int,
) -> None:
    base = statistics.median(walls[rows[0][0]])
    print(f"\nvia Ansible (kvops.gds.validate through ansible-runner), median of {repeat} runs")
    print(f"{'hosts':>6} {'wall_s':>8} {'ratio_vs_1':>11} {'ratio_vs_direct':>16}")
    for n, direct, *_ in rows:
        wall = statistics.median(walls[n])
        print(f"{n:>6} {wall:>8.2f} {wall / base:>11.2f} {wall / direct:>16.2f}")
    n, direct = rows[-1][0], rows[-1][1]
    ratio = statistics.median(walls[n]) / direct
    verdict = "met" if ratio <= 2 else "NOT met"
    print(
        f"issue 26's bar: the Ansible path no slower than 2x the direct path at {n} hosts: "
        f"{verdict} ({ratio:.2f}x)."
    )


if __name__ == "__main__":
    sys.exit(main())
