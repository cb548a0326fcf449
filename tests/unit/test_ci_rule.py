"""The CI rule: which `CI` values mean CI, and that in CI no skip of any kind passes."""

from __future__ import annotations

from pathlib import Path

import pytest
from ci_rule import in_ci

TESTS = Path(__file__).parents[1]

SKIPPING_MODULE = """
import pytest
from ci_rule import unavailable

@pytest.mark.skipif(True, reason="marker says no sshd")
def test_marker(): pass

def test_inside(): pytest.skip("no quiet CPU")

def test_unavailable(): unavailable("no lab hosts")

@pytest.mark.xfail(reason="known")
def test_expected_failure(): assert False

def test_runs(): pass
"""

SKIPPED_AT_COLLECTION = """
import pytest
pytest.skip("module needs a GPU", allow_module_level=True)
"""


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "True", "yes", "Yes", " true "])
def test_truthy_ci_values_mean_ci(value: str) -> None:
    assert in_ci({"CI": value})


@pytest.mark.parametrize("value", ["", "0", "false", "no", "off"])
def test_other_ci_values_do_not(value: str) -> None:
    assert not in_ci({"CI": value}) and not in_ci({})


def _pytest(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str, **modules: str
) -> pytest.RunResult:
    """Runs pytest in-process on `modules` with this suite's own conftest and `CI=ci`."""
    monkeypatch.setenv("CI", ci)
    pytester.syspathinsert(TESTS)
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makepyfile(**modules)
    return pytester.runpytest(
        "-q", "-rA", "-p", "no:cacheprovider", "--continue-on-collection-errors"
    )


def test_in_ci_every_kind_of_skip_fails_with_its_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _pytest(
        pytester, monkeypatch, "true",
        test_subject=SKIPPING_MODULE, test_collection=SKIPPED_AT_COLLECTION,
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    for reason in ("marker says no sshd", "no quiet CPU", "no lab hosts", "module needs a GPU"):
        assert reason in out
    assert "SKIPPED" not in out
    result.assert_outcomes(passed=1, failed=2, errors=2, xfailed=1)


def test_outside_ci_the_same_skips_stay_skips(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _pytest(pytester, monkeypatch, "", test_subject=SKIPPING_MODULE)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.assert_outcomes(passed=1, skipped=3, xfailed=1)


# Each test counts its runs in a file: the first run fails, a rerun passes.
TIMING_MODULE = """
import pytest
from pathlib import Path
from ci_rule import too_busy

def _first_run(name):
    marker = Path(name)
    first = not marker.exists()
    marker.write_text("ran")
    return first

@pytest.mark.timing
def test_busy_then_judged():
    if _first_run("busy"):
        too_busy("load 3.7 on 2 CPUs")

@pytest.mark.timing
def test_noisy_then_fine():
    assert not _first_run("noisy"), "TTFT drop 12% (needed 20%)"

@pytest.mark.timing
def test_a_real_regression():
    assert False, "TTFT drop 0%"

@pytest.fixture
def engine():
    raise RuntimeError("engine failed to start")

@pytest.mark.timing
def test_a_set_up_error(engine):
    pass

def test_not_timing():
    assert not _first_run("untimed")
"""


def test_in_ci_a_timing_test_is_rerun_once_after_a_busy_machine_or_a_failed_timing(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `make test` relies on to judge timings beside the lab groups: one rerun after a
    timing assertion or a machine too busy to judge; never for a set-up error or an unmarked
    test; a test that fails twice fails."""
    monkeypatch.setenv("KVOPS_TIMING_RERUN_DELAY_S", "0")
    monkeypatch.chdir(pytester.path)
    result = _pytest(pytester, monkeypatch, "true", test_timing=TIMING_MODULE)
    outcomes = result.parseoutcomes()
    out = result.stdout.str()
    assert (outcomes.get("passed"), outcomes.get("failed"), outcomes.get("errors")) == (
        2,
        2,
        1,
    ), out
    # the busy one, the noisy one and the regression's first run
    assert outcomes.get("rerun") == 3, out
    # each rerun says why its first run failed (tests/conftest.py RerunReasons)
    assert "RERUN test_timing.py::test_noisy_then_fine (call) after:" in out, out
    assert "TTFT drop 12% (needed 20%)" in out.split("test_noisy_then_fine (call) after:")[1]
    assert "too busy to judge timing" in out.split("test_busy_then_judged (call) after:")[1]
    assert "FAILED test_timing.py::test_a_real_regression" in out
    assert "FAILED test_timing.py::test_not_timing" in out
