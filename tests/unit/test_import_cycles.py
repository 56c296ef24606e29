"""No import circle in provision/, counting the imports made only for type checking: a circle
says two modules are one room split in two (lint-imports' layers leave those imports out)."""

from __future__ import annotations

import grimp


def import_circles(package: str) -> list[list[str]]:
    """Every group of modules that import each other, directly or not (Tarjan's strongly
    connected components of the import graph, type-checking imports included)."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=False)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in graph.modules:
                continue
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return circles


def test_provision_has_no_import_circle() -> None:
    assert import_circles("provision") == []


def test_the_check_finds_a_planted_circle(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    package = tmp_path / "planted"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import planted.b\n"
    )
    (package / "b.py").write_text("import planted.a\n")
    (package / "c.py").write_text("import planted.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_circles("planted") == [["planted.a", "planted.b"]]
