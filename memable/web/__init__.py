"""The dashboard: every instance, why it failed, and acting on it, from a browser.

``app(target)`` is a WSGI application over a store (a SQLite file, a PostgreSQL URL, or an
``Engine``'s) to mount in a Flask or Django project behind its own login, or to serve with
``memable ui``. Needs the extra ``web``: ``pip install 'memable-engine[web]'``.

Imports Werkzeug and Jinja2 (only this package does), the operator views
(``memable._inspect``) and the store protocol; only ``memable ui`` imports it.

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
