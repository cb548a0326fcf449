"""Lab state on disk and the slot locks that keep concurrent sessions apart.

``state.json`` is written after every host start, so a crash half-way still tells ``down`` what
to remove. A slot's lock file is held by the session driving it (pytest holds it for the whole
session); a slot with live hosts is never taken over, locked or not.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from kvops.lab import host
from kvops.lab.config import MAX_SLOT
from kvops.lab.errors import LabError

STATE_FILE = "state.json"


@dataclass
class HostState:
    name: str
    index: int
    ip: str
    netns: str
    veth: str
    pid: int
    pid_start: int | None
    dir: str
    host_key: str


@dataclass
class LabState:
    slot: int
    name_prefix: str
    bridge: str
    gateway_ip: str
    inventory_dir: str
    base_dir: str
    repo_dir: str | None
    started_at: float
    hosts: list[HostState] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> LabState | None:
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        hosts = [HostState(**h) for h in raw.pop("hosts", [])]
        return cls(**raw, hosts=hosts)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.rename(path)


@contextmanager
def slot_lock(lab_dir: Path, slot: int, *, wait: bool = True) -> Iterator[IO[str] | None]:
    """Hold the slot's lock file (yields None when ``wait`` is False and it is taken)."""
    lab_dir.mkdir(parents=True, exist_ok=True)
    handle = (lab_dir / f"slot{slot}.lock").open("w")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield None
            return
        yield handle
    finally:
        handle.close()


def has_live_hosts(state_path: Path) -> bool:
    state = LabState.load(state_path)
    return state is not None and any(
        h.pid_start is not None and host.proc_start_time(h.pid) == h.pid_start for h in state.hosts
    )


def claim_free_slot(lab_dir: Path) -> tuple[int, IO[str]]:
    """Lock the first free test slot (1..MAX_SLOT) for this process; it dies with the process."""
    lab_dir.mkdir(parents=True, exist_ok=True)
    for slot in range(1, MAX_SLOT + 1):
        handle = (lab_dir / f"slot{slot}.lock").open("w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        if has_live_hosts(lab_dir / f"slot{slot}" / STATE_FILE):
            # Unlocked but running: someone drives it without the lock (or a session was
            # killed hard). Never take it over; `kvops lab down --slot N` frees it.
            handle.close()
            continue
        return slot, handle
    raise LabError(f"all lab slots 1..{MAX_SLOT} are in use (see `kvops lab status`)")
