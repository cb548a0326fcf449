"""Recording primitives of the probe: commands, files, HTTP, all bounded in size and time.

Why a context object: the probe has one time budget for the whole host (so a hanging tool cannot
hold the fleet run), one place that maps system paths to their root (the narrow seam that lets
tests and the lab point the probe at a recorded /proc, /sys, /etc tree), and one list of extra
tool directories. Values are never invented here: what is read is what is recorded.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import pwd
import re
import select
import shutil
import signal
import ssl
import stat
import subprocess
import tempfile
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Tuple

KIND_COMMAND = "command"
KIND_FILE = "file"
KIND_DIR = "dir"
KIND_HTTP = "http"
KIND_SYSFS = "sysfs"

STDOUT_LIMIT = 512 * 1024
STDERR_LIMIT = 32 * 1024
FILE_LIMIT = 1024 * 1024
SYSTEM_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def _bounded(data: bytes, limit: int) -> "tuple[str, bool]":
    truncated = len(data) > limit
    return data[:limit].decode("utf-8", "replace"), truncated


class Probe:
    """Time budget, path roots and tool lookup shared by every collector."""

    def __init__(self, config: Dict[str, Any]) -> None:
        self.started = time.monotonic()
        self.deadline_s = float(config.get("deadline_s") or 60.0)
        self.command_timeout_s = float(config.get("command_timeout_s") or 20.0)
        self.http_timeout_s = float(config.get("http_timeout_s") or 5.0)
        self.bench_timeout_s = float(config.get("bench_timeout_s") or 300.0)
        roots = config.get("roots") or {}
        self.roots = {k: str(roots[k]).rstrip("/") for k in ("proc", "sys", "etc") if roots.get(k)}
        self.tool_dirs = [str(d) for d in (config.get("tool_dirs") or [])]
        self._bearer_token = str(config.get("http_bearer_token") or "") or None
        self.http_ca_file = str(config.get("http_ca_file") or "") or None
        self.items: Dict[str, Dict[str, Any]] = {}
        self._workdir: Optional[str] = None

    # -- private working directory ----------------------------------------------------------
    def workdir(self) -> str:
        """A private (0700, mkdtemp) directory: tools run in it and write their logs there,
        so nothing lands in a directory another user controls; removed by `close`."""
        if self._workdir is None:
            self._workdir = tempfile.mkdtemp(prefix="kvops-probe-")
        return self._workdir

    def close(self) -> None:
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    # -- time -----------------------------------------------------------------------------
    def remaining(self) -> float:
        return self.deadline_s - (time.monotonic() - self.started)

    def out_of_time(self, item_id: str, kind: str, source: Any) -> bool:
        """Record the item as skipped when the host's budget is spent; True if it was."""
        if self.remaining() > 0.5:
            return False
        self.items[item_id] = {
            "kind": kind,
            "source": source,
            "error": "skipped: probe deadline of %.0f s reached" % self.deadline_s,
            "duration_s": 0.0,
        }
        return True

    # -- paths ----------------------------------------------------------------------------
    def path(self, system_path: str) -> str:
        """Where a /proc, /sys or /etc path is read from (identity unless a root is set)."""
        for top, root in self.roots.items():
            prefix = "/" + top
            if system_path == prefix or system_path.startswith(prefix + "/"):
                return root + system_path[len(prefix) :]
        return system_path

    def search_path(self) -> List[str]:
        env_path = os.environ.get("PATH", "").split(os.pathsep)
        dirs = self.tool_dirs + [d for d in env_path if d] + list(SYSTEM_DIRS)
        seen: List[str] = []
        for d in dirs:
            if d not in seen:
                seen.append(d)
        return seen

    def which(self, name: str, extra_globs: Optional[List[str]] = None) -> Optional[str]:
        """First executable `name` in tool_dirs, then `extra_globs` (newest first), then PATH."""
        candidates = [os.path.join(d, name) for d in self.tool_dirs]
        for pattern in extra_globs or []:
            found = glob.glob(os.path.join(pattern, name))
            candidates += sorted(found, key=_version_key, reverse=True)
        candidates += [os.path.join(d, name) for d in self.search_path()[len(self.tool_dirs) :]]
        for cand in candidates:
            if os.path.isfile(cand) and os.access(cand, os.X_OK):
                return cand
        return None

    # -- recorders ------------------------------------------------------------------------
    def command(
        self,
        item_id: str,
        argv: List[str],
        timeout_s: Optional[float] = None,
        resolve: bool = True,
        record: bool = True,
        extra_env: Optional[Dict[str, str]] = None,
        as_user: Optional[str] = None,
        cwd: Optional[str] = None,
    ) -> Dict[str, Any]:
        """Run argv (no shell) and record it; exit 127 with the search path when not found.

        The tool gets a clean environment (PATH, LC_ALL=C, HOME/TMPDIR = the private workdir,
        plus `extra_env`), never the probe's or the service's, in the workdir unless `cwd`
        says otherwise; `as_user` drops to that user first (root only)."""
        if record and self.out_of_time(item_id, KIND_COMMAND, argv):
            return self.items[item_id]
        item: Dict[str, Any] = {"kind": KIND_COMMAND, "source": list(argv)}
        exe = self.which(argv[0]) if resolve and "/" not in argv[0] else argv[0]
        start = time.monotonic()
        if exe is None or not os.path.exists(exe):
            item.update(
                exit_code=127,
                stdout="",
                stderr="%s: not found in %s" % (argv[0], ":".join(self.search_path())),
                duration_s=0.0,
            )
        else:
            item["source"] = [exe, *list(argv[1:])]
            limit = min(timeout_s or self.command_timeout_s, max(self.remaining(), 0.5))
            item.update(self._run(item["source"], limit, extra_env, as_user, cwd))
            if as_user:
                item["run_as"] = _effective_user(as_user)
        item["duration_s"] = round(time.monotonic() - start, 4)
        if record:
            self.items[item_id] = item
        return item

    def _run(
        self,
        argv: List[str],
        timeout_s: float,
        extra_env: Optional[Dict[str, str]] = None,
        as_user: Optional[str] = None,
        cwd: Optional[str] = None,
    ) -> Dict[str, Any]:
        workdir = self.workdir()
        env = {"HOME": workdir, "TMPDIR": workdir}
        env.update(extra_env or {})
        env["PATH"] = os.pathsep.join(self.search_path())
        env["LC_ALL"] = "C"
        try:
            drop = privilege_drop(as_user) if as_user else None
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=cwd or workdir,
                preexec_fn=drop,
                start_new_session=True,  # so a timeout kills the tool's children too
            )
        except (OSError, KeyError, subprocess.SubprocessError) as exc:
            code = 127 if getattr(exc, "errno", None) == errno.ENOENT else 126
            return {"exit_code": code, "stdout": "", "stderr": str(exc)}
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            stdout, t1 = _bounded(out, STDOUT_LIMIT)
            stderr, t2 = _bounded(err, STDERR_LIMIT)
            return {
                "exit_code": None,
                "stdout": stdout,
                "stderr": stderr,
                "truncated": t1 or t2,
                "error": "timed out after %.1f s (killed)" % timeout_s,
            }
        stdout, t1 = _bounded(out, STDOUT_LIMIT)
        stderr, t2 = _bounded(err, STDERR_LIMIT)
        result: Dict[str, Any] = {"exit_code": proc.returncode, "stdout": stdout, "stderr": stderr}
        if t1 or t2:
            result["truncated"] = True
        return result

    def file(
        self,
        item_id: str,
        system_path: str,
        record: bool = True,
        readable_by: Optional[str] = None,
    ) -> Dict[str, Any]:
        """Read a text file (mapped through the roots); a missing file is an ENOENT error.
        `readable_by`: the path came from the service, read it only if that user could."""
        real = self.path(system_path)
        if record and self.out_of_time(item_id, KIND_FILE, real):
            return self.items[item_id]
        start = time.monotonic()
        item: Dict[str, Any] = {"kind": KIND_FILE, "source": real}
        try:
            # The access check and the read are one file: what is judged readable is the
            # opened descriptor (fstat), so a path swapped between check and read (a symlink
            # to /etc/shadow put in place by the service user) is not read. O_NONBLOCK: a FIFO
            # named by the service must not hang the probe at open.
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            name = errno.errorcode.get(exc.errno or 0, "OSError")
            item["error"] = "%s %s: %s" % (name, real, exc.strerror or exc)
            fd = -1
        if fd >= 0:
            with os.fdopen(fd, "rb") as fh:
                refused = user_can_read(real, readable_by, os.fstat(fh.fileno()))
                if refused:
                    item.update(error=refused, duration_s=0.0)
                    if record:
                        self.items[item_id] = item
                    return item
                try:
                    data = fh.read(FILE_LIMIT + 1)
                    text, truncated = _bounded(data, FILE_LIMIT)
                    item["stdout"] = text
                    if truncated:
                        item["truncated"] = True
                    item["error"] = None
                except OSError as exc:
                    name = errno.errorcode.get(exc.errno or 0, "OSError")
                    item["error"] = "%s %s: %s" % (name, real, exc.strerror or exc)
        item["duration_s"] = round(time.monotonic() - start, 4)
        if record:
            self.items[item_id] = item
        return item

    def structured(
        self, item_id: str, kind: str, source: str, data: Any, error: Optional[str], start: float
    ) -> Dict[str, Any]:
        """Record a sysfs/dir item whose `data` a collector built from what it read."""
        item: Dict[str, Any] = {"kind": kind, "source": source, "error": error}
        if data is not None:
            item["data"] = data
        item["duration_s"] = round(time.monotonic() - start, 4)
        self.items[item_id] = item
        return item

    def http(self, item_id: str, url: str, limit: int = STDOUT_LIMIT) -> Dict[str, Any]:
        """GET url directly (no proxy); TLS certificates are verified by urllib's defaults."""
        if self.out_of_time(item_id, KIND_HTTP, url):
            return self.items[item_id]
        start = time.monotonic()
        item: Dict[str, Any] = {"kind": KIND_HTTP, "source": url, "http_status": None}
        handlers: List[Any] = [urllib.request.ProxyHandler({}), _SameOriginRedirects()]
        if url.startswith("https:"):
            # verified always; against the inventory's CA bundle when one is given
            context = ssl.create_default_context(cafile=self.http_ca_file)
            handlers.append(urllib.request.HTTPSHandler(context=context))
        opener = urllib.request.build_opener(*handlers)
        request = urllib.request.Request(url)
        if self._bearer_token:
            request.add_header("Authorization", "Bearer " + self._bearer_token)
            item["auth"] = "bearer token (not recorded)"
        timeout = min(self.http_timeout_s, max(self.remaining(), 0.5))
        try:
            with opener.open(request, timeout=timeout) as resp:
                body = resp.read(limit + 1)
                item["http_status"] = resp.status
        except urllib.error.HTTPError as exc:
            item["http_status"] = exc.code
            if 300 <= exc.code < 400:
                item["error"] = str(exc.msg)
            body = exc.read(limit + 1) if exc.fp is not None else b""
        except (urllib.error.URLError, OSError, ValueError, ssl.SSLError) as exc:
            reason = getattr(exc, "reason", exc)
            item["error"] = "no response: %s" % (reason,)
            body = b""
        text, truncated = _bounded(body, limit)
        item["stdout"] = text
        if truncated:
            item["truncated"] = True
        item["duration_s"] = round(time.monotonic() - start, 4)
        self.items[item_id] = item
        return item


def _origin(url: str) -> Tuple[str, str, Optional[int]]:
    parsed = urllib.parse.urlsplit(url)
    default = 443 if parsed.scheme == "https" else 80
    return parsed.scheme.lower(), (parsed.hostname or "").lower(), parsed.port or default


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only within the configured URL's origin (scheme, host, port).

    Why: urllib's stock handler copies every header added with `add_header`, the bearer
    token included, onto the redirected request, wherever it points (CPython
    Lib/urllib/request.py, `HTTPRedirectHandler.redirect_request`). A server on the vLLM port
    could thus send the operator's API key to any host. A same-origin redirect (vLLM's
    mounted `/metrics` answers `/metrics/` on some versions) is still followed; any other is
    not, and the item records the 3xx status with the refused target."""

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> Optional[urllib.request.Request]:
        if _origin(newurl) != _origin(req.full_url):
            raise urllib.error.HTTPError(
                req.full_url,
                code,
                "redirect to another origin not followed: %s" % newurl[:200],
                headers,
                fp,
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def user_can_read(path: str, user: Optional[str], st: os.stat_result) -> Optional[str]:
    """None when `user` may read the opened file `st` (of `path`) by its mode bits (root:
    always); else why not. A file the service names is read only if the service could read it
    too, so a root probe never copies e.g. /etc/shadow into evidence on the service's word;
    and only a regular file, as a service's config is."""
    if not user:
        return None
    try:
        pw = pwd.getpwnam(user)
    except KeyError as exc:
        return "cannot check read access of %s for %s: %s" % (path, user, exc)
    if not stat.S_ISREG(st.st_mode):
        return "%s is not a regular file: not read" % path
    if pw.pw_uid == 0:
        return None
    try:
        gids = set(os.getgrouplist(user, pw.pw_gid))
    except OSError:
        gids = {pw.pw_gid}
    if st.st_uid == pw.pw_uid:
        ok = bool(st.st_mode & 0o400)
    elif st.st_gid in gids:
        ok = bool(st.st_mode & 0o040)
    else:
        ok = bool(st.st_mode & 0o004)
    return None if ok else "%s is not readable by the service user %s: not read" % (path, user)


def _effective_user(wanted: str) -> str:
    """Who a tool asked to run as `wanted` really ran as: an unprivileged probe cannot switch,
    and the evidence must say so rather than name a user that did not run it."""
    if os.geteuid() == 0:
        return wanted
    try:
        me = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        me = str(os.geteuid())
    return wanted if me == wanted else "%s (not %s: the probe is not root)" % (me, wanted)


def privilege_drop(user: str) -> Optional[Callable[[], None]]:
    """A preexec function that becomes `user` (groups, gid, uid); None when nothing to drop
    (already that user, or not root: an unprivileged probe cannot switch). KeyError when the
    user does not exist."""
    pw = pwd.getpwnam(user)
    if os.geteuid() != 0 or pw.pw_uid == os.geteuid():
        return None
    groups = os.getgrouplist(user, pw.pw_gid)

    def drop() -> None:
        os.setgroups(groups)
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)

    return drop


def in_child(
    work: Callable[[], Any], timeout_s: float, as_user: Optional[str] = None
) -> Tuple[Any, Optional[str]]:
    """Run `work` in a forked child with its own time budget: (its JSON result, error).

    Why a child: a hard NFS mount that stops answering blocks stat/statvfs/readdir in the
    kernel, uninterruptibly; done in the probe itself, one such call would cost the host all
    of its evidence. The child is killed (and left to the kernel if it cannot die) after
    `timeout_s`; the probe goes on with what it has."""
    drop = privilege_drop(as_user) if as_user else None
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(read_fd)
            if drop is not None:
                drop()
            payload = json.dumps({"result": work()})
        except BaseException:  # anything the child hits is reported, never raised
            payload = json.dumps({"error": traceback.format_exc(limit=2).strip()})
            code = 1
        with contextlib.suppress(OSError):
            data = payload.encode("utf-8")
            while data:
                data = data[os.write(write_fd, data) :]
        os._exit(code)
    os.close(write_fd)
    chunks: List[bytes] = []
    deadline = time.monotonic() + timeout_s
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([read_fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)
    if timed_out:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        for _ in range(20):  # a child stuck in the kernel dies later; init reaps it then
            with contextlib.suppress(OSError):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    break
            time.sleep(0.025)
        return None, "did not answer in %g s" % timeout_s
    with contextlib.suppress(OSError):
        os.waitpid(pid, 0)
    try:
        message = json.loads(b"".join(chunks).decode("utf-8"))
    except ValueError:
        return None, "child ended without a result"
    if "error" in message:
        return None, str(message["error"]).splitlines()[-1]
    return message.get("result"), None


def _version_key(path: str) -> List[Any]:
    """Natural order, so /usr/local/cuda-12.10 sorts after /usr/local/cuda-12.8."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def read_text(path: str, limit: int = 4096) -> Optional[str]:
    """Small sysfs/proc value, stripped; None when unreadable (the caller records why)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace").strip()
    except OSError:
        return None
