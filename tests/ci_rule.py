"""The one rule for "am I in CI", shared by every test tier.

Why: a test that skips because its machine lacks something (sshd, a lab, an engine, a quiet
CPU) is fine on a laptop and a hole in CI, where a skip reads as green. In CI every test runs
or fails: `tests/conftest.py` turns any skip into a failure when `in_ci()`, and tests that
cannot run call `unavailable(reason)`, which fails in CI and skips with the reason elsewhere.

`CI` is truthy when it is 1, true or yes in any case (GitHub Actions and GitLab set
`CI=true`, https://docs.github.com/en/actions/reference/variables-reference).
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

CI_TRUTHY = ("1", "true", "yes")


def in_ci(environ: dict[str, str] | None = None) -> bool:
    """True when the `CI` environment variable is 1/true/yes (case-insensitive)."""
    env = os.environ if environ is None else environ
    return env.get("CI", "").strip().lower() in CI_TRUTHY


def unavailable(reason: str) -> NoReturn:
    """The test cannot run here: fail in CI (it must run there), skip with the reason elsewhere."""
    if in_ci():
        pytest.fail(f"{reason} (CI: this test must run, not skip)", pytrace=False)
    pytest.skip(reason)


# The reason a `timing` test gives when the machine was too loaded to judge it: such a test is
# rerun once on it (tests/conftest.py), as after a failed timing assertion.
TOO_BUSY = "too busy to judge timing"


def too_busy(reason: str) -> NoReturn:
    """The machine was too busy for this timing to mean anything: `unavailable`, with the reason
    a `timing` test's rerun recognises."""
    unavailable(f"{TOO_BUSY}: {reason}")
