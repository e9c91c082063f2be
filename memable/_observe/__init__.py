"""Observability: the spans and metrics an engine reports, through OpenTelemetry.

Its one job: one small interface (``base.Telemetry``) that the engine's parts
call, a version of it that does nothing, and one that speaks the OpenTelemetry
API (``otel``, imported only when the API is installed): the only package that
imports ``opentelemetry``.

May import: the value modules; never a store, the runner or the engine.
"""

from __future__ import annotations

from .base import Telemetry


def telemetry() -> Telemetry:
    """OpenTelemetry's, if its API is installed; else the one that does nothing."""
    try:
        import opentelemetry.metrics
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return Telemetry()
    from .otel import OpenTelemetry

    return OpenTelemetry.instance()
