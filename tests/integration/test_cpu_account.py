"""The kernel's CPU accounting as `make test` uses it (tests/cpu_account.py): a group's cgroup
counts every process started in it, and each test's JUnit record carries its own CPU-seconds.
Needs root (creating a cgroup); in CI it must run."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import cpu_account
import pytest
from ci_rule import unavailable
from cpu_account import CpuCgroup
from tiers import junit_times

TESTS = Path(__file__).parents[1]
# Burns `seconds` of CPU in a grandchild: what is counted is the cgroup, not the child's rusage.
BURN = (
    "import subprocess, sys\n"
    "code = 'import time\\nt = time.process_time()\\n'\n"
    "code += 'while time.process_time() - t < {seconds}: pass'\n"
    "subprocess.run([sys.executable, '-c', code], check=True)\n"
)


@pytest.fixture
def cgroup() -> Iterator[CpuCgroup]:
    made = cpu_account.create(f"kvops-test-{os.getpid()}")
    if isinstance(made, str):
        unavailable(f"no cgroup CPU accounting here: {made}")
    try:
        yield made
    finally:
        made.remove()
        assert not made.path.exists(), f"{made.path} left behind"


def test_a_groups_cgroup_counts_the_cpu_of_every_process_started_in_it(cgroup: CpuCgroup) -> None:
    before = cgroup.usage_s()
    assert before is not None
    subprocess.run(
        [sys.executable, "-c", BURN.format(seconds=0.4)], check=True, preexec_fn=cgroup.join
    )
    spent = (cgroup.usage_s() or 0.0) - before
    assert 0.35 <= spent < 5.0, spent


NESTED = """
import subprocess, sys
from cpu_account import from_environment

BURN = {burn!r}

def test_burns():
    group = from_environment()
    assert group is not None
    subprocess.run([sys.executable, "-c", BURN.format(seconds=0.5)], check=True,
                   preexec_fn=group.join)

def test_idles():
    pass
"""


def test_each_test_records_the_cpu_its_groups_processes_used_while_it_ran(
    cgroup: CpuCgroup,
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """This suite's conftest, in-process, in a group cgroup as tests/tiers.py starts it."""
    monkeypatch.setenv(cpu_account.ENV, str(cgroup.path))
    monkeypatch.delenv("CI", raising=False)
    pytester.syspathinsert(TESTS)
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makepyfile(test_nested=NESTED.format(burn=BURN))
    junit = tmp_path / "nested.xml"
    result = pytester.runpytest("-q", "-p", "no:cacheprovider", f"--junitxml={junit}")
    result.assert_outcomes(passed=2)
    cpu = {t.nodeid.rsplit("::", 1)[1]: t.cpu_s for t in junit_times(junit, "nested")}
    assert cpu["test_burns"] is not None and cpu["test_burns"] >= 0.45, cpu
    assert cpu["test_idles"] is not None and cpu["test_idles"] < 0.3, cpu
