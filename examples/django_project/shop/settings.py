"""Settings of the example project: one app, no database, one memable store."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-insecure-memable-example-only")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1"]

INSTALLED_APPS = ["orders"]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
]
ROOT_URLCONF = "shop.urls"
WSGI_APPLICATION = "shop.wsgi.application"
USE_TZ = True

# The example keeps nothing in Django's database: the workflows are in the store.
DATABASES: dict[str, dict[str, Any]] = {}

# The memable store: one SQLite file, shared by every web process and the worker.
MEMABLE_DB = os.environ.get("MEMABLE_DB", str(BASE_DIR / "memable.db"))

# Who may open the memable dashboard at /ops/ (REMOTE_USER, as the sign-on proxy sets it).
MEMABLE_OPERATORS = {"ops"}
