"""A pytest plugin: SIGTERM ends a test session the way Ctrl-C does, with every fixture's
teardown run.

CI cancels a job with SIGTERM, and tests/tiers.py stops its test groups with SIGTERM when a
gate fails or it is stopped itself. Python's default for SIGTERM is to die at once, so lab
hosts, the session's vLLM engines and simulated servers would keep running. Raised as
KeyboardInterrupt instead, pytest stops the test in progress and still finishes the session,
which tears every fixture down (https://docs.pytest.org/en/stable/how-to/fixtures.html#teardown-cleanup-aka-fixture-finalization).
Loaded by tests/conftest.py for every tier.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

import pytest

_PREVIOUS: list[Any] = []  # what SIGTERM did before, restored when pytest ends


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if threading.current_thread() is threading.main_thread():  # signals reach only that one
        _PREVIOUS.append(signal.signal(signal.SIGTERM, _interrupt))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _PREVIOUS:
        signal.signal(signal.SIGTERM, _PREVIOUS.pop())
