"""testinfra after site.yml: modprobe.d and modules-load.d files, the modprobe calls in order
(as the converge made them: later tests add their own calls to the doubles' logs)."""

from __future__ import annotations

import pytest
from lab_harness import LabHosts
from site_lab import STACK, converge_log, converged


@pytest.fixture(params=sorted(STACK))
def name(request: pytest.FixtureRequest, lab: LabHosts) -> str:
    converged(lab)
    return str(request.param)


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def test_rpcrdma_loads_at_boot(lab: LabHosts, name: str) -> None:
    f = lab.testinfra(name).file("/etc/modules-load.d/rpcrdma.conf")
    assert f.is_file and f.user == "root" and f.group == "root" and f.mode == 0o644
    assert _lines(f.content_string) == ["rpcrdma"]


def test_nvidia_fs_loads_at_boot_with_its_options(lab: LabHosts, name: str) -> None:
    host = lab.testinfra(name)
    load = host.file("/etc/modules-load.d/nvidia-fs.conf")
    assert _lines(load.content_string) == ["nvidia_fs"]
    opts = host.file("/etc/modprobe.d/nvidia-fs.conf")
    assert opts.is_file and opts.user == "root" and opts.mode == 0o644
    assert _lines(opts.content_string) == [
        "options nvidia_fs peer_stats_enabled=0",
        "options nvidia_fs rw_stats_enabled=1",
    ]
    # The modprobe double applied /etc/modprobe.d when it loaded nvidia_fs, as /sys/module shows.
    params = "/var/lib/kvops-test-doubles/sys/module/nvidia_fs/parameters"
    assert host.file(f"{params}/rw_stats_enabled").content_string.strip() == "1"


def test_modprobe_calls_load_driver_then_rdma_then_nvidia_fs(lab: LabHosts, name: str) -> None:
    calls = converge_log(lab, name, "modprobe")
    assert calls, "the roles never called modprobe"
    assert not any(c.split()[0] in ("-r", "--remove") for c in calls), calls
    first = {m: calls.index(m) for m in ("nvidia", "rpcrdma", "nvidia_fs")}
    assert first["nvidia"] < first["rpcrdma"] < first["nvidia_fs"], calls
    # The converge loaded each module once (later entries are boot replays, not reloads).
    assert calls[:3] == ["nvidia", "rpcrdma", "nvidia_fs"], calls


def test_the_modules_are_loaded(lab: LabHosts, name: str) -> None:
    loaded = {ln.split()[0] for ln in lab.ssh(name, ["lsmod"]).stdout.splitlines()[1:]}
    assert {"nvidia", "rpcrdma", "nvidia_fs"} <= loaded


def test_the_roles_verified_the_hardware_through_its_commands(lab: LabHosts, name: str) -> None:
    assert any("--query-gpu=" in c for c in converge_log(lab, name, "nvidia-smi"))
    assert converge_log(lab, name, "ibv_devices")
    assert any("license" in c and "nvidia" in c for c in converge_log(lab, name, "modinfo"))
