"""GDS evidence: the cufile.json the service reads, `gdscheck -p`, the GDS directory, and the
optional gdsio write+read run with nvidia-fs counters around it.

gdscheck and gdsio run with the service's CUFILE_ENV_PATH_JSON so they see the same cuFile
configuration as vLLM does; a GPU-direct run whose nvidia-fs read/write counters do not move
is the proof that cuFile fell back to POSIX, so the stats are read right before and after.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import sys
import time
from typing import Any, Dict, List, Optional

from .core import KIND_DIR, Probe

CUDA_TOOL_GLOBS = ["/usr/local/cuda/gds/tools", "/usr/local/cuda-*/gds/tools"]
WALK_LIMIT = 200000
TMP_LIST_LIMIT = 20
BENCH_SUBDIR = "kvops-gdsio"


def cufile_path(settings: Dict[str, Any], env: Dict[str, str]) -> str:
    return str(
        settings.get("cufile_json_path") or env.get("CUFILE_ENV_PATH_JSON") or "/etc/cufile.json"
    )


def cufile_env(settings: Dict[str, Any], env: Dict[str, str]) -> Dict[str, str]:
    """CUFILE_* variables of the service, so the tools read the service's configuration."""
    out = {k: v for k, v in env.items() if k.startswith("CUFILE_")}
    if settings.get("cufile_json_path"):
        out["CUFILE_ENV_PATH_JSON"] = str(settings["cufile_json_path"])
    return out


def collect_gds(p: Probe, settings: Dict[str, Any], service: Dict[str, Any]) -> None:
    env = service.get("env") or {}
    p.file("cufile_json", cufile_path(settings, env))
    argv = [p.which("gdscheck", CUDA_TOOL_GLOBS) or "gdscheck", "-p"]
    wrapper = None if os.path.isabs(argv[0]) else p.which("gdscheck.py", CUDA_TOOL_GLOBS)
    if wrapper:  # only the python wrapper is installed (gds-tools packaging varies)
        argv = [sys.executable or "python3", wrapper, "-p"]
    p.command("gdscheck", argv, extra_env=cufile_env(settings, env))
    gds_dir(p, settings.get("gds_dir"), service.get("service_user"))
    if settings.get("storage_bench"):
        bench(p, settings, env)


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


def _name(lookup: Any, ident: int) -> str:
    try:
        return str(lookup(ident)[0])
    except KeyError:
        return str(ident)


def gds_dir(p: Probe, path: Optional[str], service_user: Optional[str]) -> None:
    start = time.monotonic()
    if not path:
        p.structured("gds_dir", KIND_DIR, "", None, "settings.gds_dir not set", start)
        return
    if p.out_of_time("gds_dir", KIND_DIR, path):
        return
    data: Dict[str, Any] = {"exists": False, "is_dir": False, "service_user": service_user}
    try:
        st = os.stat(path)
    except OSError as exc:
        p.structured("gds_dir", KIND_DIR, path, data, "cannot stat %s: %s" % (path, exc), start)
        return
    data.update(
        exists=True,
        is_dir=stat.S_ISDIR(st.st_mode),
        owner=_name(pwd.getpwuid, st.st_uid),
        group=_name(grp.getgrgid, st.st_gid),
        mode="0o%o" % stat.S_IMODE(st.st_mode),
        writable_by_service_user=_user_can_write(st, service_user),
    )
    try:
        vfs = os.statvfs(path)
        data["free_bytes"] = vfs.f_bavail * vfs.f_frsize
        data["total_bytes"] = vfs.f_blocks * vfs.f_frsize
    except OSError:
        pass
    files = total = 0
    tmp: List[str] = []
    tmp_count = 0
    walked = 0
    error = None
    for root, dirs, names in os.walk(path, onerror=None):
        dirs[:] = [d for d in dirs if d != BENCH_SUBDIR]
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
        if walked >= WALK_LIMIT or p.remaining() < 2:
            error = "directory walk stopped after %d entries (limit or deadline)" % walked
            break
    data.update(file_count=files, bytes=total, tmp_file_count=tmp_count, tmp_files=tmp)
    p.structured("gds_dir", KIND_DIR, path, data, error, start)


def bench(p: Probe, settings: Dict[str, Any], env: Dict[str, str]) -> None:
    """gdsio GPU_DIRECT write then read in <gds_dir>/kvops-gdsio, removed afterwards."""
    args = {"size": "1G", "io_size": "1M", "threads": "8", "gpu": "0"}
    args.update({k: str(v) for k, v in (settings.get("gdsio_args") or {}).items()})
    gdsio = p.which("gdsio", CUDA_TOOL_GLOBS) or "gdsio"
    target = os.path.join(str(settings.get("gds_dir") or "."), BENCH_SUBDIR)
    created = False
    if settings.get("gds_dir") and not os.path.isdir(target):
        try:
            os.mkdir(target)
            created = True
        except OSError:
            pass  # gdsio then fails on its own and that failure is the evidence
    common = ["-D", target, "-d", args["gpu"], "-w", args["threads"], "-s", args["size"]]
    common += ["-i", args["io_size"], "-x", "0"]
    tool_env = cufile_env(settings, env)
    try:
        p.file("nvfs_stats_before_bench", "/proc/driver/nvidia-fs/stats")
        p.command("gdsio_write", [gdsio, *common, "-I", "1"], p.bench_timeout_s, extra_env=tool_env)
        p.command("gdsio_read", [gdsio, *common, "-I", "0"], p.bench_timeout_s, extra_env=tool_env)
        p.file("nvfs_stats_after_bench", "/proc/driver/nvidia-fs/stats")
    finally:
        if created:
            shutil.rmtree(target, ignore_errors=True)
