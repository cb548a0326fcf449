"""A local apt repository built from a package list (``tests/lab/packages.yml``).

The builder is generic: it turns a validated list of (name, versions, files) into ``.deb`` files
(``dpkg-deb --root-owner-group --build``) and an index (``dpkg-scanpackages --multiversion``).
What goes *into* the packages (test doubles, recorded outputs) lives under ``tests/``, never in
this package. Hosts see the result read-only at ``/srv/kvops-test-repo`` as their only source.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvops.errors import KvopsError
from kvops.lab.errors import LabError, run

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
VERSION_RE = re.compile(r"^(\d+:)?[0-9][A-Za-z0-9.+~-]*$")
FILE_KINDS = ("double", "fixture", "file", "content", "symlink")
RELATIONS = ("depends", "conflicts", "provides", "replaces")


class PackageSpecError(KvopsError, ValueError):
    """The package list is malformed; the message names the package and the field."""


@dataclass(frozen=True)
class FileSpec:
    path: str
    kind: str  # one of FILE_KINDS
    source: str
    mode: int


@dataclass(frozen=True)
class PackageSpec:
    name: str
    versions: tuple[str, ...]
    description: str
    files: tuple[FileSpec, ...]
    relations: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    postinst: str | None = None
    vars: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RepoSpec:
    packages: tuple[PackageSpec, ...]
    host_doubles: tuple[FileSpec, ...]
    repo_dir_in_host: str
    apt_source: str


def _file_spec(where: str, raw: Any) -> FileSpec:
    if not isinstance(raw, dict) or not isinstance(raw.get("path"), str):
        raise PackageSpecError(f"{where}: each file needs a 'path' string")
    path = raw["path"]
    if not path.startswith("/") or ".." in path.split("/"):
        raise PackageSpecError(f"{where}: path {path!r} must be absolute without '..'")
    kinds = [k for k in FILE_KINDS if k in raw]
    if len(kinds) != 1:
        raise PackageSpecError(f"{where} {path}: give exactly one of {', '.join(FILE_KINDS)}")
    kind = kinds[0]
    source = raw[kind]
    if not isinstance(source, str):
        raise PackageSpecError(f"{where} {path}: '{kind}' must be a string")
    default_mode = "0755" if kind == "double" else "0644"
    mode_text = str(raw.get("mode", default_mode))
    if not re.fullmatch(r"0[0-7]{3}", mode_text):
        raise PackageSpecError(f"{where} {path}: mode must look like '0644', got {mode_text!r}")
    unknown = set(raw) - {"path", "mode", kind}
    if unknown:
        raise PackageSpecError(f"{where} {path}: unknown keys {sorted(unknown)}")
    return FileSpec(path=path, kind=kind, source=source, mode=int(mode_text, 8))


def _str_list(where: str, key: str, raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(x, str) and x for x in raw):
        raise PackageSpecError(f"{where}: '{key}' must be a list of strings")
    return tuple(raw)


def parse_spec(doc: Any) -> RepoSpec:
    """Validate the loaded YAML document (pure; raises :class:`PackageSpecError`)."""
    if not isinstance(doc, dict) or doc.get("schema") != 1:
        raise PackageSpecError("package list: expected a mapping with 'schema: 1'")
    raw_packages = doc.get("packages")
    if not isinstance(raw_packages, list) or not raw_packages:
        raise PackageSpecError("package list: 'packages' must be a non-empty list")
    packages: list[PackageSpec] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_packages):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise PackageSpecError(f"packages[{i}]: needs a 'name'")
        name = raw["name"]
        where = f"package {name}"
        if not NAME_RE.match(name):
            raise PackageSpecError(f"{where}: not a valid Debian package name")
        if name in seen:
            raise PackageSpecError(f"{where}: listed twice")
        seen.add(name)
        unknown = set(raw) - {"name", "versions", "description", "files", "postinst", "vars"}
        unknown -= set(RELATIONS)
        if unknown:
            raise PackageSpecError(f"{where}: unknown keys {sorted(unknown)}")
        versions = _str_list(where, "versions", raw.get("versions"))
        if not versions:
            raise PackageSpecError(f"{where}: needs at least one version")
        for version in versions:
            if not VERSION_RE.match(version):
                raise PackageSpecError(f"{where}: {version!r} is not a valid Debian version")
        if len(set(versions)) != len(versions):
            raise PackageSpecError(f"{where}: a version is listed twice")
        description = raw.get("description")
        if not isinstance(description, str) or not description.strip():
            raise PackageSpecError(f"{where}: needs a one-line 'description'")
        files_raw = raw.get("files") or []
        if not isinstance(files_raw, list):
            raise PackageSpecError(f"{where}: 'files' must be a list")
        files = tuple(_file_spec(where, f) for f in files_raw)
        paths = [f.path for f in files]
        if len(set(paths)) != len(paths):
            raise PackageSpecError(f"{where}: a path is listed twice")
        relations = {key: _str_list(where, key, raw.get(key)) for key in RELATIONS}
        postinst = raw.get("postinst")
        if postinst is not None and not isinstance(postinst, str):
            raise PackageSpecError(f"{where}: 'postinst' must name a double")
        pvars = raw.get("vars") or {}
        if not isinstance(pvars, dict) or not all(isinstance(v, str) for v in pvars.values()):
            raise PackageSpecError(f"{where}: 'vars' must map names to strings")
        packages.append(
            PackageSpec(name, versions, description.strip(), files, relations, postinst, pvars)
        )
    host_doubles = tuple(_file_spec("host_doubles", f) for f in doc.get("host_doubles") or [])
    return RepoSpec(
        packages=tuple(packages),
        host_doubles=host_doubles,
        repo_dir_in_host=str(doc.get("repo_dir_in_host", "/srv/kvops-test-repo")),
        apt_source=str(doc.get("apt_source", "deb [trusted=yes] file:/srv/kvops-test-repo ./")),
    )


def load_spec(path: Path) -> RepoSpec:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PackageSpecError(f"cannot read package list {path}: {exc}") from exc
    return parse_spec(doc)


def upstream_version(version: str) -> str:
    """``1:2.6.2-4+deb12u1`` -> ``2.6.2``; ``580.95.05-0ubuntu1`` -> ``580.95.05``."""
    no_epoch = version.split(":", 1)[-1]
    return no_epoch.rsplit("-", 1)[0] if "-" in no_epoch else no_epoch


def substitute(text: str, pkg: PackageSpec, version: str) -> str:
    values = {"name": pkg.name, "version": version, "upstream_version": upstream_version(version)}
    values.update(pkg.vars)
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


@dataclass(frozen=True)
class Sources:
    """Where file sources resolve: doubles, recorded fixtures, plain files (all under tests/)."""

    doubles: Path
    fixtures: Path
    files: Path

    def resolve(self, spec: FileSpec) -> Path:
        base = {"double": self.doubles, "fixture": self.fixtures, "file": self.files}[spec.kind]
        path = base / spec.source
        if not path.is_file():
            raise PackageSpecError(f"{spec.path}: {spec.kind} source {path} does not exist")
        return path


def place_file(root: Path, spec: FileSpec, sources: Sources, text_sub: Any = None) -> None:
    """Materialise one file spec under ``root`` (a package tree or a host's inject tree)."""
    rel = spec.path.lstrip("/")
    if text_sub is not None:
        rel = text_sub(rel)
    dest = root / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    if spec.kind == "symlink":
        dest.symlink_to(spec.source)
        return
    if spec.kind == "content":
        data = spec.source if text_sub is None else text_sub(spec.source)
        dest.write_text(data)
    else:
        shutil.copyfile(sources.resolve(spec), dest)
    dest.chmod(spec.mode)


def digest(spec_path: Path, spec: RepoSpec, sources: Sources) -> str:
    """Hash of the list, the doubles and every file it pulls in: rebuild only on change.

    Only referenced fixtures count, so unrelated fixture changes do not rebuild the repo.
    """
    h = hashlib.sha256(spec_path.read_bytes())
    for base in (sources.doubles, sources.files):
        if base.is_dir():
            for f in sorted(p for p in base.rglob("*") if p.is_file()):
                h.update(str(f.relative_to(base)).encode())
                h.update(f.read_bytes())
    for pkg in spec.packages:
        for fspec in pkg.files:
            if fspec.kind == "fixture":
                h.update(fspec.source.encode())
                h.update(sources.resolve(fspec).read_bytes())
    return h.hexdigest()[:16]


def _control(pkg: PackageSpec, version: str) -> str:
    lines = [
        f"Package: {pkg.name}",
        f"Version: {version}",
        "Architecture: all",
        "Maintainer: kvops lab test doubles <kvops-lab@localhost>",
        "Section: kvops-test",
        "Priority: optional",
    ]
    for key in RELATIONS:
        values = [substitute(v, pkg, version) for v in pkg.relations.get(key, ())]
        if values:
            lines.append(f"{key.capitalize()}: {', '.join(values)}")
    lines.append(f"Description: kvops lab TEST DOUBLE: {pkg.description}")
    lines.append(" Contents are test doubles from the kvops repository (tests/lab/doubles).")
    return "\n".join(lines) + "\n"


def build_package(pkg: PackageSpec, version: str, sources: Sources, work: Path, out: Path) -> Path:
    tree = work / f"{pkg.name}_{version.replace(':', '%3a')}"
    shutil.rmtree(tree, ignore_errors=True)
    (tree / "DEBIAN").mkdir(parents=True)
    for spec in pkg.files:
        place_file(tree, spec, sources, lambda t: substitute(t, pkg, version))
    marker = tree / f"usr/share/doc/{pkg.name}/KVOPS-TEST-DOUBLE"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{pkg.name} {version} is a kvops lab test double: {pkg.description}\n")
    etc = tree / "etc"
    conffiles = sorted(
        "/" + str(p.relative_to(tree)) for p in etc.rglob("*") if p.is_file() and not p.is_symlink()
    )
    (tree / "DEBIAN/control").write_text(_control(pkg, version))
    if conffiles:
        (tree / "DEBIAN/conffiles").write_text("".join(c + "\n" for c in conffiles))
    if pkg.postinst:
        script = tree / "DEBIAN/postinst"
        shutil.copyfile(sources.doubles / pkg.postinst, script)
        script.chmod(0o755)
    deb = out / f"{pkg.name}_{version.split(':', 1)[-1]}_all.deb"
    run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(tree), str(deb)])
    return deb


def build_repo(spec: RepoSpec, sources: Sources, out: Path) -> Path:
    """Build every version of every package into ``out`` and index it; returns ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    work = out.with_name(out.name + ".work")
    shutil.rmtree(work, ignore_errors=True)
    try:
        for pkg in spec.packages:
            for version in pkg.versions:
                build_package(pkg, version, sources, work, out)
    except PackageSpecError as exc:
        raise LabError(f"test package list: {exc}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    index = run(["dpkg-scanpackages", "--multiversion", ".", "/dev/null"], timeout_s=120, cwd=out)
    (out / "Packages").write_text(index.stdout)
    with gzip.open(out / "Packages.gz", "wt") as handle:
        handle.write(index.stdout)
    out.chmod(0o755)
    return out
