"""cufile.json parser: the shipped template, typos with suggestions, syntax errors with position."""

from __future__ import annotations

from pathlib import Path

from kvops.parse.cufile import KNOWN_KEYS, parse_cufile, strip_comments, suggest

TEMPLATE = (
    Path(__file__).parent.parent / "fixtures" / "cufile" / "default-cufile.json"
).read_text()


def test_default_template_parses_with_only_known_keys() -> None:
    config = parse_cufile(TEMPLATE)
    assert config.error is None
    assert config.unknown_keys == []
    assert config.get("properties.allow_compat_mode") is True
    assert config.get("properties.max_direct_io_size_kb") == 16384
    assert config.get("fs.beegfs.posix_gds_min_kb") == 0  # value followed only by comments
    assert config.get("properties.rdma_dev_addr_list") == []
    assert config.get("denylist.filesystems") == []


def test_misspelled_key_gets_a_suggestion() -> None:
    config = parse_cufile(TEMPLATE.replace('"allow_compat_mode"', '"allow_compat_mod"'))
    [unknown] = config.unknown_keys
    assert unknown.key == "properties.allow_compat_mod"
    assert unknown.suggestion == "properties.allow_compat_mode"


def test_gdscheck_display_name_is_not_a_config_key() -> None:
    config = parse_cufile('{"properties": {"use_compat_mode": false}}')
    assert [u.key for u in config.unknown_keys] == ["properties.use_compat_mode"]


def test_key_in_wrong_section_is_suggested_by_leaf() -> None:
    assert suggest("execution.max_direct_io_size_kb") == "properties.max_direct_io_size_kb"
    assert suggest("totally.unrelated") is None


def test_mount_table_paths_are_free_names() -> None:
    text = (
        '{"fs": {"nfs": {"mount_table": {"/mnt/a/": {"rdma_dev_addr_list": ["10.0.0.1"]},'
        ' "/mnt/b/": {"rdma_dev_adr_list": []}}}}}'
    )
    config = parse_cufile(text)
    assert [u.key for u in config.unknown_keys] == ["fs.nfs.mount_table./mnt/b/.rdma_dev_adr_list"]
    assert config.get("fs.nfs.mount_table")["/mnt/a/"]["rdma_dev_addr_list"] == ["10.0.0.1"]


def test_syntax_error_names_line_and_column_in_the_original_file() -> None:
    broken = TEMPLATE.replace('"level": "ERROR"', '"level": "ERROR",', 1)
    config = parse_cufile(broken)
    assert config.config is None
    line = next(i for i, ln in enumerate(broken.splitlines(), 1) if '"level": "ERROR",' in ln)
    assert config.error is not None and config.error.startswith(f"line {line + 1} column")


def test_comment_markers_inside_strings_are_kept() -> None:
    text = '{"logging": {"dir": "/var//log"} // trailing\n}'
    assert parse_cufile(text).get("logging.dir") == "/var//log"
    assert len(strip_comments(text)) == len(text)


def test_duplicate_keys_and_non_object_top_level() -> None:
    config = parse_cufile('{"profile": {"nvtx": true, "nvtx": false}}')
    assert config.get("profile.nvtx") is False
    assert "duplicate" in config.warnings[0]
    assert parse_cufile("[1]").error == "top level is list, expected an object"
    assert parse_cufile("").error is not None


def test_known_keys_cover_the_reference_list() -> None:
    for key in (
        "properties.rdma_dynamic_routing_order",
        "fs.gpfs.gds_async_support",
        "miscellaneous.skip_topology_detection",
        "properties.gpu_bounce_buffer_slab_config.slab_count",
        "block.nvmeof.use_pci_p2pdma",
    ):
        assert key in KNOWN_KEYS
