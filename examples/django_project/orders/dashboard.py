"""The memable dashboard at /ops/, for the project's operators only.

Django hands the request to the dashboard's WSGI application and turns its
answer back into an ``HttpResponse``. The project's own login decides who
may see it: here ``operators_only`` trusts ``REMOTE_USER`` as set by the
single sign-on proxy in front of the site and compares it with
``settings.MEMABLE_OPERATORS``; with ``django.contrib.auth``, decorate the
view with ``staff_member_required`` instead.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from functools import wraps

import memable.web
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.views.decorators.csrf import csrf_exempt
from memable import Engine
from werkzeug.wrappers import Response

from .engine import get_engine

_lock = threading.Lock()
_shown: tuple[Engine, memable.web.Dashboard] | None = None


def _dashboard() -> memable.web.Dashboard:
    """The dashboard of the process's engine (made once per engine)."""
    global _shown
    engine = get_engine()
    with _lock:
        if _shown is None or _shown[0] is not engine:
            _shown = (engine, memable.web.app(engine, allow_actions=True))
        return _shown[1]


def operators_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Let through only the users ``settings.MEMABLE_OPERATORS`` names."""

    @wraps(view)
    def guarded(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if request.META.get("REMOTE_USER") not in settings.MEMABLE_OPERATORS:
            return HttpResponseForbidden("operators only")
        return view(request, *args, **kwargs)

    return guarded


@csrf_exempt  # the dashboard checks its own CSRF token on every action
@operators_only
def dashboard(request: HttpRequest, path: str = "") -> HttpResponse:
    """Hand the request to the dashboard, mounted where this view is (its links and
    cookies say so)."""
    body = request.body
    environ = dict(request.environ)  # type: ignore[attr-defined]  # WSGIRequest's
    environ.update({
        "SCRIPT_NAME": request.path[: len(request.path) - len(path)].rstrip("/"),
        "PATH_INFO": "/" + path,
        "wsgi.input": io.BytesIO(body),
        "CONTENT_LENGTH": str(len(body)),
    })
    answer = Response.from_app(_dashboard(), environ)
    response = HttpResponse(answer.get_data(), status=answer.status_code)
    for name, value in answer.headers.items():
        if name.lower() != "set-cookie":
            response[name] = value
    for cookie in answer.headers.getlist("Set-Cookie"):
        response.cookies.load(cookie)
    return response
