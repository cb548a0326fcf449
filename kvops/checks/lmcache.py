"""LMCache as it will actually run: effective config (file < env < vLLM extra config)
against the installed LMCache version. Checked on offload hosts only."""

from __future__ import annotations

from kvops import evidence as ev
from kvops.checks.context import Context
from kvops.checks.model import Finding, Severity, finding
from kvops.checks.rdma_mount import mount_line
from kvops.parse.lmcache_config import LmcacheConfig, buffer_key_for

STABLE_HASHES = frozenset({"sha256", "sha256_cbor", "xxhash", "xxhash_cbor"})


def _not_offload(ctx: Context) -> str:
    if ctx.role == ev.ROLE_NONE:
        return "kvops_role none: no inference service declared on this host"
    return f"role {ctx.role or 'unset'}: not an offload host"


def _config_or_skip(ctx: Context, check_id: str) -> LmcacheConfig | Finding:
    if ctx.role != ev.ROLE_OFFLOAD:
        return finding(check_id, Severity.SKIP, _not_offload(ctx))
    config = ctx.lmcache
    if config is None and check_id != "GDS-060":
        return finding(check_id, Severity.SKIP, "no LMCache config to judge (see GDS-060)")
    if config is None:
        return finding(
            check_id,
            Severity.FAIL,
            f"no LMCache config: {ctx.problem(ev.LMCACHE_CONFIG)} and no LMCACHE_* env",
            remedy="Set LMCACHE_CONFIG_FILE in the service env to the config (role vllm_lmcache).",
        )
    return config


def check_gds_path(ctx: Context) -> list[Finding]:
    config = _config_or_skip(ctx, "GDS-060")
    if isinstance(config, Finding):
        return [config]
    raw = config.effective.get("gds_path")
    if not raw:
        return [finding("GDS-060", Severity.FAIL, "gds_path not set: the GDS backend is off")]
    table = ctx.mounts
    if table is None:
        return [ctx.skip("GDS-060", ev.MOUNTS)]
    out = []
    source = config.sources.get("gds_path", "?")
    for path in [p.strip() for p in str(raw).split(",") if p.strip()]:
        mount = table.mount_for(path)
        if mount is not None and mount.is_nfs and mount.proto in {"rdma", "rdma6"}:
            msg = f"gds_path {path} ({source}) on {mount.mount_point} over RDMA"
            out.append(finding("GDS-060", Severity.PASS, msg, mount_line(mount)))
        else:
            where = f"{mount.mount_point} ({mount.fs_type}, proto={mount.proto})" if mount else "?"
            msg = f"gds_path {path} ({source}) is on {where}, not an NFS/RDMA mount"
            out.append(finding("GDS-060", Severity.FAIL, msg, mount_line(mount) if mount else ""))
    return out


def check_buffer_key(ctx: Context) -> list[Finding]:
    config = _config_or_skip(ctx, "GDS-061")
    if isinstance(config, Finding):
        return [config]
    version = ctx.lmcache_version
    expected = buffer_key_for(version)
    present = [k for k in ("cufile_buffer_size", "gds_buffer_size") if k in config.file_keys]
    present += [k for k in ("cufile_buffer_size", "gds_buffer_size") if k in config.effective]
    if expected is None:
        msg = f"LMCache version unknown ({ctx.problem(ev.LMCACHE_VERSION)}); keys: {present}"
        return [finding("GDS-061", Severity.WARN, msg)]
    if expected in config.effective:
        value = config.effective[expected]
        msg = f"{expected} = {value} MiB ({config.sources[expected]}) for LMCache {version}"
        return [finding("GDS-061", Severity.PASS, msg)]
    wrong = [k for k in present if k != expected]
    if wrong:
        msg = (
            f"LMCache {version} reads {expected}, but the config sets {wrong[0]}: "
            "ignored, and the GDS backend then fails its startup assertion"
        )
        return [finding("GDS-061", Severity.FAIL, msg, remedy=f"Rename {wrong[0]} to {expected}.")]
    return [finding("GDS-061", Severity.FAIL, f"{expected} not set (LMCache {version} needs it)")]


def check_stable_hash(ctx: Context) -> list[Finding]:
    config = _config_or_skip(ctx, "GDS-062")
    if isinstance(config, Finding):
        return [config]
    algorithm = str(config.effective.get("pre_caching_hash_algorithm", "builtin"))
    if algorithm in STABLE_HASHES:
        return [finding("GDS-062", Severity.PASS, f"pre_caching_hash_algorithm = {algorithm}")]
    env = ctx.service_env
    if env is None:
        return [ctx.skip("GDS-062", ev.VLLM_ENV)]
    seed = env.get("PYTHONHASHSEED")
    if seed is not None and seed != "random":
        return [finding("GDS-062", Severity.PASS, f"{algorithm} hash with PYTHONHASHSEED={seed}")]
    msg = (
        f"{algorithm} hash without PYTHONHASHSEED: chunk keys change at every restart, "
        "so stored KV is never found again"
    )
    return [finding("GDS-062", Severity.FAIL, msg)]


def check_prometheus_dir(ctx: Context) -> list[Finding]:
    if ctx.role != ev.ROLE_OFFLOAD:
        return [finding("GDS-063", Severity.SKIP, _not_offload(ctx))]
    env = ctx.service_env
    if env is None:
        return [ctx.skip("GDS-063", ev.VLLM_ENV)]
    value = env.get("PROMETHEUS_MULTIPROC_DIR")
    if value:
        return [finding("GDS-063", Severity.PASS, f"PROMETHEUS_MULTIPROC_DIR={value}")]
    msg = "PROMETHEUS_MULTIPROC_DIR unset: lmcache:* metrics will not show on vLLM /metrics"
    return [finding("GDS-063", Severity.WARN, msg)]


def check_unknown_keys(ctx: Context) -> list[Finding]:
    config = _config_or_skip(ctx, "GDS-064")
    if isinstance(config, Finding):
        return [config]
    if config.error:
        return [finding("GDS-064", Severity.FAIL, f"LMCache config does not parse: {config.error}")]
    buffer_keys = {"cufile_buffer_size", "gds_buffer_size"}  # judged by GDS-061
    unknown = [k for k in config.unknown_keys if k not in buffer_keys]
    if not unknown:
        return [finding("GDS-064", Severity.PASS, "all LMCache keys known")]
    msg = f"keys ignored by LMCache {ctx.lmcache_version or '?'}: {', '.join(unknown)}"
    return [finding("GDS-064", Severity.WARN, msg)]


CHECKS = [
    check_gds_path,
    check_buffer_key,
    check_stable_hash,
    check_prometheus_dir,
    check_unknown_keys,
]
