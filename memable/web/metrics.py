"""``/metrics``: the store's counts in the Prometheus text format (version 0.0.4).

What the store holds, read at each scrape. (Rates and durations are the engines' own
metrics, through OpenTelemetry.)

>>> print(exposition([("ship", "failed", 2)], [("mail", 3, 1, 4.5, 1)]), end="")
# HELP memable_instances Instances in the store, by workflow and status.
# TYPE memable_instances gauge
memable_instances{workflow="ship",status="failed"} 2
# HELP memable_queue_queued Instances waiting in a queue for a slot.
# TYPE memable_queue_queued gauge
memable_queue_queued{queue="mail"} 3
# HELP memable_queue_running Instances of a queue holding a slot.
# TYPE memable_queue_running gauge
memable_queue_running{queue="mail"} 1
# HELP memable_queue_oldest_age_seconds Seconds the oldest waiting instance of a queue has waited.
# TYPE memable_queue_oldest_age_seconds gauge
memable_queue_oldest_age_seconds{queue="mail"} 4.5
# HELP memable_queue_paused Whether a queue is paused (1): none of its instances starts.
# TYPE memable_queue_paused gauge
memable_queue_paused{queue="mail"} 1
"""

from __future__ import annotations

from .._clock import Clock
from .._store.operator import OperatorStore
from .._store.rows import waited

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def label(value: str) -> str:
    """A label value escaped as the text format wants it.

    >>> print(label('a "b"\\\\c\\nd'))
    a \\"b\\"\\\\c\\nd
    """
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(
    counts: list[tuple[str, str, int]], queues: list[tuple[str, int, int, float, int]]
) -> str:
    """The text of a scrape: ``counts`` (workflow, status, n), ``queues`` (name, queued,
    running, oldest age in seconds, paused 1 or 0)."""
    lines = ["# HELP memable_instances Instances in the store, by workflow and status.",
        "# TYPE memable_instances gauge"]
    lines += [f'memable_instances{{workflow="{label(w)}",status="{label(s)}"}} {n}'
              for w, s, n in counts]
    for index, (name, help_text) in enumerate((
        ("memable_queue_queued", "Instances waiting in a queue for a slot."),
        ("memable_queue_running", "Instances of a queue holding a slot."),
        ("memable_queue_oldest_age_seconds",
         "Seconds the oldest waiting instance of a queue has waited."),
        ("memable_queue_paused", "Whether a queue is paused (1): none of its instances starts."),
    ), start=1):
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        lines += [f'{name}{{queue="{label(q[0])}"}} {q[index]:g}' for q in queues]
    return "\n".join(lines) + "\n"


def scrape(store: OperatorStore, clock: Clock) -> str:
    """The store's counts at ``clock``'s now, as ``exposition`` writes them."""
    now = clock.wall()
    queues = []
    paused = store.paused_queues()
    for name in sorted(set(store.queue_names()) | set(paused)):
        queued, running, oldest = store.queue_stats(name, now)
        age = waited(oldest, now) or 0.0
        queues.append((name, queued, running, round(age, 3), int(name in paused)))
    return exposition(store.status_counts(), queues)
