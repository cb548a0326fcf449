"""`/proc/self/mountstats`: which pNFS layout driver each NFS mount is using.

The kernel writes one block per mount, `device <src> mounted on <mnt> with fstype nfs4 ...`,
and for NFSv4 an `nfsv4:` line ending in `pnfs=<layout driver>` (e.g. LAYOUT_NFSV4_1_FILES,
what ONTAP hands out) or `pnfs=not configured` (Linux fs/nfs/super.c, nfs_show_stats /
show_pnfs: https://github.com/torvalds/linux/blob/master/fs/nfs/super.c).
"""

from __future__ import annotations

import re

from kvops.parse._common import capped_lines

_DEVICE = re.compile(r"^device (\S+) mounted on (\S+) with fstype (\S+)")
_PNFS = re.compile(r"[\s,]pnfs=([^,\n]+)")
NOT_CONFIGURED = "not configured"


def pnfs_layouts(text: str) -> dict[str, str]:
    """Mount point → the `pnfs=` value of its block (NFSv4 mounts only; `\\040` stays escaped
    like in /proc/mounts)."""
    out: dict[str, str] = {}
    mount_point: str | None = None
    for line in capped_lines(text):
        device = _DEVICE.match(line)
        if device:
            mount_point = device.group(2)
            continue
        if mount_point is not None and line.strip().startswith("nfsv4:"):
            found = _PNFS.search(line)
            if found:
                out[mount_point] = found.group(1).strip()
    return out
