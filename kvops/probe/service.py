"""vLLM service evidence: unit, running process, its environment, LMCache config and version,
and the HTTP endpoints.

The running process is the truth (its argv and environ are what vLLM and libcufile actually
see); the unit's Environment=/EnvironmentFile= are the fallback when /proc/<pid> is unreadable.
Without systemd (the lab runs sshd as PID 1) the process is found by the socket listening on the
vLLM URL's port. Secret-looking values (tokens, passwords, API keys) are replaced by
"<redacted>" before anything leaves the host: evidence bundles get saved and attached to tickets.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shlex
import time
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlparse

from .core import KIND_COMMAND, KIND_FILE, KIND_HTTP, KIND_SYSFS, Probe, read_text
from .redact import redact_argv, redact_env, redact_text


def parse_show(text: str) -> Dict[str, List[str]]:
    """`systemctl show` KEY=VALUE lines; a key may repeat (EnvironmentFiles)."""
    props: Dict[str, List[str]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props.setdefault(key, []).append(value)
    return props


def parse_env_assignments(text: str) -> Dict[str, str]:
    """KEY=VALUE pairs of an EnvironmentFile or a unit's Environment= value (shell-like quoting)."""
    env: Dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        try:
            words = shlex.split(line)
        except ValueError:
            words = line.split()
        for word in words:
            key, sep, value = word.partition("=")
            if sep and re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                env[key] = value
    return env


def _exec_start_argv(values: List[str]) -> List[str]:
    for value in values:
        m = re.search(r"argv\[\]=(.*?) ;", value)
        if m:
            try:
                return shlex.split(m.group(1))
            except ValueError:
                return m.group(1).split()
    return []


def _listener_pid(port: int) -> Optional[int]:
    """PID owning a TCP socket listening on `port` (from /proc/net/tcp{,6} and /proc/*/fd).

    Processes and sockets are always read from the real /proc, never through the roots seam:
    a recorded tree stands in for kernel state (modules, driver files), not for processes."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh, None)
                for line in fh:
                    cols = line.split()
                    if (
                        len(cols) > 9
                        and cols[3] == "0A"
                        and int(cols[1].rsplit(":", 1)[1], 16) == port
                    ):
                        inodes.add("socket:[%s]" % cols[9])
        except (OSError, ValueError, IndexError):
            continue
    if not inodes:
        return None
    proc = "/proc"
    for pid in sorted((d for d in os.listdir(proc) if d.isdigit()), key=int):
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            for fd in os.listdir(fd_dir):
                if os.readlink(os.path.join(fd_dir, fd)) in inodes:
                    return int(pid)
        except OSError:
            continue
    return None


def _process_data(pid: int) -> Tuple[Dict[str, Any], Optional[Dict[str, str]]]:
    base = "/proc/%d" % pid
    with open(os.path.join(base, "cmdline"), "rb") as fh:
        argv = [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
    uid = None
    for line in (read_text(os.path.join(base, "status"), 65536) or "").splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
    try:
        user = pwd.getpwuid(uid).pw_name if uid is not None else None
    except KeyError:
        user = str(uid)
    env: Optional[Dict[str, str]] = None
    try:
        with open(os.path.join(base, "environ"), "rb") as fh:
            raw = fh.read(1024 * 1024).split(b"\0")
        env = {}
        for entry in raw:
            key, sep, value = entry.decode("utf-8", "replace").partition("=")
            if sep:
                env[key] = value
    except OSError:
        env = None  # another user's environ needs root (become): fall back to the unit
    return {"pid": pid, "user": user, "argv": redact_argv(argv)}, env


SITE_GLOBS = (
    "lib/python3*/site-packages",
    "lib/python3*/dist-packages",
    "local/lib/python3*/dist-packages",
    "lib64/python3*/site-packages",
)
METADATA_LIMIT = 64 * 1024


def _prefixes(argv: List[str], env: Dict[str, str], settings: Dict[str, Any]) -> List[str]:
    """Install prefixes to look in: the inventory's venv, the service's VIRTUAL_ENV, the
    directory above argv[0]'s bin/, then the system ones. Only ever read, never run."""
    found: List[str] = []
    for value in (settings.get("vllm_venv"), env.get("VIRTUAL_ENV")):
        if value:
            found.append(str(value))
    if argv and os.path.isabs(argv[0]):
        found.append(os.path.dirname(os.path.dirname(argv[0])))
    found += ["/usr/local", "/usr", "/opt/conda"]
    out: List[str] = []
    for prefix in found:
        if prefix not in out:
            out.append(prefix)
    return out


def _metadata_header(path: str) -> Dict[str, str]:
    """Name and Version of a core-metadata file (the header before the first blank line)."""
    fields: Dict[str, str] = {}
    try:
        with open(path, "rb") as fh:
            text = fh.read(METADATA_LIMIT).decode("utf-8", "replace")
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep and key in ("Name", "Version"):
            fields[key] = value.strip()
    return fields


def distribution_version(
    package: str, prefixes: List[str], root: str = ""
) -> "Tuple[Optional[str], List[str]]":
    """(path of the installed `package`'s METADATA, where it was looked for).

    Reads `*.dist-info/METADATA` (https://packaging.python.org/en/latest/specifications/
    recording-installed-packages/) instead of importing the package or running the service's
    Python: that Python, its `.pth` files and its site-packages belong to the service, and the
    probe may run as root. `root` is /proc/<pid>/root, so a containerised service is read in
    its own filesystem."""
    looked: List[str] = []
    wanted = re.sub(r"[-_.]+", "_", package).lower()
    for prefix in prefixes:
        for pattern in SITE_GLOBS:
            where = os.path.join(root + prefix, pattern)
            looked.append(where)
            for info in sorted(glob.glob(os.path.join(where, "*.dist-info"))):
                name = os.path.basename(info)[: -len(".dist-info")].split("-", 1)[0]
                if re.sub(r"[-_.]+", "_", name).lower() == wanted:
                    return os.path.join(info, "METADATA"), looked
    return None, looked


def collect_lmcache_version(
    p: Probe, argv: List[str], env: Dict[str, str], settings: Dict[str, Any], pid: int
) -> None:
    """Record LMCache's Name/Version from its METADATA in the service's filesystem."""
    start = time.monotonic()
    prefixes = _prefixes(argv, env, settings)
    path: Optional[str] = None
    looked: List[str] = []
    for root in (["/proc/%d/root" % pid] if pid else []) + [""]:
        path, tried = distribution_version("lmcache", prefixes, root)
        looked += tried
        if path:
            break
    item: Dict[str, Any] = {"kind": KIND_FILE, "source": path or ""}
    fields = _metadata_header(path) if path else {}
    if fields.get("Version"):
        item["stdout"] = "Name: %s\nVersion: %s\n" % (fields.get("Name", ""), fields["Version"])
        item["error"] = None
    elif path:
        item["error"] = "no Version in %s" % path
    else:
        item["error"] = "ENOENT lmcache-*.dist-info/METADATA not in %s" % ", ".join(looked[:6])
    item["duration_s"] = round(time.monotonic() - start, 4)
    p.items["lmcache_version"] = item


def collect_service(p: Probe, settings: Dict[str, Any]) -> Dict[str, Any]:
    """Record the service items; return what storage collection needs (env, service user)."""
    unit = settings.get("vllm_service") or "vllm.service"
    item = p.command("vllm_unit", ["systemctl", "cat", "--no-pager", unit])
    if item.get("stdout"):
        item["stdout"] = redact_text(item["stdout"])
    show_item = p.command(
        "vllm_unit_show",
        [
            "systemctl",
            "show",
            "--no-pager",
            unit,
            "-p",
            "LoadState,ActiveState,MainPID,User,InvocationID",
            "-p",
            "Environment,EnvironmentFiles,ExecStart",
        ],
    )
    show = parse_show(show_item.get("stdout") or "") if show_item.get("exit_code") == 0 else {}
    if show_item.get("stdout"):
        show_item["stdout"] = redact_text(show_item["stdout"])

    start = time.monotonic()
    pid, found_by = 0, None
    try:
        pid = int((show.get("MainPID") or ["0"])[-1])
        found_by = "systemd MainPID" if pid else None
    except ValueError:
        pid = 0
    port = _url_port(settings.get("vllm_url") or "")
    if not pid and port:
        pid = _listener_pid(port) or 0
        found_by = "listening socket :%d" % port if pid else None
    proc_data: Optional[Dict[str, Any]] = None
    proc_env: Optional[Dict[str, str]] = None
    error = None
    source = "/proc/%d" % pid if pid else "/proc"
    if pid:
        try:
            proc_data, proc_env = _process_data(pid)
            proc_data["found_by"] = found_by
            serving = _serving_descendant(pid)
            if serving is not None:
                proc_data["serving_pid"], proc_data["serving_argv"] = serving
        except OSError as exc:
            error = "cannot read %s: %s" % (source, exc)
    else:
        error = "vLLM service not running: %s has no MainPID and nothing listens on port %s" % (
            unit,
            port,
        )
    p.structured("vllm_process", KIND_SYSFS, source, proc_data, error, start)

    start = time.monotonic()
    if proc_env is not None:
        env, origin, env_source = proc_env, "process", os.path.join(source, "environ")
    else:
        env, origin = {}, "unit"
        env_source = "systemctl show %s -p Environment,EnvironmentFiles" % unit
        for path in show.get("EnvironmentFiles", []):
            path = path.split(" (", 1)[0].lstrip("-")
            text = read_text(p.path(path), 1024 * 1024)
            if text is not None:
                env.update(parse_env_assignments(text))
        for value in show.get("Environment", []):
            env.update(parse_env_assignments(value))
    env_error = None if (proc_env is not None or show) else "no process environ and no unit"
    p.structured(
        "vllm_env",
        KIND_SYSFS,
        env_source,
        {"env": redact_env(env), "from": origin},
        env_error,
        start,
    )

    lmcache_path = settings.get("lmcache_config_path") or env.get("LMCACHE_CONFIG_FILE")
    user = settings.get("service_user") or (proc_data or {}).get("user")
    if not user and show:
        user = (show.get("User") or [""])[-1] or "root"
    if lmcache_path:
        from_service = not settings.get("lmcache_config_path")
        lm = p.file("lmcache_config", lmcache_path, readable_by=user if from_service else None)
        if lm.get("stdout"):
            lm["stdout"] = redact_text(lm["stdout"])
    else:
        p.items["lmcache_config"] = {
            "kind": KIND_FILE,
            "source": "",
            "error": "no LMCache config path: settings.lmcache_config_path unset and "
            "LMCACHE_CONFIG_FILE not in the service environment",
            "duration_s": 0.0,
        }
    collect_journal(p, unit, (show.get("InvocationID") or [""])[-1])
    argv = (proc_data or {}).get("argv") or _exec_start_argv(show.get("ExecStart", []))
    root_pid = int((proc_data or {}).get("serving_pid") or pid or 0) if proc_data else 0
    collect_launch_files(p, [(proc_data or {}).get("serving_argv") or [], argv], root_pid, user)
    collect_lmcache_version(p, argv, env, settings, pid if proc_data else 0)
    return {"env": env, "service_user": user}


DESCENDANT_DEPTH = 4


def _children() -> Dict[int, List[int]]:
    """ppid → pids, from /proc/*/stat (field 4, after the parenthesised command name)."""
    out: Dict[int, List[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat_text = read_text("/proc/%s/stat" % name, 1024) or ""
        fields = stat_text.rpartition(")")[2].split()
        if len(fields) > 1 and fields[1].isdigit():
            out.setdefault(int(fields[1]), []).append(int(name))
    return out


def _serving_descendant(pid: int) -> "Optional[Tuple[int, List[str]]]":
    """The process under MainPID that really serves (a wrapper script's child, a container's
    process under podman's conmon): the first descendant whose argv names vLLM's connector
    config or vLLM itself. None when MainPID is that process already."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            own = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    if "--kv-transfer-config" in own or "--kv_transfer_config" in own:
        return None
    children = _children()
    level = children.get(pid, [])
    for _ in range(DESCENDANT_DEPTH):
        nxt: List[int] = []
        for child in sorted(level):
            try:
                with open("/proc/%d/cmdline" % child, "rb") as fh:
                    argv = [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
            except OSError:
                continue
            text = " ".join(argv)
            if "--kv-transfer-config" in text or "--kv_transfer_config" in text or "vllm" in text:
                return child, redact_argv(argv)
            nxt += children.get(child, [])
        level = nxt
    return None


SHELLS = ("sh", "bash", "dash", "zsh")


def _flag_value(argv: List[str], flag: str) -> Optional[str]:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _in_process_root(pid: int, path: str) -> str:
    """Where to read a path the service names: inside its own filesystem (a container's
    /proc/<pid>/root) when that is readable, else the host's."""
    if pid and os.path.isabs(path):
        inside = "/proc/%d/root%s" % (pid, path)
        if os.path.exists(inside):
            return inside
    return path


def collect_launch_files(
    p: Probe, argvs: List[List[str]], pid: int, user: Optional[str] = None
) -> None:
    """Files that carry vLLM's arguments when argv does not: `vllm serve --config FILE`
    (https://docs.vllm.ai/en/latest/configuration/serve_args.html) and a wrapper script the
    unit starts. Read as text and redacted, never executed."""
    config = next((v for v in (_flag_value(a, "--config") for a in argvs) if v), None)
    if config:
        item = p.file("vllm_config_file", _in_process_root(pid, config), readable_by=user)
        if item.get("stdout"):
            item["stdout"] = redact_text(item["stdout"])
    script = None
    for argv in argvs:
        if not argv:
            continue
        words = argv[1:] if os.path.basename(argv[0]) in SHELLS else argv[:1]
        candidate = next((w for w in words if not w.startswith("-")), None)
        if candidate and os.path.isabs(candidate) and _is_script(candidate):
            script = candidate
            break
    if script:
        item = p.file("vllm_wrapper", script, readable_by=user)
        if item.get("stdout"):
            item["stdout"] = redact_text(item["stdout"])


def _is_script(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == b"#!"
    except OSError:
        return False


JOURNAL_LINES = 3000
# LMCache 0.5.6's log texts of a silent failure: its initialisation failing into "degraded mode
# (recompute)" (lmcache/v1/manager.py, lmcache/v1/cache_engine.py), loads from storage that
# failed and were recomputed (lmcache/integration/vllm/vllm_v1_adapter.py,
# lmcache/v1/storage_backend/gds_backend.py), the pure-torch fallback and ignored settings
# (device_ops.py, config_base.py, config.py). Most are logged once, at start, and scroll out of
# the tail of a busy server's log; journalctl --grep keeps them.
LMCACHE_PROBLEM_TEXTS = (
    "Failed to initialize LMCacheManager components",
    "marked as init failed",
    "degraded mode",
    "The number of retrieved tokens is less than the expected number of tokens",
    "GDS read failed",
    "cuda_ops compiled extension not found",
    "Unknown configuration key",
    "does not exist in configuration",
    "Failed to convert value",
    # a WARN: LMCache's start-up scan of gds_path stopped (kvops.checks.lmcache.JOURNAL_WARNINGS)
    "during GDS start",
)
PROBLEM_LINES = 200


def collect_journal(
    p: Probe,
    unit: str,
    invocation: str,
    names: "Tuple[str, str]" = ("vllm_journal", "vllm_journal_problems"),
    problems: "Tuple[str, ...]" = LMCACHE_PROBLEM_TEXTS,
) -> None:
    """The service's log of its current run (systemd's InvocationID), else of this boot: LMCache
    reports a missing compiled extension or an ignored key only there, as a warning."""
    argv = ["journalctl", "--no-pager", "-o", "cat", "-n", str(JOURNAL_LINES)]
    if invocation:
        argv.append("_SYSTEMD_INVOCATION_ID=%s" % invocation)
    else:
        argv += ["-b", "-u", unit]
    item = p.command(names[0], argv)
    if item.get("stdout"):
        item["stdout"] = redact_text(item["stdout"])
    pattern = "|".join(re.escape(text) for text in problems)
    grep = [*argv[:4], "--grep", pattern, "-n", str(PROBLEM_LINES), *argv[6:]]
    item = p.command(names[1], grep)
    if item.get("stdout"):
        item["stdout"] = redact_text(item["stdout"])


# LMCache's multiprocess server (`lmcache server`, the vllm_lmcache role's offload_mp variant):
# its log texts of a failure, in LMCache 0.5.6 (lmcache/v1/multiprocess/transport/zmq_impl/mq.py,
# server.py; uvicorn's "Application startup failed"), besides the in-process ones.
LMCACHE_SERVER_PROBLEM_TEXTS = (
    *LMCACHE_PROBLEM_TEXTS,
    "No handler registered for operation",
    "Application startup failed",
    "Insufficient /dev/shm capacity",
    "Cannot verify /dev/shm capacity",
)
NOT_MP = "no LMCache server declared (settings.lmcache_server_service/_url unset: not offload_mp)"


# ExecStart: the server's --chunk-size and --hash-algorithm, which hosts sharing its file tier
# must agree on (kvops/checks/shared_store.py).
SERVER_PROPERTIES = "ActiveState,MainPID,InvocationID,ExecStart"


def collect_lmcache_server(p: Probe, settings: Dict[str, Any]) -> None:
    """The LMCache server's log of its current run (settings.lmcache_server_service) and its
    HTTP frontend's /healthcheck and /metrics (settings.lmcache_server_url): where an offload_mp
    host's LMCache reports, instead of vLLM's log and /metrics."""
    unit = settings.get("lmcache_server_service") or ""
    if unit:
        show = p.command(
            "lmcache_server_unit_show",
            ["systemctl", "show", "--no-pager", unit, "-p", SERVER_PROPERTIES],
        )
        fields = parse_show(show.get("stdout") or "") if show.get("exit_code") == 0 else {}
        invocation = (fields.get("InvocationID") or [""])[-1]
        names = ("lmcache_server_journal", "lmcache_server_journal_problems")
        collect_journal(p, unit, invocation, names, LMCACHE_SERVER_PROBLEM_TEXTS)
    else:
        for name in (
            "lmcache_server_unit_show",
            "lmcache_server_journal",
            "lmcache_server_journal_problems",
        ):
            p.items[name] = {"kind": KIND_COMMAND, "source": "", "error": NOT_MP, "duration_s": 0.0}
    base = (settings.get("lmcache_server_url") or "").rstrip("/")
    if base:
        p.http("lmcache_server_health", base + "/healthcheck")
        p.http("lmcache_server_metrics", base + "/metrics", limit=4 * 1024 * 1024)
    else:
        for name in ("lmcache_server_health", "lmcache_server_metrics"):
            p.items[name] = {"kind": KIND_HTTP, "source": "", "error": NOT_MP, "duration_s": 0.0}


def _url_port(url: str) -> Optional[int]:
    if not url:
        return None
    try:
        parsed = urlparse(url)
        return parsed.port or (443 if parsed.scheme == "https" else 80)
    except ValueError:
        return None


def collect_http(p: Probe, settings: Dict[str, Any]) -> None:
    base = (settings.get("vllm_url") or "http://127.0.0.1:8000").rstrip("/")
    p.http("http_health", base + "/health")
    p.http("http_version", base + "/version")
    p.http("http_models", base + "/v1/models")
    p.http("http_metrics", base + "/metrics", limit=4 * 1024 * 1024)
