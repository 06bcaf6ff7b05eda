"""No import cycle anywhere in Laminar's packages, type-checking imports included."""

from __future__ import annotations

import grimp

PACKAGES = (
    "laminar_cli",
    "laminar_sim",
    "laminar_bench",
    "laminar_zone",
    "laminar_agent",
    "laminar_airlock",
    "laminar_base",
)


def cycles(graph: grimp.ImportGraph) -> set[tuple[str, str]]:
    """Pairs of modules where each reaches the other (one direct edge closes the loop)."""
    found: set[tuple[str, str]] = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if imported != module and graph.chain_exists(importer=imported, imported=module):
                found.add((min(module, imported), max(module, imported)))
    return found


def test_no_module_imports_itself_through_another() -> None:
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False)
    assert len(graph.modules) > 80  # the packages were read
    assert cycles(graph) == set()


def test_a_cycle_is_seen_when_there_is_one() -> None:
    graph = grimp.ImportGraph()
    for name in ("p.a", "p.b", "p.c"):
        graph.add_module(name)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    assert cycles(graph) == set()
    graph.add_import(importer="p.c", imported="p.a")
    assert cycles(graph) == {("p.a", "p.b"), ("p.b", "p.c"), ("p.a", "p.c")}
