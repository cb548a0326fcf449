"""Chunk files of a KV offload directory: which exist, and whether LMCache's header is sound.

One implementation for both sides of `kvops smoke`: imported locally when the operator's machine
mounts the GDS directory, and shipped as source over SSH (`kvops.smoke.remote`) when only the
GPU host does. Hence stdlib only and Python >= 3.8 syntax, like the probe.

LMCache's GDS backend writes ``*.kvcache.safetensors``: a 4096-byte header (``<Q`` length + JSON)
followed by the KV bytes, ``data_offsets[1]`` of the header being their length
(lmcache/v1/storage_backend/gds_backend.py). Other ``*.safetensors`` are a connector's files (vLLM's
ExampleConnector). LMCache's server mode (``lmcache server``) keeps its file tier through the
``fs`` L2 adapter: flat ``<model>@0x<kv_rank hex>@<group hex>@<chunk hash hex>[@salt].data``
files of raw KV bytes with no header (lmcache/v1/distributed/l2_adapters/fs_l2_adapter.py,
``_object_key_to_filename``). ``*.tmp*`` files are writes in flight and are not counted.
"""

import json
import os
import re
import struct
import sys
from typing import Any

LMCACHE_SUFFIX = ".kvcache.safetensors"
LMCACHE_HEADER_BYTES = 4096
# the fs L2 adapter's object file name (see the module docstring)
LMCACHE_FS_NAME = re.compile(r"@0x[0-9a-f]{8}@[0-9a-f]+@[0-9a-f]+(@[^@/]*)?\.data$")


def _is_chunk_name(name: str) -> bool:
    if ".tmp" in name:
        return False
    return name.endswith(".safetensors") or LMCACHE_FS_NAME.search(name) is not None


def _raise(exc: OSError) -> None:
    raise exc


def list_paths(root: str) -> list[str]:
    """Every finished chunk file (``*.safetensors``, the fs tier's ``*.data``) under root;
    empty when root is not a directory.
    Raises OSError for a directory that cannot be listed (an empty answer would read as
    "nothing stored")."""
    found: list[str] = []
    if not os.path.isdir(root):
        return found
    for dirpath, _dirs, files in os.walk(root, onerror=_raise):
        for name in files:
            if _is_chunk_name(name):
                found.append(os.path.join(dirpath, name))
    return sorted(found)


def _lmcache_header_ok(path: str, size: int) -> bool:
    if size < LMCACHE_HEADER_BYTES:
        return False
    try:
        with open(path, "rb") as fh:
            head = fh.read(LMCACHE_HEADER_BYTES)
        (length,) = struct.unpack("<Q", head[:8])
        header = json.loads(head[8 : 8 + length])
        end = int(next(iter(header.values()))["data_offsets"][1])
    except (OSError, ValueError, KeyError, IndexError, StopIteration, TypeError, struct.error):
        return False
    return size - LMCACHE_HEADER_BYTES == end


def describe(path: str) -> dict[str, Any]:
    """{"path", "size_bytes", "layout" (lmcache | lmcache-fs | connector), "header_ok" (None:
    not checked; for the fs tier's headerless files, whether there are any bytes)}."""
    if path.endswith(LMCACHE_SUFFIX):
        layout = "lmcache"
    elif LMCACHE_FS_NAME.search(os.path.basename(path)):
        layout = "lmcache-fs"
    else:
        layout = "connector"
    header_ok: bool | None = None
    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0
    else:
        if layout == "lmcache":
            header_ok = _lmcache_header_ok(path, size)
        elif layout == "lmcache-fs":
            header_ok = size > 0
    return {"path": path, "size_bytes": size, "layout": layout, "header_ok": header_ok}


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """The remote entry: {"op": "list", "root": R} or {"op": "describe", "paths": [...]};
    {"error": ...} when the directory cannot be listed."""
    if request.get("op") == "describe":
        return {"files": [describe(str(p)) for p in request.get("paths") or []]}
    root = str(request.get("root") or "")
    try:
        paths = list_paths(root)
    except OSError as exc:
        where = exc.filename or root
        return {"root": root, "error": f"cannot list {where}: {exc.strerror}"}
    return {"root": root, "is_dir": os.path.isdir(root), "paths": paths}


def become(user: str) -> None:
    """Read as the inference service's user when run as root: on an export with root squashed
    (ONTAP's `superuser none`, the role's default) root is nobody there and cannot list the
    service's directory, while the service user sees exactly what LMCache sees."""
    if not user or os.geteuid() != 0:
        return
    import pwd

    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return  # no such user here: read as who we are
    if pw.pw_uid == 0:
        return
    os.setgroups(os.getgrouplist(user, pw.pw_gid))
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)


def main(request_json: str) -> None:
    request = json.loads(request_json)
    become(str(request.get("as_user") or ""))
    sys.stdout.write(json.dumps(answer(request)) + "\n")
