"""docs/howto/tracing.md shows what its code does.

Its example, ``trace_order.py``, sets the global OpenTelemetry providers, as an
application does; a provider can be set once per process, so the example runs in
a process of its own (the rest of the suite runs with none set), and prints
exactly what the page says it prints. The page's configuration blocks send to
an OTLP collector, so they are compiled, not run. Its tables name the spans'
attributes and the instruments the engine makes.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "howto" / "tracing.md"
OTEL = ROOT / "memable" / "_observe" / "otel.py"
EXAMPLE = "trace_order.py"


def python_blocks() -> list[str]:
    """The code of each ```python block of the page, in order."""
    return re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(), re.M | re.S)


def example_and_output() -> tuple[str, str]:
    """The page's ``# trace_order.py`` block, and the ```text block that follows it."""
    found = re.search(
        rf"^```python\n(# {re.escape(EXAMPLE)}\n.*?)^```$.*?^```text\n(.*?)^```$",
        PAGE.read_text(), re.M | re.S,
    )
    assert found is not None, f"no {EXAMPLE} block followed by its output on {PAGE.name}"
    return found.group(1), found.group(2)


def test_the_tracing_example_prints_what_the_page_shows(tmp_path: Path) -> None:
    """The tracing guide's ``trace_order.py``, run in a process of its own, exits cleanly with
    nothing on stderr and prints exactly the output the page shows after it."""
    code, shown = example_and_output()
    (tmp_path / EXAMPLE).write_text(code)
    run = subprocess.run(
        [sys.executable, EXAMPLE], cwd=tmp_path, capture_output=True, text=True,
        timeout=120, check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    assert run.stdout == shown


def test_the_tracing_page_configuration_blocks_compile() -> None:
    """Each of the tracing guide's python blocks (at least five) compiles; they send to a
    collector, so they are not run."""
    blocks = python_blocks()
    assert len(blocks) >= 5
    for number, code in enumerate(blocks, 1):
        compile(code, f"{PAGE.name}, python block {number}", "exec")


def test_the_tracing_page_names_every_attribute_and_instrument_the_engine_makes() -> None:
    """The ``memable.*`` names in the page's tables are those of the engine's spans and
    instruments, no more and no fewer."""
    made = set(re.findall(r'"(memable\.[a-z_.]+)"', OTEL.read_text()))
    table_rows = [line for line in PAGE.read_text().splitlines() if line.startswith("| `")]
    tabled = {name for row in table_rows for name in re.findall(r"`(memable\.[a-z_.]+)`", row)}
    assert made
    assert sorted(tabled) == sorted(made)
