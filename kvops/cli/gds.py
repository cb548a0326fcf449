"""`kvops gds prune DIR`: keep an LMCache GDS directory under a byte budget or an age.

Thin: options → `kvops.gds.prune` → a summary line (or `--json`) → exit code: 0 done (the
directory within its budget), 1 still over budget (every chunk left is younger than
--min-age) or some files could not be removed, 2 bad options or no such directory.
"""

from __future__ import annotations

import json
import os

import click

from kvops.errors import RC, KvopsError
from kvops.gds.prune import PruneRequest, prune
from kvops.gds.units import parse_duration_s, parse_size_bytes
from kvops.report.host_text import printable


@click.group()
def gds() -> None:
    """Look after an LMCache GDS directory (the shared KV store on the ONTAP export)."""


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    try:
        return None if value is None else parse_size_bytes(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    try:
        return None if value is None else parse_duration_s(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _gib(size_bytes: int) -> str:
    return f"{size_bytes / 2**30:.2f} GiB"


@gds.command("prune")
@click.argument("directory", type=click.Path(file_okay=False, path_type=str))
@click.option(
    "--max-bytes",
    "max_bytes",
    callback=_size,
    metavar="SIZE",
    help="Keep at most SIZE of chunks (500G, 1.5T; binary units), least recently used first.",
)
@click.option(
    "--max-age",
    "max_age_s",
    callback=_duration,
    metavar="DURATION",
    help="Remove chunks not used for DURATION (12h, 7d).",
)
@click.option(
    "--min-age",
    "min_age_s",
    callback=_duration,
    default="5m",
    show_default=True,
    metavar="DURATION",
    help="Never remove a chunk used more recently than this.",
)
@click.option(
    "--tmp-age",
    "tmp_age_s",
    callback=_duration,
    default="1h",
    show_default=True,
    metavar="DURATION",
    help="Remove unfinished writes (*.tmp<hex>) and metadata without data older than this.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
def prune_command(
    directory: str,
    max_bytes: int | None,
    max_age_s: float | None,
    min_age_s: float,
    tmp_age_s: float,
    dry_run: bool,
    as_json: bool,
) -> RC:
    """Remove least recently used chunks of an LMCache GDS directory, safely while engines run.

    LMCache's GDS backend never evicts: a shared store fills until the export is full. A
    chunk's metadata goes before its data, so no engine finds a chunk that is half gone, and
    one that already indexed it recomputes (vLLM `kv_load_failure_policy: recompute`, the
    role's setting). Only LMCache's chunk files and its unfinished writes are ever touched.

    \b
    Examples:
      kvops gds prune /mnt/kvcache/gds --max-bytes 800G
      kvops gds prune /mnt/kvcache/gds --max-age 7d --dry-run
      kvops gds prune /mnt/kvcache/gds --max-bytes 2T --max-age 14d --json

    "Used" is a data file's atime where the mount updates it (else its mtime: least recently
    written). Millions of files are walked twice, never held in memory.
    """
    if max_bytes is None and max_age_s is None:
        raise click.UsageError("give --max-bytes SIZE, --max-age DURATION, or both")
    if not os.path.isdir(directory):
        raise KvopsError(f"{directory}: no such directory")
    req = PruneRequest(directory, max_bytes, max_age_s, min_age_s, tmp_age_s, dry_run)

    def progress(seen: int) -> None:
        click.echo(f"  ... {seen:,} files looked at", err=True)

    try:
        report = prune(req, progress)  # progress on stderr: stdout stays the report
    except KeyboardInterrupt:
        raise KvopsError(
            "interrupted: chunks removed so far are gone whole (metadata and data)",
            rc=RC.INTERRUPTED,
        ) from None
    over = max_bytes is not None and report.bytes_left > max_bytes
    if as_json:
        click.echo(json.dumps({**report.to_dict(), "over_budget": over}, indent=2))
    else:
        verb = "would remove" if dry_run else "removed"
        click.echo(
            f"{printable(directory, one_line=True)}: {report.chunks_found:,} chunks, "
            f"{_gib(report.bytes_found)}; {verb} {report.chunks_removed:,} chunks "
            f"({_gib(report.bytes_freed)}), {report.tmp_removed} unfinished writes, "
            f"{report.orphans_removed} orphan metadata; {_gib(report.bytes_left)} left"
        )
        for error in report.errors:
            click.echo(f"  error: {printable(error, one_line=True)}", err=True)
        if over:
            click.echo(
                f"  still over --max-bytes ({_gib(max_bytes or 0)}): the rest was used within "
                "--min-age; raise the budget or lower --min-age",
                err=True,
            )
    return RC.FAIL if over or report.error_count else RC.OK
