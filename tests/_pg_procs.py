"""A child engine process on a PostgreSQL schema, for tests/test_postgres_faults.py.

    _pg_procs.py URL SCHEMA LOG NAME NEIGHBOUR N

Runs the workflow "job" (a step, a short timer, a signal, a step) for the N
instances NAME-0 .. NAME-(N-1), invoking those not stored yet; signals
"go" to each instance of NEIGHBOUR once told to (a line on stdin); then
prints the outputs of its own instances as JSON. Each step body appends
"instance key" to LOG. Run again after a SIGKILL, it takes over what the
killed one left: recovery, and the signals not yet sent.
"""

from __future__ import annotations

import json
import sys
from contextlib import suppress

from _procs import log_line  # the one O_APPEND writer of the helpers

from memable import Context, Engine, InstanceFinished, SignalRejected


def job(log: str) -> object:
    def workflow(ctx: Context, n: int) -> str:
        ctx.step("s1").run(lambda: log_line(log, f"{ctx.instance_id} s1"))
        ctx.timer("t", 0.2)
        payload = ctx.suspend("go")
        ctx.step("s2").run(lambda: log_line(log, f"{ctx.instance_id} s2"))
        return f"{n}:{payload}"

    return workflow


def main(url: str, schema: str, log: str, name: str, neighbour: str, count: str) -> None:
    n = int(count)
    engine = Engine.open(url, schema=schema, poll_interval=0.1, lease=2.0)
    engine.register("job", job(log))  # type: ignore[arg-type]
    with engine:
        for i in range(n):
            if engine.get_metadata("job", f"{name}-{i}") is None:
                engine.invoke("job", i, instance_id=f"{name}-{i}")
        print("invoked", flush=True)
        sys.stdin.readline()  # the test says go once every process has invoked its own
        pending = [f"{neighbour}-{i}" for i in range(n)]
        for instance_id in pending:  # the neighbour has stored them all by now
            # Sent already (and maybe run to its end) by the process this one replaces.
            with suppress(SignalRejected, InstanceFinished):
                engine.signal("job", instance_id, "go", f"from {name}")
        outputs = [engine.invocation("job", f"{name}-{i}").result(timeout=120) for i in range(n)]
    print(json.dumps(outputs), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
