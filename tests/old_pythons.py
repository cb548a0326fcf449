"""Find the oldest Pythons installed here, for the probe's "runs on Python >= 3.8" promise.

Why: the probe ships to hosts whose only Python may be 3.8 (Ubuntu 20.04, RHEL 8's python38),
so the tests run it on the oldest Python this machine has, whatever its patch release: any
pyenv version (`$PYENV_ROOT`, default ~/.pyenv), then `python3.X` on PATH. Where no 3.8 exists
(a fresh Debian 12 CI machine has 3.11 only) `oldest_supported_python()` falls back to the
oldest Python >= 3.8 that does exist, so the test still runs there and says which one it used;
the 3.8 grammar of every shipped module is checked without an interpreter
(tests/unit/test_probe_python_floor.py), so a 3.9+ construct fails everywhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

PROBE_FLOOR = (3, 8)


def _pyenv_root() -> Path:
    return Path(os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv")))


def _version_of(python: Path) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [str(python), "-c", "import sys; print('%d %d' % sys.version_info[:2])"],
            capture_output=True, text=True, timeout=30, env={"PATH": os.defpath},
        ).stdout.split()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (int(out[0]), int(out[1])) if len(out) == 2 else None


def find_python(major: int, minor: int) -> Path | None:
    """An installed CPython `major.minor` (any patch release), or None."""
    name = f"python{major}.{minor}"
    versions = _pyenv_root() / "versions"
    candidates = sorted(versions.glob(f"{major}.{minor}.*/bin/{name}")) if versions.is_dir() else []
    on_path = shutil.which(name)
    if on_path:
        candidates.append(Path(on_path))
    for python in candidates:
        if _version_of(python) == (major, minor):
            return python
    return None


def oldest_supported_python() -> tuple[Path, tuple[int, int]]:
    """The oldest installed Python at or above the probe's floor (this interpreter at worst)."""
    for minor in range(PROBE_FLOOR[1], sys.version_info[1]):
        found = find_python(3, minor)
        if found is not None:
            return found, (3, minor)
    return Path(sys.executable), (sys.version_info[0], sys.version_info[1])


def older_than_floor_python() -> Path | None:
    """An installed Python just below the probe's floor (3.7, then 3.6), or None."""
    for minor in range(PROBE_FLOOR[1] - 1, 5, -1):
        found = find_python(3, minor)
        if found is not None:
            return found
    return None
