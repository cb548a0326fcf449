"""No parser raises, whatever the input: bad evidence must become warnings, not crashes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvops.parse.cufile import parse_cufile
from kvops.parse.gdscheck import parse_gdscheck
from kvops.parse.gdsio import parse_gdsio
from kvops.parse.ip_addr import parse_ip_addr
from kvops.parse.lmcache_config import effective_lmcache_config
from kvops.parse.mounts import parse_mounts
from kvops.parse.nvfs_stats import parse_nvfs_stats
from kvops.parse.nvidia_smi import parse_nvidia_proc_version, parse_nvidia_smi_csv
from kvops.parse.rdma_tools import parse_ibdev2netdev, parse_show_gids
from kvops.parse.topo import parse_topo

PARSERS: list[Callable[[str], Any]] = [
    parse_cufile,
    parse_gdscheck,
    parse_gdsio,
    parse_ip_addr,
    parse_mounts,
    parse_nvfs_stats,
    parse_nvidia_proc_version,
    parse_nvidia_smi_csv,
    parse_ibdev2netdev,
    parse_show_gids,
    parse_topo,
    lambda text: effective_lmcache_config(text, {"LMCACHE_" + text[:8].upper(): text}),
]
# Text built from the tokens these formats are made of, so inputs get past the first checks.
TOKENS = st.sampled_from(
    [":", "=", ",", "\n", "\t", " ", "{", "}", "[", "]", '"', "//", "GPU ", "IoType:",
     "NFS", "Reads", "n=", "Throughput:", "1", "x", "nfs4", "/", "inet", "- ", "Platform",
     ".", " GiB/sec", "XferType:", "GPU index 0 x bar:1 bar size (MiB):", " port 1 ",
     " ==> ", "(Up)", "mlx5_0", "GPU0", "NIC0", " X ", "PIX", "NV4", "Legend:",
     "NIC Legend:", "NIC0: ", "CPU Affinity", "n_gids_found=", "v2", "192.168.0.1", "0000:"]
)  # fmt: skip


@pytest.mark.parametrize("parser", PARSERS)
@settings(max_examples=60, deadline=None)
@given(text=st.one_of(st.text(max_size=300), st.lists(TOKENS, max_size=80).map("".join)))
def test_never_raises(parser: Callable[[str], Any], text: str) -> None:
    parser(text)
