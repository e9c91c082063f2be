"""Child processes for the crash and several-process tests (not a test module).

    python _procs.py crash   DB LOG K       run a 10-step workflow; hang in step K
    python _procs.py recover DB LOG         start an engine on DB; finish the crashed one
    python _procs.py many    DB LOG N       invoke N instances of a 3-step + timer workflow
    python _procs.py wait    DB LOG         invoke a workflow parked on a signal; await it
    python _procs.py signal  DB ID [wf]     signal that instance (registering it with "wf")
    python _procs.py open    -              open (and close) each path read from stdin
    python _procs.py family  DB LOG         a parent starts a child; hang once it is started
    python _procs.py queued  DB LOG K       run ten/crash through the queue "q"; hang in step K

Every step body appends one line to LOG (O_APPEND: whole lines, from any
process), so the parent counts executions. Any exception exits non-zero.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from datetime import timedelta

from memable import Context, Engine
from memable._store.protocol import Store


def log_line(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{line}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def ten_steps(log: str, hang_at: int) -> object:
    def body(i: int) -> int:
        log_line(log, f"s{i}")
        if i == hang_at:
            print(f"in step {i}", flush=True)
            threading.Event().wait()  # until SIGKILL
        return i

    def workflow(ctx: Context) -> int:
        return sum(ctx.step(f"s{i}").run(body, i) for i in range(1, 11))

    return workflow


def three_steps(log: str) -> object:
    def body(instance_id: str, step: str) -> str:
        log_line(log, f"{instance_id} {step}")
        return step

    def workflow(ctx: Context) -> str:
        a = ctx.step("a").run(body, ctx.instance_id, "a")
        b = ctx.step("b").run(body, ctx.instance_id, "b")
        ctx.timer("pause", timedelta(0))
        c = ctx.step("c").run(body, ctx.instance_id, "c")
        return a + b + c

    return workflow


def awaits_signal(log: str) -> object:
    def workflow(ctx: Context) -> str:
        payload = ctx.suspend("go:v1")
        return ctx.step("after").run(lambda: log_line(log, f"after {payload}") or payload)

    return workflow


def family(engine: Engine, log: str, hold: Store | None) -> None:
    """Register "parent" (one child, "child", under the key "kid") on ``engine``.

    With ``hold`` (the store the engine runs on), the parent's run hangs right
    after the transaction that created the child committed, and the child's run
    before its step: the state a SIGKILL at that moment leaves.
    """
    def child(ctx: Context, n: int) -> int:
        if hold:
            threading.Event().wait()  # until SIGKILL
        return ctx.step("work").run(lambda: log_line(log, f"work {n}") or n * 10)

    def parent(ctx: Context) -> int:
        return int(ctx.child("kid", "child", 4)) + 1

    engine.register("child", child)
    engine.register("parent", parent)
    if hold is not None:
        start = hold.start_children

        def started(*args: object) -> object:
            created = start(*args)  # type: ignore[arg-type]
            print("children started", flush=True)
            threading.Event().wait()  # until SIGKILL
            return created

        hold.start_children = started  # type: ignore[method-assign]


def open_each_line() -> None:
    """Open every path read from stdin, answering "ok" or why it was refused."""
    for line in sys.stdin:
        try:
            Engine.open(line.strip()).close()
        except Exception as exc:
            print(f"refused: {exc}", flush=True)
        else:
            print("ok", flush=True)


def main(command: str, db: str, *args: str) -> None:
    if command == "open":
        return open_each_line()
    # A PostgreSQL URL's schema comes from the environment (the test's own schema).
    schema = os.environ.get("MEMABLE_PROC_SCHEMA") if db.startswith("postgresql") else None
    if command == "family":  # its hold hooks the store: the engine is built holding it
        from helpers import build

        engine, store = build(db, poll_interval=0.05, lease=3.0, schema=schema)
        family(engine, args[0], hold=store)
        engine.start()
        engine.invoke("parent", instance_id="p")
        threading.Event().wait()  # until SIGKILL
        return
    engine = Engine.open(db, poll_interval=0.05, lease=3.0, schema=schema)
    if command == "crash":
        log, k = args[0], int(args[1])
        engine.register("ten", ten_steps(log, k))  # type: ignore[arg-type]
        engine.start()
        engine.invoke("ten", instance_id="crash").result()
    elif command == "recover":
        engine.register("ten", ten_steps(args[0], 0))  # type: ignore[arg-type]
        with engine:
            print(json.dumps(engine.invocation("ten", "crash").result(timeout=60)), flush=True)
    elif command == "many":
        log, n = args[0], int(args[1])
        engine.register("three", three_steps(log))  # type: ignore[arg-type]
        with engine:
            invocations = [
                engine.invoke("three", instance_id=f"{os.getpid()}-{i}") for i in range(n)
            ]
            results = [inv.result(timeout=120) for inv in invocations]
        print(json.dumps(sorted(set(results))), flush=True)
    elif command == "wait":
        engine.register("awaits", awaits_signal(args[0]))  # type: ignore[arg-type]
        with engine:
            inv = engine.invoke("awaits", instance_id="parked")
            print(f"suspended {inv.wait(timeout=30)}", flush=True)
            print(json.dumps(inv.result(timeout=60)), flush=True)
    elif command == "signal":
        instance_id = args[0]
        if len(args) > 1:  # this process can run the workflow too
            engine.register("awaits", awaits_signal(args[1]))  # type: ignore[arg-type]
        with engine:
            engine.signal("awaits", instance_id, "go:v1", "hello")
    elif command == "queued":
        log, k = args[0], int(args[1])
        engine.queue("q", concurrency=1)
        engine.register("ten", ten_steps(log, k), queue="q")  # type: ignore[arg-type]
        engine.start()
        engine.invoke("ten", instance_id="crash").result()
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
