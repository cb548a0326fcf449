"""`make test`'s runner (tests/tiers.py): tier groups in parallel, one verdict, readable output."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest
from tiers import (
    GROUPS,
    NO_TESTS_COLLECTED,
    PREPARE_NICENESS,
    CaseTime,
    Group,
    TierTime,
    combined_returncode,
    group_argv,
    junit_times,
    main,
    order_by_tier,
    run,
    slowest,
    tier_times,
)

SUITE = """
import os
import time
import pytest

def _niced_by():
    return os.nice(0) - int(os.environ["KVOPS_TEST_OUTER_NICE"])

@pytest.mark.lab
def test_in_the_lab():
    time.sleep(0.3)
    assert _niced_by() == {lab_nice}

@pytest.mark.lab
@pytest.mark.own_lab
def test_in_an_own_lab():
    assert _niced_by() == {lab_nice}

def test_passes():
    assert _niced_by() == {rest_nice}

def test_fails():
    assert 1 + 1 == 3, "arithmetic"
"""


def test_every_tier_runs_in_exactly_one_group(pytestconfig: pytest.Config) -> None:
    tiers = [line.split(":", 1)[0].strip() for line in pytestconfig.getini("markers")]
    assert {"unit", "integration", "lab", "engine", "own_lab", "own_lab_b"} <= set(tiers)
    combined = [
        {"lab", "own_lab"},
        {"lab", "own_lab", "own_lab_b"},
        {"integration", "beside_lab_own"},
    ]
    for marks in [{tier} for tier in tiers] + combined:
        selected = [name for name, marker, _ in GROUPS if _selects(marker, marks)]
        assert len(selected) == 1, (marks, selected)


def _selects(marker: str, marks: set[str]) -> bool:
    """Evaluate a group's marker expression for a test carrying exactly ``marks``."""
    from _pytest.mark.expression import Expression

    return bool(Expression.compile(marker).evaluate(lambda name, **kwargs: name in marks))


@pytest.mark.parametrize(
    ("codes", "expected"),
    [
        ([0, 0], 0),
        ([1, 0], 1),
        ([0, 1], 1),
        ([2, 1], 2),  # the first failing group's status, in group order
        ([0, NO_TESTS_COLLECTED], 0),  # arguments that select one group's tests only
        ([NO_TESTS_COLLECTED, 1], 1),
        ([NO_TESTS_COLLECTED, NO_TESTS_COLLECTED], NO_TESTS_COLLECTED),
    ],
)
def test_the_suite_fails_when_any_group_fails(codes: list[int], expected: int) -> None:
    assert combined_returncode(codes) == expected


def test_a_groups_command_line_keeps_the_durations_and_the_callers_arguments(
    tmp_path: Path,
) -> None:
    group = Group("unit+integration+engine", "not lab", tmp_path / "g.log", tmp_path / "g.xml")
    argv = group_argv(["pytest"], group, ["-x", "-k", "smoke"])
    assert argv[:4] == ["pytest", "-q", "--durations=20", "-m"]
    assert argv[4] == "not lab"
    assert f"--junitxml={tmp_path / 'g.xml'}" in argv
    assert "-rfER" in argv  # a rerun's reason is in the group's log
    assert "cache_dir=.pytest_cache/unit-integration-engine" in argv
    assert argv[-3:] == ["-x", "-k", "smoke"]


def test_slowest_orders_by_time_across_groups() -> None:
    times = [
        CaseTime("a::t1", 1.0, "lab"),
        CaseTime("b::t2", 9.0, "rest"),
        CaseTime("c::t3", 5.0, "lab"),
    ]
    assert [t.nodeid for t in slowest(times, 2)] == ["b::t2", "c::t3"]


def test_each_tiers_time_is_summed_from_the_test_ids() -> None:
    times = [
        CaseTime("tests.unit.test_a::t1", 1.0, "rest"),
        CaseTime("tests.lab.test_b::t2", 9.0, "lab-own"),
        CaseTime("tests.unit.test_c::t3", 2.5, "rest"),
        CaseTime("tests.lab.test_d::t4", 1.0, "lab-shared"),
        CaseTime("test_suite::t5", 0.5, "rest"),
    ]
    assert tier_times(times) == [
        TierTime("unit", 2, 3.5),
        TierTime("lab", 2, 10.0),
        TierTime("other", 1, 0.5),
    ]


@pytest.fixture
def nested_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The nested suite; its tests also check each group's niceness relative to this process."""
    nice = {name: niceness for name, _, niceness in GROUPS}
    lab_nice = nice.pop("lab-shared")
    assert nice.pop("lab-own") == lab_nice
    [rest_nice] = nice.values()
    pytester.makeini("[pytest]\nmarkers =\n    lab: lab tier\n    own_lab: labs of its own\n")
    suite = SUITE.replace("{lab_nice}", str(lab_nice)).replace("{rest_nice}", str(rest_nice))
    pytester.makepyfile(test_suite=suite)
    monkeypatch.setenv("KVOPS_TEST_OUTER_NICE", str(os.nice(0)))


def test_parallel_groups_report_each_log_whole_and_the_first_failure(
    nested_suite: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "logs"
    rc = run([sys.executable, "-m", "pytest"], logs, [])
    out = capsys.readouterr().out
    assert rc == 1  # the unit group's failure fails the suite
    lab_log = (logs / "lab-shared.log").read_text()
    own_log = (logs / "lab-own.log").read_text()
    rest_log = (logs / "unit-integration-engine.log").read_text()
    assert "1 passed, 3 deselected" in lab_log
    assert "1 passed, 3 deselected" in own_log
    assert "1 failed, 1 passed, 2 deselected" in rest_log
    for log in (lab_log, own_log, rest_log):
        assert "slowest 20 durations" in log
        assert log in out  # printed in one piece, not interleaved with another group's
    assert "tier group lab-shared: exit 0" in out
    assert "tier group lab-own: exit 0" in out
    assert "tier group unit+integration+engine: exit 1" in out
    slow = out.split("slowest 20 tests of the whole suite", 1)[1].splitlines()
    assert re.search(r"^other +4 tests +\d+ s$", out.split("each tier's tests", 1)[1], re.M)
    assert "test_suite::test_in_the_lab" in slow[1] and "[lab-shared]" in slow[1]
    assert len(junit_times(logs / "lab-shared.xml", "lab")) == 1
    assert len(junit_times(logs / "lab-own.xml", "lab")) == 1
    assert len(junit_times(logs / "unit-integration-engine.xml", "x")) == 2


def test_arguments_that_select_one_groups_tests_do_not_fail_the_other(
    nested_suite: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = run([sys.executable, "-m", "pytest"], tmp_path / "logs", ["-k", "passes"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"tier group lab-shared: exit {NO_TESTS_COLLECTED}" in out
    assert f"tier group lab-own: exit {NO_TESTS_COLLECTED}" in out


def test_the_preparation_runs_beside_the_groups_and_is_reported(
    nested_suite: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "logs"
    prepare = [sys.executable, "-c", "import os; print('prepared at nice', os.nice(0))"]
    run([sys.executable, "-m", "pytest"], logs, ["-k", "passes"], prepare)
    out = capsys.readouterr().out
    assert "preparation: exit 0" in out, out
    niced = int((logs / "prepare.log").read_text().split()[-1])
    assert niced - os.nice(0) == PREPARE_NICENESS


def test_a_preparation_still_running_at_the_end_is_stopped_with_its_children(
    nested_suite: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pid_file = tmp_path / "child.pid"
    # a shell whose child outlives a signal to the shell alone: as pip under install_engine.sh
    prepare = ["bash", "-c", f"sleep 300 & echo $! > {pid_file}; wait"]
    rc = run([sys.executable, "-m", "pytest"], tmp_path / "logs", ["-k", "passes"], prepare)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "preparation: stopped (no test group left to need it)" in out
    _assert_gone(int(pid_file.read_text()), "the preparation's child outlived it")


def _assert_gone(pid: int, why: str) -> None:
    """The process ``pid`` ends (or is a zombie) within 5 s."""
    for _ in range(50):
        if not Path(f"/proc/{pid}").exists() or "Z" in _state(pid):
            return
        time.sleep(0.1)
    pytest.fail(f"{why} (pid {pid})")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


class _Item:
    """What the tier ordering reads of a collected test: its tier marker."""

    def __init__(self, name: str, tier: str) -> None:
        self.name, self.tier = name, tier

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == self.tier else None


def test_the_engine_tier_runs_after_unit_and_integration_and_files_keep_their_order() -> None:
    items = [
        _Item("engine-a", "engine"),
        _Item("engine-b", "engine"),
        _Item("integration-a", "integration"),
        _Item("lab-a", "lab"),
        _Item("unit-a", "unit"),
        _Item("unit-b", "unit"),
    ]
    order_by_tier(items)
    assert [i.name for i in items] == [
        "unit-a", "unit-b", "integration-a", "engine-a", "engine-b", "lab-a",
    ]  # fmt: skip


SLOW_SUITE = """
import time
import pytest

@pytest.mark.lab
def test_slow_in_the_lab():
    time.sleep(60)

def test_slow_elsewhere():
    time.sleep(60)
"""


def test_a_failing_gate_stops_every_group_and_is_the_exit_status(
    pytester: pytest.Pytester, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """make test's lint runs beside the groups and still fails fast: its log is shown and no
    group runs on to its end."""
    pytester.makeini("[pytest]\nmarkers =\n    lab: lab tier\n    own_lab: labs of its own\n")
    pytester.makepyfile(test_slow=SLOW_SUITE)
    gate = [
        sys.executable,
        "-c",
        "import time; time.sleep(1); print('E501 line too long'); exit(3)",
    ]
    started = time.monotonic()
    rc = run([sys.executable, "-m", "pytest"], tmp_path / "logs", [], gate=gate)
    took = time.monotonic() - started
    out = capsys.readouterr().out
    assert rc == 3, out
    assert took < 45, out  # not the 60 s the slow tests would take
    assert "E501 line too long" in out
    assert "gate: exit 3 after" in out and "stopping the tier groups" in out
    assert re.search(r"^gate +exit 3 +\d+ s$", out, re.M), out
    assert "1 passed" not in out  # the 60-second tests were stopped, not run to their end


def test_a_passing_gate_is_shown_and_the_groups_give_the_verdict(
    nested_suite: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gate writes bytecode as the groups do (.venv is installed without it), whatever the
    environment says."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    says = "import sys; sys.exit(4 if sys.dont_write_bytecode else print('All checks passed!'))"
    gate = [sys.executable, "-c", says]
    rc = run([sys.executable, "-m", "pytest"], tmp_path / "logs", [], gate=gate)
    out = capsys.readouterr().out
    assert rc == 1, out  # the unit group's failing test: the gate's success changes nothing
    assert "All checks passed!" in out and "gate: exit 0 after" in out
    assert "tier group lab-shared: exit 0" in out  # every group ran to its end


def test_a_gate_that_cannot_run_fails_the_run_without_a_traceback(
    nested_suite: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = run([sys.executable, "-m", "pytest"], tmp_path / "logs", ["-k", "passes"],
             gate=[str(tmp_path / "no-such-lint")])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 127, out
    assert "cannot run the gate" in out and "Traceback" not in out


@pytest.mark.parametrize(
    ("gate", "says"), [("", "needs a command"), ("'oops", "No closing quotation")]
)
def test_a_malformed_gate_is_a_usage_error(
    gate: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--gate", gate])
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


def test_setup_runs_beside_the_preparation_and_before_the_groups(
    nested_suite: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """make test installs the project's virtualenv while the engine tier's installs: the setup
    finds the preparation already running, and no group starts before the setup has ended."""
    started = tmp_path / "prepare-started"
    touch = f"import pathlib; pathlib.Path({str(started)!r}).touch()"
    prepare = [sys.executable, "-c", touch]
    wait_for_it = (
        "import pathlib, sys, time\n"
        f"p = pathlib.Path({str(started)!r})\n"
        "for _ in range(100):\n"
        "    if p.exists(): print('setup saw the preparation'); sys.exit(0)\n"
        "    time.sleep(0.1)\n"
        "sys.exit(4)\n"
    )
    setup = [[sys.executable, "-c", wait_for_it], [sys.executable, "-c", "print('second setup')"]]
    rc = run([sys.executable, "-m", "pytest"], tmp_path / "logs", ["-k", "passes"], prepare,
             setup=setup)  # fmt: skip
    out = capfd.readouterr().out
    assert rc == 0, out
    saw, second = out.index("setup saw the preparation"), out.index("second setup")
    assert saw < second < out.index("tier group lab-shared: started"), out
    assert "preparation: exit 0" in out


def test_a_failing_setup_ends_the_run_with_its_status_before_any_group(
    nested_suite: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    pid_file = tmp_path / "child.pid"
    prepare = ["bash", "-c", f"sleep 300 & echo $! > {pid_file}; wait"]
    setup = [
        [sys.executable, "-c", "print('pip: no matching distribution'); exit(6)"],
        [sys.executable, "-c", "print('never runs')"],
    ]
    rc = run([sys.executable, "-m", "pytest"], tmp_path / "logs", [], prepare, setup=setup)
    out = capfd.readouterr().out
    assert rc == 6, out
    assert "pip: no matching distribution" in out and "failed (exit 6); no test ran" in out
    assert "never runs" not in out and "tier group" not in out
    assert "preparation: stopped" in out
    _assert_gone(int(pid_file.read_text()), "the preparation's child outlived the failed setup")


def test_a_setup_that_cannot_run_is_127_and_a_malformed_one_a_usage_error(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    rc = run([sys.executable, "-m", "pytest"], tmp_path / "logs", [],
             setup=[[str(tmp_path / "no-such-installer")]])  # fmt: skip
    out = capfd.readouterr().out
    assert rc == 127 and "cannot run the setup command" in out and "Traceback" not in out
    with pytest.raises(SystemExit) as exit_:
        main(["--setup", "'oops"])
    assert exit_.value.code == 2
    assert "No closing quotation" in capfd.readouterr().err
