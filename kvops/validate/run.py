"""The I/O half of `kvops validate`: one request in, the judged fleet out.

Why a request object and one call (as `ab-test` does with `AbTestRequest` → `run_ab_test`): the
CLI only turns options into a `ValidateRequest` and renders the `ValidateOutcome`, so scripts and
tests drive the same path without click. Here: the inventory (`kvops.remote.inventory`), the
probe over SSH in parallel (`kvops.validate.collect`), the ONTAP clusters over REST
(`kvops.validate.ontap`, with `--ontap`) or a saved bundle, then the pure judges
(`kvops.validate.judge`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvops.checks import Thresholds
from kvops.checks.fleet import FleetResult
from kvops.checks.ontap import OntapThresholds
from kvops.errors import RC, KvopsError
from kvops.ontap.target import is_ontap_host
from kvops.remote.inventory import InventoryHost, load_inventory, probe_options, probe_settings
from kvops.remote.ssh import SshOptions
from kvops.report.host_text import markup
from kvops.validate import ontap as ontap_fleet
from kvops.validate.collect import HostResult, probe_config, probe_fleet
from kvops.validate.judge import judge_fleet, load_evidence, save_evidence

# One line of rich markup for the operator (stderr). Whatever in it came from a host or a file
# (a probe's reason quotes the host's stderr) is escaped by `markup`: shown, never parsed.
Progress = Callable[[str], None]


@dataclass(frozen=True)
class ValidateRequest:
    """What to validate: an inventory to probe (`inventories`, `limit`) or a saved bundle
    (`from_dir`), with how to reach the hosts and what to judge them against."""

    inventories: tuple[str, ...] = ()
    limit: str | None = None
    from_dir: Path | None = None
    storage_bench: bool = False
    bench_size: str | None = None
    bench_io_size: str | None = None
    forks: int = 16
    forks_given: int | None = None  # --forks as given: with --via ansible, None = Ansible's own
    timeout_s: float = 120.0
    known_hosts: Path | None = None
    accept_new_host_keys: bool = False
    vault_password_files: tuple[str, ...] = ()
    vault_ids: tuple[str, ...] = ()
    thresholds: Thresholds = field(default_factory=Thresholds)
    strict: bool = False
    ontap: bool = False
    ontap_ca_file: Path | None = None
    ontap_thresholds: OntapThresholds = field(default_factory=OntapThresholds)
    save_dir: Path | None = None
    # "ssh": kvops's own SSH fan-out; "ansible": playbooks/validate.yml with the probe module
    # (kvops.validate.via_ansible). Same probe, configs and judges.
    via: str = "ssh"


@dataclass
class ValidateOutcome:
    """The judged fleet, and how probing each host went (empty for a saved bundle)."""

    fleet: FleetResult
    probes: list[HostResult] = field(default_factory=list)

    def transport(self) -> dict[str, dict[str, Any]]:
        """`--json`'s `transport`: per host `status`, `reason`, `duration_s`."""
        return {
            r.host: {"status": str(r.status), "reason": r.reason, "duration_s": r.duration_s}
            for r in self.probes
        }


def _quiet(_: str) -> None:
    """No progress lines."""


def run_validate(req: ValidateRequest, progress: Progress = _quiet) -> ValidateOutcome:
    """Collect (or load) the evidence, save it when asked, judge it. Raises `KvopsError`
    (exit 2) for an unreadable inventory or bundle, `RC.INTERRUPTED` on Ctrl-C."""
    probes: list[HostResult] = []
    clusters: list[dict[str, Any]] = []
    addresses: dict[str, str] = {}
    if req.from_dir is not None:
        documents = load_evidence(req.from_dir)
        clusters = [d for d in documents if ontap_fleet.is_ontap_document(d)]
        documents = [d for d in documents if not ontap_fleet.is_ontap_document(d)]
        progress(f"judging {len(documents)} saved evidence documents from {markup(req.from_dir)}")
    else:
        hosts = load_inventory(
            list(req.inventories), req.limit, list(req.vault_password_files), list(req.vault_ids)
        )
        ontap_hosts = [h for h in hosts if is_ontap_host(h)]
        hosts = [h for h in hosts if not is_ontap_host(h)]
        if req.ontap:
            if not ontap_hosts:
                raise KvopsError("--ontap: the inventory (or --limit) has no host in group 'ontap'")
            progress(f"reading {len(ontap_hosts)} ONTAP cluster(s) over REST ...")
            clusters = ontap_fleet.collect_clusters(ontap_hosts, req.ontap_ca_file, req.timeout_s)
            addresses = ontap_fleet.storage_addresses(hosts)
        probes = _probe(req, hosts, progress)
        documents = [dict(r.evidence) for r in probes]
    if req.save_dir is not None:
        paths = save_evidence(req.save_dir, [*documents, *clusters])
        progress(f"saved {len(paths)} evidence documents to {markup(req.save_dir)}")
    fleet = judge_fleet(
        documents, req.thresholds, req.strict, clusters, addresses, req.ontap_thresholds
    )
    return ValidateOutcome(fleet, probes)


def _probe(
    req: ValidateRequest, hosts: list[InventoryHost], progress: Progress
) -> list[HostResult]:
    if not hosts:
        return []
    for host in hosts:
        for warning in host.warnings:
            progress(f"[yellow]warning[/] {markup(host.name)}: {markup(warning)}")
    gdsio = {"size": req.bench_size or "", "io_size": req.bench_io_size or ""}
    configs = {
        h.name: probe_config(
            h, probe_settings(h, req.storage_bench, gdsio), probe_options(h), req.timeout_s
        )
        for h in hosts
    }
    ssh = SshOptions(
        known_hosts=req.known_hosts.expanduser() if req.known_hosts else None,
        accept_new_host_keys=req.accept_new_host_keys,
        timeout_s=req.timeout_s,
    )
    if req.via == "ansible":
        return _probe_via_ansible(req, hosts, configs, progress)
    progress(
        f"probing {len(hosts)} host(s), forks {min(req.forks, len(hosts))}, "
        f"timeout {req.timeout_s:.0f} s{', with storage bench' if req.storage_bench else ''} ..."
    )

    return _fan_out(req, hosts, configs, ssh, progress)


def _report(progress: Progress) -> Callable[[HostResult], None]:
    def report(res: HostResult) -> None:
        if res.ok:
            progress(f"  [green]probed[/]  {markup(res.host)} ({res.duration_s:.1f} s)")
        else:
            progress(f"  [bold red]{res.status}[/]  {markup(res.host)}: {markup(res.reason)}")

    return report


def _probe_via_ansible(
    req: ValidateRequest,
    hosts: list[InventoryHost],
    configs: dict[str, dict[str, Any]],
    progress: Progress,
) -> list[HostResult]:
    from kvops.validate.via_ansible import probe_via_ansible

    progress(f"probing {len(hosts)} host(s) through Ansible (kvops.gds.validate) ...")
    try:
        return probe_via_ansible(
            hosts,
            configs,
            list(req.inventories),
            req.forks_given,
            req.timeout_s,
            on_result=_report(progress),
        )
    except KeyboardInterrupt:
        raise KvopsError("interrupted: no report", rc=RC.INTERRUPTED) from None


def _fan_out(
    req: ValidateRequest,
    hosts: list[InventoryHost],
    configs: dict[str, dict[str, Any]],
    ssh: SshOptions,
    progress: Progress,
) -> list[HostResult]:
    try:
        return probe_fleet(hosts, configs, ssh, forks=req.forks, on_result=_report(progress))
    except KeyboardInterrupt:
        raise KvopsError(
            "interrupted: no report (hosts' probes end at their remote timeout)",
            rc=RC.INTERRUPTED,
        ) from None
