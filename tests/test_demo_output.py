"""What `python -m memable demo` prints: its narration on stdout, one log line on stderr."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

from memable._cli.demo import run_demo


def test_the_demo_logs_its_failure_in_one_line_without_a_traceback(tmp_path: Path) -> None:
    """The step that fails on purpose is logged (a WARNING of the `memable` logger)
    as one line on stderr, not as the traceback Python's last-resort handler prints."""
    demo = subprocess.run(
        [sys.executable, "-m", "memable", "demo", "--db", str(tmp_path / "demo.db")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert demo.stdout.rstrip().endswith("the demo went as it should")
    assert "Traceback" not in demo.stderr
    [line] = demo.stderr.splitlines()
    assert re.fullmatch(
        r"  log: WARNING memable: checkout/\S+ \[charge:v1\]: failed: step 'charge:v1' "
        r"failed: ConnectionError: payment gateway timed out \(traceback left out\)",
        line,
    ), line


def test_the_demo_leaves_the_memable_logger_as_it_found_it(tmp_path: Path) -> None:
    """Run in-process, where handlers exist (pytest's), the demo adds none and keeps none."""
    logger = logging.getLogger("memable")
    before = (list(logger.handlers), logger.level, logger.propagate)
    lines: list[str] = []
    assert run_demo(tmp_path / "demo.db", lines.append) == 0
    assert (list(logger.handlers), logger.level, logger.propagate) == before
    assert lines[-1] == "the demo went as it should"
