"""`nvidia-smi --query-gpu=... --format=csv` and `/proc/driver/nvidia/version`.

The CSV header carries units (`memory.total [MiB]`); column names are kept without them so
callers ask for `driver_version` whatever units option was used. `[N/A]`/`N/A` become None.
`/proc/driver/nvidia/version` is the one place that says whether the *open* kernel module is
loaded, which nvidia-fs >= 2.17.5 requires.
"""

from __future__ import annotations

import csv
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from kvops.parse._common import capped_lines

_NA = {"[N/A]", "N/A", "[Not Supported]", ""}


@dataclass
class NvidiaSmiCsv:
    gpus: list[dict[str, str | None]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def driver_versions(self) -> list[str]:
        return sorted({v for g in self.gpus if (v := g.get("driver_version"))})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _without_unit(column: str) -> str:
    r"""`memory.total [MiB]` → `memory.total`: from the first `[` when the name ends in `]`.
    Done by hand: `\s*\[.*\]$` took quadratic time on runs of spaces or `[`."""
    column = column.strip()
    if column.endswith("]") and "[" in column:
        return column[: column.index("[")].rstrip()
    return column


_SUFFIXES = ("MiB", "W", "%", "MHz")


def _without_suffix(value: str) -> str:
    """`46068 MiB` → `46068`: a unit after whitespace at the end is dropped."""
    for suffix in _SUFFIXES:
        head = value[: -len(suffix)]
        if value.endswith(suffix) and head[-1:].isspace():
            return head.rstrip()
    return value


def parse_nvidia_smi_csv(text: str, columns: list[str] | None = None) -> NvidiaSmiCsv:
    """Parse CSV; the first row is the header unless `columns` is given (`noheader`)."""
    out = NvidiaSmiCsv()
    rows: list[list[str]] = []
    for number, line in enumerate(capped_lines(text), start=1):
        try:
            rows.extend(r for r in csv.reader([line], skipinitialspace=True) if r)
        except csv.Error as exc:
            out.warnings.append(f"line {number}: not CSV ({exc})")
    if not rows:
        out.warnings.append("empty nvidia-smi output")
        return out
    if columns is None:
        columns = [_without_unit(c) for c in rows[0]]
        rows = rows[1:]
    for number, row in enumerate(rows, start=2):
        if len(row) != len(columns):
            out.warnings.append(f"row {number}: {len(row)} fields, expected {len(columns)}")
            continue
        gpu: dict[str, str | None] = {}
        for name, value in zip(columns, row, strict=True):
            value = value.strip()
            gpu[name] = None if value in _NA else _without_suffix(value)
        out.gpus.append(gpu)
    if not out.gpus:
        out.warnings.append("no GPU rows")
    return out


@dataclass
class NvidiaProcVersion:
    driver_version: str | None
    open_kernel_module: bool | None
    text: str


def parse_nvidia_proc_version(text: str) -> NvidiaProcVersion:
    """`NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build ...`
    (open) or `NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ...` (proprietary)."""
    line = next((ln for ln in capped_lines(text) if ln.startswith("NVRM version")), "")
    if not line:
        return NvidiaProcVersion(None, None, text.strip()[:200])
    version = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", line)
    return NvidiaProcVersion(
        driver_version=version.group(1) if version else None,
        open_kernel_module="Open Kernel Module" in line,
        text=line.strip(),
    )
