"""`kvops validate --via ansible`: the probe as the kvops.gds.kvops_probe module, over Ansible.

The same probe code (the collection's module_utils are links to ``kvops/probe``), the same
per-host configuration (``kvops.validate.collect.probe_config`` from the inventory), the same
judges; only the transport differs: playbooks/validate.yml run through ansible-runner
(https://ansible.readthedocs.io/projects/runner/en/stable/python_interface/), so Ansible's
connection plugins, ``ssh_config``, bastions, become methods and forks reach the hosts. Each
host's outcome is read from the runner's events: the module's ``evidence``, or, for a host
Ansible could not reach or where the module failed, a document whose ``error`` is Ansible's
own message. A host the play never reported on is kept too, as "no result".
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvops import __version__
from kvops.errors import KvopsError
from kvops.remote.collection import checkout_root, collection_env, playbook
from kvops.remote.inventory import InventoryHost
from kvops.remote.ssh import MAX_OUTPUT
from kvops.validate.collect import HostResult, HostStatus, error_evidence

PROBE_TASK = "Kvops | Probe the host"
MAX_REASON_CHARS = 2000


@dataclass
class _Watch:
    """Collects the probe task's result per host from ansible-runner's events."""

    results: dict[str, tuple[HostStatus, dict[str, Any] | None, str]] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)
    on_result: Callable[[str], None] | None = None

    def __call__(self, event: Mapping[str, Any]) -> bool:
        data = event.get("event_data") or {}
        if data.get("task") != PROBE_TASK:
            return True
        host = str(data.get("host", ""))
        kind = event.get("event", "")
        res = data.get("res") or {}
        if kind == "runner_on_start":
            self.started[host] = time.monotonic()
            return True
        if kind == "runner_on_ok" and isinstance(res.get("evidence"), dict):
            size = len(json.dumps(res["evidence"]))
            if size > MAX_OUTPUT:  # the direct path's bound on what a host hands back
                why = f"probe output exceeds {MAX_OUTPUT} bytes ({size})"
                self.results[host] = (HostStatus.PROBE_FAILED, None, why)
            else:
                self.results[host] = (HostStatus.OK, res["evidence"], "")
        elif kind == "runner_on_unreachable" or res.get("unreachable"):
            why = str(res.get("msg") or "unreachable")
            self.results[host] = (HostStatus.UNREACHABLE, None, why[:MAX_REASON_CHARS])
        elif kind in ("runner_on_failed", "runner_on_ok"):
            why = str(res.get("msg") or json.dumps(res)[:500])
            self.results[host] = (HostStatus.PROBE_FAILED, None, why[:MAX_REASON_CHARS])
        else:
            return True
        if host in self.started:
            self.durations[host] = round(time.monotonic() - self.started[host], 3)
        if self.on_result is not None:
            self.on_result(host)
        return True


def probe_via_ansible(
    hosts: list[InventoryHost],
    configs: dict[str, dict[str, Any]],
    inventories: list[str],
    forks: int | None,
    timeout_s: float,
    on_result: Callable[[HostResult], None] | None = None,
    root: Path | None = None,
) -> list[HostResult]:
    """Run kvops.gds.validate on ``hosts`` (their inventory names as the limit); one result per
    host, in inventory order. ``root``: the checkout to use as the collection (default: the one
    around the working directory, else the installed collection). Raises KvopsError when
    ansible-runner cannot run at all."""
    import ansible_runner  # heavy import: only --via ansible needs it

    if not hosts:
        return []
    by_name = {h.name: h for h in hosts}
    results: dict[str, HostResult] = {}
    watch = _Watch()

    def result_of(name: str) -> HostResult:
        status, document, reason = watch.results.get(
            name, (HostStatus.PROBE_FAILED, None, "the play reported no result for this host")
        )
        settings = dict(configs[name].get("settings") or {})
        if document is None:
            return HostResult(
                name,
                status,
                error_evidence(name, settings, reason),
                reason,
                watch.durations.get(name, 0.0),
            )
        # who the host is and what it was asked to be are the inventory's (as on the SSH path)
        document = {**document, "host": name, "settings": settings}
        return HostResult(name, status, document, None, watch.durations.get(name, 0.0))  # type: ignore[arg-type]

    def tell(name: str) -> None:
        if name in by_name and on_result is not None:
            on_result(result_of(name))

    watch.on_result = tell
    # a vLLM API key goes to the module's no_log option, never into its logged `config`
    tokens = {n: c["http_bearer_token"] for n, c in configs.items() if c.get("http_bearer_token")}
    extravars = {
        "kvops_probe_configs": {
            n: {k: v for k, v in c.items() if k != "http_bearer_token"} for n, c in configs.items()
        },
        "kvops_probe_tokens": tokens,
        "kvops_probe_version": __version__,
        "kvops_validate_hosts": "all",
    }
    root = checkout_root() if root is None else root
    with (
        tempfile.TemporaryDirectory(prefix="kvops-validate-") as private,
        collection_env(root) as env,
    ):
        # the tokens: a 0600 file, not a command line
        vars_file = Path(private) / "probe-configs.json"
        vars_file.write_text(json.dumps(extravars))
        vars_file.chmod(0o600)
        kwargs: dict[str, Any] = {
            "private_data_dir": private,
            "project_dir": str(Path.cwd()),
            "playbook": playbook("validate"),
            "limit": ",".join(by_name),
            "cmdline": f"-e @{vars_file}",
            "envvars": env,
            "event_handler": watch,
            "quiet": True,
            "timeout": int(timeout_s * max(1, -(-len(hosts) // (forks or 5)))) + 60,
        }
        # ansible-playbook next to the running Python (the venv) first, as for ansible-inventory
        venv_bin = Path(sys.executable).parent
        if (venv_bin / "ansible-playbook").exists():
            kwargs["envvars"] = {
                **env,
                "PATH": os.pathsep.join([str(venv_bin), os.environ.get("PATH", os.defpath)]),
            }
        if inventories:
            kwargs["inventory"] = list(inventories)
        if forks:
            kwargs["forks"] = forks
        try:
            run = ansible_runner.run(**kwargs)
        except Exception as exc:  # a missing binary, a bad argument
            raise KvopsError(f"--via ansible: ansible-runner could not run: {exc}") from exc
        if not watch.results and run.rc not in (0, None):
            out = run.stdout.read() if run.stdout else ""
            raise KvopsError(
                f"--via ansible: {playbook('validate')} failed (rc {run.rc}, status "
                f"{run.status}): {out[-MAX_REASON_CHARS:].strip()}"
            )
    for name in by_name:
        results[name] = result_of(name)
        if name not in watch.results:
            tell(name)
    return [results[h.name] for h in hosts]
