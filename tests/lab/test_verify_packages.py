"""testinfra after site.yml: packages, pinned versions, holds, one RDMA stack, install order."""

from __future__ import annotations

import pytest
from lab_harness import LabHosts
from site_lab import (
    DOCA_VERSIONS,
    DRIVER_VERSION,
    GDS_VERSION,
    NVIDIA_FS_VERSION,
    STACK,
    converged,
)


@pytest.fixture(params=sorted(STACK))
def host(request: pytest.FixtureRequest, lab: LabHosts):  # type: ignore[no-untyped-def]
    converged(lab)
    h = lab.testinfra(request.param)
    h.lab_name = request.param
    return h


@pytest.mark.parametrize(
    ("package", "version"),
    [
        ("nvidia-driver-580-open", DRIVER_VERSION),
        ("nvidia-persistenced", DRIVER_VERSION),
        ("nvidia-gds", GDS_VERSION),
        ("nvidia-fs", NVIDIA_FS_VERSION),
        ("nvidia-fs-dkms", NVIDIA_FS_VERSION),
        ("nfs-common", "1:2.6.2-4+deb12u1"),
    ],
)
def test_pinned_packages_are_installed(host, package: str, version: str) -> None:  # type: ignore[no-untyped-def]
    pkg = host.package(package)
    assert pkg.is_installed, package
    assert pkg.version == version, f"{package}: {pkg.version} (pinned {version})"


@pytest.mark.parametrize(
    "package",
    ["nvidia-driver-580-open", "nvidia-persistenced", "nvidia-gds", "nvidia-fs", "nvidia-fs-dkms"],
)
def test_driver_and_gds_packages_are_held(host, package: str) -> None:  # type: ignore[no-untyped-def]
    out = host.check_output("dpkg-query -W -f='${Status}' %s", package)
    assert out.startswith("hold "), f"{package}: {out}"


def test_the_proprietary_driver_is_not_installed(host) -> None:  # type: ignore[no-untyped-def]
    assert not host.package("nvidia-driver-580").is_installed
    assert host.check_output("modinfo -F license nvidia") == "Dual MIT/GPL"


def test_doca_ofed_replaced_the_distribution_stack_in_place(host) -> None:  # type: ignore[no-untyped-def]
    assert STACK[host.lab_name] == "doca-ofed"
    assert host.package("doca-ofed").version == DOCA_VERSIONS[host.lab_name]
    # DOCA-OFED's own rdma-core build, not a second stack beside Debian's ...
    rdma_core = host.package("rdma-core")
    assert rdma_core.is_installed and "mlnx" in rdma_core.version
    assert "mlnx" in host.package("ibverbs-utils").version
    # ... and the NFS-RDMA client modules built for its kernel stack.
    assert host.package("mlnx-ofed-kernel-dkms").is_installed
    assert host.package("mlnx-nfsrdma-dkms").is_installed
    assert host.check_output("ofed_info -s").startswith("OFED-internal-")


def test_nvidia_fs_has_peerdirect(host) -> None:  # type: ignore[no-untyped-def]
    # The nvidia-fs-dkms double's postinst records, like the real build, whether the OFED kernel
    # stack was installed before it; the nvidia_fs role asserted it from the loaded module's stats.
    stats = host.file("/var/lib/kvops-test-doubles/proc/driver/nvidia-fs/stats")
    assert "Mellanox PeerDirect Supported: True" in stats.content_string
