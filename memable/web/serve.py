"""``memable ui``: the dashboard on Werkzeug's threaded server, until interrupted.

The server is Werkzeug's development server, threaded, which is enough for
the few operators of one store; behind a reverse proxy or in production,
mount ``app()`` in the project's own WSGI server instead.
"""

from __future__ import annotations

from collections.abc import Callable

from werkzeug.serving import make_server

from .app import Dashboard


def serve(
    dashboard: Dashboard, host: str, port: int, *, announce: Callable[[str], None] = print
) -> None:
    """Serve ``dashboard`` on ``host:port`` (port 0: any free one) until KeyboardInterrupt
    (or SIGINT); ``announce`` is told the address first."""
    server = make_server(host, port, dashboard, threaded=True)
    shown = f"[{host}]" if ":" in host else host
    mode = "actions allowed" if dashboard.allow_actions else "read-only"
    announce(f"memable ui: serving http://{shown}:{server.server_port}/ ({mode}); "
             "Ctrl-C stops it")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
