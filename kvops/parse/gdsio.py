"""gdsio result lines → one record per line.

gdsio prints one summary line per job; recorded outputs interleave prompts, warnings and log
noise, so only lines containing `IoType:` are read. A result line cut short (truncated output)
is never guessed at: what it had is kept as a `GdsioPartial` that names the fields it lacks
(and a warning, as the gdscheck parser reports missing sections), so a check can say "no
Throughput" instead of judging a number that is not there. A result line wrapped onto the next
line (older docs' copies) is joined first.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from kvops.parse._common import capped_lines, to_float, to_int

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
# gdsio's own label of each field, for naming what a cut line lacks.
LABELS = {
    "io_type": "IoType",
    "xfer_type": "XferType",
    "threads": "Threads",
    "dataset": "DataSetSize",
    "io_size": "IOSize",
    "throughput": "Throughput",
    "latency": "Avg_Latency",
    "ops": "ops",
    "total_time": "total_time",
}


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
class GdsioPartial:
    """A result line cut short: the fields it had (by GdsioResult's names) and gdsio's labels
    of the ones it lacks."""

    line: int
    fields: dict[str, Any]
    missing: list[str]

    @property
    def gpu_direct(self) -> bool:
        return str(self.fields.get("xfer_type", "")).upper() in GPU_DIRECT_XFER_TYPES

    def describe(self) -> str:
        kept = " ".join(f"{k}={v}" for k, v in self.fields.items())
        return f"line {self.line} ({kept or 'nothing readable'}) has no {', '.join(self.missing)}"


@dataclass
class GdsioOutput:
    results: list[GdsioResult] = field(default_factory=list)
    partial: list[GdsioPartial] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "results": [asdict(r) for r in self.results],
            "partial": [asdict(p) for p in self.partial],
            "warnings": list(self.warnings),
        }


def _found(line: str) -> dict[str, re.Match[str] | None]:
    return {name: rx.search(line) for name, rx in _FIELDS.items()}


def _partial(found: dict[str, re.Match[str] | None], number: int) -> GdsioPartial:
    """What a cut line had, typed as in GdsioResult, and the labels of what it lacks."""
    fields: dict[str, Any] = {}
    if (io_type := found["io_type"]) is not None:
        fields["io_type"] = io_type.group(1).upper()
    if (xfer := found["xfer_type"]) is not None:
        fields["xfer_type"] = xfer.group(1).upper()
    if (threads := found["threads"]) is not None:
        fields["threads"] = to_int(threads.group(1))
    if (dataset := found["dataset"]) is not None:
        fields["dataset_done_kib"] = to_int(dataset.group(1))
        fields["dataset_total_kib"] = to_int(dataset.group(2))
    if (io_size := found["io_size"]) is not None:
        fields["io_size_kib"] = to_int(io_size.group(1))
    if (latency := found["latency"]) is not None:
        fields["avg_latency_us"] = to_float(latency.group(1))
    missing = [LABELS[name] for name, match in found.items() if match is None]
    return GdsioPartial(line=number, fields=fields, missing=missing)


def _result(line: str, number: int, out: GdsioOutput) -> GdsioResult | None:
    found = _found(line)
    io_type, xfer, tput = found["io_type"], found["xfer_type"], found["throughput"]
    if io_type is None or xfer is None or tput is None:
        partial = _partial(found, number)
        out.partial.append(partial)
        out.warnings.append(f"gdsio result cut short: {partial.describe()}")
        return None
    if tput.group(2) == "GB":
        out.warnings.append(f"line {number}: old gdsio 'GB/sec' unit taken as GiB/s")
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


def _joined(lines: list[str]) -> list[tuple[int, str]]:
    """`IoType:` lines (1-based number, text), each joined with the next line when it stops
    before Throughput and the next line, not a result of its own, carries it (a wrapped copy)."""
    out: list[tuple[int, str]] = []
    for index, line in enumerate(lines):
        if "IoType:" not in line:
            continue
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if (
            _FIELDS["throughput"].search(line) is None
            and "IoType:" not in following
            and _FIELDS["throughput"].search(following) is not None
        ):
            line = f"{line.rstrip()} {following.strip()}"
        out.append((index + 1, line))
    return out


def parse_gdsio(text: str) -> GdsioOutput:
    """Parse every `IoType:` line; other lines are noise. Never raises."""
    out = GdsioOutput()
    for number, line in _joined(capped_lines(text)):
        result = _result(line, number, out)
        if result is not None:
            out.results.append(result)
    return out
