"""`ip -j addr show` (JSON) or `ip -o addr show` (one line per address) → addresses per
interface. Needed to prove cufile's `rdma_dev_addr_list` names addresses of this host's RDMA
interfaces and not a copy from another host."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kvops.parse._common import capped_lines


@dataclass
class Interfaces:
    addresses: dict[str, list[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"addresses": self.addresses, "warnings": self.warnings}


def _from_json(doc: Any, out: Interfaces) -> None:
    for link in doc if isinstance(doc, list) else []:
        if not isinstance(link, dict) or "ifname" not in link:
            continue
        addrs = out.addresses.setdefault(str(link["ifname"]), [])
        for info in link.get("addr_info") or []:
            if isinstance(info, dict) and "local" in info:
                addrs.append(str(info["local"]))


def parse_ip_addr(text: str) -> Interfaces:
    """Parse either format; lines of the text format that do not fit become warnings."""
    out = Interfaces()
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            _from_json(json.loads(stripped), out)
            return out
        except json.JSONDecodeError as exc:
            out.warnings.append(f"ip -j output is not valid JSON ({exc.msg}); trying text")
        except (ValueError, RecursionError) as exc:  # too deep, or a number int() refuses
            out.warnings.append(f"ip -j output does not load ({str(exc)[:120]}); trying text")
    for number, line in enumerate(capped_lines(text), start=1):
        fields = line.split()
        if len(fields) < 4 or fields[2] not in {"inet", "inet6"}:
            if line.strip():
                out.warnings.append(f"line {number}: not an address line")
            continue
        ifname = fields[1].split("@", 1)[0]
        out.addresses.setdefault(ifname, []).append(fields[3].split("/", 1)[0])
    return out
