"""`ibdev2netdev` and `show_gids` (MLNX/DOCA-OFED tools) → RDMA port ↔ net device facts.

Why these two: an NFS/RDMA mount is carried by one net device (the one holding its
`clientaddr`), and only these tools tie that net device to an RDMA device and port with its
link state (`ibdev2netdev`) and to the port's GID table with RoCE versions (`show_gids`).
rdma_cm resolves the mount's IP addresses through that GID table; on RoCE without a v2
(UDP/IP, routable) GID for an address, the connection is limited to RoCE v1, which does not
cross a router.

`ibdev2netdev` prints `mlx5_0 port 1 ==> ibp12s0 (Up)`; with `-v` each line starts with the
PCI address and adapter description and adds the port state:
`0000:b8:00.1 mlx5_13 (MT4123 - MCX653106A-ECAT) ConnectX-6 VPI ... fw 20.26.4012 port 1
(ACTIVE) ==> ib4 (Up) (o2ib)`. `show_gids` prints a tab-separated table
`DEV PORT INDEX GID IPv4 VER DEV` (the IPv4 column is empty for non-IPv4 GIDs, the net device
may be empty for InfiniBand ports) and ends with `n_gids_found=N`, which tells a complete
output from a truncated one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from kvops.parse._common import capped_lines, looks_like_prompt, to_int

# One line is `<left> ==> <netdev> (<state>)<rest>`, the left part `[<pci>] <device>
# [<description>] port <n> [(<port state>)]`. Parsed in pieces around the first `==>` and from
# the end of the left part: one regex with a lazy description between two `\s+` took quadratic
# time on a long run of spaces.
_IBDEV_NETDEV = re.compile(r"\s+(?P<netdev>\S+)\s+\((?P<state>[^)]*)\)(?P<rest>.*)$")
_IBDEV_HEAD = re.compile(
    r"(?:(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+)?"
    r"(?P<device>\S+)(?:\s+(?P<description>.*))?$"
)
_FIRMWARE = re.compile(r"\bfw\s+(\S+)")
_IPV4 = re.compile(r"^\d{1,3}(?:\.\d{1,3}){3}$")
_VERSION = re.compile(r"^[vV](\d)$")
_GIDS_FOUND = re.compile(r"^n_gids_found\s*=\s*(\S*)$")
_NO_NETDEV = {"N/A", "-", ""}


@dataclass
class RdmaLink:
    """One `ibdev2netdev` line: an RDMA device port and the net device on it."""

    device: str
    port: int
    netdev: str | None  # None when the tool printed none (`N/A`)
    state: str  # the net device's state as printed: "Up" or "Down"
    port_state: str | None = None  # RDMA port state, only with -v: "ACTIVE", "DOWN", ...
    pci_address: str | None = None  # -v only
    description: str | None = None  # -v only: adapter model text
    firmware: str | None = None  # -v only

    @property
    def up(self) -> bool:
        return self.state.strip().lower() == "up"


@dataclass
class RdmaNetdevMap:
    links: list[RdmaLink] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def for_netdev(self, netdev: str) -> list[RdmaLink]:
        return [link for link in self.links if link.netdev == netdev]

    def to_dict(self) -> dict[str, Any]:
        return {
            "links": [{**asdict(link), "up": link.up} for link in self.links],
            "warnings": list(self.warnings),
        }


def _port_state(left: str) -> tuple[str, str | None] | None:
    """The left part without its trailing `(<port state>)`, and that state (None if absent);
    None when a `(` is not preceded by whitespace."""
    if not left.endswith(")"):
        return left, None
    opening = left.rfind("(")
    if opening < 1 or not left[opening - 1].isspace():
        return None
    return left[:opening].rstrip(), left[opening + 1 : -1].strip() or None


def _ibdev_line(line: str) -> RdmaLink | None:
    """One `ibdev2netdev [-v]` line, or None when it does not have that shape."""
    left, arrow, right = line.partition("==>")
    if not arrow or not left[-1:].isspace():
        return None
    tail = _IBDEV_NETDEV.match(right)
    split = _port_state(left.rstrip())
    words = split[0].rsplit(None, 2) if split is not None else []  # <head> port <n>
    if len(words) != 3 or words[1] != "port" or not words[2].isdecimal():
        return None
    head = _IBDEV_HEAD.match(words[0])
    if tail is None or split is None or head is None:
        return None
    description = (head.group("description") or "").strip() or None
    firmware = _FIRMWARE.search(description or "")
    netdev = tail.group("netdev")
    return RdmaLink(
        device=head.group("device"),
        port=int(words[2]),
        netdev=None if netdev in _NO_NETDEV else netdev,
        state=tail.group("state").strip(),
        port_state=split[1],
        pci_address=head.group("pci"),
        description=description,
        firmware=firmware.group(1) if firmware else None,
    )


def parse_ibdev2netdev(text: str) -> RdmaNetdevMap:
    """Parse `ibdev2netdev` or `ibdev2netdev -v`. Never raises; lines that do not fit (a
    truncated last line, stray text) become warnings."""
    out = RdmaNetdevMap()
    for number, raw in enumerate(capped_lines(text), start=1):
        line = raw.strip()
        if not line or looks_like_prompt(raw):
            continue
        link = _ibdev_line(line)
        if link is None:
            out.warnings.append(f"line {number}: not an ibdev2netdev line: {line[:120]}")
            continue
        out.links.append(link)
    if not out.links:
        out.warnings.append("no device lines: no RDMA device, or not ibdev2netdev output")
    return out


@dataclass
class Gid:
    """One row of `show_gids`."""

    device: str
    port: int
    index: int
    gid: str
    ipv4: str | None
    version: str | None  # "v1" (RoCE v1 / InfiniBand) or "v2" (RoCE v2, UDP/IP)
    netdev: str | None


@dataclass
class GidTable:
    gids: list[Gid] = field(default_factory=list)
    n_gids_found: int | None = None
    warnings: list[str] = field(default_factory=list)

    def ports(self) -> list[tuple[str, int]]:
        """(device, port) pairs in the order the table lists them."""
        return list(dict.fromkeys((g.device, g.port) for g in self.gids))

    def rows(self, device: str, port: int) -> list[Gid]:
        return [g for g in self.gids if g.device == device and g.port == port]

    def to_dict(self) -> dict[str, Any]:
        return {
            "gids": [asdict(g) for g in self.gids],
            "n_gids_found": self.n_gids_found,
            "warnings": list(self.warnings),
        }


def _gid_row(tokens: list[str]) -> Gid | None:
    """DEV PORT INDEX GID, then in any order: an IPv4 address, a version, the net device."""
    if len(tokens) < 4 or ":" not in tokens[3]:
        return None
    port, index = to_int(tokens[1]), to_int(tokens[2])
    if port is None or index is None:
        return None
    ipv4 = version = netdev = None
    for token in tokens[4:]:
        if _IPV4.match(token):
            ipv4 = token
        elif m := _VERSION.match(token):
            version = f"v{m.group(1)}"
        else:
            netdev = token
    return Gid(tokens[0], port, index, tokens[3], ipv4, version, netdev)


def _is_header(tokens: Iterable[str]) -> bool:
    first = next(iter(tokens), "")
    return first == "DEV" or set(first) == {"-"}


def parse_show_gids(text: str) -> GidTable:
    """Parse `show_gids`. Never raises; a missing or disagreeing `n_gids_found` line (the
    tool's last line) is reported as truncation."""
    out = GidTable()
    for number, raw in enumerate(capped_lines(text), start=1):
        line = raw.strip()
        if not line or looks_like_prompt(raw):
            continue
        tokens = line.split()
        if _is_header(tokens):
            continue
        if m := _GIDS_FOUND.match(line):
            out.n_gids_found = to_int(m.group(1))
            if out.n_gids_found is None:
                out.warnings.append(f"line {number}: n_gids_found is not a number")
            continue
        row = _gid_row(tokens)
        if row is None:
            out.warnings.append(f"line {number}: not a show_gids row: {line[:120]}")
            continue
        out.gids.append(row)
    if out.n_gids_found is None:
        out.warnings.append("no 'n_gids_found=' line: output truncated or not show_gids")
    elif out.n_gids_found != len(out.gids):
        out.warnings.append(
            f"n_gids_found={out.n_gids_found} but {len(out.gids)} rows read (truncated?)"
        )
    return out
