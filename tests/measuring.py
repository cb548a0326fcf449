"""Measuring beside `make test`'s lab groups: a test that judges kvops' own timing (the load
generator's error, the embedded engines' agreement with the model) runs its measurement ahead of
the niced lab groups (tests/tiers.py), so that what it judges is kvops, not how long the
scheduler let the neighbours' Ansible runs hold the 2 cores.

Niceness alone does not put it ahead of the lab hosts. With autogroup scheduling (Linux's
default where CONFIG_SCHED_AUTOGROUP is on: /proc/sys/kernel/sched_autogroup_enabled = 1), the
CPU is first shared fairly between autogroups, one per session, and a nice value weighs only
inside its own autogroup (https://man7.org/linux/man-pages/man7/sched.7.html, "The autogroup
feature"). Every lab host runs in a session of its own, and sshd starts a new session for each
SSH login: every Ansible task on a lab host runs in a fresh autogroup with full weight, whatever
the niceness of the lab group that sent it. So the measurement also raises the weight of its own
autogroup (make test's session) by writing its nice value to /proc/self/autogroup, and sets it
back afterwards (tests/tiers.py does the same for the whole run).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

# Raising a priority needs root (CAP_SYS_NICE,
# https://man7.org/linux/man-pages/man2/setpriority.2.html); elsewhere the measurement runs at
# its inherited priority, and a client delayed by its neighbours still flags itself.
MEASURING_NICE = -10
AUTOGROUP = Path("/proc/self/autogroup")
_AUTOGROUP_NICE = re.compile(r"\bnice\s+(-?\d+)\s*$")


def autogroup_nice(text: str) -> int | None:
    """The nice value in /proc/<pid>/autogroup's ``/autogroup-<id> nice <n>``."""
    match = _AUTOGROUP_NICE.search(text.strip())
    return int(match.group(1)) if match else None


def _set_autogroup_nice(nice: int, pid: int | None = None) -> None:
    """Of this session's autogroup, or of the one process ``pid`` leads."""
    (AUTOGROUP if pid is None else Path(f"/proc/{pid}/autogroup")).write_text(f"{nice}\n")


@contextlib.contextmanager
def autogroup_at(nice: int) -> Iterator[None]:
    """This session's autogroup at ``nice`` where the kernel has autogroups and permits it."""
    try:
        before = autogroup_nice(AUTOGROUP.read_text())
        if before is None:
            raise OSError("no autogroup nice value")
        _set_autogroup_nice(nice)
    except OSError:  # no autogroup support, autogroups off, or not permitted
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            _set_autogroup_nice(before)


def weigh_as_this_session(pid: int) -> None:
    """Give a child started in a session of its own (``start_new_session``: so that it and its
    children are stopped together) this session's autogroup weight, where permitted: a new
    session starts a new autogroup at nice 0 (tests/tiers.py's background engine install).
    Not used for the engines the tests start: tried for the real vLLMs, LMCache's server and
    `kvops sim serve` in one CI-mode run, it shortened the engine tier (vLLM starts 62-91 s
    instead of 83-156 s) by taking the CPU from the lab's own A/B, whose engines run in the lab
    hosts' sessions: that A/B read "no significant difference", +43 % [-49 %, +296 %], and
    passed only on its rerun."""
    try:
        nice = autogroup_nice(AUTOGROUP.read_text())
        if nice is not None:
            _set_autogroup_nice(nice, pid)
    except OSError:  # no autogroups, not permitted, or the child is gone
        pass


@contextlib.contextmanager
def weighed_as_this_session(*pids: int) -> Iterator[None]:
    """While a test measures engines it started in sessions of their own (a real vLLM, LMCache's
    server: so that each stops with its children), their autogroups weigh as this session's;
    afterwards as they did. Only for the measurement, seconds: held for the whole engine tier
    it took the CPU from the lab's own A/B (weigh_as_this_session). Where autogroups are off,
    absent or not permitted, nothing changes (nice values then order the groups)."""
    restore: list[tuple[int, int]] = []
    for pid in pids:
        try:
            before = autogroup_nice(Path(f"/proc/{pid}/autogroup").read_text())
        except OSError:  # no autogroups, or this engine is gone
            continue
        if before is not None:
            weigh_as_this_session(pid)
            restore.append((pid, before))
    try:
        yield
    finally:
        for pid, before in restore:
            with contextlib.suppress(OSError):
                _set_autogroup_nice(before, pid)


@contextlib.contextmanager
def ahead_of_the_lab_groups() -> Iterator[None]:
    """This thread, and the processes it starts meanwhile, at MEASURING_NICE where permitted,
    in an autogroup weighted as MEASURING_NICE too."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, MEASURING_NICE)
    except PermissionError:
        yield
        return
    try:
        with autogroup_at(MEASURING_NICE):
            yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)
