"""``python manage.py memable_worker``: run the workflows until SIGINT or SIGTERM."""

from __future__ import annotations

import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from orders.engine import open_engine


class Command(BaseCommand):
    help = "Run the memable workflows on settings.MEMABLE_DB until SIGINT or SIGTERM."

    def handle(self, *args: Any, **options: Any) -> None:
        stop_signals = {signal.SIGINT, signal.SIGTERM}
        # Blocked before the engine starts its threads, which inherit the mask:
        # sigwait below is then the only taker, and no handler interrupts a run.
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        engine = open_engine()
        engine.start()
        self.stdout.write(f"memable worker running on {settings.MEMABLE_DB}")
        self.stdout.flush()
        try:
            received = signal.Signals(signal.sigwait(stop_signals))
            self.stdout.write(f"{received.name}: letting the runs in flight end")
        finally:
            engine.close()  # stop (waits for active runs), then close the file
        self.stdout.write("memable worker stopped")
