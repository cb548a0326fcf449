"""The strict spec loader: field metadata decides what a YAML key accepts and what --help says."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvops.cli import main
from kvops.schema import load_strict, reference, spec_field
from kvops.sim.profiles import (
    GpuProfile,
    ModelProfile,
    ProfileError,
    StorageProfile,
    load_storage,
)
from kvops.workload.spec import WorkloadSpec


@dataclass(frozen=True)
class Example:
    count: int = spec_field(1, minimum=1, help="How many.")
    share: float = spec_field(0.5, above=0, help="A positive share.")
    rate: float | None = spec_field(None, above=0, inf_ok=True, help="Per second.")
    mode: str = spec_field("a", choices=("a", "b"), help="Which mode.")


@pytest.mark.parametrize(
    ("data", "values"),
    [
        ({}, {}),
        ({"count": 3, "share": 1}, {"count": 3, "share": 1.0}),
        ({"rate": "inf", "mode": "b"}, {"rate": math.inf, "mode": "b"}),
        ({"rate": None}, {"rate": None}),
    ],
)
def test_good_values_load_with_their_types(data: dict[str, object], values: dict[str, Any]) -> None:
    loaded = load_strict(Example, data, "x.yaml")
    assert loaded == values and all(type(loaded[k]) is type(v) for k, v in values.items())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "x.yaml: expected a mapping of keys, got list"),
        ({"cont": 1}, "x.yaml: unknown key(s) cont; allowed: count, mode, rate, share"),
        ({"count": True}, "x.yaml: count must be an integer >= 1"),
        ({"count": 0}, "x.yaml: count must be an integer >= 1"),
        ({"count": 1.5}, "x.yaml: count must be an integer >= 1"),
        ({"share": 0}, "x.yaml: share must be a number > 0"),
        ({"share": None}, "x.yaml: share must be a number > 0"),
        ({"rate": "fast"}, "x.yaml: rate must be a number > 0, inf or null"),
        ({"mode": "c"}, "x.yaml: mode must be one of a, b"),
    ],
)
def test_bad_values_name_the_key_and_what_it_accepts(data: object, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        load_strict(Example, data, "x.yaml")
    assert str(caught.value) == message


@dataclass(frozen=True)
class Part:
    path: str = spec_field(pattern=r"/.*", pattern_is="an absolute path", help="Where.")


@dataclass(frozen=True)
class Whole:
    tags: tuple[str, ...] = spec_field(
        (), pattern=r"[a-z]+", pattern_is="a lowercase word", min_items=1, item="tag", help="T."
    )
    labels: Mapping[str, str] = spec_field(default_factory=dict, help="L.")
    parts: tuple[Part, ...] = spec_field((), help="P.")


def test_lists_mappings_and_nested_specs_load_checked() -> None:
    loaded = load_strict(
        Whole, {"tags": ["a", "b"], "labels": {"k": "v"}, "parts": [{"path": "/x"}]}, "w.yaml"
    )
    assert loaded == {"tags": ("a", "b"), "labels": {"k": "v"}, "parts": (Part("/x"),)}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"tags": "a"},
            "w.yaml: tags must be a list of strings, each a lowercase word (at least 1)",
        ),
        ({"tags": []}, "w.yaml: tags: needs at least one tag"),
        ({"tags": ["a", "B"]}, "w.yaml: tags: 'B' is not a lowercase word"),
        ({"labels": {"k": 1}}, "w.yaml: labels must be a mapping of names to strings"),
        ({"parts": [{"path": "x"}]}, "w.yaml: parts[0]: path: 'x' is not an absolute path"),
        (
            {"parts": [{"path": "/x", "pth": 1}]},
            "w.yaml: parts[0]: unknown key(s) pth; allowed: path",
        ),
        ({"parts": [{}]}, "w.yaml: parts[0]: missing field 'path'"),
        ({"parts": ["/x"]}, "w.yaml: parts[0]: expected a mapping of keys, got str"),
    ],
)
def test_bad_items_name_their_place(data: object, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        load_strict(Whole, data, "w.yaml")
    assert str(caught.value) == message


def test_lab_up_help_prints_the_package_list_reference() -> None:
    from kvops.lab.aptrepo import FileEntry, PackageEntry, RepoEntry

    result = CliRunner().invoke(main, ["lab", "up", "--help"])
    assert result.exit_code == 0 and "Package list (--packages FILE" in result.output
    for cls in (RepoEntry, PackageEntry, FileEntry):
        for field in dataclasses.fields(cls):
            assert f"\n      {field.name}: " in result.output


def test_reference_lists_every_key_with_its_rule_and_default() -> None:
    text = reference(Example)
    assert "count: an integer >= 1  [default: 1]\n    How many." in text
    assert "rate: a number > 0, inf or null  [default: null]" in text


@pytest.mark.parametrize(
    "command",
    [["ab-test", "--help"], ["advise", "trace", "--help"], ["advise", "x.yaml", "--help"]],
)
def test_every_command_that_reads_a_workload_spec_prints_its_reference(
    command: list[str],
) -> None:
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 0
    assert "Workload spec (" in result.output
    for field in dataclasses.fields(WorkloadSpec):
        assert f"\n    {field.name}: " in result.output


def test_profiles_are_strict_and_sim_help_prints_their_reference(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(
        "kind: storage\nread_bandwidth_gb_s: 10\nwrite_bandwidth_gb_s: 9\nio_latency_us: 5\n"
        "capacity_gb: null\nread_bandwith_gb_s: 20\n"
    )
    with pytest.raises(ProfileError, match="unknown key\\(s\\) read_bandwith_gb_s"):
        load_storage(str(path))
    path.write_text(path.read_text().replace("read_bandwith_gb_s: 20", "io_latency_us: -1"))
    with pytest.raises(ProfileError, match="io_latency_us must be a number >= 0"):
        load_storage(str(path))
    result = CliRunner().invoke(main, ["sim", "--help"])
    for cls in (GpuProfile, ModelProfile, StorageProfile):
        for field in dataclasses.fields(cls):
            assert f"\n      {field.name}: " in result.output


def test_a_share_above_one_is_refused() -> None:
    @dataclass(frozen=True)
    class Share:
        mfu: float = spec_field(above=0, maximum=1, help="A share.")

    assert load_strict(Share, {"mfu": 1}, "s") == {"mfu": 1.0}
    with pytest.raises(ValueError, match="mfu must be a number > 0 <= 1"):
        load_strict(Share, {"mfu": 1.5}, "s")
    with pytest.raises(ValueError, match="s: missing field 'mfu'"):
        load_strict(Share, {}, "s")
