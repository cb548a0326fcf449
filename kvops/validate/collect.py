"""Ship the probe to many hosts over SSH in parallel and bring back one evidence document each.

Why it looks like this:
- One SSH session per host (`kvops.remote.ssh`: host keys verified, jumps, sudo): the probe program
  goes in on stdin, one JSON document comes out.
- Every failure mode (refused, timed out, auth failed, bad key, probe crashed) becomes a
  HostResult whose evidence carries a top-level `error`, so a fleet run always completes.
- Two time bounds: the probe gets a budget a little under the host timeout (it returns partial
  evidence instead of hanging), and the client gives up at the timeout regardless (a probe stuck
  in uninterruptible I/O on a dead NFS mount cannot answer). The remote `timeout` command then
  reaps the orphan.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import paramiko
from paramiko.ssh_exception import NoValidConnectionsError

from kvops import __version__
from kvops.evidence import SCHEMA_VERSION, Evidence
from kvops.probe.bundle import INTERPRETER_ARGS, build_program
from kvops.remote.inventory import InventoryHost
from kvops.remote.ssh import (
    HostKeyRefused,
    ProbeRun,
    SshOptions,
    fingerprint,
    known_hosts_for,
    run_ssh,
)

_log = logging.getLogger(__name__)


class HostStatus(StrEnum):
    """How probing one host ended (`transport.<host>.status` in `kvops validate --json`)."""

    OK = "ok"
    UNREACHABLE = "unreachable"
    AUTH_FAILED = "auth_failed"
    HOST_KEY = "host_key_refused"
    TIMEOUT = "timeout"
    PROBE_FAILED = "probe_failed"


@dataclass
class HostResult:
    """What happened on one host: `status` OK with evidence, or why there is none."""

    host: str
    status: HostStatus
    evidence: Evidence
    reason: str | None = None
    duration_s: float = 0.0
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.status is HostStatus.OK


def error_evidence(host: str, settings: dict[str, Any], reason: str) -> Evidence:
    """The evidence document of a host that could not be probed (top-level `error` set)."""
    return Evidence(
        schema_version=SCHEMA_VERSION,
        host=host,
        collected_at=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        probe_version=__version__,
        error=reason,
        settings=settings,  # type: ignore[typeddict-item]
        items={},
    )


def _run_local(host: InventoryHost, program: str, opts: SshOptions) -> ProbeRun:
    """`ansible_connection: local`: the same program under the local interpreter."""
    argv = [host.python, *INTERPRETER_ARGS]
    if host.become and os.geteuid() != 0:
        argv = ["sudo", "-n", "-u", host.become_user, "--", *argv]
    try:
        proc = subprocess.run(
            argv, input=program.encode(), capture_output=True, timeout=opts.timeout_s
        )
    except subprocess.TimeoutExpired as exc:
        raise TimeoutError(f"probe did not finish within {opts.timeout_s:.0f} s") from exc
    except FileNotFoundError as exc:
        return ProbeRun(127, b"", str(exc).encode())
    return ProbeRun(proc.returncode, proc.stdout, proc.stderr[-65536:])


def _last_json_line(out: bytes) -> Any:
    """The probe's document: its one JSON line, even if a login script printed text first."""
    text = out.decode("utf-8", "replace").strip()
    try:
        return json.loads(text)
    except ValueError:
        last = text.rsplit("\n", 1)[-1]
        return json.loads(last)  # raises ValueError when there is no document at all


def probe_host(host: InventoryHost, config: dict[str, Any], opts: SshOptions) -> HostResult:
    """Probe one host; never raises for anything that can go wrong on the way."""
    start = time.monotonic()
    deadline = start + opts.timeout_s
    settings = dict(config.get("settings") or {})
    program = build_program(config)

    def result(status: HostStatus, reason: str, stderr: bytes = b"") -> HostResult:
        return HostResult(
            host=host.name,
            status=status,
            evidence=error_evidence(host.name, settings, reason),
            reason=reason,
            duration_s=round(time.monotonic() - start, 3),
            stderr_tail=stderr.decode("utf-8", "replace")[-2000:],
        )

    where = f"{host.user or getpass.getuser()}@{host.address}:{host.port}"
    if host.connection == "local":
        where = f"{host.name} (local)"
    try:
        if host.connection == "local":
            run = _run_local(host, program, opts)
        elif host.connection in ("ssh", "paramiko", "smart"):
            run = run_ssh(host, program, opts, deadline)
        else:
            return result(
                HostStatus.PROBE_FAILED, f"ansible_connection {host.connection!r} is not supported"
            )
    except paramiko.BadHostKeyException as exc:
        return result(
            HostStatus.HOST_KEY,
            f"host key of {exc.hostname} CHANGED: known_hosts has "
            f"{fingerprint(exc.expected_key)}, the host presented {fingerprint(exc.key)}; "
            "refusing to connect (possible "
            f"man-in-the-middle). If the host was reinstalled, remove the old entry with "
            f"`ssh-keygen -R {exc.hostname} -f {known_hosts_for(host, opts)}` and verify the "
            "new key",
        )
    except HostKeyRefused as exc:
        return result(HostStatus.HOST_KEY, str(exc))
    except paramiko.AuthenticationException as exc:
        tried = f"key {host.key_file}, " if host.key_file else ""
        tried += "ssh-agent, ~/.ssh default keys" + (", password" if host.password else "")
        return result(
            HostStatus.AUTH_FAILED, f"authentication to {where} failed ({exc}); tried {tried}"
        )
    except PermissionError as exc:
        return result(HostStatus.AUTH_FAILED, str(exc))
    except TimeoutError as exc:
        return result(HostStatus.TIMEOUT, f"{where}: {exc}")
    except NoValidConnectionsError as exc:
        causes = "; ".join(
            f"{addr[0]}:{addr[1]}: {getattr(e, 'strerror', None) or e}"
            for addr, e in exc.errors.items()
        )
        return result(HostStatus.UNREACHABLE, f"cannot reach {where}: {causes}")
    except (paramiko.SSHException, OSError, EOFError) as exc:
        return result(HostStatus.UNREACHABLE, f"cannot reach {where}: {exc or type(exc).__name__}")
    except Exception as exc:  # a fleet run must survive any one host
        return result(HostStatus.PROBE_FAILED, f"{where}: {type(exc).__name__}: {exc}")
    code, out, err = run.exit_status, run.stdout, run.stderr_tail
    if code == 127:
        return result(
            HostStatus.PROBE_FAILED,
            f"{host.python} not found on {host.name} (set ansible_python_interpreter)",
            err,
        )
    if code == 124 or code == 137:
        return result(HostStatus.TIMEOUT, f"probe killed by the remote timeout on {host.name}", err)
    try:
        doc = _last_json_line(out)
        if not isinstance(doc, dict) or "items" not in doc:
            raise ValueError("not an evidence document")
    except ValueError as exc:
        lines = err.decode("utf-8", "replace").strip().splitlines()
        why = lines[-1][:300] if lines else str(exc)
        return result(
            HostStatus.PROBE_FAILED,
            f"probe on {host.name} exited {code} without evidence: {why}",
            err,
        )
    # Who the host is and what it was asked to be (`role`, vLLM URL, paths) are the
    # inventory's: a host that rewrites them in its answer (say `role: none`, which turns its
    # vLLM and LMCache checks into SKIPs, or another host's name) is not believed.
    doc["host"] = host.name
    doc["settings"] = settings
    return HostResult(
        host=host.name,
        status=HostStatus.OK,
        evidence=doc,  # type: ignore[arg-type]
        duration_s=round(time.monotonic() - start, 3),
        stderr_tail=err.decode("utf-8", "replace")[-2000:],
    )


def probe_fleet(
    hosts: list[InventoryHost],
    configs: dict[str, dict[str, Any]],
    opts: SshOptions,
    forks: int = 8,
    on_result: Callable[[HostResult], None] | None = None,
) -> list[HostResult]:
    """Probe every host with `forks` worker threads; results in inventory order, one per host.

    Daemon threads (not a ThreadPoolExecutor) so that Ctrl-C ends the run at once instead of
    waiting for every in-flight host to reach its timeout.

    Every host ends as a result, whatever the reporting does: `on_result` only reports (it
    quotes host text, which a hostile host chooses), so its exception keeps the host's own
    result, the worker goes on to the next host, and the first such failure is logged once
    (a warning on stderr through logging's last-resort handler where nothing is configured:
    https://docs.python.org/3/library/logging.html#logging.lastResort). A worker that dies
    anyway (a BaseException) leaves the hosts it held or would have taken as PROBE_FAILED rows
    saying so, never as missing rows."""
    results: list[HostResult | None] = [None] * len(hosts)
    queue = iter(list(enumerate(hosts)))
    take, report = threading.Lock(), threading.Lock()
    report_failed: list[str] = []  # hosts whose report raised; the first one is logged

    def failed(host: InventoryHost, reason: str) -> HostResult:
        settings = dict(configs.get(host.name, {}).get("settings") or {})
        return HostResult(
            host.name,
            HostStatus.PROBE_FAILED,
            error_evidence(host.name, settings, reason),
            reason,
        )

    def tell(res: HostResult) -> None:
        if on_result is None:
            return
        with report:
            try:
                on_result(res)
            except Exception as exc:  # reporting one host must not cost the others
                report_failed.append(res.host)
                if len(report_failed) == 1:
                    _log.warning(
                        "kvops: reporting the probe of %s failed (%s: %r); the fleet run "
                        "goes on and every host stays in the results",
                        res.host,
                        type(exc).__name__,
                        str(exc),
                    )

    def worker() -> None:
        while True:
            with take:
                nxt = next(queue, None)
            if nxt is None:
                return
            index, host = nxt
            try:
                res = probe_host(host, configs[host.name], opts)
            except Exception as exc:  # belt and braces: a host is never silently dropped
                res = failed(host, f"{type(exc).__name__}: {exc}")
            results[index] = res
            tell(res)

    threads = [
        threading.Thread(target=worker, name=f"kvops-probe-{i}", daemon=True)
        for i in range(max(1, min(forks, len(hosts))))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.2)  # short joins keep the main thread responsive to Ctrl-C
    for index, host in enumerate(hosts):
        if results[index] is None:  # its worker thread died before or while probing it
            lost = failed(host, f"{host.name} was not probed: its worker thread ended")
            results[index] = lost
            tell(lost)
    return [r for r in results if r is not None]


def probe_config(
    host: InventoryHost, settings: dict[str, Any], options: dict[str, Any], timeout_s: float
) -> dict[str, Any]:
    """The probe's input: settings to echo, probe options, and a budget under the host timeout."""
    config: dict[str, Any] = dict(options)
    config.update(
        host=host.name,
        probe_version=__version__,
        settings=settings,
        deadline_s=max(1.0, timeout_s - min(5.0, timeout_s * 0.2)),
    )
    return config
