"""One lab host: an overlayfs over the base image, started as its own namespaces with sshd as PID 1.

The host process is ``ip netns exec <ns> unshare --mount --uts --pid --fork --kill-child``
running :data:`HOST_INIT` (a bash script written into the lab dir), which mounts the overlay,
/proc, a read-only /sys, a private /dev and /run, the test repo read-only, copies in the files
the harness prepared (host key, authorized_keys, doubles), replays a "boot" (modules-load.d
through the modprobe double, ``apt-get update`` against the test repo), and finally execs sshd
under ``setpriv`` with CAP_SYS_MODULE/SYS_BOOT/SYS_TIME/SYS_RAWIO dropped from the bounding set.
Every mount lives in the host's private mount namespace, so killing the ``unshare`` process
(SIGKILL: ``unshare --fork`` ignores SIGTERM) removes the host and all its mounts at once.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from kvops.lab.errors import LabError

HOST_INIT = r"""#!/bin/bash
# kvops lab host init (written by kvops/lab/host.py): PID 1 of the host's PID namespace until it
# execs sshd. Arguments: merged lower upper work hostname inject-dir repo-dir|-
set -euo pipefail
M=$1 LOWER=$2 UPPER=$3 WORK=$4 NAME=$5 INJECT=$6 REPO=$7
mount -t overlay overlay -o "lowerdir=$LOWER,upperdir=$UPPER,workdir=$WORK" "$M"
mount -t proc -o nosuid,nodev,noexec proc "$M/proc"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$M/sys"
mount -t tmpfs -o mode=755,nosuid,size=16m tmpfs "$M/dev"
for d in null zero full random urandom tty; do
  : > "$M/dev/$d"
  mount --bind "/dev/$d" "$M/dev/$d"
done
mkdir -m 755 "$M/dev/pts"
mkdir -m 1777 "$M/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts "$M/dev/pts"
ln -s pts/ptmx "$M/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$M/dev/shm"
ln -s /proc/self/fd "$M/dev/fd"
ln -s /proc/self/fd/0 "$M/dev/stdin"
ln -s /proc/self/fd/1 "$M/dev/stdout"
ln -s /proc/self/fd/2 "$M/dev/stderr"
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$M/run"
mkdir -m 755 "$M/run/sshd" "$M/run/lock"
if [ "$REPO" != "-" ]; then
  mkdir -p "$M/srv/kvops-test-repo"
  mount --bind "$REPO" "$M/srv/kvops-test-repo"
  mount -o remount,bind,ro "$M/srv/kvops-test-repo"
fi
tar -C "$INJECT" -cf - . | tar -C "$M" -xpf - --no-overwrite-dir
hostname "$NAME"
DROP=-sys_module,-sys_boot,-sys_time,-sys_rawio
if [ -x "$M/usr/lib/kvops-test-doubles/boot" ]; then
  setpriv --bounding-set "$DROP" chroot "$M" /usr/lib/kvops-test-doubles/boot
fi
if [ "$REPO" != "-" ]; then
  chroot "$M" apt-get update -qq || echo "kvops lab: apt-get update failed" >&2
fi
echo "kvops lab: $NAME ready to start sshd"
if grep -qx 'SYSTEMD=double' "$M/etc/kvops-test-doubles/variant.env" 2>/dev/null; then
  # With the service manager double, PID 1 is a reaping shell (Ansible then decides the service
  # manager from /run/systemd/system, as on a systemd host); sshd is its child.
  exec setpriv --bounding-set "$DROP" chroot "$M" /bin/bash -c '/usr/sbin/sshd -D -e & wait $!'
fi
exec setpriv --bounding-set "$DROP" chroot "$M" /usr/sbin/sshd -D -e
"""


def write_init(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HOST_INIT)
    path.chmod(0o755)
    return path


def start(
    *,
    netns: str,
    name: str,
    init: Path,
    host_dir: Path,
    lower: Path,
    repo_dir: Path | None,
) -> subprocess.Popen[bytes]:
    """Start the host process (returns at once; see :func:`wait_ready`)."""
    for sub in ("upper", "work", "merged"):
        (host_dir / sub).mkdir(parents=True, exist_ok=True)
    console = (host_dir / "console.log").open("ab")
    argv = [
        "ip",
        "netns",
        "exec",
        netns,
        "unshare",
        "--mount",
        "--uts",
        "--pid",
        "--fork",
        "--kill-child",
        "--propagation",
        "private",
        "bash",
        str(init),
        str(host_dir / "merged"),
        str(lower),
        str(host_dir / "upper"),
        str(host_dir / "work"),
        name,
        str(host_dir / "inject"),
        str(repo_dir) if repo_dir is not None else "-",
    ]
    try:
        # A new session: Ctrl-C on the terminal reaches the harness, which tears hosts down
        # in order, instead of killing sshd under a half-finished teardown.
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=console, stderr=console, start_new_session=True
        )
    finally:
        console.close()


def proc_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: tells a recycled PID from the one the lab started."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def wait_ready(
    ip: str, proc: subprocess.Popen[bytes] | None, console: Path, timeout_s: float = 60.0
) -> None:
    """Wait until TCP ip:22 answers with an SSH banner."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise LabError(
                f"host {ip} exited during start (exit {proc.returncode}): {tail(console)}"
            )
        try:
            with socket.create_connection((ip, 22), timeout=1.0) as sock:
                sock.settimeout(2.0)
                if sock.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise LabError(f"host {ip} did not answer SSH within {timeout_s:.0f} s: {tail(console)}")


def tail(console: Path, lines: int = 3) -> str:
    try:
        text = console.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no console log"
    return " | ".join(text[-lines:]) or "empty console log"


def kill(pid: int, start_time: int | None, timeout_s: float = 5.0) -> None:
    """SIGKILL the host's unshare process (only if it is still the process the lab started)."""
    if pid <= 1 or proc_start_time(pid) is None:
        return
    if start_time is not None and proc_start_time(pid) != start_time:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return
        except ChildProcessError:
            pass  # not our child (started by an earlier `kvops lab up`): poll /proc instead
        stat = proc_start_time(pid)
        if stat is None or stat != start_time:
            return
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return
        time.sleep(0.02)
    raise LabError(f"host process {pid} survived SIGKILL for {timeout_s:.0f} s")
