"""TEST DOUBLE: a recorded GPU host's /proc, /sys and /etc built in a temporary folder.

The probe reads these through its `roots` setting (the one named seam), so tests exercise the
real collectors on real recorded outputs (`tests/fixtures/`, each with its source noted).
What each file is made from:

- etc/cufile.json: fixtures/cufile/default-cufile.json (NVIDIA's template, verbatim).
- proc/mounts: the NetApp ONTAP NFSv4.1/RDMA line of fixtures/misc/mount-nfs4-rdma-netapp-ontap.txt
  rewritten from `mount` to /proc/mounts layout, with its mount point moved to the test's GDS dir.
- proc/driver/nvidia-fs/stats: fixtures/nvidia-fs/nvidia-docs-stats-gds1.0-16gpu-mib.txt.
- sys/class/infiniband: devices, ports and net devices of fixtures/misc/ibdev2netdev-dgx-a100-...
  (`Up` written as the kernel's `4: ACTIVE`, `Down` as `1: DOWN`; no rate recorded, none written).
- sys/module/nvidia_fs/parameters: the module's documented defaults (gds-nvidia-fs nvfs-core.c).
- etc/os-release: this machine's own file.
Nothing else is written: absent files are what the probe must record as ENOENT evidence.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TOOLS_DOUBLE_DIR = Path(__file__).resolve().parent / "probe_tools_double"
HANGING_PYTHON_DOUBLE = Path(__file__).resolve().parent / "hanging_python_double"

NVFS_PARAM_DEFAULTS = {
    "max_devices": "16",
    "dbg_enabled": "0",
    "info_enabled": "1",
    "peer_stats_enabled": "0",
    "rw_stats_enabled": "0",
    "use_legacy_p2p_allocation": "1",
}


def ontap_mount_line(mount_point: str) -> str:
    """The recorded ONTAP RDMA mount as a /proc/mounts line, mounted at `mount_point`."""
    text = (FIXTURES / "misc" / "mount-nfs4-rdma-netapp-ontap.txt").read_text()
    for line in text.splitlines():
        m = re.match(r"^(\S+) on (\S+) type (\S+) \((.*)\)$", line)
        if m:
            return f"{m.group(1)} {mount_point} {m.group(3)} {m.group(4)} 0 0\n"
    raise AssertionError("fixture has no mount line")


def build_recorded_tree(root: Path, gds_dir: Path) -> dict[str, str]:
    """Write the tree under `root`; return the probe's `roots` setting for it."""
    etc, proc, sys_ = root / "etc", root / "proc", root / "sys"
    for d in (etc, proc / "driver" / "nvidia-fs", sys_ / "module" / "nvidia_fs" / "parameters"):
        d.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(FIXTURES / "cufile" / "default-cufile.json", etc / "cufile.json")
    shutil.copyfile("/etc/os-release", etc / "os-release")
    (proc / "mounts").write_text(
        "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n" + ontap_mount_line(str(gds_dir))
    )
    shutil.copyfile(
        FIXTURES / "nvidia-fs" / "nvidia-docs-stats-gds1.0-16gpu-mib.txt",
        proc / "driver" / "nvidia-fs" / "stats",
    )
    for name, value in NVFS_PARAM_DEFAULTS.items():
        (sys_ / "module" / "nvidia_fs" / "parameters" / name).write_text(value + "\n")
    ib_text = (FIXTURES / "misc" / "ibdev2netdev-dgx-a100-nvidia-docs.txt").read_text()
    for m in re.finditer(r"^(mlx5_\d+) port (\d+) ==> (\S+) \((Up|Down)\)$", ib_text, re.M):
        dev, port, netdev, updown = m.groups()
        dev_dir = sys_ / "class" / "infiniband" / dev
        port_dir = dev_dir / "ports" / port
        port_dir.mkdir(parents=True, exist_ok=True)
        (dev_dir / "device" / "net" / netdev).mkdir(parents=True, exist_ok=True)
        (port_dir / "state").write_text("4: ACTIVE\n" if updown == "Up" else "1: DOWN\n")
        (port_dir / "link_layer").write_text("InfiniBand\n")
    return {"proc": str(proc), "sys": str(sys_), "etc": str(etc)}
