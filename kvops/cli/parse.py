"""`kvops parse TOOL FILE|-`: print what kvops reads from a tool's output, as JSON.

For support cases and scripts: the same parsers the checks use, so what this prints is
exactly what `kvops validate` judged. Exit 0 when the input parsed (warnings included in the
JSON), 1 when it could not be parsed at all (e.g. cufile.json syntax error), 2 for an
unreadable file.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from kvops.errors import RC
from kvops.parse.cufile import parse_cufile
from kvops.parse.gdscheck import parse_gdscheck
from kvops.parse.gdsio import parse_gdsio
from kvops.parse.mounts import parse_mounts
from kvops.parse.nvfs_stats import parse_nvfs_stats
from kvops.parse.rdma_tools import parse_ibdev2netdev, parse_show_gids
from kvops.parse.topo import parse_topo


def _cufile(text: str) -> tuple[dict[str, Any], bool]:
    result = parse_cufile(text)
    return result.to_dict(), result.error is None


def _simple(parser: Callable[[str], Any]) -> Callable[[str], tuple[dict[str, Any], bool]]:
    def run(text: str) -> tuple[dict[str, Any], bool]:
        return parser(text).to_dict(), True

    return run


PARSERS: dict[str, Callable[[str], tuple[dict[str, Any], bool]]] = {
    "gdscheck": _simple(parse_gdscheck),
    "gdsio": _simple(parse_gdsio),
    "nvfs-stats": _simple(parse_nvfs_stats),
    "cufile": _cufile,
    "mounts": _simple(parse_mounts),
    "ibdev2netdev": _simple(parse_ibdev2netdev),
    "show-gids": _simple(parse_show_gids),
    "topo": _simple(parse_topo),
}


class UnreadableInput(click.FileError):
    """An input that cannot be read: exit 2 like other usage problems, never a traceback."""

    exit_code = RC.COULD_NOT_RUN


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError as exc:
        raise UnreadableInput(path, hint=exc.strerror or str(exc)) from exc


@click.command("parse")
@click.argument("tool", type=click.Choice(sorted(PARSERS)))
@click.argument("path", metavar="FILE|-")
def parse(tool: str, path: str) -> RC:
    """Parse TOOL output from FILE (or - for stdin) and print it as JSON.

    \b
    gdscheck      gdscheck -p           per-filesystem modes, platform, cuFile config
    gdsio         gdsio result lines    one object per line (throughput_gib_s, ...)
    nvfs-stats    /proc/driver/nvidia-fs/stats
    cufile        cufile.json           values, unknown keys with suggestions, syntax error
    mounts        /proc/mounts or `mount` output
    ibdev2netdev  ibdev2netdev [-v]     RDMA device, port, net device, Up/Down
    show-gids     show_gids             GIDs with IPv4 and RoCE version, n_gids_found
    topo          nvidia-smi topo -mp   GPUs, NICs (NIC Legend), link types, CPU/NUMA affinity
    """
    document, ok = PARSERS[tool](_read(path))
    click.echo(json.dumps(document, indent=2, sort_keys=True))
    return RC.OK if ok else RC.FAIL
