"""The evidence document: what the probe collected on one host, as plain JSON.

This is the contract between the probe (runs on the target, stdlib only, Python >= 3.8, so it
mirrors these names rather than importing them) and the judges in `kvops.checks`, which read
nothing else. Keeping raw tool output (not just conclusions) in the document is what lets a
saved bundle be re-judged offline with newer checks (`--from-evidence`) and lets tests feed
recorded real outputs to the checks.

Rules both sides follow:
- An item that could not be collected is still recorded: a missing tool is `exit_code` 127
  (or `error` set), a missing file is `error` "ENOENT ..." — that is evidence, never a crash.
- An item absent from `items` means the probe did not try (e.g. `gdsio_*` without
  `--storage-bench`); checks that need it report SKIP with the reason.
- stdout/stderr are bounded by the probe; `truncated` says it cut them, and parsers then
  return what they could read plus a warning.

Document shape (`schema_version` 1)::

    {"schema_version": 1, "host": "gpu-01", "collected_at": "2026-12-02T14:00:00+00:00",
     "probe_version": "0.1.0", "error": null,
     "settings": {...Settings...},
     "items": {ITEM_ID: {...Item...}, ...}}

`error` at the top level is set (and `items` may be empty) when the host could not be probed
at all (unreachable, auth refused, probe timed out); the fleet report shows it per host.
"""

from __future__ import annotations

from typing import Any, TypedDict

SCHEMA_VERSION = 1

# Item kinds: how the probe obtained the item.
KIND_COMMAND = "command"  # source = argv list; exit_code = process exit status (127: not found)
KIND_FILE = "file"  # source = path; stdout = file contents; error = "ENOENT ..." when missing
KIND_DIR = "dir"  # source = path; data = structured summary of the directory
KIND_HTTP = "http"  # source = URL; http_status = HTTP status (None: no response); stdout = body
KIND_SYSFS = "sysfs"  # source = path (glob root); data = structured values read from sysfs
KINDS = (KIND_COMMAND, KIND_FILE, KIND_DIR, KIND_HTTP, KIND_SYSFS)

ROLE_BASELINE = "baseline"
ROLE_OFFLOAD = "offload"
# No inference service on this host (yet): the GDS stack is judged, vLLM/LMCache checks SKIP.
ROLE_NONE = "none"
ROLES = (ROLE_BASELINE, ROLE_OFFLOAD, ROLE_NONE)


class Item(TypedDict, total=False):
    """One collected observation. Only `kind` and `source` are always present."""

    kind: str
    source: list[str] | str
    exit_code: int | None
    http_status: int | None
    stdout: str
    stderr: str
    truncated: bool
    duration_s: float
    error: str | None
    data: Any


class Settings(TypedDict, total=False):
    """What the probe was asked to look at (from inventory variables and CLI options).

    The judges use these as expectations: e.g. the GDS directory must live on the RDMA mount,
    and `role` decides whether LMCache/`--kv-transfer-config` checks apply (offload only)."""

    gds_dir: str  # LMCache gds_path directory to inspect (and gdsio target)
    vllm_url: str  # e.g. "http://127.0.0.1:8000"
    vllm_service: str  # systemd unit name, e.g. "vllm.service"
    service_user: str  # user the vLLM service runs as (GDS dir must be writable by it)
    lmcache_config_path: str  # LMCache YAML path (else taken from LMCACHE_CONFIG_FILE)
    expected_model: str  # model name that /v1/models must list
    role: str  # ROLE_BASELINE | ROLE_OFFLOAD | ROLE_NONE (no inference service declared)
    storage_bench: bool  # whether gdsio_* items were requested
    gdsio_args: dict[str, str]  # e.g. {"size": "1G", "io_size": "1M", "threads": "8", "gpu": "0"}
    cufile_json_path: str  # path the service's libcufile reads (CUFILE_ENV_PATH_JSON or /etc)
    min_free_gib: float  # this host's GDS-directory free-space floor (beats --min-free-gib)
    lmcache_server_service: str  # offload_mp: LMCache server's unit, e.g. "lmcache.service"
    lmcache_server_url: str  # offload_mp: its HTTP frontend, e.g. "http://127.0.0.1:8080"
    gds_prune_timer: str  # timer running `kvops gds prune` (default "kvops-gds-prune.timer")


class Evidence(TypedDict, total=False):
    schema_version: int
    host: str
    collected_at: str
    probe_version: str
    error: str | None
    settings: Settings
    items: dict[str, Item]


# --- Item ids. The docstring of each is in ITEM_SOURCES (what produces it, and its shape). ---
OS_RELEASE = "os_release"
UNAME = "uname"
NVIDIA_SMI = "nvidia_smi"
NVIDIA_DRIVER_VERSION = "nvidia_driver_version"
MODULES = "modules"
NVFS_VERSION = "nvfs_version"
NVFS_STATS = "nvfs_stats"
NVFS_PARAMS = "nvfs_params"
INFINIBAND = "infiniband"
IBDEV2NETDEV = "ibdev2netdev"
SHOW_GIDS = "show_gids"
NVIDIA_SMI_TOPO = "nvidia_smi_topo"
IP_ADDR = "ip_addr"
MOUNTS = "mounts"
MOUNTSTATS = "mountstats"
CMDLINE = "cmdline"
IOMMU = "iommu"
PCI_ACS = "pci_acs"
CUFILE_JSON = "cufile_json"
GDSCHECK = "gdscheck"
BENCH_DIR = "bench_dir"
GDSIO_WRITE = "gdsio_write"
GDSIO_READ = "gdsio_read"
NVFS_STATS_BEFORE_BENCH = "nvfs_stats_before_bench"
NVFS_STATS_AFTER_BENCH = "nvfs_stats_after_bench"
VLLM_UNIT = "vllm_unit"
VLLM_UNIT_SHOW = "vllm_unit_show"
VLLM_PROCESS = "vllm_process"
VLLM_ENV = "vllm_env"
LMCACHE_CONFIG = "lmcache_config"
LMCACHE_VERSION = "lmcache_version"
VLLM_JOURNAL = "vllm_journal"
VLLM_JOURNAL_PROBLEMS = "vllm_journal_problems"
VLLM_CONFIG_FILE = "vllm_config_file"
VLLM_WRAPPER = "vllm_wrapper"
GDS_DIR = "gds_dir"
GDS_PRUNE_TIMER = "gds_prune_timer"
HTTP_HEALTH = "http_health"
HTTP_VERSION = "http_version"
HTTP_MODELS = "http_models"
HTTP_METRICS = "http_metrics"
LMCACHE_SERVER_UNIT_SHOW = "lmcache_server_unit_show"
LMCACHE_SERVER_JOURNAL = "lmcache_server_journal"
LMCACHE_SERVER_JOURNAL_PROBLEMS = "lmcache_server_journal_problems"
LMCACHE_SERVER_HEALTH = "lmcache_server_health"
LMCACHE_SERVER_METRICS = "lmcache_server_metrics"

ITEM_SOURCES: dict[str, str] = {
    OS_RELEASE: "file /etc/os-release (stdout = contents).",
    UNAME: "command ['uname', '-srm'] (kernel name, release, machine).",
    NVIDIA_SMI: (
        "command ['nvidia-smi', '--query-gpu=index,name,driver_version,persistence_mode,"
        "pci.bus_id,memory.total', '--format=csv'] (CSV with header; parsed by "
        "kvops.parse.nvidia_smi)."
    ),
    NVIDIA_DRIVER_VERSION: (
        "file /proc/driver/nvidia/version: 'NVRM version: NVIDIA UNIX Open Kernel Module for "
        "x86_64 <ver>' (open) vs 'NVIDIA UNIX x86_64 Kernel Module <ver>' (proprietary)."
    ),
    MODULES: "file /proc/modules (loaded modules: nvidia, nvidia_fs, rpcrdma, ...).",
    NVFS_VERSION: "file /proc/driver/nvidia-fs/version (nvidia_fs module version text).",
    NVFS_STATS: "file /proc/driver/nvidia-fs/stats (parsed by kvops.parse.nvfs_stats).",
    NVFS_PARAMS: (
        "sysfs /sys/module/nvidia_fs/parameters; data = {param_name: value string} "
        "(max_devices, dbg_enabled, rw_stats_enabled, use_legacy_p2p_allocation, ...)."
    ),
    INFINIBAND: (
        "sysfs /sys/class/infiniband; data = {'devices': [{'name': 'mlx5_0', 'ports': "
        "[{'port': 1, 'state': '4: ACTIVE', 'phys_state': '5: LinkUp', 'rate': "
        "'200 Gb/sec (4X HDR)', 'link_layer': 'Ethernet', 'netdevs': ['ens1f0np0']}]}]}; "
        "netdevs from /sys/class/infiniband/<dev>/device/net/*. Empty list: no RDMA device."
    ),
    IBDEV2NETDEV: (
        "command ['ibdev2netdev'] (MLNX/DOCA-OFED mlnx-tools): 'mlx5_0 port 1 ==> ens1f0np0 "
        "(Up)' per RDMA port (parsed by kvops.parse.rdma_tools); exit 127 without the tool."
    ),
    SHOW_GIDS: (
        "command ['show_gids'] (MLNX/DOCA-OFED): GID table 'DEV PORT INDEX GID IPv4 VER DEV' "
        "with RoCE v1/v2 per GID, ending 'n_gids_found=N' (parsed by kvops.parse.rdma_tools)."
    ),
    NVIDIA_SMI_TOPO: (
        "command ['nvidia-smi', 'topo', '-mp'] (GPU/NIC PCIe link matrix, CPU/NUMA affinity, "
        "NIC Legend; parsed by kvops.parse.topo). Not run, with `error` set, when the "
        "nvidia_smi item timed out (a hung driver would only spend the budget again)."
    ),
    IP_ADDR: (
        "command ['ip', '-j', 'addr', 'show'] (JSON, iproute2 >= 4.13); a probe may fall "
        "back to ['ip', '-o', 'addr', 'show'] (one line per address). Both are parsed."
    ),
    MOUNTS: "file /proc/mounts (parsed by kvops.parse.mounts).",
    MOUNTSTATS: "file /proc/self/mountstats (pNFS layout per NFS mount; kvops.parse.mountstats).",
    CMDLINE: "file /proc/cmdline (intel_iommu=, amd_iommu=, iommu=pt ...).",
    IOMMU: (
        "sysfs /sys/kernel/iommu_groups; data = {'group_count': int, 'types': {'identity': "
        "n, 'DMA-FQ': m}} (0 groups: IOMMU off or not exposed; types = each group's default "
        "domain from <group>/type, absent on older kernels and bundles)."
    ),
    PCI_ACS: (
        "command ['lspci', '-vvv'], stdout kept to device header lines and 'ACSCap:'/'ACSCtl:'"
        " lines (item 'filtered' says so); parsed by kvops.parse.pci_acs. Without root lspci "
        "prints '<access denied>' for the capabilities."
    ),
    CUFILE_JSON: (
        "file: the cufile.json the service's libcufile reads (settings.cufile_json_path, "
        "else CUFILE_ENV_PATH_JSON from the service env, else /etc/cufile.json)."
    ),
    GDSCHECK: (
        "command ['/usr/local/cuda/gds/tools/gdscheck', '-p'] (first gdscheck found under "
        "/usr/local/cuda*/gds/tools; parsed by kvops.parse.gdscheck)."
    ),
    BENCH_DIR: (
        "dir <gds_dir>/kvops-gdsio-XXXXXX made with mkdtemp by the bench user (the service "
        "user unless settings.bench_user); data = {'dir': path, 'stale_removed': [dirs a "
        "killed earlier run left, untouched for an hour: a younger one may be another host's "
        "bench on the same store], 'stale_left': [those it could not remove]}; `error` "
        "when it could not be made (then gdsio is not run). Only with --storage-bench."
    ),
    GDSIO_WRITE: (
        "command gdsio -D <bench_dir> -d <gpu> -w <threads> -s <size> -i <io_size> -x 0 -I 1 "
        "(GPU_DIRECT write as the bench user, clean env: CUFILE_ENV_PATH_JSON, "
        "CUFILE_LOGFILE_PATH only; item run_as names the user; only with --storage-bench)."
    ),
    GDSIO_READ: "command gdsio ... -x 0 -I 0 on the files GDSIO_WRITE made (--storage-bench).",
    NVFS_STATS_BEFORE_BENCH: "file /proc/driver/nvidia-fs/stats read just before gdsio_write.",
    NVFS_STATS_AFTER_BENCH: "file /proc/driver/nvidia-fs/stats read just after gdsio_read.",
    VLLM_UNIT: "command ['systemctl', 'cat', <vllm_service>] (unit file incl. drop-ins).",
    VLLM_UNIT_SHOW: (
        "command ['systemctl', 'show', <vllm_service>, '-p', 'LoadState,ActiveState,MainPID,"
        "User', '-p', 'Environment,EnvironmentFiles,ExecStart'] (KEY=VALUE lines)."
    ),
    VLLM_PROCESS: (
        "sysfs /proc/<MainPID>; data = {'pid': int, 'user': str, 'argv': [..]} of the running "
        "vLLM service (argv from /proc/<pid>/cmdline); absent/error when not running. With "
        "'serving_pid'/'serving_argv' when MainPID is a wrapper or container monitor and a "
        "descendant process runs vLLM."
    ),
    VLLM_ENV: (
        "sysfs /proc/<MainPID>/environ, else the unit's Environment=/EnvironmentFile=; "
        "data = {'env': {NAME: value}, 'from': 'process'|'unit'}."
    ),
    LMCACHE_CONFIG: (
        "file: settings.lmcache_config_path, else LMCACHE_CONFIG_FILE from the service env "
        "(stdout = YAML text)."
    ),
    LMCACHE_VERSION: (
        "file <prefix>/lib/python3*/site-packages/lmcache-*.dist-info/METADATA, looked up in "
        "the service's filesystem (/proc/<pid>/root) under its venv; stdout = 'Name: lmcache"
        "\\nVersion: 0.5.6'. Never obtained by running the service's Python. Older bundles: "
        "a command whose last stdout line is the version."
    ),
    VLLM_CONFIG_FILE: (
        "file: the YAML of `vllm serve --config FILE` (read inside the service's filesystem, "
        "/proc/<pid>/root, when it has one); redacted. Only when argv has --config."
    ),
    VLLM_WRAPPER: (
        "file: the script the unit or MainPID runs (`bash /opt/run-vllm.sh`, or argv[0] "
        "starting with #!), read as text and redacted, never run. Only when there is one."
    ),
    VLLM_JOURNAL: (
        "command ['journalctl', '--no-pager', '-o', 'cat', '-n', '3000', "
        "'_SYSTEMD_INVOCATION_ID=<the unit's InvocationID>'] (the current run's log), else "
        "[..., '-b', '-u', <vllm_service>]; redacted on the host. Exit 127 without systemd."
    ),
    VLLM_JOURNAL_PROBLEMS: (
        "command [..., '--grep', <the LMCache problem lines>, '-n', '200', <as vllm_journal>]: "
        "the lines of the whole current run that name a silent LMCache failure (degraded mode, "
        "an ignored key, the pure-torch fallback), which the 3000-line tail loses on a busy "
        "server; redacted on the host."
    ),
    GDS_DIR: (
        "dir settings.gds_dir, read in a child process with its own time budget; error "
        "'GDS directory <path> did not answer in N s' (data exists: None) when it hangs; "
        "data = {'exists': bool, 'is_dir': bool, 'file_count': int, "
        "'bytes': int, 'tmp_file_count': int, 'tmp_files': [first paths], 'free_bytes': int, "
        "'total_bytes': int, 'owner': str, 'group': str, 'owner_uid': int, 'owner_gid': int, "
        "'mode': '0o2775', 'service_user': str, 'writable_by_service_user': bool|None, "
        "'service_uid': int|None, 'service_gid': int|None (the service user's ids on this "
        "host)}. tmp files = names "
        "containing '.tmp' (LMCache writes <file>.tmp<hex> then renames). `error` may be set "
        "with partial data (cannot stat → exists false; walk stopped early)."
    ),
    GDS_PRUNE_TIMER: (
        "command ['systemctl', 'show', '--no-pager', <timer>, <timer's .service>, '-p', "
        "'Id,LoadState,UnitFileState,ActiveState,ExecStart'] (one KEY=VALUE block per unit); "
        "<timer> = settings.gds_prune_timer, else 'kvops-gds-prune.timer' (role vllm_lmcache); "
        "error set without running anything when the name is not a timer unit name."
    ),
    HTTP_HEALTH: "http GET <vllm_url>/health (200 healthy, 503 engine dead).",
    HTTP_VERSION: "http GET <vllm_url>/version (body {'version': 'x.y.z'}).",
    HTTP_MODELS: "http GET <vllm_url>/v1/models (OpenAI list; data[].id are served names).",
    HTTP_METRICS: "http GET <vllm_url>/metrics (Prometheus text; vllm:* and lmcache:*).",
    # LMCache's multiprocess server (role vllm_lmcache, variant offload_mp); error "no LMCache
    # server declared ..." on other hosts.
    LMCACHE_SERVER_UNIT_SHOW: (
        "command ['systemctl', 'show', <lmcache_server_service>, '-p', "
        "'ActiveState,MainPID,InvocationID,ExecStart'] (older probes: without ExecStart). "
        "Only with settings.lmcache_server_service."
    ),
    LMCACHE_SERVER_JOURNAL: (
        "command as vllm_journal for <lmcache_server_service> (the server's current run). "
        "Only with settings.lmcache_server_service."
    ),
    LMCACHE_SERVER_JOURNAL_PROBLEMS: (
        "command as vllm_journal_problems for the server, with the server's own failure texts "
        "(a transfer-mode mismatch, a failed start, SHM falling back). Only with "
        "settings.lmcache_server_service."
    ),
    LMCACHE_SERVER_HEALTH: (
        "http GET <lmcache_server_url>/healthcheck (200 healthy). Only with "
        "settings.lmcache_server_url."
    ),
    LMCACHE_SERVER_METRICS: (
        "http GET <lmcache_server_url>/metrics (Prometheus text; lmcache_mp_*). Only with "
        "settings.lmcache_server_url."
    ),
}

ITEM_IDS: tuple[str, ...] = tuple(ITEM_SOURCES)


def item_text(evidence: Evidence | dict[str, Any], item_id: str) -> str | None:
    """The item's stdout when it was collected successfully, else None.

    "Successfully" means: present, no `error`, and exit code 0 (commands) or 2xx (HTTP).
    Checks call this to get text to parse and fall back to `item_problem` for the SKIP reason."""
    item = get_item(evidence, item_id)
    if item is None or item_problem(item) is not None:
        return None
    stdout = item.get("stdout")
    return stdout if isinstance(stdout, str) else ""


def get_item(evidence: Evidence | dict[str, Any], item_id: str) -> Item | None:
    items = evidence.get("items")
    if not isinstance(items, dict):
        return None
    item = items.get(item_id)
    return item if isinstance(item, dict) else None  # type: ignore[return-value]


def item_problem(item: Item | None) -> str | None:
    """Why an item carries no usable output (for SKIP/FAIL messages), or None if it does."""
    if item is None:
        return "not collected"
    if item.get("error"):
        return str(item.get("error"))
    code = item.get("exit_code")
    if item.get("kind") == KIND_HTTP:
        status = item.get("http_status")
        if status is None:
            return "no HTTP response"
        if not isinstance(status, int) or isinstance(status, bool):
            return f"HTTP status {status!r} is not a number"
        if not 200 <= status < 300:
            return f"HTTP {status}"
        return None
    if code == 127:
        return "command not found (exit 127)"
    if code not in (None, 0):
        stderr = str(item.get("stderr") or "").strip().splitlines()
        tail = f": {stderr[-1][:200]}" if stderr else ""
        return f"exit {code}{tail}"
    return None


def source_text(item: Item | None) -> str:
    """The item's source as one printable string (argv joined, or the path/URL)."""
    if item is None:
        return ""
    source = item.get("source", "")
    return " ".join(str(a) for a in source) if isinstance(source, list) else str(source)
