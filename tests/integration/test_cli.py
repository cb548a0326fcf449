"""The command group behaves as a user expects from a click CLI."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from kvops import __version__
from kvops.cli import main


def test_help_lists_the_group() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "Provision, validate and prove" in result.output


def test_version_matches_package() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.output


def test_unknown_command_is_a_usage_error_without_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvops", "nosuchcommand"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "No such command" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_option_is_a_usage_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvops", "--no-such-option"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "No such option" in proc.stderr
