"""`kvops smoke --host H -i INV`: the GPU host's target (URL, GDS directory) from the inventory,
and its chunk files read over SSH, so smoke works where the operator's machine does not mount
the export.

The reading is `kvops.smoke.chunk_files` shipped as source to the host's Python over the validate
transport (`kvops.remote.ssh`: verified host keys, jump hosts, become), one round trip per look.

The service log of this start is what validate's probe collects (one probe run over the same
transport, started by the CLI: `kvops.cli.smoke`): the unit's journal of its current invocation
and the LMCache problem lines of the whole run (`vllm_journal`, `vllm_journal_problems`), judged
by the same code as validate's GDS-066; `journal_service_log` reads them from the evidence.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

from kvops import evidence as ev
from kvops.checks.lmcache import problem_lines
from kvops.remote.inventory import InventoryError, InventoryHost, load_inventory
from kvops.remote.ssh import SshOptions, known_hosts_for, run_ssh
from kvops.smoke import chunk_files
from kvops.smoke.judge import ChunkFile, ServiceLog
from kvops.smoke.run import SmokeError

_SOURCE = Path(chunk_files.__file__).read_text()
DEFAULT_PORT = 8000


@dataclass(frozen=True)
class HostTarget:
    host: InventoryHost
    url: str
    gds_dir: str | None


def host_target(
    inventories: list[str], name: str, url: str | None, gds_dir: str | None
) -> HostTarget:
    """The one inventory host called ``name``; URL and GDS directory from the options, else from
    the role's variables (``vllm_lmcache_port``, ``vllm_lmcache_gds_dir``, or ``kvops_gds_dir``)."""
    try:
        hosts = load_inventory(inventories, limit=name)
    except InventoryError as exc:
        raise SmokeError(str(exc)) from exc
    matches = [h for h in hosts if h.name == name]
    if not matches:
        raise SmokeError(f"host {name!r} is not in the inventory ({', '.join(inventories)})")
    host = matches[0]
    port = host.vars.get("vllm_lmcache_port") or DEFAULT_PORT
    directory = gds_dir or host.vars.get("vllm_lmcache_gds_dir") or host.vars.get("kvops_gds_dir")
    return HostTarget(
        host=host,
        url=url or f"http://{host.address}:{port}",
        gds_dir=str(directory) if directory else None,
    )


def service_user(host: InventoryHost) -> str:
    """Who the chunk files are read as on the host: the inference service's user, as validate's
    probe names it (`kvops_service_user`) or the role deploys it (`vllm_lmcache_service_user`)."""
    return str(
        host.vars.get("kvops_service_user") or host.vars.get("vllm_lmcache_service_user") or ""
    )


@dataclass(frozen=True)
class RemoteChunks:
    """The chunk files of ``root`` on ``host``, read over SSH (become as the inventory says)."""

    host: InventoryHost
    root: str
    ssh: SshOptions

    @property
    def where(self) -> str:
        return f"{self.host.name}:{self.root}"

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        request = {**request, "as_user": service_user(self.host)}
        program = f"{_SOURCE}\nmain({json.dumps(json.dumps(request))})\n"
        deadline = time.monotonic() + self.ssh.timeout_s
        try:
            run = run_ssh(self.host, program, self.ssh, deadline)
        except paramiko.BadHostKeyException as exc:
            raise SmokeError(
                f"host key of {exc.hostname} CHANGED (known_hosts "
                f"{known_hosts_for(self.host, self.ssh)}): refusing to connect"
            ) from exc
        except (OSError, paramiko.SSHException, ValueError) as exc:
            raise SmokeError(f"cannot read {self.where} over SSH: {exc}") from exc
        lines = run.stdout.decode("utf-8", "replace").strip().splitlines()
        if run.exit_status != 0 or not lines:
            tail = run.stderr_tail.decode("utf-8", "replace").strip()[-300:]
            raise SmokeError(f"reading {self.where} failed (exit {run.exit_status}): {tail}")
        try:
            answer: dict[str, Any] = json.loads(lines[-1])
        except ValueError as exc:
            raise SmokeError(
                f"reading {self.where}: unexpected output {lines[-1][:200]!r}"
            ) from exc
        return answer

    def paths(self) -> set[str]:
        listed = self._ask({"op": "list", "root": self.root})
        if listed.get("error"):
            raise SmokeError(f"{self.host.name}: {listed['error']}")
        return set(listed["paths"])

    def details(self, paths: list[str]) -> list[ChunkFile]:
        if not paths:
            return []
        files = self._ask({"op": "describe", "paths": paths})["files"]
        return [ChunkFile(**f) for f in files]


def journal_service_log(where: str, evidence: ev.Evidence) -> ServiceLog:
    """The journal's LMCache problem lines from a probe's evidence; a journal that was not read
    is a ServiceLog with its `error` (the item SKIPs with the reason: a host without systemd
    has no journal)."""
    journal = ev.item_text(evidence, ev.VLLM_JOURNAL)
    if journal is None:
        problem = ev.item_problem(ev.get_item(evidence, ev.VLLM_JOURNAL))
        return ServiceLog(where, 0, error=f"journal not read: {problem}")
    lines = journal.splitlines()
    # journalctl --grep exits 1 when nothing matched: no text is no problem line
    early = (ev.item_text(evidence, ev.VLLM_JOURNAL_PROBLEMS) or "").splitlines()
    return ServiceLog(where, len(lines), tuple(problem_lines(lines + early)))
