"""Collect one cluster's ONTAP evidence over REST: reads only, fields chosen by release.

ONTAP answers HTTP 400 (code 262197) when `fields=` names a field its release does not have
(https://github.com/ansible-collections/netapp.ontap/issues/189), so the cluster version is
read first and the newer fields are asked for only where they exist:

- `transport.rdma_enabled` on NFS services: in the REST schema from 9.12.1 (netapp-ontap
  9.12.1.0 has it, 9.10.1.0 does not; 9.11.1 was never published) — before that RDMA on the
  SVM is a CLI-only setting and is reported as unreadable, not guessed;
- `protocol.v42_enabled`: from 9.19.1 (before, NFSv4.2 follows v4.1);
- volume `nodes`: from 9.17.1; before, the owning node comes from the volume's aggregates
  (`/api/storage/aggregates/{uuid}?fields=node`).

The result is a plain JSON document (`kind: ontap`) that the pure checks judge and that
`--save-evidence` keeps next to the hosts' documents.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

from kvops.ontap.client import OntapClient, OntapError
from kvops.ontap.target import OntapTarget

Version = tuple[int, int, int]
SCHEMA_VERSION = 1

FIELD_FLOORS: dict[str, Version] = {
    "transport.rdma_enabled": (9, 12, 1),
    "protocol.v42_enabled": (9, 19, 1),
    "volume.nodes": (9, 17, 1),
}
NFS_FIELDS = [
    "svm.name",
    "enabled",
    "state",
    "protocol.v3_enabled",
    "protocol.v40_enabled",
    "protocol.v41_enabled",
    "protocol.v41_features.pnfs_enabled",
    "transport.tcp_enabled",
]
LIF_FIELDS = "name,uuid,ip,enabled,state,services,rdma_protocols,location.home_node,location.node"
VOLUME_FIELDS = ["name", "uuid", "state", "nas.path", "nas.export_policy", "space", "aggregates"]
RULE_FIELDS = "index,clients,protocols,ro_rule,rw_rule,superuser"


def version_of(cluster: dict[str, Any]) -> Version:
    raw = cluster.get("version") or {}
    try:
        return int(raw["generation"]), int(raw["major"]), int(raw["minor"])
    except (KeyError, TypeError, ValueError):
        raise OntapError(f"ONTAP answered no version in /api/cluster: {raw!r}") from None


def has_field(version: Version, name: str) -> bool:
    return version >= FIELD_FLOORS.get(name, (0, 0, 0))


def _floor_text(name: str) -> str:
    return ".".join(str(p) for p in FIELD_FLOORS[name])


async def _volume_nodes(
    api: OntapClient, version: Version, volume: dict[str, Any]
) -> tuple[list[str], str]:
    if has_field(version, "volume.nodes"):
        return [str(n.get("name")) for n in volume.get("nodes") or []], "volume nodes"
    aggregates = [a for a in volume.get("aggregates") or [] if a.get("uuid")]
    answers = await asyncio.gather(
        *(api.get(f"storage/aggregates/{a['uuid']}", {"fields": "node"}) for a in aggregates)
    )
    nodes = [str((a.get("node") or {}).get("name")) for a in answers if a.get("node")]
    return sorted(set(nodes)), "the volume's aggregates"


async def collect(target: OntapTarget, timeout_s: float = 30.0) -> dict[str, Any]:
    """One cluster → its evidence document (see module doc). Raises OntapError."""
    async with OntapClient(target.hostname, target.credentials, target.ca_file, timeout_s) as api:
        cluster = await api.get("cluster", {"fields": "name,version"})
        version = version_of(cluster)
        nfs_fields = list(NFS_FIELDS)
        unreadable: dict[str, str] = {}
        for name in ("transport.rdma_enabled", "protocol.v42_enabled"):
            if has_field(version, name):
                nfs_fields.append(name)
            else:
                unreadable[name] = f"not in ONTAP REST before {_floor_text(name)}"
        volume_fields = [*VOLUME_FIELDS, *(["nodes"] if has_field(version, "volume.nodes") else [])]
        svm_filter = {"svm.name": target.svm}
        nodes, services, lifs, volumes = await asyncio.gather(
            api.get_all("cluster/nodes", {"fields": "name,uuid,state"}),
            api.get_all("protocols/nfs/services", {**svm_filter, "fields": ",".join(nfs_fields)}),
            api.get_all("network/ip/interfaces", {**svm_filter, "fields": LIF_FIELDS}),
            api.get_all(
                "storage/volumes",
                {**svm_filter, "name": target.volume, "fields": ",".join(volume_fields)},
            ),
        )
        volume = volumes[0] if volumes else None
        volume_nodes: list[str] = []
        nodes_source = ""
        rules: list[dict[str, Any]] | None = None
        if volume is not None:
            volume_nodes, nodes_source = await _volume_nodes(api, version, volume)
            policy_id = ((volume.get("nas") or {}).get("export_policy") or {}).get("id")
            if policy_id is not None:
                rules = await api.get_all(
                    f"protocols/nfs/export-policies/{policy_id}/rules", {"fields": RULE_FIELDS}
                )
    return {
        "kind": "ontap",
        "schema_version": SCHEMA_VERSION,
        "host": target.name,
        "hostname": target.hostname,
        "svm": target.svm,
        "volume_name": target.volume,
        "collected_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cluster": {"name": cluster.get("name"), "version": cluster.get("version")},
        "nodes": nodes,
        "nfs_service": services[0] if services else None,
        "unreadable_fields": unreadable,
        "lifs": lifs,
        "volume": volume,
        "volume_nodes": volume_nodes,
        "volume_nodes_source": nodes_source,
        "export_rules": rules,
    }
