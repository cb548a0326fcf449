"""`make test`'s runner: the suite's tiers as parallel pytest processes, one verdict.

The lab tier spends most of its time in Ansible runs against lab hosts (about 1.2 to 1.5 cores
of a 2-core machine, much of it waiting on SSH and the hosts' own processes); the other tiers
are independent of it (their own servers, ports, temporary folders and caches). So the suite
runs as pytest processes side by side (``GROUPS``): the lab tier in two (the shared lab's
tests with some private-lab modules, and the other tests with labs of their own, balanced by
time), and unit + integration + engine. Each writes its
whole output (with its own ``--durations=20``) to a log that is printed in one piece when that
process ends, so they never interleave; the end is a summary per
group and the slowest 20 tests of the whole suite, read from each group's JUnit XML
(https://docs.pytest.org/en/stable/how-to/output.html#creating-junitxml-format-files). Where
cgroups can be created (tests/cpu_account.py), each group runs in its own and the summary adds
its CPU-seconds and the 20 tests that cost the most of them (tests/conftest.py records each
test's as a JUnit property): on 2 cores the suite is CPU-bound, and what a test costs the suite
is its CPU, not its wall time beside the other groups.

Exit status: the first failing group's pytest status (1 tests failed, 2 interrupted, ...);
pytest's 5 ("no tests collected") only when no group collected anything, so ``PYTEST_ARGS``
that select one tier's tests do not fail the other group (https://docs.pytest.org/en/stable/
reference/exit-codes.html). SIGTERM or Ctrl-C is passed on to every group, whose fixtures then
tear their lab hosts and engines down as they would alone (tests/stop_on_sigterm.py).

Before the groups start, the engine tier's cached virtualenv is prepared in the background
(``PREPARE``: tests/engine/install_engine.sh, a no-op once its stamp is there). On a fresh
machine that install is minutes of downloads; the unit and integration tiers run first in their
group (tests/conftest.py orders the tiers), so the engine tests find it ready instead of
waiting for it at the start of their group. Its log is ``prepare.log``; a failed preparation
fails nothing by itself (the engine tier's own fixture runs the installer again and fails
loudly), and one still running when every group has ended is stopped.

What the groups need first (``--setup``, repeatable: `make test` passes the system packages and
the project's virtualenv) runs after the preparation has started and before the groups, one
command after another, its output shown as it comes; the first that fails ends the run with its
status (the preparation is stopped, no group starts). So on a fresh machine the engine
virtualenv's downloads and byte-compiling share the machine with apt and pip's mostly one-core
install of the project instead of with the first minutes of tests.

The lint gates run beside the groups too (``--gate``: `make test` passes `make lint`), not
before them: they are ~45 s of mostly one core (mypy, ansible-lint) that the groups' tests can
share the other core with. They still fail fast: the first test group ends minutes later, and a
failed gate prints its log, stops every group (SIGTERM, so fixtures tear their lab hosts and
engines down) and is the run's exit status. A gate still running when the groups end is waited
for: the verdict needs it.

    python tests/tiers.py [--pytest PATH] [--log-dir DIR] [--no-prepare] [--setup CMD ...]
                          [--gate CMD] [PYTEST ARGS ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Protocol

import cpu_account
from cpu_account import CpuCgroup
from measuring import MEASURING_NICE, autogroup_at, weigh_as_this_session

# (name, marker expression, niceness): every tier in exactly one group (tests/conftest.py's
# TIERS). The lab tier is two groups: its time goes mostly to waiting (SSH round trips, the lab
# hosts' own processes starting), so one lab session leaves the 2 cores partly idle; the tests
# that bring up only their own private labs (marker ``own_lab``: the deploy, MP-server, services
# and absent labs) run in a second lab session, in lab slots of its own (kvops/lab/config.py),
# beside the tests of the shared three-host lab, which is converged once in that session only.
# The lab groups run niced (nice(1): their Ansible runs, SSH sessions and lab hosts inherit it):
# when every group wants the CPU, the scheduler gives it first to the tiers whose tests judge
# timing on this machine (the load generator's own accuracy, the embedded engines' agreement with
# the model, a real vLLM's TTFT), and the lab's Ansible runs, which only take longer, use what is
# left (https://man7.org/linux/man-pages/man7/sched.7.html, "The nice value"). That holds for
# the lab hosts' work too only because the run raises its own autogroup (SESSION_AUTOGROUP_NICE):
# each SSH session on a lab host is an autogroup of its own, where the groups' niceness does not
# weigh (tests/measuring.py says why). Seen before, in a CI-mode run: the load generator's
# accuracy test found its client the bottleneck in 12 tries out of 12 beside the lab. (The group
# that is not niced still ends last, on ~0.7 of a core: it waits more than it computes - real
# engines starting, timed traffic - so its length is its own, not the lab's doing.)
#
# For balance, the private-lab modules marked ``own_lab_b`` (the MP-server, services and absent
# labs) run in the shared lab's session (in slots of their own); the deploy lab's modules (the
# A/B, its gates, and last the shared-store fleet on the same two hosts) are the lab-own group.
# Per module, in CPU-seconds (tests/cpu_account.py, the CI-mode run of 1e338e7): deploy 453,
# deploy_collection 146 (less its A/B, 53, since folded into the fleet's), shared_store 200 (less
# its own lab's converge and first deploy, ~60, since it uses the deploy lab), services 78,
# absent 46; the shared session 786 less the second site run (~42) now read from the installed
# collection's. A fourth process (a third lab session) finished no sooner on 2 cores and slowed
# the tiers that judge timing.
#
# And the other way: the unit+integration+engine group ended last in every CI-mode run (by 50 to
# 160 s: it waits on real engines and timed traffic), the lab-own group first, so integration
# modules without a timing verdict (``beside_lab_own``: Ansible against the ONTAP REST double,
# ONTAP validation, the collection build, the inventory, a campaign's resume; ~100 s in all) run
# in the lab-own process, niced with it.
GROUPS: tuple[tuple[str, str, int], ...] = (
    ("lab-shared", "lab and (not own_lab or own_lab_b)", 10),
    ("lab-own", "(lab and own_lab and not own_lab_b) or beside_lab_own", 10),
    ("unit+integration+engine", "not lab and not beside_lab_own", 0),
)
# The run's own session (its autogroup) ahead of the lab hosts' SSH sessions (above).
SESSION_AUTOGROUP_NICE = MEASURING_NICE
PREPARE: tuple[str, ...] = ("bash", str(Path(__file__).parent / "engine" / "install_engine.sh"))
# The order the tiers run in within one pytest process (tests/conftest.py): the fast ones first,
# so a broken change fails in seconds, and the engine tier after the unit and integration tiers,
# so the virtualenv PREPARE installs in the background on a fresh machine is ready for it.
RUN_ORDER = ("unit", "integration", "engine", "lab")


class _Marked(Protocol):
    def get_closest_marker(self, name: str) -> object | None: ...


def order_by_tier(items: list[_Marked]) -> None:
    """Sort collected tests by RUN_ORDER, in place. Stable: within a tier, pytest's own (file)
    order, so a module's tests stay together and share their module-scoped fixtures."""

    def rank(item: _Marked) -> int:
        for index, tier in enumerate(RUN_ORDER):
            if item.get_closest_marker(tier):
                return index
        return len(RUN_ORDER)

    items.sort(key=rank)


# niced like the lab groups: pip's unpacking must not slow the tiers that judge timing
PREPARE_NICENESS = 10
NO_TESTS_COLLECTED = 5  # pytest.ExitCode.NO_TESTS_COLLECTED
SLOWEST = 20
CPU_PROPERTY = "cpu_s"  # the JUnit property tests/conftest.py records each test's CPU-seconds in
COMMAND_NOT_RUN = 127  # the shell's status for a command it could not run


@dataclass
class Group:
    name: str
    marker: str
    log_path: Path
    junit_path: Path
    niceness: int = 0
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    started_s: float = 0.0
    wall_s: float = 0.0
    returncode: int | None = None
    reported: bool = field(default=False)
    cgroup: CpuCgroup | None = None  # tests/cpu_account.py: the group's CPU-seconds
    cpu_s: float | None = None


@dataclass
class Gate:
    """A check the verdict depends on that is not a test (the lint gates), run beside the groups."""

    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    started_s: float = 0.0
    wall_s: float = 0.0
    returncode: int | None = None

    def start(self) -> None:
        """In a session of its own, so that stopping it stops its children (make's)."""
        self.started_s = time.monotonic()
        _write(f"gate: {shlex.join(self.argv)} (log: {self.log_path})\n")
        with self.log_path.open("wb") as log:
            try:
                self.proc = subprocess.Popen(
                    self.argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env=bytecode_written(),
                )
            except OSError as exc:  # not found, not executable: a failed gate, not a traceback
                log.write(f"cannot run the gate: {exc}\n".encode())
        if self.proc is None:
            self._report(COMMAND_NOT_RUN)

    def poll(self) -> int | None:
        """Its status once it has ended (reported then, once), else None."""
        if self.returncode is not None or self.proc is None:
            return self.returncode
        rc = self.proc.poll()
        if rc is not None:
            self._report(rc)
        return rc

    def stop(self) -> None:
        """Stop it and its children (an interrupted run)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait()

    def _report(self, rc: int) -> None:
        self.returncode = rc
        self.wall_s = time.monotonic() - self.started_s
        bar = "=" * 30
        _write(f"\n{bar} gate {shlex.join(self.argv)} {bar}\n")
        _write(self.log_path.read_text(errors="replace"))
        stopping = "" if rc == 0 else ": stopping the tier groups"
        _write(f"{bar} gate: exit {rc} after {self.wall_s:.0f} s{stopping} {bar}\n")


def bytecode_written() -> dict[str, str]:
    """This environment with Python's bytecode writing on, for the groups and the gate.

    With PYTHONDONTWRITEBYTECODE set (some CI images set it) every Python process recompiles
    what it imports from source (kvops, the tests, pytest's assertion rewriting), and the suite
    starts hundreds (each CLI call, each embedded engine, each Ansible run's kvops plugins).
    Measured here: collecting the suite 7.0 CPU-s against 2.7, CLI-heavy integration modules
    17% fewer CPU-seconds. And `make test` installs .venv without byte-compiling it (Makefile):
    the suite imports a tenth of its files, so each is compiled once, by the first process that
    imports it."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def group_argv(pytest: Sequence[str], group: Group, args: Sequence[str]) -> list[str]:
    """One group's pytest command line: its marker, its JUnit XML, its own cache folder (two
    pytest processes must not overwrite each other's last-failed list)."""
    slug = group.name.replace("+", "-")
    return [
        *pytest,
        "-q",
        f"--durations={SLOWEST}",
        "-m",
        group.marker,
        f"--junitxml={group.junit_path}",
        # the short summary of failures, errors and reruns: a `timing` test's rerun shows why
        # its first run failed (pytest-rerunfailures' "R"; pytest's default is "fE")
        "-rfER",
        "-o",
        f"cache_dir=.pytest_cache/{slug}",
        *args,
    ]


def combined_returncode(returncodes: Sequence[int]) -> int:
    """The suite's status from the groups' (in group order): see the module docstring."""
    failing = [rc for rc in returncodes if rc not in (0, NO_TESTS_COLLECTED)]
    if failing:
        return failing[0]
    if returncodes and all(rc == NO_TESTS_COLLECTED for rc in returncodes):
        return NO_TESTS_COLLECTED
    return 0


@dataclass(frozen=True)
class CaseTime:
    nodeid: str
    seconds: float
    group: str
    cpu_s: float | None = None  # the test's CPU-seconds (tests/conftest.py), where accounted


def junit_times(path: Path, group: str) -> list[CaseTime]:
    """Each test case of a pytest JUnit XML file with its time (setup + call + teardown:
    pytest's default ``junit_duration_report = total``) and its ``cpu_s`` property."""
    if not path.exists():
        return []
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return []
    return [
        CaseTime(
            f"{case.get('classname', '')}::{case.get('name', '')}",
            float(case.get("time") or 0),
            group,
            _cpu_property(case),
        )
        for case in root.iter("testcase")
    ]


def _cpu_property(case: ET.Element) -> float | None:
    for prop in case.iterfind("properties/property"):
        if prop.get("name") == CPU_PROPERTY:
            try:
                return float(prop.get("value") or "")
            except ValueError:
                return None
    return None


def slowest(times: Sequence[CaseTime], count: int = SLOWEST) -> list[CaseTime]:
    return sorted(times, key=lambda t: (-t.seconds, t.nodeid))[:count]


def costliest(times: Sequence[CaseTime], count: int = SLOWEST) -> list[CaseTime]:
    """The tests that cost the machine the most CPU-seconds (only those accounted)."""
    accounted = [t for t in times if t.cpu_s is not None]
    return sorted(accounted, key=lambda t: (-(t.cpu_s or 0.0), t.nodeid))[:count]


@dataclass(frozen=True)
class TierTime:
    tier: str
    tests: int
    seconds: float
    cpu_s: float | None = None  # summed where every test of the tier was accounted


def tier_times(times: Sequence[CaseTime]) -> list[TierTime]:
    """Each tier's test count and summed test time (RUN_ORDER, then "other"), from the test
    cases' ids (``tests.<tier>.<module>::name``, the layout tests/conftest.py marks by): the
    README's table gives them, and a tier that grows shows here first."""
    count: dict[str, int] = {}
    seconds: dict[str, float] = {}
    cpu: dict[str, float | None] = {}
    for t in times:
        parts = t.nodeid.split("::", 1)[0].split(".")
        tier = (
            parts[1]
            if len(parts) > 2 and parts[0] == "tests" and parts[1] in RUN_ORDER
            else "other"
        )
        count[tier] = count.get(tier, 0) + 1
        seconds[tier] = seconds.get(tier, 0.0) + t.seconds
        so_far = cpu.get(tier, 0.0)
        cpu[tier] = None if so_far is None or t.cpu_s is None else so_far + t.cpu_s
    order = [*RUN_ORDER, "other"]
    return [
        TierTime(tier, count[tier], seconds[tier], cpu[tier]) for tier in order if tier in count
    ]


def _child_setup(niceness: int, cgroup: CpuCgroup | None = None) -> Callable[[], None] | None:
    """What the child runs before pytest: lower its own priority by ``niceness`` and enter
    its group's cgroup (a failure to enter leaves it unaccounted, never unstarted)."""
    if niceness == 0 and cgroup is None:
        return None

    def lower() -> None:
        if niceness:
            os.nice(niceness)
        if cgroup is not None:
            with contextlib.suppress(OSError):
                cgroup.join()

    return lower


def _cpu(seconds: float | None) -> str:
    return "" if seconds is None else f"  {seconds:7.0f} CPU-s"


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _report(group: Group) -> None:
    assert group.returncode is not None
    bar = "=" * 30
    nice = f", nice {group.niceness}" if group.niceness else ""
    _write(f"\n{bar} tier group {group.name} (-m {group.marker!r}{nice}) {bar}\n")
    _write(group.log_path.read_text(errors="replace"))
    _write(
        f"{bar} tier group {group.name}: exit {group.returncode} after {group.wall_s:.0f} s {bar}\n"
    )
    group.reported = True


def _start_preparation(command: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
    """The background preparation, in a session of its own so that stopping it stops its
    children (pip) too."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            list(command),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_child_setup(PREPARE_NICENESS),
        )
    _write(f"preparing: {' '.join(command)} (log: {log_path})\n")
    return proc


def _finish_preparation(proc: subprocess.Popen[bytes], started_s: float) -> None:
    """Report the preparation's end, stopping it when no group is left to need it."""
    rc = proc.poll()
    if rc is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        _write("preparation: stopped (no test group left to need it)\n")
        return
    _write(f"preparation: exit {rc} after {time.monotonic() - started_s:.0f} s\n")


def _run_setup(command: Sequence[str]) -> int:
    """One setup command in the foreground (its output is ours); its exit status, 127 when it
    cannot start."""
    _write(f"setup: {shlex.join(command)}\n")
    try:
        rc = subprocess.run(list(command), stdin=subprocess.DEVNULL, check=False).returncode
    except OSError as exc:
        _write(f"cannot run the setup command {shlex.join(command)}: {exc}\n")
        return 127
    if rc != 0:
        _write(f"setup: {shlex.join(command)} failed (exit {rc}); no test ran\n")
    return rc


def run(
    pytest: Sequence[str],
    log_dir: Path,
    args: Sequence[str],
    prepare: Sequence[str] | None = None,
    gate: Sequence[str] | None = None,
    setup: Sequence[Sequence[str]] = (),
) -> int:
    log_dir.mkdir(parents=True, exist_ok=True)
    groups = [
        Group(
            name,
            marker,
            log_dir / f"{name.replace('+', '-')}.log",
            log_dir / f"{name.replace('+', '-')}.xml",
            niceness,
        )
        for name, marker, niceness in GROUPS
    ]
    for group in groups:
        group.junit_path.unlink(missing_ok=True)

    received: list[int] = []

    def _stop_groups() -> None:
        for group in groups:
            if group.proc is not None and group.proc.poll() is None:
                group.proc.send_signal(signal.SIGTERM)

    def _forward(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        _stop_groups()

    previous = {s: signal.signal(s, _forward) for s in (signal.SIGTERM, signal.SIGINT)}
    accounting = cpu_account.create(f"kvops-tiers-{os.getpid()}")
    if isinstance(accounting, str):
        _write(f"CPU accounting: unavailable ({accounting}); wall times only\n")
    else:
        for group in groups:
            group.cgroup = accounting.child(group.name.replace("+", "-"))
    started = time.monotonic()
    preparation = None if prepare is None else _start_preparation(prepare, log_dir / "prepare.log")
    prepared_s: float | None = None
    checks = None if gate is None else Gate(list(gate), log_dir / "gate.log")
    stopped_for_the_gate = False
    session_ahead_of_the_lab_hosts = contextlib.ExitStack()
    try:
        session_ahead_of_the_lab_hosts.enter_context(autogroup_at(SESSION_AUTOGROUP_NICE))
        if preparation is not None:
            # its own session, so its own autogroup: as much weight as the run's, as before the
            # run raised its own (niced inside it; a fresh machine's engine tier waits for it)
            weigh_as_this_session(preparation.pid)
        for command in setup:
            rc = _run_setup(command)
            if received:
                return 128 + received[0]
            if rc != 0:
                return rc
        if checks is not None:
            checks.start()
            if checks.proc is not None:
                weigh_as_this_session(checks.proc.pid)  # its own session: the run's weight
        for group in groups:
            group.log = group.log_path.open("wb")
            group.started_s = time.monotonic()
            env = bytecode_written()
            if group.cgroup is not None:
                env[cpu_account.ENV] = str(group.cgroup.path)
            group.proc = subprocess.Popen(
                group_argv(pytest, group, args),
                stdout=group.log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_child_setup(group.niceness, group.cgroup),
                env=env,
            )
            _write(f"tier group {group.name}: started (log: {group.log_path})\n")
        while not all(g.reported for g in groups):
            for group in groups:
                if group.reported or group.proc is None:
                    continue
                rc = group.proc.poll()
                if rc is None:
                    continue
                group.returncode = rc
                group.wall_s = time.monotonic() - group.started_s
                if group.cgroup is not None:
                    group.cpu_s = group.cgroup.usage_s()
                if group.log is not None:
                    group.log.close()
                _report(group)
            if preparation is not None and prepared_s is None and preparation.poll() is not None:
                prepared_s = time.monotonic()
                _finish_preparation(preparation, started)
            if checks is not None and not stopped_for_the_gate and checks.poll() not in (None, 0):
                stopped_for_the_gate = True
                _stop_groups()  # fail fast: every group stops and tears its labs down
            time.sleep(0.5)
        # a gate still running: the verdict waits for it (its own session: Ctrl-C reaches it
        # only through `received`, and the finally stops it)
        while checks is not None and checks.poll() is None and not received:
            time.sleep(0.2)
    finally:
        session_ahead_of_the_lab_hosts.close()
        if checks is not None:
            checks.stop()
        if preparation is not None and prepared_s is None:
            _finish_preparation(preparation, started)
        for group in groups:
            if group.proc is not None and group.proc.poll() is None:
                group.proc.send_signal(signal.SIGTERM)
                group.proc.wait()
            if group.log is not None and not group.log.closed:
                group.log.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if not isinstance(accounting, str):
            accounting.remove()

    _write("\n" + "=" * 30 + " tier groups " + "=" * 30 + "\n")
    for group in groups:
        _write(
            f"{group.name:<26} exit {group.returncode}  {group.wall_s:7.0f} s{_cpu(group.cpu_s)}\n"
        )
    if checks is not None:
        status = "stopped" if checks.returncode is None else f"exit {checks.returncode}"
        _write(f"{'gate':<26} {status}  {checks.wall_s:7.0f} s\n")
    whole = f"{'whole suite (in parallel)':<26}         {time.monotonic() - started:7.0f} s"
    if all(g.cpu_s is not None for g in groups):
        cores = os.cpu_count() or 1
        total = sum(g.cpu_s or 0.0 for g in groups)
        whole += f"{_cpu(total)} ({total / cores:.0f} s of work for each of {cores} cores)"
    _write(whole + "\n")
    times = [t for g in groups for t in junit_times(g.junit_path, g.name)]
    if times:
        _write(f"\nslowest {SLOWEST} tests of the whole suite (setup + call + teardown):\n")
        for t in slowest(times):
            _write(f"{t.seconds:9.2f} s  {t.nodeid}  [{t.group}]\n")
        costly = costliest(times)
        if costly:
            _write(f"\ncostliest {SLOWEST} tests in CPU-seconds (all the processes each ran):\n")
            for t in costly:
                _write(f"{t.cpu_s:9.1f} CPU-s  {t.seconds:7.1f} s  {t.nodeid}  [{t.group}]\n")
        _write("\neach tier's tests, their time summed (the groups ran side by side):\n")
        for tier in tier_times(times):
            _write(
                f"{tier.tier:<12} {tier.tests:6,} tests  {tier.seconds:8.0f} s{_cpu(tier.cpu_s)}\n"
            )
    if received:
        return 128 + received[0]
    if checks is not None and checks.returncode:
        return checks.returncode
    return combined_returncode([g.returncode if g.returncode is not None else 1 for g in groups])


def _command(parser: argparse.ArgumentParser, option: str, text: str) -> list[str]:
    """An option's command line split as a shell would (no shell runs it); a usage error, not a
    traceback, when it is empty or has an unbalanced quote."""
    try:
        command = shlex.split(text)
    except ValueError as exc:
        parser.error(f"{option} {text!r}: {exc}")
    if not command:
        parser.error(f"{option} needs a command")
    return command


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--pytest", default=str(Path(sys.executable).parent / "pytest"))
    parser.add_argument("--log-dir", type=Path, default=Path("runs") / "test-tiers")
    parser.add_argument(
        "--no-prepare",
        action="store_true",
        help="do not install the engine tier's virtualenv in the background",
    )
    parser.add_argument(
        "--setup",
        metavar="CMD",
        action="append",
        default=[],
        help="a command the groups need first (make test: the system packages, the project's "
        "virtualenv), run after the preparation starts; repeatable, in order; a failure ends the "
        "run with its status",
    )
    parser.add_argument(
        "--gate",
        metavar="CMD",
        help="a command the verdict also needs (make test: make lint), run beside the groups; "
        "its failure stops them and is the exit status",
    )
    known, rest = parser.parse_known_args(argv)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    prepare = None if known.no_prepare else PREPARE
    gate = None if known.gate is None else _command(parser, "--gate", known.gate)
    setup = [_command(parser, "--setup", text) for text in known.setup]
    return run([known.pytest], known.log_dir, rest, prepare, gate, setup)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
