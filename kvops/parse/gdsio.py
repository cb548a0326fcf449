"""gdsio result lines → one record per line.

gdsio prints one summary line per job; recorded outputs interleave prompts, warnings and log
noise, so only lines containing `IoType:` are read. A result line cut short (truncated output)
is reported as a warning rather than guessed at.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from kvops.parse._common import to_float, to_int

_FIELDS = {
    "io_type": re.compile(r"IoType:\s*(\w+)"),
    "xfer_type": re.compile(r"XferType:\s*(\w+)"),
    "threads": re.compile(r"Threads:\s*(\d+)"),
    "dataset": re.compile(r"DataSetSize:\s*(\d+)/(\d+)\s*\((KiB|KB)\)"),
    "io_size": re.compile(r"IOSize:\s*([\d-]+)\s*\((KiB|KB)\)"),
    "throughput": re.compile(r"Throughput:\s*(\d+(?:\.\d+)?)\s*(GiB|GB)/sec"),
    "latency": re.compile(r"Avg_Latency:\s*(\d+(?:\.\d+)?)\s*usecs"),
    "ops": re.compile(r"ops:\s*(\d+)"),
    "total_time": re.compile(r"total_time\s*(\d+(?:\.\d+)?)\s*(secs|usecs)"),
}
GPU_DIRECT_XFER_TYPES = frozenset({"GPUD", "GPU_DIRECT", "GPU_DIRECT_ASYNC", "GPU_BATCH"})


@dataclass
class GdsioResult:
    io_type: str
    xfer_type: str
    threads: int | None
    throughput_gib_s: float
    avg_latency_us: float | None
    io_size_kib: int | None
    io_size_text: str | None
    dataset_done_kib: int | None
    dataset_total_kib: int | None
    ops: int | None
    total_time_s: float | None
    line: int

    @property
    def gpu_direct(self) -> bool:
        return self.xfer_type.upper() in GPU_DIRECT_XFER_TYPES

    @property
    def is_read(self) -> bool:
        return "READ" in self.io_type.upper()


@dataclass
class GdsioOutput:
    results: list[GdsioResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"results": [asdict(r) for r in self.results], "warnings": list(self.warnings)}


def _result(line: str, number: int, warnings: list[str]) -> GdsioResult | None:
    found = {name: rx.search(line) for name, rx in _FIELDS.items()}
    io_type, xfer, tput = found["io_type"], found["xfer_type"], found["throughput"]
    if io_type is None or xfer is None or tput is None:
        warnings.append(f"line {number}: incomplete gdsio result line skipped: {line[:120]}")
        return None
    if tput.group(2) == "GB":
        warnings.append(f"line {number}: old gdsio 'GB/sec' unit taken as GiB/s")
    dataset, io_size = found["dataset"], found["io_size"]
    latency, ops, total = found["latency"], found["ops"], found["total_time"]
    total_time_s = to_float(total.group(1)) if total else None
    if total and total_time_s is not None and total.group(2) == "usecs":
        total_time_s /= 1e6
    threads = found["threads"]
    return GdsioResult(
        io_type=io_type.group(1).upper(),
        xfer_type=xfer.group(1).upper(),
        threads=to_int(threads.group(1)) if threads else None,
        throughput_gib_s=float(tput.group(1)),
        avg_latency_us=to_float(latency.group(1)) if latency else None,
        io_size_kib=to_int(io_size.group(1)) if io_size else None,
        io_size_text=io_size.group(1) if io_size else None,
        dataset_done_kib=to_int(dataset.group(1)) if dataset else None,
        dataset_total_kib=to_int(dataset.group(2)) if dataset else None,
        ops=to_int(ops.group(1)) if ops else None,
        total_time_s=total_time_s,
        line=number,
    )


def parse_gdsio(text: str) -> GdsioOutput:
    """Parse every `IoType:` line; other lines are noise. Never raises."""
    out = GdsioOutput()
    for number, line in enumerate(text.splitlines(), start=1):
        if "IoType:" not in line:
            continue
        result = _result(line, number, out.warnings)
        if result is not None:
            out.results.append(result)
    return out
