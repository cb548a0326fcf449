"""The checkout is the kvops.gds collection: what keeps it so without building it.

Ansible looks a bare filter name up only among ansible.builtin and the legacy plugin paths,
never in the calling role's collection (ansible-core's Jinja plugin lookup; the `collections`
keyword "does not apply to Jinja2 plugins":
https://docs.ansible.com/ansible/latest/collections_guide/collections_using_playbooks.html), so a
role that works from the checkout with a bare name fails once installed. The roles call their
filters by FQCN, and the checkout resolves those names to itself through
`.collections/ansible_collections/kvops/gds` (a link to the checkout, first on ansible.cfg's
collections_path).
"""

from __future__ import annotations

import configparser
import re
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
# top-level entries that are the collection (everything else is build_ignore'd)
COLLECTION_TOP = {
    "README.md", "changelogs", "galaxy.yml", "meta", "playbooks", "plugins", "requirements.yml",
    "roles",
}  # fmt: skip


def _role_filters() -> set[str]:
    names: set[str] = set()
    for path in REPO.glob("roles/*/filter_plugins/*.py"):
        body = path.read_text().split("def filters(self)", 1)[1]
        names |= set(re.findall(r'"([a-z_]+)":', body))
    return names


def test_roles_call_their_filters_by_fqcn_only() -> None:
    names = _role_filters()
    assert {"cufile_typed", "normalize_fingerprint", "lmcache_type_errors"} <= names
    bare = re.compile(r"\|\s*(" + "|".join(sorted(names)) + r")\b")
    fqcn_uses = 0
    for path in [
        *REPO.glob("roles/**/*.yml"),
        *REPO.glob("roles/**/*.j2"),
        *REPO.glob("playbooks/*.yml"),
    ]:
        text = path.read_text()
        assert not bare.search(text), f"{path.relative_to(REPO)}: {bare.search(text)}"
        fqcn_uses += len(re.findall(r"\|\s*kvops\.gds\.(?:" + "|".join(names) + r")\b", text))
    assert fqcn_uses >= len(names) - 1  # lmcache_known_keys is only called by the other filters
    links = {p.name for p in (REPO / "plugins" / "filter").glob("*.py")}
    assert links == {p.name for p in REPO.glob("roles/*/filter_plugins/*.py")}


def test_the_checkout_resolves_kvops_gds_to_itself() -> None:
    link = REPO / ".collections" / "ansible_collections" / "kvops" / "gds"
    assert link.is_symlink() and link.resolve() == REPO
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "ansible.cfg")
    assert cfg["defaults"]["collections_path"].split(":")[0] == ".collections"
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    assert (galaxy["namespace"], galaxy["name"]) == ("kvops", "gds")


def test_build_ignore_leaves_out_every_tracked_top_level_entry_but_the_collection() -> None:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    top = {path.split("/", 1)[0] for path in tracked}
    ignored = set(yaml.safe_load((REPO / "galaxy.yml").read_text())["build_ignore"])
    assert top >= COLLECTION_TOP
    # kvops/ is ignored piecewise, see integration/test_collection_build.py
    assert top - COLLECTION_TOP - {"kvops"} <= ignored, top - COLLECTION_TOP - ignored
    assert not (COLLECTION_TOP & ignored)


def _pyproject() -> dict[str, object]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_one_ansible_core_range_is_declared_everywhere_and_the_installed_core_is_in_it() -> None:
    """pyproject (what pip installs), meta/runtime.yml (what ansible-galaxy checks) and every
    role's min_ansible_version name the same supported range; kvops depends on ansible-core, not
    on the ``ansible`` bundle (only the ``collections`` extra carries it), and the ansible-core
    this suite runs is inside the range."""
    from importlib.metadata import version

    from packaging.specifiers import SpecifierSet

    project = _pyproject()["project"]
    assert isinstance(project, dict)
    deps = project["dependencies"]
    core = [d for d in deps if re.match(r"ansible-core\b", d)]
    assert len(core) == 1
    assert not [d for d in deps if re.match(r"ansible\s*[<>=~!]", d)], "no bundle at runtime"
    declared = SpecifierSet(core[0].removeprefix("ansible-core"))
    runtime = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())
    assert SpecifierSet(runtime["requires_ansible"]) == SpecifierSet(
        ",".join(f"{s.operator}{s.version}.0" for s in declared)
    )
    floor = min(s.version for s in declared if s.operator == ">=")
    for meta in sorted(REPO.glob("roles/*/meta/main.yml")):
        galaxy_info = yaml.safe_load(meta.read_text())["galaxy_info"]
        assert str(galaxy_info["min_ansible_version"]) == floor, meta
    assert version("ansible-core") in declared
    collections_extra = project["optional-dependencies"]["collections"]
    assert [d for d in collections_extra if d.startswith("ansible>=")]
