"""testinfra after site.yml: /etc/cufile.json content, ownership and backup."""

from __future__ import annotations

import json

import pytest
from lab_harness import LabHosts
from site_lab import STACK, converged


@pytest.fixture(params=sorted(STACK))
def name(request: pytest.FixtureRequest, lab: LabHosts) -> str:
    converged(lab)
    return str(request.param)


def test_cufile_json_content(lab: LabHosts, name: str) -> None:
    host = lab.testinfra(name)
    f = host.file("/etc/cufile.json")
    assert f.user == "root" and f.group == "root" and f.mode == 0o644
    doc = json.loads(f.content_string)  # plain JSON: no // comments left from the package
    props = doc["properties"]
    assert props["allow_compat_mode"] is False
    assert props["rdma_dev_addr_list"] == [lab.host(name).ip]  # from eth0's facts
    assert props["max_device_cache_size_kb"] == 2097152  # cufile_overrides, merged recursively
    assert props["per_buffer_cache_size_kb"] == 16384
    assert props["max_direct_io_size_kb"] == 16384  # defaults kept beside the overrides
    assert doc["logging"] == {"level": "WARN"}
    assert set(doc) == {
        "logging",
        "profile",
        "execution",
        "properties",
        "fs",
        "denylist",
        "miscellaneous",
    }


def test_the_packaged_cufile_json_was_backed_up(lab: LabHosts, name: str) -> None:
    backups = lab.ssh(name, ["sh", "-c", "ls /etc/cufile.json.*~"], sudo=True).stdout.split()
    assert len(backups) == 1, backups
    # The backup is the file libcufile-12-9 shipped (the NVIDIA template, with comments).
    assert "CUFILE_ENV_PATH_JSON" in lab.read_file(name, backups[0])
