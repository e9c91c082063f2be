"""The package's shape: no import cycles, one Engine class.

Size is a smell, never a reason to split (STYLE.md): no line-count rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import memable
from memable import Engine

PACKAGE = Path(memable.__file__).parent


def _runtime_imports(path: Path) -> set[str]:
    """The memable modules ``path`` imports when it runs (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("memable."):
            found.add(node.module.split(".")[1])  # type: ignore[union-attr]
    return found


def _graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    return {
        p.stem: {m for m in _runtime_imports(p) if m in modules and m != p.stem}
        for p in PACKAGE.glob("*.py")
    }


def test_no_module_imports_itself_back() -> None:
    """The import graph among memable's modules has no cycle (TYPE_CHECKING imports aside)."""
    graph = _graph()
    cycles: list[list[str]] = []
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_cycle_check_sees_a_cycle() -> None:
    """The checker itself: the engine imports the runner, which imports the context."""
    graph = _graph()
    assert "_runner" in graph["_engine"]
    assert "_context" in graph["_runner"]


def test_engine_is_one_class() -> None:
    """Engine inherits from nothing but object: its parts are objects it holds, not mixins."""
    assert Engine.__mro__ == (Engine, object)
