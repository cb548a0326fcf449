"""Effective LMCache config: file < env < kv_connector_extra_config, keys per LMCache version."""

from __future__ import annotations

from kvops.parse.lmcache_config import buffer_key_for, effective_lmcache_config

YAML = "chunk_size: 256\nlocal_cpu: false\ngds_path: /mnt/kv\ngds_buffer_size: 8192\n"


def test_buffer_key_boundary() -> None:
    assert buffer_key_for("0.4.3") == "cufile_buffer_size"
    assert buffer_key_for("0.3.9") == "cufile_buffer_size"
    assert buffer_key_for("0.4.4") == "gds_buffer_size"
    assert buffer_key_for("0.5.6") == "gds_buffer_size"
    assert buffer_key_for("garbage") is None
    assert buffer_key_for(None) is None


def test_file_then_env_then_extra_config() -> None:
    config = effective_lmcache_config(
        YAML,
        {"LMCACHE_CHUNK_SIZE": "512", "LMCACHE_LOCAL_CPU": "True", "LMCACHE_CONFIG_FILE": "/x"},
        {"lmcache.gds_path": "/mnt/other", "unrelated": 1},
        version="0.5.6",
    )
    assert config.effective == {
        "chunk_size": 512,
        "local_cpu": True,
        "gds_path": "/mnt/other",
        "gds_buffer_size": 8192,
    }
    assert config.sources["chunk_size"] == "env LMCACHE_CHUNK_SIZE"
    assert config.sources["gds_path"] == "kv_connector_extra_config"
    assert config.sources["gds_buffer_size"] == "file"
    assert config.unknown_keys == []


def test_old_key_on_new_version_is_unknown_and_not_effective() -> None:
    config = effective_lmcache_config(
        YAML.replace("gds_buffer_size", "cufile_buffer_size"), {}, version="0.5.6"
    )
    assert "cufile_buffer_size" in config.file_keys
    assert config.unknown_keys == ["cufile_buffer_size"]
    assert "cufile_buffer_size" not in config.effective


def test_new_key_on_old_version_is_unknown() -> None:
    config = effective_lmcache_config(YAML, {}, version="0.4.3")
    assert config.unknown_keys == ["gds_buffer_size"]


def test_bad_env_value_and_extra_config_json() -> None:
    config = effective_lmcache_config(
        None,
        {"LMCACHE_CHUNK_SIZE": "lots", "LMCACHE_EXTRA_CONFIG": '{"use_direct_io": true}'},
    )
    # LMCache logs "Failed to convert value" and runs with None, not with the default
    assert config.effective["chunk_size"] is None
    assert config.value("chunk_size") is None
    assert config.unconverted == {"chunk_size": "env LMCACHE_CHUNK_SIZE: 'lots'"}
    assert config.effective["extra_config"] == {"use_direct_io": True}
    assert any("LMCACHE_CHUNK_SIZE" in w for w in config.warnings)


def test_yaml_error_has_position_and_non_mapping_is_an_error() -> None:
    config = effective_lmcache_config("gds_path: [unclosed\n", {})
    assert config.error is not None and config.error.startswith("line ")
    assert effective_lmcache_config("- a\n- b\n").error == "top level is list, expected a mapping"


def test_booleans_are_lmcaches_only_true_and_1_are_true() -> None:
    env = {"LMCACHE_USE_GDS": "yes", "LMCACHE_LOCAL_CPU": "1", "LMCACHE_SAVE_UNFULL_CHUNK": "On"}
    config = effective_lmcache_config("save_decode_cache: TRUE\n", env, version="0.5.6")
    assert config.effective["use_gds"] is False  # "yes" is false to LMCache
    assert config.effective["local_cpu"] is True
    assert config.effective["save_unfull_chunk"] is False
    assert config.effective["save_decode_cache"] is True


def test_defaults_apply_only_to_unset_keys() -> None:
    config = effective_lmcache_config("gds_path: /mnt/kv\n", {}, version="0.5.6")
    assert config.value("use_gds") is True and not config.is_set("use_gds")
    assert config.value("pre_caching_hash_algorithm") == "builtin"
    assert config.value("gds_path") == "/mnt/kv" and config.is_set("gds_path")


def test_unconvertible_file_value_is_none_and_a_later_source_clears_it() -> None:
    config = effective_lmcache_config(
        "gds_buffer_size: 8 GiB\n", {}, {"lmcache.gds_buffer_size": 4096}, version="0.5.6"
    )
    assert config.effective["gds_buffer_size"] == 4096 and config.unconverted == {}
    config = effective_lmcache_config("gds_buffer_size: 8 GiB\n", {}, version="0.5.6")
    assert config.effective["gds_buffer_size"] is None
    assert "gds_buffer_size" in config.unconverted


def test_unknown_connector_key_is_warned_and_ignored() -> None:
    config = effective_lmcache_config(None, {}, {"lmcache.gds_io_threads": 8}, version="0.5.6")
    assert config.unknown_keys == ["gds_io_threads"]
    assert "gds_io_threads" not in config.effective
