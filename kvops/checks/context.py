"""Parsed views of one evidence document, computed once and shared by all checks."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from kvops import evidence as ev
from kvops.checks.model import Finding, Severity, Thresholds, finding
from kvops.parse._common import MAX_LINE_CHARS
from kvops.parse.cufile import CufileConfig, parse_cufile
from kvops.parse.gdscheck import GdsCheckReport, parse_gdscheck
from kvops.parse.host_yaml import HostYamlError, load_host_yaml
from kvops.parse.ip_addr import parse_ip_addr
from kvops.parse.lmcache_config import LmcacheConfig, effective_lmcache_config
from kvops.parse.mounts import MountTable, parse_mounts
from kvops.parse.nvfs_stats import NvfsStats, parse_nvfs_stats
from kvops.parse.rdma_tools import GidTable, RdmaNetdevMap, parse_ibdev2netdev, parse_show_gids
from kvops.parse.topo import TopoMatrix, parse_topo

# Starts only where a digit run starts: from inside a run `\d+` rescans it (quadratic time).
_RATE = re.compile(r"(?<!\d)(\d+(?:\.\d+)?)\s*Gb/sec")


@dataclass
class RdmaPort:
    device: str
    port: int
    state: str
    rate_gbit_s: float | None
    netdevs: list[str]
    link_layer: str = ""  # "Ethernet" (RoCE) or "InfiniBand"; "" when not recorded

    @property
    def active(self) -> bool:
        return "ACTIVE" in self.state.upper()


def _split(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def _flag(argv: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the last of `names` in argv (`--x V` or `--x=V`)."""
    raw: str | None = None
    for i, arg in enumerate(argv):
        if arg in names and i + 1 < len(argv):
            raw = argv[i + 1]
        elif arg.startswith(tuple(n + "=" for n in names)):
            raw = arg.split("=", 1)[1]
    return raw


# Public names for the fleet judges (kvops/checks/shared_store.py).
split_command = _split
flag_value = _flag


def _json_or_raw(raw: str) -> dict[str, Any] | str:
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        return raw
    return parsed if isinstance(parsed, dict) else raw


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The dict members of a list; anything else is no members (evidence may be malformed)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


class Context:
    """One host's evidence with lazily parsed items. Checks never parse twice."""

    def __init__(self, evidence: dict[str, Any], thresholds: Thresholds) -> None:
        self.evidence = evidence
        self.thresholds = thresholds
        settings = evidence.get("settings")
        self.settings: dict[str, Any] = settings if isinstance(settings, dict) else {}

    # --- raw access -------------------------------------------------------------------
    def item(self, item_id: str) -> ev.Item | None:
        return ev.get_item(self.evidence, item_id)

    def text(self, item_id: str) -> str | None:
        return ev.item_text(self.evidence, item_id)

    def problem(self, item_id: str) -> str:
        item = self.item(item_id)
        where = ev.source_text(item)
        reason = ev.item_problem(item) or "no output"
        return f"{item_id}: {reason}" + (f" ({where})" if where else "")

    def skip(self, check_id: str, *item_ids: str, why: str = "") -> Finding:
        reasons = "; ".join(self.problem(i) for i in item_ids)
        return finding(check_id, Severity.SKIP, why or f"input missing: {reasons}")

    def data(self, item_id: str, partial_ok: bool = False) -> dict[str, Any] | None:
        """The item's structured data; with an `error` only when `partial_ok` (e.g. a GDS
        directory that cannot be stat'ed still says `exists: false`)."""
        item = self.item(item_id)
        if item is None or (item.get("error") and not partial_ok):
            return None
        value = item.get("data")
        return value if isinstance(value, dict) else None

    @property
    def role(self) -> str | None:
        role = self.settings.get("role")
        return str(role) if role else None

    # --- parsed views -----------------------------------------------------------------
    @cached_property
    def gdscheck(self) -> GdsCheckReport | None:
        text = self.text(ev.GDSCHECK)
        return parse_gdscheck(text) if text is not None else None

    @cached_property
    def mounts(self) -> MountTable | None:
        text = self.text(ev.MOUNTS)
        return parse_mounts(text) if text is not None else None

    @cached_property
    def cufile(self) -> CufileConfig | None:
        text = self.text(ev.CUFILE_JSON)
        return parse_cufile(text) if text is not None else None

    @cached_property
    def nvfs_stats(self) -> NvfsStats | None:
        text = self.text(ev.NVFS_STATS)
        return parse_nvfs_stats(text) if text is not None else None

    @cached_property
    def modules(self) -> set[str] | None:
        text = self.text(ev.MODULES)
        if text is None:
            return None
        return {line.split()[0] for line in text.splitlines() if line.strip()}

    @cached_property
    def rdma_ports(self) -> list[RdmaPort] | None:
        data = self.data(ev.INFINIBAND)
        if data is None:
            return None
        ports: list[RdmaPort] = []
        for device in _dicts(data.get("devices")):
            for port in _dicts(device.get("ports")):
                rate = _RATE.search(str(port.get("rate") or "")[:MAX_LINE_CHARS])
                netdevs = port.get("netdevs") or device.get("netdevs")
                number = port.get("port")
                ports.append(
                    RdmaPort(
                        device=str(device.get("name", "?")),
                        port=number if isinstance(number, int) else 0,
                        state=str(port.get("state") or ""),
                        rate_gbit_s=float(rate.group(1)) if rate else None,
                        netdevs=[str(n) for n in netdevs] if isinstance(netdevs, list) else [],
                        link_layer=str(port.get("link_layer") or ""),
                    )
                )
        return ports

    @cached_property
    def ibdev2netdev(self) -> RdmaNetdevMap | None:
        text = self.text(ev.IBDEV2NETDEV)
        return parse_ibdev2netdev(text) if text is not None else None

    @cached_property
    def show_gids(self) -> GidTable | None:
        text = self.text(ev.SHOW_GIDS)
        return parse_show_gids(text) if text is not None else None

    @cached_property
    def topo(self) -> TopoMatrix | None:
        text = self.text(ev.NVIDIA_SMI_TOPO)
        return parse_topo(text) if text is not None else None

    @cached_property
    def down_rdma_devices(self) -> set[str]:
        """RDMA devices with no port up by either source (sysfs state, ibdev2netdev): they
        carry no traffic, so placement judgements leave them out."""
        states: dict[str, bool] = {}
        for port in self.rdma_ports or []:
            states[port.device] = states.get(port.device, False) or port.active
        for link in self.ibdev2netdev.links if self.ibdev2netdev else []:
            states[link.device] = states.get(link.device, False) or link.up
        return {device for device, up in states.items() if not up}

    @cached_property
    def interface_addresses(self) -> dict[str, list[str]] | None:
        text = self.text(ev.IP_ADDR)
        return parse_ip_addr(text).addresses if text is not None else None

    @cached_property
    def rdma_addresses(self) -> set[str] | None:
        """Addresses on the net devices of RDMA ports: the only valid rdma_dev_addr_list."""
        if self.rdma_ports is None or self.interface_addresses is None:
            return None
        netdevs = {n for p in self.rdma_ports for n in p.netdevs}
        return {
            a for name, addrs in self.interface_addresses.items() if name in netdevs for a in addrs
        }

    @cached_property
    def service_env(self) -> dict[str, str] | None:
        data = self.data(ev.VLLM_ENV)
        env = data.get("env") if data else None
        return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else None

    @cached_property
    def vllm_argv(self) -> list[str] | None:
        """The running process's argv, else the unit's ExecStart split like a shell would."""
        data = self.data(ev.VLLM_PROCESS)
        if data and isinstance(data.get("argv"), list):
            return [str(a) for a in data["argv"]]
        unit = self.text(ev.VLLM_UNIT)
        if unit is None:
            return None
        joined = re.sub(r"\\\n", " ", unit)
        starts = [ln for ln in joined.splitlines() if ln.strip().startswith("ExecStart=")]
        if not starts:
            return None
        command = starts[-1].strip()[len("ExecStart=") :].lstrip("-@+!:")
        try:
            return shlex.split(command)
        except ValueError:
            return command.split()

    @cached_property
    def _launch_argvs(self) -> list[tuple[str, list[str]]]:
        """(where, argv) of every command line that may carry vLLM's arguments, in order:
        the serving process under a wrapper/container monitor, MainPID, the unit's ExecStart."""
        out: list[tuple[str, list[str]]] = []
        data = self.data(ev.VLLM_PROCESS) or {}
        for key, where in (("serving_argv", "serving process"), ("argv", "process argv")):
            if isinstance(data.get(key), list):
                out.append((where, [str(a) for a in data[key]]))
        unit = self.text(ev.VLLM_UNIT)
        if unit is not None:
            joined = re.sub(r"\\\n", " ", unit)
            for line in joined.splitlines():
                if line.strip().startswith("ExecStart="):
                    command = line.strip()[len("ExecStart=") :].lstrip("-@+!:")
                    out.append(("unit ExecStart", _split(command)))
        wrapper = self.text(ev.VLLM_WRAPPER)
        for line in (wrapper or "").splitlines():
            if "kv-transfer-config" in line or "kv_transfer_config" in line:
                out.append(("wrapper script", _split(line.strip())))
        return out

    @property
    def launch_argvs(self) -> list[list[str]]:
        """Every command line that may carry vLLM's arguments (see `_launch_argvs`)."""
        return [argv for _, argv in self._launch_argvs]

    @cached_property
    def kv_transfer_config_source(self) -> str | None:
        return self._kv_transfer[1]

    @cached_property
    def kv_transfer_config(self) -> dict[str, Any] | str | None:
        """Parsed --kv-transfer-config JSON; the raw string if it is not JSON; None if absent.
        Looked for in the serving argv, MainPID's argv, ExecStart, `--config FILE` (vLLM's
        YAML of CLI options) and a wrapper script, in that order."""
        return self._kv_transfer[0]

    @cached_property
    def _kv_transfer(self) -> tuple[dict[str, Any] | str | None, str | None]:
        for where, argv in self._launch_argvs:
            raw = _flag(argv, ("--kv-transfer-config", "--kv_transfer_config"))
            if raw is not None:
                return _json_or_raw(raw), where
        loaded, _ = self.vllm_config_file
        if loaded is not None:
            for key in ("kv-transfer-config", "kv_transfer_config"):
                value = loaded.get(key)
                if isinstance(value, dict):
                    return value, "--config file"
                if isinstance(value, str):
                    return _json_or_raw(value), "--config file"
        return None, None

    @cached_property
    def vllm_config_file(self) -> tuple[dict[str, Any] | None, str | None]:
        """`vllm serve --config` YAML as (mapping, None); (None, why) when it does not load
        (host YAML is refused with anchors, aliases or past its size cap); (None, None) when
        it was not collected or is not a mapping."""
        text = self.text(ev.VLLM_CONFIG_FILE)
        if text is None:
            return None, None
        try:
            loaded = load_host_yaml(text)
        except HostYamlError as exc:
            return None, f"{ev.VLLM_CONFIG_FILE}: {exc}"
        return (loaded if isinstance(loaded, dict) else None), None

    @cached_property
    def lmcache_version(self) -> str | None:
        """From the `Version:` line of LMCache's METADATA (older bundles: the last line of
        the version command's output)."""
        text = self.text(ev.LMCACHE_VERSION)
        lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
        for line in lines:
            if line.startswith("Version:"):
                return line.partition(":")[2].strip() or None
        return lines[-1] if lines else None

    @cached_property
    def lmcache(self) -> LmcacheConfig | None:
        """Effective LMCache config (file < env < kv_connector_extra_config), or None when
        there is neither a config file nor any LMCACHE_* variable to read."""
        text = self.text(ev.LMCACHE_CONFIG)
        env = self.service_env or {}
        kv = self.kv_transfer_config
        extra = kv.get("kv_connector_extra_config") if isinstance(kv, dict) else None
        has_env = any(k.startswith("LMCACHE_") for k in env)
        if text is None and not has_env and not extra:
            return None
        return effective_lmcache_config(
            text, env, extra if isinstance(extra, dict) else None, self.lmcache_version
        )

    @property
    def gds_dir(self) -> str | None:
        value = self.settings.get("gds_dir")
        return str(value) if value else None

    def real_path(self, path: str) -> str:
        """The path with its symlinks resolved on the host (the probe resolves the GDS
        directory and LMCache's gds_path), else the path as given (older bundles)."""
        data = self.data(ev.GDS_DIR, partial_ok=True) or {}
        resolved = data.get("resolved_paths")
        if isinstance(resolved, dict) and isinstance(resolved.get(path), str):
            return str(resolved[path])
        return path
