"""The click group class every `kvops` command group uses: one place for exit codes and errors."""

from __future__ import annotations

from typing import Any

import click

from kvops.errors import RC, KvopsError
from kvops.report.host_text import printable


class KvopsGroup(click.Group):
    """The group every `kvops` command runs under: return value → exit status, a
    `KvopsError` → one line on stderr and its `rc`, Ctrl-C → 130 (click's own default would
    print "Aborted!" and exit 1)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
        except KvopsError as exc:
            # The message may quote a host or a server (a probe's stderr, an engine's error
            # body): its control characters are shown, not sent to the terminal.
            click.echo(f"{_command_name(ctx)}: error: {printable(exc)}", err=True)
            ctx.exit(int(exc.rc))
        except KeyboardInterrupt:
            click.echo(f"\n{_command_name(ctx)}: interrupted", err=True)
            ctx.exit(int(RC.INTERRUPTED))
        if isinstance(result, RC):
            ctx.exit(int(result))
        return result


def _command_name(ctx: click.Context) -> str:
    """`kvops smoke`, `kvops lab up`: the command the user typed, for the one-line message."""
    names = [ctx.invoked_subcommand] if ctx.invoked_subcommand else []
    while ctx.parent is not None:  # the root's own name may be "python -m kvops"
        names.insert(0, ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["kvops", *names])
