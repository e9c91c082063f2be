"""The documentation is executable: docstring and docs examples run as doctests."""

from __future__ import annotations

import doctest
import gc
import importlib
import inspect
import pkgutil
import re
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import postgres_or_skip

import memable

ROOT = Path(__file__).resolve().parent.parent
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
MODULES = ["memable"] + [
    info.name for info in pkgutil.walk_packages(memable.__path__, "memable.")
    if info.name != "memable.__main__"
]


def _docstring_tests() -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    found = []
    for name in MODULES:
        found.extend(t for t in finder.find(importlib.import_module(name)) if t.examples)
    return found


DOCSTRING_TESTS = _docstring_tests()
DOC_FILES = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts),
]


def _run(test: doctest.DocTest) -> None:
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    runner.run(test)
    test.globs.clear()
    # An example that leaves an engine open shows here (ResourceWarning), not in
    # whichever later test the garbage collector happens to run in.
    gc.collect()
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"


@pytest.mark.parametrize("test", DOCSTRING_TESTS, ids=[t.name for t in DOCSTRING_TESTS])
def test_docstring_examples_run(test: doctest.DocTest) -> None:
    """Every example in a docstring of the package runs and prints what it says."""
    _run(test)


@pytest.mark.parametrize("path", DOC_FILES, ids=[str(p.relative_to(ROOT)) for p in DOC_FILES])
def test_docs_examples_run(path: Path) -> None:
    """Every `>>>` example in README.md and docs/*.md runs and prints what it says.

    A page marked ``needs: postgres`` runs against the test server (skipped,
    saying why, when none answers; failed under CI).
    """
    text = path.read_text()
    if "<!-- needs: postgres" in text:
        postgres_or_skip()
    test = doctest.DocTestParser().get_doctest(text, {}, path.name, str(path), 0)
    _run(test)


def _public_members(obj: object) -> list[tuple[str, object]]:
    members = [(obj.__qualname__, obj)]  # type: ignore[attr-defined]
    if inspect.isclass(obj):
        for name, member in vars(obj).items():
            if name.startswith("_") or name in {"args", "with_traceback", "add_note"}:
                continue
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if isinstance(member, property) or inspect.isfunction(member):
                members.append((f"{obj.__qualname__}.{name}", member))
    return members


@pytest.mark.parametrize("name", memable.__all__)
def test_every_public_name_has_a_runnable_example(name: str) -> None:
    """Each name in __all__, and each public method or property on it, shows an example."""
    missing = [
        qualname
        for qualname, member in _public_members(getattr(memable, name))
        if ">>>" not in (inspect.getdoc(member) or "")
    ]
    assert missing == []


SPEC_ERRORS = {
    "NotStarted", "AlreadyStarted", "WorkflowNotFound", "InstanceNotFound",
    "InstanceFinished", "SignalRejected", "InvalidKey", "DuplicateStepKey", "StorageError",
    "SerializationError", "StepTimeout", "WorkflowFailed",
    # Part 2: waiting with a deadline, child workflows.
    "SignalTimeout", "ChildFailed",
}
SPEC_NAMES = SPEC_ERRORS | {
    "Engine", "EngineBuilder", "Context", "Invocation", "Retry", "StepError",
    "WorkflowState", "Started", "InProgress", "Suspended", "Completed", "Failed", "Cancelled",
    "WorkflowMetadata", "MetadataStatus", "StepRecord", "EngineError",
    # Part 2: queues.
    "Queued",
}


def test_all_holds_exactly_the_public_names_of_the_spec() -> None:
    """memable.__all__ is the SPEC's list of public names; its errors derive from EngineError."""
    assert set(memable.__all__) == SPEC_NAMES
    assert all(issubclass(getattr(memable, name), memable.EngineError) for name in SPEC_ERRORS)


def test_all_is_sorted_and_importable() -> None:
    """__all__ is sorted and names only what the package really exports."""
    assert memable.__all__ == sorted(memable.__all__)
    assert all(hasattr(memable, name) for name in memable.__all__)


def test_every_public_name_is_in_the_api_reference() -> None:
    """docs/api.md documents every name in __all__."""
    api = (ROOT / "docs" / "api.md").read_text()
    documented = set(re.findall(r"\.\. auto\w+:: memable\.(\w+)", api))
    assert sorted(set(memable.__all__) - documented) == []


def test_version_matches_the_installed_distribution() -> None:
    """memable.__version__ is the version pip installed."""
    assert memable.__version__ == version("memable-engine")


def test_package_ships_py_typed() -> None:
    """The installed package carries py.typed, so type checkers use its hints."""
    assert (Path(memable.__file__).parent / "py.typed").is_file()


def test_every_test_the_guarantees_page_cites_exists() -> None:
    """Each test named on docs/guarantees.md is a test function in tests/."""
    cited = set(re.findall(r"`(test_\w+)`", (ROOT / "docs" / "guarantees.md").read_text()))
    defined = {
        name
        for path in (ROOT / "tests").glob("test_*.py")
        for name in re.findall(r"^def (test_\w+)", path.read_text(), re.M)
    }
    assert cited
    assert sorted(cited - defined) == []


def test_every_test_the_guarantees_page_names_exists() -> None:
    """Each test name docs/guarantees.md cites is defined in tests/: the page shows real proof."""
    cited = set(re.findall(r"`(test_\w+)`", (ROOT / "docs" / "guarantees.md").read_text()))
    defined = {
        name
        for path in (ROOT / "tests").glob("test_*.py")
        for name in re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.M)
    }
    assert sorted(cited - defined) == []
