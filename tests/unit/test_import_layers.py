"""No kvops subpackage imports another that imports it back (DESIGN.md: one direction of flow).

Read from the source with `ast`, every import counts, including those inside functions and
under TYPE_CHECKING: a cycle there is still two parts that cannot be understood apart.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import kvops

ROOT = Path(kvops.__file__).parent


def _part(module: str) -> str:
    """The unit of layering: `kvops.loadgen.runner` → `kvops.loadgen`; `kvops.errors` itself."""
    return ".".join(module.split(".")[:2])


def _imports(path: Path) -> Iterator[str]:
    parts = ("kvops", *path.relative_to(ROOT).with_suffix("").parts)
    package = parts[:-1]  # of a module, and of a package's __init__ alike
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            yield ".".join([*base, *([node.module] if node.module else [])])


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        module = ".".join(("kvops", *path.relative_to(ROOT).with_suffix("").parts))
        source = _part(module)
        for target in _imports(path):
            if target.startswith("kvops.") and _part(target) != source:
                graph.setdefault(source, set()).add(_part(target))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_between_kvops_parts() -> None:
    graph = import_graph()
    assert graph["kvops.loadgen"] >= {"kvops.workload"}  # the graph is really read
    assert cycles(graph) == [], "these kvops parts import each other: " + str(cycles(graph))


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"kvops.a": {"kvops.b"}, "kvops.b": {"kvops.c"}, "kvops.c": {"kvops.a"}}
    graph["kvops.d"] = {"kvops.a"}
    assert cycles(graph) == [["kvops.a", "kvops.b", "kvops.c"]]


def test_workload_knows_no_http() -> None:
    """vLLM's split: datasets produce plain sample requests; the client builds the wire request."""
    assert "kvops.loadgen" not in import_graph().get("kvops.workload", set())


def test_the_top_level_is_packages_per_path_and_the_ground_floor() -> None:
    """`ls kvops/` reads as the design's picture: a package per path; loose modules only for
    what everything stands on (errors, the spec loader, the evidence document)."""
    loose = sorted(p.name for p in ROOT.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "errors.py", "evidence.py", "schema.py"]
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert {"remote", "validate", "smoke", "abtest", "workload", "loadgen"} <= packages


def _module_imports(module: str) -> set[str]:
    path = ROOT.joinpath(*module.split(".")[1:]).with_suffix(".py")
    return set(_imports(path))


def test_the_metrics_read_the_request_record_without_the_client() -> None:
    """The record sits below both sides: the load generator writes it, the metrics read it."""
    assert "kvops.workload.record" in _module_imports("kvops.abtest.metrics")
    assert not any(m.startswith("kvops.loadgen") for m in _module_imports("kvops.abtest.metrics"))
    assert "kvops.workload.record" in _module_imports("kvops.loadgen.client")


def test_renderers_and_smoke_do_not_reach_into_validate() -> None:
    """A fleet's findings live beside the findings (`kvops.checks.fleet`): rendering them or
    filling them from smoke needs no judge."""
    graph = import_graph()
    assert "kvops.validate" not in graph.get("kvops.report", set())
    assert "kvops.validate" not in graph.get("kvops.smoke", set())
    assert "kvops.report" not in graph.get("kvops.abtest", set())
