"""A reporting failure never drops hosts: every host of the fleet ends as a result (issue 24).

The hosts ask for a connection kvops does not speak, so each ends at once as PROBE_FAILED
without a process or a socket: the fleet machinery is under test, not the transport.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from kvops.remote.inventory import InventoryHost
from kvops.remote.ssh import SshOptions
from kvops.validate import collect
from kvops.validate.collect import HostResult, HostStatus, probe_fleet

NAMES = [f"gpu-{i:02d}" for i in range(7)]


def fleet(names: list[str] = NAMES) -> list[InventoryHost]:
    return [InventoryHost(n, vars={"ansible_connection": "not-a-transport"}) for n in names]


def run(forks: int, on_result: Callable[[HostResult], None] | None = None) -> list[HostResult]:
    hosts = fleet()
    return probe_fleet(
        hosts,
        {h.name: {} for h in hosts},
        SshOptions(known_hosts=Path("/nonexistent"), timeout_s=5),
        forks=forks,
        on_result=on_result,
    )


@pytest.mark.parametrize("forks", [1, 2])
def test_a_raising_callback_loses_no_host(forks: int, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    def report(res: HostResult) -> None:
        seen.append(res.host)
        if res.host in ("gpu-01", "gpu-04"):
            raise ValueError(f"closing tag '[/]' for {res.host} has nothing to close")

    with caplog.at_level(logging.WARNING, logger=collect.__name__):
        results = run(forks, report)
    assert [r.host for r in results] == NAMES  # every host, inventory order
    assert sorted(seen) == NAMES  # the callback went on after it failed
    # Each host keeps its real result: the callback's failure is not the host's.
    assert all(r.status is HostStatus.PROBE_FAILED for r in results)
    assert all("not supported" in str(r.reason) for r in results)
    # Reported once, naming the first failure: gpu-01 with one worker; with two, whichever
    # worker's callback failed first (the threads' order is the scheduler's).
    reported = [r.getMessage() for r in caplog.records if "ValueError" in r.getMessage()]
    assert len(reported) == 1
    failing = ["gpu-01"] if forks == 1 else ["gpu-01", "gpu-04"]
    assert any(name in reported[0] for name in failing)


@pytest.mark.parametrize("forks", [1, 2])
def test_a_dead_worker_leaves_probe_failed_rows(
    forks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worse than an exception: something ends the worker thread itself (here SystemExit from
    the callback, which no `except Exception` catches). Its host and those it would have
    probed still come back, as PROBE_FAILED saying why; with a second worker, it probes them."""

    def report(res: HostResult) -> None:
        if res.host == "gpu-02":
            raise SystemExit("worker gone")

    monkeypatch.setattr(
        threading, "excepthook", lambda args: None
    )  # the thread's death is expected
    results = run(forks, report)
    assert [r.host for r in results] == NAMES
    assert all(r.status is HostStatus.PROBE_FAILED for r in results)
    lost = [r for r in results if "worker" in str(r.reason)]
    assert all(r.evidence["error"] == r.reason for r in lost)
    if forks == 1:  # the one worker died after gpu-02: the rest were never probed
        assert [r.host for r in lost] == NAMES[3:]
    assert all(r.evidence["host"] == r.host for r in results)
