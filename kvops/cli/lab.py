"""`kvops lab up|down|status|restart|demo`: the local lab of disposable Debian test hosts
(needs root).

Thin: options in, :class:`kvops.lab.lab.Lab` (and :mod:`kvops.lab.demo`) does the work, one
clear line out on failure (exit 2, "could not run", never a traceback). ``make lab`` runs
``kvops lab demo``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from kvops.cli.group import KvopsGroup
from kvops.cli.spec_help import package_list_reference_epilog
from kvops.lab.config import MAX_SLOT, LabConfig, find_project_root
from kvops.lab.demo import run_demo
from kvops.lab.errors import LabError
from kvops.lab.lab import Lab, missing_prerequisites, slot_lock

# The lab's role settings and its declarations for `kvops validate` (inventory sources in
# tests/lab/), written into hosts.yml so `-i inventories/lab` alone is enough for both.
DEFAULT_VARS_FILES = ("site_lab_vars.yml", "validate_lab_vars.yml")


def _config(
    hosts: int,
    name_prefix: str,
    slot: int,
    packages: Path | None,
    vars_files: tuple[Path, ...] | None = None,
) -> LabConfig:
    root = find_project_root()
    lab_tests = root / "tests" / "lab" if root else None
    if packages is None:
        candidate = lab_tests / "packages.yml" if lab_tests else None
        packages = candidate if candidate and candidate.is_file() else None
    if vars_files is None:
        found = [lab_tests / name for name in DEFAULT_VARS_FILES] if lab_tests else []
        vars_files = tuple(p for p in found if p.is_file())
    try:
        return LabConfig(
            slot=slot,
            hosts=hosts,
            name_prefix=name_prefix,
            packages_spec=packages,
            vars_files=vars_files,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _require_lab() -> None:
    """Say plainly why the lab cannot run here, before touching anything."""
    reasons = missing_prerequisites()
    if reasons:
        raise LabError("the lab cannot run here: " + "; ".join(reasons))


@contextmanager
def _lab_errors() -> Iterator[None]:
    """An OS error on the way (permissions, a full disk) is a lab error: one line, exit 2."""
    try:
        yield
    except OSError as exc:
        raise LabError(str(exc)) from exc


@click.group("lab", cls=KvopsGroup)
def lab() -> None:
    """The local lab: disposable Debian test hosts for running the roles (needs root).

    \b
    Each host: an overlayfs over a cached Debian 12 image, its own network/mount/UTS/PID
    namespaces on a private bridge 10.200.<slot>.0/24 (no forwarding from it: nothing leaves
    the machine), sshd as PID 1, CAP_SYS_MODULE dropped, a local apt repo of test doubles.

    \b
    kvops lab demo                the whole path: hosts, site.yml, deploy.yml, validate,
                                  smoke --host, ab-test --deploy (what `make lab` runs)
    kvops lab up --hosts 3        start 3 hosts; writes inventories/lab/hosts.yml and .ssh/
    ansible-playbook -i inventories/lab playbooks/site.yml
    kvops validate -i inventories/lab
    kvops lab status --json
    kvops lab restart kvlab-1     reboot one host (modules-load.d, fstab NFS replayed)
    kvops lab down
    """


_slot_option = click.option(
    "--slot",
    type=click.IntRange(0, MAX_SLOT),
    default=0,
    show_default=True,
    help="Lab instance: 0 for `make lab`; the pytest fixtures take free ones of 1..31.",
)


@lab.command("up", epilog=package_list_reference_epilog())
@click.option("--hosts", "hosts", type=click.IntRange(1, 50), default=2, show_default=True)
@click.option("--name-prefix", default="kvlab", show_default=True, help="Hosts are PREFIX-1..N.")
@click.option(
    "--packages",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Package list of the test apt repo [default: tests/lab/packages.yml of this checkout].",
)
@click.option(
    "--vars",
    "vars_files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Inventory source whose gpu_hosts vars go into hosts.yml; repeatable, later wins "
    "[default: tests/lab/site_lab_vars.yml and tests/lab/validate_lab_vars.yml].",
)
@_slot_option
def up(
    hosts: int, name_prefix: str, packages: Path | None, vars_files: tuple[Path, ...], slot: int
) -> None:
    """Start fresh hosts (replacing a running lab in the same slot)."""
    cfg = _config(hosts, name_prefix, slot, packages, vars_files or None)
    _require_lab()
    with _lab_errors(), slot_lock(cfg.lab_dir, cfg.slot):
        state = Lab(cfg, log=lambda msg: click.echo(f"lab: {msg}", err=True)).up()
    if cfg.packages_spec is None:
        click.echo("lab: no tests/lab/packages.yml found: hosts have no test apt repo", err=True)
    for h in state.hosts:
        click.echo(f"{h.name}\t{h.ip}")
    inv = Path(state.inventory_dir)
    click.echo(f"inventory: {inv / 'hosts.yml'}  (ansible-playbook -i {inv} ...)")
    for path in cfg.vars_files:
        click.echo(f"lab vars: {path}")
    click.echo("tear down: kvops lab down")


@lab.command("down")
@_slot_option
@click.option(
    "--all",
    "all_slots",
    is_flag=True,
    help="Every slot 0..31 not locked by a running session (cleans labs of killed sessions).",
)
def down(slot: int, all_slots: bool) -> None:
    """Stop every host of the slot; remove namespaces, links, the bridge and host files."""
    _require_lab()
    slots = list(range(MAX_SLOT + 1)) if all_slots else [slot]
    for number in slots:
        cfg = _config(1, "kvlab", number, None)
        with _lab_errors(), slot_lock(cfg.lab_dir, cfg.slot, wait=not all_slots) as lock:
            if lock is None:
                click.echo(f"lab slot {number}: in use by a running session, left alone")
                continue
            removed = Lab(cfg).down()
        if removed or not all_slots:
            names = ", ".join(removed) if removed else "nothing was running"
            click.echo(f"lab slot {number}: removed {len(removed)} host(s): {names}")


@lab.command("restart")
@click.argument("name")
@_slot_option
def restart(name: str, slot: int) -> None:
    """Reboot host NAME: same disk, fresh processes and mounts, modules-load.d replayed."""
    cfg = _config(1, "kvlab", slot, None)
    _require_lab()
    with _lab_errors(), slot_lock(cfg.lab_dir, cfg.slot):
        state = Lab(cfg).restart_host(name)
    click.echo(f"{state.name}\t{state.ip}\trestarted")


@lab.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_slot_option
def status(as_json: bool, slot: int) -> None:
    """Show the hosts of a slot: process alive, SSH answering."""
    cfg = _config(1, "kvlab", slot, None)
    with _lab_errors():
        report = Lab(cfg).status()
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    if not report["up"]:
        click.echo(f"lab slot {slot}: down")
        return
    click.echo(f"lab slot {slot}: bridge {report['bridge']} ({report['gateway_ip']})")
    for h in report["hosts"]:
        state = "up" if h["ssh"] else ("process alive, no ssh" if h["alive"] else "DEAD")
        click.echo(f"  {h['name']:<16} {h['ip']:<14} {state}")
    click.echo(f"inventory: {report['inventory']}")


@lab.command("demo")
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("runs/lab-demo"),
    show_default=True,
    help="The ab-test run directory (replaced if there).",
)
def demo(out: Path) -> None:
    """Provision, validate and prove on the lab, end to end (what `make lab` runs; root).

    \b
    Two hosts up (slot 0, replacing a lab there), playbooks/site.yml converged on both,
    playbooks/deploy.yml (kvlab-1 offload, kvlab-2 baseline), kvops validate, kvops smoke
    --host kvlab-1, then kvops ab-test --deploy switching kvlab-1 between baseline and offload
    on multi-shared-prefix (scale 0.05, 2 trials). Several minutes; the hosts stay up after it
    (kvops lab down).
    """
    if os.geteuid() != 0:
        raise LabError(
            "kvops lab demo needs root: the lab creates network namespaces, a bridge and "
            "mounts (run `sudo make lab`, or `sudo .venv/bin/kvops lab demo`)"
        )
    root = find_project_root()
    if root is None or not (root / "tests" / "lab" / "deploy_lab_vars.yml").is_file():
        raise LabError("kvops lab demo runs the lab files of a kvops checkout: run it from one")
    _require_lab()
    with _lab_errors():
        run_dir = run_demo(root, out, lambda msg: click.echo(msg, err=True))
    click.echo(f"report: {run_dir / 'report.md'}")
    click.echo(f"        {run_dir / 'report.html'}")
    click.echo(f"results: {run_dir / 'results.json'} (deploys: {run_dir / 'deploys.jsonl'})")
    click.echo("lab hosts stay up: inventories/lab/hosts.yml; tear down: kvops lab down")
