"""Targets: what a string given to ``Engine.open`` and to the command line names.

A path or a ``postgresql://`` URL, as ever; ``sqlite:///relative``,
``sqlite:////absolute`` and ``sqlite://`` (memory) as SQLAlchemy and DBOS spell
SQLite; any other scheme refused with ``StorageError`` (the command line: exit 2,
the same text), creating nothing and naming no password.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import cli

from memable import Context, Engine, StorageError
from memable._engine.targets import ACCEPTED


def double(ctx: Context, n: int) -> int:
    return ctx.step("double:v1").run(lambda: n * 2)


def run_one(engine: Engine, instance_id: str) -> int:
    """Register ``double`` on ``engine``, run one instance to its end; its result."""
    engine.register("double", double)
    with engine:
        result: int = engine.invoke("double", 21, instance_id=instance_id).result(timeout=10)
    return result


def test_sqlite_urls_name_the_file_they_spell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sqlite:///rel opens rel in the working directory and sqlite:////abs the absolute
    path; the command line reads the same files by the same URLs, and by their paths."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "var").mkdir()
    absolute = tmp_path / "abs.db"
    assert run_one(Engine.open("sqlite:///var/rel.db"), "r-1") == 42
    assert run_one(Engine.open(f"sqlite:///{absolute}"), "a-1") == 42
    assert sorted(p.name for p in tmp_path.iterdir()) == ["abs.db", "var"]
    assert (tmp_path / "var" / "rel.db").is_file()
    for target, instance_id in [
        ("sqlite:///var/rel.db", "r-1"), ("var/rel.db", "r-1"),
        (f"sqlite:///{absolute}", "a-1"), (str(absolute), "a-1"),
    ]:
        listed = cli("list", target)
        assert listed.exit_code == 0, listed.stderr
        assert f"double    {instance_id}" in listed.stdout


def test_sqlite_memory_url_opens_a_store_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sqlite:// is a store in memory: the engine runs and no file appears; the command
    line, which cannot see it, refuses it with exit 2."""
    monkeypatch.chdir(tmp_path)
    assert run_one(Engine.open("sqlite://"), "m-1") == 42
    assert list(tmp_path.iterdir()) == []
    refused = cli("list", "sqlite://")
    assert refused.exit_code == 2
    assert "is a store in memory" in refused.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("target", "names"), [
    ("sqlite:x.db", "'sqlite:x.db' is not a SQLite URL memable reads"),
    ("sqlite://host/x.db", "'sqlite://host/x.db' is not a SQLite URL memable reads"),
    ("postgresq://app:s3cret@db.example/app",
     f"'postgresq:' is not a store memable opens: a store is {ACCEPTED}; "
     "did you mean 'postgresql:'?"),
    ("mysql://app:s3cret@db.example/app",
     f"'mysql:' is not a store memable opens: a store is {ACCEPTED}"),
    ("run-10:00.db", f"'run-10:' is not a store memable opens: a store is {ACCEPTED} "
     "(a file whose name has ':' in it: write ./ before it)"),
], ids=["sqlite-no-slashes", "sqlite-host", "postgres-typo", "mysql", "colon-in-name"])
def test_another_scheme_is_refused_creating_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, names: str
) -> None:
    """A scheme memable does not open raises StorageError at Engine.open (and the
    builder) naming the accepted forms and never the password; the command line exits 2
    with the same text; no file is made, and the engine would have made one."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageError) as raised:
        Engine.open(target)
    message = str(raised.value)
    assert message.startswith(names)
    assert "s3cret" not in message
    with pytest.raises(StorageError) as built:
        Engine.builder().open(target).build()
    assert str(built.value) == message
    for args in (["list", target], ["demo", "--db", target]):
        result = cli(*args)
        assert (result.exit_code, result.stdout) == (2, "")
        assert result.stderr == f"memable: error: {message}\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["./run-10:00.db", "data/a:b.db", "C:x.db"])
def test_a_colon_after_a_path_or_a_drive_letter_is_a_file_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """A ':' after a '/' or a single letter is no scheme: the file of that name is the
    store, and the command line reads it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    assert run_one(Engine.open(name), "f-1") == 42
    assert (tmp_path / os.path.normpath(name)).is_file()
    listed = cli("list", name)
    assert listed.exit_code == 0, listed.stderr
    assert "double    f-1" in listed.stdout
