"""Mount table parser: the recorded ONTAP NFS/RDMA mount, /proc/mounts lines, lookup by path."""

from __future__ import annotations

from pathlib import Path

from kvops.parse.mounts import parse_mounts

FIXTURE = Path(__file__).parent.parent / "fixtures" / "misc" / "mount-nfs4-rdma-netapp-ontap.txt"

PROC_MOUNTS = (
    "/dev/sda3 / xfs rw,relatime 0 0\n"
    "tmpfs /run tmpfs rw,nosuid,nodev,size=3276800k,mode=755 0 0\n"
    "10.0.0.5:/vol/kv /mnt/kv nfs rw,vers=3,rsize=65536,wsize=65536,soft,proto=tcp,port=2049 0 0\n"
    "10.0.0.5:/vol/kv2 /mnt/kv/deep\\040dir nfs4 rw,vers=4.1,proto=rdma,port=20049 0 0\n"
)


def test_recorded_ontap_mount_command_output() -> None:
    table = parse_mounts(FIXTURE.read_text())
    assert table.warnings == []  # the copied prompt line is not a mount line
    [mount] = table.mounts
    assert mount.fs_type == "nfs4" and mount.is_nfs
    assert mount.proto == "rdma"
    assert mount.nfs_version == "4.1"
    assert mount.hard
    assert mount.size_bytes("rsize") == 262144 and mount.size_bytes("wsize") == 262144
    assert mount.options["port"] == "20049"
    assert mount.options["hard"] is None


def test_proc_mounts_lookup_picks_the_deepest_mount() -> None:
    table = parse_mounts(PROC_MOUNTS)
    assert table.warnings == []
    assert table.mount_for("/mnt/kv/cache").mount_point == "/mnt/kv"  # type: ignore[union-attr]
    deep = table.mount_for("/mnt/kv/deep dir/x")
    assert deep is not None and deep.mount_point == "/mnt/kv/deep dir" and deep.proto == "rdma"
    assert table.mount_for("/mnt/kvother").mount_point == "/"  # type: ignore[union-attr]
    tcp = table.mount_for("/mnt/kv")
    assert tcp is not None and tcp.proto == "tcp" and not tcp.hard and tcp.nfs_version == "3"


def test_nfs4_without_vers_and_minorversion() -> None:
    table = parse_mounts(
        "srv:/a /a nfs4 rw,proto=rdma 0 0\nsrv:/b /b nfs rw,vers=4,minorversion=1 0 0\n"
    )
    assert table.mounts[0].nfs_version == "4"
    assert table.mounts[1].nfs_version == "4.1"
    assert table.mounts[1].proto is None


def test_garbage_and_truncated_lines_warn() -> None:
    table = parse_mounts("srv:/a /a nfs4 rw,proto=rd\nnot a mount\n")
    assert len(table.mounts) == 1
    assert len(table.warnings) == 2
