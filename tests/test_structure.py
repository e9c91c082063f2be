"""The package's shape: layers that import only downwards, no import cycle, drivers
imported by their store alone, and classes that are one class each.

Size is a smell, never a reason to split (STYLE.md): no line-count rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import memable
from memable._engine.engine import Engine
from memable._postgres.store import PostgresStore
from memable._sqlite.store import SQLiteStore

PACKAGE = Path(memable.__file__).parent

#: Each part of memable and its layer: a module imports its own package, and the
#: packages of lower layers; the value modules (layer 0) also import each other.
#: The face (``memable``, ``memable.__main__``, ``memable.testing``) is on top; the
#: pytest plugin's fixtures, and the engine a test runs with its leak check, under it.
LAYERS = {
    "_errors": 0, "_states": 0, "_records": 0, "_retry": 0, "_step_error": 0,
    "_clock": 0, "_log": 0, "_validate": 0, "_queues": 0,
    "_observe": 1,
    "_store": 2,
    "_sqlite": 3, "_postgres": 3, "_background": 3,
    "_run": 4,
    "_schedules": 5,
    "_engine": 6,
    "_inspect": 7, "_running": 7,
    "web": 8,
    "_cli": 9, "_pytest_plugin": 9,
    "__init__": 10, "__main__": 10, "testing": 10,
}
#: The database drivers, and the one package that may import each.
DRIVERS = {"sqlite3": "_sqlite", "sqlite_utils": "_sqlite", "psycopg": "_postgres",
           "psycopg_pool": "_postgres", "opentelemetry": "_observe",
           # The dashboard's extra: only the dashboard imports it.
           "werkzeug": "web", "jinja2": "web", "markupsafe": "web"}


def _modules() -> dict[str, Path]:
    """memable's modules by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, modules: set[str]) -> set[str]:
    """Every module ``name`` imports, TYPE_CHECKING imports included: memable's by dotted
    name, others by their top-level name."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            # ``from . import x``: x may be a module of the package (then only x counts).
            submodules = {f"{module}.{alias.name}" for alias in node.names} & modules
            found.update(submodules or {module})
    return {m if m.startswith("memable") else m.split(".")[0] for m in found} - {name}


def graph() -> dict[str, set[str]]:
    """Who imports whom: memable's modules, and the outside modules each imports."""
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def part(module: str) -> str:
    """The part of memable a module belongs to: ``memable._run.context`` -> ``_run``."""
    return "__init__" if module == "memable" else module.split(".")[1]


def layering_faults(imports: dict[str, set[str]]) -> list[str]:
    """Each import that goes up a layer or sideways, or names a driver outside its store."""
    faults = []
    for module, names in sorted(imports.items()):
        here = part(module)
        for name in sorted(names):
            if name.startswith("memable"):
                there = part(name)
                if there == here or LAYERS[there] < LAYERS[here]:
                    continue
                if LAYERS[there] == LAYERS[here] == 0:
                    continue
                faults.append(f"{module} imports {name} (layer {LAYERS[here]} -> "
                              f"{LAYERS[there]})")
            elif name in DRIVERS and DRIVERS[name] != here:
                faults.append(f"{module} imports the driver {name}")
    return faults


def cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first walk of the memable import graph runs into."""
    edges = {m: {n for n in names if n in imports} for m, names in imports.items()}
    found: list[list[str]] = []
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                found.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    return found


def test_every_module_belongs_to_a_layer() -> None:
    """A new package or value module gets its place in LAYERS (or this fails)."""
    assert {part(m) for m in graph()} <= set(LAYERS)


def test_no_import_goes_up_or_sideways() -> None:
    """A package imports only from lower layers; only the stores import their drivers."""
    assert layering_faults(graph()) == []


def test_no_import_cycle_even_for_type_checking() -> None:
    """No module of memable imports itself back through others, counting the imports made only
    for type checking."""
    assert cycles(graph()) == []


@pytest.mark.parametrize(
    ("imports", "fault"),
    [
        ({"memable._store.protocol": {"memable._run.runner"}},
         "memable._store.protocol imports memable._run.runner (layer 2 -> 4)"),
        ({"memable._sqlite.store": {"memable._postgres.transaction"}},
         "memable._sqlite.store imports memable._postgres.transaction (layer 3 -> 3)"),
        ({"memable._run.context": {"sqlite3"}}, "memable._run.context imports the driver sqlite3"),
        ({"memable._inspect": {"psycopg"}}, "memable._inspect imports the driver psycopg"),
        ({"memable._postgres.store": {"sqlite_utils"}},
         "memable._postgres.store imports the driver sqlite_utils"),
    ],
)
def test_the_layering_check_sees_each_kind_of_fault(
    imports: dict[str, set[str]], fault: str
) -> None:
    """The layering check reports an import up a layer, one sideways between two stores, and a
    driver (sqlite3, psycopg, sqlite_utils) imported outside its store, each in its own
    words."""
    assert layering_faults(imports) == [fault]


def test_the_checks_see_the_real_imports() -> None:
    """The reader finds relative, package and TYPE_CHECKING imports, and the cycle walk
    finds a cycle through them."""
    imports = graph()
    assert "memable._run.runner" in imports["memable._engine.engine"]
    assert "memable._store.protocol" in imports["memable._run.context"]
    assert "sqlite3" in imports["memable._sqlite.store"]
    assert "psycopg" in imports["memable._postgres.connections"]
    looped = {**imports, "memable._store.protocol": {"memable._engine.engine"}}
    assert any("memable._store.protocol" in cycle for cycle in cycles(looped))


def test_every_package_says_its_job() -> None:
    """Each package's ``__init__`` has a docstring: its one job, and what it may import."""
    for path in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc, f"{path} has no docstring"


def test_engine_is_one_class() -> None:
    """Engine inherits from nothing but object: its parts are objects it holds, not mixins."""
    assert Engine.__mro__ == (Engine, object)


@pytest.mark.parametrize("store", [SQLiteStore, PostgresStore])
def test_a_store_is_one_class(store: type) -> None:
    """A store class takes no base from its own package (no mixin cut out to shorten a
    file): its parts are objects it holds."""
    own = store.__module__.rpartition(".")[0]
    assert [c for c in store.__mro__[1:] if c.__module__.startswith(own)] == []


def _operations(protocol: type) -> set[str]:
    """The operations a store protocol declares itself (not those of its bases)."""
    return {name for name in vars(protocol) if not name.startswith("_")}


def test_the_store_protocol_is_a_run_half_and_an_operator_half() -> None:
    """``Store`` is ``RunStore`` and ``OperatorStore`` and nothing more; the halves share
    only ``close``; and both stores have every operation of both."""
    from memable._store.operator import OperatorStore
    from memable._store.protocol import RunStore, Store

    run, operator = _operations(RunStore), _operations(OperatorStore)
    assert run & operator == {"close"}
    assert _operations(Store) == set()
    assert {"begin_run", "save_step", "suspend", "finish"} <= run
    assert {"list_view", "inspect", "instance_page", "purge_batch"} <= operator
    for store in (SQLiteStore, PostgresStore):
        assert [name for name in sorted(run | operator) if not hasattr(store, name)] == []
