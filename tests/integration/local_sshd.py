"""Real OpenSSH servers on 127.0.0.1 for tests and the fan-out benchmark.

Each server has its own port, temporary host key and authorized_keys, runs as the current user
(root here), and is torn down by `stop()`. Nothing about SSH is simulated: kvops talks to the
real sshd, verifies its real host key and authenticates with a real key.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def sshd_available() -> bool:
    return os.path.exists(SSHD) and shutil.which("ssh-keygen") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path, kind: str = "ed25519") -> str:
    """A new key pair (ed25519 unless `kind` says otherwise) at `path`; returns the public key
    line."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "kvops-test", "-f", str(path)],
        check=True,
    )
    return path.with_suffix(".pub").read_text().strip()


@dataclass
class LocalSshd:
    port: int
    host_key_line: str  # "ssh-ed25519 AAAA... comment"
    proc: subprocess.Popen[bytes]
    workdir: Path

    @property
    def known_hosts_line(self) -> str:
        keytype, b64 = self.host_key_line.split()[:2]
        return f"[127.0.0.1]:{self.port} {keytype} {b64}\n"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_sshd(
    workdir: Path,
    authorized_keys: list[str],
    host_key: Path | None = None,
    host_certificate: Path | None = None,
) -> LocalSshd:
    """Start `sshd -D` on a free 127.0.0.1 port; returns once it answers with its banner.
    `host_certificate` (an `ssh-keygen -s ... -h` certificate of `host_key`) makes it offer the
    certificate too (sshd_config(5) HostCertificate)."""
    workdir.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
    if host_key is None:
        host_key = workdir / "ssh_host_ed25519_key"
        keygen(host_key)
    host_key_line = host_key.with_suffix(".pub").read_text().strip()
    (workdir / "authorized_keys").write_text("\n".join(authorized_keys) + "\n")
    port = free_port()
    config = workdir / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile none\n"
        + (f"HostCertificate {host_certificate}\n" if host_certificate else "")
        + f"AuthorizedKeysFile {workdir}/authorized_keys\nStrictModes no\nUsePAM no\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\nPubkeyAuthentication yes\nX11Forwarding no\n"
        "PrintMotd no\nLogLevel ERROR\nMaxStartups 200:30:400\nMaxSessions 50\n"
        # Debian's bash sources ~/.bashrc for ssh commands unless it is a nested shell; on
        # these machines root's .bashrc runs `pyenv init` (about 1 s of CPU per session),
        # which is this machine's baggage, not a GPU host's. SHLVL=1 makes it nested.
        "SetEnv SHLVL=1\n"
    )
    proc = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(config)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(workdir / "sshd.log", "wb"),  # noqa: SIM115 - lives as long as sshd
    )
    server = LocalSshd(port=port, host_key_line=host_key_line, proc=proc, workdir=workdir)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {(workdir / 'sshd.log').read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                if s.recv(4).startswith(b"SSH-"):
                    return server
        except OSError:
            time.sleep(0.05)
    server.stop()
    raise RuntimeError("sshd did not answer within 10 s")
