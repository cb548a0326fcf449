"""Evidence documents built from recorded real tool outputs (tests/fixtures/), for checks tests
and for the saved bundles under tests/fixtures/evidence/ (`--from-evidence` tests).

Which parts are recorded and which are made up here:
- recorded verbatim: gdscheck -p, gdsio result lines, nvidia-fs stats, the ONTAP NFS/RDMA
  mount line, the default cufile.json template (see each fixture folder's README); the
  L40S `nvidia-smi topo -mp` (GPU0 NODE to every NIC) of the `nic-across-host-bridge` host.
- derived from a recording by a stated text edit: cufile.json with allow_compat_mode false,
  nvidia-fs stats after a bench (counters raised), a TCP-fallback mount line; `nvidia-smi
  topo -mp` with GPU0 moved under the PCIe switch of NIC1-NIC9 (its NODE links to them made
  PIX); `show_gids` with its IPv4 GIDs moved from 192.168.10.2 to the mount's clientaddr
  192.168.10.30 (the two recordings come from different pods of the same cluster).
- synthetic (no public recording was found): nvidia-smi CSV, /proc/driver/nvidia/version,
  /proc/modules, sysfs infiniband/IOMMU data, `ip -o addr`, `ibdev2netdev` (one line in the
  recorded format for the sysfs model's mlx5_3/net1; `storage-nic-far` renames that port
  mlx5_0 and adds a compute port mlx5_1/eth1), the vLLM unit/env/process, the
  LMCache YAML, HTTP bodies and the GDS directory summary. They follow the formats named in
  kvops/evidence.py ITEM_SOURCES and are marked `"synthetic": true` in the item.

`python tests/evidence_builders.py` rewrites tests/fixtures/evidence/; a unit test checks the
saved files still equal what the builders produce.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"
EVIDENCE_DIR = FIXTURES / "evidence"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
GDS_DIR = "/mnt/lmcache"


def fixture(relative: str) -> str:
    return (FIXTURES / relative).read_text(encoding="utf-8")


def command(argv: list[str], stdout: str, exit_code: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "command",
        "source": argv,
        "exit_code": exit_code,
        "stdout": stdout,
        "stderr": "",
        "truncated": False,
        "duration_s": 0.05,
        "error": None,
        **extra,
    }


def file_item(path: str, stdout: str, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "file",
        "source": path,
        "exit_code": None,
        "stdout": stdout,
        "stderr": "",
        "truncated": False,
        "duration_s": 0.001,
        "error": None,
        **extra,
    }


def data_item(kind: str, source: str, data: dict[str, Any]) -> dict[str, Any]:
    item = file_item(source, "", synthetic=True)
    item.update(kind=kind, data=data)
    return item


def http_item(url: str, status: int | None, body: str) -> dict[str, Any]:
    item = file_item(url, body, synthetic=True)
    item.update(kind="http", http_status=status)
    return item


NVIDIA_SMI_CSV = (
    "index, name, driver_version, persistence_mode, pci.bus_id, memory.total [MiB]\n"
    "0, NVIDIA L40S, 570.124.06, Enabled, 00000000:4A:00.0, 46068 MiB\n"
)
PROC_OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Fri Mar 14 2025\nGCC version:  gcc version 11.5.0\n"
)
PROC_PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.124.06  Fri Mar 14 2025\n"
    "GCC version:  gcc version 11.5.0\n"
)
PROC_MODULES = (
    "nvidia_fs 286720 0 - Live 0x0000000000000000 (OE)\n"
    "rpcrdma 409600 1 - Live 0x0000000000000000\n"
    "nvidia_uvm 4956160 0 - Live 0x0000000000000000 (OE)\n"
    "nvidia 9789440 3 nvidia_fs,nvidia_uvm, Live 0x0000000000000000 (OE)\n"
    "mlx5_ib 483328 0 - Live 0x0000000000000000\n"
)
LMCACHE_YAML = f"chunk_size: 256\nlocal_cpu: false\ngds_path: {GDS_DIR}\ngds_buffer_size: 8192\n"
METRICS = (
    "# TYPE vllm:num_requests_running gauge\n"
    f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 0.0\n'
    "# TYPE lmcache:retrieve_hit_rate gauge\n"
    'lmcache:retrieve_hit_rate{model_name="x",worker_id="0"} 0.0\n'
)
# LMCache's log format ("[time] LMCache LEVEL: message (file:line:module)"); the messages are
# the ones lmcache 0.5.6 logs (deploy notes §0.3, §2.2, §2.4).
JOURNAL = (
    "[2026-12-02 13:59:01,100] LMCache INFO: Loading LMCache config file /etc/lmcache/gds.yaml "
    "(utils.py:60:lmcache.integration.vllm.utils)\n"
    "[2026-12-02 13:59:03,200] LMCache INFO: Using GDS backend 'cufile' "
    "(gds_backend.py:290:lmcache.v1.storage_backend.gds_backend)\n"
)
TORCH_FALLBACK_LINE = (
    "[2026-12-02 13:59:02,150] LMCache WARNING: lmcache.cuda_ops compiled extension not found; "
    "CudaDeviceOps stays on the torch baseline for all ops. "
    "(device_ops.py:131:lmcache.v1.platform.devices.cuda.device_ops)\n"
)
# `lspci -vvv` kept to headers and ACS lines, in lspci's format (synthetic: a PCIe switch
# downstream port with ACS but no redirect, the GPU and the NIC under it).
LSPCI_ACS = (
    "17:02.0 PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0)\n"
    "\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+\n"
    "\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-\n"
    "18:00.0 3D controller: NVIDIA Corporation Device 2330 (rev a1)\n"
    "19:00.0 Ethernet controller: Mellanox Technologies MT2910 Family [ConnectX-7]\n"
)
KV_TRANSFER = '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'


def _cufile(allow_compat: bool = False) -> str:
    text = fixture("cufile/default-cufile.json")
    if not allow_compat:
        text = text.replace('"allow_compat_mode": true', '"allow_compat_mode": false')
    return text


def _nvfs_after_bench() -> str:
    """The recorded stats with the read/write counters raised as a GDS run would raise them."""
    text = fixture("nvidia-fs/nvidia-docs-stats-gds1.0-16gpu-mib.txt")
    text = text.replace("Reads : n=0 ok=0", "Reads : n=312794 ok=312794")
    return text.replace("Writes : n=0 ok=0", "Writes : n=312794 ok=312794")


TOPO_FIXTURE = "misc/nvidia-smi-topo-mp-l40s-r760xa.txt"
SHOW_GIDS_FIXTURE = "misc/show_gids-mlx5.txt"


def _topo_gpu_under_nic_switch() -> str:
    """The recorded L40S matrix with GPU0 behind the switch NIC1-NIC9 share (PIX), the
    placement GDS wants; NIC0 stays NODE."""
    out = []
    for line in fixture(TOPO_FIXTURE).splitlines(keepends=True):
        fields = line.split("\t")
        if fields[0] == "GPU0":
            fields[3:12] = ["PIX"] * 9
        elif fields[0] in {f"NIC{n}" for n in range(1, 10)}:
            fields[1] = "PIX"
        out.append("\t".join(fields))
    return "".join(out)


def _show_gids_at_clientaddr() -> str:
    text = fixture(SHOW_GIDS_FIXTURE).replace("c0a8:0a02", "c0a8:0a1e")
    return text.replace("192.168.10.2 ", "192.168.10.30")


# `systemctl show` of the role's prune timer and its service, in systemd's KEY=VALUE form
# (ExecStart as systemd prints an exec command line: `{ path=... ; argv[]=... ; ... }`).
PRUNE_SHOW = ["systemctl", "show", "--no-pager"]
PRUNE_TIMER = "kvops-gds-prune.timer"
PRUNE_SERVICE = "kvops-gds-prune.service"
PRUNE_PROPERTIES = "Id,LoadState,UnitFileState,ActiveState,ExecStart"
PRUNE_ARGV = f"/opt/kvops/vllm-venv/bin/kvops gds prune {GDS_DIR} --max-bytes 800G"


def prune_show(active: bool, directory: str = GDS_DIR) -> str:
    """The timer and service blocks on the pruning host (active) or on a host the role left
    without a timer (not-found: the units do not exist there)."""
    if not active:
        return (
            f"Id={PRUNE_TIMER}\nLoadState=not-found\nUnitFileState=\nActiveState=inactive\n\n"
            f"Id={PRUNE_SERVICE}\nLoadState=not-found\nUnitFileState=\nActiveState=inactive\n"
            "ExecStart=\n"
        )
    argv = PRUNE_ARGV.replace(GDS_DIR, directory)
    return (
        f"Id={PRUNE_TIMER}\nLoadState=loaded\nUnitFileState=enabled\nActiveState=active\n\n"
        f"Id={PRUNE_SERVICE}\nLoadState=loaded\nUnitFileState=static\nActiveState=inactive\n"
        f"ExecStart={{ path=/opt/kvops/vllm-venv/bin/kvops ; argv[]={argv} ; "
        "ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; "
        "status=0/0 }\n"
    )


def healthy() -> dict[str, Any]:
    """The NetApp ONTAP NFSv4.1/RDMA host (L40S, OpenShift recording) set up as kvops wants."""
    gdsio = fixture("gdsio/openshift-l40s-netapp-nfs-rdma.txt").splitlines()
    write_lines = "\n".join(gdsio[-2:]) + "\n"  # the `-i 1M -x 0 -I 1` run
    read_lines = "\n".join(gdsio[2:4]) + "\n"  # the `-i 4K -x 0 -I 2` run
    items: dict[str, Any] = {
        "uname": command(["uname", "-srm"], "Linux 5.14.0-427.65.1.el9_4.x86_64 x86_64\n"),
        "nvidia_smi": command(["nvidia-smi", "--query-gpu=...", "--format=csv"], NVIDIA_SMI_CSV),
        "nvidia_driver_version": file_item("/proc/driver/nvidia/version", PROC_OPEN),
        "modules": file_item("/proc/modules", PROC_MODULES, synthetic=True),
        "nvfs_version": file_item("/proc/driver/nvidia-fs/version", "version: 2.20\n"),
        "nvfs_stats": file_item(
            "/proc/driver/nvidia-fs/stats",
            fixture("nvidia-fs/nvidia-docs-stats-gds1.0-16gpu-mib.txt"),
        ),
        "infiniband": data_item(
            "sysfs",
            "/sys/class/infiniband",
            {
                "devices": [
                    {
                        "name": "mlx5_3",
                        "ports": [
                            {
                                "port": 1,
                                "state": "4: ACTIVE",
                                "phys_state": "5: LinkUp",
                                "rate": "25 Gb/sec (1X EDR)",
                                "link_layer": "Ethernet",
                                "netdevs": ["net1"],
                            }
                        ],
                    }
                ]
            },
        ),
        "ibdev2netdev": command(["ibdev2netdev"], "mlx5_3 port 1 ==> net1 (Up)\n", synthetic=True),
        "show_gids": command(["show_gids"], _show_gids_at_clientaddr()),
        "ip_addr": command(
            ["ip", "-o", "addr", "show"],
            "1: lo    inet 127.0.0.1/8 scope host lo\n"
            "5: net1    inet 192.168.10.30/24 brd 192.168.10.255 scope global net1\n",
            synthetic=True,
        ),
        "mounts": file_item("/proc/mounts", fixture("misc/mount-nfs4-rdma-netapp-ontap.txt")),
        "cmdline": file_item(
            "/proc/cmdline", "BOOT_IMAGE=(hd0,gpt2)/vmlinuz root=/dev/sda3 ro\n", synthetic=True
        ),
        "iommu": data_item("sysfs", "/sys/kernel/iommu_groups", {"group_count": 0}),
        "pci_acs": command(["lspci", "-vvv"], LSPCI_ACS, filtered="device headers and ACS lines"),
        "nvidia_smi_topo": command(["nvidia-smi", "topo", "-mp"], _topo_gpu_under_nic_switch()),
        "cufile_json": file_item("/etc/cufile.json", _cufile()),
        "gdscheck": command(
            ["/usr/local/cuda/gds/tools/gdscheck", "-p"],
            fixture("gdscheck/openshift-l40s-netapp-nfs-rdma-supported.txt"),
        ),
        "nvfs_stats_before_bench": file_item(
            "/proc/driver/nvidia-fs/stats",
            fixture("nvidia-fs/nvidia-docs-stats-gds1.0-16gpu-mib.txt"),
        ),
        "gdsio_write": command(["gdsio", "-D", f"{GDS_DIR}/kvops-gdsio", "-x", "0"], write_lines),
        "gdsio_read": command(["gdsio", "-D", f"{GDS_DIR}/kvops-gdsio", "-x", "0"], read_lines),
        "nvfs_stats_after_bench": file_item("/proc/driver/nvidia-fs/stats", _nvfs_after_bench()),
        "vllm_unit": command(
            ["systemctl", "cat", "vllm.service"],
            f"[Service]\nExecStart=/opt/vllm/bin/vllm serve {MODEL} \\\n"
            f"    --kv-transfer-config '{KV_TRANSFER}'\n",
            synthetic=True,
        ),
        "vllm_process": data_item(
            "sysfs",
            "/proc/4242",
            {
                "pid": 4242,
                "user": "vllm",
                "argv": ["/opt/vllm/bin/vllm", "serve", MODEL, "--kv-transfer-config", KV_TRANSFER],
            },
        ),
        "vllm_env": data_item(
            "sysfs",
            "/proc/4242/environ",
            {
                "from": "process",
                "env": {
                    "LMCACHE_CONFIG_FILE": "/etc/lmcache/gds.yaml",
                    "PYTHONHASHSEED": "0",
                    "PROMETHEUS_MULTIPROC_DIR": "/run/vllm/prometheus",
                },
            },
        ),
        "vllm_journal": command(
            ["journalctl", "--no-pager", "-o", "cat", "-n", "3000", "_SYSTEMD_INVOCATION_ID=1f"],
            JOURNAL,
            synthetic=True,
        ),
        "lmcache_config": file_item("/etc/lmcache/gds.yaml", LMCACHE_YAML, synthetic=True),
        "lmcache_version": file_item(
            "/opt/vllm/lib/python3.11/site-packages/lmcache-0.5.6.dist-info/METADATA",
            "Name: lmcache\nVersion: 0.5.6\n",
        ),
        "gds_dir": data_item(
            "dir",
            GDS_DIR,
            {
                "exists": True,
                "is_dir": True,
                "file_count": 0,
                "bytes": 0,
                "tmp_file_count": 0,
                "tmp_files": [],
                "free_bytes": 500 * 2**30,
                "total_bytes": 1024 * 2**30,
                "owner": "vllm",
                "group": "vllm",
                "owner_uid": 990,
                "owner_gid": 990,
                "mode": "0o2775",
                "service_user": "vllm",
                "writable_by_service_user": True,
                "service_uid": 990,
                "service_gid": 990,
                "resolved_paths": {GDS_DIR: GDS_DIR},
            },
        ),
        "gds_prune_timer": command(
            [*PRUNE_SHOW, PRUNE_TIMER, PRUNE_SERVICE, "-p", PRUNE_PROPERTIES],
            prune_show(active=True),
            synthetic=True,
        ),
        "http_health": http_item("http://127.0.0.1:8000/health", 200, ""),
        "http_version": http_item("http://127.0.0.1:8000/version", 200, '{"version": "0.34.0"}'),
        "http_models": http_item(
            "http://127.0.0.1:8000/v1/models",
            200,
            json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}),
        ),
        "http_metrics": http_item("http://127.0.0.1:8000/metrics", 200, METRICS),
    }
    return {
        "schema_version": 1,
        "host": "netapp-rdma-ok",
        "collected_at": "2026-12-02T14:00:00+00:00",
        "probe_version": "test-builder",
        "error": None,
        "settings": {
            "gds_dir": GDS_DIR,
            "vllm_url": "http://127.0.0.1:8000",
            "vllm_service": "vllm.service",
            "service_user": "vllm",
            "expected_model": MODEL,
            "role": "offload",
            "storage_bench": True,
        },
        "items": items,
    }


def _variant(host: str, edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    doc = copy.deepcopy(healthy())
    doc["host"] = host
    # One host prunes a shared directory (the role's vllm_lmcache_prune_host): the variants,
    # which share the healthy host's directory in the fleet bundle, have no timer.
    doc["items"]["gds_prune_timer"]["stdout"] = prune_show(active=False)
    edit(doc["items"])
    return doc


def compat_only() -> dict[str, Any]:
    """gdscheck says `NFS : compat` (GDS 1.16 docs sample) and nvidia-fs counters stand still."""

    def edit(items: dict[str, Any]) -> None:
        items["gdscheck"]["stdout"] = fixture(
            "gdscheck/nvidia-docs-l4-rhel9-gds1.16-nfs-compat.txt"
        )
        items["nvfs_stats_after_bench"] = copy.deepcopy(items["nvfs_stats_before_bench"])

    return _variant("compat-only", edit)


def tcp_fallback() -> dict[str, Any]:
    """The ONTAP mount line with proto=tcp,port=2049: the mount silently fell back to TCP."""

    def edit(items: dict[str, Any]) -> None:
        text = items["mounts"]["stdout"]
        items["mounts"]["stdout"] = text.replace("proto=rdma", "proto=tcp").replace(
            "port=20049", "port=2049"
        )

    return _variant("tcp-fallback", edit)


def proprietary_driver() -> dict[str, Any]:
    def edit(items: dict[str, Any]) -> None:
        items["nvidia_driver_version"]["stdout"] = PROC_PROPRIETARY

    return _variant("proprietary-driver", edit)


def misspelled_cufile_key() -> dict[str, Any]:
    """`allow_compat_mod`: libcufile ignores it and keeps compat mode allowed."""

    def edit(items: dict[str, Any]) -> None:
        items["cufile_json"]["stdout"] = _cufile().replace(
            '"allow_compat_mode": false', '"allow_compat_mod": false'
        )

    return _variant("misspelled-cufile-key", edit)


def wrong_lmcache_buffer_key() -> dict[str, Any]:
    """LMCache 0.5.6 with the <= 0.4.3 key `cufile_buffer_size`."""

    def edit(items: dict[str, Any]) -> None:
        items["lmcache_config"]["stdout"] = LMCACHE_YAML.replace(
            "gds_buffer_size", "cufile_buffer_size"
        )

    return _variant("wrong-lmcache-buffer-key", edit)


def use_gds_yes() -> dict[str, Any]:
    """`LMCACHE_USE_GDS=yes` in the unit: LMCache reads only true/1 as true, so GDS is off."""

    def edit(items: dict[str, Any]) -> None:
        items["vllm_env"]["data"]["env"]["LMCACHE_USE_GDS"] = "yes"

    return _variant("use-gds-yes", edit)


def lmcache_torch_fallback() -> dict[str, Any]:
    """LMCache built for another torch: its compiled ops fail to load and it says so once."""

    def edit(items: dict[str, Any]) -> None:
        items["vllm_journal"]["stdout"] = JOURNAL + TORCH_FALLBACK_LINE

    return _variant("lmcache-torch-fallback", edit)


def gds_dir_hung() -> dict[str, Any]:
    """The NFS server stopped answering: the probe's child for the GDS directory was killed
    after its budget (the platform evidence is all there)."""

    def edit(items: dict[str, Any]) -> None:
        items["gds_dir"]["data"] = {"exists": None, "is_dir": None, "service_user": "vllm"}
        items["gds_dir"]["error"] = f"GDS directory {GDS_DIR} did not answer in 20 s"

    return _variant("gds-dir-hung", edit)


def nic_across_host_bridge() -> dict[str, Any]:
    """The recorded R760xa matrix as it is: GPU0 reaches every NIC only through NODE."""

    def edit(items: dict[str, Any]) -> None:
        items["nvidia_smi_topo"]["stdout"] = fixture(TOPO_FIXTURE)

    return _variant("nic-across-host-bridge", edit)


def storage_nic_far() -> dict[str, Any]:
    """The mount's RDMA port is mlx5_0 (NIC0, NODE to GPU0) while mlx5_1 (NIC1, a live
    compute NIC under GPU0's switch) carries no storage traffic: healthy with the storage port
    renamed mlx5_3 → mlx5_0 (sysfs, ibdev2netdev, show_gids) and mlx5_1/eth1 added."""

    def edit(items: dict[str, Any]) -> None:
        [storage] = items["infiniband"]["data"]["devices"]
        storage["name"] = "mlx5_0"
        compute = copy.deepcopy(storage)
        compute["name"] = "mlx5_1"
        compute["ports"][0]["netdevs"] = ["eth1"]
        items["infiniband"]["data"]["devices"].append(compute)
        items["ibdev2netdev"]["stdout"] = (
            "mlx5_0 port 1 ==> net1 (Up)\nmlx5_1 port 1 ==> eth1 (Up)\n"
        )
        items["show_gids"]["stdout"] = items["show_gids"]["stdout"].replace("mlx5_3", "mlx5_0")
        items["ip_addr"]["stdout"] += "6: eth1    inet 192.168.20.31/24 scope global eth1\n"

    return _variant("storage-nic-far", edit)


def unreachable() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "host": "unreachable",
        "collected_at": "2026-12-02T14:00:00+00:00",
        "probe_version": "test-builder",
        "error": "ssh: connect to 10.0.0.99 port 22: timed out after 10 s",
        "settings": {},
        "items": {},
    }


BUNDLE: dict[str, Callable[[], dict[str, Any]]] = {
    "healthy": healthy,
    "compat-only": compat_only,
    "tcp-fallback": tcp_fallback,
    "proprietary-driver": proprietary_driver,
    "misspelled-cufile-key": misspelled_cufile_key,
    "wrong-lmcache-buffer-key": wrong_lmcache_buffer_key,
    "nic-across-host-bridge": nic_across_host_bridge,
    "storage-nic-far": storage_nic_far,
    "use-gds-yes": use_gds_yes,
    "lmcache-torch-fallback": lmcache_torch_fallback,
    "gds-dir-hung": gds_dir_hung,
}


def write_bundles(directory: Path = EVIDENCE_DIR) -> None:
    """healthy/ (one good host), broken/ (one host per failure), fleet/ (all + unreachable)."""
    sys.path.insert(0, str(Path(__file__).parent.parent))
    from kvops.validate.judge import save_evidence

    for old in directory.glob("*/*.json"):
        old.unlink()
    save_evidence(directory / "healthy", [healthy()])
    save_evidence(
        directory / "broken", [build() for name, build in BUNDLE.items() if name != "healthy"]
    )
    save_evidence(directory / "fleet", [*(build() for build in BUNDLE.values()), unreachable()])


if __name__ == "__main__":
    write_bundles()


def findings_for(doc: dict[str, Any], check_id: str) -> list[tuple[str, str]]:
    """(severity, message) of one check's findings on a document: what tests assert on."""
    from kvops.validate.judge import judge

    return [(str(f.severity), f.message) for f in judge(doc) if f.check_id == check_id]


def edited(**items: dict[str, Any] | None) -> dict[str, Any]:
    """The healthy document with some items replaced (None removes the item)."""
    return with_items(healthy(), items)


def with_items(doc: dict[str, Any], items: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """`doc` with these items replaced (None removes the item)."""
    for item_id, item in items.items():
        if item is None:
            doc["items"].pop(item_id, None)
        else:
            doc["items"][item_id] = item
    return doc
