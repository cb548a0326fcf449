"""A SIGTERM (CI cancelling, tests/tiers.py stopping a group) still tears down what a session
fixture started: the lab's hosts and the engine tier's vLLMs are process groups of their own,
so nothing else would stop them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

SUITE = """
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

OUT = Path({out!r})

@pytest.fixture(scope="session")
def server():
    proc = subprocess.Popen(["sleep", "600"], process_group=0)  # its own group, as an engine
    (OUT / "child.pid").write_text(str(proc.pid))
    yield proc
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    (OUT / "torn-down").write_text("yes")

def test_long(server):
    (OUT / "running").write_text("yes")
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _terminate_while_running(tmp_path: Path, plugins: list[str]) -> tuple[int, int]:
    """Run the suite, SIGTERM its pytest once the test is running: (exit code, child pid)."""
    (tmp_path / "test_suite.py").write_text(SUITE.format(out=str(tmp_path)))
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    for plugin in plugins:
        argv += ["-p", plugin]
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    proc = subprocess.Popen(
        [*argv, str(tmp_path / "test_suite.py")], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (tmp_path / "running").exists():
        assert proc.poll() is None, proc.communicate()[0].decode()
        assert time.monotonic() < deadline, "the test never started"
        time.sleep(0.05)
    child = int((tmp_path / "child.pid").read_text())
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    return proc.returncode, child


def test_sigterm_tears_down_a_session_fixtures_process_group(tmp_path: Path) -> None:
    returncode, child = _terminate_while_running(tmp_path, ["stop_on_sigterm"])
    assert returncode == pytest.ExitCode.INTERRUPTED
    assert (tmp_path / "torn-down").exists()
    assert not _alive(child)


def test_without_it_the_fixtures_process_outlives_pytest(tmp_path: Path) -> None:
    """What the plugin is for: Python's own SIGTERM leaves the fixture's group running."""
    returncode, child = _terminate_while_running(tmp_path, [])
    try:
        assert returncode == -signal.SIGTERM
        assert not (tmp_path / "torn-down").exists()
        assert _alive(child)
    finally:
        os.killpg(child, signal.SIGKILL)
