"""Workload specs: strict keys, checked values, presets as data, proportional scaling."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kvops.workload import (
    PRESET_NAMES,
    WorkloadSpecError,
    load_preset,
    load_spec_file,
    spec_from_dict,
)


def test_presets_load_and_match_the_reference_experiment() -> None:
    specs = {n: load_preset(n) for n in PRESET_NAMES}
    multi = specs["multi-shared-prefix"]
    assert (multi.num_prefixes, multi.prefix_tokens, multi.prompt_tokens) == (20, 28000, 30000)
    assert specs["single-shared-prefix"].num_prefixes == 1
    assert specs["unique-one-shot"].num_prefixes == 0
    assert all(s.name == n for n, s in specs.items())


def test_unknown_key_is_an_error_naming_it() -> None:
    with pytest.raises(WorkloadSpecError, match="prefix_token"):
        spec_from_dict({"prefix_token": 28000})


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"prompt_tokens": "30000"}, "prompt_tokens must be an integer"),
        ({"batch_size": 0}, "batch_size must be an integer >= 1"),
        ({"iterations": True}, "iterations"),
        ({"num_prefixes": 2, "prefix_tokens": 100, "prompt_tokens": 100}, "must exceed"),
        ({"prefix_tokens": 10}, "num_prefixes is 0"),
        ({"rate": -1}, "rate must be"),
        ({"max_concurrency": 4}, "rate mode"),
    ],
)
def test_bad_values_are_errors(data: dict[str, object], fragment: str) -> None:
    with pytest.raises(WorkloadSpecError, match=fragment):
        spec_from_dict(data)


def test_rate_accepts_inf() -> None:
    spec = spec_from_dict({"rate": "inf", "max_concurrency": 8})
    assert math.isinf(spec.rate or 0.0)
    assert spec.to_dict()["rate"] == "inf"


def test_scale_shrinks_lengths_not_counts() -> None:
    spec = load_preset("multi-shared-prefix").scaled(0.25)
    assert (spec.prefix_tokens, spec.prompt_tokens) == (7000, 7500)
    assert spec.output_tokens == 16
    assert (spec.num_prefixes, spec.batch_size) == (20, 40)
    tiny = load_preset("multi-shared-prefix").scaled(1e-5)
    assert tiny.prompt_tokens > tiny.prefix_tokens >= 1 and tiny.output_tokens >= 2
    with pytest.raises(WorkloadSpecError):
        load_preset("unique-one-shot").scaled(1.5)


def test_spec_file_round_trip(tmp_path: Path) -> None:
    spec = load_preset("single-shared-prefix")
    path = tmp_path / "w.yaml"
    path.write_text(spec.to_yaml())
    assert load_spec_file(path) == spec
    path.write_text("num_prefixes: [1\n")
    with pytest.raises(WorkloadSpecError, match="not valid YAML"):
        load_spec_file(path)
    with pytest.raises(WorkloadSpecError, match="cannot read"):
        load_spec_file(tmp_path / "missing.yaml")


def test_file_without_name_is_custom(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("prompt_tokens: 100\noutput_tokens: 4\n")
    assert load_spec_file(path).name == "custom"


def test_unknown_preset() -> None:
    with pytest.raises(WorkloadSpecError, match="unknown scenario"):
        load_preset("nope")
