"""The GDS directory itself: writable by the service, clean, with room to grow.

LMCache's GDS backend never evicts, so free space only shrinks; and it writes
`<file>.tmp<hex>` then renames, so leftovers mean interrupted or failed writes.
"""

from __future__ import annotations

from kvops import evidence as ev
from kvops.checks.context import Context
from kvops.checks.model import Finding, Severity, finding
from kvops.checks.rdma_mount import mount_line

GIB = 2**30


def _summary(data: dict[str, object]) -> str:
    keys = ("owner", "group", "mode", "file_count", "bytes", "free_bytes", "tmp_file_count")
    return ", ".join(f"{k}={data[k]}" for k in keys if k in data)


def check_writable(ctx: Context) -> list[Finding]:
    data = ctx.data(ev.GDS_DIR, partial_ok=True)
    if data is None:
        if ctx.gds_dir is None:
            return [finding("GDS-080", Severity.SKIP, "settings.gds_dir not set")]
        return [ctx.skip("GDS-080", ev.GDS_DIR)]
    item = ctx.item(ev.GDS_DIR)
    path = ev.source_text(item)
    if not data.get("exists") or data.get("is_dir") is False:
        why = (item or {}).get("error") or "does not exist or is not a directory"
        return [finding("GDS-080", Severity.FAIL, f"{path}: {why}")]
    user = data.get("service_user") or ctx.settings.get("service_user") or "?"
    unusable = _mount_makes_unusable(ctx, path)
    if unusable is not None:
        return [unusable]
    writable = data.get("writable_by_service_user")
    if writable is True:
        return [finding("GDS-080", Severity.PASS, f"{path} writable by {user}", _summary(data))]
    if writable is False:
        return [finding("GDS-080", Severity.FAIL, f"{path} not writable by {user}", _summary(data))]
    return [finding("GDS-080", Severity.WARN, f"write access for {user} unknown", _summary(data))]


def _mount_makes_unusable(ctx: Context, path: str) -> Finding | None:
    """Mount options that stop the service user writing whatever the mode bits say: `ro`
    (mount(8)); `sec=krb5*` needs a Kerberos credential for that user (nfs(5), "sec=")."""
    table = ctx.mounts
    mount = table.mount_for(ctx.real_path(path)) if table is not None else None
    if mount is None:
        return None
    if "ro" in mount.options:
        msg = f"{path} is on {mount.mount_point}, mounted read-only (ro)"
        return finding("GDS-080", Severity.FAIL, msg, mount_line(mount), "Remount it rw.")
    sec = str(mount.options.get("sec") or "")
    if mount.is_nfs and sec.startswith("krb5"):
        user = ctx.settings.get("service_user") or "the service user"
        msg = (
            f"{mount.mount_point} uses sec={sec}: {user} can write only with a Kerberos "
            "credential (keytab/gssproxy) the mode bits do not show"
        )
        return finding("GDS-080", Severity.WARN, msg, mount_line(mount))
    return None


def check_tmp_files(ctx: Context) -> list[Finding]:
    data = ctx.data(ev.GDS_DIR, partial_ok=True)
    if data is None or not data.get("exists"):
        return [finding("GDS-081", Severity.SKIP, "GDS directory not inspected (see GDS-080)")]
    count = data.get("tmp_file_count")
    if not isinstance(count, int):
        return [finding("GDS-081", Severity.SKIP, "probe did not count temp files")]
    if count == 0:
        return [finding("GDS-081", Severity.PASS, "no leftover temp files")]
    listed = data.get("tmp_files")
    sample = "\n".join(str(p) for p in listed[:5]) if isinstance(listed, list) else ""
    return [finding("GDS-081", Severity.WARN, f"{count} leftover *.tmp* files", sample)]


def check_free_space(ctx: Context) -> list[Finding]:
    data = ctx.data(ev.GDS_DIR, partial_ok=True)
    if data is None or not isinstance(data.get("free_bytes"), int):
        return [finding("GDS-082", Severity.SKIP, "free space not reported (see GDS-080)")]
    free_gib = int(data["free_bytes"]) / GIB
    minimum, whose = ctx.thresholds.min_free_gib, ""
    floor = ctx.settings.get("min_free_gib")
    if isinstance(floor, (int, float)) and not isinstance(floor, bool) and floor >= 0:
        minimum, whose = float(floor), ", this host's kvops_min_free_gib"  # host beats fleet
    msg = f"{free_gib:.{_digits(free_gib)}f} GiB free (minimum {minimum:g} GiB{whose})"
    if free_gib < minimum:
        return [finding("GDS-082", Severity.FAIL, msg, _summary(data))]
    return [finding("GDS-082", Severity.PASS, msg, _summary(data))]


def check_fill(ctx: Context) -> list[Finding]:
    """The file system under the directory, from statvfs: LMCache's GDS backend never evicts
    (LMCache #1724), so a store above the threshold is filling and nothing will stop it but a
    pruner (`kvops gds prune`, the role's timer) or a larger volume."""
    data = ctx.data(ev.GDS_DIR, partial_ok=True) or {}
    free, total = _count(data.get("free_bytes")), _count(data.get("total_bytes"))
    if free is None or not total:
        return [finding("GDS-083", Severity.SKIP, "size of the file system not reported")]
    used_pct = 100.0 * (total - min(free, total)) / total
    limit = ctx.thresholds.max_fill_percent
    msg = f"{used_pct:.1f}% full ({free / GIB:.1f} of {total / GIB:.1f} GiB free)"
    if used_pct > limit:
        return [finding("GDS-083", Severity.WARN, f"{msg}, above {limit:g}%", _summary(data))]
    return [finding("GDS-083", Severity.PASS, f"{msg}, threshold {limit:g}%")]


def _count(value: object) -> int | None:
    """A byte count from the host, or None when it is not one."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if ok and isinstance(value, int) else None


def _digits(gib: float) -> int:
    """Enough decimals that a small volume does not read as 0.0 GiB."""
    return 1 if gib >= 1 or gib == 0 else 3


CHECKS = [check_writable, check_tmp_files, check_free_space, check_fill]
