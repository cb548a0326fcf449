"""`/proc/driver/nvidia-fs/stats` → counters, PeerDirect state and per-GPU memory.

Old drivers print MB unit names (`readmb`, `pinned_MB`), newer ones MiB (`readMiB`,
`Registered_MiB`); the kernel prints `label<TABs>: key=value ...`. Values are keyed the same
way for both (`read_mib`), with `unit` recording which spelling was seen. A doc-wrapped
continuation line (`pg-cache-eio=0` alone) is folded into the line before it.

Partial or older output (a copy cut short, a driver without the PeerDirect line) keeps what was
there; the lines the checks rely on that are absent are named in `missing` (and a warning each,
as the gdscheck parser reports its missing sections), so a check can say what it could not see
instead of judging absent evidence.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from kvops.parse._common import capped_lines

# A key starts where a run of key characters starts: tried from inside a run, `[...]+` would
# rescan the rest of it at every position (quadratic time on a long run without `=`).
_KV = re.compile(r"(?<![A-Za-z_\-()%/])([A-Za-z_\-()%/]+)=\s*(-?[\d.]+|\S+)")
_GPU = re.compile(r"GPU\s+(?P<bdf>\S+)\s+uuid:(?P<uuid>\S+)\s*:\s*(?P<rest>.*)")


@dataclass
class NvfsStats:
    gds_version: str | None = None
    stats_version: str | None = None
    driver_version: str | None = None
    peerdirect_supported: bool | None = None
    # `IO stats: Enabled|Disabled` (the driver's rw_stats_enabled): None when not printed
    io_stats_enabled: bool | None = None
    unit: str | None = None
    reads: dict[str, float] = field(default_factory=dict)
    writes: dict[str, float] = field(default_factory=dict)
    ops: dict[str, float] = field(default_factory=dict)
    sections: dict[str, dict[str, str]] = field(default_factory=dict)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _num(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def _counters(pairs: dict[str, str]) -> dict[str, float]:
    """Normalise `readMiB`/`readmb`/`writeMiB`/`writemb` to `mib`, keep the rest by name."""
    out: dict[str, float] = {}
    for key, value in pairs.items():
        number = _num(value)
        if number is None:
            continue
        lowered = key.lower()
        if lowered in {"readmib", "readmb", "writemib", "writemb"}:
            out["mib"] = number
        elif lowered.startswith("bandwidth"):
            out["bandwidth_mib_s"] = number
        elif lowered.startswith("avg-latency"):
            out["avg_latency_us"] = number
        else:
            out[lowered.replace("-", "_")] = number
    return out


def _enabled(word: str) -> bool | None:
    """nvidia-fs prints `IO stats: %s, peer IO stats: %s` with "Enabled" or "Disabled"
    (gds-nvidia-fs src/nvfs-stat.c, nvfs_stats_show: https://github.com/NVIDIA/gds-nvidia-fs).
    Anything else is not guessed at."""
    return {"enabled": True, "disabled": False}.get(word.strip().lower())


def _header(stats: NvfsStats, label: str, value: str) -> bool:
    if label == "GDS Version":
        stats.gds_version = value.strip() or None
    elif label.startswith("NVFS statistics"):
        m = re.search(r"ver:\s*([\d.]+)", label + ":" + value)
        stats.stats_version = m.group(1) if m else None
    elif label.startswith("NVFS Driver"):
        m = re.search(r"version:\s*([\d:.]+)", label + ":" + value)
        stats.driver_version = m.group(1).replace(":", ".") if m else None
    elif label == "Mellanox PeerDirect Supported":
        stats.peerdirect_supported = value.strip().lower() == "true"
    elif label == "IO stats":
        stats.io_stats_enabled = _enabled(value.split(",", 1)[0])
    elif label.startswith("Active Shadow-Buffer"):
        stats.unit = "MiB" if "MiB" in label else "MB"
    else:
        return False
    return True


def _gpu(stats: NvfsStats, line: str) -> None:
    m = _GPU.match(line)
    if not m:
        stats.warnings.append(f"unrecognised GPU line: {line[:120]}")
        return
    gpu: dict[str, Any] = {"bdf": m.group("bdf"), "uuid": m.group("uuid")}
    for key, value in _KV.findall(m.group("rest")):
        lowered = key.lower()
        name = {
            "registered_mib": "registered_mib",
            "pinned_mb": "registered_mib",
            "cache_mib": "cache_mib",
            "cache_mb": "cache_mib",
            "max_pinned_mib": "max_pinned_mib",
            "max_pinned_mb": "max_pinned_mib",
            "cross_root_port(%)": "cross_root_port_pct",
        }.get(lowered, lowered)
        gpu[name] = _num(value)
    stats.gpus.append(gpu)


def parse_nvfs_stats(text: str) -> NvfsStats:
    """Parse the stats file. Never raises; unknown lines become warnings."""
    stats = NvfsStats()
    previous: str | None = None
    for raw in capped_lines(text):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("GPU ") and "uuid:" in line:
            _gpu(stats, line)
            continue
        if ":" not in line:
            if previous is not None and "=" in line:
                stats.sections[previous].update(dict(_KV.findall(line)))
            else:
                stats.warnings.append(f"unrecognised line: {line[:120]}")
            continue
        label, _, value = line.partition(":")
        label = label.strip()
        if _header(stats, label, value):
            continue
        pairs = dict(_KV.findall(value))
        if not pairs:
            stats.sections.setdefault(label, {})["value"] = value.strip()
            continue
        key = label if label not in stats.sections else f"{label} #2"
        stats.sections[key] = pairs
        previous = key
    for label, pairs in stats.sections.items():
        if label.startswith("Reads"):
            stats.reads.update(_counters(pairs))
        elif label.startswith("Writes"):
            stats.writes.update(_counters(pairs))
        elif label == "Ops":
            stats.ops.update({k.lower(): v for k, v in _counters(pairs).items()})
    present = {
        "GDS Version": stats.gds_version is not None,
        "NVFS Driver(version)": stats.driver_version is not None,
        "Mellanox PeerDirect Supported": stats.peerdirect_supported is not None,
        "Reads": "n" in stats.reads,
        "Writes": "n" in stats.writes,
    }
    stats.missing = [label for label, seen in present.items() if not seen]
    if stats.gds_version is None and not stats.sections:
        stats.warnings.append("no nvidia-fs statistics found")
        return stats
    for label in stats.missing:
        if stats.io_stats_enabled is False and label in ("Reads", "Writes"):
            # with statistics off the driver prints only the error counters of these lines
            stats.warnings.append(f"line {label!r} has no n=: IO stats disabled")
            continue
        stats.warnings.append(f"line {label!r} missing: older nvidia-fs or output truncated")
    return stats


def missing_counters(stats: NvfsStats) -> list[str]:
    """Which of the Reads/Writes lines (their `n=` counts) the stats lack."""
    return [label for label in ("Reads", "Writes") if label in stats.missing]


def io_counts(stats: NvfsStats) -> tuple[int, int] | None:
    """(reads n, writes n): the counters that rise only when IO really goes through nvidia-fs."""
    reads, writes = stats.reads.get("n"), stats.writes.get("n")
    if reads is None or writes is None:
        return None
    return int(reads), int(writes)
