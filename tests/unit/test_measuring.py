"""tests/measuring.py reads its autogroup's weight from /proc/<pid>/autogroup, so that a
measurement is put ahead of the lab hosts' SSH sessions and set back afterwards."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from measuring import (
    AUTOGROUP,
    MEASURING_NICE,
    ahead_of_the_lab_groups,
    autogroup_at,
    autogroup_nice,
    weigh_as_this_session,
    weighed_as_this_session,
)


@pytest.mark.parametrize(
    ("text", "nice"),
    [
        ("/autogroup-295247 nice 0\n", 0),
        ("/autogroup-7 nice -10", -10),
        ("/autogroup-7 nice 19", 19),
    ],
)
def test_the_autogroup_nice_value_is_read(text: str, nice: int) -> None:
    assert autogroup_nice(text) == nice


@pytest.mark.parametrize("text", ["", "/autogroup-7", "nice", "/autogroup-7 nice x"])
def test_anything_else_is_no_value(text: str) -> None:
    assert autogroup_nice(text) is None


def _autogroup() -> str | None:
    return AUTOGROUP.read_text() if AUTOGROUP.exists() else None


def test_the_measurement_runs_ahead_and_leaves_both_priorities_as_they_were() -> None:
    """As root (CI): the thread and, where the kernel schedules by autogroup, its autogroup at
    MEASURING_NICE; without the privilege nothing changes. Either way, all is as before after."""
    nice_before, group_before = os.getpriority(os.PRIO_PROCESS, 0), _autogroup()
    autogroups_on = Path("/proc/sys/kernel/sched_autogroup_enabled")
    with ahead_of_the_lab_groups():
        if os.geteuid() == 0:
            assert os.getpriority(os.PRIO_PROCESS, 0) == MEASURING_NICE
            # A kernel (or sandbox) may show /proc/self/autogroup without a value in it (CI's
            # machine reads it empty): then there is no autogroup weight to raise.
            readable = autogroup_nice(group_before or "") is not None
            if readable and autogroups_on.read_text().strip() == "1":
                assert autogroup_nice(_autogroup() or "") == MEASURING_NICE
    assert os.getpriority(os.PRIO_PROCESS, 0) == nice_before
    assert _autogroup() == group_before


def test_a_child_in_a_session_of_its_own_weighs_as_this_session() -> None:
    """As root with autogroups on: the child's new autogroup takes this session's nice value;
    otherwise it keeps its own and nothing fails."""
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        own = Path(f"/proc/{child.pid}/autogroup")
        with autogroup_at(-3):
            weigh_as_this_session(child.pid)
            ours = _autogroup()
            if os.geteuid() == 0 and ours is not None and autogroup_nice(ours) == -3:
                assert autogroup_nice(own.read_text()) == -3
                assert own.read_text().split()[0] != ours.split()[0]  # its own autogroup
    finally:
        child.kill()
        child.wait()
    weigh_as_this_session(child.pid)  # gone: nothing to do, nothing raised


def test_engines_weigh_as_this_session_only_while_they_are_measured() -> None:
    """As root with autogroups on: the engine's autogroup takes this session's nice value for
    the measurement and its own back afterwards; elsewhere nothing changes and nothing fails."""
    engine = subprocess.Popen(["sleep", "30"], start_new_session=True)
    own = Path(f"/proc/{engine.pid}/autogroup")
    try:
        before = own.read_text() if own.exists() else None
        with autogroup_at(-4), weighed_as_this_session(engine.pid):
            raised = autogroup_nice(_autogroup() or "") == -4 and os.geteuid() == 0
            if raised and autogroup_nice(before or "") is not None:
                assert autogroup_nice(own.read_text()) == -4
        assert (own.read_text() if own.exists() else None) == before
    finally:
        engine.kill()
        engine.wait()
    with weighed_as_this_session(engine.pid):  # gone: nothing to do, nothing raised
        pass


@pytest.mark.parametrize("shown", ["", "/autogroup-7\n"])
def test_an_autogroup_file_without_a_value_is_left_as_it_is(
    shown: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some kernels and sandboxes show /proc/self/autogroup empty (CI's machine did): nothing is
    written to it and the measurement still runs."""
    fake_autogroup = tmp_path / "autogroup"
    fake_autogroup.write_text(shown)
    monkeypatch.setattr("measuring.AUTOGROUP", fake_autogroup)
    ran = False
    with autogroup_at(MEASURING_NICE):
        ran = True
    assert ran
    assert fake_autogroup.read_text() == shown
