"""The ``memable`` command line (also ``python -m memable``)."""

from __future__ import annotations

import click

from ._demo import run_demo


@click.group()
@click.version_option(package_name="memable-engine")
def main() -> None:
    """memable: durable execution for plain synchronous Python."""


@main.command()
@click.option(
    "--db",
    "path",
    default="memable-demo.db",
    show_default=True,
    help="Store to run the demo on (created if missing).",
)
def demo(path: str) -> None:
    """Run a workflow whose second step fails once, then resume it."""
    raise SystemExit(run_demo(path, click.echo))
