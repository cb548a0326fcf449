"""The registry of check ids: one row per id, so ids stay unique, stable and documented.

An id is never reused for a different meaning; a retired check keeps its row. Severity is
decided per run by the check; the remedy here is the default one a finding carries.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckInfo:
    check_id: str
    concern: str
    title: str
    remedy: str


_ROWS = [
    ("GDS-000", "host", "Host probed", "Fix SSH reachability/auth; rerun kvops validate."),
    (
        "GDS-001",
        "driver",
        "NVIDIA driver present and >= minimum",
        "Install or upgrade the NVIDIA driver (role nvidia_driver) to the minimum version.",
    ),
    (
        "GDS-002",
        "driver",
        "Open kernel module loaded",
        "Install the open kernel module flavour (nvidia-open / nvidia-driver-*-open): "
        "nvidia-fs >= 2.17.5 works only with it.",
    ),
    (
        "GDS-010",
        "nvidia_fs",
        "nvidia_fs module loaded",
        "Install nvidia-fs (nvidia-fs-dkms) and `modprobe nvidia_fs` (role nvidia_fs).",
    ),
    (
        "GDS-011",
        "nvidia_fs",
        "nvidia_fs version >= minimum",
        "Upgrade nvidia-fs to at least the minimum version gdscheck requires.",
    ),
    (
        "GDS-012",
        "nvidia_fs",
        "Mellanox PeerDirect enabled",
        "Install MOFED/DOCA-OFED before nvidia-fs; if it was installed after, reinstall "
        "nvidia-fs so it builds against it (NVIDIA GDS TSG §12.18).",
    ),
    (
        "GDS-020",
        "rdma_mount",
        "GDS directory on an NFS mount",
        "Mount the ONTAP export on the GDS directory (role nfs_rdma_mount).",
    ),
    (
        "GDS-021",
        "rdma_mount",
        "NFS mount uses proto=rdma",
        "Remount with `proto=rdma,port=20049`; check rpcrdma, the RDMA LIF "
        "(`-rdma-protocols roce`) and that the SVM has RDMA enabled.",
    ),
    (
        "GDS-022",
        "rdma_mount",
        "NFS version supported over RDMA",
        "Use vers=3 (ONTAP 9.15.1+), 4.0 (9.10.1+) or 4.1 (9.14.1+) for NFS over RDMA.",
    ),
    ("GDS-023", "rdma_mount", "NFS mount is hard", "Mount with `hard` (soft mounts lose IO)."),
    (
        "GDS-024",
        "rdma_mount",
        "NFS rsize/wsize large enough",
        "Mount with rsize/wsize of at least the configured minimum (e.g. 262144).",
    ),
    (
        "GDS-025",
        "rdma_mount",
        "rpcrdma module loaded",
        "`modprobe rpcrdma` and persist it in /etc/modules-load.d (role rdma_client).",
    ),
    (
        "GDS-026",
        "rdma_mount",
        "RDMA device with an active port",
        "Check cabling/switch and `ibdev2netdev`; bring the RDMA port up.",
    ),
    (
        "GDS-027",
        "rdma_mount",
        "RDMA port carrying the NFS/RDMA mount is up",
        "Bring up the port that holds the mount's clientaddr (cabling, switch port, "
        "`ip link set <netdev> up`), or move the address to an RDMA port that is up and remount.",
    ),
    (
        "GDS-028",
        "rdma_mount",
        "RoCE v2 GID for each RDMA IPv4 address",
        "Use RoCE v2 (ONTAP NFS/RDMA runs RoCE v2 on ConnectX-5/6): firmware and driver with "
        "RoCE v2 enabled until `show_gids` lists a v2 GID for the address, and "
        "`cma_roce_mode -d <dev> -p <port> -m 2` where rdma_cm defaults to v1.",
    ),
    (
        "GDS-030",
        "cufile",
        "cufile.json present and parses",
        "Fix the syntax at the reported line/column (JSON with // comments; role cufile).",
    ),
    (
        "GDS-031",
        "cufile",
        "cufile.json keys known to libcufile",
        "Rename each unknown key to the suggested one: libcufile ignores keys it does not know.",
    ),
    (
        "GDS-032",
        "cufile",
        "cuFile compat mode off",
        "Set properties.allow_compat_mode false (and force_compat_mode false) so a broken GDS "
        "path fails loudly instead of falling back to POSIX IO.",
    ),
    (
        "GDS-033",
        "cufile",
        "rdma_dev_addr_list names this host's RDMA addresses",
        "List only addresses configured on this host's RDMA interfaces (or leave it empty).",
    ),
    (
        "GDS-034",
        "cufile",
        "max_direct_io_size_kb multiple of 64",
        "Set properties.max_direct_io_size_kb to a multiple of 64 (default 16384).",
    ),
    (
        "GDS-040",
        "gds_platform",
        "gdscheck: NFS through nvidia-fs",
        "Fix nvidia_fs/rpcrdma/MOFED until `gdscheck -p` shows NFS as Supported or nvfs.",
    ),
    (
        "GDS-041",
        "gds_platform",
        "gdscheck: platform verification succeeded",
        "Read the gdscheck -p output and fix the reported platform problem.",
    ),
    (
        "GDS-042",
        "gds_platform",
        "IOMMU off or pass-through",
        "Boot with intel_iommu=off/amd_iommu=off (or iommu=pt) and disable PCIe ACS.",
    ),
    (
        "GDS-043",
        "gds_platform",
        "GPU and its storage RDMA NIC under the same PCIe switch",
        "Give each GPU the RDMA NIC that carries its storage traffic (the NFS/RDMA mount's "
        "clientaddr) under its PCIe switch (nvidia-smi topo -mp: PIX or PXB): mount through a "
        "NIC behind the GPU's switch, or move the NIC to such a slot; where the platform has "
        "none, set properties.rdma_dynamic_routing true and list the nearest NICs' addresses "
        "in fs.nfs.rdma_dev_addr_list (or fs.nfs.mount_table.<mount>.rdma_dev_addr_list).",
    ),
    (
        "GDS-044",
        "gds_platform",
        "PCIe ACS does not redirect peer-to-peer traffic",
        "Disable ACS redirect on the ports between GPU and NIC: kernel parameter "
        "`pci=disable_acs_redir=<bdf>;...` (or `setpci` at boot); NVIDIA GDS "
        "Troubleshooting Guide, PCIe ACS.",
    ),
    (
        "GDS-050",
        "storage_bench",
        "gdsio GPU-direct throughput vs RDMA link rate",
        "Check NIC/GPU PCIe placement (nvidia-smi topo -mp), mount options, ONTAP LIF "
        "locality and jumbo frames/PFC.",
    ),
    (
        "GDS-051",
        "storage_bench",
        "nvidia-fs counters rise during gdsio",
        "IO bypassed nvidia-fs (compat/POSIX mode): fix the GDS path until the counters rise.",
    ),
    (
        "GDS-060",
        "lmcache",
        "LMCache gds_path set and on the RDMA mount",
        "Set gds_path to a directory on the NFS/RDMA mount (role vllm_lmcache).",
    ),
    (
        "GDS-061",
        "lmcache",
        "LMCache buffer-size key matches the installed version",
        "Use cufile_buffer_size for LMCache <= 0.4.3 and gds_buffer_size for >= 0.4.4.",
    ),
    (
        "GDS-062",
        "lmcache",
        "Stable chunk hash across restarts",
        "Set PYTHONHASHSEED=0 in the service env or pre_caching_hash_algorithm: sha256_cbor.",
    ),
    (
        "GDS-063",
        "lmcache",
        "PROMETHEUS_MULTIPROC_DIR set",
        "Set PROMETHEUS_MULTIPROC_DIR in the service env and wipe it before each start.",
    ),
    (
        "GDS-064",
        "lmcache",
        "LMCache config keys known",
        "Fix or remove keys LMCache does not know: it ignores them silently.",
    ),
    (
        "GDS-065",
        "lmcache",
        "LMCache settings keep the GDS backend on",
        "Set use_gds: true (LMCache reads only true/1 as true), gds_backend: cufile, a "
        "positive chunk_size and a bool extra_config.use_direct_io.",
    ),
    (
        "GDS-066",
        "lmcache",
        "Service log free of LMCache fallback and ignored-setting warnings",
        "Fix what the quoted log lines name: for degraded mode, the first LMCache ERROR of the "
        "start says why (a cuFile registration error, a gds_path that is not on the RDMA mount, "
        "a missing library); rebuild or reinstall LMCache against the installed torch "
        "(`python -c 'import torch, lmcache.cuda_ops'` must work), rename or remove ignored "
        "keys, and restart the service.",
    ),
    (
        "GDS-070",
        "vllm",
        "vLLM healthy",
        "Check `systemctl status` and `journalctl -u` of the vLLM service.",
    ),
    (
        "GDS-071",
        "vllm",
        "Expected model served",
        "Start vLLM with the expected model / --served-model-name.",
    ),
    (
        "GDS-072",
        "vllm",
        "--kv-transfer-config names LMCacheConnectorV1 on offload hosts",
        "Start vLLM with --kv-transfer-config "
        '\'{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}\' (offload variant).',
    ),
    (
        "GDS-073",
        "vllm",
        "/metrics exposes vLLM (and LMCache) metrics",
        "Set the same PROMETHEUS_MULTIPROC_DIR for vLLM and LMCache; on an offload_mp host "
        "set kvops_lmcache_server_service/_url and check the LMCache server unit.",
    ),
    (
        "GDS-080",
        "gds_dir",
        "GDS directory exists and is writable by the service user",
        "Create the directory and give the service user write access (role vllm_lmcache).",
    ),
    (
        "GDS-081",
        "gds_dir",
        "No leftover temp files in the GDS directory",
        "Stop vLLM and remove the stray *.tmp* files (interrupted LMCache writes).",
    ),
    (
        "GDS-082",
        "gds_dir",
        "Free space above threshold",
        "Free space on the export (LMCache's GDS backend never evicts) or grow the volume.",
    ),
    (
        "GDS-083",
        "gds_dir",
        "GDS directory's file system below the fill threshold",
        "Prune the store (`kvops gds prune DIR --max-bytes SIZE`, or the role's timer: "
        "vllm_lmcache_prune_host, vllm_lmcache_prune_max_bytes) or grow the volume; LMCache's "
        "GDS backend never evicts.",
    ),
    # GDS-09x: judged across hosts (kvops/checks/shared_store.py): the offload hosts whose GDS
    # directory is one directory on one export.
    (
        "GDS-090",
        "shared_store",
        "Hosts sharing a GDS directory agree on what the chunk keys hold",
        "Give every host that shares the directory the same --model string, LMCache "
        "chunk_size, pre_caching_hash_algorithm, PYTHONHASHSEED and service uid/gid (role "
        "vllm_lmcache from one inventory group), or give each setup its own directory "
        "(vllm_lmcache_gds_store: one per model revision, KV dtype and TP layout).",
    ),
    (
        "GDS-091",
        "shared_store",
        "No LMCache local_disk path shared between hosts",
        "Point each host's local_disk at local storage (or drop it): LMCache's local_disk "
        "backend writes its files in place, indexes only its own and deletes them on eviction; "
        "share KV through the GDS directory instead.",
    ),
    (
        "GDS-092",
        "shared_store",
        "A host prunes each GDS directory",
        "Name one host per directory in vllm_lmcache_prune_host with a budget "
        "(vllm_lmcache_prune_max_bytes / _max_age) and rerun playbooks/deploy.yml; its "
        "kvops-gds-prune.timer runs `kvops gds prune`.",
    ),
    # GDS-2xx: `kvops smoke`, judged on a running engine (kvops/smoke/judge.py), not on a probe.
    (
        "GDS-200",
        "smoke",
        "Engine has a KV offload tier",
        "Start the engine with --kv-transfer-config naming a KV connector (LMCacheConnectorV1) "
        "and its LMCache config (role vllm_lmcache); check its log for connector errors.",
    ),
    (
        "GDS-201",
        "smoke",
        "Prompt left GPU memory before the re-send",
        "Start vLLM with VLLM_SERVER_DEV_MODE=1 so POST /reset_prefix_cache is served, or use "
        "--evict fillers on an engine whose /metrics report its KV capacity.",
    ),
    (
        "GDS-202",
        "smoke",
        "LMCache stored the prompt",
        "Read LMCache's log for store errors; check gds_path is on the mount and writable by "
        "the service user (kvops validate GDS-060, GDS-080).",
    ),
    (
        "GDS-203",
        "smoke",
        "vLLM got prefix-cache hits from the connector",
        "Nothing came back from the offload tier: read the connector's log for retrieve errors "
        "and check the stored chunks are still in the storage directory.",
    ),
    (
        "GDS-204",
        "smoke",
        "LMCache retrieved the prompt",
        "Read LMCache's log for retrieve errors; chunk keys must be stable across processes "
        "(kvops validate GDS-062).",
    ),
    (
        "GDS-205",
        "smoke",
        "Re-send TTFT clearly lower than cold",
        "Retrieval is no faster than recompute here: measure the storage path (kvops validate "
        "--storage-bench) and check GDS is not in compat mode (GDS-032, GDS-040).",
    ),
    (
        "GDS-206",
        "smoke",
        "New chunk files in the storage directory",
        "Point --gds-dir at the engine's gds_path as seen from here; check the mount and the "
        "service user's write access (kvops validate GDS-060, GDS-080).",
    ),
    (
        "GDS-207",
        "smoke",
        "Offloaded KV gives the answer computed from scratch",
        "The KV the offload tier returned is not the KV vLLM computed: every host sharing "
        "gds_path must run the same model, dtype, tensor-parallel size and LMCache chunk size; "
        "LMCache must be the release built for this vLLM (its KV layout); clear gds_path of "
        "chunk files written by another setup, restart the service and run the smoke again.",
    ),
    (
        "GDS-208",
        "smoke",
        "Service log free of LMCache degraded mode and ignored settings",
        "Fix what the quoted log lines name: for degraded mode, the first LMCache ERROR of this "
        "start says why (a cuFile registration error, a gds_path not on the RDMA mount, a "
        "missing library); restart the service and give smoke this start's log "
        "(journalctl -o cat _SYSTEMD_INVOCATION_ID=$(systemctl show -p InvocationID --value "
        "UNIT) > log).",
    ),
]

_ROWS += [  # The ONTAP side (`kvops validate --ontap`, kvops/checks/ontap.py).
    (
        "ONT-000",
        "ontap",
        "ONTAP cluster read over REST",
        "Check the management address, credentials and the REST role (README: ONTAP).",
    ),
    (
        "ONT-001",
        "ontap",
        "ONTAP release serves the mounted NFS version over RDMA",
        "Upgrade ONTAP (NFSv4.0 over RDMA 9.10.1+, v4.1 9.14.1+, v3 9.15.1+) or mount a "
        "version the release serves (nfs_rdma_mount_nfs_version).",
    ),
    (
        "ONT-002",
        "ontap",
        "SVM NFS service enabled with RDMA",
        "Enable NFS and RDMA on the SVM: role ontap_export (ontap_export_rdma: true), or "
        "`vserver nfs modify -vserver <svm> -rdma enabled`.",
    ),
    (
        "ONT-003",
        "ontap",
        "Mounted NFS versions enabled on the SVM",
        "Enable the version on the SVM (ontap_export_nfs_versions) or mount an enabled one.",
    ),
    (
        "ONT-005",
        "ontap",
        "KV-cache volume present and online",
        "Create the volume (role ontap_export) or set ontap_export_volume_name to its name.",
    ),
    (
        "ONT-010",
        "ontap",
        "Data LIF with RoCE on the volume's node",
        "Add `roce` to the data LIFs' rdma_protocols (ontap_export_rdma_lifs), one on each node "
        "that owns the volume, on RoCE-capable ports.",
    ),
    (
        "ONT-011",
        "ontap",
        "Host mounts a RoCE LIF on the volume's node",
        "Mount the address of a RoCE LIF on the node that owns the volume "
        "(nfs_rdma_mount_export_address).",
    ),
    (
        "ONT-020",
        "ontap",
        "Export policy admits the host read-write with sys",
        "Add the host's storage address to ontap_export_clients (rule rw_rule/ro_rule sys, "
        "superuser none, protocols nfs) and rerun playbooks/ontap.yml.",
    ),
    (
        "ONT-030",
        "ontap",
        "Mount source equals the volume's junction path",
        "Mount <LIF>:<junction path> (nfs_rdma_mount_export_path = ontap_export_junction_path).",
    ),
    (
        "ONT-031",
        "ontap",
        "KV-cache volume free space above threshold",
        "Grow the volume (ontap_export_size_gib) or clear old KV chunks: LMCache's GDS backend "
        "never evicts.",
    ),
    (
        "ONT-040",
        "ontap",
        "Host mount uses pNFS when the SVM offers it",
        "Mount with vers=4.1 after pNFS is enabled (remount: layouts are negotiated at mount), "
        "on a kernel with the NFSv4.1 files layout driver (nfs_layout_nfsv41_files).",
    ),
]

CATALOG: dict[str, CheckInfo] = {row[0]: CheckInfo(*row) for row in _ROWS}


def validate_check_ids() -> set[str]:
    """The ids `kvops validate` judges on each GPU host alone: every concern but `smoke`
    (judged by `kvops smoke`), `ontap` (judged per cluster and host by `kvops validate
    --ontap`) and `shared_store` (judged across the fleet's hosts: `fleet_check_ids`)."""
    return {
        key for key, info in CATALOG.items() if info.concern not in ("smoke", "ontap", SHARED_STORE)
    }


SHARED_STORE = "shared_store"


def fleet_check_ids() -> set[str]:
    """The ids judged across hosts (`judge_fleet`): every offload host gets one of each."""
    return {key for key, info in CATALOG.items() if info.concern == SHARED_STORE}


def catalog_rows() -> list[CheckInfo]:
    """All checks in id order (for docs and `--list-checks`)."""
    return [CATALOG[key] for key in sorted(CATALOG)]


def catalog_markdown() -> str:
    """The catalog as a Markdown table, for docs and support answers."""
    lines = ["| id | concern | check | remedy when it fails |", "|---|---|---|---|"]
    for row in catalog_rows():
        remedy = row.remedy.replace("|", "\\|")
        lines.append(f"| {row.check_id} | {row.concern} | {row.title} | {remedy} |")
    return "\n".join(lines) + "\n"
