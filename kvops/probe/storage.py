"""GDS evidence: the cufile.json the service reads, `gdscheck -p`, the GDS directory, and the
optional gdsio write+read with nvidia-fs counters around it.

What the host's side may decide is kept small, because the probe may run as root:
- gdscheck/gdsio get a clean environment with an explicit config path and a private log path
  (`CUFILE_ENV_PATH_JSON`, `CUFILE_LOGFILE_PATH`; NVIDIA GDS Installation and Troubleshooting
  Guide, "cufile.json" / "CUFILE_ENV_PATH_JSON"), never the service's `CUFILE_*` variables; a
  cufile.json path taken from the service environment is used only when root owns the file and
  nobody else can write it.
- the GDS directory lives on NFS, and a hard mount that stops answering blocks every call in
  the kernel: each access (stat, statvfs, walk, bench directory) runs in a child with its own
  time budget (`core.in_child`).
- the bench writes only inside a fresh `mkdtemp` directory made by the service user (the user
  whose I/O matters; a root-squashed export would fail a root bench falsely), removed on every
  exit path; directories left by a killed earlier run are removed at the next one.
A GPU-direct run whose nvidia-fs read/write counters do not move is the proof that cuFile fell
back to POSIX, so the stats are read right before and after.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import stat
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from .core import KIND_COMMAND, KIND_DIR, Probe, in_child

CUDA_TOOL_GLOBS = ["/usr/local/cuda/gds/tools", "/usr/local/cuda-*/gds/tools"]
WALK_LIMIT = 200000
TMP_LIST_LIMIT = 20
BENCH_PREFIX = "kvops-gdsio-"
LEGACY_BENCH_SUBDIR = "kvops-gdsio"
DEFAULT_CUFILE_JSON = "/etc/cufile.json"


def _trusted_by_root(path: str) -> Optional[str]:
    """None when root owns the file (symlinks resolved) and no one else may write it or its
    directory; else why the probe will not let root read it on the service's word."""
    real = os.path.realpath(path)
    for target in (real, os.path.dirname(real)):
        try:
            st = os.stat(target)
        except OSError as exc:
            return "cannot stat %s: %s" % (target, exc.strerror or exc)
        if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return "%s is owned by uid %d with mode 0o%o" % (
                target,
                st.st_uid,
                stat.S_IMODE(st.st_mode),
            )
    return None


def cufile_path(p: Probe, settings: Dict[str, Any], env: Dict[str, str]) -> "tuple[str, str]":
    """(path the tools and the cufile_json item use, why the service's path was not used)."""
    if settings.get("cufile_json_path"):
        return str(settings["cufile_json_path"]), ""
    service_path = env.get("CUFILE_ENV_PATH_JSON")
    if not service_path:
        return DEFAULT_CUFILE_JSON, ""
    why = _trusted_by_root(p.path(service_path))
    if why is None:
        return service_path, ""
    return DEFAULT_CUFILE_JSON, (
        "CUFILE_ENV_PATH_JSON=%s from the service environment not read (%s); "
        "set kvops_cufile_json to judge it" % (service_path, why)
    )


def tool_env(p: Probe, config_path: str, log_dir: Optional[str] = None) -> Dict[str, str]:
    """The only cuFile variables a tool gets: the config to read and where to log."""
    return {
        "CUFILE_ENV_PATH_JSON": p.path(config_path),
        "CUFILE_LOGFILE_PATH": os.path.join(log_dir or p.workdir(), "cufile.log"),
    }


def collect_gds(p: Probe, settings: Dict[str, Any], service: Dict[str, Any]) -> None:
    env = service.get("env") or {}
    config_path, refused = cufile_path(p, settings, env)
    item = p.file("cufile_json", config_path)
    if refused:
        item["note"] = refused
    argv = [p.which("gdscheck", CUDA_TOOL_GLOBS) or "gdscheck", "-p"]
    wrapper = None if os.path.isabs(argv[0]) else p.which("gdscheck.py", CUDA_TOOL_GLOBS)
    if wrapper:  # only the python wrapper is installed (gds-tools packaging varies)
        argv = [sys.executable or "python3", "-I", "-S", wrapper, "-p"]
    p.command("gdscheck", argv, extra_env=tool_env(p, config_path))
    gds_dir(p, settings.get("gds_dir"), service.get("service_user"), env)
    gds_prune_timer(p, settings)
    if settings.get("storage_bench"):
        bench(p, settings, config_path, service.get("service_user"))


def _user_can_write(st: os.stat_result, user: Optional[str]) -> Optional[bool]:
    """Whether `user` may create files in a directory with this stat (mode bits; ACLs ignored)."""
    if not user:
        return None
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return None
    if pw.pw_uid == 0:
        return True
    try:
        gids = set(os.getgrouplist(user, pw.pw_gid))
    except OSError:
        gids = {pw.pw_gid}
    mode = st.st_mode
    if st.st_uid == pw.pw_uid:
        return bool(mode & stat.S_IWUSR and mode & stat.S_IXUSR)
    if st.st_gid in gids:
        return bool(mode & stat.S_IWGRP and mode & stat.S_IXGRP)
    return bool(mode & stat.S_IWOTH and mode & stat.S_IXOTH)


def _user_ids(user: Optional[str]) -> Dict[str, Optional[int]]:
    """The service user's uid and primary gid on this host (None: no such user)."""
    try:
        pw = pwd.getpwnam(user) if user else None
    except KeyError:
        pw = None
    return {
        "service_uid": pw.pw_uid if pw else None,
        "service_gid": pw.pw_gid if pw else None,
    }


def _name(lookup: Any, ident: int) -> str:
    try:
        return str(lookup(ident)[0])
    except KeyError:
        return str(ident)


def _storage_budget_s(p: Probe) -> float:
    return max(min(p.command_timeout_s, p.remaining() - 1.0), 0.5)


def summarize_dir(
    path: str, service_user: Optional[str], walk_s: float, others: Optional[List[str]] = None
) -> Dict[str, Any]:
    """stat, statvfs and a bounded walk of the GDS directory (runs in a child), and the real
    path of it and of LMCache's gds_path(s): a symlink decides which mount a path is on."""
    data: Dict[str, Any] = {"exists": False, "is_dir": False, "service_user": service_user}
    data["resolved_paths"] = {p: os.path.realpath(p) for p in [path, *(others or [])]}
    try:
        st = os.stat(path)
    except OSError as exc:
        data["error"] = "cannot stat %s: %s" % (path, exc)
        return data
    data.update(
        exists=True,
        is_dir=stat.S_ISDIR(st.st_mode),
        owner=_name(pwd.getpwuid, st.st_uid),
        group=_name(grp.getgrgid, st.st_gid),
        owner_uid=st.st_uid,
        owner_gid=st.st_gid,
        mode="0o%o" % stat.S_IMODE(st.st_mode),
        writable_by_service_user=_user_can_write(st, service_user),
    )
    # The ids the service writes with: with sec=sys a shared export checks numbers, so hosts
    # sharing the directory must agree on them whatever the names (nfs(5), "sec=sys").
    data.update(_user_ids(service_user))
    try:
        vfs = os.statvfs(path)
        data["free_bytes"] = vfs.f_bavail * vfs.f_frsize
        data["total_bytes"] = vfs.f_blocks * vfs.f_frsize
    except OSError:
        pass
    data.update(walk_dir(path, walk_s))
    return data


def walk_dir(path: str, walk_s: float) -> Dict[str, Any]:
    """Chunk files, bytes and temporary files under `path`, walked for at most `walk_s`;
    `unlisted` names a directory that could not be listed."""
    files = total = walked = tmp_count = 0
    tmp: List[str] = []
    unlisted: List[str] = []
    out: Dict[str, Any] = {}
    stop = time.monotonic() + walk_s
    for root, dirs, names in os.walk(path, onerror=lambda exc: unlisted.append(str(exc))):
        dirs[:] = [d for d in dirs if not _is_bench_dir(d)]
        for name in names:
            walked += 1
            full = os.path.join(root, name)
            try:
                total += os.lstat(full).st_size
            except OSError:
                continue
            files += 1
            if ".tmp" in name:
                tmp_count += 1
                if len(tmp) < TMP_LIST_LIMIT:
                    tmp.append(full)
        if walked >= WALK_LIMIT or time.monotonic() > stop:
            out["error"] = "directory walk stopped after %d entries (limit or deadline)" % walked
            break
    if unlisted:
        out["unlisted"] = unlisted[0]
    out.update(file_count=files, bytes=total, tmp_file_count=tmp_count, tmp_files=tmp)
    return out


def _known_user(user: Optional[str]) -> bool:
    if not user:
        return False
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def _is_bench_dir(name: str) -> bool:
    return name == LEGACY_BENCH_SUBDIR or name.startswith(BENCH_PREFIX)


_GDS_PATH_LINE = re.compile(r"^\s*gds_path\s*:\s*['\"]?([^'\"#\n]+?)['\"]?\s*(?:#.*)?$", re.M)


def lmcache_gds_paths(p: Probe, env: Dict[str, str]) -> List[str]:
    """Absolute paths LMCache may write to (its YAML's `gds_path:` lines, LMCACHE_GDS_PATH;
    comma lists split), only to resolve their symlinks; judging them is the checks' job."""
    text = str((p.items.get("lmcache_config") or {}).get("stdout") or "")
    raw = [*_GDS_PATH_LINE.findall(text), env.get("LMCACHE_GDS_PATH") or ""]
    paths = [part.strip() for value in raw for part in value.split(",")]
    return sorted({path for path in paths if os.path.isabs(path)})


def gds_dir(
    p: Probe, path: Optional[str], service_user: Optional[str], env: Optional[Dict[str, str]] = None
) -> None:
    start = time.monotonic()
    if not path:
        p.structured("gds_dir", KIND_DIR, "", None, "settings.gds_dir not set", start)
        return
    if p.out_of_time("gds_dir", KIND_DIR, path):
        return
    budget = _storage_budget_s(p)
    others = lmcache_gds_paths(p, env or {})
    data, error = in_child(lambda: summarize_dir(path, service_user, budget * 0.8, others), budget)
    if data is None:
        data = {"exists": None, "is_dir": None, "service_user": service_user}
        error = "GDS directory %s %s" % (path, error)
    else:
        unlisted = data.pop("unlisted", None)
        if unlisted and _known_user(service_user):
            # On an export with root squashed (ONTAP `superuser none`) root is nobody there
            # and cannot list the service's directory: walk it again as the service user,
            # whose view is LMCache's.
            left = max(min(budget, p.remaining() - 1.0), 0.5)
            walk, _ = in_child(lambda: walk_dir(path, left * 0.8), left, as_user=service_user)
            if walk is not None and not walk.get("unlisted"):
                data.update(walk, walked_as=service_user)
                unlisted = None
        error = data.pop("error", None) or (
            "cannot list part of %s: %s" % (path, unlisted) if unlisted else None
        )
    p.structured("gds_dir", KIND_DIR, path, data, error, start)


DEFAULT_PRUNE_TIMER = "kvops-gds-prune.timer"
_TIMER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9@._:-]{0,240}\.timer$")
PRUNE_TIMER_PROPERTIES = "Id,LoadState,UnitFileState,ActiveState,ExecStart"


def gds_prune_timer(p: Probe, settings: Dict[str, Any]) -> None:
    """`systemctl show` of the timer that prunes the GDS directory and of its service (the
    role's `kvops gds prune` unit, named like the timer): LMCache's GDS backend never evicts
    (LMCache issue #1724), so a store nobody prunes fills its volume. The name comes from
    the inventory (settings.gds_prune_timer); one that is not a plain timer unit name is
    refused rather than handed to systemctl."""
    timer = str(settings.get("gds_prune_timer") or DEFAULT_PRUNE_TIMER)
    if not _TIMER_NAME.match(timer):
        error = "settings.gds_prune_timer %r is not a timer unit name" % timer[:200]
        p.items["gds_prune_timer"] = {
            "kind": KIND_COMMAND,
            "source": "",
            "error": error,
            "duration_s": 0.0,
        }
        return
    service = timer[: -len(".timer")] + ".service"
    argv = ["systemctl", "show", "--no-pager", timer, service, "-p", PRUNE_TIMER_PROPERTIES]
    p.command("gds_prune_timer", argv)


# A bench directory untouched this long was left by a killed run; a younger one may be another
# host's bench in progress on the same store (every host of a fleet mounts the one export), which
# must not be deleted under its gdsio. Far beyond any probe's time budget.
STALE_BENCH_AGE_S = 3600.0


def remove_stale_bench_dirs(gds: str, now_s: Optional[float] = None) -> Dict[str, List[str]]:
    """Bench directories a killed earlier run left behind (untouched for STALE_BENCH_AGE_S),
    removed without following links (shutil.rmtree's fd-based walk); those this user could not
    remove are listed as left."""
    out: Dict[str, List[str]] = {"stale_removed": [], "stale_left": []}
    now = time.time() if now_s is None else now_s
    for name in sorted(os.listdir(gds)):
        if not _is_bench_dir(name):
            continue
        full = os.path.join(gds, name)
        try:
            st = os.lstat(full)  # a link is not a directory here: never followed
        except OSError:
            continue  # removed meanwhile by its own run
        if stat.S_ISDIR(st.st_mode) and now - st.st_mtime >= STALE_BENCH_AGE_S:
            shutil.rmtree(full, ignore_errors=True)
            out["stale_left" if os.path.lexists(full) else "stale_removed"].append(full)
    return out


def make_bench_dir(gds: str) -> Dict[str, Any]:
    """Stale directories removed, then a fresh private one (mkdtemp: O_EXCL, 0700, never an
    existing path or link), as whoever runs this child."""
    result: Dict[str, Any] = dict(remove_stale_bench_dirs(gds))
    result["dir"] = tempfile.mkdtemp(prefix=BENCH_PREFIX, dir=gds)
    return result


def bench(
    p: Probe, settings: Dict[str, Any], config_path: str, service_user: Optional[str]
) -> None:
    """gdsio GPU_DIRECT write then read in a fresh directory under the GDS directory, as the
    service user (root when unknown), removed afterwards whatever happens."""
    args = {"size": "1G", "io_size": "1M", "threads": "8", "gpu": "0"}
    args.update({k: str(v) for k, v in (settings.get("gdsio_args") or {}).items()})
    gdsio = p.which("gdsio", CUDA_TOOL_GLOBS) or "gdsio"
    gds = str(settings.get("gds_dir") or "")
    user = str(settings.get("bench_user") or service_user or "") or None
    start = time.monotonic()
    made: Optional[Dict[str, Any]] = None
    error: Optional[str] = "settings.gds_dir not set"
    if gds:
        try:
            made, error = in_child(lambda: make_bench_dir(gds), _storage_budget_s(p), user)
        except KeyError:
            made, error = None, "bench user %r does not exist on the host" % user
    target = (made or {}).get("dir") or os.path.join(gds or ".", BENCH_PREFIX + "XXXXXX")
    p.structured(
        "bench_dir", KIND_DIR, target, made, error and "bench directory: %s" % error, start
    )
    if not made:
        for item_id in ("gdsio_write", "gdsio_read"):
            p.items[item_id] = {
                "kind": KIND_COMMAND,
                "source": [gdsio, "-D", target],
                "exit_code": None,
                "error": "not run: bench directory: %s" % error,
                "duration_s": 0.0,
            }
        return
    common = ["-D", target, "-d", args["gpu"], "-w", args["threads"], "-s", args["size"]]
    common += ["-i", args["io_size"], "-x", "0"]
    env = tool_env(p, config_path, target)
    try:
        p.file("nvfs_stats_before_bench", "/proc/driver/nvidia-fs/stats")
        for item_id, io in (("gdsio_write", "1"), ("gdsio_read", "0")):
            argv = [gdsio, *common, "-I", io]
            p.command(item_id, argv, p.bench_timeout_s, extra_env=env, as_user=user, cwd=target)
        p.file("nvfs_stats_after_bench", "/proc/driver/nvidia-fs/stats")
    finally:
        in_child(lambda: shutil.rmtree(target, ignore_errors=True), _storage_budget_s(p), user)
