"""NFS/RDMA mount judges and cufile.json judges."""

from __future__ import annotations

from evidence_builders import data_item, edited, file_item, findings_for, fixture, healthy


def mounts(text: str) -> dict[str, object]:
    return file_item("/proc/mounts", text)


def test_gds_dir_on_local_disk_fails_and_nfs_checks_skip() -> None:
    doc = edited(mounts=mounts("/dev/sda3 / xfs rw,relatime 0 0\n"))
    assert findings_for(doc, "GDS-020")[0][0] == "FAIL"
    for check_id in ("GDS-021", "GDS-022", "GDS-023", "GDS-024"):
        assert findings_for(doc, check_id)[0][0] == "SKIP"


def test_mount_without_proto_is_tcp() -> None:
    doc = edited(mounts=mounts("srv:/kv /mnt nfs rw,vers=3,hard,rsize=1048576,wsize=1048576 0 0\n"))
    [(severity, message)] = findings_for(doc, "GDS-021")
    assert severity == "FAIL" and "tcp (no proto option)" in message


def test_soft_small_v42_mount_warns() -> None:
    line = "srv:/kv /mnt nfs4 rw,vers=4.2,soft,proto=rdma,rsize=32768,wsize=1048576 0 0\n"
    doc = edited(mounts=mounts(line))
    assert findings_for(doc, "GDS-021")[0][0] == "PASS"
    assert findings_for(doc, "GDS-022")[0][0] == "WARN"
    assert findings_for(doc, "GDS-023")[0][0] == "WARN"
    [(severity, message)] = findings_for(doc, "GDS-024")
    assert severity == "WARN" and "rsize=32768" in message


def test_a_nosuid_nodev_mount_passes_every_mount_check() -> None:
    """nfs_rdma_mount mounts the shared export nosuid,nodev (the kernel lists them before
    relatime): validate judges that mount as it judged it without them."""
    line = (
        "192.0.2.10:/kvcache /mnt nfs4 rw,nosuid,nodev,relatime,vers=4.1,rsize=262144,"
        "wsize=262144,namlen=255,hard,proto=rdma,port=20049,timeo=600,retrans=2,sec=sys 0 0\n"
    )
    doc = edited(mounts=mounts(line))
    for check_id in ("GDS-020", "GDS-021", "GDS-022", "GDS-023", "GDS-024"):
        assert findings_for(doc, check_id)[0][0] == "PASS", check_id


def test_rpcrdma_missing_fails() -> None:
    doc = edited(modules=file_item("/proc/modules", "nvidia_fs 1 0 - Live 0x0\n"))
    assert findings_for(doc, "GDS-025")[0][0] == "FAIL"


def test_no_active_rdma_port_fails() -> None:
    doc = healthy()
    doc["items"]["infiniband"]["data"]["devices"][0]["ports"][0]["state"] = "1: DOWN"
    assert findings_for(doc, "GDS-026")[0][0] == "FAIL"
    empty = data_item("sysfs", "/sys/class/infiniband", {"devices": []})
    assert findings_for(edited(infiniband=empty), "GDS-026")[0][0] == "FAIL"


def cufile(text: str) -> dict[str, object]:
    return file_item("/etc/cufile.json", text)


TEMPLATE = fixture("cufile/default-cufile.json")


def test_cufile_syntax_error_fails_with_position_and_dependent_checks_skip() -> None:
    doc = edited(cufile_json=cufile(TEMPLATE.replace('"nvtx": false,', '"nvtx": false,,')))
    [(severity, message)] = findings_for(doc, "GDS-030")
    assert severity == "FAIL" and "line 15 column" in message
    assert findings_for(doc, "GDS-031")[0][0] == "SKIP"


def test_missing_cufile_json_warns_defaults() -> None:
    gone = file_item("/etc/cufile.json", "", error="ENOENT: /etc/cufile.json")
    [(severity, message)] = findings_for(edited(cufile_json=gone), "GDS-030")
    assert severity == "WARN" and "defaults" in message
    [(severity, message)] = findings_for(edited(cufile_json=gone), "GDS-032")
    assert severity == "WARN" and "allow_compat_mode true" in message


def test_compat_mode_env_overrides_file() -> None:
    doc = healthy()
    doc["items"]["vllm_env"]["data"]["env"]["CUFILE_ALLOW_COMPAT_MODE"] = "true"
    assert findings_for(doc, "GDS-032")[0][0] == "WARN"
    doc["items"]["vllm_env"]["data"]["env"]["CUFILE_FORCE_COMPAT_MODE"] = "1"
    assert findings_for(doc, "GDS-032")[0][0] == "FAIL"


def test_empty_compat_env_is_no_setting() -> None:
    """An empty CUFILE_*_COMPAT_MODE sets nothing: the file's value stays in force."""
    doc = healthy()
    text = doc["items"]["cufile_json"]["stdout"]
    forced = text.replace('"allow_compat_mode": false', '"force_compat_mode": true', 1)
    doc["items"]["cufile_json"]["stdout"] = forced
    doc["items"]["vllm_env"]["data"]["env"]["CUFILE_FORCE_COMPAT_MODE"] = ""
    [(severity, message)] = findings_for(doc, "GDS-032")
    assert severity == "FAIL" and "force_compat_mode" in message


def test_template_default_allows_compat() -> None:
    assert findings_for(edited(cufile_json=cufile(TEMPLATE)), "GDS-032")[0][0] == "WARN"


def test_rdma_dev_addr_list_must_be_on_rdma_interfaces() -> None:
    good = TEMPLATE.replace('"rdma_dev_addr_list": [ ]', '"rdma_dev_addr_list": ["192.168.10.30"]')
    assert findings_for(edited(cufile_json=cufile(good)), "GDS-033")[0][0] == "PASS"
    bad = TEMPLATE.replace('"rdma_dev_addr_list": [ ]', '"rdma_dev_addr_list": ["127.0.0.1"]')
    [(severity, message)] = findings_for(edited(cufile_json=cufile(bad)), "GDS-033")
    assert severity == "FAIL" and "127.0.0.1" in message  # lo is not an RDMA netdev
    assert findings_for(edited(cufile_json=cufile(good), ip_addr=None), "GDS-033")[0][0] == "SKIP"


def test_max_direct_io_size_multiple_of_64() -> None:
    odd = TEMPLATE.replace('"max_direct_io_size_kb" : 16384', '"max_direct_io_size_kb" : 1000')
    assert findings_for(edited(cufile_json=cufile(odd)), "GDS-034")[0][0] == "FAIL"
