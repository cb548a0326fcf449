"""CPU-seconds of a tier group and of each of its tests, from the kernel's cgroup accounting.

`make test` is CPU-bound on a 2-core machine: the tier groups run side by side (tests/tiers.py)
and a test's wall time says as much about what the other groups did at that moment as about the
test. Its CPU-seconds do not: they are the work it costs the suite, whichever group it is in.
tests/tiers.py puts each group's pytest in a cgroup of its own; every process it starts stays in
that cgroup (a child starts in its parent's cgroup: https://docs.kernel.org/admin-guide/cgroup-v2.html
"Processes"), so the group's counter sums pytest, ansible-playbook and its forks, the lab hosts'
sshd and Ansible modules, the engines - everything the group's tests made the machine do.

cgroup v1's ``cpuacct.usage`` (nanoseconds, https://docs.kernel.org/admin-guide/cgroup-v1/cpuacct.html)
or v2's ``cpu.stat`` ``usage_usec``. Creating a cgroup needs root; where it is not possible the
suite runs as before and says why it has no CPU figures.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# The environment variable that names a test process's group cgroup (set by tests/tiers.py).
ENV = "KVOPS_CPU_CGROUP"


@dataclass(frozen=True)
class CpuCgroup:
    path: Path
    version: int  # 1: the cpuacct hierarchy, 2: the unified one

    def usage_s(self) -> float | None:
        """CPU-seconds used by the processes of this cgroup and its children, ever."""
        try:
            if self.version == 1:
                return int((self.path / "cpuacct.usage").read_text()) / 1e9
            return usage_usec(self.path / "cpu.stat") / 1e6
        except (OSError, ValueError):
            return None

    def join(self) -> None:
        """Move the calling process into this cgroup (its later children start in it)."""
        (self.path / "cgroup.procs").write_text("0\n")

    def child(self, name: str) -> CpuCgroup:
        path = self.path / name
        path.mkdir(exist_ok=True)
        return CpuCgroup(path, self.version)

    def close(self) -> None:
        """For a cgroup this process joined: move it back to the parent, stop what is left (its
        own children's leftovers, such as ssh's ControlPersist master), remove the cgroup."""
        (self.path.parent / "cgroup.procs").write_text("0\n")
        for pid in (self.path / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGTERM)
        deadline = time.monotonic() + 10
        while (self.path / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.remove()

    def remove(self) -> None:
        """Remove this cgroup and its child cgroups, leaving any that still have processes."""
        for sub in sorted(self.path.iterdir(), reverse=True):
            if sub.is_dir():
                CpuCgroup(sub, self.version).remove()
        with contextlib.suppress(OSError):
            self.path.rmdir()


def usage_usec(cpu_stat: Path) -> int:
    for line in cpu_stat.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value)
    raise ValueError(f"no usage_usec in {cpu_stat}")


def own_path(proc_cgroup: str, version: int) -> str | None:
    """The cgroup path of a process for the cpuacct (v1) or unified (v2) hierarchy, from the
    text of /proc/<pid>/cgroup (``hierarchy-id:controller-list:path`` lines)."""
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if version == 1 and "cpuacct" in controllers.split(","):
            return path
        if version == 2 and hierarchy == "0" and controllers == "":
            return path
    return None


def _mounted() -> tuple[Path, int] | None:
    """The hierarchy to account in: v1's cpuacct where it is mounted, else a unified (v2) one."""
    v1 = CGROUP_ROOT / "cpuacct"
    if (v1 / "cpuacct.usage").exists():
        return v1, 1
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return CGROUP_ROOT, 2
    return None


def create(name: str) -> CpuCgroup | str:
    """A new cgroup ``name`` beside this process's own, or why there can be none."""
    mounted = _mounted()
    if mounted is None:
        return f"no cgroup CPU accounting is mounted under {CGROUP_ROOT}"
    root, version = mounted
    try:
        own = own_path(Path("/proc/self/cgroup").read_text(), version)
    except OSError as exc:
        return f"cannot read /proc/self/cgroup: {exc}"
    if own is None:
        return "this process's cgroup is not in /proc/self/cgroup"
    cgroup = CpuCgroup(root / own.lstrip("/") / name, version)
    try:
        cgroup.path.mkdir(exist_ok=True)
    except OSError as exc:
        return f"cannot create a cgroup in {cgroup.path.parent}: {exc.strerror or exc}"
    if cgroup.usage_s() is None:
        cgroup.remove()
        return f"the cgroup {cgroup.path} has no CPU usage counter"
    return cgroup


def from_environment() -> CpuCgroup | None:
    """The group cgroup tests/tiers.py started this process in (``KVOPS_CPU_CGROUP``)."""
    named = os.environ.get(ENV, "")
    if not named:
        return None
    path = Path(named)
    version = 1 if (path / "cpuacct.usage").exists() else 2
    cgroup = CpuCgroup(path, version)
    return cgroup if cgroup.usage_s() is not None else None
