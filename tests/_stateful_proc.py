"""The workflow of tests/test_stateful.py, and the child process it SIGKILLs (not a test module).

    python _stateful_proc.py DB LOG DELAY LEASE OP...

opens DB, registers the workflow, starts, prints "ready", then runs each OP
(``invoke:ID:N``, ``resume:ID``, ``signal:ID:KEY:PAYLOAD``) printing ``ok OP``
or ``err OP ErrorName`` once it returned, prints "done" and waits to be
killed. Every step body appends ``ID KEY start WHO`` and ``ID KEY end WHO``
to LOG (O_APPEND: whole lines from any process; WHO is pid.thread), so the
parent counts executions and sees overlapping runs.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from memable import Context, Engine

#: Where step bodies log, and how long each sleeps: set by configure().
LOG = ""
DELAY = 0.0


def configure(log: str, delay: float) -> None:
    global LOG, DELAY
    LOG, DELAY = log, delay


def log_line(line: str) -> None:
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def read_log(path: str) -> list[list[str]]:
    """The log's lines split into [id, key, start|end, who]; a torn last line is dropped."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return []
    return [line.split() for line in text.splitlines() if len(line.split()) == 4]


def body(instance_id: str, key: str, fail_first: bool = False) -> str:
    """A step body: logs start, sleeps DELAY, logs end; optionally fails its first execution."""
    first = fail_first and not any(
        r[:3] == [instance_id, key, "start"] for r in read_log(LOG)
    )
    who = f"{os.getpid()}.{threading.get_ident()}"
    log_line(f"{instance_id} {key} start {who}")
    time.sleep(DELAY)
    log_line(f"{instance_id} {key} end {who}")
    if first:
        raise RuntimeError(f"first execution of {key} fails")
    return key


def workflow(ctx: Context, n: int) -> int:
    """a; suspend "go" (payload p); b; zero timer t; c (fails once when n is odd) -> n*1000+p."""
    ctx.step("a").run(body, ctx.instance_id, "a")
    payload = ctx.suspend("go", returns=int)
    ctx.step("b").run(body, ctx.instance_id, "b")
    ctx.timer("t", 0)
    ctx.step("c").run(body, ctx.instance_id, "c", n % 2 == 1)
    return n * 1000 + payload


def main(db: str, log: str, delay: str, lease: str, *ops: str) -> None:
    configure(log, float(delay))
    engine = Engine.open(db, lease=float(lease), poll_interval=0.05)
    engine.register("wf", workflow)
    engine.start()
    print("ready", flush=True)
    for op in ops:
        verb, instance_id, *rest = op.split(":")
        try:
            if verb == "invoke":
                engine.invoke("wf", int(rest[0]), instance_id=instance_id)
            elif verb == "resume":
                engine.resume("wf", instance_id)
            else:
                engine.signal("wf", instance_id, rest[0], int(rest[1]))
        except Exception as exc:
            print(f"err {op} {type(exc).__name__}", flush=True)
        else:
            print(f"ok {op}", flush=True)
    print("done", flush=True)
    threading.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    main(*sys.argv[1:])
