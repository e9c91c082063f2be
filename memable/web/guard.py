"""Who may see the dashboard and who may act: the access token and the CSRF token.

A dashboard with a token answers 401 unless a request carries it, as
``Authorization: Bearer <token>`` or in the HttpOnly cookie a browser gets by opening a page
with ``?token=<token>``. Every action is a POST carrying, in a form field, the CSRF token of
the browser's HttpOnly, ``SameSite=Lax`` cookie, which another site can neither read nor send.
Tokens are compared in constant time and never shown in a page, a message or a log.

>>> csrf = new_csrf()
>>> len(csrf) >= 43, same(csrf, csrf), same(csrf, "x"), same(None, csrf)
(True, True, False, False)
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from urllib.parse import urlsplit

TOKEN_COOKIE = "memable_token"
CSRF_COOKIE = "memable_csrf"
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


def loopback_host(host: str | None) -> bool:
    """Whether a request's ``Host`` names this machine's loopback, with any port. A dashboard
    without a token answers only these, so a domain rebound to 127.0.0.1 (DNS rebinding)
    gets nothing.

    >>> [loopback_host(h) for h in ("localhost:8321", "127.0.0.1", "[::1]:80", "LOCALHOST")]
    [True, True, True, True]
    >>> [loopback_host(h) for h in ("attacker.example:8321", "::1", "127.0.0.1:x", "", None)]
    [False, False, False, False, False]
    """
    if not host:
        return False
    bracketed = host.startswith("[")
    if bracketed:
        name, bracket, port = host[1:].partition("]")
        if not bracket or (port and not port.startswith(":")):
            return False
        port = port[1:]
    else:
        name, colon, port = host.rpartition(":")
        if not colon:
            name, port = host, ""
        elif ":" in name:  # an IPv6 address without its brackets is no Host
            return False
    if port and not port.isdigit():
        return False
    if not bracketed and name.lower() == "localhost":
        return True
    try:
        address = ipaddress.IPv6Address(name) if bracketed else ipaddress.IPv4Address(name)
    except ValueError:
        return False
    return address.is_loopback


def same_origin(origin: str | None, referer: str | None, host: str) -> bool:
    """Whether a request's ``Origin`` (else its ``Referer``) is the dashboard at ``host`` (its
    checked ``Host``); a browser sends one with every form, so an action with neither is
    refused.

    >>> same_origin("http://127.0.0.1:8321", None, "127.0.0.1:8321")
    True
    >>> same_origin(None, "http://localhost:8321/instance?id=1", "localhost:8321")
    True
    >>> same_origin("http://attacker.example:8321", None, "127.0.0.1:8321")
    False
    >>> same_origin(None, None, "127.0.0.1:8321"), same_origin("null", None, "localhost")
    (False, False)
    """
    source = origin if origin and origin != "null" else referer
    if not source:
        return False
    parsed = urlsplit(source)
    return parsed.scheme in ("http", "https") and parsed.netloc.lower() == host.lower()
