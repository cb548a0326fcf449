"""`validate --ontap`'s collection: every `ontap` inventory host's cluster read over REST into
one evidence document, and the GPU hosts' storage addresses. The judging is
`kvops.validate.judge.judge_fleet`'s, in the same pass as the hosts'."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvops.ontap.collect import collect
from kvops.ontap.target import target_of
from kvops.remote.inventory import InventoryHost

STORAGE_ADDRESS_VAR = "kvops_storage_address"


def is_ontap_document(document: Mapping[str, Any]) -> bool:
    return document.get("kind") == "ontap"


def collect_clusters(
    hosts: Sequence[InventoryHost], ca_file: Path | None, timeout_s: float
) -> list[dict[str, Any]]:
    """One evidence document per `ontap` host, read concurrently. Raises OntapError (one
    line: credentials, certificate, privilege, address) before anything is judged."""
    targets = [target_of(h, ca_file) for h in hosts]

    async def gather() -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(collect(t, timeout_s) for t in targets)))

    return asyncio.run(gather())


def storage_addresses(hosts: Sequence[InventoryHost]) -> dict[str, str]:
    """GPU host → `kvops_storage_address` (for NFSv3 mounts, which show no clientaddr=)."""
    return {
        h.name: str(h.vars[STORAGE_ADDRESS_VAR]) for h in hosts if h.vars.get(STORAGE_ADDRESS_VAR)
    }
