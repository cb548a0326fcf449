"""Where the lab keeps things and how its hosts are named and addressed.

A lab instance lives in a *slot*: slot 0 is the one ``kvops lab up`` manages (inventory in
``inventories/lab/``); the pytest fixture takes a free slot 1..31 so that two test sessions (or a
test session next to ``make lab``) on the same machine never share a bridge, an address or a
network namespace. Slot N owns bridge ``kvopsbrN``, subnet ``10.200.N.0/24`` (bridge address
``.1``, hosts from ``.11``) and network namespaces named ``kvopsN-<host>``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

MAX_SLOT = 31
MAX_HOSTS = 50
LAB_USER = "kvops"


def default_cache_dir() -> Path:
    """Heavy artifacts (the root filesystem) live outside the repo so CI runs reuse them."""
    base = os.environ.get("KVOPS_CACHE_DIR") or str(Path.home() / ".cache" / "kvops")
    return Path(base) / "lab"


def default_lab_dir() -> Path:
    """Running state (overlay layers, host keys, the apt repo) of all slots."""
    return Path(os.environ.get("KVOPS_LAB_DIR") or "/run/kvops-lab")


def find_project_root(start: Path | None = None) -> Path | None:
    """The kvops checkout around ``start`` (it holds the package list of the test repo)."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "pyproject.toml").is_file() and (candidate / "kvops").is_dir():
            return candidate
    return None


@dataclass(frozen=True)
class LabConfig:
    """Everything that names or places a lab instance; pure, so it is unit-tested."""

    slot: int = 0
    hosts: int = 2
    name_prefix: str = "kvlab"
    cache_dir: Path = field(default_factory=default_cache_dir)
    lab_dir: Path = field(default_factory=default_lab_dir)
    inventory_dir: Path | None = None
    packages_spec: Path | None = None
    # Inventory-source files whose gpu_hosts vars and hosts' vars go into the generated
    # hosts.yml (the lab's role settings and its declarations for kvops validate); see
    # inventory.read_declarations.
    vars_files: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.slot <= MAX_SLOT:
            raise ValueError(f"slot must be 0..{MAX_SLOT}, got {self.slot}")
        if not 1 <= self.hosts <= MAX_HOSTS:
            raise ValueError(f"hosts must be 1..{MAX_HOSTS}, got {self.hosts}")
        prefix = self.name_prefix
        if not prefix or len(prefix) > 20 or not all(c.isalnum() or c == "-" for c in prefix):
            raise ValueError(f"name prefix must be 1-20 letters, digits or '-', got {prefix!r}")
        if not prefix[0].isalpha():
            raise ValueError(f"name prefix must start with a letter, got {prefix!r}")

    @property
    def state_dir(self) -> Path:
        return self.lab_dir / f"slot{self.slot}"

    @property
    def bridge(self) -> str:
        return f"kvopsbr{self.slot}"

    @property
    def gateway_ip(self) -> str:
        return f"10.200.{self.slot}.1"

    @property
    def prefix_len(self) -> int:
        return 24

    @property
    def netns_prefix(self) -> str:
        return f"kvops{self.slot}-"

    def host_name(self, index: int) -> str:
        """Host ``index`` (1-based): ``kvlab-1``, ``kvlab-2``, ..."""
        return f"{self.name_prefix}-{index}"

    def host_ip(self, index: int) -> str:
        return f"10.200.{self.slot}.{10 + index}"

    def netns(self, index: int) -> str:
        return f"{self.netns_prefix}{self.host_name(index)}"

    def veth(self, index: int) -> str:
        """Bridge-side veth name; interface names are limited to 15 characters."""
        return f"kv{self.slot}h{index}"

    def resolved_inventory_dir(self) -> Path:
        """Slot 0 writes ``inventories/lab/``; test slots keep theirs in their state dir so
        ``ansible-inventory -i inventories/lab`` never mixes two labs."""
        if self.inventory_dir is not None:
            return self.inventory_dir
        if self.slot == 0:
            root = find_project_root() or Path.cwd()
            return root / "inventories" / "lab"
        return self.state_dir / "inventory"
