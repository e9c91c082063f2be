"""Observability: the spans and metrics an engine reports, through OpenTelemetry.

Its one job: the interface the engine's parts call (``base.Telemetry``, which does nothing)
and its OpenTelemetry version (``otel``): the only package that imports ``opentelemetry``.

May import: the value modules; never a store, the runner or the engine."""

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
