"""Test tiers and the CI rule.

The folder a test lives in gives its marker (unit, integration, lab, engine). In CI
(`tests/ci_rule.py`: CI=1/true/yes) no test may skip: a skip, from a marker or from inside the
test, is reported as a failure naming the skip's reason, so a green CI run ran everything.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path

import cpu_account
import pytest
from ci_rule import TOO_BUSY, in_ci
from tiers import CPU_PROPERTY, order_by_tier

# pytester: tests/unit/test_ci_rule.py runs this conftest in-process; stop_on_sigterm: a SIGTERM
# (CI cancelling, tests/tiers.py stopping a group) still tears down every fixture.
pytest_plugins = ["pytester", "stop_on_sigterm"]

TIERS = ("unit", "integration", "lab", "engine")


def _resolve_the_checkout_collection() -> None:
    """Tests that template the roles in this process (Templar, not ansible-playbook) resolve the
    roles' `kvops.gds.*` filters through the checkout's `.collections` link, as a play run from
    the checkout does. Ansible configures its collection finder once per process, with the
    paths of whoever asks first, so it is configured here before any test can ask."""
    from ansible.plugins.loader import init_plugin_loader

    init_plugin_loader([str(TESTS_ROOT.parent / ".collections")])


TESTS_ROOT = Path(__file__).parent
_resolve_the_checkout_collection()


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark each test with its folder's tier as it is collected, so `-m unit` selects it."""
    try:
        tier = Path(item.fspath).relative_to(TESTS_ROOT).parts[0]
    except ValueError:
        return
    if tier in TIERS and not any(item.get_closest_marker(t) for t in TIERS):
        item.add_marker(getattr(pytest.mark, tier))


# A `timing` test judges TTFTs measured on a 2-core machine that the lab groups of `make test`
# load at the same time (tests/tiers.py): a busy neighbour can delay a request by more than the
# effect judged. One rerun (pytest-rerunfailures, https://github.com/pytest-dev/pytest-rerunfailures)
# after an assertion error or a machine too busy to judge (ci_rule.too_busy), never after an
# error of set-up or of the code under test; a real regression fails both runs. Each test's run
# starts from fresh prompts or its own output folder, and "R" in the progress line and "N rerun"
# in the summary show that it happened.
TIMING_RERUN = pytest.mark.flaky(
    reruns=1,
    reruns_delay=float(os.environ.get("KVOPS_TIMING_RERUN_DELAY_S", "5")),
    only_rerun=["AssertionError", TOO_BUSY],
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the tiers in tests/tiers.py's RUN_ORDER (the fast ones first; the engine tier after
    the tiers its background virtualenv install overlaps); give `timing` tests their rerun."""
    order_by_tier(items)
    for item in items:
        if item.get_closest_marker("timing"):
            item.add_marker(TIMING_RERUN)


_CPU_CGROUP = cpu_account.from_environment()  # set when tests/tiers.py accounts this group
_CPU_AT_START = pytest.StashKey[float]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None]:
    """Note the group's CPU counter before each run of the test's set-up (a `timing` rerun is
    a run of its own, with its own CPU-seconds)."""
    if _CPU_CGROUP is not None:
        start = _CPU_CGROUP.usage_s()
        if start is not None:
            item.stash[_CPU_AT_START] = start
    return (yield)


def _record_cpu(item: pytest.Item, report: pytest.TestReport) -> None:
    """The test's CPU-seconds as a JUnit property (``cpu_s``), written with its teardown:
    everything its group's processes used from its set-up to its teardown (tests/tiers.py
    prints the costliest). Only its own group's processes count, not the other groups'."""
    start = item.stash.get(_CPU_AT_START, None)
    end = _CPU_CGROUP.usage_s() if _CPU_CGROUP is not None else None
    if start is not None and end is not None:
        report.user_properties.append((CPU_PROPERTY, f"{end - start:.1f}"))


class RerunReasons:
    """A `timing` test's failed first run leaves why in the group's log (pytest-rerunfailures
    lists the rerun, not its error): the error lines of its report, under the progress line."""

    LINES = 15

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.outcome != "rerun":
            return
        text = report.longreprtext.splitlines()
        shown = [line for line in text if line.startswith("E ")][: self.LINES] or text[-3:]
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        reporter.write_line(f"\nRERUN {report.nodeid} ({report.when}) after:")
        for line in shown:
            reporter.write_line("    " + line[:300])


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(RerunReasons(config), "kvops-rerun-reasons")


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The reason pytest recorded for a skip (its longrepr is (path, line, "Skipped: why"))."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """In CI a skipped test (not an expected failure) fails with the reason it gave; the
    teardown's report carries the test's CPU-seconds."""
    report = yield
    if report.skipped and in_ci() and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where every test must run: {skip_reason(report)}"
    if call.when == "teardown":
        _record_cpu(item, report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """In CI a module that skips itself while being collected fails the same way."""
    report = yield
    if report.skipped and in_ci():
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where every test must run: {skip_reason(report)}"
    return report
