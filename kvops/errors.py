"""One exit-code vocabulary and one error root for every `kvops` command.

Why: scripts and CI read a command's exit status before its output, so every command must
mean the same thing by the same number. The shape follows ansible-lint's `RC` enum
(https://github.com/ansible/ansible-lint/blob/main/src/ansiblelint/constants.py): commands
return an `RC`, and a command-level failure is a `KvopsError` carrying the `RC` it exits
with, caught in one place (`kvops.cli.KvopsGroup`) that prints one line, never a traceback.
The 130 for an interrupt is the shell's 128 + SIGINT convention
(https://tldp.org/LDP/abs/html/exitcodes.html).
"""

from __future__ import annotations

import enum


class RC(enum.IntEnum):
    """Exit status of every `kvops` command."""

    OK = 0  # everything judged passed (WARN allowed); or the command did what was asked
    FAIL = 1  # the command ran and something FAILed (a check, a request, a parse)
    COULD_NOT_RUN = 2  # usage error, unreadable input, unreachable target: nothing judged
    INTERRUPTED = 130  # Ctrl-C (SIGINT); what was already measured is kept


class KvopsError(Exception):
    """A command-level error: its message is the one line the user sees, `rc` the exit status.

    Subclasses name the failing part (`SmokeError`, `LabError`, ...); they also keep their
    historical builtin base (ValueError, RuntimeError) so existing `except` clauses still match.
    """

    rc: RC = RC.COULD_NOT_RUN

    def __init__(self, message: object = "", *, rc: RC | None = None) -> None:
        super().__init__(message)
        if rc is not None:
            self.rc = rc
