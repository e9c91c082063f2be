"""Who may see the dashboard and who may act: the access token and the CSRF token.

A dashboard with a token answers every request 401 unless it carries the
token: as ``Authorization: Bearer <token>``, or in the HttpOnly cookie a
browser gets by opening any page once with ``?token=<token>``. Every action
is a POST that carries the CSRF token of the browser's own HttpOnly,
``SameSite=Lax`` cookie in a hidden form field (a page of another site can
neither read it nor send the cookie with its POST). Tokens are compared in
constant time, and never shown in a page, a message or a log.

>>> csrf = new_csrf()
>>> len(csrf) >= 43, same(csrf, csrf), same(csrf, "x"), same(None, csrf)
(True, True, False, False)
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets

#: The cookie that holds the access token once a browser gave it.
TOKEN_COOKIE = "memable_token"
#: The cookie that holds a browser's CSRF token; its forms carry the same value.
CSRF_COOKIE = "memable_csrf"
#: The form field each action carries the CSRF token in.
CSRF_FIELD = "csrf"


def new_csrf() -> str:
    """A fresh CSRF token: 32 random bytes, URL-safe."""
    return secrets.token_urlsafe(32)


def same(given: str | None, expected: str | None) -> bool:
    """Whether ``given`` is ``expected``, compared in constant time (None never is)."""
    if given is None or expected is None:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None.

    >>> bearer("Bearer s3cret"), bearer("Basic dXNlcg=="), bearer(None)
    ('s3cret', None, None)
    """
    if header is None:
        return None
    scheme, _, value = header.partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` serves only this machine (a token is needed otherwise).

    >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("localhost")
    (True, True, True)
    >>> is_loopback("0.0.0.0"), is_loopback("192.168.1.5"), is_loopback("example.com")
    (False, False, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False
