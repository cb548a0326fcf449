"""`nvidia-smi topo -mp` → GPUs, NICs (named through the `NIC Legend`), the PCIe link type of
every pair, and each GPU's CPU/NUMA affinity.

Why: GDS moves data by peer-to-peer DMA between the NIC and GPU memory. When both sit under
the same PCIe switch (PIX, PXB) the transfer stays in the switch; through a host bridge (PHB),
between host bridges (NODE) or across the CPU interconnect between NUMA nodes (SYS) it goes
through the CPU complex and throughput drops, which no other evidence shows.

The output is tab-separated: a header row of device names then `CPU Affinity`, `NUMA Affinity`
(and on newer drivers `GPU NUMA ID`), one row per device with `X` on the diagonal, then a
`Legend:` and, since the NIC columns are named `NIC0..NICn`, a `NIC Legend:` mapping them to
RDMA device names (`NIC0: mlx5_0`). Older drivers name the NIC columns `mlx5_0` directly. GPU
rows carry one more field than the header announces (an empty one before `GPU NUMA ID`), so
affinity values are taken as the non-empty fields after the links, in header order.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from kvops.parse._common import capped_lines, clip, clip_repr, looks_like_prompt

# Ranked best first. SOC is the pre-2016 name of SYS.
PCIE_LINK_RANK = {"PIX": 0, "PXB": 1, "PHB": 2, "NODE": 3, "SYS": 4, "SOC": 4}
_NVLINK = re.compile(r"^NV\d+$")
_DEVICE = re.compile(r"^[A-Za-z][\w.:-]*\d$")  # GPU0, NIC12, mlx5_0, mlx5_bond_0
_TRAILING = re.compile(r"\b(?:CPU Affinity|NUMA Affinity|GPU NUMA ID)\b")
# A tab, or two or more whitespace from where a run starts (from inside a run `\s{2,}` would
# rescan it at every position: quadratic time on a long run of spaces).
_COLUMN_GAP = re.compile(r"\t|(?<!\s)\s{2,}")
_LEGEND_ENTRY = re.compile(r"^(?P<nic>NIC\d+)\s*:\s*(?P<name>\S+)$")
_NA = {"N/A", "[N/A]"}


def _snake(name: str) -> str:
    return re.sub(r"\W+", "_", name.strip()).strip("_").lower()


def link_rank(label: str | None) -> int | None:
    """0 (PIX, best) .. 4 (SYS); None for X, NVLink (NV#) or anything not a PCIe path."""
    return PCIE_LINK_RANK.get(label or "")


@dataclass
class TopoMatrix:
    devices: list[str] = field(default_factory=list)  # column order of the header
    links: dict[str, dict[str, str]] = field(default_factory=dict)  # row → column → label
    nic_names: dict[str, str] = field(default_factory=dict)  # NIC0 → mlx5_0 (NIC Legend)
    affinity: dict[str, dict[str, str | None]] = field(default_factory=dict)  # GPU0 → {...}
    warnings: list[str] = field(default_factory=list)

    @property
    def gpus(self) -> list[str]:
        return [d for d in self.devices if d.startswith("GPU")]

    @property
    def nics(self) -> list[str]:
        return [d for d in self.devices if not d.startswith("GPU")]

    def nic_name(self, nic: str) -> str:
        """The RDMA device name of a NIC column (`NIC1` → `mlx5_1`); the column name when the
        legend does not say (older drivers name columns `mlx5_1` themselves)."""
        return self.nic_names.get(nic, nic)

    def link(self, a: str, b: str) -> str | None:
        """Link label between two devices, from either row (the matrix is symmetric)."""
        return self.links.get(a, {}).get(b) or self.links.get(b, {}).get(a)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["gpus"], out["nics"] = self.gpus, self.nics
        return out


def _header(line: str) -> tuple[list[str], list[str]] | None:
    """(device columns, trailing column names) when `line` is the matrix header."""
    cut = _TRAILING.search(line)
    left, right = (line[: cut.start()], line[cut.start() :]) if cut else (line, "")
    devices = left.split()
    if not devices or not all(_DEVICE.match(d) for d in devices):
        return None
    trailing = [t.strip() for t in _COLUMN_GAP.split(right) if t.strip()]
    return devices, trailing


def _row(topo: TopoMatrix, trailing: list[str], tokens: list[str], number: int) -> None:
    label, values = tokens[0], tokens[1:]
    n = len(topo.devices)
    links = dict(zip(topo.devices, values[:n], strict=False))
    for column, value in links.items():
        if value != "X" and link_rank(value) is None and not _NVLINK.match(value):
            shown = f"{clip_repr(value)} ({clip(label)}-{clip(column)})"
            topo.warnings.append(f"line {number}: unknown link type {shown}")
    topo.links[label] = links
    if len(values) < n:
        topo.warnings.append(f"line {number}: {label} has {len(values)} of {n} links (truncated?)")
        return
    extra = values[n:]
    if extra or label.startswith("GPU"):
        named = dict(zip(trailing, extra, strict=False))
        topo.affinity[label] = {
            _snake(name): (None if named.get(name) in _NA else named.get(name)) for name in trailing
        }
        if len(extra) > len(trailing):
            topo.warnings.append(f"line {number}: {label} has more fields than the header")


def parse_topo(text: str) -> TopoMatrix:
    """Parse `nvidia-smi topo -mp` (or `-m`). Never raises: missing rows, an unknown link
    label or a missing NIC Legend become warnings next to what could be read."""
    topo = TopoMatrix()
    trailing: list[str] = []
    section = "before"  # before → matrix → legend → nic_legend
    for number, raw in enumerate(capped_lines(text), start=1):
        line = raw.strip()
        if not line or looks_like_prompt(raw):
            continue
        if line in {"Legend:", "NIC Legend:"}:
            section = "nic_legend" if line == "NIC Legend:" else "legend"
            continue
        if section == "before":
            header = _header(raw)
            if header is None:
                topo.warnings.append(f"line {number}: not a topology header: {line[:120]}")
                continue
            topo.devices, trailing = header
            section = "matrix"
        elif section == "matrix":
            tokens = line.split()
            if tokens[0] in topo.devices:
                _row(topo, trailing, tokens, number)
            else:
                topo.warnings.append(f"line {number}: not a matrix row: {line[:120]}")
        elif section == "nic_legend":
            if m := _LEGEND_ENTRY.match(line):
                topo.nic_names[m.group("nic")] = m.group("name")
            else:
                topo.warnings.append(f"line {number}: not a NIC Legend entry: {line[:120]}")
    _completeness(topo)
    return topo


def _completeness(topo: TopoMatrix) -> None:
    if not topo.devices:
        topo.warnings.append("no topology matrix header (GPU0 ...): not nvidia-smi topo -m output")
        return
    missing = [d for d in topo.devices if d not in topo.links]
    if missing:
        topo.warnings.append(f"no row for {', '.join(missing)} (output truncated?)")
    unnamed = [n for n in topo.nics if re.fullmatch(r"NIC\d+", n) and n not in topo.nic_names]
    if unnamed:
        topo.warnings.append(
            f"NIC Legend missing {', '.join(unnamed)}: RDMA device names unknown (truncated?)"
        )
