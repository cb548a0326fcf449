"""LMCache as it will actually run: effective config (file < env < vLLM extra config)
against the installed LMCache version. Checked on offload hosts only."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvops import evidence as ev
from kvops.checks.context import Context
from kvops.checks.model import Finding, Severity, finding
from kvops.checks.rdma_mount import mount_line
from kvops.checks.vllm import is_lmcache_server
from kvops.parse._common import MAX_SHOWN_CHARS, clip, clip_repr
from kvops.parse.lmcache_config import LmcacheConfig, buffer_key_for

STABLE_HASHES = frozenset({"sha256", "sha256_cbor", "xxhash", "xxhash_cbor"})


def _not_offload(ctx: Context) -> str:
    if ctx.role == ev.ROLE_NONE:
        return "kvops_role none: no inference service declared on this host"
    return f"role {ctx.role or 'unset'}: not an offload host"


SERVER_MODE = (
    "LMCache runs as its multiprocess server (LMCacheMPConnector, offload_mp): no in-process "
    "config; the server is judged by GDS-066 and GDS-073"
)


def _config_or_skip(ctx: Context, check_id: str) -> LmcacheConfig | Finding:
    if ctx.role != ev.ROLE_OFFLOAD:
        return finding(check_id, Severity.SKIP, _not_offload(ctx))
    if is_lmcache_server(ctx):
        return finding(check_id, Severity.SKIP, SERVER_MODE)
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
        why = (
            f" ({config.unconverted['gds_path']} does not convert)"
            if ("gds_path" in config.unconverted)
            else ""
        )
        msg = f"gds_path not set{why}: the GDS backend is off"
        return [finding("GDS-060", Severity.FAIL, msg)]
    table = ctx.mounts
    if table is None:
        return [ctx.skip("GDS-060", ev.MOUNTS)]
    out = []
    source = config.sources.get("gds_path", "?")
    paths = [p.strip() for p in str(raw).split(",") if p.strip()]
    for path in paths:
        real = ctx.real_path(path)
        named = clip(path) if real == path else f"{clip(path)} (→ {clip(real)})"
        mount = table.mount_for(real)
        if mount is None or not mount.is_nfs or mount.proto not in {"rdma", "rdma6"}:
            where = f"{mount.mount_point} ({mount.fs_type}, proto={mount.proto})" if mount else "?"
            msg = f"gds_path {named} ({source}) is on {where}, not an NFS/RDMA mount"
            out.append(finding("GDS-060", Severity.FAIL, msg, mount_line(mount) if mount else ""))
            continue
        # LMCache picks the filesystem type by the path as written (longest /proc/mounts
        # prefix, gds_backend.py get_fstype) and turns GDS off on tmpfs/overlay unless
        # use_gds was set: a symlink from such a filesystem hides the NFS mount from it.
        lexical = table.mount_for(path)
        if (
            real != path
            and lexical is not None
            and lexical.fs_type in AUTO_DISABLE_FS
            and not config.is_set("use_gds")
        ):
            msg = (
                f"gds_path {named}: LMCache judges the path as written, which is on "
                f"{lexical.mount_point} ({lexical.fs_type}), and turns GDS off there"
            )
            remedy = f"Set gds_path to {clip(real)}, or set use_gds: true explicitly."
            out.append(finding("GDS-060", Severity.FAIL, msg, mount_line(lexical), remedy))
            continue
        msg = f"gds_path {named} ({source}) on {mount.mount_point} over RDMA"
        out.append(finding("GDS-060", Severity.PASS, msg, mount_line(mount)))
    if all(f.severity is Severity.PASS for f in out):  # one cause, one finding
        out.extend(_declared_dir_mismatch(ctx, paths))
    return out


AUTO_DISABLE_FS = frozenset({"tmpfs", "overlay", "overlayfs"})


def _declared_dir_mismatch(ctx: Context, paths: list[str]) -> list[Finding]:
    """kvops_gds_dir is what the directory checks (GDS-020.., GDS-080..) inspect: it must be
    where LMCache writes, compared after resolving symlinks on both sides."""
    if ctx.gds_dir is None:
        return []
    declared = ctx.real_path(ctx.gds_dir).rstrip("/") or "/"
    reals = [ctx.real_path(p).rstrip("/") or "/" for p in paths]
    if any(r == declared or r.startswith(declared + "/") for r in reals):
        return []
    msg = (
        f"kvops_gds_dir {ctx.gds_dir} (→ {declared}) is not where LMCache writes "
        f"({clip(', '.join(reals))}): the GDS directory checks judge another directory"
    )
    remedy = "Set kvops_gds_dir to LMCache's gds_path (or gds_path to the checked directory)."
    return [finding("GDS-060", Severity.WARN, msg, remedy=remedy)]


def check_buffer_key(ctx: Context) -> list[Finding]:
    config = _config_or_skip(ctx, "GDS-061")
    if isinstance(config, Finding):
        return [config]
    version = ctx.lmcache_version
    expected = buffer_key_for(version)
    present = [k for k in ("cufile_buffer_size", "gds_buffer_size") if k in config.file_keys]
    present += [k for k in ("cufile_buffer_size", "gds_buffer_size") if k in config.effective]
    if expected is None:
        msg = f"LMCache version unknown ({clip(ctx.problem(ev.LMCACHE_VERSION))}); keys: {present}"
        return [finding("GDS-061", Severity.WARN, msg)]
    if expected in config.effective:
        value = config.effective[expected]
        source = config.sources[expected]
        if value is None or value <= 0:
            msg = (
                f"{expected} = {config.unconverted.get(expected, clip_repr(value))} ({source}): "
                f"LMCache {clip(str(version))} reads it as {clip_repr(value)}, and the GDS "
                "backend asserts a size"
            )
            return [finding("GDS-061", Severity.FAIL, msg, remedy=f"Set {expected} to MiB.")]
        msg = f"{expected} = {value} MiB ({source}) for LMCache {version}"
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
    algorithm = str(config.value("pre_caching_hash_algorithm"))
    if algorithm in STABLE_HASHES:
        return [finding("GDS-062", Severity.PASS, f"pre_caching_hash_algorithm = {algorithm}")]
    env = ctx.service_env
    if env is None:
        return [ctx.skip("GDS-062", ev.VLLM_ENV)]
    seed = env.get("PYTHONHASHSEED")
    if seed is not None and seed.strip() and seed != "random":
        shown = clip(seed)
        return [finding("GDS-062", Severity.PASS, f"{algorithm} hash with PYTHONHASHSEED={shown}")]
    # CPython: "If this variable is not set or set to random, a random value is used", and an
    # empty value counts as not set (https://docs.python.org/3/using/cmdline.html#envvar-PYTHONHASHSEED).
    how = "without PYTHONHASHSEED" if seed is None else f"with PYTHONHASHSEED={seed!r}"
    if seed is not None and not seed.strip():
        how += " (empty: Python treats it as unset)"
    msg = (
        f"{algorithm} hash {how}: chunk keys change at every restart, "
        "so stored KV is never found again"
    )
    return [finding("GDS-062", Severity.FAIL, msg)]


def check_prometheus_dir(ctx: Context) -> list[Finding]:
    if ctx.role != ev.ROLE_OFFLOAD:
        return [finding("GDS-063", Severity.SKIP, _not_offload(ctx))]
    if is_lmcache_server(ctx):
        return [finding("GDS-063", Severity.SKIP, SERVER_MODE)]
    env = ctx.service_env
    if env is None:
        return [ctx.skip("GDS-063", ev.VLLM_ENV)]
    value = env.get("PROMETHEUS_MULTIPROC_DIR")
    if value:
        return [finding("GDS-063", Severity.PASS, f"PROMETHEUS_MULTIPROC_DIR={clip(value)}")]
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
    judged = buffer_keys | GDS_SWITCHES | {"gds_path"}  # judged by GDS-060/061/065
    unconverted = {k: v for k, v in config.unconverted.items() if k not in judged}
    if not unknown and not unconverted:
        return [finding("GDS-064", Severity.PASS, "all LMCache keys known and well-typed")]
    parts = []
    if unknown:
        ignored = clip(", ".join(unknown))
        parts.append(f"keys ignored by LMCache {clip(ctx.lmcache_version or '?')}: {ignored}")
    if unconverted:
        bad = clip(", ".join(f"{k} ({v})" for k, v in unconverted.items()), 4 * MAX_SHOWN_CHARS)
        parts.append(f"values LMCache cannot convert and reads as None: {bad}")
    return [finding("GDS-064", Severity.WARN, "; ".join(parts))]


# Keys whose value decides whether the GDS backend runs at all (lmcache 0.5.6
# `storage_backend/__init__.py`, `gds_backend.py`): judged together by GDS-065.
GDS_SWITCHES = frozenset({"use_gds", "gds_backend", "chunk_size", "extra_config"})
TRUE_STRINGS = ("true", "1")


def _gds_off_reasons(config: LmcacheConfig) -> list[str]:
    """Every effective setting that turns the GDS backend off, falls back to POSIX I/O, or
    stops LMCache at startup; read with LMCache's own parsing (`kvops.parse.lmcache_config`)."""
    reasons = []
    for key in sorted(GDS_SWITCHES & set(config.unconverted)):
        reasons.append(f"{key} = {config.unconverted[key]} does not convert: LMCache uses None")
    if config.is_set("use_gds") and config.value("use_gds") is False:
        raw = config.effective.get("use_gds")
        reasons.append(
            f"use_gds is false ({config.sources['use_gds']}): POSIX mmap+cudaMemcpy, not cuFile"
            + ("" if raw is False else f" (LMCache's booleans are only {TRUE_STRINGS})")
        )
    backend = config.value("gds_backend")
    if backend not in (None, "cufile"):
        reasons.append(f"gds_backend = {clip_repr(backend)}: NVIDIA GDS needs 'cufile'")
    chunk = config.value("chunk_size")
    if isinstance(chunk, int) and chunk <= 0:
        reasons.append(f"chunk_size = {chunk}: must be positive")
    extra = config.value("extra_config")
    direct = extra.get("use_direct_io") if isinstance(extra, dict) else None
    if direct is not None and not isinstance(direct, (bool, str)):
        reasons.append(
            f"extra_config.use_direct_io = {clip_repr(direct)} is neither bool nor string: "
            "the GDS backend raises RuntimeError at startup"
        )
    return reasons


def check_gds_stays_on(ctx: Context) -> list[Finding]:
    config = _config_or_skip(ctx, "GDS-065")
    if isinstance(config, Finding):
        return [config]
    reasons = _gds_off_reasons(config)
    if reasons:
        return [finding("GDS-065", Severity.FAIL, "; ".join(reasons))]
    use_gds = config.value("use_gds")
    origin = config.sources.get("use_gds", "default")
    msg = f"use_gds {use_gds} ({origin}), gds_backend {clip(str(config.value('gds_backend')))}"
    return [finding("GDS-065", Severity.PASS, msg)]


# LMCache 0.5.6 log lines that mean slower or misconfigured offload without any error
# (`lmcache/v1/platform/devices/cuda/device_ops.py`, `config_base.py`, `config.py`), or loads
# that failed and were recomputed (`lmcache/integration/vllm/vllm_v1_adapter.py`,
# `lmcache/v1/storage_backend/gds_backend.py` `_load_gds`).
DEGRADED = (
    "LMCache failed to initialise and the server runs without offload, healthy on /health "
    "(degraded mode: every request recomputed)"
)
FAILED_LOAD = (
    "a KV load from the offload tier failed and vLLM recomputed those tokens "
    "(kv_load_failure_policy: recompute): no request lost, but offload did not serve it"
)
JOURNAL_PROBLEMS = (
    ("Failed to initialize LMCacheManager components", DEGRADED),
    ("marked as init failed", DEGRADED),
    ("degraded mode", DEGRADED),
    ("The number of retrieved tokens is less than the expected number of tokens", FAILED_LOAD),
    ("GDS read failed", "a chunk file could not be read from gds_path: " + FAILED_LOAD),
    ("cuda_ops compiled extension not found", "LMCache runs its pure-torch fallback (ABI "
     "mismatch with torch): rebuild/reinstall LMCache for this torch"),
    ("Unknown configuration key", "a config key is ignored"),
    ("does not exist in configuration", "a kv_connector_extra_config lmcache.* key is ignored"),
    ("Failed to convert value", "a value did not convert and LMCache uses None"),
)  # fmt: skip
# Worth a WARN, not a FAIL: LMCache's start-up scan of gds_path (`GdsBackend._scan_metadata`,
# which preloads the index of chunks already on disk) stopped. In 0.5.6 the scan is scheduled on
# LMCache's event loop before the constructor sets `_use_noatime`, and when the scan wins that
# race its first metadata read raises AttributeError ("Failed to read metadata file ... during GDS
# start; raising the error to fail startup", though start-up goes on); seen in this project's
# engine tier. Offload still serves those chunks: a lookup that misses the index reads the
# chunk's metadata file on demand (`contains()`).
SCAN_STOPPED = (
    "LMCache's start-up scan of gds_path stopped at a chunk's metadata: chunks stored before this "
    "start are not preloaded and are found by on-demand lookups only (LMCache 0.5.6's scan can "
    "race its own constructor; restart to retry)"
)
JOURNAL_WARNINGS = (("during GDS start", SCAN_STOPPED),)
# LMCache's multiprocess server (offload_mp), 0.5.6: lmcache/v1/multiprocess/transport/zmq_impl/
# mq.py, server.py, and uvicorn's start-up failure.
SERVER_PROBLEMS = (
    ("No handler registered for operation", "vLLM registers in a transfer mode the server does "
     "not serve and never gets healthy: set --supported-transfer-mode auto"),
    ("Application startup failed", "the LMCache server failed to start"),
    ("Insufficient /dev/shm capacity", "the server fell back from shared memory to pickle"),
    ("Cannot verify /dev/shm capacity", "the server fell back from shared memory to pickle"),
)  # fmt: skip


def _log_lines(ctx: Context, tail: str, problems: str) -> list[str] | None:
    """A journal tail plus the problem lines of the whole run (journalctl --grep), which the
    tail may have lost; None when the tail is missing."""
    text = ctx.text(tail)
    if text is None:
        return None
    lines = text.splitlines()
    early = [ln for ln in (ctx.text(problems) or "").splitlines() if ln]
    seen = set(lines)
    return lines + [ln for ln in early if ln not in seen]


def check_service_log(ctx: Context) -> list[Finding]:
    if ctx.role != ev.ROLE_OFFLOAD:
        return [finding("GDS-066", Severity.SKIP, _not_offload(ctx))]
    lines = _log_lines(ctx, ev.VLLM_JOURNAL, ev.VLLM_JOURNAL_PROBLEMS)
    if lines is None:
        return [ctx.skip("GDS-066", ev.VLLM_JOURNAL)]
    logs: list[tuple[str, list[str], tuple[tuple[str, str], ...]]] = [("", lines, JOURNAL_PROBLEMS)]
    # offload_mp: LMCache logs in its server's unit
    server = _log_lines(ctx, ev.LMCACHE_SERVER_JOURNAL, ev.LMCACHE_SERVER_JOURNAL_PROBLEMS)
    if server is not None:
        logs.append(("LMCache server: ", server, JOURNAL_PROBLEMS + SERVER_PROBLEMS))
    elif is_lmcache_server(ctx):
        return [ctx.skip("GDS-066", ev.LMCACHE_SERVER_JOURNAL)]
    found: list[str] = []
    shown: list[str] = []
    for where, log, problems in logs:
        log_found, log_shown = journal_problems(log, problems)
        found += [where + text for text in log_found]
        shown += log_shown
    if found:
        return [finding("GDS-066", Severity.FAIL, "; ".join(found), "\n".join(shown))]
    warned, warned_shown = journal_problems(lines, JOURNAL_WARNINGS)
    if warned:
        return [finding("GDS-066", Severity.WARN, "; ".join(warned), "\n".join(warned_shown))]
    counted = " + ".join(str(len(log)) for _, log, _ in logs)
    return [finding("GDS-066", Severity.PASS, f"{counted} log lines, no LMCache fallback")]


def problem_lines(lines: Iterable[str]) -> list[str]:
    """The lines of a service log that name one of `JOURNAL_PROBLEMS` or `JOURNAL_WARNINGS`
    (what `journalctl --grep` keeps in the probe's `vllm_journal_problems`): enough to judge the
    log again offline."""
    needles = [needle for needle, _ in JOURNAL_PROBLEMS + JOURNAL_WARNINGS]
    return [ln.strip() for ln in lines if any(needle in ln for needle in needles)]


def journal_problems(
    lines: Sequence[str], problems: tuple[tuple[str, str], ...] = JOURNAL_PROBLEMS
) -> tuple[list[str], list[str]]:
    """What a service log says went wrong with LMCache: one "<n>x '<text>': <meaning>" per
    problem found, and up to two quoted lines of each (GDS-066 and `kvops smoke`'s GDS-208)."""
    found: list[str] = []
    shown: list[str] = []
    for needle, meaning in problems:
        hits = [ln.strip() for ln in lines if needle in ln]
        if hits:
            found.append(f"{len(hits)}x '{needle}': {meaning}")
            shown.extend(hits[:2])
    return found, shown


CHECKS = [
    check_gds_path,
    check_buffer_key,
    check_stable_hash,
    check_prometheus_dir,
    check_unknown_keys,
    check_gds_stays_on,
    check_service_log,
]
