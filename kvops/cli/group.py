"""The click group class every `kvops` command group uses: one place for exit codes and errors."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
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


class LazyKvopsGroup(KvopsGroup):
    """A `KvopsGroup` whose commands are imported only when named (Click's "Lazily Loading
    Subcommands", https://click.palletsprojects.com/en/stable/complex/). Each command pulls in
    its own stack (aiohttp and numpy for ab-test, paramiko for validate, ...): importing all of
    them took ~0.6 s on every `kvops` start, paid again by every script, Ansible task and lab
    host that calls it; `kvops smoke` now loads smoke's modules and no other command's. Listing
    (`kvops --help`) still imports every command for its one-line help."""

    def __init__(self, *args: Any, lazy_commands: Mapping[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # command name → "module:attribute"
        self.lazy_commands = dict(lazy_commands)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = self.lazy_commands.get(cmd_name)
        if spec is None:
            return super().get_command(ctx, cmd_name)
        module_name, attribute = spec.split(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{spec} is not a click command")
        return command


def _command_name(ctx: click.Context) -> str:
    """`kvops smoke`, `kvops lab up`: the command the user typed, for the one-line message."""
    names = [ctx.invoked_subcommand] if ctx.invoked_subcommand else []
    while ctx.parent is not None:  # the root's own name may be "python -m kvops"
        names.insert(0, ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["kvops", *names])
