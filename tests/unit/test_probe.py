"""The probe records what a recorded host tree really contains, bounded in size and time.

The tree is built from the recorded fixtures (tests/doubles/recorded_host_double.py) and the
probe is pointed at it through its `roots` setting; tools come from tests/doubles.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "doubles"))

from old_pythons import oldest_supported_python
from recorded_host_double import (
    FIXTURES,
    NVFS_PARAM_DEFAULTS,
    TOOLS_DOUBLE_DIR,
    build_recorded_tree,
)
from vllm_http_double import VllmHttpDouble

from kvops import evidence as ev
from kvops.probe import core
from kvops.probe.bundle import INTERPRETER_ARGS, build_program
from kvops.probe.main import collect

OLDEST_PYTHON, OLDEST_VERSION = oldest_supported_python()


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Any]:
    gds = tmp_path / "gds"
    gds.mkdir()
    (gds / "chunk-0001.kvcache").write_bytes(b"x" * 1000)
    (gds / "sub").mkdir()
    (gds / "sub" / "chunk-0002.kvcache.tmp3f2a").write_bytes(b"y" * 10)
    roots = build_recorded_tree(tmp_path / "tree", gds)
    return {
        "host": "gpu-test",
        "probe_version": "test",
        "roots": roots,
        "tool_dirs": [str(TOOLS_DOUBLE_DIR)],
        "deadline_s": 30,
        "settings": {
            "gds_dir": str(gds),
            "vllm_url": "http://127.0.0.1:9",
            "vllm_service": "kvops-test-no-such.service",
            "service_user": "root",
            "role": "offload",
        },
    }


def test_document_shape_follows_the_evidence_schema(host: dict[str, Any]) -> None:
    doc = collect(host)
    assert doc["schema_version"] == ev.SCHEMA_VERSION
    assert doc["host"] == "gpu-test" and doc["error"] is None
    assert doc["settings"] == host["settings"]
    for item_id, item in doc["items"].items():
        assert item["kind"] in ev.KINDS, item_id
        assert "source" in item and "duration_s" in item, item_id
    expected = set(ev.ITEM_IDS) - {
        ev.VLLM_CONFIG_FILE,
        ev.VLLM_WRAPPER,
        ev.BENCH_DIR,
        ev.GDSIO_WRITE,
        ev.GDSIO_READ,
        ev.NVFS_STATS_BEFORE_BENCH,
        ev.NVFS_STATS_AFTER_BENCH,
    }
    assert expected <= set(doc["items"])  # every item tried; bench only when asked
    assert ev.GDSIO_WRITE not in doc["items"]
    json.dumps(doc)  # plain JSON


def test_recorded_files_are_read_verbatim_through_the_roots(host: dict[str, Any]) -> None:
    items = collect(host)["items"]
    cufile = (FIXTURES / "cufile" / "default-cufile.json").read_text()
    assert items[ev.CUFILE_JSON]["stdout"] == cufile
    assert items[ev.CUFILE_JSON]["source"].startswith(host["roots"]["etc"])
    assert "proto=rdma" in items[ev.MOUNTS]["stdout"]
    stats = (FIXTURES / "nvidia-fs" / "nvidia-docs-stats-gds1.0-16gpu-mib.txt").read_text()
    assert items[ev.NVFS_STATS]["stdout"] == stats
    assert items[ev.NVFS_PARAMS]["data"] == NVFS_PARAM_DEFAULTS
    gdscheck = items[ev.GDSCHECK]
    assert gdscheck["exit_code"] == 0 and gdscheck["source"][0].startswith(str(TOOLS_DOUBLE_DIR))
    assert "NFS" in gdscheck["stdout"]


def test_missing_files_and_tools_are_evidence_not_errors(host: dict[str, Any]) -> None:
    items = collect(host)["items"]
    assert items[ev.MODULES]["error"].startswith("ENOENT")
    assert items[ev.NVIDIA_DRIVER_VERSION]["error"].startswith("ENOENT")
    assert items[ev.NVIDIA_SMI]["exit_code"] == 127
    assert ev.item_problem(items[ev.NVIDIA_SMI]) == "command not found (exit 127)"
    assert items[ev.IOMMU]["data"] == {"group_count": 0}
    assert items[ev.HTTP_HEALTH]["http_status"] is None and items[ev.HTTP_HEALTH]["error"]
    assert items[ev.VLLM_PROCESS]["error"]


def test_rdma_devices_ports_and_netdevs_from_sysfs(host: dict[str, Any]) -> None:
    data = collect(host)["items"][ev.INFINIBAND]["data"]
    devices = {d["name"]: d for d in data["devices"]}
    assert len(devices) == 12
    port = devices["mlx5_0"]["ports"][0]
    assert port["port"] == 1 and port["state"] == "4: ACTIVE"
    assert port["netdevs"] == ["ibp12s0"]
    assert devices["mlx5_10"]["ports"][0]["state"] == "1: DOWN"
    assert port["rate"] is None  # not recorded, so not invented


def test_gds_dir_counts_bytes_temp_files_and_service_user_access(host: dict[str, Any]) -> None:
    data = collect(host)["items"][ev.GDS_DIR]["data"]
    assert data["exists"] and data["is_dir"]
    assert data["file_count"] == 2 and data["bytes"] == 1010
    assert data["tmp_file_count"] == 1 and data["tmp_files"][0].endswith(".tmp3f2a")
    assert data["free_bytes"] > 0 and data["total_bytes"] >= data["free_bytes"]
    assert data["mode"].startswith("0o") and data["owner"]
    assert data["writable_by_service_user"] is True  # root
    os.chmod(host["settings"]["gds_dir"], 0o755)
    host["settings"]["service_user"] = "nobody"
    data = collect(host)["items"][ev.GDS_DIR]["data"]
    assert data["writable_by_service_user"] is False and data["service_user"] == "nobody"


def test_storage_bench_runs_write_then_read_between_nvfs_stats(host: dict[str, Any]) -> None:
    host["settings"]["storage_bench"] = True
    host["settings"]["gdsio_args"] = {"size": "64M", "io_size": "1M", "threads": "2", "gpu": "0"}
    items = collect(host)["items"]
    write, read = items[ev.GDSIO_WRITE], items[ev.GDSIO_READ]
    assert write["exit_code"] == 0 and "IoType: WRITE XferType: GPUD" in write["stdout"]
    assert read["exit_code"] == 0 and "IoType: READ XferType: GPUD" in read["stdout"]
    argv = write["source"]
    assert argv[argv.index("-s") + 1] == "64M" and argv[argv.index("-x") + 1] == "0"
    assert argv[argv.index("-I") + 1] == "1" and read["source"][-1] == "0"
    assert items[ev.NVFS_STATS_BEFORE_BENCH]["stdout"] and items[ev.NVFS_STATS_AFTER_BENCH]
    assert not list(Path(host["settings"]["gds_dir"]).glob("kvops-gdsio*"))  # cleaned up


def test_http_endpoints_and_the_listening_process_are_recorded(host: dict[str, Any]) -> None:
    with VllmHttpDouble(health_status=503) as server:
        host["settings"]["vllm_url"] = server.url
        items = collect(host)["items"]  # processes come from the real /proc, roots or not
    assert items[ev.HTTP_HEALTH]["http_status"] == 503
    assert ev.item_problem(items[ev.HTTP_HEALTH]) == "HTTP 503"
    assert json.loads(items[ev.HTTP_MODELS]["stdout"])["data"][0]["id"] == "double-model"
    assert "vllm:num_requests_running" in items[ev.HTTP_METRICS]["stdout"]
    proc = items[ev.VLLM_PROCESS]
    assert proc["data"]["pid"] == os.getpid()
    assert proc["data"]["found_by"].startswith("listening socket")
    assert items[ev.VLLM_ENV]["data"]["from"] == "process"
    assert items[ev.VLLM_ENV]["data"]["env"].get("PATH") == os.environ["PATH"]


def test_command_timeout_kills_the_tool_and_its_children(tmp_path: Path) -> None:
    probe = core.Probe({"command_timeout_s": 0.5, "deadline_s": 30})
    start = time.monotonic()
    item = probe.command("slow", ["sh", "-c", "sleep 30 & sleep 30"])
    assert time.monotonic() - start < 5
    assert item["exit_code"] is None and "timed out" in item["error"]


def test_deadline_skips_remaining_items_instead_of_hanging(host: dict[str, Any]) -> None:
    host["deadline_s"] = 0.1
    items = collect(host)["items"]
    optional = {ev.VLLM_CONFIG_FILE, ev.VLLM_WRAPPER, ev.BENCH_DIR, ev.GDSIO_WRITE, ev.GDSIO_READ}
    assert set(ev.ITEM_IDS) - optional <= set(items) | {
        ev.NVFS_STATS_BEFORE_BENCH,
        ev.NVFS_STATS_AFTER_BENCH,
    }
    assert "deadline" in items[ev.HTTP_METRICS]["error"]


def test_outputs_are_bounded_and_marked_truncated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = tmp_path / "big"
    big.write_text("a" * 5000)
    monkeypatch.setattr(core, "FILE_LIMIT", 1000)
    monkeypatch.setattr(core, "STDOUT_LIMIT", 100)
    probe = core.Probe({})
    item = probe.file("big", str(big))
    assert len(item["stdout"]) == 1000 and item["truncated"] is True
    cmd = probe.command("yes", ["sh", "-c", "head -c 5000 /dev/zero | tr '\\0' b"])
    assert len(cmd["stdout"]) == 100 and cmd["truncated"] is True


def _run_program(python: str, config: dict[str, Any]) -> dict[str, Any]:
    """The program as it is shipped: on stdin of `python -S -` (as over SSH and locally)."""
    proc = subprocess.run(
        [python, *INTERPRETER_ARGS],
        input=build_program(config),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    doc: dict[str, Any] = json.loads(proc.stdout)  # exactly one JSON document
    return doc


def test_shipped_program_runs_as_one_stdin_program(host: dict[str, Any]) -> None:
    doc = _run_program(sys.executable, host)
    assert doc["host"] == "gpu-test" and "proto=rdma" in doc["items"][ev.MOUNTS]["stdout"]


def test_shipped_program_runs_on_the_oldest_python_here(host: dict[str, Any]) -> None:
    """Python 3.8 where installed (tests/old_pythons.py says what it falls back to)."""
    host["settings"]["storage_bench"] = True
    doc = _run_program(str(OLDEST_PYTHON), host)
    assert doc["items"][ev.GDSCHECK]["exit_code"] == 0
    assert doc["items"][ev.GDSIO_READ]["exit_code"] == 0
    assert doc["items"][ev.INFINIBAND]["data"]["devices"]


def test_gds_dir_records_the_ids_the_service_writes_with(host: dict[str, Any]) -> None:
    gds = host["settings"]["gds_dir"]
    data = collect(host)["items"][ev.GDS_DIR]["data"]
    assert (data["service_uid"], data["service_gid"]) == (0, 0)  # root
    assert (data["owner_uid"], data["owner_gid"]) == (os.stat(gds).st_uid, os.stat(gds).st_gid)
    host["settings"]["service_user"] = "kvops-no-such-user"
    data = collect(host)["items"][ev.GDS_DIR]["data"]
    assert (data["service_uid"], data["service_gid"]) == (None, None)


def test_prune_timer_is_shown_by_name_and_an_odd_name_is_refused(host: dict[str, Any]) -> None:
    item = collect(host)["items"][ev.GDS_PRUNE_TIMER]
    assert item["kind"] == ev.KIND_COMMAND and not item.get("error")
    assert item["source"][1:] == [
        "show",
        "--no-pager",
        "kvops-gds-prune.timer",
        "kvops-gds-prune.service",
        "-p",
        "Id,LoadState,UnitFileState,ActiveState,ExecStart",
    ]
    host["settings"]["gds_prune_timer"] = "--root=/tmp/x.timer"  # an option, not a unit
    item = collect(host)["items"][ev.GDS_PRUNE_TIMER]
    assert item["source"] == "" and "not a timer unit name" in item["error"]
