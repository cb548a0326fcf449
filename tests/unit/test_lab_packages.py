"""The package list of the lab's test apt repo is valid, and the builder refuses bad lists."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvops.lab.aptrepo import PackageSpecError, parse_spec, substitute, upstream_version
from kvops.lab.lab import spec_sources

SPEC = Path(__file__).resolve().parents[1] / "lab" / "packages.yml"


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    loaded = yaml.safe_load(SPEC.read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_the_committed_package_list_is_valid_and_every_source_exists(doc: dict[str, Any]) -> None:
    spec = parse_spec(doc)
    sources = spec_sources(SPEC)
    for pkg in spec.packages:
        for f in pkg.files:
            if f.kind in ("double", "fixture", "file"):
                assert sources.resolve(f).is_file()
        for script in (pkg.postinst, pkg.prerm):
            if script:
                assert (sources.doubles / script).is_file()
    for f in spec.host_doubles:
        if f.kind in ("double", "file"):
            assert sources.resolve(f).is_file()


def test_the_list_has_what_the_roles_pin(doc: dict[str, Any]) -> None:
    spec = parse_spec(doc)
    versions = {p.name: p.versions for p in spec.packages}
    assert len(versions["nvidia-driver-580-open"]) >= 3  # pinning is testable
    for name in (
        "nvidia-driver-580",
        "nvidia-persistenced",
        "cuda-keyring",
        "nvidia-gds",
        "nvidia-fs-dkms",
        "libcufile-12-9",
        "gds-tools-12-9",
        "doca-ofed",
        "rdma-core",
        "nfs-common",
    ):
        assert name in versions
    for pkg in spec.packages:
        assert pkg.description  # "kvops lab TEST DOUBLE" is prefixed by the builder


def _broken(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    bad = copy.deepcopy(doc)
    target = bad["packages"][0]
    if value is None:
        del target[path]
    else:
        target[path] = value
    return bad


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("versions", ["not a version"], "not a valid Debian version"),
        ("versions", [], "at least one version"),
        ("name", "Bad_Name", "not a valid Debian package name"),
        ("description", None, "description"),
        ("files", [{"path": "relative/x", "content": "x"}], "absolute"),
        ("files", [{"path": "/x", "content": "x", "double": "y"}], "exactly one"),
        ("files", [{"path": "/x", "content": "x", "mode": "644"}], "mode"),
        ("depends", "libfoo", "list of strings"),
        ("recommends", ["x"], "unknown key"),
    ],
)
def test_malformed_entries_are_refused_with_the_package_named(
    doc: dict[str, Any], field: str, value: Any, message: str
) -> None:
    with pytest.raises(PackageSpecError, match=message):
        parse_spec(_broken(doc, field, value))


def test_duplicate_packages_are_refused(doc: dict[str, Any]) -> None:
    bad = copy.deepcopy(doc)
    bad["packages"].append(copy.deepcopy(bad["packages"][0]))
    with pytest.raises(PackageSpecError, match="listed twice"):
        parse_spec(bad)


def test_versions_and_substitutions() -> None:
    assert upstream_version("1:2.6.2-4+deb12u1") == "2.6.2"
    assert upstream_version("580.95.05-0ubuntu1") == "580.95.05"
    assert upstream_version("1.1") == "1.1"
    spec = parse_spec(
        {
            "schema": 1,
            "packages": [
                {
                    "name": "nvidia-fs",
                    "versions": ["2.26.6-1"],
                    "description": "d",
                    "depends": ["nvidia-fs-dkms (= {version})"],
                    "vars": {"flavor": "open"},
                }
            ],
        }
    )
    pkg = spec.packages[0]
    assert substitute("{name} {version} {upstream_version} {flavor}", pkg, "2.26.6-1") == (
        "nvidia-fs 2.26.6-1 2.26.6 open"
    )
