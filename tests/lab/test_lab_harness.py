"""The lab itself: real SSH with verified host keys, the test apt repo, the doubles, teardown.

Package installs happen on a private one-host lab so the shared ``lab`` hosts stay pristine for
the roles' converge tests.
"""

from __future__ import annotations

import subprocess
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest
from lab_harness import PROBE_ROOTS, LabHosts, LabSession

from kvops.lab import net
from kvops.lab.lab import mounts_under


@pytest.fixture(scope="module")
def scratch(lab_factory: Callable[..., LabHosts]) -> Iterator[LabHosts]:
    """A private one-host lab these tests may dirty (its slot is freed after this module;
    ``lab_factory`` is requested for its skip/fail rule)."""
    session = LabSession()
    try:
        yield session.start(hosts=1, name_prefix="kvscratch")
    finally:
        session.close()


def _paramiko(lab: LabHosts, name: str, known_hosts: Path) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        lab.host(name).ip,
        username=lab.user,
        key_filename=str(lab.ssh_key_path),
        look_for_keys=False,
        allow_agent=False,
        timeout=10,
    )
    return client


def test_every_host_answers_ssh_with_its_known_host_key(lab: LabHosts) -> None:
    assert len(lab.hosts) >= 2
    for h in lab.hosts:
        client = _paramiko(lab, h.name, lab.known_hosts_path)
        try:
            _, out, _ = client.exec_command("hostname; sudo -n id -u")
            assert out.read().decode().split() == [h.name, "0"]
        finally:
            client.close()


def test_testinfra_reaches_hosts_through_the_lab_ssh_config(lab: LabHosts) -> None:
    host = lab.testinfra(lab.hosts[-1].name)
    assert host.package("openssh-server").is_installed
    assert host.file("/etc/apt/sources.list.d/kvops-test-repo.list").contains("trusted=yes")
    assert host.check_output("hostname") == lab.hosts[-1].name


def test_an_unknown_host_key_is_rejected(lab: LabHosts, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(paramiko.SSHException):
        _paramiko(lab, lab.hosts[0].name, empty)
    wrong = tmp_path / "wrong_known_hosts"
    other = lab.known_hosts_path.read_text().splitlines()[1].split()[1:]  # host 2's key
    wrong.write_text(f"{lab.hosts[0].ip} {' '.join(other)}\n")
    with pytest.raises(paramiko.BadHostKeyException):
        _paramiko(lab, lab.hosts[0].name, wrong)


_TCP_PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], 22), timeout=2).close()
    print("open")
except OSError as exc:
    print("closed", exc)
"""


def test_hosts_are_isolated_namespaces_without_sys_module(lab: LabHosts) -> None:
    name = lab.hosts[0].name
    out = lab.ssh(name, ["cat", "/proc/1/comm", "/proc/self/status"]).stdout
    assert out.splitlines()[0] == "sshd"  # sshd is PID 1 of the host
    cap_bnd = int(next(x for x in out.splitlines() if x.startswith("CapBnd:")).split()[1], 16)
    assert not cap_bnd & (1 << 16), "CAP_SYS_MODULE must be dropped"
    route = lab.ssh(name, ["ip", "-4", "route"]).stdout
    assert f"default via {lab.gateway_ip}" in route
    bridge = f"kvopsbr{lab.slot}"
    assert Path(f"/proc/sys/net/ipv4/conf/{bridge}/forwarding").read_text().strip() == "0"
    sibling = lab.ssh(name, ["python3", "-c", _TCP_PROBE, lab.hosts[1].ip], check=False)
    assert sibling.stdout.strip() == "open"  # hosts reach each other's sshd
    outside = lab.ssh(name, ["python3", "-c", _TCP_PROBE, "192.0.2.1"], check=False)
    assert outside.stdout.strip() != "open"  # and nothing beyond the bridge


def test_every_host_has_the_modelled_rdma_port_bound_at_boot(lab: LabHosts) -> None:
    name = lab.hosts[0].name
    port = f"{PROBE_ROOTS['sys']}/class/infiniband/mlx5_0/ports/1"
    assert lab.read_file(name, f"{port}/state").strip() == "4: ACTIVE"
    assert lab.read_file(name, f"{port}/gid_attrs/ndevs/0").strip() == "eth0"
    assert "\nmlx5_ib " in lab.ssh(name, ["lsmod"]).stdout
    assert lab.doubles_log(name, "modprobe") == []  # coldplug is not a modprobe call
    assert lab.read_file(name, f"{PROBE_ROOTS['sys']}/class/net/eth0/address").strip()


def test_ansible_playbook_uses_ssh_with_strict_host_keys(lab: LabHosts, tmp_path: Path) -> None:
    inventory = lab.inventory_path.read_text()
    assert "StrictHostKeyChecking=yes" in inventory
    assert f"UserKnownHostsFile={lab.known_hosts_path}" in inventory
    playbook = tmp_path / "facts.yml"
    playbook.write_text(
        textwrap.dedent(
            """\
            - name: Lab facts
              hosts: gpu_hosts
              gather_facts: true
              tasks:
                - name: The host is the Debian lab host it claims to be
                  ansible.builtin.assert:
                    that:
                      - ansible_facts.distribution == "Debian"
                      - ansible_facts.default_ipv4.address == ansible_host
                      - ansible_facts.hostname == inventory_hostname
            """
        )
    )
    proc = lab.ansible_playbook(playbook)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "failed=0" in proc.stdout


def test_apt_installs_pinned_test_packages_from_the_lab_repo(scratch: LabHosts) -> None:
    h = scratch.hosts[0].name
    scratch.ssh(
        h,
        ["apt-get", "install", "-y", "-q", "nvidia-driver-580-open=580.82.07-0ubuntu1"],
        sudo=True,
    )
    version = scratch.ssh(h, ["dpkg-query", "-W", "-f", "${Version}", "nvidia-driver-580-open"])
    assert version.stdout == "580.82.07-0ubuntu1"
    scratch.ssh(h, ["modprobe", "nvidia"], sudo=True)  # nvidia-smi needs the driver loaded
    csv = scratch.ssh(h, ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    assert csv.stdout.strip() == "NVIDIA L40S, 580.82.07"
    assert scratch.ssh(h, ["/usr/sbin/modinfo", "-F", "license", "nvidia"]).stdout.strip() == (
        "Dual MIT/GPL"
    )
    # The proprietary double replaces the open one (they conflict, as the real ones do).
    scratch.ssh(h, ["apt-get", "install", "-y", "-q", "nvidia-driver-580"], sudo=True)
    gone = scratch.ssh(h, ["dpkg-query", "-W", "nvidia-driver-580-open"], check=False)
    assert "no packages found" in gone.stderr or gone.returncode != 0
    assert scratch.ssh(h, ["/usr/sbin/modinfo", "-F", "license", "nvidia"]).stdout.strip() == (
        "NVIDIA"
    )
    assert "nvidia-smi.log" in scratch.ssh(h, ["ls", "/var/log/kvops-test-doubles"]).stdout


def test_modprobe_double_records_calls_and_knows_installed_modules(scratch: LabHosts) -> None:
    h = scratch.hosts[0].name
    scratch.write_file(h, "/etc/modprobe.d/nvidia-fs.conf", "options nvidia_fs max_devices=32\n")
    missing = scratch.ssh(h, ["modprobe", "nvidia_fs"], sudo=True, check=False)
    assert missing.returncode == 1 and "not found" in missing.stderr  # no nvidia-fs-dkms yet
    scratch.ssh(h, ["apt-get", "install", "-y", "-q", "doca-ofed", "mlnx-nfsrdma-dkms"], sudo=True)
    scratch.ssh(h, ["apt-get", "install", "-y", "-q", "nvidia-gds"], sudo=True)
    scratch.ssh(h, ["modprobe", "rpcrdma"], sudo=True)
    scratch.ssh(h, ["modprobe", "nvidia_fs"], sudo=True)
    assert scratch.doubles_log(h, "modprobe")[-3:] == ["nvidia_fs", "rpcrdma", "nvidia_fs"]
    lsmod = scratch.ssh(h, ["lsmod"]).stdout
    for module in ("rpcrdma", "sunrpc", "nvidia_fs", "nvidia"):
        assert f"\n{module} " in lsmod
    params = "/var/lib/kvops-test-doubles/sys/module/nvidia_fs/parameters/max_devices"
    assert scratch.read_file(h, params).strip() == "32"
    stats = scratch.read_file(h, "/var/lib/kvops-test-doubles/evidence/nvidia-fs-stats")
    assert "Mellanox PeerDirect Supported: True" in stats  # RDMA stack was installed first
    # The lab proc tree (the probe's path-root seam) shows what the loaded modules add.
    proc = PROBE_ROOTS["proc"]
    assert scratch.read_file(h, f"{proc}/driver/nvidia-fs/stats") == stats
    assert "NVIDIA UNIX" in scratch.read_file(h, f"{proc}/driver/nvidia/version")
    assert "\nnvidia_fs " in "\n" + scratch.read_file(h, f"{proc}/modules")
    assert scratch.read_file(h, f"{proc}/cmdline") == Path("/proc/cmdline").read_text()
    scratch.ssh(h, ["modprobe", "-r", "nvidia_fs"], sudo=True)
    assert scratch.ssh(h, ["test", "-e", f"{proc}/driver/nvidia-fs"], check=False).returncode
    scratch.ssh(h, ["modprobe", "nvidia_fs"], sudo=True)


GDSCHECK = "/usr/local/cuda/gds/tools/gdscheck"
GDSIO = "/usr/local/cuda/gds/tools/gdsio"
NO_COMPAT_CUFILE = '{ // written by the test\n "properties": { "allow_compat_mode": false } }\n'


def test_gdscheck_double_follows_the_host_state(scratch: LabHosts) -> None:
    """NFS through nvidia-fs needs nvidia_fs and rpcrdma loaded; without them compat only when
    cufile.json allows it (libcufile's default file does), else Unsupported. PeerDirect comes
    from the nvidia-fs build (OFED installed first in the test above)."""
    h = scratch.hosts[0].name
    gdscheck = scratch.ssh(h, [GDSCHECK, "-p"]).stdout
    assert " NFS                : Supported" in gdscheck
    assert " --Mellanox PeerDirect : Enabled" in gdscheck
    assert " properties.use_compat_mode : true" in gdscheck  # the packaged default cufile.json
    default_cufile = scratch.read_file(h, "/etc/cufile.json")
    scratch.ssh(h, ["modprobe", "-r", "rpcrdma"], sudo=True)
    try:
        assert "NFS : compat" in scratch.ssh(h, [GDSCHECK, "-p"]).stdout
        scratch.write_file(h, "/etc/cufile.json", NO_COMPAT_CUFILE)
        gdscheck = scratch.ssh(h, [GDSCHECK, "-p"]).stdout
        assert " NFS                : Unsupported" in gdscheck
        assert " properties.use_compat_mode : false" in gdscheck
    finally:
        scratch.write_file(h, "/etc/cufile.json", default_cufile)
        scratch.ssh(h, ["modprobe", "rpcrdma"], sudo=True)
    scratch.ssh(h, ["modprobe", "-r", "nvidia_fs"], sudo=True)
    try:
        gdscheck = scratch.ssh(h, [GDSCHECK, "-p"]).stdout
        assert "NFS : compat" in gdscheck and "NFS                : Supported" not in gdscheck
    finally:
        scratch.ssh(h, ["modprobe", "nvidia_fs"], sudo=True)


def _nvfs_counters(lab: LabHosts, name: str) -> dict[str, int]:
    stats = lab.read_file(name, f"{PROBE_ROOTS['proc']}/driver/nvidia-fs/stats")
    counters: dict[str, int] = {}
    for line in stats.splitlines():
        key, _, rest = line.partition(" : ")
        if key in ("Reads", "Writes") and rest.startswith("n="):
            for word in rest.split():
                k, _, v = word.partition("=")
                counters[f"{key}.{k}"] = int(v)
    return counters


def test_gdsio_double_writes_files_and_moves_counters(scratch: LabHosts) -> None:
    """GPU_DIRECT through the fast path: one file per thread in -D and the nvidia-fs counters
    rise by the ops and MiB the result line reports; through compat, files but no counters."""
    h = scratch.hosts[0].name
    target = "/tmp/gdsio-target"
    missing = scratch.ssh(h, [GDSIO, "-D", target, "-w", "2", "-s", "1M", "-x", "0", "-I", "1"],
                          check=False)  # fmt: skip
    assert missing.returncode != 0 and "No such file or directory" in missing.stderr
    scratch.ssh(h, ["mkdir", "-p", target], sudo=True)
    before = _nvfs_counters(scratch, h)
    run = [GDSIO, "-D", target, "-d", "0", "-w", "3", "-s", "1M", "-i", "1M", "-x", "0", "-I", "1"]
    out = scratch.ssh(h, run, sudo=True).stdout
    after = _nvfs_counters(scratch, h)
    files = scratch.ssh(h, ["ls", target]).stdout.split()
    assert files == ["gdsio.0", "gdsio.1", "gdsio.2"]
    assert scratch.ssh(h, ["stat", "-c", "%s", f"{target}/gdsio.0"]).stdout.strip() == "1048576"
    ops = int(out.split(" ops: ")[1].split()[0])
    kib = int(out.split("DataSetSize: ")[1].split("/")[0])
    assert after["Writes.n"] - before["Writes.n"] == ops
    assert after["Writes.ok"] - before["Writes.ok"] == ops
    write_mib = "Writes.writeMiB" if "Writes.writeMiB" in after else "Writes.writeMB"
    assert after[write_mib] - before[write_mib] == kib // 1024
    assert after["Reads.n"] == before["Reads.n"]
    # Without rpcrdma the IO falls back to POSIX (libcufile's default cufile.json allows
    # compat): gdsio still "works", nvidia-fs sees nothing.
    scratch.ssh(h, ["modprobe", "-r", "rpcrdma"], sudo=True)
    try:
        scratch.ssh(
            h, [GDSIO, "-D", target, "-w", "1", "-s", "1M", "-x", "0", "-I", "0"], sudo=True
        )
        assert _nvfs_counters(scratch, h) == after
    finally:
        scratch.ssh(h, ["modprobe", "rpcrdma"], sudo=True)


def test_nvidia_smi_double_follows_driver_and_gpus(scratch: LabHosts) -> None:
    h = scratch.hosts[0].name
    query = ["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"]
    assert scratch.ssh(h, query).stdout == "0, NVIDIA L40S\n"
    scratch.set_gpus(h, ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"])
    try:
        assert scratch.ssh(h, query).stdout == (
            "0, NVIDIA H100 80GB HBM3\n1, NVIDIA H100 80GB HBM3\n"
        )
        scratch.set_gpus(h, [])
        none = scratch.ssh(h, query, check=False)
        assert none.returncode == 6 and "No devices were found" in none.stdout
    finally:
        scratch.set_gpus(h, None)
    scratch.ssh(h, ["modprobe", "-r", "nvidia_fs"], sudo=True)
    scratch.ssh(h, ["modprobe", "-r", "nvidia"], sudo=True)
    try:
        no_driver = scratch.ssh(h, query, check=False)
        assert no_driver.returncode == 9
        assert "couldn't communicate with the NVIDIA driver" in no_driver.stdout
    finally:
        scratch.ssh(h, ["modprobe", "nvidia_fs"], sudo=True)  # loads nvidia first
    assert scratch.ssh(h, query).returncode == 0


def test_mount_nfs_double_mounts_and_records_rdma_options(scratch: LabHosts) -> None:
    h = scratch.hosts[0].name
    scratch.ssh(h, ["apt-get", "install", "-y", "-q", "nfs-common"], sudo=True)
    scratch.ssh(h, ["mkdir", "-p", "/mnt/kv"], sudo=True)
    fstab = scratch.read_file(h, "/etc/fstab")
    line = "192.0.2.10:/kvcache /mnt/kv nfs vers=4.1,proto=rdma,port=20049,hard,_netdev 0 0\n"
    scratch.write_file(h, "/etc/fstab", fstab + line)
    # No RPC-over-RDMA transport: the in-box rpcrdma does not insert against OFED's ib_core
    # once mlnx-nfsrdma-dkms is gone, so the kernel cannot load it on demand and refuses.
    scratch.ssh(h, ["apt-get", "remove", "-y", "-q", "mlnx-nfsrdma-dkms"], sudo=True)
    scratch.ssh(h, ["modprobe", "-r", "rpcrdma"], sudo=True)
    refused = scratch.ssh(h, ["mount", "/mnt/kv"], sudo=True, check=False)
    assert refused.returncode == 32 and "Protocol not supported" in refused.stderr, refused
    assert scratch.ssh(h, ["mountpoint", "-q", "/mnt/kv"], check=False).returncode != 0
    # With the rebuilt module back, the mount loads rpcrdma on demand, as the kernel does.
    scratch.ssh(h, ["apt-get", "install", "-y", "-q", "mlnx-nfsrdma-dkms"], sudo=True)
    scratch.ssh(h, ["mount", "/mnt/kv"], sudo=True)
    assert scratch.ssh(h, ["mountpoint", "-q", "/mnt/kv"], check=False).returncode == 0
    assert "\nrpcrdma " in scratch.ssh(h, ["lsmod"]).stdout
    mounts = scratch.ssh(h, ["/usr/share/kvops-test-doubles/bin/proc-mounts"]).stdout
    expected = "192.0.2.10:/kvcache /mnt/kv nfs4 rw,relatime,vers=4.1,proto=rdma,port=20049,hard"
    assert expected in mounts
    assert expected in scratch.read_file(h, f"{PROBE_ROOTS['proc']}/mounts")
    assert (
        scratch.doubles_log(h, "mount.nfs")
        == ["192.0.2.10:/kvcache /mnt/kv -o rw,vers=4.1,proto=rdma,port=20049,hard,_netdev"] * 2
    )  # the refused call, then the mount
    scratch.ssh(h, ["umount", "/mnt/kv"], sudo=True)
    mounts = scratch.ssh(h, ["/usr/share/kvops-test-doubles/bin/proc-mounts"]).stdout
    assert "/mnt/kv" not in mounts


def test_restart_replays_modules_load_and_keeps_host_key(scratch: LabHosts) -> None:
    h = scratch.hosts[0].name
    scratch.write_file(h, "/etc/modules-load.d/rpcrdma.conf", "# NFS over RDMA\nrpcrdma\n")
    scratch.ssh(h, ["touch", "/root/survives-reboot"], sudo=True)
    scratch.restart(h)
    lsmod = scratch.ssh(h, ["lsmod"]).stdout  # strict host key checking still passes
    assert "\nrpcrdma " in lsmod and "\nnvidia_fs " not in lsmod
    assert "loaded rpcrdma" in scratch.read_file(h, "/var/log/kvops-test-doubles/boot.log")
    assert scratch.ssh(h, ["test", "-f", "/root/survives-reboot"], sudo=True).returncode == 0
    # RDMA=down takes the modelled port down from the next boot on.
    scratch.set_variant(h, RDMA="down")
    scratch.restart(h)
    assert scratch.ssh(h, ["ibdev2netdev"]).stdout == "mlx5_0 port 1 ==> eth0 (Down)\n"
    scratch.set_variant(h)
    # The fstab NFS entry of the mount test is mounted again at boot, through the double.
    proc_mounts = scratch.read_file(h, f"{PROBE_ROOTS['proc']}/mounts")
    assert "192.0.2.10:/kvcache /mnt/kv nfs4 rw,relatime,vers=4.1,proto=rdma" in proc_mounts


SERVICE_PLAYBOOK = """\
- name: Service manager double
  hosts: gpu_hosts
  become: true
  gather_facts: true
  tasks:
    - name: Ansible sees systemd
      ansible.builtin.assert:
        that: ansible_facts.service_mgr == "systemd"
    - name: A unit written by a role
      ansible.builtin.copy:
        dest: /etc/systemd/system/kvdemo.service
        mode: "0644"
        content: |
          [Unit]
          Description=kvops lab demo
          [Service]
          Environment=KVDEMO=yes
          User=kvops
          ExecStart=/usr/bin/python3 -m http.server 8090 --bind 127.0.0.1
          [Install]
          WantedBy=multi-user.target
    - name: Started and enabled
      ansible.builtin.systemd_service:
        name: kvdemo
        state: started
        enabled: true
        daemon_reload: true
    - name: Facts
      ansible.builtin.service_facts:
    - name: Running per service_facts
      ansible.builtin.assert:
        that: ansible_facts.services['kvdemo.service'].state == 'running'
"""


def test_service_manager_double_runs_units_for_ansible(
    lab_factory: Callable[..., LabHosts], tmp_path: Path
) -> None:
    session = LabSession()
    try:
        svc = session.start(
            hosts=1, name_prefix="kvsvc", variants={"kvsvc-1": {"SYSTEMD": "double"}}
        )
        _check_service_manager_double(svc, tmp_path)
    finally:
        session.close()


def _check_service_manager_double(svc: LabHosts, tmp_path: Path) -> None:
    h = svc.hosts[0].name
    playbook = tmp_path / "service.yml"
    playbook.write_text(SERVICE_PLAYBOOK)
    proc = svc.ansible_playbook(playbook)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = svc.ansible_playbook(playbook)
    assert "changed=0" in again.stdout, again.stdout
    pid = svc.read_file(h, "/run/kvops-test-doubles/systemd/kvdemo.service.pid").strip()
    environ = svc.read_file(h, f"/proc/{pid}/environ").split("\0")
    assert "KVDEMO=yes" in environ
    svc.restart(h)  # enabled units start at boot
    assert svc.ssh(h, ["systemctl", "is-active", "kvdemo"]).stdout.strip() == "active"
    svc.set_variant(h)  # back to no service manager: the real systemctl returns
    svc.restart(h)
    assert svc.ssh(h, ["cat", "/proc/1/comm"]).stdout.strip() == "sshd"
    assert svc.ssh(h, ["test", "-e", "/usr/bin/systemctl.real"], check=False).returncode == 1


def test_teardown_leaves_no_namespace_mount_process_or_file() -> None:
    session = LabSession()
    lab = session.start(hosts=2, name_prefix="kvteardown")
    slot_prefix = f"kvops{lab.slot}-"
    state_dir = lab.inventory_dir.parent
    pids = [
        int(p) for ns in net.list_netns() if ns.startswith(slot_prefix) for p in net.netns_pids(ns)
    ]
    assert pids, "hosts should be running before teardown"
    # A host that died on its own (a crashed test) must not stop the teardown.
    subprocess.run(["kill", "-KILL", str(pids[0])], check=False)
    session.close()
    assert not [ns for ns in net.list_netns() if ns.startswith(slot_prefix)]
    assert not net.link_exists(f"kvopsbr{lab.slot}")
    deadline = time.monotonic() + 5  # killed processes are reaped by PID 1, not by us
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    assert not mounts_under(state_dir)
    assert not (state_dir / "hosts").exists() or not any((state_dir / "hosts").iterdir())
    assert not lab.inventory_path.exists() and not lab.ssh_key_path.exists()
