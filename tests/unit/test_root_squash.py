"""On an export with root squashed (ONTAP `superuser none`, what `ontap_export` sets by default)
root on the GPU host is nobody on the storage and cannot list the inference service's
directory; the service user can. kvops reads that directory as the service user sees it.

Root here is not squashed, so root's refusal is played by a test double of `os.walk` that fails
to list for uid 0 only (the refusal an NFS server gives a squashed root); everything the service
user does is real: a forked child that really switches to `nobody`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvops.probe import storage
from kvops.probe.core import Probe
from kvops.smoke import chunk_files

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")


@pytest.fixture
def service_dir() -> Iterator[Path]:
    """A directory `nobody` can reach and list (pytest's tmp_path sits under 0700 parents)."""
    top = Path(tempfile.mkdtemp(prefix="kvops-squash-"))
    top.chmod(0o755)
    gds = top / "gds"
    (gds / "ab" / "cd").mkdir(parents=True)
    (gds / "ab" / "cd" / "m@1@0@abc@float.kvcache.safetensors").write_bytes(b"k" * 5000)
    for path in (gds, gds / "ab", gds / "ab" / "cd"):
        path.chmod(0o755)
    yield gds
    shutil.rmtree(top)


def _squashed_walk(real: Callable[..., Any]) -> Callable[..., Any]:
    """TEST DOUBLE of os.walk under root squash: uid 0 is refused the listing."""

    def walk(top: str, onerror: Callable[[OSError], None] | None = None, **kw: Any) -> Any:
        if os.geteuid() == 0:
            if onerror is not None:
                onerror(PermissionError(13, "Permission denied", top))
            return iter(())
        return real(top, onerror=onerror, **kw)

    return walk


def test_the_probe_walks_the_gds_directory_as_the_service_user(
    service_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage.os, "walk", _squashed_walk(os.walk))
    probe = Probe({"deadline_s": 30})
    storage.gds_dir(probe, str(service_dir), "nobody")
    item = probe.items["gds_dir"]
    assert item["error"] is None
    assert item["data"]["file_count"] == 1 and item["data"]["bytes"] == 5000
    assert item["data"]["walked_as"] == "nobody"

    probe = Probe({"deadline_s": 30})
    storage.gds_dir(probe, str(service_dir), "no-such-user-kvops")
    item = probe.items["gds_dir"]  # nobody to switch to: the refusal is said, not hidden
    assert "cannot list part of" in item["error"] and item["data"]["file_count"] == 0


def _remote_answer(request: dict[str, Any]) -> dict[str, Any]:
    """chunk_files run as smoke ships it to a host: its source and main(request)."""
    source = Path(chunk_files.__file__).read_text()
    program = f"{source}\nmain({json.dumps(json.dumps(request))})\n"
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    answer: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return answer


def test_smoke_reads_chunk_files_as_the_service_user(service_dir: Path) -> None:
    listed = _remote_answer({"op": "list", "root": str(service_dir), "as_user": "nobody"})
    assert [Path(p).name for p in listed["paths"]] == ["m@1@0@abc@float.kvcache.safetensors"]
    os.chmod(service_dir / "ab", 0o700)  # root's own directory: nobody may not list it
    refused = _remote_answer({"op": "list", "root": str(service_dir), "as_user": "nobody"})
    assert "cannot list" in refused["error"] and "Permission denied" in refused["error"]
