"""The roles' per-platform variables, rendered with Ansible's own templar for each supported
platform. The lab runs Debian only, so this is where the Ubuntu and RHEL 9 branches (repository
URLs, package names, initramfs tool) are checked at all: a typo there would otherwise surface
only on a customer's first RHEL run."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from role_files import role_vars_file

ROLES = Path(__file__).resolve().parents[2] / "roles"

PLATFORMS: dict[str, dict[str, str]] = {
    "ubuntu-22.04-x86_64": {
        "distribution": "Ubuntu",
        "distribution_version": "22.04",
        "distribution_major_version": "22",
        "os_family": "Debian",
        "architecture": "x86_64",
    },
    "ubuntu-24.04-aarch64": {
        "distribution": "Ubuntu",
        "distribution_version": "24.04",
        "distribution_major_version": "24",
        "os_family": "Debian",
        "architecture": "aarch64",
    },
    "rhel-9.4-x86_64": {
        "distribution": "RedHat",
        "distribution_version": "9.4",
        "distribution_major_version": "9",
        "os_family": "RedHat",
        "architecture": "x86_64",
    },
    "rocky-9.5-x86_64": {
        "distribution": "Rocky",
        "distribution_version": "9.5",
        "distribution_major_version": "9",
        "os_family": "RedHat",
        "architecture": "x86_64",
    },
}


def _os_vars_files(role: str, facts: dict[str, str]) -> list[Path]:
    """What the role's first_found picks: distribution, then OS family (none for a role
    without per-OS variables)."""
    for name in (facts["distribution"], facts["os_family"]):
        path = ROLES / role / "vars" / f"{name}.yml"
        if path.is_file():
            return [path]
    return []


def _render(
    role: str, platform: str, expr: str, facts_extra: dict[str, Any] | None = None, **role_vars: Any
) -> Any:
    facts = {**PLATFORMS[platform], **(facts_extra or {})}
    variables: dict[str, Any] = {}
    for path in (
        ROLES / role / "defaults" / "main.yml",
        ROLES / role / "vars" / "main.yml",
        *_os_vars_files(role, facts),
    ):
        variables.update(role_vars_file(path))
    variables.update(role_vars, ansible_facts=facts)
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(trust_as_template("{{ " + expr + " }}"))


@pytest.mark.parametrize("role", ["nvidia_driver", "rdma_client", "nfs_rdma_mount"])
def test_every_platform_file_defines_the_same_variables(role: str) -> None:
    files = sorted((ROLES / role / "vars").glob("*.yml"))
    keys = {p.name: set(yaml.safe_load(p.read_text())) for p in files if p.name != "main.yml"}
    assert len(keys) >= 2, keys
    first = next(iter(keys.values()))
    assert all(k == first for k in keys.values()), keys


@pytest.mark.parametrize(
    ("platform", "repo_url", "key_file"),
    [
        ("ubuntu-22.04-x86_64", "repos/ubuntu2204/x86_64/", "3bf863cc.pub"),
        ("ubuntu-24.04-aarch64", "repos/ubuntu2404/sbsa/", "3bf863cc.pub"),
        ("rhel-9.4-x86_64", "repos/rhel9/x86_64/", "D42D0685.pub"),
        ("rocky-9.5-x86_64", "repos/rhel9/x86_64/", "D42D0685.pub"),
    ],
)
def test_cuda_repository_and_key_per_platform(platform: str, repo_url: str, key_file: str) -> None:
    base = "https://developer.download.nvidia.com/compute/cuda/"
    assert _render("nvidia_driver", platform, "_nvidia_driver_cuda_repo_url") == base + repo_url
    key = _render("nvidia_driver", platform, "_nvidia_driver_cuda_repo_key_url")
    assert key == base + repo_url + key_file


@pytest.mark.parametrize(
    ("platform", "open_packages", "closed_packages"),
    [
        ("ubuntu-22.04-x86_64", ["nvidia-driver-580-open"], ["nvidia-driver-580"]),
        ("rhel-9.4-x86_64", ["@nvidia-driver:580-open"], ["@nvidia-driver:580-dkms"]),
    ],
)
def test_driver_packages_follow_the_kernel_module_flavour(
    platform: str, open_packages: list[str], closed_packages: list[str]
) -> None:
    for is_open, want in ((True, open_packages), (False, closed_packages)):
        got = _render(
            "nvidia_driver",
            platform,
            "_nvidia_driver_packages",
            nvidia_driver_branch="580",
            nvidia_driver_open=is_open,
            nvidia_driver_persistenced=False,
        )
        assert list(got) == want


# The DOCA repository's signing key per package manager. apt: the "NVIDIA DOCA Host" key that
# signs every DOCA apt repository since January 2026, served as the binary doca_keyring.gpg in the
# repository directory (Azure/AgentBaker#9394 checked the live InRelease signature against this
# fingerprint); before, apt hosts fetched GPG-KEY-Mellanox.pub, which lacks it (NO_PUBKEY). dnf:
# rpm_key reads armored keys only, and GPG-KEY-Mellanox.pub's fingerprint is unpublished.
DOCA_APT_KEY = ("doca_keyring.gpg", "70454E6BF5D9C2D3B78709E8DC726C5E41B9CC50")
DOCA_DNF_KEY = ("https://linux.mellanox.com/public/repo/doca/GPG-KEY-Mellanox.pub", "")


@pytest.mark.parametrize(
    ("platform", "doca_path", "doca_key", "rdma_core", "doca", "initramfs"),
    [
        (
            "ubuntu-22.04-x86_64",
            "ubuntu22.04/x86_64/",
            DOCA_APT_KEY,
            ["rdma-core", "ibverbs-utils"],
            ["doca-ofed", "mlnx-nfsrdma-dkms"],
            ["update-initramfs", "-u", "-k", "all"],
        ),
        ("ubuntu-24.04-aarch64", "ubuntu24.04/arm64-sbsa/", DOCA_APT_KEY, None, None, None),
        (
            "rhel-9.4-x86_64",
            "rhel9.4/x86_64/",
            DOCA_DNF_KEY,
            ["rdma-core", "libibverbs-utils"],
            ["doca-ofed", "kmod-mlnx-nfsrdma"],
            ["dracut", "--force"],
        ),
    ],
)
def test_rdma_stack_repository_packages_and_initramfs_per_platform(
    platform: str,
    doca_path: str,
    doca_key: tuple[str, str],
    rdma_core: list[str] | None,
    doca: list[str] | None,
    initramfs: list[str] | None,
) -> None:
    url = _render(
        "rdma_client", platform, "_rdma_client_doca_repo_url", rdma_client_doca_version="3.1.0"
    )
    assert url.strip() == f"https://linux.mellanox.com/public/repo/doca/3.1.0/{doca_path}"
    key_url, pin = (
        str(_render("rdma_client", platform, f"{var} | trim", rdma_client_doca_version="3.1.0"))
        for var in ("rdma_client_doca_repo_key_url", "rdma_client_doca_repo_key_fingerprint")
    )
    # The apt key sits in the repository directory: doca_key names the file there.
    assert (key_url.removeprefix(url.strip()), pin) == doca_key
    if rdma_core is not None:
        got = _render(
            "rdma_client", platform, "_rdma_client_packages", rdma_client_stack="rdma-core"
        )
        assert list(got) == rdma_core
        got = _render(
            "rdma_client", platform, "_rdma_client_packages", rdma_client_stack="doca-ofed"
        )
        # DOCA-OFED with its NFS-RDMA client modules: the in-box rpcrdma does not load under it.
        assert list(got) == doca
    if initramfs is not None:
        assert list(_render("rdma_client", platform, "_rdma_client_initramfs_command")) == initramfs


@pytest.mark.parametrize(
    ("platform", "packages"),
    [("ubuntu-22.04-x86_64", ["nfs-common"]), ("rhel-9.4-x86_64", ["nfs-utils"])],
)
def test_nfs_client_package_per_platform(platform: str, packages: list[str]) -> None:
    got = _render("nfs_rdma_mount", platform, "_nfs_rdma_mount_client_packages")
    assert list(got) == packages


def test_the_default_rdma_stack_is_doca_ofed_and_pins_follow_the_stack() -> None:
    """GDS over NFS needs DOCA-OFED: it is the default; rdma-core's pin covers its packages."""
    platform = "ubuntu-22.04-x86_64"
    assert _render("rdma_client", platform, "rdma_client_stack") == "doca-ofed"
    doca = _render(
        "rdma_client", platform, "_rdma_client_install_names", _rdma_client_pin="=3.1.0-1"
    )
    assert list(doca) == ["doca-ofed=3.1.0-1", "mlnx-nfsrdma-dkms"]
    distro = _render(
        "rdma_client",
        platform,
        "_rdma_client_install_names",
        rdma_client_stack="rdma-core",
        _rdma_client_pin="=44.0-2",
    )
    assert list(distro) == ["rdma-core=44.0-2", "ibverbs-utils=44.0-2"]


@pytest.mark.parametrize(
    ("stack", "installed", "conflicting"),
    [
        # DOCA-OFED replaces the distribution's rdma-core in place: no conflict.
        ("doca-ofed", ["rdma-core", "ibverbs-utils"], []),
        ("doca-ofed", ["doca-ofed", "mlnx-ofed-kernel-dkms", "rdma-core"], []),
        # MLNX_OFED's metapackages under DOCA-OFED: refused.
        ("doca-ofed", ["mlnx-ofed-basic", "mlnx-ofed-kernel-dkms"], ["mlnx-ofed-basic"]),
        ("rdma-core", ["rdma-core"], []),
        (
            "rdma-core",
            ["doca-ofed", "mlnx-ofed-kernel-dkms"],
            ["doca-ofed", "mlnx-ofed-kernel-dkms"],
        ),
    ],
)
def test_only_mlnx_ofed_and_doca_mixes_are_refused(
    stack: str, installed: list[str], conflicting: list[str]
) -> None:
    got = _render(
        "rdma_client",
        "ubuntu-22.04-x86_64",
        "_rdma_client_other_stack_found",
        facts_extra={"packages": {p: [{}] for p in installed}},
        rdma_client_stack=stack,
    )
    assert sorted(got) == conflicting


@pytest.mark.parametrize(
    ("package", "proprietary"),
    [
        ("nvidia-driver-580", True),
        ("nvidia-driver-580-server", True),
        ("nvidia-dkms-580", True),
        ("nvidia-dkms-580-server", True),
        ("nvidia-kernel-source-580", True),
        ("linux-modules-nvidia-580-generic", True),
        ("linux-modules-nvidia-580-server-6.8.0-45-generic", True),
        ("kmod-nvidia-latest-dkms", True),
        # Ubuntu's signed precompiled OPEN modules and the open packages are what GDS needs.
        ("linux-modules-nvidia-580-open-generic", False),
        ("linux-modules-nvidia-580-server-open-6.8.0-45-generic", False),
        ("nvidia-driver-580-open", False),
        ("nvidia-driver-580-server-open", False),
        ("nvidia-dkms-580-open", False),
        ("nvidia-persistenced", False),
    ],
)
def test_the_proprietary_package_pattern(package: str, proprietary: bool) -> None:
    regex = _render(
        "nvidia_driver", "ubuntu-22.04-x86_64", "_nvidia_driver_proprietary_package_regex"
    )
    assert (re.match(regex.strip(), package) is not None) is proprietary


@pytest.mark.parametrize(
    ("platform", "build", "prerequisites"),
    [
        ("ubuntu-22.04-x86_64", ["linux-headers-6.8.0-45-generic"], []),
        ("ubuntu-24.04-aarch64", ["linux-headers-6.8.0-45-generic"], []),
        (
            "rhel-9.4-x86_64",
            ["kernel-devel-6.8.0-45-generic", "dkms"],
            ["python3-dnf-plugin-versionlock", "dnf-plugins-core"],
        ),
    ],
)
def test_dkms_gets_the_running_kernels_build_files_and_the_repo_tools_are_there(
    platform: str, build: list[str], prerequisites: list[str]
) -> None:
    """DKMS builds for the running kernel: its headers/kernel-devel are named explicitly (with
    install_recommends false nothing pulls them); the apt repository needs nothing extra, dnf
    versionlock its plugin."""
    running = {"kernel": "6.8.0-45-generic"}
    got = _render(
        "nvidia_driver", platform, "_nvidia_driver_kernel_build_packages", facts_extra=running
    )
    assert list(got) == build
    assert list(_render("nvidia_driver", platform, "_nvidia_driver_repo_prerequisites")) == (
        prerequisites
    )


def test_rhel_locks_the_open_driver_packages_by_name() -> None:
    names = _render("nvidia_driver", "rhel-9.4-x86_64", "_nvidia_driver_lock_names")
    assert "kmod-nvidia-open-dkms" in names and "nvidia-persistenced" in names
    closed = _render(
        "nvidia_driver", "rhel-9.4-x86_64", "_nvidia_driver_lock_names", nvidia_driver_open=False
    )
    assert "kmod-nvidia-latest-dkms" in closed


@pytest.mark.parametrize(
    ("iommu", "extra", "args"),
    [
        ("", [], []),
        ("pt", [], ["iommu=pt"]),
        (
            "off",
            ["pci=disable_acs_redir=pci:0:0"],
            ["intel_iommu=off", "amd_iommu=off", "pci=disable_acs_redir=pci:0:0"],
        ),
    ],
)
def test_the_gds_kernel_arguments_are_opt_in(iommu: str, extra: list[str], args: list[str]) -> None:
    got = _render(
        "kernel_gate",
        "ubuntu-22.04-x86_64",
        "_kernel_gate_cmdline_args",
        kernel_gate_iommu=iommu,
        kernel_gate_cmdline_extra=extra,
    )
    assert list(got) == args


def test_a_running_kernel_without_the_arguments_needs_the_gates_reboot() -> None:
    def missing(cmdline: str) -> list[str]:
        content = base64.b64encode(cmdline.encode()).decode()
        return list(
            _render(
                "kernel_gate",
                "rhel-9.4-x86_64",
                "_kernel_gate_cmdline_missing",
                kernel_gate_iommu="pt",
                _kernel_gate_cmdline={"content": content},
            )
        )

    assert missing("BOOT_IMAGE=/vmlinuz ro quiet\n") == ["iommu=pt"]
    assert missing("BOOT_IMAGE=/vmlinuz ro iommu=pt quiet\n") == []


def _nvswitch_entries(*addresses: str) -> dict[str, Any]:
    """What ``find`` returns for /proc/driver/nvidia-nvswitch/devices: one entry per NVSwitch."""
    devices = "/proc/driver/nvidia-nvswitch/devices"
    return {"files": [{"path": f"{devices}/{a}"} for a in addresses]}


_DETECTABLE = {
    "nvidia_driver_state": "present",
    "nvidia_driver_kernel_steps": True,
    "_nvidia_driver_install_previewed": False,
}


@pytest.mark.parametrize(
    ("setting", "entries", "switches", "wanted"),
    [
        # An HGX H100 baseboard: the driver lists its NVSwitches by PCI address.
        ("auto", _nvswitch_entries("0000:06:00.0", "0000:05:00.0"),
         ["0000:05:00.0", "0000:06:00.0"], True),
        ("auto", _nvswitch_entries(), [], False),  # a PCIe GPU server: the list is empty
        ("auto", {"skipped": True}, [], False),  # no list at all (no directory)
        ("never", _nvswitch_entries("0000:05:00.0"), ["0000:05:00.0"], False),
        ("always", {"skipped": True}, [], True),
    ],
)  # fmt: skip
def test_fabric_manager_only_where_the_driver_lists_nvswitches(
    setting: str, entries: dict[str, Any], switches: list[str], wanted: bool
) -> None:
    common = {
        **_DETECTABLE,
        "nvidia_driver_fabricmanager": setting,
        "_nvidia_driver_nvswitch_entries": entries,
    }
    got = _render("nvidia_driver", "ubuntu-22.04-x86_64", "_nvidia_driver_nvswitches", **common)
    assert list(got) == switches
    expr = "_nvidia_driver_fabricmanager_wanted"
    assert _render("nvidia_driver", "ubuntu-22.04-x86_64", expr, **common) is wanted


@pytest.mark.parametrize(
    ("changes", "detect"),
    [
        ({}, True),
        ({"kernel_gate_pending": True}, False),  # the new driver is not loaded before the reboot
        ({"_nvidia_driver_install_previewed": True}, False),  # --check installed nothing
        ({"nvidia_driver_kernel_steps": False}, False),  # no driver loaded by the role
        ({"nvidia_driver_fabricmanager": "always"}, False),  # nothing to look for
    ],
)
def test_the_nvswitch_list_is_read_only_from_a_loaded_driver(
    changes: dict[str, Any], detect: bool
) -> None:
    variables = {**_DETECTABLE, "nvidia_driver_fabricmanager": "auto", **changes}
    got = _render(
        "nvidia_driver", "ubuntu-22.04-x86_64", "_nvidia_driver_nvswitch_detect", **variables
    )
    assert got is detect
    path = _render("nvidia_driver", "rhel-9.4-x86_64", "_nvidia_driver_nvswitch_dir", **variables)
    assert path == "/proc/driver/nvidia-nvswitch/devices"


@pytest.mark.parametrize(
    ("platform", "version", "package"),
    [
        ("ubuntu-22.04-x86_64", "", "nvidia-fabricmanager-580"),
        # Fabric Manager starts only against the driver of its own version: pinned alike.
        (
            "ubuntu-24.04-aarch64",
            "580.82.07-0ubuntu1",
            "nvidia-fabricmanager-580=580.82.07-0ubuntu1",
        ),
        ("rhel-9.4-x86_64", "", "nvidia-fabric-manager"),
    ],
)
def test_fabric_manager_package_follows_the_driver_branch(
    platform: str, version: str, package: str
) -> None:
    got = _render(
        "nvidia_driver",
        platform,
        "_nvidia_driver_fabricmanager_install_name | trim",
        nvidia_driver_branch="580",
        nvidia_driver_version=version,
    )
    assert got == package
