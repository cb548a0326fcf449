"""`gdscheck -p` output → per-filesystem GDS modes, platform facts and effective cuFile config.

Two formats exist: GDS <= ~1.15 prints `NFS : Supported|Unsupported`; GDS >= 1.16 prints the
modes a filesystem can use, e.g. `NFS : nvfs, compat` or `NFS : compat` (compat only = no real
GDS). Both become a lower-case list (`["supported"]`, `["nvfs", "compat"]`) so checks ask one
question: is there a mode other than compat/unsupported.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from kvops.parse._common import capped_lines, looks_like_prompt, to_int

SECTIONS = {
    "ENVIRONMENT": "environment",
    "DRIVER CONFIGURATION": "drivers",
    "CUFILE CONFIGURATION": "cufile",
    "GPU INFO": "gpus",
    "PLATFORM INFO": "platform",
}
# Modes that move data GPU<->storage without a CPU bounce buffer.
DIRECT_MODES = frozenset({"supported", "nvfs", "p2pdma", "dmabuf", "c2c"})

_GPU = re.compile(
    r"GPU index (?P<index>\d+) (?P<name>.+?) bar:(?P<bar>\d+) bar size \(MiB\):\s*(?P<size>\d+)"
    r"(?P<rest>.*)"
)


@dataclass
class GdsCheckReport:
    gds_release_version: str | None = None
    nvidia_fs_version: str | None = None
    libcufile_version: str | None = None
    nvidia_fs_minimum_version: str | None = None
    arch: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    drivers: dict[str, list[str]] = field(default_factory=dict)
    driver_properties: dict[str, str] = field(default_factory=dict)
    cufile: dict[str, str] = field(default_factory=dict)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    platform: dict[str, str] = field(default_factory=dict)
    platform_verification: bool | None = None
    messages: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def modes(self, filesystem: str) -> list[str] | None:
        """Modes of a filesystem by gdscheck's name (case-insensitive), None if not listed."""
        for name, modes in self.drivers.items():
            if name.lower() == filesystem.lower():
                return modes
        return None

    def direct_modes(self, filesystem: str) -> list[str]:
        return [m for m in self.modes(filesystem) or [] if m in DIRECT_MODES]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _split_key_value(line: str) -> tuple[str, str] | None:
    if ":" not in line:
        return None
    key, _, value = line.partition(":")
    return key.strip(), value.strip()


def _header(report: GdsCheckReport, line: str) -> bool:
    if m := re.match(r"GDS release version:\s*(\S+)", line):
        report.gds_release_version = m.group(1)
        return True
    if m := re.match(r"nvidia_fs version:\s*(\S+)", line):
        report.nvidia_fs_version = m.group(1)
        if lib := re.search(r"libcufile version:\s*(\S+)", line):
            report.libcufile_version = lib.group(1)
        if minimum := re.search(r"nvidia_fs minimum version:\s*(\S+)", line):
            report.nvidia_fs_minimum_version = minimum.group(1)
        return True
    if m := re.match(r"Platform:\s*(\S+)$", line):
        report.arch = m.group(1)
        return True
    return False


def _gpu(report: GdsCheckReport, line: str) -> None:
    m = _GPU.match(line)
    if not m:
        report.warnings.append(f"unrecognised GPU INFO line: {line[:120]}")
        return
    rest = m.group("rest")
    iommu = re.search(r"IOMMU State:\s*(\w+)", rest)
    report.gpus.append(
        {
            "index": int(m.group("index")),
            "name": m.group("name").strip(),
            "bar_index": int(m.group("bar")),
            "bar_size_mib": int(m.group("size")),
            "supports_gds": "supports GDS" in rest,
            "iommu_state": iommu.group(1) if iommu else None,
        }
    )


# Driver lines gdscheck prints under DRIVER CONFIGURATION (GDS 1.0 … 1.16 docs).
KNOWN_DRIVERS = frozenset(
    {"NVMe", "NVMeOF", "SCSI", "ScaleFlux CSD", "NVMesh", "DDN EXAScaler", "IBM Spectrum Scale",
     "NFS", "BeeGFS", "ScaTeFS", "VIRTIOFS", "WekaFS", "Userspace RDMA", "Lustre"}
)  # fmt: skip


def _unsectioned(report: GdsCheckReport, line: str) -> bool:
    """A line outside any section banner, placed by its shape (older output, or a copy that
    lost its banners): driver, driver property, GPU, platform lines. False: not recognised."""
    if line.startswith("Platform verification"):
        report.platform_verification = "succeeded" in line.lower()
        report.platform["verification"] = line
        return True
    if _GPU.match(line):
        _gpu(report, line)
        return True
    pair = _split_key_value(line)
    if pair is None:
        return False
    key, value = pair
    if key.startswith("--"):
        report.driver_properties[key.lstrip("-").strip()] = value
        return True
    if key in KNOWN_DRIVERS:
        report.drivers[key] = [m.strip().lower() for m in value.split(",") if m.strip()]
        return True
    if key in ("IOMMU", "Nvidia Driver Info Status", "Cuda Driver Version Installed"):
        report.platform[key] = value
        return True
    return False


def _have(report: GdsCheckReport, section: str) -> bool:
    if section == "drivers":
        return bool(report.drivers)
    return report.platform_verification is not None or bool(report.platform)


def parse_gdscheck(text: str) -> GdsCheckReport:
    """Parse `gdscheck -p`. Never raises; missing sections (truncated output) become warnings."""
    report = GdsCheckReport()
    section: str | None = None
    seen: set[str] = set()
    unsectioned = 0
    for raw in capped_lines(text):
        line = raw.strip()
        if not line or set(line) == {"="} or looks_like_prompt(raw):
            continue
        if line.endswith(":") and line[:-1] in SECTIONS:
            section = SECTIONS[line[:-1]]
            seen.add(section)
            continue
        if line.lower().startswith(("warn:", "error:")):
            report.messages.append(line)
            continue
        if section is None:
            if not _header(report, line):
                if _unsectioned(report, line):
                    unsectioned += 1
                else:
                    report.messages.append(line)
            continue
        if section == "gpus":
            _gpu(report, line)
            continue
        if section == "platform" and line.startswith("Platform verification"):
            report.platform_verification = "succeeded" in line.lower()
            report.platform["verification"] = line
            continue
        pair = _split_key_value(line)
        if pair is None:
            report.warnings.append(f"unrecognised {section} line: {line[:120]}")
            continue
        key, value = pair
        if section == "drivers":
            if key.startswith("--"):
                report.driver_properties[key.lstrip("-").strip()] = value
            else:
                report.drivers[key] = [m.strip().lower() for m in value.split(",") if m.strip()]
        elif section == "cufile":
            report.cufile[key] = value
        elif section == "environment":
            report.environment[key] = value
        else:
            report.platform[key] = value
    if unsectioned:
        report.warnings.append(
            f"{unsectioned} line(s) read by their shape, without a section banner "
            "(older gdscheck or a partial copy)"
        )
    for needed in ("drivers", "platform"):
        if needed not in seen and not _have(report, needed):
            report.warnings.append(f"section {needed!r} missing: output truncated or not -p")
    if "platform" in seen and report.platform_verification is None:
        report.warnings.append("no 'Platform verification' line: output truncated?")
    if not report.gds_release_version:
        report.warnings.append("no 'GDS release version' line")
    return report


def rdma_device_status(report: GdsCheckReport) -> tuple[int, int] | None:
    """(up, down) from `--rdma_device_status : Up: N Down: M`, None when absent."""
    value = report.driver_properties.get("rdma_device_status")
    if not value:
        return None
    up = re.search(r"Up:\s*(\d+)", value)
    down = re.search(r"Down:\s*(\d+)", value)
    up_n = to_int(up.group(1)) if up else None
    down_n = to_int(down.group(1)) if down else None
    return (up_n or 0, down_n or 0) if up_n is not None or down_n is not None else None
