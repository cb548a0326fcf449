"""testinfra after site.yml: packages, pinned versions, holds, one RDMA stack, install order."""

from __future__ import annotations

import pytest
from lab_harness import LabHosts
from site_lab import (
    DOCA_VERSION,
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


def test_exactly_one_rdma_stack(host) -> None:  # type: ignore[no-untyped-def]
    installed = {
        p for p in ("rdma-core", "ibverbs-utils", "doca-ofed") if host.package(p).is_installed
    }
    if STACK[host.lab_name] == "doca-ofed":
        assert installed == {"doca-ofed"}
        assert host.package("doca-ofed").version == DOCA_VERSION
    else:
        assert installed == {"rdma-core", "ibverbs-utils"}


def test_nvidia_fs_was_built_after_the_rdma_stack(host) -> None:  # type: ignore[no-untyped-def]
    # The nvidia-fs-dkms double's postinst records, like the real build, whether an RDMA stack
    # was installed before it: PeerDirect support depends on that order.
    stats = host.file("/var/lib/kvops-test-doubles/evidence/nvidia-fs-stats")
    assert stats.exists
    assert "Mellanox PeerDirect Supported: True" in stats.content_string
