"""What one Ansible task costs the machine, in CPU-seconds, by kind: the unit the lab tier pays in.

`make test` is CPU-bound on 2 cores and most of its CPU goes to the lab's Ansible runs
(tests/tiers.py prints each test's CPU-seconds). This measures, against a real OpenSSH server
on 127.0.0.1 (ControlPersist, pipelining: the settings of ansible.cfg), plays of N identical
tasks of each kind, and prints the CPU per task of each as a ratio against `raw` (one SSH round
trip and a shell, no Python on the host) measured in the same run:

- ``set_fact``: the controller's own work per task (a worker fork, templating, callbacks);
- ``raw``: that plus the round trip;
- ``command`` and ``stat``: that plus a Python module run on the host (AnsiballZ: the module
  and ansible.module_utils imported from a zip on every task);
- ``stat_cached``: ``stat`` with the lab hosts' bytecode cache for zip imports
  (tests/lab/files/kvops_lab_zip_bytecode.py, loaded here through a sitecustomize on the
  module's PYTHONPATH instead of the lab's .pth line): what the cache takes off a lab task.

CPU is everything the play made run (ansible-playbook and its forks, ssh, sshd, the module's
Python): the benchmark's own cgroup where one can be created (root; tests/cpu_account.py),
else the whole machine's busy time (/proc/stat; keep the machine quiet). An empty play's start
is printed apart and taken off every play.

    python benchmarks/ansible_task_cost.py [--tasks 20] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "integration")]

import cpu_account  # noqa: E402
from local_sshd import keygen, sshd_available, start_sshd  # noqa: E402

KINDS = {
    "set_fact": "ansible.builtin.set_fact:\n        kvops_bench: 1",
    "raw": "ansible.builtin.raw: 'true'",
    "command": "ansible.builtin.command: 'true'\n      changed_when: false",
    "stat": "ansible.builtin.stat:\n        path: /",
}
REFERENCE = "raw"
# The lab hosts' zip bytecode cache, installed for one kind of play (see the docstring).
ZIP_CACHE_HOOK = ROOT / "tests" / "lab" / "files"
CACHED_KINDS = {"stat_cached": "stat"}


def _machine_busy_s() -> float:
    with open("/proc/stat") as stat:
        ticks = [int(v) for v in stat.readline().split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"must be 1 to 1000, got {value}")
    return value


def _play(path: Path, kind: str, tasks: int, pythonpath: Path | None = None) -> Path:
    """A play of ``tasks`` tasks of ``kind``; with ``pythonpath``, its modules' PYTHONPATH."""
    body = "".join(f"    - name: Task {i}\n      {KINDS[kind]}\n" for i in range(tasks))
    env = f"  environment:\n    PYTHONPATH: {pythonpath}\n" if pythonpath else ""
    path.write_text(
        f"---\n- name: {kind}\n  hosts: all\n  gather_facts: false\n{env}  tasks:\n{body}"
    )
    return path


def _zip_cache_site(folder: Path) -> Path:
    """A sitecustomize that installs the lab's zip bytecode cache (cache under ``folder``)."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ZIP_CACHE_HOOK)!r})\n"
        "import kvops_lab_zip_bytecode\n"
        f"kvops_lab_zip_bytecode.install({str(folder / 'cache')!r})\n"
    )
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=_positive, default=20, help="tasks per play (default 20)")
    parser.add_argument("--repeat", type=_positive, default=3, help="plays of each kind (median)")
    args = parser.parse_args()
    if not sshd_available():
        print("needs OpenSSH's sshd (apt-get install openssh-server)", file=sys.stderr)
        return 2
    accounting = cpu_account.create(f"kvops-bench-{os.getpid()}")
    if isinstance(accounting, str):
        print(f"CPU: the whole machine's busy time ({accounting}); keep the machine quiet")
        busy_s = _machine_busy_s
    else:
        accounting.join()  # this process; ansible-playbook, ssh and sshd start in it
        group = accounting

        def busy_s() -> float:
            return group.usage_s() or 0.0

    work = Path(tempfile.mkdtemp(prefix="kvops-ansible-cost-"))
    client_key = work / "id_ed25519"
    keygen(client_key)
    sshd = start_sshd(work / "sshd", [client_key.with_suffix(".pub").read_text().strip()])
    try:
        known = work / "known_hosts"
        known.write_text(sshd.known_hosts_line)
        inventory = work / "hosts.ini"
        inventory.write_text(
            f"bench ansible_host=127.0.0.1 ansible_port={sshd.port} ansible_user=root "
            f"ansible_ssh_private_key_file={client_key} "
            f"ansible_python_interpreter=/usr/bin/python3 "
            f"ansible_ssh_common_args='-o UserKnownHostsFile={known} "
            "-o StrictHostKeyChecking=yes'\n"
        )
        env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
        playbook = str(Path(sys.executable).parent / "ansible-playbook")

        def cpu_of(play: Path) -> float:
            start = busy_s()
            proc = subprocess.run(
                [playbook, "-i", str(inventory), str(play)],
                capture_output=True, text=True, env=env, cwd=ROOT, check=False,
            )  # fmt: skip
            if proc.returncode != 0:
                raise SystemExit(f"{play.name} failed:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
            return busy_s() - start

        empty = _play(work / "empty.yml", "raw", 0)
        plays = {kind: _play(work / f"{kind}.yml", kind, args.tasks) for kind in KINDS}
        site = _zip_cache_site(work / "zip-cache-site")
        for cached, kind in CACHED_KINDS.items():
            plays[cached] = _play(work / f"{cached}.yml", kind, args.tasks, site)
        cpu_of(plays["raw"])  # warm-up: the ControlPersist master, the page cache
        for cached in CACHED_KINDS:
            cpu_of(plays[cached])  # and the cache itself, warm on a lab host after one task
        start_s: list[float] = []
        per_task: dict[str, list[float]] = {kind: [] for kind in plays}
        for _ in range(args.repeat):  # kinds interleaved, so drifting load hits all alike
            start_s.append(cpu_of(empty))
            for kind, play in plays.items():
                per_task[kind].append(cpu_of(play))
        started = statistics.median(start_s)
        print(f"an empty play starts in {started:.2f} CPU-s (taken off each play below)")
        reference = (statistics.median(per_task[REFERENCE]) - started) / args.tasks
        print(f"{'task':<12} {'CPU-s per task':>15} {'vs ' + REFERENCE:>8}")
        for kind, samples in per_task.items():
            cost = (statistics.median(samples) - started) / args.tasks
            print(f"{kind:<12} {cost:15.3f} {cost / reference:7.1f}x")
        print(
            f"({args.tasks} tasks per play, median of {args.repeat}; one host on 127.0.0.1; "
            f"load average {os.getloadavg()[0]:.1f})"
        )
    finally:
        sshd.stop()
        if not isinstance(accounting, str):
            accounting.close()  # ssh's ControlPersist master would linger 60 s in it
    return 0


if __name__ == "__main__":
    sys.exit(main())
