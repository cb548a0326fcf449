"""`kvops validate`: probe every GPU host once over SSH, judge the evidence locally, report.

Thin by design: options → a `ValidateRequest` → `kvops.validate.run.run_validate` (inventory,
probe over SSH in parallel, ONTAP over REST, pure judges) → table, JSON or JUnit
(`kvops.report.findings`) → exit code.
Progress goes to stderr so `--json` on stdout stays machine-readable.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from kvops.checks import Thresholds
from kvops.checks.ontap import OntapThresholds
from kvops.errors import RC
from kvops.report.findings import render_terminal, write_junit
from kvops.validate.run import ValidateRequest, run_validate

EXAMPLES = """
\b
Examples:
  kvops validate -i inventories/prod
  kvops validate -i inventories/prod --limit 'gpu_hosts:!gpu-07' --storage-bench
  kvops validate -i inventories/prod --json --junit validate.xml --save-evidence runs/ev
  kvops validate --from-evidence runs/ev          # judge a saved bundle offline
  KVOPS_ONTAP_USERNAME=kvops-ro KVOPS_ONTAP_PASSWORD=... \\
    kvops validate -i inventories/prod --ontap --ontap-ca-file ca.pem   # + the cluster
\b
Exit status: 0 every host passed (WARN allowed; with --strict not on the checks that prove
the GDS path), 1 some check FAILed, 2 could not run
(bad inventory or bundle, or some host could not be probed: unreachable, auth refused, host
key unknown or changed, timed out).
"""


@click.command("validate", epilog=EXAMPLES)
@click.option(
    "-i",
    "--inventory",
    "inventories",
    multiple=True,
    metavar="INV",
    help="Ansible inventory (path or comma list), read with ansible-inventory.",
)
@click.option(
    "-l",
    "--limit",
    metavar="PATTERN",
    help="Ansible host pattern: names, groups, globs, 'a:b', 'g:!host', 'g:&h'.",
)
@click.option(
    "--storage-bench",
    is_flag=True,
    help="Also run gdsio write+read in each host's GDS directory (minutes; writes "
    "--bench-size per thread, removed afterwards).",
)
@click.option("--bench-size", metavar="SIZE", help="gdsio file size per thread (default 1G).")
@click.option("--bench-io-size", metavar="SIZE", help="gdsio IO size (default 1M).")
@click.option(
    "--forks",
    type=click.IntRange(min=1),
    default=None,
    help="Hosts probed in parallel [default: ANSIBLE_FORKS, else 16; with --via ansible, "
    "Ansible's configured forks].",
)
@click.option(
    "--via",
    type=click.Choice(["ssh", "ansible"]),
    default="ssh",
    show_default=True,
    help="Transport: kvops's own SSH fan-out, or Ansible (the kvops.gds collection's "
    "validate playbook and probe module: Ansible's connections, become, forks).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    help="Seconds per host, connect to last byte [default: 120, 600 with --storage-bench].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON on stdout.")
@click.option(
    "--junit",
    "junit_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write JUnit XML: one testcase per host x check.",
)
@click.option(
    "--save-evidence",
    "save_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write each host's evidence document to DIR/<host>.json.",
)
@click.option(
    "--from-evidence",
    "from_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Judge a saved evidence bundle instead of probing (no SSH).",
)
@click.option(
    "--known-hosts",
    type=click.Path(dir_okay=False, path_type=Path),
    help="known_hosts file host keys are verified against [default: the inventory's "
    "-o UserKnownHostsFile=, else ~/.ssh/known_hosts].",
)
@click.option(
    "--accept-new-host-keys",
    is_flag=True,
    help="Trust and record keys of hosts not yet in --known-hosts (a CHANGED key "
    "is still refused).",
)
@click.option(
    "--vault-password-file",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="Passed to ansible-inventory for vaulted variables.",
)
@click.option("--vault-id", multiple=True, help="Passed to ansible-inventory.")
@click.option(
    "--min-free-gib",
    type=click.FloatRange(min=0),
    help="GDS dir free-space floor [10]; a host's kvops_min_free_gib beats it.",
)
@click.option(
    "--max-fill-pct",
    type=click.FloatRange(min=0, max=100),
    help="GDS dir file system fill level above which GDS-083 WARNs [85].",
)
@click.option(
    "--bench-min-link-share",
    type=click.FloatRange(min=0, max=1),
    help="gdsio throughput below this share of the RDMA link rate WARNs (0.70).",
)
@click.option(
    "--ontap",
    is_flag=True,
    help="Also read each cluster of the inventory's `ontap` group over its REST API (GETs "
    "only; credentials from KVOPS_ONTAP_USERNAME/KVOPS_ONTAP_PASSWORD or vaulted "
    "kvops_ontap_username/kvops_ontap_password) and judge it with the hosts' mounts.",
)
@click.option(
    "--ontap-ca-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="CA bundle the cluster's HTTPS certificate is verified against [default: the "
    "inventory's ontap_export_ca_file, else the system store]. Never skipped.",
)
@click.option(
    "--ontap-min-free-pct",
    type=click.FloatRange(min=0, max=100),
    default=10.0,
    show_default=True,
    help="The KV-cache volume's free share below which ONT-031 FAILs.",
)
@click.option("-v", "--verbose", is_flag=True, help="Show evidence excerpts in the tables.")
@click.option("--problems-only", is_flag=True, help="Tables list only FAIL and WARN rows.")
@click.option(
    "--strict",
    is_flag=True,
    help="For CI gates: WARN or SKIP of a path-proving check (GDS platform GDS-04x, storage "
    "bench GDS-05x, compat mode GDS-032) exits 1. Needs --storage-bench to pass.",
)
def validate(**options: Any) -> RC:
    """Prove each GPU host's GDS offload path is really in place, fleet-wide.

    One SSH round trip per host ships a stdlib-only probe (Python >= 3.8 on the host) that
    records driver, nvidia-fs, RDMA, mounts, cufile.json, gdscheck, the vLLM service, LMCache
    config and the GDS directory; the checks then judge that evidence here. Host keys are
    verified against --known-hosts; hosts and variables come from ansible-inventory.
    """
    view = _View(
        **{k: options.pop(k) for k in ("as_json", "junit_file", "verbose", "problems_only")}
    )
    err = Console(stderr=True, highlight=False)
    outcome = run_validate(_request(**options), err.print)
    fleet = outcome.fleet
    if fleet.strict and fleet.unproven():
        err.print(f"--strict: {len(fleet.unproven())} path-proving check(s) WARN/SKIP: exit 1")
    if view.junit_file is not None:
        write_junit(view.junit_file, fleet)
    if view.as_json:
        out = fleet.to_dict()
        if outcome.probes:
            out["transport"] = outcome.transport()
        click.echo(json.dumps(out, indent=2, sort_keys=True))
    else:
        render_terminal(fleet, Console(), verbose=view.verbose, problems_only=view.problems_only)
    return fleet.exit_code()


@dataclass(frozen=True)
class _View:
    """How to show the outcome (the rest of the options make the request)."""

    as_json: bool
    junit_file: Path | None
    verbose: bool
    problems_only: bool


def _request(
    *,
    inventories: tuple[str, ...],
    limit: str | None,
    from_dir: Path | None,
    storage_bench: bool,
    bench_size: str | None,
    bench_io_size: str | None,
    forks: int | None,
    via: str,
    timeout_s: float | None,
    known_hosts: Path | None,
    accept_new_host_keys: bool,
    vault_password_file: tuple[str, ...],
    vault_id: tuple[str, ...],
    min_free_gib: float | None,
    max_fill_pct: float | None,
    bench_min_link_share: float | None,
    strict: bool,
    ontap: bool,
    ontap_ca_file: Path | None,
    ontap_min_free_pct: float,
    save_dir: Path | None,
) -> ValidateRequest:
    """The options as a `ValidateRequest`; usage errors name the conflicting options."""
    if from_dir is not None and (inventories or limit):
        raise click.UsageError("--from-evidence judges a saved bundle: drop -i/--limit")
    if from_dir is None and not inventories:
        raise click.UsageError("give an inventory (-i INV) or a bundle (--from-evidence DIR)")
    if from_dir is not None and via != "ssh":
        raise click.UsageError("--from-evidence judges a saved bundle: drop --via")
    if via == "ansible" and (known_hosts is not None or accept_new_host_keys):
        raise click.UsageError(
            "--known-hosts/--accept-new-host-keys are kvops's SSH path: with --via ansible, "
            "Ansible's own host key settings apply (host_key_checking, ssh args)"
        )
    thresholds = Thresholds()
    if min_free_gib is not None:
        thresholds = replace(thresholds, min_free_gib=min_free_gib)
    if max_fill_pct is not None:
        thresholds = replace(thresholds, max_fill_percent=max_fill_pct)
    if bench_min_link_share is not None:
        thresholds = replace(thresholds, bench_min_link_share=bench_min_link_share)
    return ValidateRequest(
        inventories=inventories,
        limit=limit,
        from_dir=from_dir,
        storage_bench=storage_bench,
        bench_size=bench_size,
        bench_io_size=bench_io_size,
        forks=forks or _env_forks(),
        forks_given=forks,
        via=via,
        timeout_s=timeout_s if timeout_s is not None else (600.0 if storage_bench else 120.0),
        known_hosts=known_hosts,
        accept_new_host_keys=accept_new_host_keys,
        vault_password_files=vault_password_file,
        vault_ids=vault_id,
        thresholds=thresholds,
        strict=strict,
        ontap=ontap,
        ontap_ca_file=ontap_ca_file,
        ontap_thresholds=OntapThresholds(min_free_percent=ontap_min_free_pct),
        save_dir=save_dir,
    )


def _env_forks() -> int:
    """ANSIBLE_FORKS when it is a positive number (as Ansible's own commands read it), else 16."""
    value = os.environ.get("ANSIBLE_FORKS", "")
    return int(value) if value.isdigit() and int(value) > 0 else 16
