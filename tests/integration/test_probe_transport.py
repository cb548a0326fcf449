"""Fleet transport without SSH: local connection, per-host timeout, sudo handshake, ordering."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "doubles"))

from old_pythons import older_than_floor_python
from recorded_host_double import HANGING_PYTHON_DOUBLE, TOOLS_DOUBLE_DIR, build_recorded_tree

from kvops import evidence as ev
from kvops.remote.inventory import InventoryHost, probe_options, probe_settings
from kvops.remote.ssh import SshOptions, _become_handshake, remote_command
from kvops.validate.collect import HostStatus, probe_config, probe_fleet


def local_host(name: str, tmp_path: Path, **extra: Any) -> InventoryHost:
    gds = tmp_path / "gds"
    gds.mkdir(exist_ok=True)
    roots = build_recorded_tree(tmp_path / "tree", gds)
    hvars = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "kvops_gds_dir": str(gds),
        "kvops_vllm_url": "http://127.0.0.1:9",
        "kvops_probe_roots": roots,
        "kvops_probe_tool_dirs": [str(TOOLS_DOUBLE_DIR)],
    }
    hvars.update(extra)
    return InventoryHost(name, vars=hvars)


def run(hosts: list[InventoryHost], timeout_s: float, forks: int = 4) -> list[Any]:
    configs = {
        h.name: probe_config(h, probe_settings(h), probe_options(h), timeout_s) for h in hosts
    }
    seen: list[str] = []
    results = probe_fleet(
        hosts,
        configs,
        SshOptions(known_hosts=Path("/nonexistent"), timeout_s=timeout_s),
        forks=forks,
        on_result=lambda r: seen.append(r.host),
    )
    assert sorted(seen) == sorted(h.name for h in hosts)
    return results


def test_hung_host_times_out_while_the_others_complete(tmp_path: Path) -> None:
    hosts = [
        local_host("a", tmp_path),
        local_host("hung", tmp_path, ansible_python_interpreter=str(HANGING_PYTHON_DOUBLE)),
        local_host("b", tmp_path),
        local_host("nopython", tmp_path, ansible_python_interpreter="/nonexistent/python3"),
    ]
    start = time.monotonic()
    results = run(hosts, timeout_s=4)
    assert time.monotonic() - start < 12
    assert [r.host for r in results] == ["a", "hung", "b", "nopython"]  # inventory order
    by = {r.host: r for r in results}
    assert by["a"].status == HostStatus.OK and by["b"].status == HostStatus.OK
    assert by["a"].evidence["error"] is None and ev.MOUNTS in by["a"].evidence["items"]
    assert by["hung"].status == HostStatus.TIMEOUT and "within 4 s" in str(by["hung"].reason)
    assert by["hung"].evidence["error"] and by["hung"].evidence["items"] == {}
    assert by["nopython"].status == HostStatus.PROBE_FAILED


def test_probe_budget_sits_under_the_host_timeout() -> None:
    host = InventoryHost("h")
    assert probe_config(host, {}, {}, 60)["deadline_s"] == 55
    assert probe_config(host, {}, {}, 5)["deadline_s"] == 4
    assert probe_config(host, {}, {}, 1)["deadline_s"] == 1


def test_remote_command_runs_python_on_stdin_under_a_remote_timeout() -> None:
    plain = remote_command(InventoryHost("h"), 30, "MARK", "PROMPT")
    assert plain.startswith("/bin/sh -c ") and "timeout -k 5 35 python3 -S -;" in plain
    become = remote_command(
        InventoryHost("h", vars={"ansible_become": "true", "ansible_become_user": "svc"}),
        30,
        "MARK",
        "PROMPT",
    )
    assert become.startswith("sudo -H -S -p PROMPT -u svc -- /bin/sh -c ")
    assert "echo MARK" in become


class ChannelDouble:
    """TEST DOUBLE of a paramiko Channel: scripted stdout/stderr, records what was sent.

    Its fileno() is always readable (the script is there at once), so waits never block."""

    _readable: int | None = None

    def __init__(self, script: list[tuple[str, bytes]], exits: bool = False) -> None:
        self.script = script
        self.sent: list[bytes] = []
        self.exits = exits
        self.eof_received = False
        self.status_event = threading.Event()

    def fileno(self) -> int:
        if ChannelDouble._readable is None:
            r, w = os.pipe()
            os.write(w, b"x")
            os.close(w)
            ChannelDouble._readable = r
        return ChannelDouble._readable

    def _next(self, stream: str) -> bool:
        return bool(self.script) and self.script[0][0] == stream

    def recv_ready(self) -> bool:
        return self._next("out")

    def recv_stderr_ready(self) -> bool:
        return self._next("err")

    def recv(self, n: int) -> bytes:
        return self.script.pop(0)[1]

    def recv_stderr(self, n: int) -> bytes:
        return self.script.pop(0)[1]

    def sendall(self, data: bytes) -> None:
        self.sent.append(data)
        if self.script and self.script[0][0] == "wait-for-send":
            self.script.pop(0)

    def exit_status_ready(self) -> bool:
        return self.exits and not self.script


def test_sudo_prompt_is_answered_with_the_become_password() -> None:
    host = InventoryHost("h", vars={"ansible_become": True, "ansible_become_password": "pw"})
    chan = ChannelDouble([("err", b"[P]"), ("wait-for-send", b""), ("out", b"MARK\n{partial")])
    rest = _become_handshake(chan, host, "MARK", "[P]", time.monotonic() + 5)  # type: ignore[arg-type]
    assert chan.sent == [b"pw\n"] and rest == b"{partial"


def test_sudo_prompt_without_password_is_an_auth_failure() -> None:
    host = InventoryHost("h", vars={"ansible_become": True})
    chan = ChannelDouble([("err", b"[P]")])
    with pytest.raises(PermissionError, match="required"):
        _become_handshake(chan, host, "MARK", "[P]", time.monotonic() + 5)  # type: ignore[arg-type]
    assert chan.sent == []


def test_sudo_refusal_is_reported_with_its_message() -> None:
    host = InventoryHost("h", vars={"ansible_become": True})
    chan = ChannelDouble([("err", b"sudo: a password is required\n")], exits=True)
    with pytest.raises(PermissionError, match="a password is required"):
        _become_handshake(chan, host, "MARK", "[P]", time.monotonic() + 5)  # type: ignore[arg-type]


def test_a_host_that_streams_before_the_marker_costs_constant_memory() -> None:
    """A hostile host can write without end before the marker (or to stderr) during become:
    the handshake keeps a short tail, not everything it was sent."""
    host = InventoryHost("h", vars={"ansible_become": True, "ansible_become_password": "pw"})
    junk = b"x" * 65536
    script = [("out", junk), ("err", junk)] * 128 + [("out", b"MAR"), ("out", b"K\n{doc")]
    chan = ChannelDouble(script)
    tracemalloc.start()
    try:
        rest = _become_handshake(chan, host, "MARK", "[P]", time.monotonic() + 30)  # type: ignore[arg-type]
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rest == b"{doc"  # the marker split across two reads is still found
    assert peak_bytes < 1024 * 1024  # 16 MiB streamed: nothing near it kept


OLD_PYTHON_DOUBLE = Path(__file__).parents[1] / "doubles" / "python_3_7_double"


def test_too_old_python_is_a_clear_probe_failure(tmp_path: Path) -> None:
    """A real Python 3.7/3.6 where one is installed; else the double that reports 3.7.16."""
    old = older_than_floor_python() or OLD_PYTHON_DOUBLE
    (res,) = run([local_host("old", tmp_path, ansible_python_interpreter=str(old))], 30)
    assert res.status == HostStatus.PROBE_FAILED
    assert re.search(r"needs Python >= 3\.8 on the host, found 3\.[67]\.\d+", str(res.reason))
