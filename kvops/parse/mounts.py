"""`/proc/mounts` (or `mount` output) → mounts with parsed options, and NFS facts.

Why parse options ourselves: the GDS path is only real when the directory LMCache writes to
sits on an NFS mount with `proto=rdma`; a mount that silently fell back to TCP looks the same
everywhere else.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from kvops.parse._common import capped_lines, looks_like_prompt

_MOUNT_CMD = re.compile(r"^(?P<dev>\S+) on (?P<mp>.+?) type (?P<fs>\S+) \((?P<opts>[^)]*)\)?$")


def _unescape(field_text: str) -> str:
    """/proc/mounts escapes space, tab, newline and backslash as octal (`\\040`)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_text)


def parse_options(text: str) -> dict[str, str | None]:
    options: dict[str, str | None] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        options[key] = value if sep else None
    return options


@dataclass
class Mount:
    device: str
    mount_point: str
    fs_type: str
    options: dict[str, str | None]

    @property
    def is_nfs(self) -> bool:
        return self.fs_type in {"nfs", "nfs4"}

    @property
    def nfs_version(self) -> str | None:
        version = self.options.get("vers") or self.options.get("nfsvers")
        if version is None and self.fs_type == "nfs4":
            return "4"
        if version is not None and "minorversion" in self.options and "." not in version:
            version = f"{version}.{self.options['minorversion']}"
        return version

    @property
    def proto(self) -> str | None:
        return self.options.get("proto")

    @property
    def hard(self) -> bool:
        """NFS mounts are hard unless `soft`/`softerr` is given."""
        return "soft" not in self.options and "softerr" not in self.options

    def size_bytes(self, name: str) -> int | None:
        value = self.options.get(name)
        return int(value) if value is not None and value.isdigit() else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "mount_point": self.mount_point,
            "fs_type": self.fs_type,
            "options": dict(self.options),
        }


@dataclass
class MountTable:
    mounts: list[Mount] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def mount_for(self, path: str) -> Mount | None:
        """The mount that holds `path`: longest mount point that is a path prefix; the last
        such line wins when mounts are stacked (as the kernel shows the top one last)."""
        path = posixpath.normpath(path)
        best: Mount | None = None
        for mount in self.mounts:
            mp = posixpath.normpath(mount.mount_point)
            inside = path == mp or path.startswith(mp.rstrip("/") + "/")
            if inside and (best is None or len(mp) >= len(posixpath.normpath(best.mount_point))):
                best = mount
        return best

    def to_dict(self) -> dict[str, Any]:
        return {"mounts": [m.to_dict() for m in self.mounts], "warnings": list(self.warnings)}


def parse_mounts(text: str) -> MountTable:
    """Parse /proc/mounts lines or `mount` command lines; other lines are warnings."""
    table = MountTable()
    for number, raw in enumerate(capped_lines(text), start=1):
        line = raw.strip()
        if not line or looks_like_prompt(raw):
            continue
        if m := _MOUNT_CMD.match(line):
            table.mounts.append(
                Mount(m.group("dev"), m.group("mp"), m.group("fs"), parse_options(m.group("opts")))
            )
            continue
        fields = line.split()
        if len(fields) >= 4 and fields[1].startswith("/"):
            table.mounts.append(
                Mount(
                    _unescape(fields[0]),
                    _unescape(fields[1]),
                    fields[2],
                    parse_options(fields[3]),
                )
            )
            if len(fields) < 6:
                table.warnings.append(f"line {number}: short mount line (truncated?)")
            continue
        table.warnings.append(f"line {number}: not a mount line: {line[:120]}")
    return table
