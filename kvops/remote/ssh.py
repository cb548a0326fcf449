"""One paramiko session to one host: connect, verify its key, become, run a program on stdin.

Why it looks like this:
- Host keys are verified against a known_hosts file by default. Unknown keys are refused unless
  the caller opted in to accepting new ones (then recorded, under a lock, for the next run); a
  CHANGED key is always refused: paramiko raises BadHostKeyException before authenticating,
  whatever the policy, and the message names both fingerprints.
- Host certificates: a host with no plain key listed but covered by a `@cert-authority` line
  is asked for its `*-cert-v01@openssh.com` key first, and the certificate paramiko hands over
  (the key's public_blob) is judged by kvops.remote.ssh_cert as ssh(1) judges it.
- Jump hosts (`-J`/`ProxyJump`) are SSH clients in their own right, verified the same way, and
  each hop is a direct-tcpip channel of the previous one; `ProxyCommand` is paramiko's.
- The program goes in on stdin (`python3 -S -`), under the remote `timeout` command, so nothing
  is written on the host and a probe the client gave up on is reaped there.
- sudo is driven the way Ansible does it: a unique prompt on stderr means "send the password", a
  unique marker on stdout means "sudo is done, send the program".
- A fleet run shares what does not change between hosts: each known_hosts file is parsed once
  and each unencrypted private key file loaded once per run (again only if the file changes).
  Both would otherwise cost CPU per host: paramiko's known_hosts parse is quadratic in its
  lines (~0.14 s for 1000 lines) and loading an RSA key ~0.15 s (cryptography's key check).
  Verification is unchanged: each host's client gets exactly the known_hosts entries paramiko
  would have looked up for it, and the key is the same key.
- Waiting on a channel blocks (select on the channel, then on its exit status once all output
  is in); nothing sleeps or spins.
"""

from __future__ import annotations

import errno
import getpass
import logging
import os
import select
import shlex
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import paramiko
from paramiko.hostkeys import InvalidHostKey

from kvops.probe.bundle import INTERPRETER_ARGS
from kvops.remote import ssh_cert
from kvops.remote.inventory import InventoryHost, Jump

logging.getLogger("paramiko").addHandler(logging.NullHandler())  # no auth chatter on stderr

MAX_OUTPUT = 64 * 1024 * 1024
T = TypeVar("T")


class HostKeyRefused(paramiko.SSHException):
    """A host key that is not in known_hosts (and accepting new keys was not asked for)."""


@dataclass
class SshOptions:
    # None: the host's `-o UserKnownHostsFile=` from the inventory, else ~/.ssh/known_hosts.
    known_hosts: Path | None = None
    accept_new_host_keys: bool = False
    timeout_s: float = 120.0
    connect_timeout_s: float = 15.0


def known_hosts_for(host: InventoryHost, opts: SshOptions) -> Path:
    """The known_hosts file for this host: --known-hosts, else the inventory's
    UserKnownHostsFile (so kvops trusts exactly what Ansible's ssh trusts), else ~/.ssh's.
    StrictHostKeyChecking in the inventory is deliberately not honoured: only the explicit
    --accept-new-host-keys lowers verification."""
    if opts.known_hosts is not None:
        return opts.known_hosts
    return Path(host.known_hosts_file or "~/.ssh/known_hosts").expanduser()


class _FileCache(Generic[T]):
    """Values derived from a file, recomputed only when the file changes (inode, size, mtime).

    One lock: 32 threads that ask at once cause one parse, not 32."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, tuple[tuple[int, int, int], T]] = {}

    def get(self, path: str, make: Callable[[], T]) -> T:
        st = os.stat(path)
        sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._values.get(path)
            if hit is not None and hit[0] == sig:
                return hit[1]
            value = make()
            self._values[path] = (sig, value)
            return value

    def clear(self) -> None:
        with self._lock:
            self._values.clear()


_NO_FILE = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)
_KNOWN_HOSTS: _FileCache[KnownHosts] = _FileCache()
_PRIVATE_KEYS: _FileCache[paramiko.PKey | None] = _FileCache()
# The classes paramiko's SSHClient tries, in its order, for a key_filename (DSS is gone in 4.x).
_KEY_CLASSES: tuple[Any, ...] = tuple(
    cls
    for cls in (
        paramiko.RSAKey,
        getattr(paramiko, "DSSKey", None),
        paramiko.ECDSAKey,
        paramiko.Ed25519Key,
    )
    if cls is not None
)


def clear_caches() -> None:
    """Forget parsed known_hosts files and loaded keys (the next host reads them again)."""
    _KNOWN_HOSTS.clear()
    _PRIVATE_KEYS.clear()


@dataclass
class KnownHosts:
    """A known_hosts file as OpenSSH reads it (sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT"): plain
    entries, `@revoked` keys (refused even when listed or accepted as new) and
    `@cert-authority` lines (host certificates, judged by kvops.remote.ssh_cert). paramiko's own
    loader raises on a marker line, which made every host fail; here markers are read apart
    and a bad line is skipped, as ssh does."""

    keys: paramiko.HostKeys = field(default_factory=paramiko.HostKeys)
    revoked: list[paramiko.PKey] = field(default_factory=list)
    authorities: list[ssh_cert.Authority] = field(default_factory=list)
    skipped_lines: list[int] = field(default_factory=list)

    def is_revoked(self, key: paramiko.PKey) -> bool:
        return any(key == bad for bad in self.revoked)

    def authority_for(self, name: str) -> bool:
        """Whether a @cert-authority line covers this known_hosts name (`host` or
        `[host]:port`, then the bare host, as ssh tries them)."""
        return ssh_cert.authority_covers(self.authorities, name)

    def verify_certificate(self, name: str, key: paramiko.PKey) -> None:
        """Refuse (HostKeyRefused, one line) a presented host certificate that does not prove
        `name`; return when it does."""
        blob = key.public_blob
        if blob is None:
            raise HostKeyRefused(f"host key of {name} ({fingerprint(key)}) is no certificate")
        try:
            ssh_cert.verify_host_certificate(
                blob.key_type,
                blob.key_blob,
                name,
                self.authorities,
                [bad.asbytes() for bad in self.revoked],
                time.time(),
            )
        except ssh_cert.CertificateRefused as exc:
            raise HostKeyRefused(f"host certificate of {name} refused: {exc}") from None


def _is_certificate(key: paramiko.PKey) -> bool:
    """paramiko keeps a presented certificate in the key's public_blob."""
    blob = key.public_blob
    return blob is not None and blob.key_type.endswith(ssh_cert.CERT_SUFFIX)


def _known_hosts(path: Path) -> KnownHosts:
    """The parsed file, once per run; an absent file is an empty one."""
    try:
        return _KNOWN_HOSTS.get(str(path), lambda: _parse_known_hosts(path))
    except OSError as exc:
        if exc.errno in _NO_FILE:  # what Path.exists() calls absent: no known keys
            return KnownHosts()
        raise


def _known_host_entries(path: Path, name: str) -> list[tuple[str, paramiko.PKey]]:
    """(key type, key) of `name` in the known_hosts file, in file order (what paramiko's
    lookup gives: the first key of each type, hashed host names included); [] if none."""
    found = _known_hosts(path).keys.lookup(name)
    if found is None:
        return []
    return [(keytype, found[keytype]) for keytype in dict.fromkeys(found.keys())]


def _marker_key(fields: list[str]) -> paramiko.PKey | None:
    entry = paramiko.hostkeys.HostKeyEntry.from_line(" ".join(fields[1:]))
    return entry.key if entry is not None else None


def _parse_known_hosts(path: Path) -> KnownHosts:
    parsed = KnownHosts()
    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, raw in enumerate(fh, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            try:
                if fields[0] in ("@revoked", "@cert-authority"):
                    key = _marker_key(fields)
                    if key is None:
                        raise paramiko.SSHException("unreadable key")
                    if fields[0] == "@revoked":
                        parsed.revoked.append(key)
                    else:
                        patterns = tuple(fields[1].split(","))
                        parsed.authorities.append(ssh_cert.Authority(patterns, key.asbytes()))
                    continue
                entry = paramiko.hostkeys.HostKeyEntry.from_line(line, number)
            except (paramiko.SSHException, InvalidHostKey, ValueError, IndexError, TypeError):
                parsed.skipped_lines.append(number)
                continue
            if entry is None:
                parsed.skipped_lines.append(number)
                continue
            # what HostKeys.load does per line (add() would replace a same-type key instead)
            parsed.keys._entries.append(entry)  # type: ignore[attr-defined]
    return parsed


def _private_key(path: str) -> paramiko.PKey | None:
    """The unencrypted key (and its `-cert.pub`) paramiko would load from `path`, loaded once
    per run. None when it needs a passphrase or cannot be loaded: then paramiko gets the file
    as before (with ansible_password as the passphrase), host by host; no secret is cached."""

    def load() -> paramiko.PKey | None:
        suffix = "-cert.pub"
        key_path, cert_path = (
            (path[: -len(suffix)], path) if path.endswith(suffix) else (path, path + suffix)
        )
        for cls in _KEY_CLASSES:
            try:
                key: paramiko.PKey = cls.from_private_key_file(key_path, None)
            except (paramiko.SSHException, ValueError):
                continue
            if os.path.isfile(cert_path):
                key.load_certificate(cert_path)
            return key
        return None

    try:
        return _PRIVATE_KEYS.get(path, load)
    except (OSError, paramiko.SSHException, ValueError):
        return None


def fingerprint(key: paramiko.PKey) -> str:
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
        known = _known_hosts(self.path)
        if known.is_revoked(key):
            raise HostKeyRefused(f"host key of {hostname} ({fingerprint(key)}) is @revoked")
        if _is_certificate(key):
            # Only a host a @cert-authority covers is asked for a certificate. A bad one is
            # refused even with --accept-new-host-keys (ssh would fall back to trusting the
            # bare key on first use): a certificate that contradicts a CA the operator
            # declared for this host is exactly what the CA is there to catch.
            known.verify_certificate(hostname, key)
            return
        if known.authority_for(hostname) and not self.accept_new:
            raise HostKeyRefused(
                f"host key of {hostname} ({fingerprint(key)}) is not in {self.path} and the "
                "host presented no certificate, though a @cert-authority there covers it; "
                "give it a HostCertificate signed by that CA, or add its key (ssh-keyscan)"
            )
        if not self.accept_new:
            raise HostKeyRefused(
                f"host key of {hostname} ({fingerprint(key)}) is not in {self.path}; verify it "
                "and add it (e.g. ssh-keyscan), or pass --accept-new-host-keys"
            )
        with self._lock:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


class _CertFirstTransport(paramiko.Transport):
    """A transport that offers the `*-cert-v01@openssh.com` host key types before the plain
    ones. paramiko 4 lists them after (Transport.preferred_keys), so a server with both a
    HostKey and a HostCertificate would otherwise always present its bare key."""

    @property
    def preferred_keys(self) -> tuple[str, ...]:
        keys = tuple(super().preferred_keys)
        certs = tuple(k for k in keys if k.endswith(ssh_cert.CERT_SUFFIX))
        return certs + tuple(k for k in keys if k not in certs)


@dataclass(frozen=True)
class Credentials:
    """What one connection authenticates with: a hop's own, or the target's."""

    key_file: str | None = None
    password: str | None = None


def _client(
    host: InventoryHost,
    address: str,
    port: int,
    user: str,
    opts: SshOptions,
    timeout_s: float,
    sock: Any = None,
    creds: Credentials | None = None,
    known: Path | None = None,
) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    known = known or known_hosts_for(host, opts)
    name = address if port == 22 else f"[{address}]:{port}"  # paramiko's known_hosts name
    entries = _known_host_entries(known, name)
    for keytype, key in entries:
        client.get_host_keys().add(name, keytype, key)
    # No plain key but a CA for this host: ask for its certificate first (ssh does the same:
    # HostKeyAlgorithms puts the certificate types first).
    wants_cert = not entries and _known_hosts(known).authority_for(name)
    client.set_missing_host_key_policy(_KnownHostsPolicy(known, opts.accept_new_host_keys))
    if creds is None:
        creds = Credentials(host.key_file, host.password)
    try:
        factory = _CertFirstTransport if wants_cert else None
        _do_connect(client, creds, address, port, user, timeout_s, sock, factory)
        transport = client.get_transport()
        presented = transport.get_remote_server_key() if transport is not None else None
        if presented is not None and _known_hosts(known).is_revoked(presented):
            raise HostKeyRefused(f"host key of {name} ({fingerprint(presented)}) is @revoked")
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
    creds: Credentials,
    address: str,
    port: int,
    user: str,
    timeout_s: float,
    sock: Any,
    transport_factory: Callable[..., paramiko.Transport] | None = None,
) -> None:
    pkey = _private_key(creds.key_file) if creds.key_file else None
    client.connect(
        address,
        port=port,
        username=user,
        password=creds.password,
        pkey=pkey,
        key_filename=None if pkey is not None else creds.key_file,
        allow_agent=True,
        look_for_keys=True,
        timeout=timeout_s,
        banner_timeout=timeout_s,
        auth_timeout=timeout_s,
        channel_timeout=timeout_s,
        sock=sock,
        transport_factory=transport_factory,
    )


def _hop_credentials(hop: Jump) -> Credentials:
    """The hop's inventory key/password, else the IdentityFile ~/.ssh/config names for it
    (agent and ~/.ssh default keys are tried as for any host); never the target's secrets."""
    if hop.key_file or hop.password:
        return Credentials(hop.key_file, hop.password)
    config_path = Path("~/.ssh/config").expanduser()
    try:
        config = paramiko.SSHConfig.from_path(str(config_path))
    except (OSError, paramiko.SSHException):
        return Credentials()
    found: str | list[str] = config.lookup(hop.host).get("identityfile") or []
    files = [found] if isinstance(found, str) else list(found)
    existing = [os.path.expanduser(f) for f in files if os.path.exists(os.path.expanduser(f))]
    return Credentials(existing[0] if existing else None)


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
        hop_known = Path(hop.known_hosts_file).expanduser() if hop.known_hosts_file else None
        jc = _client(
            host,
            hop.host,
            hop.port,
            hop.user or user,
            opts,
            budget,
            sock,
            _hop_credentials(hop),
            None if opts.known_hosts else hop_known,
        )
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
    """Shell command that runs `python -S -` under a remote `timeout` (reaps a hung probe)."""
    py = " ".join(shlex.quote(word) for word in (host.python, *INTERPRETER_ARGS))
    limit = f"{int(timeout_s) + 5}"
    script = (
        f"if command -v timeout >/dev/null 2>&1; then exec timeout -k 5 {limit} {py}; "
        f"else exec {py}; fi"
    )
    if host.become:
        script = f"echo {marker}; {script}"
        return (
            f"sudo -H -S -p {shlex.quote(prompt)} -u {shlex.quote(host.become_user)} -- "
            f"/bin/sh -c {shlex.quote(script)}"
        )
    return f"/bin/sh -c {shlex.quote(script)}"


# Bytes of sudo's stderr (and of stdout before the marker) kept during the become handshake.
HANDSHAKE_TAIL_BYTES = 4096


def _become_handshake(
    chan: paramiko.Channel, host: InventoryHost, marker: str, prompt: str, deadline: float
) -> bytes:
    """Answer sudo's prompt if it asks; return stdout bytes that followed the marker line.

    What the host sends before the marker is kept only as a short tail (enough to find a
    marker or prompt split across reads, and the last words of a failure): a host that
    streams without end costs constant memory and linear time, not a growing buffer scanned
    again on every read."""
    line = marker.encode() + b"\n"
    out = err = b""
    sent_password = False
    while time.monotonic() < deadline:
        if chan.recv_ready():
            out += chan.recv(65536)
        if chan.recv_stderr_ready():
            err = (err + chan.recv_stderr(65536))[-HANDSHAKE_TAIL_BYTES:]
        if line in out:
            return out.split(line, 1)[1]
        out = out[-len(line) :]
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
        _wait_for(chan, deadline - time.monotonic())
    raise TimeoutError("become (sudo) did not answer in time")


def _wait_for(chan: paramiko.Channel, timeout_s: float) -> None:
    """Block until the channel has output to read, or, once the host sent EOF (all output is
    buffered and the channel's pipe stays readable for good), until its exit status came."""
    timeout_s = min(max(timeout_s, 0.0), 0.5)
    if chan.eof_received:
        chan.status_event.wait(timeout_s)
    else:
        select.select([chan], [], [], timeout_s)


@dataclass(frozen=True)
class ProbeRun:
    """One run of the probe program on a host: its exit status (None when the remote side
    reported none), its stdout (the evidence document) and the tail of its stderr."""

    exit_status: int | None
    stdout: bytes
    stderr_tail: bytes


def run_ssh(host: InventoryHost, program: str, opts: SshOptions, deadline: float) -> ProbeRun:
    """Run `program` on stdin of the host's Python over one verified SSH session."""
    if host.become and host.become_method != "sudo":
        raise PermissionError(f"become method {host.become_method!r} is not supported (sudo)")
    client, jumps = _connect(host, opts, deadline)
    try:
        transport = client.get_transport()
        assert transport is not None
        chan = transport.open_session(timeout=max(deadline - time.monotonic(), 0.1))
        marker = f"KVOPS_BECOME_OK_{uuid.uuid4().hex}"
        prompt = f"[kvops sudo {uuid.uuid4().hex}]"
        chan.exec_command(remote_command(host, opts.timeout_s, marker, prompt))
        out = bytearray(
            _become_handshake(chan, host, marker, prompt, deadline) if host.become else b""
        )
        chan.sendall(program.encode())
        chan.shutdown_write()
        err = b""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"probe did not finish within {opts.timeout_s:.0f} s")
            _wait_for(chan, remaining)
            while chan.recv_ready():
                out += chan.recv(1 << 20)
            while chan.recv_stderr_ready():
                err = (err + chan.recv_stderr(1 << 16))[-65536:]
            if len(out) > MAX_OUTPUT:
                raise ValueError(f"probe output exceeds {MAX_OUTPUT} bytes")
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                return ProbeRun(chan.recv_exit_status(), bytes(out), err)
    finally:
        client.close()
        for jc in reversed(jumps):
            jc.close()
