"""Offload hosts that share one GDS directory, judged together: pure, list of evidence → findings.

A directory is shared when it is the same path inside the same NFS export (`server:/export`
of the mount it resolves to, plus the path below the mount point; the server is the SVM that
owns the mounted data LIF when ONTAP was read, else the address in the mount source). Why
hosts sharing it must agree, from LMCache 0.5.6 (`lmcache/utils.py` l.467-475, `token_database.py`,
`gds_backend.py`) and vLLM 0.34 (`v1/core/kv_cache_utils.py`):

- A chunk's file name holds `{model}@{world_size}@{worker_id}@{chunk_hash}@{kv_dtype}`, where
  `model` is vLLM's `--model` string and the chunk hash depends on `chunk_size`, on
  `pre_caching_hash_algorithm` and, through vLLM's NONE_HASH seed, on `PYTHONHASHSEED`. A host
  that differs in any of them writes chunks no other host ever finds: two caches in one
  directory, each pruned against the other's budget, and no cross-host hit (FAIL).
- With `sec=sys` the export checks numeric ids: a host whose service uid/gid differs cannot
  read the others' chunks in a 0750 directory, nor they its own (FAIL).
- A different TP size, KV dtype or LMCache mode never collides (they are in the key or the
  layout) but never shares either: the directory holds separate caches (WARN; one directory
  per model revision, dtype and TP layout).
- The weights revision is in no key: a new revision served under the same `--model` string in
  the same directory loads the old revision's KV. No evidence shows a revision, so the role
  names one directory per revision (`vllm_lmcache_gds_store`); this module cannot see it.
- LMCache's `local_disk` backend writes `{path}/{key}.pt` in place, indexes only its own files
  and deletes them on eviction (`local_disk_backend.py` l.290, l.778-786): a shared local_disk
  path corrupts and deletes other hosts' files (GDS-091, FAIL).
- Nothing evicts from the GDS tier (LMCache #1724): each shared directory needs one pruner
  (GDS-092, WARN when none).

Each offload host gets exactly one finding of each id; hosts not probed get none (GDS-000
says why), other hosts a SKIP.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvops import evidence as ev
from kvops.checks.context import Context, flag_value, split_command
from kvops.checks.model import SEVERITY_ORDER, Finding, Severity, Thresholds, finding
from kvops.checks.vllm import is_lmcache_server
from kvops.parse._common import clip

# What must agree (a difference means no sharing, or no access) and what should (a difference
# means separate caches in one directory). Labels are shown to the operator.
MUST_AGREE = (
    "model",
    "chunk_size",
    "hash_algorithm",
    "PYTHONHASHSEED",
    "service uid",
    "service gid",
)
SHOULD_AGREE = ("LMCache mode", "tensor_parallel_size", "dtype", "LMCache version")
IN_PROCESS = "in-process GDS backend"
SERVER = "multiprocess server (offload_mp)"
MAX_HOSTS_SHOWN = 8


@dataclass
class HostStore:
    """One offload host as the shared-store judges see it."""

    host: str
    stores: list[str]
    settings: dict[str, str | None]
    local_disk_store: str | None = None
    local_disk_path: str | None = None
    server_mode: bool = False
    prune: PruneTimer | None = None
    prune_probed: bool = False


@dataclass
class PruneTimer:
    """The host's `kvops gds prune` timer: whether it runs, and which directory it prunes."""

    timer: str
    active: bool
    state: str
    directory: str | None = None
    store: str | None = None


@dataclass
class _Group:
    store: str
    members: list[HostStore] = field(default_factory=list)


def store_key(ctx: Context, path: str, servers: Mapping[str, str] | None = None) -> str | None:
    """`server:/export/path/below/mount` for a path on an NFS mount, else None (a local path
    is never shared). The server is the SVM that owns the mounted LIF address where ONTAP was
    read (`servers`, from `--ontap`), else the address as written in the mount source."""
    table = ctx.mounts
    real = ctx.real_path(path)
    mount = table.mount_for(real) if table is not None else None
    if mount is None or not mount.is_nfs:
        return None
    server, sep, export = mount.device.rpartition(":")
    if not sep or not export.startswith("/"):
        return None
    below = posixpath.relpath(posixpath.normpath(real), posixpath.normpath(mount.mount_point))
    joined = posixpath.normpath(export if below == "." else posixpath.join(export, below))
    owner = (servers or {}).get(server.strip("[]"))
    return f"{owner or server.lower()}:{joined}"


def _model(ctx: Context) -> str | None:
    """vLLM's `--model` string (what LMCache puts in the key): the argument after `serve`,
    else `--model`, else the `root` /v1/models reports."""
    for argv in ([ctx.vllm_argv] if ctx.vllm_argv else []) + ctx.launch_argvs:
        flagged = flag_value(argv, ("--model",))
        if flagged:
            return flagged
        if "serve" in argv:
            rest = argv[argv.index("serve") + 1 :]
            if rest and not rest[0].startswith("-"):
                return rest[0]
    text = ctx.text(ev.HTTP_MODELS)
    try:
        data = json.loads(text or "").get("data") or []
        root = data[0].get("root") if isinstance(data[0], dict) else None
    except (ValueError, AttributeError, IndexError, TypeError):
        return None
    return str(root) if root else None


def _argv_value(ctx: Context, names: tuple[str, ...], default: str) -> str | None:
    argvs = ctx.launch_argvs
    if not argvs:
        return None
    for argv in argvs:
        value = flag_value(argv, names)
        if value is not None:
            return value
    return default


def _gds_paths(ctx: Context, server_mode: bool) -> list[str]:
    config = None if server_mode else ctx.lmcache
    raw = config.effective.get("gds_path") if config is not None else None
    if isinstance(raw, str) and raw.strip():
        return [p.strip() for p in raw.split(",") if p.strip()]
    return [ctx.gds_dir] if ctx.gds_dir else []


def _local_disk(ctx: Context, server_mode: bool) -> str | None:
    config = None if server_mode else ctx.lmcache
    raw = config.effective.get("local_disk") if config is not None else None
    if not isinstance(raw, str) or not raw.strip():
        return None
    path = raw.strip()
    return path[len("file://") :] if path.startswith("file://") else path


def _prune_timer(
    ctx: Context, servers: Mapping[str, str] | None = None
) -> tuple[PruneTimer | None, bool]:
    """(the timer, whether it was probed): `systemctl show` blocks of the timer and its
    service; the pruned directory is the argument after `prune` in the service's ExecStart."""
    item = ctx.item(ev.GDS_PRUNE_TIMER)
    if item is None:
        return None, False
    text = ctx.text(ev.GDS_PRUNE_TIMER)
    if text is None:
        return None, True
    blocks: list[dict[str, str]] = [{}]
    for line in text.splitlines():
        if not line.strip():
            blocks.append({})
            continue
        key, sep, value = line.partition("=")
        if sep:
            blocks[-1].setdefault(key, value)
    units = [b for b in blocks if b.get("Id")]
    timer = next((b for b in units if b["Id"].endswith(".timer")), None)
    service = next((b for b in units if b["Id"].endswith(".service")), {})
    if timer is None:
        return None, True
    active = (
        timer.get("LoadState") == "loaded"
        and timer.get("UnitFileState") in ("enabled", "enabled-runtime", "static")
        and timer.get("ActiveState") == "active"
    )
    state = "/".join(timer.get(k, "?") for k in ("LoadState", "UnitFileState", "ActiveState"))
    directory = _pruned_directory(service.get("ExecStart", ""))
    store = store_key(ctx, directory, servers) if directory else None
    return PruneTimer(clip(timer["Id"]), active, clip(state), directory, store), True


def _pruned_directory(exec_start: str) -> str | None:
    """`{ path=... ; argv[]=/x/kvops gds prune DIR --max-bytes 800G ; ... }` → DIR."""
    _, sep, rest = exec_start.partition("argv[]=")
    if not sep:
        return None
    argv = split_command(rest.partition(" ;")[0])
    if "prune" not in argv:
        return None
    tail = argv[argv.index("prune") + 1 :]
    for i, arg in enumerate(tail):
        if not arg.startswith("-") and not (i > 0 and tail[i - 1] in _PRUNE_VALUED):
            return arg
    return None


# `kvops gds prune` options that take a value (kvops/cli/gds.py).
_PRUNE_VALUED = frozenset({"--max-bytes", "--max-age", "--min-age", "--tmp-age"})


def host_store(
    document: Mapping[str, Any], servers: Mapping[str, str] | None = None
) -> HostStore | None:
    """What the judges compare about one offload host; None for any other host."""
    ctx = Context(dict(document), Thresholds())
    if document.get("error") or ctx.role != ev.ROLE_OFFLOAD:
        return None
    server_mode = is_lmcache_server(ctx)
    config = None if server_mode else ctx.lmcache
    env = ctx.service_env
    data = ctx.data(ev.GDS_DIR, partial_ok=True) or {}

    def text(value: Any) -> str | None:
        return None if value is None else clip(str(value))

    server = _server_argv(ctx) if server_mode else None
    settings: dict[str, str | None] = {
        "model": text(_model(ctx)),
        "chunk_size": text(config.value("chunk_size")) if config else None,
        "hash_algorithm": text(config.value("pre_caching_hash_algorithm")) if config else None,
        # The server hashes in one process (no seed needed): compared only in-process.
        "PYTHONHASHSEED": None if server_mode or env is None else text(env.get("PYTHONHASHSEED")),
        "service uid": text(data.get("service_uid")),
        "service gid": text(data.get("service_gid")),
        "LMCache mode": SERVER if server_mode else IN_PROCESS,
        "tensor_parallel_size": text(
            _argv_value(ctx, ("--tensor-parallel-size", "-tp"), default="1")
        ),
        "dtype": _dtype(ctx),
        "LMCache version": text(ctx.lmcache_version),
    }
    if server is not None:  # the server hashes and chunks for every vLLM it serves
        settings["chunk_size"] = text(flag_value(server, ("--chunk-size",)) or SERVER_DEFAULT)
        algorithm = flag_value(server, ("--hash-algorithm",))
        settings["hash_algorithm"] = text(algorithm or SERVER_DEFAULT)
    if settings["PYTHONHASHSEED"] is None and env is not None and not server_mode:
        settings["PYTHONHASHSEED"] = "(unset: random)"
    paths = _gds_paths(ctx, server_mode)
    stores = sorted({k for p in paths if (k := store_key(ctx, p, servers))})
    local_disk = _local_disk(ctx, server_mode)
    prune, probed = _prune_timer(ctx, servers)
    return HostStore(
        host=str(document.get("host") or "?"),
        stores=stores,
        settings=settings,
        local_disk_store=store_key(ctx, local_disk, servers) if local_disk else None,
        local_disk_path=clip(local_disk) if local_disk else None,
        server_mode=server_mode,
        prune=prune,
        prune_probed=probed,
    )


SERVER_DEFAULT = "(lmcache server default)"


def _server_argv(ctx: Context) -> list[str] | None:
    """`lmcache server`'s argv from its unit's ExecStart (`systemctl show`), else None."""
    for line in (ctx.text(ev.LMCACHE_SERVER_UNIT_SHOW) or "").splitlines():
        if line.startswith("ExecStart="):
            _, sep, rest = line.partition("argv[]=")
            return split_command(rest.partition(" ;")[0]) if sep else None
    return None


def _dtype(ctx: Context) -> str | None:
    model = _argv_value(ctx, ("--dtype",), default="auto")
    kv = _argv_value(ctx, ("--kv-cache-dtype",), default="auto")
    return None if model is None or kv is None else clip(f"{model}/kv {kv}")


def _hosts(names: Iterable[str]) -> str:
    names = list(names)
    shown = ", ".join(names[:MAX_HOSTS_SHOWN])
    return shown + (
        f" and {len(names) - MAX_HOSTS_SHOWN} more" if len(names) > MAX_HOSTS_SHOWN else ""
    )


def _differences(members: Sequence[HostStore], labels: Sequence[str]) -> list[str]:
    """`chunk_size: 256 (a, b) vs 512 (c)` for each label on which known values differ."""
    out = []
    for label in labels:
        by_value: dict[str, list[str]] = {}
        for member in members:
            value = member.settings.get(label)
            if value is not None:
                by_value.setdefault(value, []).append(member.host)
        if len(by_value) > 1:
            parts = [f"{value!r} ({_hosts(hosts)})" for value, hosts in sorted(by_value.items())]
            out.append(f"{label}: " + " vs ".join(parts))
    return out


def _unknown(members: Sequence[HostStore], labels: Sequence[str]) -> list[str]:
    return [
        f"{label} of {_hosts(m.host for m in members if m.settings.get(label) is None)}"
        for label in labels
        if any(m.settings.get(label) is None for m in members)
    ]


def _judge_agreement(group: _Group) -> Finding:
    others = len(group.members) - 1
    if others == 0:
        return finding(
            "GDS-090", Severity.PASS, f"no other host of this run shares {clip(group.store)}"
        )
    names = _hosts(m.host for m in group.members)
    must = _differences(group.members, MUST_AGREE)
    if must:
        msg = f"{clip(group.store)} is shared by {names}, which disagree: " + "; ".join(must)
        return finding("GDS-090", Severity.FAIL, msg, "\n".join(must))
    should = _differences(group.members, SHOULD_AGREE)
    if should:
        msg = (
            f"{clip(group.store)} is shared by {names}, which keep separate caches in it "
            "(their chunks never match): " + "; ".join(should)
        )
        remedy = (
            "Give each model revision, KV dtype, TP layout and LMCache mode its own directory "
            "(vllm_lmcache_gds_store)."
        )
        return finding("GDS-090", Severity.WARN, msg, "\n".join(should), remedy)
    unknown = _unknown(group.members, MUST_AGREE)
    msg = f"{clip(group.store)} is shared by {names}: {', '.join(MUST_AGREE)} agree"
    if unknown:
        msg += " (not known, so not compared: " + "; ".join(unknown) + ")"
    return finding("GDS-090", Severity.PASS, msg)


def _judge_local_disk(member: HostStore, everyone: Sequence[HostStore]) -> Finding:
    if member.server_mode:
        return finding("GDS-091", Severity.PASS, "no in-process local_disk (LMCache server mode)")
    if member.local_disk_path is None:
        return finding("GDS-091", Severity.PASS, "local_disk not set")
    if member.local_disk_store is None:
        return finding(
            "GDS-091", Severity.PASS, f"local_disk {member.local_disk_path} is not on NFS"
        )
    mine = member.local_disk_store
    clash = [
        o.host
        for o in everyone
        if o is not member
        and (
            o.local_disk_store == mine
            or any(_within(mine, s) or _within(s, mine) for s in o.stores)
        )
    ]
    own_gds = [s for s in member.stores if _within(mine, s) or _within(s, mine)]
    if clash or own_gds:
        who = (
            f"shared with {_hosts(clash)}"
            if clash
            else f"inside its own GDS directory {clip(own_gds[0])}"
        )
        msg = f"local_disk {member.local_disk_path} ({clip(mine)}) is {who}"
        return finding("GDS-091", Severity.FAIL, msg)
    msg = (
        f"local_disk {member.local_disk_path} is on NFS ({clip(mine)}); "
        "no other host of this run uses it"
    )
    return finding("GDS-091", Severity.PASS, msg)


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _judge_pruning(group: _Group) -> Finding:
    members = group.members
    if all(m.server_mode for m in members):
        msg = (
            "offload_mp's file tier is LMCache's L2 adapter layout, not the GDS backend's "
            "chunk files kvops gds prune removes: bound it with the adapter's own eviction"
        )
        return finding("GDS-092", Severity.SKIP, msg)
    if not any(m.prune_probed for m in members):
        return finding("GDS-092", Severity.SKIP, "prune timer not probed (older probe)")
    pruners = [
        m
        for m in members
        if m.prune is not None
        and m.prune.active
        and (m.prune.store == group.store or m.prune.directory is None)
    ]
    if len(pruners) == 1:
        timer = pruners[0].prune
        what = f" ({timer.timer})" if timer else ""
        return finding(
            "GDS-092", Severity.PASS, f"{clip(group.store)} pruned by {pruners[0].host}{what}"
        )
    if pruners:
        msg = (
            f"{clip(group.store)} pruned by {len(pruners)} hosts "
            f"({_hosts(p.host for p in pruners)}): "
            "their budgets compete and their removals race; one is enough"
        )
        return finding(
            "GDS-092", Severity.WARN, msg, remedy="Set one vllm_lmcache_prune_host per directory."
        )
    seen = [
        f"{m.host}: {m.prune.timer} {m.prune.state}"
        + (f" prunes {clip(m.prune.store or m.prune.directory)}" if m.prune.directory else "")
        for m in members
        if m.prune is not None
    ]
    msg = (
        f"no host of this run prunes {clip(group.store)}: LMCache never evicts, so it fills until "
        "the volume is full (a host outside this run may prune it)"
    )
    return finding("GDS-092", Severity.WARN, msg, "\n".join(seen))


def judge_shared_stores(
    documents: Iterable[Mapping[str, Any]], servers: Mapping[str, str] | None = None
) -> dict[str, list[Finding]]:
    """host → its GDS-090/091/092 findings (each carries the host name), for every probed
    host; hosts that were not probed get none (GDS-000 already says why). `servers` maps an
    ONTAP data LIF address to its `cluster/svm` (`kvops.checks.ontap.lif_owners`)."""
    out: dict[str, list[Finding]] = {}
    members: list[HostStore] = []
    for document in documents:
        name = str(document.get("host") or "?")
        if document.get("error"):
            continue
        member = host_store(document, servers)
        if member is None:
            why = "not an offload host: it writes no KV to a GDS directory"
            out[name] = [_with(finding(i, Severity.SKIP, why), name) for i in _IDS]
        elif not member.stores:
            why = "GDS directory not on an NFS mount (see GDS-060): not shared"
            out[name] = [
                _with(finding(i, Severity.SKIP, why), name) for i in ("GDS-090", "GDS-092")
            ]
            out[name].append(_with(_judge_local_disk(member, []), name))
            members.append(member)
        else:
            members.append(member)
    groups: dict[str, _Group] = {}
    for member in members:
        for store in member.stores:
            groups.setdefault(store, _Group(store)).members.append(member)
    for member in members:
        if not member.stores:
            continue
        mine = [groups[s] for s in member.stores]
        findings = [
            _merge([_judge_agreement(g) for g in mine]),
            _judge_local_disk(member, members),
            _merge([_judge_pruning(g) for g in mine]),
        ]
        out[member.host] = [_with(f, member.host) for f in findings]
    return out


_IDS = ("GDS-090", "GDS-091", "GDS-092")


def _merge(items: list[Finding]) -> Finding:
    """One finding per id and host (a host with a comma list of gds_paths is in several
    groups): the worst severity, the messages of that severity joined."""
    worst = next(s for s in SEVERITY_ORDER if any(f.severity is s for f in items))
    chosen = [f for f in items if f.severity is worst]
    if len(chosen) == 1:
        return chosen[0]
    first = chosen[0]
    return Finding(
        first.check_id,
        worst,
        first.title,
        " | ".join(f.message for f in chosen),
        "\n".join(f.evidence for f in chosen if f.evidence),
        first.remedy,
    )


def _with(item: Finding, host: str) -> Finding:
    return Finding(
        item.check_id, item.severity, item.title, item.message, item.evidence, item.remedy, host
    )
