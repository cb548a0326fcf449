"""Errors and the one subprocess helper of the lab.

Every failing step raises :class:`LabError` with the command and its stderr, so the CLI can
print one clear line instead of a traceback and the pytest fixture can skip or fail with it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from kvops.errors import KvopsError


class LabError(KvopsError, RuntimeError):
    """A lab step failed; the message is written for the person running the lab."""


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout_s: float = 120.0,
    input_text: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run one command (argument list, never a shell string) and capture its output."""
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            input=input_text,
            env=None if env is None else dict(env),
            cwd=cwd,
            check=False,
        )
    except FileNotFoundError as exc:
        raise LabError(
            f"command not found: {argv[0]} (install it, see tests/lab/README.md)"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"timed out after {timeout_s:.0f} s: {' '.join(argv)}") from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        tail = " | ".join(detail[-3:]) if detail else "no output"
        raise LabError(f"`{' '.join(argv)}` failed (exit {proc.returncode}): {tail}")
    return proc
