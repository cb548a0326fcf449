"""`kvops smoke`: prove that a running engine's KV offload really stores and retrieves.

Thin by design: options → `kvops.smoke.run` (I/O) → `kvops.smoke.judge` (judge: findings with
catalog ids) → validate's renderers (`kvops.report.findings`: table, JSON, JUnit) →
exit code (`kvops.errors.RC`: 0 pass, 1 fail, 2 could not run, 130 interrupted).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.text import Text

from kvops.errors import RC
from kvops.report.findings import STYLE, host_table, write_junit
from kvops.report.host_text import json_safe, markup
from kvops.smoke.judge import (
    DEFAULT_MIN_TTFT_DROP,
    ServiceLog,
    as_fleet,
    exit_code,
    judge,
    overall,
    report_dict,
)
from kvops.smoke.kv_check import DEFAULT_LOGPROB_TOLERANCE
from kvops.smoke.run import SmokeError, SmokeOptions, run_smoke

if TYPE_CHECKING:
    from kvops.remote.inventory import InventoryHost
    from kvops.remote.ssh import SshOptions


@click.command("smoke")
@click.option(
    "--url", help="Base URL of the engine, e.g. http://gpu1:8000 (with --host: from inventory)."
)
@click.option(
    "--gds-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the engine writes offloaded chunks (LMCache gds_path, or the connector's "
    "directory), as seen from here; with --host, the path on that host (default: its "
    "vllm_lmcache_gds_dir or kvops_gds_dir). New chunk files there are evidence.",
)
@click.option(
    "--host",
    "host_name",
    help="Inventory host running the engine: its URL comes from the inventory and its chunk "
    "files are read over SSH (verified host keys, become as the inventory says).",
)
@click.option(
    "-i",
    "--inventory",
    "inventories",
    multiple=True,
    help="Ansible inventory for --host (path or comma list; repeatable).",
)
@click.option(
    "--known-hosts",
    type=click.Path(dir_okay=False, path_type=Path),
    help="known_hosts for --host [default: the inventory's UserKnownHostsFile, else "
    "~/.ssh/known_hosts].",
)
@click.option("--model", help="Model to use (default: the first one /v1/models lists).")
@click.option(
    "--prompt-tokens",
    type=click.IntRange(min=64),
    default=2048,
    show_default=True,
    help="Length of the test prompt: several LMCache chunks (256 tokens by default).",
)
@click.option(
    "--prompts",
    type=click.IntRange(min=1, max=20),
    default=3,
    show_default=True,
    help="How many test prompts; TTFT is judged on their medians.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=120.0,
    show_default=True,
    help="Seconds allowed for each request.",
)
@click.option(
    "--evict",
    type=click.Choice(["auto", "reset", "fillers"]),
    default="auto",
    show_default=True,
    help="How to force the prompt out of GPU memory: POST /reset_prefix_cache (vLLM needs "
    "VLLM_SERVER_DEV_MODE=1), filler prompts sized from the KV capacity in the metrics, or "
    "auto (reset where served, else fillers).",
)
@click.option(
    "--min-ttft-drop",
    type=click.FloatRange(min=0, max=1),
    default=DEFAULT_MIN_TTFT_DROP,
    show_default=True,
    help="Fraction by which the re-send's TTFT must fall (0.2 = 20 % lower).",
)
@click.option(
    "--logprob-tolerance",
    type=click.FloatRange(min=0),
    default=DEFAULT_LOGPROB_TOLERANCE,
    show_default=True,
    help="Largest difference (nats) allowed between a token's log-probability computed from "
    "scratch and from offloaded KV; the greedy token ids must be identical regardless.",
)
@click.option(
    "--service-log",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="The engine's service log of this start (e.g. journalctl -o cat "
    "_SYSTEMD_INVOCATION_ID=$(systemctl show -p InvocationID --value UNIT) > FILE): LMCache's "
    "degraded mode, which /health and the metrics do not show, is a FAIL. With --host the "
    "host's journal is read by validate's probe unless this is given.",
)
@click.option("--seed", type=int, help="Seed of the test prompt (default: fresh each run).")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print a JSON document instead of a table: validate's shape (hosts, findings with "
    "GDS-2xx ids, summary, exit_code), plus items by name and the raw evidence.",
)
@click.option(
    "--junit",
    "junit_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write JUnit XML: one testcase per check (as kvops validate --junit).",
)
@click.option(
    "--lmcache-server-url",
    help="offload_mp (LMCache's multiprocess server, `lmcache server`): its HTTP frontend as "
    "seen from here, e.g. http://127.0.0.1:8080; its counters stand for LMCache's stored and "
    "retrieved tokens (vLLM's /metrics has no lmcache:* then).",
)
@click.option("-v", "--verbose", is_flag=True, help="Show evidence excerpts in the table.")
def smoke(
    url: str | None,
    gds_dir: Path | None,
    host_name: str | None,
    inventories: tuple[str, ...],
    known_hosts: Path | None,
    model: str | None,
    prompt_tokens: int,
    prompts: int,
    timeout_s: float,
    evict: str,
    min_ttft_drop: float,
    logprob_tolerance: float,
    service_log: Path | None,
    seed: int | None,
    as_json: bool,
    junit_file: Path | None,
    lmcache_server_url: str | None,
    verbose: bool,
) -> RC:
    """Send long prompts, force them out of GPU memory, re-send them, and judge the evidence.

    \b
    PASS needs: a KV connector or LMCache on the engine; LMCache stored/retrieved-token
    counters rising (SKIP on non-LMCache engines); vLLM's external prefix-cache hits rising on
    the re-sends; a clearly lower median re-send TTFT; with --gds-dir, new chunk files there;
    the same greedy tokens and logprobs for a prompt computed from scratch and from offloaded
    KV; with --service-log, no LMCache degraded mode in this start's log.

    \b
    Examples:
      kvops smoke --url http://gpu1:8000 --gds-dir /mnt/ontap/lmcache
      kvops smoke --url http://127.0.0.1:8000 --json --junit smoke.xml
      kvops smoke --host gpu1 -i inventories/prod     # chunk files read over SSH
    Exit: 0 pass, 1 fail, 2 could not run, 130 interrupted.
    """
    err = Console(stderr=True)
    if not url and not host_name:
        raise click.UsageError("give the engine's --url, or --host H -i INVENTORY")
    if host_name and not inventories:
        raise click.UsageError("--host needs the inventory that names it (-i INVENTORY)")
    # Progress quotes the server (its model names, its errors): shown as text, never markup.
    progress = (
        (lambda _msg: None) if as_json else (lambda msg: err.print(f"[dim]{markup(msg)}[/dim]"))
    )
    try:
        opts = _options(url, gds_dir, host_name, list(inventories), known_hosts, timeout_s)
        opts = dataclasses.replace(
            opts,
            model=model,
            prompt_tokens=prompt_tokens,
            prompts=prompts,
            seed=seed,
            evict=evict,
            service_log=service_log,
            lmcache_server_url=lmcache_server_url,
        )
        evidence = run_smoke(opts, progress)
    except SmokeError as exc:
        if as_json:  # scripts read stdout: the failure is a document there too
            doc = {"status": "ERROR", "exit_code": int(exc.rc), "error": str(exc)}
            click.echo(json_safe(json.dumps(doc)))
        raise
    items = judge(evidence, min_ttft_drop, logprob_tolerance)
    fleet = as_fleet(evidence.url, items)
    if junit_file is not None:
        write_junit(junit_file, fleet, suite_name="kvops-smoke")
    if as_json:
        doc = {**fleet.to_dict(), **report_dict(evidence, items)}
        click.echo(json_safe(json.dumps(doc, indent=2, ensure_ascii=False)))
    else:
        out = Console(width=None if sys.stdout.isatty() else 120)  # logs and CI: not 80 columns
        title = f"kvops smoke {evidence.url} (prompt seed {evidence.seed})"
        out.print(host_table(title, fleet.findings[evidence.url], verbose=verbose))
        verdict = overall(items)
        out.print(Text.assemble("smoke: ", (str(verdict), STYLE[verdict])))
    return exit_code(items)


def _options(
    url: str | None,
    gds_dir: Path | None,
    host_name: str | None,
    inventories: list[str],
    known_hosts: Path | None,
    timeout_s: float,
) -> SmokeOptions:
    """Where to send requests and where to look for chunk files: here, or on an inventory host."""
    if not host_name:
        assert url is not None
        return SmokeOptions(url=url, gds_dir=gds_dir, timeout_s=timeout_s)
    from kvops.remote.ssh import SshOptions
    from kvops.smoke.remote import RemoteChunks, host_target

    target = host_target(inventories, host_name, url, str(gds_dir) if gds_dir else None)
    ssh = SshOptions(known_hosts=known_hosts.expanduser() if known_hosts else None)
    chunks = RemoteChunks(target.host, target.gds_dir, ssh) if target.gds_dir else None
    return SmokeOptions(
        url=target.url,
        timeout_s=timeout_s,
        chunks=chunks,
        service_log_source=_HostJournal(target.host, ssh),
    )


@dataclasses.dataclass(frozen=True)
class _HostJournal:
    """`--host`: this start's service log is the host's journal as validate's probe reads it
    (one probe run over the same transport; `kvops.smoke.remote.journal_service_log` reads it)."""

    host: InventoryHost
    ssh: SshOptions

    def read(self) -> ServiceLog:
        from kvops.remote.inventory import probe_options, probe_settings
        from kvops.smoke.remote import journal_service_log
        from kvops.validate.collect import probe_config, probe_host

        settings = probe_settings(self.host)
        where = f"{self.host.name}: journal of {settings['vllm_service']}"
        config = probe_config(self.host, settings, probe_options(self.host), self.ssh.timeout_s)
        result = probe_host(self.host, config, self.ssh)
        if not result.ok:
            return ServiceLog(where, 0, error=f"probe failed: {result.reason}")
        return journal_service_log(where, result.evidence)
