"""The wheelhouse the lab serves on its bridge: kvops built from this checkout plus the wheels
`kvops sim serve` imports, so the vllm_lmcache role installs the lab's engine with its own pip
task, exactly as it installs vLLM + LMCache from a package index in production.

Lab hosts have no network beyond the bridge and Debian's python3 without ensurepip, so the
wheelhouse also carries pip's own wheel (the role's `vllm_lmcache_pip_bootstrap_url`). The third-
party wheels are fetched once with `pip download` at the versions installed here (the lab hosts
run the same CPython minor version as this machine's Debian) and cached under the lab cache.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from kvops.lab.config import default_cache_dir

# Distributions `kvops sim serve` imports (the kvops CLI loads every command module), without
# the heavy ones only other commands need at run time (ansible, testinfra, matplotlib).
ENGINE_DISTRIBUTIONS = (
    "aiohappyeyeballs", "aiohttp", "aiosignal", "attrs", "click", "frozenlist", "idna",
    "multidict", "numpy", "prometheus_client", "propcache", "PyYAML", "yarl", "rich",
    "markdown-it-py", "mdurl", "Pygments", "typing_extensions", "paramiko", "bcrypt",
    "cryptography", "cffi", "pycparser", "PyNaCl", "Jinja2", "MarkupSafe",
    "packaging",  # what Ansible's pip module imports (installed into the venv by the role)
)  # fmt: skip


class WheelhouseError(RuntimeError):
    """The wheelhouse could not be built (pip failed, or a distribution is not installed here)."""


@dataclass(frozen=True)
class Wheelhouse:
    directory: Path
    requirements: list[str]  # name==version, kvops first
    pip_wheel: str  # file name of pip's wheel in directory


def _pinned() -> list[str]:
    pins = []
    for name in (*ENGINE_DISTRIBUTIONS, "pip"):
        try:
            pins.append(f"{name}=={version(name)}")
        except PackageNotFoundError as exc:
            raise WheelhouseError(f"{name} is not installed here: install kvops first") from exc
    return pins


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise WheelhouseError(f"{' '.join(argv[:4])} failed: {' | '.join(tail)}")


def build_wheelhouse(directory: Path, project_root: Path) -> Wheelhouse:
    """kvops from ``project_root`` plus the cached third-party wheels, all in ``directory``."""
    pins = _pinned()
    cache = (
        default_cache_dir()
        / "lab"
        / ("wheels-" + hashlib.sha256("\n".join(pins).encode()).hexdigest()[:12])
    )
    pip = [sys.executable, "-m", "pip"]
    if not (cache / ".complete").exists():
        cache.mkdir(parents=True, exist_ok=True)
        _run(
            [*pip, "download", "--no-deps", "--only-binary", ":all:", "-q", "-d", str(cache), *pins]
        )
        (cache / ".complete").touch()
    directory.mkdir(parents=True, exist_ok=True)
    for wheel in cache.glob("*.whl"):
        shutil.copy2(wheel, directory / wheel.name)
    _build_kvops_wheel(project_root, directory)
    pip_wheels = sorted(p.name for p in directory.glob("pip-*.whl"))
    if not pip_wheels:
        raise WheelhouseError(f"no pip wheel in {cache}")
    from kvops import __version__

    engine_pins = [p for p in pins if not p.startswith("pip==")]
    return Wheelhouse(directory, [f"kvops=={__version__}", *engine_pins], pip_wheels[-1])


def _build_kvops_wheel(project_root: Path, directory: Path) -> None:
    """Build from a copy of the sources: setuptools writes build/ and *.egg-info next to them."""
    with tempfile.TemporaryDirectory(prefix="kvops-wheel-") as tmp:
        source = Path(tmp) / "src"
        source.mkdir()
        skip = shutil.ignore_patterns("__pycache__", "*.pyc")
        shutil.copytree(project_root / "kvops", source / "kvops", ignore=skip)
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            if (project_root / name).exists():
                shutil.copy2(project_root / name, source / name)
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "-q",
                "-w",
                str(directory),
                str(source),
            ]
        )


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """No access log on stderr: pip's requests are not test output."""


def serve_directory(directory: Path, bind_ip: str) -> tuple[ThreadingHTTPServer, str]:
    """Serve ``directory`` read-only over HTTP on ``bind_ip`` (a free port) from a daemon thread;
    returns the server (call ``shutdown()``) and its base URL."""
    handler = partial(_QuietHandler, directory=str(directory))
    server = ThreadingHTTPServer((bind_ip, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://{bind_ip}:{server.server_address[1]}"
