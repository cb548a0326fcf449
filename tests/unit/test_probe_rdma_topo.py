"""The probe records `ibdev2netdev`, `show_gids` and `nvidia-smi topo -mp` as command items
(argv, exit code, bounded output, duration); a missing tool is exit 127, and a hung nvidia-smi
is not asked a second time.

The tools are TEST DOUBLES written by `tool_doubles` below into a temporary folder: each prints
the recorded real output of tests/fixtures/misc/ (without the copied prompt line). The host
tree is tests/doubles/recorded_host_double.py's, as in test_probe.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "doubles"))

from old_pythons import oldest_supported_python
from recorded_host_double import FIXTURES, build_recorded_tree

from kvops import evidence as ev
from kvops.parse.rdma_tools import parse_ibdev2netdev, parse_show_gids
from kvops.parse.topo import parse_topo
from kvops.probe import core, system
from kvops.probe.bundle import build_program
from kvops.probe.main import collect

OLDEST_PYTHON, _ = oldest_supported_python()
RECORDED = {
    "ibdev2netdev": "misc/ibdev2netdev-dgx-a100-nvidia-docs.txt",
    "show_gids": "misc/show_gids-mlx5.txt",
    "nvidia-smi": "misc/nvidia-smi-topo-mp-l40s-r760xa.txt",
}


def recorded_output(tool: str) -> str:
    """The tool's recorded stdout: the fixture without its first line (the shell prompt)."""
    return (FIXTURES / RECORDED[tool]).read_text().split("\n", 1)[1]


def tool_doubles(folder: Path, hang_query_s: float = 0.0) -> Path:
    """Write the doubles. nvidia-smi answers only `topo -mp` (recorded); any other call
    fails, or sleeps `hang_query_s` first (a hung driver)."""
    folder.mkdir()
    for tool in RECORDED:
        (folder / f"{tool}.out").write_text(recorded_output(tool))
    script = {
        "ibdev2netdev": f'#!/bin/sh\n# TEST DOUBLE\nexec cat "{folder}/ibdev2netdev.out"\n',
        "show_gids": f'#!/bin/sh\n# TEST DOUBLE\nexec cat "{folder}/show_gids.out"\n',
        "nvidia-smi": (
            "#!/bin/sh\n# TEST DOUBLE: only `topo -mp` is recorded\n"
            f'if [ "$1 $2" = "topo -mp" ]; then exec cat "{folder}/nvidia-smi.out"; fi\n'
            f"sleep {hang_query_s}\necho 'double: not recorded' >&2\nexit 9\n"
        ),
    }
    for tool, text in script.items():
        path = folder / tool
        path.write_text(text)
        path.chmod(0o755)
    return folder


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Any]:
    gds = tmp_path / "gds"
    gds.mkdir()
    return {
        "host": "gpu-test",
        "probe_version": "test",
        "roots": build_recorded_tree(tmp_path / "tree", gds),
        "tool_dirs": [str(tool_doubles(tmp_path / "tools"))],
        "deadline_s": 30,
        "settings": {"gds_dir": str(gds), "vllm_url": "http://127.0.0.1:9", "role": "none"},
    }


def test_tools_are_recorded_as_command_items(host: dict[str, Any]) -> None:
    items = collect(host)["items"]
    tools = Path(host["tool_dirs"][0])
    ib = items[ev.IBDEV2NETDEV]
    assert ib["kind"] == "command" and ib["source"] == [str(tools / "ibdev2netdev")]
    assert ib["exit_code"] == 0 and ib["stdout"] == recorded_output("ibdev2netdev")
    assert isinstance(ib["duration_s"], float) and ib["stderr"] == ""
    links = parse_ibdev2netdev(ib["stdout"]).links
    assert len(links) == 12 and links[2].netdev == "ibp225s0f0" and not links[2].up
    gids = items[ev.SHOW_GIDS]
    assert gids["exit_code"] == 0 and parse_show_gids(gids["stdout"]).n_gids_found == 4
    topo = items[ev.NVIDIA_SMI_TOPO]
    assert topo["source"] == [str(tools / "nvidia-smi"), "topo", "-mp"]
    assert topo["exit_code"] == 0 and parse_topo(topo["stdout"]).nic_name("NIC9") == "mlx5_9"
    assert items[ev.NVIDIA_SMI]["exit_code"] == 9  # the query is a different call


def test_missing_tools_are_exit_127_evidence(
    host: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    host["tool_dirs"] = []
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(core, "SYSTEM_DIRS", ())
    items = collect(host)["items"]
    for item_id, tool in (
        (ev.IBDEV2NETDEV, "ibdev2netdev"),
        (ev.SHOW_GIDS, "show_gids"),
        (ev.NVIDIA_SMI_TOPO, "nvidia-smi"),
    ):
        item = items[item_id]
        assert item["exit_code"] == 127 and item["stderr"].startswith(f"{tool}: not found in ")
        assert ev.item_problem(item) == "command not found (exit 127)"  # type: ignore[arg-type]


def test_topo_is_not_run_after_nvidia_smi_timed_out(tmp_path: Path) -> None:
    tools = tool_doubles(tmp_path / "hung", hang_query_s=30)
    probe_config = {"tool_dirs": [str(tools)], "command_timeout_s": 0.5, "deadline_s": 30}
    probe = core.Probe(probe_config)
    start = time.monotonic()
    probe.command("nvidia_smi", ["nvidia-smi", system.NVIDIA_SMI_QUERY, "--format=csv"])
    system.nvidia_topo(probe)
    assert time.monotonic() - start < 10
    assert "timed out" in probe.items["nvidia_smi"]["error"]
    topo = probe.items["nvidia_smi_topo"]
    assert topo["kind"] == "command" and topo["source"] == ["nvidia-smi", "topo", "-mp"]
    assert topo["error"].startswith("skipped: nvidia-smi timed out")
    assert "exit_code" not in topo and topo["duration_s"] == 0.0


def test_shipped_program_records_the_tools_on_the_oldest_python_here(
    host: dict[str, Any],
) -> None:
    proc = subprocess.run(
        [str(OLDEST_PYTHON), "-"],
        input=build_program(host),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    items = json.loads(proc.stdout)["items"]
    assert items[ev.IBDEV2NETDEV]["stdout"] == recorded_output("ibdev2netdev")
    assert items[ev.SHOW_GIDS]["exit_code"] == 0
    assert items[ev.NVIDIA_SMI_TOPO]["stdout"] == recorded_output("nvidia-smi")
