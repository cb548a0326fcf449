"""`kvops smoke --host`: the chunk-file reader shipped to the host runs under the probe's
interpreter flags (`python -S -`, stdlib only) and reports the same files and header verdicts
as the local reader. The SSH transport is replaced by a test double that runs the shipped
program with this machine's Python, so the program itself is exercised for real."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_smoke_run import _lmcache_file

from kvops.cli.smoke import _HostJournal
from kvops.remote.inventory import InventoryHost
from kvops.remote.ssh import ProbeRun, SshOptions
from kvops.smoke import remote as smoke_remote
from kvops.smoke.run import LocalChunks, SmokeError


def _ssh_double(host: InventoryHost, program: str, opts: SshOptions, deadline: float) -> ProbeRun:
    proc = subprocess.run(
        [sys.executable, "-S", "-"], input=program.encode(), capture_output=True, check=False
    )
    return ProbeRun(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def remote(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> smoke_remote.RemoteChunks:
    monkeypatch.setattr(smoke_remote, "run_ssh", _ssh_double)
    return smoke_remote.RemoteChunks(InventoryHost(name="gpu1"), str(tmp_path), SshOptions())


def test_remote_reader_agrees_with_the_local_one(
    remote: smoke_remote.RemoteChunks, tmp_path: Path
) -> None:
    _lmcache_file(tmp_path / "12" / "34" / "a.kvcache.safetensors", 64)
    _lmcache_file(tmp_path / "12" / "35" / "b.kvcache.safetensors", 64, declared_bytes=99)
    (tmp_path / "12" / "34" / "c.kvcache.safetensors.tmp1a2b3c4d").write_bytes(b"partial")
    local = LocalChunks(tmp_path)
    assert remote.paths() == local.paths()
    assert len(remote.paths()) == 2
    names = sorted(remote.paths())
    assert remote.details(names) == local.details(names)
    assert [f.header_ok for f in remote.details(names)] == [True, False]
    assert remote.where == f"gpu1:{tmp_path}"


def test_a_missing_directory_has_no_chunks(remote: smoke_remote.RemoteChunks) -> None:
    gone = smoke_remote.RemoteChunks(remote.host, remote.root + "/missing", remote.ssh)
    assert gone.paths() == set()


def test_a_failing_host_side_is_a_one_line_could_not_run(
    monkeypatch: pytest.MonkeyPatch, remote: smoke_remote.RemoteChunks
) -> None:
    def refused(*_args: Any) -> Any:
        raise PermissionError("sudo password required (set ansible_become_password)")

    monkeypatch.setattr(smoke_remote, "run_ssh", refused)
    with pytest.raises(SmokeError, match=r"cannot read gpu1:.* over SSH: sudo password required"):
        remote.paths()


def _tool(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


@pytest.mark.parametrize("degraded", [True, False])
def test_with_host_the_service_log_is_the_journal_validates_probe_reads(
    tmp_path: Path, degraded: bool
) -> None:
    """`--host` (kvops.cli.smoke): validate's probe, run as for `ansible_connection: local`
    (the same program the SSH transport ships), with test doubles of
    `systemctl` and `journalctl` (the invocation's journal; `--grep` for the problem lines,
    exiting 1 when nothing matches, as journalctl does)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    _tool(tools, "systemctl", 'echo "MainPID=0"; echo "InvocationID=abc123"\n')
    line = "LMCache ERROR: Failed to initialize LMCacheManager components: degraded mode"
    grep = f'echo "{line}"; exit 0' if degraded else "exit 1"
    _tool(
        tools,
        "journalctl",
        f'case "$*" in *--grep*) {grep};; *) printf "start\\nserving\\nready\\n";; esac\n',
    )
    host = InventoryHost(
        name="gpu1",
        vars={
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "kvops_probe_tool_dirs": [str(tools)],
            "kvops_vllm_url": "http://127.0.0.1:9",
        },
    )
    got = _HostJournal(host, SshOptions(timeout_s=60)).read()
    assert got.error is None, got
    assert got.source == "gpu1: journal of vllm.service"
    assert got.lines == 3
    assert list(got.problem_lines) == ([line] if degraded else [])


def test_a_host_without_a_journal_skips_the_service_log_with_the_reason(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    _tool(tools, "systemctl", 'echo "MainPID=0"\n')
    _tool(tools, "journalctl", 'echo "No journal files were found." >&2; exit 1\n')
    host = InventoryHost(
        name="gpu1",
        vars={
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "kvops_probe_tool_dirs": [str(tools)],
            "kvops_vllm_url": "http://127.0.0.1:9",
        },
    )
    got = _HostJournal(host, SshOptions(timeout_s=60)).read()
    assert got.error is not None and got.error.startswith("journal not read:"), got
