"""Pure judges: one evidence document → findings. No I/O, no network, no clock.

Each concern module exports CHECKS, a list of functions `Context -> list[Finding]`. Ids,
titles and default remedies live in `catalog.py`.
"""

from __future__ import annotations

from collections.abc import Callable

from kvops.checks import (
    cufile,
    driver,
    gds_dir,
    gds_platform,
    gpu_nic,
    lmcache,
    nvidia_fs,
    rdma_mount,
    rdma_path,
    storage_bench,
    vllm,
)
from kvops.checks.catalog import CATALOG, CheckInfo, catalog_rows
from kvops.checks.context import Context
from kvops.checks.model import SEVERITY_ORDER, Finding, Severity, Thresholds, finding

Check = Callable[[Context], list[Finding]]

ALL_CHECKS: list[Check] = [
    *driver.CHECKS,
    *nvidia_fs.CHECKS,
    *rdma_mount.CHECKS,
    *rdma_path.CHECKS,
    *cufile.CHECKS,
    *gds_platform.CHECKS,
    *gpu_nic.CHECKS,
    *storage_bench.CHECKS,
    *lmcache.CHECKS,
    *vllm.CHECKS,
    *gds_dir.CHECKS,
]

__all__ = [
    "ALL_CHECKS",
    "CATALOG",
    "SEVERITY_ORDER",
    "CheckInfo",
    "Context",
    "Finding",
    "Severity",
    "Thresholds",
    "catalog_rows",
    "finding",
]
