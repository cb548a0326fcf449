"""Ship the probe to many hosts over SSH in parallel and bring back one evidence document each.

Why it looks like this:
- One SSH session per host: the probe program goes in on stdin, one JSON document comes out.
- Host keys are verified against a known_hosts file by default. Unknown keys are refused unless
  the caller opted in to accepting new ones; a CHANGED key is always refused (paramiko raises
  BadHostKeyException before authenticating, whatever the policy).
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
import select
import shlex
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko
from paramiko.ssh_exception import NoValidConnectionsError

from kvops import __version__
from kvops.evidence import SCHEMA_VERSION, Evidence
from kvops.inventory import InventoryHost
from kvops.probe.bundle import build_program

logging.getLogger("paramiko").addHandler(logging.NullHandler())  # no auth chatter on stderr

OK = "ok"
UNREACHABLE = "unreachable"
AUTH_FAILED = "auth_failed"
HOST_KEY = "host_key_refused"
TIMEOUT = "timeout"
PROBE_FAILED = "probe_failed"
MAX_OUTPUT = 64 * 1024 * 1024


class HostKeyRefused(paramiko.SSHException):
    """A host key that is not in known_hosts (and accepting new keys was not asked for)."""


@dataclass
class SshOptions:
    known_hosts: Path = field(default_factory=lambda: Path("~/.ssh/known_hosts").expanduser())
    accept_new_host_keys: bool = False
    timeout_s: float = 120.0
    connect_timeout_s: float = 15.0


@dataclass
class HostResult:
    """What happened on one host: `status` OK with evidence, or why there is none."""

    host: str
    status: str
    evidence: Evidence
    reason: str | None = None
    duration_s: float = 0.0
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == OK


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


def _fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


class _KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys, or (opt-in) append them to the known_hosts file under a lock."""

    _lock = threading.Lock()

    def __init__(self, path: Path, accept_new: bool) -> None:
        self.path = path
        self.accept_new = accept_new

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        if not self.accept_new:
            raise HostKeyRefused(
                f"host key of {hostname} ({_fingerprint(key)}) is not in {self.path}; verify it "
                "and add it (e.g. ssh-keyscan), or pass --accept-new-host-keys"
            )
        with self._lock:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


def _client(
    host: InventoryHost,
    address: str,
    port: int,
    user: str,
    opts: SshOptions,
    timeout_s: float,
    sock: Any = None,
) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    if opts.known_hosts.exists():
        client.get_host_keys().load(str(opts.known_hosts))
    client.set_missing_host_key_policy(
        _KnownHostsPolicy(opts.known_hosts, opts.accept_new_host_keys)
    )
    try:
        _do_connect(client, host, address, port, user, timeout_s, sock)
    except paramiko.BadHostKeyException as exc:
        client.close()
        exc.hostname = address if port == 22 else f"[{address}]:{port}"  # known_hosts name
        raise
    except TimeoutError as exc:  # a connect timeout is unreachability, not a hung probe
        client.close()
        raise ConnectionError(f"connection timed out after {timeout_s:.0f} s") from exc
    except BaseException:
        client.close()
        raise
    return client


def _do_connect(
    client: paramiko.SSHClient,
    host: InventoryHost,
    address: str,
    port: int,
    user: str,
    timeout_s: float,
    sock: Any,
) -> None:
    client.connect(
        address,
        port=port,
        username=user,
        password=host.password,
        key_filename=host.key_file,
        allow_agent=True,
        look_for_keys=True,
        timeout=timeout_s,
        banner_timeout=timeout_s,
        auth_timeout=timeout_s,
        channel_timeout=timeout_s,
        sock=sock,
    )


def _connect(
    host: InventoryHost, opts: SshOptions, deadline: float
) -> tuple[paramiko.SSHClient, list[paramiko.SSHClient]]:
    """The target's client and the jump clients it rides on (closed by the caller)."""
    user = host.user or getpass.getuser()
    if host.key_file and not os.path.exists(host.key_file):
        raise paramiko.AuthenticationException(f"private key file {host.key_file} does not exist")
    jumps: list[paramiko.SSHClient] = []
    sock: Any = None
    hops = host.jumps
    for i, hop in enumerate(hops):
        budget = min(opts.connect_timeout_s, max(deadline - time.monotonic(), 0.1))
        jc = _client(host, hop.host, hop.port, hop.user or user, opts, budget, sock)
        jumps.append(jc)
        nxt = (
            (hops[i + 1].host, hops[i + 1].port) if i + 1 < len(hops) else (host.address, host.port)
        )
        transport = jc.get_transport()
        assert transport is not None
        sock = transport.open_channel("direct-tcpip", nxt, ("127.0.0.1", 0), timeout=budget)
    if not hops and host.proxy_command:
        cmd = host.proxy_command.replace("%h", host.address).replace("%p", str(host.port))
        sock = paramiko.ProxyCommand(cmd.replace("%r", user))
    budget = min(opts.connect_timeout_s, max(deadline - time.monotonic(), 0.1))
    return _client(host, host.address, host.port, user, opts, budget, sock), jumps


def remote_command(host: InventoryHost, timeout_s: float, marker: str, prompt: str) -> str:
    """Shell command that runs `python -` under a remote `timeout` (reaps a hung probe)."""
    py = shlex.quote(host.python)
    limit = f"{int(timeout_s) + 5}"
    script = (
        f"if command -v timeout >/dev/null 2>&1; then exec timeout -k 5 {limit} {py} -; "
        f"else exec {py} -; fi"
    )
    if host.become:
        script = f"echo {marker}; {script}"
        return (
            f"sudo -H -S -p {shlex.quote(prompt)} -u {shlex.quote(host.become_user)} -- "
            f"/bin/sh -c {shlex.quote(script)}"
        )
    return f"/bin/sh -c {shlex.quote(script)}"


def _become_handshake(
    chan: paramiko.Channel, host: InventoryHost, marker: str, prompt: str, deadline: float
) -> bytes:
    """Answer sudo's prompt if it asks; return stdout bytes that followed the marker line."""
    out = err = b""
    sent_password = False
    while time.monotonic() < deadline:
        if chan.recv_ready():
            out += chan.recv(65536)
        if chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        if marker.encode() + b"\n" in out:
            return out.split(marker.encode() + b"\n", 1)[1]
        if prompt.encode() in err:
            if sent_password or not host.become_password:
                why = "rejected" if sent_password else "required (set ansible_become_password)"
                raise PermissionError(f"sudo password {why} for become on {host.name}")
            chan.sendall((host.become_password + "\n").encode())
            err = err.replace(prompt.encode(), b"")
            sent_password = True
        if chan.exit_status_ready() and not chan.recv_ready():
            tail = err.decode("utf-8", "replace").strip()[-300:]
            raise PermissionError(f"become (sudo) failed on {host.name}: {tail}")
        time.sleep(0.02)
    raise TimeoutError("become (sudo) did not answer in time")


def _run_ssh(
    host: InventoryHost, program: str, opts: SshOptions, deadline: float
) -> tuple[int | None, bytes, bytes]:
    client, jumps = _connect(host, opts, deadline)
    try:
        transport = client.get_transport()
        assert transport is not None
        chan = transport.open_session(timeout=max(deadline - time.monotonic(), 0.1))
        marker = f"KVOPS_BECOME_OK_{uuid.uuid4().hex}"
        prompt = f"[kvops sudo {uuid.uuid4().hex}]"
        chan.exec_command(remote_command(host, opts.timeout_s, marker, prompt))
        if host.become and host.become_method != "sudo":
            raise PermissionError(f"become method {host.become_method!r} is not supported (sudo)")
        out = _become_handshake(chan, host, marker, prompt, deadline) if host.become else b""
        chan.sendall(program.encode())
        chan.shutdown_write()
        err = b""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"probe did not finish within {opts.timeout_s:.0f} s")
            select.select([chan], [], [], min(remaining, 0.5))
            while chan.recv_ready():
                out += chan.recv(1 << 20)
            while chan.recv_stderr_ready():
                err = (err + chan.recv_stderr(1 << 16))[-65536:]
            if len(out) > MAX_OUTPUT:
                raise ValueError(f"probe output exceeds {MAX_OUTPUT} bytes")
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                return chan.recv_exit_status(), out, err
    finally:
        client.close()
        for jc in reversed(jumps):
            jc.close()


def _run_local(
    host: InventoryHost, program: str, opts: SshOptions
) -> tuple[int | None, bytes, bytes]:
    """`ansible_connection: local`: the same program under the local interpreter."""
    argv = [host.python, "-"]
    if host.become and os.geteuid() != 0:
        argv = ["sudo", "-n", "-u", host.become_user, "--", *argv]
    try:
        proc = subprocess.run(
            argv, input=program.encode(), capture_output=True, timeout=opts.timeout_s
        )
    except subprocess.TimeoutExpired as exc:
        raise TimeoutError(f"probe did not finish within {opts.timeout_s:.0f} s") from exc
    except FileNotFoundError as exc:
        return 127, b"", str(exc).encode()
    return proc.returncode, proc.stdout, proc.stderr[-65536:]


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

    def result(status: str, reason: str, stderr: bytes = b"") -> HostResult:
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
            code, out, err = _run_local(host, program, opts)
        elif host.connection in ("ssh", "paramiko", "smart"):
            code, out, err = _run_ssh(host, program, opts, deadline)
        else:
            return result(PROBE_FAILED, f"ansible_connection {host.connection!r} is not supported")
    except paramiko.BadHostKeyException as exc:
        return result(
            HOST_KEY,
            f"host key of {exc.hostname} CHANGED: known_hosts has "
            f"{_fingerprint(exc.expected_key)}, the host presented {_fingerprint(exc.key)}; "
            "refusing to connect (possible "
            f"man-in-the-middle). If the host was reinstalled, remove the old entry with "
            f"`ssh-keygen -R {exc.hostname} -f {opts.known_hosts}` and verify the new key",
        )
    except HostKeyRefused as exc:
        return result(HOST_KEY, str(exc))
    except paramiko.AuthenticationException as exc:
        tried = f"key {host.key_file}, " if host.key_file else ""
        tried += "ssh-agent, ~/.ssh default keys" + (", password" if host.password else "")
        return result(AUTH_FAILED, f"authentication to {where} failed ({exc}); tried {tried}")
    except PermissionError as exc:
        return result(AUTH_FAILED, str(exc))
    except TimeoutError as exc:
        return result(TIMEOUT, f"{where}: {exc}")
    except NoValidConnectionsError as exc:
        causes = "; ".join(
            f"{addr[0]}:{addr[1]}: {getattr(e, 'strerror', None) or e}"
            for addr, e in exc.errors.items()
        )
        return result(UNREACHABLE, f"cannot reach {where}: {causes}")
    except (paramiko.SSHException, OSError, EOFError) as exc:
        return result(UNREACHABLE, f"cannot reach {where}: {exc or type(exc).__name__}")
    except Exception as exc:  # a fleet run must survive any one host
        return result(PROBE_FAILED, f"{where}: {type(exc).__name__}: {exc}")
    if code == 127:
        return result(
            PROBE_FAILED,
            f"{host.python} not found on {host.name} (set ansible_python_interpreter)",
            err,
        )
    if code == 124 or code == 137:
        return result(TIMEOUT, f"probe killed by the remote timeout on {host.name}", err)
    try:
        doc = _last_json_line(out)
        if not isinstance(doc, dict) or "items" not in doc:
            raise ValueError("not an evidence document")
    except ValueError as exc:
        return result(
            PROBE_FAILED, f"probe on {host.name} exited {code} without evidence ({exc})", err
        )
    doc["host"] = host.name
    return HostResult(
        host=host.name,
        status=OK,
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
    """Probe every host with `forks` worker threads; results in inventory order.

    Daemon threads (not a ThreadPoolExecutor) so that Ctrl-C ends the run at once instead of
    waiting for every in-flight host to reach its timeout."""
    results: list[HostResult | None] = [None] * len(hosts)
    queue = iter(list(enumerate(hosts)))
    take, report = threading.Lock(), threading.Lock()

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
                reason = f"{type(exc).__name__}: {exc}"
                settings = dict(configs.get(host.name, {}).get("settings") or {})
                res = HostResult(
                    host.name, PROBE_FAILED, error_evidence(host.name, settings, reason), reason
                )
            results[index] = res
            if on_result is not None:
                with report:
                    on_result(res)

    threads = [
        threading.Thread(target=worker, name=f"kvops-probe-{i}", daemon=True)
        for i in range(max(1, min(forks, len(hosts))))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.2)  # short joins keep the main thread responsive to Ctrl-C
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
