"""The dashboard's WSGI application: routes, access, CSRF, actions, and their answers.

Each action is one operation of ``memable._store.admin``, answered with a redirect to what
it changed (the security model and error statuses: the dashboard how-to)."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterable
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from .._clock import SYSTEM_CLOCK, Clock, epoch_seconds
from .._engine import access
from .._engine.engine import Engine
from .._errors import (
    EngineError,
    InstanceFinished,
    InstanceNotFound,
    InvalidKey,
    SerializationError,
    SignalRejected,
    StepNotFound,
    WorkflowNotFound,
)
from .._inspect import known_queues, open_existing
from .._store import admin
from .._store.protocol import Store
from . import guard, metrics, pages

try:
    import jinja2
    from werkzeug.exceptions import HTTPException
    from werkzeug.routing import Map, Rule
    from werkzeug.wrappers import Request, Response
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("the dashboard needs Werkzeug and Jinja2, in the extra 'web': pip install "
        f"'memable-engine[web]' ({exc})") from None

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

#: The answers a finished action redirects with (``?done=``), as the page says them.
DONE = {
    "signal": "Signal delivered.",
    "cancel": "Cancelled.",
    "resume": "Marked to resume: an engine that runs the workflow takes it at its next look.",
    "fork": "Forked: this is the new instance; an engine that runs the workflow starts it.",
    "pause-queue": "Queue paused: no engine starts another of its instances until it is "
                   "resumed; runs in flight finish.",
    "resume-queue": "Queue resumed: the engines that consume it start its queued instances.",
}
_READ_ONLY = ("This dashboard is read-only: it was started without allow_actions "
              "(memable ui --allow-actions).")
_STATIC = {"live.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}


def app(
    target: str | os.PathLike[str] | Engine, *, allow_actions: bool = False,
    token: str | None = None, schema: str | None = None, loopback_only: bool = False,
) -> Dashboard:
    """The dashboard over the store ``target`` names, as a WSGI application.

    ``target``: a SQLite file or a PostgreSQL URL (which must hold a store; ``schema``
    names a PostgreSQL schema other than ``memable``), or an ``Engine``, whose store it
    shares. Read-only unless ``allow_actions``; with a ``token``, every page answers 401
    without it. ``loopback_only`` answers 403 to a ``Host`` not a loopback name, and to an
    action from another origin (see the dashboard how-to's security model).

    >>> from memable import Engine
    >>> from werkzeug.test import Client
    >>> engine = Engine.in_memory()
    >>> engine.register("greet", lambda ctx, name: f"hello {name}")
    >>> with engine:
    ...     _ = engine.invoke("greet", "ada", instance_id="g-1").result(10)
    ...     page = Client(app(engine)).get("/instances?workflow=greet")
    >>> page.status_code, "g-1" in page.text
    (200, True)
    """
    if isinstance(target, Engine):
        if schema is not None:
            raise ValueError("schema is for a PostgreSQL URL, not an Engine")
        return Dashboard(access.store(target), allow_actions=allow_actions, token=token,
                         owned=False, loopback_only=loopback_only, clock=access.clock(target))
    if not isinstance(target, (str, os.PathLike)):
        raise TypeError(f"app() takes a path, a postgresql:// URL or an Engine, not {target!r}")
    return Dashboard(open_existing(os.fspath(target), schema), allow_actions=allow_actions,
                     token=token, owned=True, loopback_only=loopback_only, clock=SYSTEM_CLOCK)


class Dashboard:
    """A WSGI application showing one store (see ``app``)."""

    def __init__(
        self, store: Store, *, allow_actions: bool, token: str | None, owned: bool,
        loopback_only: bool = False, clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if token is not None and (not isinstance(token, str) or not token):
            raise ValueError("token must be a non-empty str, or None")
        self.store = store
        self.clock = clock  # dates its actions, judges ages and liveness
        self.allow_actions = allow_actions
        self._token = token
        self._owned = owned
        self.loopback_only = loopback_only
        self._templates = jinja2.Environment(
            loader=jinja2.PackageLoader("memable.web", "templates"), autoescape=True,
            undefined=jinja2.StrictUndefined)
        self._templates.filters["when"] = pages.when
        self._routes = Map([
            Rule("/", endpoint="overview", methods=["GET"]),
            Rule("/instances", endpoint="instances", methods=["GET"]),
            Rule("/instance", endpoint="instance", methods=["GET"]),
            Rule("/instance/live", endpoint="live", methods=["GET"]),
            Rule("/instance/signal", endpoint="signal", methods=["POST"]),
            Rule("/instance/cancel", endpoint="cancel", methods=["POST"]),
            Rule("/instance/resume", endpoint="resume", methods=["POST"]),
            Rule("/instance/fork", endpoint="fork", methods=["POST"]),
            Rule("/resume-failed", endpoint="resume_failed", methods=["GET", "POST"]),
            Rule("/queue/pause", endpoint="pause_queue", methods=["POST"]),
            Rule("/queue/resume", endpoint="resume_queue", methods=["POST"]),
            Rule("/metrics", endpoint="metrics", methods=["GET"]),
            Rule("/static/<name>", endpoint="static", methods=["GET"]),
        ], strict_slashes=False)

    def close(self) -> None:
        """Close the store this dashboard opened (not an Engine's)."""
        if self._owned:
            self.store.close()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        return self._answer(Request(environ))(environ, start_response)

    def _answer(self, request: Request) -> Response:
        urls = self._routes.bind_to_environ(request.environ)
        csrf = request.cookies.get(guard.CSRF_COOKIE) or guard.new_csrf()
        page = _Page(self, request, urls, csrf)
        try:
            # The Host header as sent (request.host would fall back to the server's name).
            host = request.environ.get("HTTP_HOST", "")
            if self.loopback_only and not guard.loopback_host(host):
                return page.error(403, "This dashboard answers only on this machine's "
                                  "loopback names (localhost, 127.0.0.1, [::1]); open it "
                                  "by one of them, or serve it with a --token.")
            if self._token is not None:
                given = request.args.get("token")
                if given is not None and request.method == "GET":
                    return page.take_token(given, self._token)
                if not (guard.same(guard.bearer(request.headers.get("Authorization")), self._token)
                        or guard.same(request.cookies.get(guard.TOKEN_COOKIE), self._token)):
                    return page.error(401, "This dashboard needs its token: open it with "
                                      "?token=... once, or send Authorization: Bearer ...")
            endpoint, route_args = urls.match()
            if request.method == "POST":
                if not self.allow_actions:
                    return page.error(403, _READ_ONLY)
                if self.loopback_only and not guard.same_origin(
                        request.headers.get("Origin"), request.headers.get("Referer"), host):
                    return page.error(403, "The action did not come from a page of this dashboard "
                        "(its Origin and Referer name another site, or neither was sent): open "
                        "the dashboard and act from its page.")
                if not guard.same(request.form.get(guard.CSRF_FIELD),
                                  request.cookies.get(guard.CSRF_COOKIE)):
                    return page.error(403, "The form's CSRF token is missing or does not "
                                      "match this browser's: reload the page and try again.")
            handler: Callable[..., Response] = getattr(page, f"do_{endpoint}")
            response = handler(**route_args)
        except HTTPException as exc:  # no such page, or a method it does not take
            response = page.error(exc.code or 500, f"{exc.name}. {exc.description or ''}")
        except (pages.BadRequest, StepNotFound, InvalidKey, SerializationError) as exc:
            response = page.error(400, str(exc))
        except (InstanceNotFound, WorkflowNotFound, pages.NotFound) as exc:
            response = page.error(404, str(exc))
        except (InstanceFinished, SignalRejected) as exc:
            response = page.error(409, str(exc))
        except EngineError as exc:  # the store failed: say so, change nothing
            response = page.error(503, str(exc))
        if guard.CSRF_COOKIE not in request.cookies:
            # Lax, not Strict: a link from another site brings the cookie along, so its page
            # keeps the forms of other tabs working; a cross-site POST still comes without it.
            response.set_cookie(guard.CSRF_COOKIE, csrf, httponly=True, samesite="Lax",
                                path=request.script_root or "/")
        # Everything is the dashboard's own: no inline script, no other origin.
        response.headers.setdefault("Content-Security-Policy",
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
            "frame-ancestors 'self'; form-action 'self'; base-uri 'none'")
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault("Cache-Control", "no-store")
        return response


class _Page:
    """One request being answered: its reads and actions, and rendering."""

    def __init__(self, dashboard: Dashboard, request: Request, urls: Any, csrf: str) -> None:
        self.dashboard = dashboard
        self.store = dashboard.store
        self.clock = dashboard.clock
        self.request = request
        self.urls = urls
        self.csrf = csrf

    def url(self, endpoint: str, **values: Any) -> str:
        """The path of a page, its query from ``values`` (None and "" left out)."""
        path: str = self.urls.build(endpoint, {k: v for k, v in values.items() if k == "name"})
        query = {k: v for k, v in values.items() if k != "name" and v not in (None, "")}
        return path + ("?" + urlencode(query) if query else "")

    def render(self, template: str, status: int = 200, **context: Any) -> Response:
        html = self.dashboard._templates.get_template(template).render(
            url=self.url, csrf=self.csrf, csrf_field=guard.CSRF_FIELD,
            actions=self.dashboard.allow_actions, **context)
        return Response(html, status=status, content_type="text/html; charset=utf-8")

    def error(self, status: int, message: str) -> Response:
        return self.render("error.html", status=status, code=status, message=message)

    def redirect(self, location: str) -> Response:
        return Response("", status=303, headers={"Location": location})

    def take_token(self, given: str, token: str) -> Response:
        """``?token=``: right, keep it in a cookie and redirect to the URL without it; else 401."""
        if not guard.same(given, token):
            return self.error(401, "That token is not this dashboard's.")
        args = {k: v for k, v in self.request.args.items() if k != "token"}
        # Relative, never built from the request's Host (which the client chose); one
        # leading slash, so that "//other.example" stays a path of this dashboard.
        path = self.request.script_root + "/" + self.request.path.lstrip("/")
        response = self.redirect(quote(path) + ("?" + urlencode(args) if args else ""))
        # Lax: a link to the dashboard from another site opens it, not the 401 page.
        response.set_cookie(guard.TOKEN_COOKIE, token, httponly=True, samesite="Lax",
                            path=self.request.script_root or "/")
        return response

    def _instance_args(self, source: Any) -> tuple[str, str]:
        workflow, instance_id = source.get("workflow"), source.get("id")
        if not workflow or not instance_id:
            raise pages.BadRequest("a workflow and an instance id are needed")
        return str(workflow), str(instance_id)

    def _detail_url(self, workflow: str, instance_id: str, done: str | None = None) -> str:
        return self.url("instance", workflow=workflow, id=instance_id, done=done)

    def do_overview(self) -> Response:
        done = DONE.get(self.request.args.get("done", ""))
        return self.render("overview.html", view=pages.overview(self.store, self.clock), done=done)

    def do_instances(self) -> Response:
        args = self.request.args
        chosen = pages.instance_filter(dict(args.items()))
        page = pages.page_number(args.get("page"))
        return self.render("instances.html", view=pages.instances(self.store, chosen, page))

    def do_instance(self) -> Response:
        workflow, instance_id = self._instance_args(self.request.args)
        done = DONE.get(self.request.args.get("done", ""))
        view = pages.detail(self.store, workflow, instance_id, self.clock)
        return self.render("instance.html", view=view, done=done,
                           fork_id=f"{instance_id}.fork-{secrets.token_hex(4)}")

    def do_live(self) -> Response:
        workflow, instance_id = self._instance_args(self.request.args)
        return self.render("live.html", view=pages.detail(self.store, workflow, instance_id,
                                                                   self.clock))

    def do_metrics(self) -> Response:
        return Response(metrics.scrape(self.store, self.clock), content_type=metrics.CONTENT_TYPE)

    def do_static(self, name: str) -> Response:
        if name not in _STATIC:
            return self.error(404, "no such file")
        body = resources.files("memable.web").joinpath("static", name).read_bytes()
        return Response(body, content_type=_STATIC[name])

    def do_signal(self) -> Response:
        form = self.request.form
        workflow, instance_id = self._instance_args(form)
        key = form.get("key", "")
        try:
            payload = json.loads(form.get("payload") or "null")
        except ValueError as exc:
            raise pages.BadRequest(f"the payload is not JSON ({exc}); nothing was sent: workflow "
                f"{workflow!r}, instance {instance_id!r}, step {key!r}") from None
        admin.store_signal(self.store, workflow, instance_id, key, payload, clock=self.clock)
        return self.redirect(self._detail_url(workflow, instance_id, "signal"))

    def do_cancel(self) -> Response:
        workflow, instance_id = self._instance_args(self.request.form)
        admin.cancel_instance(self.store, workflow, instance_id, clock=self.clock)
        return self.redirect(self._detail_url(workflow, instance_id, "cancel"))

    def do_resume(self) -> Response:
        workflow, instance_id = self._instance_args(self.request.form)
        admin.resume_instance(self.store, workflow, instance_id, clock=self.clock)
        return self.redirect(self._detail_url(workflow, instance_id, "resume"))

    def do_fork(self) -> Response:
        form = self.request.form
        workflow, instance_id = self._instance_args(form)
        new_id, made = admin.fork_instance(self.store, workflow, instance_id,
            form.get("from_key") or None, form.get("new_id") or None, clock=self.clock)
        if not made:  # the form sent twice, or an id someone took: say so, fork nothing
            return self.error(409, f"an instance {new_id!r} of workflow {workflow!r} exists "
                              "already; nothing was forked (open it from the list)")
        return self.redirect(self._detail_url(workflow, new_id, "fork"))

    def _queue_arg(self) -> str:
        """The queue the form names: 400 without one, 404 for one the store does not know."""
        name = self.request.form.get("queue")
        if not name:
            raise pages.BadRequest("a queue name is needed")
        if name not in known_queues(self.store, clock=self.clock):
            raise pages.NotFound(f"the store knows no queue {name!r}")
        return str(name)

    def do_pause_queue(self) -> Response:
        admin.pause_queue(self.store, self._queue_arg(), clock=self.clock)
        return self.redirect(self.url("overview", done="pause-queue") + "#queues")

    def do_resume_queue(self) -> Response:
        admin.resume_queue(self.store, self._queue_arg(), clock=self.clock)
        return self.redirect(self.url("overview", done="resume-queue") + "#queues")

    def do_resume_failed(self) -> Response:
        if not self.dashboard.allow_actions:
            return self.error(403, _READ_ONLY)
        source = self.request.form if self.request.method == "POST" else self.request.args
        workflow, id_prefix = source.get("workflow") or None, source.get("id") or None
        if self.request.method == "GET":
            view = pages.bulk_resume(self.store, workflow, id_prefix, clock=self.clock)
            return self.render("resume_failed.html", view=view)
        until = pages.confirmed_time(source.get("until"))
        resumed = admin.resume_failed(self.store, workflow, id_prefix=id_prefix,
            until=epoch_seconds(until), limit=pages.BULK_LIMIT, clock=self.clock)
        return self.render("resumed.html", resumed=resumed, workflow=workflow,
                           id_prefix=id_prefix, until=until)
