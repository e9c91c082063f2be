"""The ``memable`` logger, and the fields every record of it carries.

Every record has ``workflow``, ``instance`` and ``step`` attributes (from ``extra``; None where one
does not apply), so a formatter or structured-logging handler can rely on them; and the message of
a record about an instance starts with ``workflow/instance`` (and `` [step]``), so a plain format
shows which one it is about."""

from __future__ import annotations

import logging

FIELDS = ("workflow", "instance", "step")


class _Fields(logging.Filter):
    """Gives every record the three fields (None where absent) and names them in its message."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name in FIELDS:
            if not hasattr(record, name):
                setattr(record, name, None)
        prefix = named(record.workflow, record.instance, record.step)  # type: ignore[attr-defined]
        if prefix:
            # The message is %-formatted only when it has arguments.
            prefix = prefix.replace("%", "%%") if record.args else prefix
            record.msg = f"{prefix}: {record.msg}"
        return True


def named(workflow: str | None, instance: str | None, step: str | None) -> str:
    """``workflow/instance [step]``, with what is known of the three.

    >>> named("ship", "order-1", "charge:v1")
    'ship/order-1 [charge:v1]'
    >>> named(None, None, None)
    ''
    """
    where = "/".join(str(p) for p in (workflow, instance) if p is not None)
    return where + (f" [{step}]" if step is not None else "")


log = logging.getLogger("memable")
log.addFilter(_Fields())


def where(
    workflow: str | None = None, instance: str | None = None, step: str | None = None
) -> dict[str, str | None]:
    """The ``extra`` of a record about a workflow, an instance and a step."""
    return {"workflow": workflow, "instance": instance, "step": step}
