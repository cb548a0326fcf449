"""PCIe Access Control Services state from `lspci -vvv` (device headers and ACS lines).

An ACS-capable bridge with Request or Completion Redirect enabled sends peer-to-peer TLPs up
to the root complex instead of across the switch: GPU↔NIC DMA under one PCIe switch then
crosses the CPU, or fails (NVIDIA GDS Troubleshooting Guide, "PCIe ACS"; kernel parameter
`pci=disable_acs_redir=`, https://docs.kernel.org/admin-guide/kernel-parameters.html).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvops.parse._common import capped_lines

_HEADER = re.compile(r"^([0-9a-fA-F]{2,4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\s+(.*)$")
_FLAG = re.compile(r"(?<!\w)(\w+)([+-])")  # from a word's start only: linear time
REDIRECT_FLAGS = ("ReqRedir", "CmpltRedir")


@dataclass
class AcsDevice:
    address: str
    name: str
    control: dict[str, bool]

    @property
    def redirects(self) -> list[str]:
        return [f for f in REDIRECT_FLAGS if self.control.get(f)]


@dataclass
class AcsReport:
    devices: list[AcsDevice] = field(default_factory=list)
    device_count: int = 0
    access_denied: bool = False

    @property
    def redirecting(self) -> list[AcsDevice]:
        return [d for d in self.devices if d.redirects]


def parse_acs(text: str) -> AcsReport:
    """Every device with an `ACSCtl:` line; counts all device headers seen."""
    report = AcsReport()
    current: tuple[str, str] | None = None
    for line in capped_lines(text):
        header = _HEADER.match(line)
        if header:
            report.device_count += 1
            address = line.split()[0]
            current = (address, header.group(2).strip())
            continue
        if "<access denied>" in line:
            report.access_denied = True
        if "ACSCtl:" in line and current is not None:
            flags = {name: sign == "+" for name, sign in _FLAG.findall(line.split("ACSCtl:", 1)[1])}
            report.devices.append(AcsDevice(current[0], current[1], flags))
    return report
