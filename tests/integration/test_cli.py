"""The command group behaves as a user expects from a click CLI."""

from __future__ import annotations

import subprocess
import sys

import click
from click.testing import CliRunner

from kvops import __version__
from kvops.cli import COMMANDS, main


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


def test_every_command_is_listed_under_the_name_it_answers_to() -> None:
    result = CliRunner().invoke(main, ["--help"])
    listed = result.output.split("Commands:", 1)[1]
    for name in COMMANDS:
        assert f"\n  {name} " in listed, name
        command = main.get_command(click.Context(main), name)
        assert command is not None and command.name == name


def test_a_command_loads_its_own_modules_and_no_other_commands() -> None:
    """`kvops sim serve` (the lab's engine) and `kvops gds prune` (a timer on every offload
    host) start without the load generator's, the A/B test's or SSH's stacks."""
    probe = (
        "import sys; from kvops.cli import main\n"
        "try:\n    main([{args}])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('kvops.abtest.session', 'kvops.smoke.run', 'paramiko',"
        " 'kvops.validate.run', 'aiohttp') if m in sys.modules))"
    )
    for args in ("'gds', 'prune', '--help'", "'sim', 'serve', '--help'", "'lab', '--help'"):
        proc = subprocess.run(
            [sys.executable, "-c", probe.format(args=args)], capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().splitlines()[-1] == "[]", (args, proc.stdout[-500:])
