"""A local apt repository built from a package list (``tests/lab/packages.yml``).

The builder is generic: it turns a validated list of (name, versions, files) into ``.deb`` files
(``dpkg-deb --root-owner-group --build``) and an index (``dpkg-scanpackages --multiversion``).
What goes *into* the packages (test doubles, recorded outputs) lives under ``tests/``, never in
this package. Hosts see the result read-only at ``/srv/kvops-test-repo`` as their only source.
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvops.errors import KvopsError
from kvops.lab.errors import LabError, run
from kvops.schema import load_strict, reference, spec_field

NAME_RE = r"[a-z0-9][a-z0-9+.-]+"  # Debian Policy 5.6.1 (Package)
VERSION_RE = r"(\d+:)?[0-9][A-Za-z0-9.+~-]*"  # Debian Policy 5.6.12 (Version)
FILE_KINDS = ("double", "fixture", "file", "content", "symlink")
RELATIONS = ("depends", "conflicts", "provides", "replaces")
# https://www.debian.org/doc/debian-policy/ch-controlfields.html
ABSOLUTE_RE = r"/(?!(.*/)?\.\.(/|$)).*"


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
    prerm: str | None = None


@dataclass(frozen=True)
class RepoSpec:
    packages: tuple[PackageSpec, ...]
    host_doubles: tuple[FileSpec, ...]
    repo_dir_in_host: str
    apt_source: str


# --- the YAML as written, checked by kvops.schema from these fields' metadata ---------------


@dataclass(frozen=True)
class FileEntry:
    """One file of a package (or one double installed straight into every host)."""

    path: str = spec_field(
        pattern=ABSOLUTE_RE, pattern_is="an absolute path without '..'", help="Path in the host."
    )
    mode: str | None = spec_field(
        None, pattern=r"0[0-7]{3}", pattern_is="a mode like '0644'",
        help="Octal mode (default 0755 for a double, else 0644).",
    )  # fmt: skip
    double: str | None = spec_field(None, help="A file in tests/lab/doubles/.")
    fixture: str | None = spec_field(None, help="A recorded real output under tests/fixtures/.")
    file: str | None = spec_field(None, help="A config file under tests/lab/files/.")
    content: str | None = spec_field(None, help='Inline text; "{name}", "{version}" substituted.')
    symlink: str | None = spec_field(None, help="A symlink to this target.")


_RELATION = {"pattern": r".*\S.*", "pattern_is": "a Debian relation"}


@dataclass(frozen=True)
class PackageEntry:
    name: str = spec_field(
        pattern=NAME_RE, pattern_is="a valid Debian package name", help="Package name."
    )
    versions: tuple[str, ...] = spec_field(
        pattern=VERSION_RE, pattern_is="a valid Debian version", min_items=1, item="version",
        help="Every version built; the last one is the newest.",
    )  # fmt: skip
    description: str = spec_field(
        pattern=r"(?s).*\S.*", pattern_is="a one-line description", help="Package description."
    )
    files: tuple[FileEntry, ...] = spec_field((), help="Files the package ships.")
    depends: tuple[str, ...] = spec_field((), **_RELATION, help='Depends ("{version}" ok).')
    conflicts: tuple[str, ...] = spec_field((), **_RELATION, help="Conflicts.")
    provides: tuple[str, ...] = spec_field((), **_RELATION, help="Provides.")
    replaces: tuple[str, ...] = spec_field((), **_RELATION, help="Replaces.")
    postinst: str | None = spec_field(None, help="A double in tests/lab/doubles/ run as postinst.")
    prerm: str | None = spec_field(
        None, help="A double in tests/lab/doubles/ run as prerm (undoes what postinst did)."
    )
    vars: Mapping[str, str] = spec_field(
        default_factory=dict, help='Extra "{key}" substitutions in file contents.'
    )


@dataclass(frozen=True)
class RepoEntry:
    """The list's top level; `packages` (a non-empty list of `PackageEntry`) is checked one
    package at a time, so that each message names its package."""

    schema: int = spec_field(minimum=1, help="Format version of the list (1).")
    host_doubles: tuple[FileEntry, ...] = spec_field((), help="Doubles put straight into hosts.")
    repo_dir_in_host: str = spec_field(
        "/srv/kvops-test-repo", pattern=ABSOLUTE_RE, pattern_is="an absolute path without '..'",
        help="Where hosts see the repository.",
    )  # fmt: skip
    apt_source: str = spec_field(
        "deb [trusted=yes] file:/srv/kvops-test-repo ./", help="The hosts' only apt source line."
    )


def _file_spec(where: str, entry: FileEntry) -> FileSpec:
    """The one rule the field metadata cannot say: exactly one kind of content per file."""
    kinds = [k for k in FILE_KINDS if getattr(entry, k) is not None]
    if len(kinds) != 1:
        raise PackageSpecError(f"{where} {entry.path}: give exactly one of {', '.join(FILE_KINDS)}")
    kind = kinds[0]
    mode = entry.mode or ("0755" if kind == "double" else "0644")
    return FileSpec(path=entry.path, kind=kind, source=getattr(entry, kind), mode=int(mode, 8))


def _package(entry: PackageEntry) -> PackageSpec:
    where = f"package {entry.name}"
    if len(set(entry.versions)) != len(entry.versions):
        raise PackageSpecError(f"{where}: a version is listed twice")
    files = tuple(_file_spec(where, f) for f in entry.files)
    paths = [f.path for f in files]
    if len(set(paths)) != len(paths):
        raise PackageSpecError(f"{where}: a path is listed twice")
    relations = {key: getattr(entry, key) for key in RELATIONS}
    return PackageSpec(
        entry.name, entry.versions, entry.description.strip(), files, relations,
        entry.postinst, entry.vars, entry.prerm,
    )  # fmt: skip


def _where(raw: Any, i: int) -> str:
    """How a package entry is named in messages before it is checked: by its name if any."""
    name = raw.get("name") if isinstance(raw, dict) else None
    return f"package {name}" if isinstance(name, str) else f"packages[{i}]"


def parse_spec(doc: Any) -> RepoSpec:
    """Validate the loaded YAML document (pure; raises :class:`PackageSpecError`)."""
    if not isinstance(doc, dict) or doc.get("schema") != 1:
        raise PackageSpecError("package list: expected a mapping with 'schema: 1'")
    raw_packages = doc.get("packages")
    if not isinstance(raw_packages, list) or not raw_packages:
        raise PackageSpecError("package list: 'packages' must be a non-empty list")
    try:
        # each package under its own name, so a message says which package is wrong
        entries = [
            PackageEntry(**load_strict(PackageEntry, raw, _where(raw, i)))
            for i, raw in enumerate(raw_packages)
        ]
        top = {k: v for k, v in doc.items() if k != "packages"}
        repo = RepoEntry(**load_strict(RepoEntry, top, "package list"))
    except ValueError as exc:
        raise PackageSpecError(str(exc)) from None
    seen: set[str] = set()
    for entry in entries:
        if entry.name in seen:
            raise PackageSpecError(f"package {entry.name}: listed twice")
        seen.add(entry.name)
    return RepoSpec(
        packages=tuple(_package(e) for e in entries),
        host_doubles=tuple(_file_spec("host_doubles", f) for f in repo.host_doubles),
        repo_dir_in_host=repo.repo_dir_in_host,
        apt_source=repo.apt_source,
    )


def package_list_reference() -> str:
    """The package list's keys, from the same field metadata that checks them."""
    return "\n".join(
        f"{title}:\n" + "\n".join("  " + line for line in reference(cls).splitlines())
        for title, cls in (
            ("package list (and packages: a non-empty list)", RepoEntry),
            ("each of packages", PackageEntry),
            ("each of files, host_doubles", FileEntry),
        )
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
    for name, double in (("postinst", pkg.postinst), ("prerm", pkg.prerm)):
        if double:
            script = tree / "DEBIAN" / name
            shutil.copyfile(sources.doubles / double, script)
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
