"""``memable ui``: the dashboard on Werkzeug's threaded development server, until interrupted
(enough for a store's few operators; in production, mount ``app()`` in a WSGI server)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from .app import Dashboard

#: A ``token=`` query parameter's value, as a request line shows it.
_TOKEN_PARAM = re.compile(r"(token=)[^&\s\"']*", re.IGNORECASE)


class _Handler(WSGIRequestHandler):
    """Werkzeug's request handler, whose access log shows the token as ``[hidden]``."""

    def log(self, type: str, message: str, *args: Any) -> None:
        line = _TOKEN_PARAM.sub(r"\1[hidden]", message % args if args else message)
        token = getattr(getattr(self.server, "app", None), "_token", None)
        if token:
            line = line.replace(token, "[hidden]").replace(quote(token, safe=""), "[hidden]")
        super().log(type, "%s", line)


def bind(dashboard: Dashboard, host: str, port: int) -> BaseWSGIServer:
    """A threaded server of ``dashboard`` bound to ``host:port`` (0: any free port), not
    serving yet; OSError if it cannot bind. Its access log (stderr) hides the token."""
    try:
        return make_server(host, port, dashboard, threaded=True, request_handler=_Handler)
    except SystemExit:  # Werkzeug's way of saying the address is in use
        raise OSError("the address is in use") from None


def serve(server: BaseWSGIServer, *, read_only: bool,
          announce: Callable[[str], None] = print) -> None:
    """Serve until ``server.shutdown()`` or KeyboardInterrupt (SIGINT), then close the
    socket; ``announce`` is told the address first."""
    host = server.host
    shown = f"[{host}]" if ":" in host else host
    mode = "read-only" if read_only else "actions allowed"
    announce(f"memable ui: serving http://{shown}:{server.server_port}/ ({mode}); "
             "Ctrl-C stops it")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
