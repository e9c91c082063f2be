"""Child processes for the fault tests in test_faults.py (not a test module).

    python _fault_procs.py hold DB LOG ID LEASE
        run the three-step workflow "held" as instance ID on DB (engine lease
        LEASE s, poll 0.05 s); step s2 prints "in step 2" and blocks until a
        line (or EOF) arrives on stdin. memable's warnings are printed as
        "warning: MESSAGE" lines. Then print "run ended: STATE" when the run
        (or the run of whichever engine took the instance over) ends, and the
        instance's result as JSON once it is terminal.
    python _fault_procs.py at-pid P COMMAND ...
        (as pid 1 of a new PID namespace) fork until a child gets pid P, run
        COMMAND ... in that child, and exit with its exit code.

Every step body appends "STEP WHO" to LOG (O_APPEND: whole lines, from any
process), so the parent counts executions. Any exception exits non-zero.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from collections.abc import Callable

from _procs import log_line  # the one O_APPEND writer of both helpers

from memable import Context, Engine

STEPS = ("s1", "s2", "s3")


def held(log: str, who: str, gate: Callable[[], object]) -> Callable[[Context], str]:
    """Steps s1, s2, s3 each return WHO + their number; s2 calls ``gate`` after logging."""

    def body(step: str) -> str:
        log_line(log, f"{step} {who}")
        if step == "s2":
            gate()
        return f"{who}{step[1:]}"

    def workflow(ctx: Context) -> str:
        return "".join(ctx.step(step).run(body, step) for step in STEPS)

    return workflow


def stdin_gate() -> None:
    print("in step 2", flush=True)
    sys.stdin.readline()


class _StdoutWarnings(logging.Handler):
    """Print memable's warnings on stdout, one line each, for the parent to read."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"warning: {record.getMessage()}", flush=True)


def hold(db: str, log: str, instance_id: str, lease: str) -> None:
    handler = _StdoutWarnings(logging.WARNING)
    logging.getLogger("memable").addHandler(handler)
    engine = Engine.open(db, lease=float(lease), poll_interval=0.05)
    engine.register("held", held(log, "A", stdin_gate))
    with engine:
        inv = engine.invoke("held", instance_id=instance_id)
        print(f"run ended: {inv.wait(timeout=120)}", flush=True)
        print(json.dumps(inv.result(timeout=120)), flush=True)


def at_pid(target: int, args: list[str]) -> None:
    """Burn pids with short-lived children until one is ``target``; run ``args`` there.

    This process stays alive as the namespace's pid 1 (its death would kill
    the namespace) and passes the child's exit code on.
    """
    while True:
        pid = os.fork()
        if pid == 0:
            code = 0
            if os.getpid() == target:
                try:
                    main(*args)
                except BaseException:
                    traceback.print_exc()
                    code = 1
                sys.stdout.flush()
            os._exit(code)
        status = os.waitpid(pid, 0)[1]
        if pid == target:
            sys.exit(os.waitstatus_to_exitcode(status))
        if pid > target:
            sys.exit(f"pid {target} was skipped (got {pid})")


def main(command: str, *args: str) -> None:
    if command == "hold":
        hold(*args)
    elif command == "at-pid":
        at_pid(int(args[0]), list(args[1:]))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
