"""`kvops ab-test --deploy`: before each segment, put the arm's variant on the host with
playbooks/deploy.yml (GDS directory cleared), so the reference procedure - baseline, stop,
offload, same workload - is one command.

Ansible is driven through ansible-runner (the library AWX uses,
https://ansible.readthedocs.io/projects/runner/en/stable/python_interface/): its events stream to
the progress display, and every deploy's outcome, the variant, and what the role reports as
deployed (packages or image, LMCache config, connector, command line; secrets redacted with
kvops.probe.redact) go to ``deploys.jsonl`` in the run directory, and from there, summarized per
arm (kvops.abtest.deploy_summary), into results.json and the reports. A failed play stops the
run with the play's own error (exit 2); the records measured so far stay, and the reports are
written with the failed deploy in them.

Where the playbook comes from: a kvops checkout's ``playbooks/deploy.yml`` with the checkout's
``ansible.cfg`` when kvops runs inside one; anywhere else the installed kvops.gds collection's
``kvops.gds.deploy``, run from the working directory with the user's own Ansible configuration
(ansible.cfg, ``ANSIBLE_*``; with no ``-i``, the inventory Ansible is configured with), as
``ansible-playbook kvops.gds.deploy`` would be (kvops.remote.collection).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvops.abtest.arms import Arm
from kvops.errors import KvopsError
from kvops.probe.redact import SECRET_NAME, redact_text, redact_value
from kvops.remote.collection import playbook as collection_playbook

# What an arm name means as a variant of the vllm_lmcache role (an arm may also be named after
# the variant directly: offload_cpu_gds, offload_mp).
VARIANTS = ("baseline", "offload", "offload_cpu_gds", "offload_mp")
DEPLOYED_FACT = "vllm_lmcache_deployed"
MAX_ERROR_CHARS = 2000


class DeployError(KvopsError):
    """The deploy of an arm failed (or could not run): the play's error, exit 2."""


@dataclass(frozen=True)
class DeploySettings:
    # a checkout holding playbooks/deploy.yml, roles/ and ansible.cfg; None: the installed
    # kvops.gds collection with the user's own configuration
    project_root: Path | None
    inventories: list[str]  # empty: Ansible's configured inventory (ANSIBLE_INVENTORY, ansible.cfg)
    limit: str
    extra_vars: dict[str, Any] = field(default_factory=dict)
    clear_gds_dir: bool = True

    @property
    def playbook(self) -> str:
        if self.project_root is None:
            return collection_playbook("deploy")
        return str(self.project_root / "playbooks" / "deploy.yml")

    def runner_kwargs(self) -> dict[str, Any]:
        """Where and how ansible-runner runs the playbook: from the checkout with its
        ansible.cfg, or from the working directory with whatever Ansible finds there."""
        kwargs: dict[str, Any] = {"playbook": self.playbook}
        if self.inventories:
            kwargs["inventory"] = list(self.inventories)
        if self.project_root is None:
            kwargs["project_dir"] = str(Path.cwd())
        else:
            kwargs["project_dir"] = str(self.project_root)
            kwargs["envvars"] = {"ANSIBLE_CONFIG": str(self.project_root / "ansible.cfg")}
        return kwargs


def variant_of(arm_name: str) -> str:
    """The role variant an arm deploys: its name, which must be one of VARIANTS."""
    if arm_name not in VARIANTS:
        raise DeployError(
            f"arm {arm_name!r} names no deploy variant: with --deploy, arms are named "
            f"{', '.join(VARIANTS)}"
        )
    return arm_name


@dataclass
class _PlayWatch:
    """Collects, from ansible-runner's events, what the run record and the error need."""

    progress: Callable[[str], None]
    label: str
    failures: list[str] = field(default_factory=list)
    deployed: dict[str, Any] = field(default_factory=dict)
    changed: int = 0

    def __call__(self, event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if kind == "playbook_on_task_start":
            self.progress(f"{self.label}: {data.get('task', '')}")
        elif kind in ("runner_on_failed", "runner_on_unreachable") and not data.get(
            "ignore_errors"
        ):
            res = data.get("res") or {}
            msg = res.get("msg") or res.get("stderr") or json.dumps(res)[:500]
            self.failures.append(f"{data.get('host', '?')}: {data.get('task', '')}: {msg}")
        elif kind == "runner_on_ok":
            res = data.get("res") or {}
            self.changed += 1 if res.get("changed") else 0
            facts = res.get("ansible_facts") or {}
            if DEPLOYED_FACT in facts:
                self.deployed[str(data.get("host", "?"))] = facts[DEPLOYED_FACT]
        return True


class ArmDeployer:
    """Deploys an arm's variant on the host(s) of ``settings.limit``; writes deploys.jsonl."""

    def __init__(
        self, settings: DeploySettings, run_dir: Path, progress: Callable[[str], None]
    ) -> None:
        self.settings = settings
        self.log_path = run_dir / "deploys.jsonl"
        self.progress = progress

    def deploy(self, arm: Arm) -> dict[str, Any]:
        """Run deploy.yml for ``arm``; returns the record; raises DeployError when it fails."""
        import ansible_runner  # heavy import: only --deploy needs it

        variant = variant_of(arm.name)
        cfg = self.settings
        extra = {
            **cfg.extra_vars,
            "vllm_lmcache_variant": variant,
            "vllm_lmcache_clear_gds_dir": cfg.clear_gds_dir,
        }
        watch = _PlayWatch(self.progress, f"deploy {variant} on {cfg.limit}")
        started = time.monotonic()
        record: dict[str, Any] = {
            "arm": arm.name,
            "variant": variant,
            "limit": cfg.limit,
            "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "clear_gds_dir": cfg.clear_gds_dir,
        }
        with tempfile.TemporaryDirectory(prefix="kvops-deploy-") as private:
            try:
                result = ansible_runner.run(
                    private_data_dir=private,
                    limit=cfg.limit,
                    extravars=extra,
                    event_handler=watch,
                    quiet=True,
                    **cfg.runner_kwargs(),
                )
                status, rc = str(result.status), result.rc
            except Exception as exc:  # ansible-runner raises for a missing binary or bad input
                status, rc = "error", None
                watch.failures.append(f"ansible-runner could not run: {exc}")
        record.update(
            status=status,
            rc=rc,
            duration_s=round(time.monotonic() - started, 1),
            changed_tasks=watch.changed,
            # redacted before it is written: a config may hold a remote URL's credentials, a
            # failed task's message may echo its environment
            deployed=redact_value(watch.deployed),
            errors=[redact_text(f[:MAX_ERROR_CHARS]) for f in watch.failures],
        )
        with self.log_path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        if status != "successful":
            why = record["errors"][0] if record["errors"] else f"status {status}"
            raise DeployError(
                f"deploy of arm {arm.name} (variant {variant}) on {cfg.limit} failed: {why} "
                f"(record: {self.log_path})"
            )
        return record

    async def __call__(self, arm: Arm) -> None:
        """The experiment's prepare-arm hook: deploy without blocking the event loop."""
        await asyncio.to_thread(self.deploy, arm)


def deploy_arms(settings: DeploySettings, names: list[str], model: str | None) -> list[Arm]:
    """Arms named after variants, each served by every inventory host ``settings.limit``
    selects, at its role's port (``vllm_lmcache_port``, default 8000): one host gives one
    endpoint per arm; several (e.g. offload hosts sharing one GDS directory on the export) give
    each arm all of them, switched together by one deploy.yml run per arm and served as a fleet
    arm (``--route``)."""
    from kvops.remote.inventory import InventoryError, load_inventory

    for name in names:
        variant_of(name)
    if len(names) < 2 or len(set(names)) != len(names):
        raise DeployError(f"--deploy needs two or more different variants, got {names}")
    try:
        hosts = load_inventory(settings.inventories, limit=settings.limit)
    except InventoryError as exc:
        raise DeployError(str(exc)) from exc
    if not hosts:
        raise DeployError(f"--limit {settings.limit} selects no inventory host for --deploy")
    urls = []
    for host in hosts:
        port = settings.extra_vars.get("vllm_lmcache_port") or host.vars.get("vllm_lmcache_port")
        urls.append(f"http://{host.address}:{int(port or 8000)}")
    return [Arm(name, urls[0], model, tuple(urls[1:])) for name in names]


def deploy_record(settings: DeploySettings) -> dict[str, Any]:
    """The settings as run.json keeps them (for --resume). A secret-named extra var (a token,
    key or password: the redactor's names) is kept by name only: run.json is an ordinary file
    in an ordinary directory, so `--resume` asks for those values again (`--deploy-var`)."""
    secret = sorted(k for k in settings.extra_vars if SECRET_NAME.search(k))
    return {
        "project_root": None if settings.project_root is None else str(settings.project_root),
        "inventories": list(settings.inventories),
        "limit": settings.limit,
        "extra_vars": {k: v for k, v in settings.extra_vars.items() if k not in secret},
        "secret_extra_vars": secret,
        "clear_gds_dir": settings.clear_gds_dir,
    }


def settings_from_record(record: Mapping[str, Any], secrets: Mapping[str, Any]) -> DeploySettings:
    """`deploy_record` read back for --resume, with the secret extra vars given again on the
    command line. Raises DeployError naming what is missing or not expected."""
    fields = dict(record)
    needed = [str(k) for k in fields.pop("secret_extra_vars", [])]
    missing = [k for k in needed if k not in secrets]
    if missing:
        raise DeployError(
            "--resume: run.json keeps no secret; give "
            + ", ".join(missing)
            + " again with --deploy-var KEY=VALUE (or keep it in the inventory, vaulted)"
        )
    unexpected = sorted(set(secrets) - set(needed))
    if unexpected:
        raise DeployError(
            "--resume takes --deploy-var only for the run's secret vars ("
            + (", ".join(needed) or "none")
            + "), not "
            + ", ".join(unexpected)
        )
    fields["extra_vars"] = {**fields.get("extra_vars", {}), **dict(secrets)}
    root = fields.pop("project_root", None)
    return DeploySettings(project_root=None if root is None else Path(root), **fields)
