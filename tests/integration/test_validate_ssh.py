"""`kvops validate` over real SSH: real sshd servers on 127.0.0.1, real host keys, real auth.

One fleet run covers a healthy host and every way a host can fail to be probed; each failure
must be reported for that host while the others complete, and the run exits 2 (could not run).
The probe reads a recorded host tree (tests/doubles/recorded_host_double.py) and recorded tool
outputs (tests/doubles/probe_tools_double); on the target it runs under Python 3.8 when pyenv
has one (tests/old_pythons.py), so the stdlib-only promise is checked over the wire too.
Become with a sudo password logs in as a disposable unprivileged account
(tests/integration/sudo_account.py), since sudo never asks root for one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1] / "doubles")]

from ci_rule import unavailable  # noqa: E402
from local_sshd import LocalSshd, free_port, keygen, sshd_available, start_sshd  # noqa: E402
from old_pythons import oldest_supported_python  # noqa: E402
from recorded_host_double import (  # noqa: E402
    HANGING_PYTHON_DOUBLE,
    TOOLS_DOUBLE_DIR,
    build_recorded_tree,
)
from sudo_account import add_sudo_account, sudo_account_available  # noqa: E402

TARGET_PYTHON = str(oldest_supported_python()[0])  # 3.8 where installed


class Lab:
    """Servers, keys and a recorded tree shared by the tests of this module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.client_key = root / "client_key"
        self.wrong_key = root / "wrong_key"
        authorized = keygen(self.client_key)
        keygen(self.wrong_key)
        self.servers: dict[str, LocalSshd] = {}
        for name in ("healthy", "healthy2", "wrongkey", "changed", "hang", "unknown"):
            self.servers[name] = start_sshd(root / f"sshd-{name}", [authorized])
        self.gds_dir = root / "gds"
        self.gds_dir.mkdir()
        self.roots = build_recorded_tree(root / "tree", self.gds_dir)
        self.known_hosts = root / "known_hosts"
        lines = [s.known_hosts_line for n, s in self.servers.items() if n != "unknown"]
        other = keygen(root / "impostor_host_key").split()
        changed = self.servers["changed"]
        lines = [ln for ln in lines if not ln.startswith(f"[127.0.0.1]:{changed.port} ")]
        lines.append(f"[127.0.0.1]:{changed.port} {other[0]} {other[1]}\n")
        self.known_hosts.write_text("".join(lines))
        self.closed_port = free_port()

    def host(self, port: int, **extra: Any) -> dict[str, Any]:
        host = {
            "ansible_host": "127.0.0.1",
            "ansible_port": port,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.client_key),
            "ansible_python_interpreter": TARGET_PYTHON,
            "kvops_gds_dir": str(self.gds_dir),
            "kvops_vllm_url": f"http://127.0.0.1:{self.closed_port}",
            "kvops_probe_roots": self.roots,
            "kvops_probe_tool_dirs": [str(TOOLS_DOUBLE_DIR)],
        }
        host.update(extra)
        return host

    def inventory(self) -> Path:
        s = self.servers
        hosts = {
            "healthy": self.host(s["healthy"].port),
            "healthy2": self.host(s["healthy2"].port, kvops_role="baseline"),
            "unreachable": self.host(self.closed_port),
            "wrongkey": self.host(
                s["wrongkey"].port, ansible_ssh_private_key_file=str(self.wrong_key)
            ),
            "changed": self.host(s["changed"].port),
            "unknown": self.host(s["unknown"].port),
            "hang": self.host(
                s["hang"].port, ansible_python_interpreter=str(HANGING_PYTHON_DOUBLE)
            ),
        }
        path = self.root / "inventory" / "hosts.yml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump({"all": {"children": {"gpu": {"hosts": hosts}}}}))
        return path

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    if not sshd_available():
        unavailable("openssh-server not installed (scripts/system-deps.sh installs it)")
    the_lab = Lab(tmp_path_factory.mktemp("ssh-lab"))
    try:
        yield the_lab
    finally:
        the_lab.stop()


# The per-host limit (`--timeout`) of the runs whose hosts all answer, where the timeout is not
# what is tested: generous, so a probe slowed by a loaded machine (other test processes beside
# this one; the storage bench writes 64 MiB) still completes. The hanging host's timeout is tested
# with its own, short limit.
SLOW_HOST_TIMEOUT = "120"


def run_validate(*args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}  # no agent keys
    if home is not None:
        env["HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "kvops", "validate", *args],
        capture_output=True,
        text=True,
        timeout=300,  # only ends a hung run; the hosts' own limits are --timeout
        env=env,
    )


def test_fleet_reports_each_failure_per_host_while_others_complete(
    lab: Lab, tmp_path: Path
) -> None:
    inv = lab.inventory()
    proc = run_validate(
        "-i", str(inv), "--known-hosts", str(lab.known_hosts), "--timeout", "20", "--forks", "8",
        "--json", "--junit", str(tmp_path / "v.xml"), "--save-evidence", str(tmp_path / "ev"),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr  # some hosts could not be probed
    report = json.loads(proc.stdout)
    transport = report["transport"]
    assert transport["healthy"]["status"] == "ok"
    assert transport["healthy2"]["status"] == "ok"
    assert transport["unreachable"]["status"] == "unreachable"
    assert "refused" in transport["unreachable"]["reason"].lower()
    assert transport["wrongkey"]["status"] == "auth_failed"
    assert str(lab.wrong_key) in transport["wrongkey"]["reason"]
    assert transport["changed"]["status"] == "host_key_refused"
    changed_port = lab.servers["changed"].port
    assert "CHANGED" in transport["changed"]["reason"]
    assert f"ssh-keygen -R [127.0.0.1]:{changed_port}" in transport["changed"]["reason"]
    assert transport["unknown"]["status"] == "host_key_refused"
    assert "--accept-new-host-keys" in transport["unknown"]["reason"]
    assert transport["hang"]["status"] == "timeout"
    # The hanging host cost its timeout and did not hold the others back: the healthy hosts
    # were done while it was still waited for (kvops's own durations, no wall-clock bounds).
    assert transport["hang"]["duration_s"] >= 19
    for name in ("healthy", "healthy2"):
        assert transport[name]["duration_s"] < transport["hang"]["duration_s"], transport
    not_probed = ["changed", "hang", "unknown", "unreachable", "wrongkey"]
    assert sorted(report["unreachable"]) == not_probed
    # The healthy hosts' evidence was judged: recorded RDMA mount and gdscheck were read.
    healthy = {f["check_id"]: f for f in report["hosts"]["healthy"]["findings"]}
    assert healthy["GDS-000"]["severity"] == "PASS"
    saved = json.loads((tmp_path / "ev" / "healthy.json").read_text())
    assert saved["host"] == "healthy" and saved["error"] is None
    items = saved["items"]
    assert "proto=rdma" in items["mounts"]["stdout"]
    assert items["gdscheck"]["exit_code"] == 0 and "NFS" in items["gdscheck"]["stdout"]
    assert items["nvidia_smi"]["exit_code"] == 127  # a missing tool is evidence
    assert items["gds_dir"]["data"]["exists"] is True
    assert saved["settings"]["role"] == "offload"
    failed = json.loads((tmp_path / "ev" / "wrongkey.json").read_text())
    assert failed["error"] and failed["items"] == {}
    # The JUnit file parses and carries, per host, exactly the check ids the report FAILed.
    suites = {s.get("name"): s for s in ET.parse(tmp_path / "v.xml").getroot().iter("testsuite")}
    assert set(suites) == set(report["hosts"]) and set(transport) <= set(suites)
    for name, suite in suites.items():
        junit_failed = {
            c.get("name", "").split()[0] for c in suite if c.find("failure") is not None
        }
        json_failed = {
            f["check_id"] for f in report["hosts"][name]["findings"] if f["severity"] == "FAIL"
        }
        assert junit_failed == json_failed, name
        assert suite.get("failures") == str(len(junit_failed)), name
    for name in not_probed:
        assert "GDS-000" in {c.get("name", "").split()[0] for c in suites[name]
                             if c.find("failure") is not None}  # fmt: skip
    # Progress went to stderr, one line per host.
    for name in transport:
        assert name in proc.stderr


def test_offline_rejudge_of_saved_bundle_matches(lab: Lab, tmp_path: Path) -> None:
    inv = lab.inventory()
    live = run_validate(
        "-i", str(inv), "--limit", "healthy*", "--known-hosts", str(lab.known_hosts),
        "--timeout", SLOW_HOST_TIMEOUT, "--json", "--save-evidence", str(tmp_path / "ev"),
        "--storage-bench", "--bench-size", "64M",
    )  # fmt: skip
    assert live.returncode in (0, 1), live.stderr
    saved = json.loads((tmp_path / "ev" / "healthy.json").read_text())
    assert saved["settings"]["gdsio_args"]["size"] == "64M"
    write = saved["items"]["gdsio_write"]
    assert "XferType: GPUD" in write["stdout"], write  # recorded via the double
    assert saved["items"]["nvfs_stats_after_bench"]["stdout"]
    offline = run_validate("--from-evidence", str(tmp_path / "ev"), "--json")
    assert offline.returncode == live.returncode
    assert json.loads(offline.stdout)["hosts"] == json.loads(live.stdout)["hosts"]
    both = run_validate("--from-evidence", str(tmp_path / "ev"), "-i", str(inv))
    assert both.returncode == 2 and "--from-evidence" in both.stderr


def test_accept_new_host_keys_records_unknown_key_but_never_a_changed_one(
    lab: Lab, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(lab.known_hosts.read_text())
    inv = lab.inventory()
    proc = run_validate(
        "-i", str(inv), "--limit", "unknown,changed", "--known-hosts", str(known),
        "--accept-new-host-keys", "--timeout", SLOW_HOST_TIMEOUT, "--json",
    )  # fmt: skip
    transport = json.loads(proc.stdout)["transport"]
    assert transport["unknown"]["status"] == "ok"
    assert transport["changed"]["status"] == "host_key_refused"
    unknown_port = lab.servers["unknown"].port
    assert f"[127.0.0.1]:{unknown_port} ssh-ed25519" in known.read_text()


def test_proxy_jump_and_become_over_ssh(lab: Lab, tmp_path: Path) -> None:
    """ProxyJump through one real sshd to another; become via sudo to an unprivileged user
    (the probe then cannot read root's files, which proves it ran as that user)."""
    s = lab.servers
    jump = f"-o ProxyJump=root@127.0.0.1:{s['healthy'].port}"
    hosts = {
        "jumped": lab.host(s["healthy2"].port, ansible_ssh_common_args=jump),
        "become": lab.host(
            s["healthy"].port,
            ansible_become=True,
            ansible_become_user="nobody",
            ansible_python_interpreter="python3",
        ),
    }
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    proc = run_validate(
        "-i", str(inv), "--known-hosts", str(lab.known_hosts), "--timeout", "30", "--json",
        "--save-evidence", str(tmp_path / "ev"),
    )  # fmt: skip
    transport = json.loads(proc.stdout)["transport"]
    assert transport["jumped"]["status"] == "ok", transport
    jumped = json.loads((tmp_path / "ev" / "jumped.json").read_text())
    assert "proto=rdma" in jumped["items"]["mounts"]["stdout"]
    if shutil.which("sudo") is None:
        assert transport["become"]["status"] == "auth_failed"
        return
    assert transport["become"]["status"] == "ok", transport
    become = json.loads((tmp_path / "ev" / "become.json").read_text())
    assert become["items"]["mounts"]["error"].startswith("EACCES")


def test_become_with_a_sudo_password_over_ssh(lab: Lab, tmp_path: Path) -> None:
    """Logged in as an unprivileged user whose sudo asks for a password (sudo never asks
    root): with `ansible_become_password` right, become answers sudo's prompt and the probe
    runs as root (it reads the recorded tree, which is root's alone: the same user without
    become gets EACCES); wrong, the host is an auth failure as soon as sudo asks again, not
    a timeout; absent, the reason names the variable. The password is in no output."""
    why_not = sudo_account_available()
    if why_not:
        unavailable(why_not)
    password = f"kvops-pw-{os.urandom(6).hex()}"
    # sshd reads authorized_keys as the user logging in, and pytest's tmp dirs are root's
    # alone: this user's sshd lives in a directory others may enter.
    shared = Path(tempfile.mkdtemp(prefix="kvops-sudo-sshd-"))
    shared.chmod(0o755)
    account = server = None
    try:
        account = add_sudo_account(f"kvsudo{os.getpid()}", password, shared)
        authorized = lab.client_key.with_suffix(".pub").read_text().strip()
        server = start_sshd(shared / "sshd", [authorized])
        known = tmp_path / "known_hosts"
        known.write_text(server.known_hosts_line)
        port = server.port
        login = {"ansible_user": account.name}
        become = {**login, "ansible_become": True}
        hosts = {
            "right": lab.host(port, **become, ansible_become_password=password),
            "wrong": lab.host(port, **become, ansible_become_password=password[::-1]),
            "absent": lab.host(port, **become),
            "no-become": lab.host(port, **login, ansible_python_interpreter="python3"),
        }
        inv = tmp_path / "hosts.yml"
        inv.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
        proc = run_validate(
            "-i", str(inv), "--known-hosts", str(known), "--timeout", "30", "--json",
            "--save-evidence", str(tmp_path / "ev"),
        )  # fmt: skip
    finally:
        if server is not None:
            server.stop()
        if account is not None:
            account.remove()
        shutil.rmtree(shared)
    assert proc.returncode == 2, proc.stderr  # two hosts could not be probed
    transport = json.loads(proc.stdout)["transport"]
    assert transport["right"]["status"] == "ok", transport
    right = json.loads((tmp_path / "ev" / "right.json").read_text())
    assert "proto=rdma" in right["items"]["mounts"]["stdout"]  # read as root
    assert transport["no-become"]["status"] == "ok", transport
    unprivileged = json.loads((tmp_path / "ev" / "no-become.json").read_text())
    assert unprivileged["items"]["mounts"]["error"].startswith("EACCES")
    assert transport["wrong"]["status"] == "auth_failed", transport
    assert "sudo password rejected" in transport["wrong"]["reason"]
    assert transport["wrong"]["duration_s"] < 25, transport  # answered, not timed out (30 s)
    assert transport["absent"]["status"] == "auth_failed", transport
    assert "set ansible_become_password" in transport["absent"]["reason"]
    assert "Traceback" not in proc.stderr
    outputs = [proc.stdout, proc.stderr] + [p.read_text() for p in (tmp_path / "ev").iterdir()]
    for text in outputs:
        assert password not in text and password[::-1] not in text


def test_inventory_user_known_hosts_file_is_used_without_known_hosts_option(
    lab: Lab, tmp_path: Path
) -> None:
    """Like Ansible's ssh: `-o UserKnownHostsFile=` in the inventory is the trust store; with
    neither it nor --known-hosts, ~/.ssh/known_hosts is used (and is never written)."""
    s = lab.servers
    home = tmp_path / "home"
    home.mkdir()
    hosts = {
        "pinned": lab.host(
            s["healthy"].port,
            ansible_ssh_common_args=f"-o UserKnownHostsFile={lab.known_hosts} "
            "-o StrictHostKeyChecking=no",  # not honoured: only --accept-new-host-keys
        ),
        "default": lab.host(s["healthy2"].port),
    }
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    proc = run_validate("-i", str(inv), "--timeout", "30", "--json", home=home)
    transport = json.loads(proc.stdout)["transport"]
    assert transport["pinned"]["status"] == "ok", transport
    assert transport["default"]["status"] == "host_key_refused"
    assert str(home / ".ssh" / "known_hosts") in transport["default"]["reason"]
    assert not (home / ".ssh").exists()


def test_bad_inventory_is_a_clear_error_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "hosts.yml"
    bad.write_text("all:\n  hosts: [a\n")
    proc = run_validate("-i", str(bad))
    assert proc.returncode == 2
    assert "kvops validate: error:" in proc.stderr and "Traceback" not in proc.stderr
    missing = run_validate("-i", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def _pids_with_cmdline(cmdline: bytes) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "cmdline").read_bytes().rstrip(b"\0") == cmdline:
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def test_remote_timeout_reaps_a_hung_probe(lab: Lab, tmp_path: Path) -> None:
    """The probe runs under the target's `timeout -k 5 <timeout + 5>`: a probe that never
    answers is killed on the host after kvops gave up on it, not left running. The hanging
    interpreter double sleeps for a duration no other test uses, so its process is ours."""
    sleep_s = f"600.{os.getpid()}{time.monotonic_ns() % 100000}"
    hanging = tmp_path / "hanging_python"
    hanging.write_text(HANGING_PYTHON_DOUBLE.read_text().replace("${KVOPS_DOUBLE_HANG_S:-600}",
                                                                 sleep_s))  # fmt: skip
    hanging.chmod(0o755)
    assert sleep_s in hanging.read_text()
    host = lab.host(lab.servers["hang"].port, ansible_python_interpreter=str(hanging))
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"hang": host}}}))
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvops", "validate", "-i", str(inv), "--known-hosts",
         str(lab.known_hosts), "--timeout", "3", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"},
    )  # fmt: skip
    target = f"sleep\0{sleep_s}".encode()
    while not _pids_with_cmdline(target):
        assert proc.poll() is None and time.monotonic() - started < 60, "the probe never ran"
        time.sleep(0.05)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr
    assert json.loads(stdout)["transport"]["hang"]["status"] == "timeout"
    # remote limit 3 + 5 s, then SIGKILL 5 s later at the latest: wait well beyond that
    while _pids_with_cmdline(target):
        assert time.monotonic() - started < 60, "the hung probe is still running on the host"
        time.sleep(0.2)


def test_two_hop_proxy_jump_and_a_jump_host_with_a_changed_key(lab: Lab, tmp_path: Path) -> None:
    """ProxyJump through two real sshds in order; a hop whose host key is not the one in
    known_hosts is refused like a target would be, first hop or second (so both hops are
    really contacted, the second through the first), and the target is never reached."""
    s = lab.servers

    def jump(*servers: str) -> str:
        return "-o ProxyJump=" + ",".join(f"root@127.0.0.1:{s[name].port}" for name in servers)

    hosts = {
        "two-hops": lab.host(s["hang"].port, ansible_ssh_common_args=jump("healthy", "healthy2")),
        "bad-second-hop": lab.host(
            s["hang"].port, ansible_ssh_common_args=jump("healthy", "changed")
        ),
        "bad-first-hop": lab.host(s["healthy2"].port, ansible_ssh_common_args=jump("changed")),
        # a hop authenticates with its own inventory entry's credentials, never the target's
        "hop1": lab.host(s["healthy"].port),
        "hop2": lab.host(s["healthy2"].port),
        "hop-changed": lab.host(s["changed"].port),
    }
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    proc = run_validate(
        "-i", str(inv), "--known-hosts", str(lab.known_hosts), "--timeout", "30", "--json",
        "--save-evidence", str(tmp_path / "ev"),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr  # the bad hops' targets could not be probed
    transport = json.loads(proc.stdout)["transport"]
    assert transport["two-hops"]["status"] == "ok", transport
    two = json.loads((tmp_path / "ev" / "two-hops.json").read_text())
    assert "proto=rdma" in two["items"]["mounts"]["stdout"]
    for name in ("bad-second-hop", "bad-first-hop"):
        assert transport[name]["status"] == "host_key_refused", transport
        assert f"127.0.0.1]:{s['changed'].port} CHANGED" in transport[name]["reason"], transport


def test_host_certificates_verify_against_cert_authority_lines(lab: Lab, tmp_path: Path) -> None:
    """known_hosts holds only a `@cert-authority` line (no host key): the host whose sshd
    presents a HostCertificate from that CA is probed; the one whose certificate another CA
    signed is refused, naming the reason. Two extra sshds (well under a second each)."""
    ca, other_ca = tmp_path / "host_ca", tmp_path / "other_ca"
    ca_line = keygen(ca)
    keygen(other_ca)
    servers = {}
    for name, signer in (("cert-ok", ca), ("cert-other-ca", other_ca)):
        host_key = tmp_path / f"{name}_host_key"
        keygen(host_key)
        subprocess.run(
            ["ssh-keygen", "-q", "-s", str(signer), "-I", name, "-h", "-n", "127.0.0.1",
             "-V", "-5m:+1h", str(host_key.with_suffix(".pub"))],
            check=True,
        )  # fmt: skip
        servers[name] = start_sshd(
            tmp_path / f"sshd-{name}",
            [lab.client_key.with_suffix(".pub").read_text().strip()],
            host_key=host_key,
            host_certificate=tmp_path / f"{name}_host_key-cert.pub",
        )
    try:
        known = tmp_path / "known_hosts"
        known.write_text(f"@cert-authority 127.0.0.1 {ca_line}\n")
        inv = tmp_path / "hosts.yml"
        hosts = {name: lab.host(server.port) for name, server in servers.items()}
        inv.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
        proc = run_validate(
            "-i", str(inv), "--known-hosts", str(known), "--timeout", SLOW_HOST_TIMEOUT, "--json",
            "--accept-new-host-keys",  # a bad certificate is refused even so
        )  # fmt: skip
        transport = json.loads(proc.stdout)["transport"]
    finally:
        for server in servers.values():
            server.stop()
    assert transport["cert-ok"]["status"] == "ok", transport
    refused = transport["cert-other-ca"]
    assert refused["status"] == "host_key_refused", transport
    port = servers["cert-other-ca"].port
    assert f"host certificate of [127.0.0.1]:{port} refused: unknown CA" in refused["reason"]
    assert known.read_text() == f"@cert-authority 127.0.0.1 {ca_line}\n"  # nothing recorded
