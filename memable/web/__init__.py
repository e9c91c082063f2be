"""The dashboard: every instance, why it failed, and acting on it, from a browser.

``app(target)`` is a WSGI application over a store (a SQLite file, a
PostgreSQL URL, or an ``Engine``'s own store) to mount in a Flask or Django
project behind its own login, or to serve with ``memable ui``. It reads and
acts only through the store protocol, so it shows a file and a server alike.
Read-only unless ``allow_actions``; with a ``token``, every page asks for it.
Needs the extra ``web`` (Werkzeug and Jinja2): ``pip install
'memable-engine[web]'``.

Imports Werkzeug and Jinja2 (only this package does), the operator views
(``memable._inspect``) and the store protocol; nothing imports it but the
``memable ui`` command.

>>> from memable import Engine
>>> from memable.web import app
>>> with Engine.in_memory() as engine:
...     dashboard = app(engine)
...     print(dashboard.allow_actions)
False
"""

from __future__ import annotations

from .app import Dashboard, app

__all__ = ["Dashboard", "app"]
