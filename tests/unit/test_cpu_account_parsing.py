"""What `make test` reads of the kernel's CPU accounting and of the JUnit files: the pure parts
of tests/cpu_account.py and tests/tiers.py."""

from __future__ import annotations

from pathlib import Path

from cpu_account import own_path, usage_usec
from tiers import CaseTime, TierTime, costliest, junit_times, tier_times

# /proc/self/cgroup of a process on a host with both hierarchies mounted (cgroups(7): one
# "hierarchy-ID:controller-list:cgroup-path" line per hierarchy; "0::" is the unified one)
PROC_CGROUP = """\
9:name=systemd:/
4:memory:/process_api/9c1ab62a
2:cpu,cpuacct:/kvops-tiers-41/lab-own
0::/user.slice/session-3.scope
"""


def test_the_cgroup_of_each_hierarchy_is_read_from_proc() -> None:
    assert own_path(PROC_CGROUP, 1) == "/kvops-tiers-41/lab-own"
    assert own_path(PROC_CGROUP, 2) == "/user.slice/session-3.scope"
    assert own_path("9:name=systemd:/\n", 1) is None


def test_the_unified_hierarchy_counts_microseconds(tmp_path: Path) -> None:
    stat = tmp_path / "cpu.stat"
    stat.write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    assert usage_usec(stat) == 2_500_000


def test_the_costliest_tests_are_those_accounted_with_the_most_cpu() -> None:
    times = [
        CaseTime("a::t1", 30.0, "lab-own", 2.0),
        CaseTime("b::t2", 5.0, "lab-shared", 40.0),
        CaseTime("c::t3", 50.0, "rest"),  # not accounted: never listed
        CaseTime("d::t4", 1.0, "rest", 9.5),
    ]
    assert [t.nodeid for t in costliest(times, 2)] == ["b::t2", "d::t4"]
    assert costliest([CaseTime("c::t3", 50.0, "rest")]) == []


def test_a_tiers_cpu_is_summed_only_when_every_test_was_accounted() -> None:
    times = [
        CaseTime("tests.unit.test_a::t1", 1.0, "rest", 0.5),
        CaseTime("tests.unit.test_a::t2", 2.0, "rest", 1.0),
        CaseTime("tests.lab.test_b::t3", 9.0, "lab-own", 20.0),
        CaseTime("tests.lab.test_b::t4", 1.0, "lab-own"),
    ]
    assert tier_times(times) == [TierTime("unit", 2, 3.0, 1.5), TierTime("lab", 2, 10.0, None)]


def test_a_tests_cpu_seconds_are_read_from_its_junit_property(tmp_path: Path) -> None:
    junit = tmp_path / "g.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.lab.test_x" name="t1" time="12.5">'
        '<properties><property name="cpu_s" value="31.4"/></properties></testcase>'
        '<testcase classname="tests.lab.test_x" name="t2" time="1.0"/>'
        '<testcase classname="tests.lab.test_x" name="t3" time="1.0">'
        '<properties><property name="cpu_s" value="n/a"/></properties></testcase>'
        "</testsuite></testsuites>"
    )
    assert [(t.nodeid, t.seconds, t.cpu_s) for t in junit_times(junit, "lab-own")] == [
        ("tests.lab.test_x::t1", 12.5, 31.4),
        ("tests.lab.test_x::t2", 1.0, None),
        ("tests.lab.test_x::t3", 1.0, None),
    ]
