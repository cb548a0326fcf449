"""cufile.json as libcufile will read it: syntax, known keys, compat mode, RDMA addresses."""

from __future__ import annotations

from typing import Any

from kvops import evidence as ev
from kvops.checks.context import Context
from kvops.checks.model import Finding, Severity, finding
from kvops.parse._common import clip_repr
from kvops.parse.cufile import CufileConfig

_TRUE = {"1", "true", "yes", "on"}


def _config_or_skip(ctx: Context, check_id: str) -> CufileConfig | Finding:
    config = ctx.cufile
    if config is None:
        return ctx.skip(check_id, ev.CUFILE_JSON)
    if config.error is not None:
        return finding(check_id, Severity.SKIP, "cufile.json does not parse (see GDS-030)")
    return config


def check_parses(ctx: Context) -> list[Finding]:
    item = ctx.item(ev.CUFILE_JSON)
    if item is None:
        return [ctx.skip("GDS-030", ev.CUFILE_JSON)]
    config = ctx.cufile
    path = ev.source_text(item)
    if config is None:
        msg = f"{ctx.problem(ev.CUFILE_JSON)}: libcufile runs on built-in defaults"
        return [finding("GDS-030", Severity.WARN, msg)]
    if config.error is not None:
        return [finding("GDS-030", Severity.FAIL, f"{path}: {config.error}")]
    notes = "; ".join(config.warnings)
    return [finding("GDS-030", Severity.PASS, f"{path} parses" + (f" ({notes})" if notes else ""))]


def check_known_keys(ctx: Context) -> list[Finding]:
    config = _config_or_skip(ctx, "GDS-031")
    if isinstance(config, Finding):
        return [config]
    if not config.unknown_keys:
        return [finding("GDS-031", Severity.PASS, f"all {len(config.values)} keys known")]
    out = []
    for unknown in config.unknown_keys:
        key = clip_repr(unknown.key)
        hint = f"; did you mean {unknown.suggestion!r}?" if unknown.suggestion else ""
        remedy = (
            f"Rename {key} to {unknown.suggestion!r}."
            if unknown.suggestion
            else f"Remove {key}: libcufile ignores it."
        )
        msg = f"unknown key {key} is ignored by libcufile{hint}"
        out.append(finding("GDS-031", Severity.WARN, msg, remedy=remedy))
    return out


def flag(value: Any) -> bool | None:
    """A cufile.json boolean as libcufile reads it (JSON bool or a true-ish string)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.strip().lower() in _TRUE
    return None


def check_compat_mode(ctx: Context) -> list[Finding]:
    """The service env wins over the file (CUFILE_*_COMPAT_MODE), the file over libcufile's
    defaults; a missing cufile.json means the defaults (compat allowed) are in force."""
    item = ctx.item(ev.CUFILE_JSON)
    config = ctx.cufile
    env = ctx.service_env or {}
    if item is None and not env:
        return [ctx.skip("GDS-032", ev.CUFILE_JSON, ev.VLLM_ENV)]
    if config is not None and config.error is not None and not env:
        return [finding("GDS-032", Severity.SKIP, "cufile.json does not parse (see GDS-030)")]
    values: dict[str, bool | None] = {}
    evidence_lines = []
    for key, env_name, default in (
        ("allow_compat_mode", "CUFILE_ALLOW_COMPAT_MODE", True),
        ("force_compat_mode", "CUFILE_FORCE_COMPAT_MODE", False),
    ):
        value: bool | None = default
        source = "libcufile default"
        if config is not None and config.get(f"properties.{key}") is not None:
            value, source = flag(config.get(f"properties.{key}")), "cufile.json"
        if env.get(env_name, "").strip():  # an empty variable sets nothing: the file decides
            value, source = env[env_name].strip().lower() in _TRUE, f"env {env_name}"
        values[key] = value
        evidence_lines.append(f"{key} = {value} ({source})")
    excerpt = "\n".join(evidence_lines)
    if values["force_compat_mode"]:
        return [finding("GDS-032", Severity.FAIL, "force_compat_mode: all IO is POSIX", excerpt)]
    if values["allow_compat_mode"]:
        msg = "allow_compat_mode true: a broken GDS path silently falls back to POSIX IO"
        return [finding("GDS-032", Severity.WARN, msg, excerpt)]
    return [finding("GDS-032", Severity.PASS, "compat mode off", excerpt)]


def address_lists(config: CufileConfig) -> dict[str, list[str]]:
    """Every rdma_dev_addr_list cufile.json sets for NFS, by dotted key (mount_table entries as
    `fs.nfs.mount_table.<mount>`)."""
    lists: dict[str, list[str]] = {}
    for key in ("properties.rdma_dev_addr_list", "fs.nfs.rdma_dev_addr_list"):
        value = config.get(key)
        if isinstance(value, list):
            lists[key] = [str(v) for v in value]
    table = config.get("fs.nfs.mount_table")
    if isinstance(table, dict):
        for mount, entry in table.items():
            value = entry.get("rdma_dev_addr_list") if isinstance(entry, dict) else None
            if isinstance(value, list):
                lists[f"fs.nfs.mount_table.{mount}"] = [str(v) for v in value]
    return lists


def check_rdma_addresses(ctx: Context) -> list[Finding]:
    config = _config_or_skip(ctx, "GDS-033")
    if isinstance(config, Finding):
        return [config]
    lists = {k: v for k, v in address_lists(config).items() if v}
    if not lists:
        return [finding("GDS-033", Severity.PASS, "no rdma_dev_addr_list set (kernel picks NIC)")]
    host = ctx.rdma_addresses
    if host is None:
        return [ctx.skip("GDS-033", ev.INFINIBAND, ev.IP_ADDR)]
    out = []
    for key, addresses in lists.items():
        foreign = [a for a in addresses if a not in host]
        shown = f"{key} = {addresses}; RDMA interface addresses: {sorted(host)}"
        if foreign:
            msg = f"{key} names {foreign}, not on this host's RDMA interfaces"
            out.append(finding("GDS-033", Severity.FAIL, msg, shown))
        else:
            out.append(finding("GDS-033", Severity.PASS, f"{key} subset of RDMA addresses", shown))
    return out


def check_direct_io_size(ctx: Context) -> list[Finding]:
    config = _config_or_skip(ctx, "GDS-034")
    if isinstance(config, Finding):
        return [config]
    value = config.get("properties.max_direct_io_size_kb")
    if value is None:
        return [finding("GDS-034", Severity.PASS, "max_direct_io_size_kb unset (16384 default)")]
    if isinstance(value, int) and not isinstance(value, bool) and value > 0 and value % 64 == 0:
        return [finding("GDS-034", Severity.PASS, f"max_direct_io_size_kb = {value}")]
    msg = f"max_direct_io_size_kb = {clip_repr(value)} is not a positive multiple of 64"
    return [finding("GDS-034", Severity.FAIL, msg)]


CHECKS = [
    check_parses,
    check_known_keys,
    check_compat_mode,
    check_rdma_addresses,
    check_direct_io_size,
]
