"""The ``memable`` logger, and the fields every record of it carries.

Every record carries ``workflow``, ``instance`` and ``step`` attributes
(from ``extra``; None where one does not apply), so a formatter or a
structured-logging handler can rely on the three being there.
"""

from __future__ import annotations

import logging

FIELDS = ("workflow", "instance", "step")


class _Fields(logging.Filter):
    """Gives a record that names no instance the three fields, as None."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name in FIELDS:
            if not hasattr(record, name):
                setattr(record, name, None)
        return True


log = logging.getLogger("memable")
log.addFilter(_Fields())


def where(
    workflow: str | None = None, instance: str | None = None, step: str | None = None
) -> dict[str, str | None]:
    """The ``extra`` of a record about a workflow, an instance and a step."""
    return {"workflow": workflow, "instance": instance, "step": step}
