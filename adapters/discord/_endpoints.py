"""Point discord.py's REST base URL and gateway URL somewhere else (a proxy, or the loopback fake in tests).

discord.py keeps both as class attributes: ``discord.http.Route.BASE`` (every REST call, including the
interaction callback and webhook routes, is ``Route.BASE + path``) and ``DiscordWebSocket.DEFAULT_GATEWAY``
(used by a non-sharded ``Client`` for every fresh IDENTIFY, and again after an INVALIDATE_SESSION). A RESUME
goes to the ``resume_gateway_url`` the server sent in READY, and ``AutoShardedClient`` asks ``GET /gateway/bot``
for its URL, so both of those follow whichever server the two attributes point at.

The adapter calls ``override_endpoints(os.environ.get("DISCORD_API_URL"), os.environ.get("DISCORD_GATEWAY_URL"))``
before it creates its client. The change is process-wide (class attributes), so it also affects any other
discord.py client in the same process.
"""

from __future__ import annotations

from dataclasses import dataclass

import yarl
from discord import http as _discord_http
from discord.gateway import DiscordWebSocket
from discord.http import Route

__all__ = ["DEFAULT_ENDPOINTS", "Endpoints", "current_endpoints", "override_endpoints"]


@dataclass(frozen=True)
class Endpoints:
    """A REST base URL (``.../api/v10``, no trailing slash) and a gateway URL (``ws://`` or ``wss://``)."""

    api_url: str
    gateway_url: str


def current_endpoints() -> Endpoints:
    """The endpoints discord.py uses right now."""
    return Endpoints(api_url=Route.BASE, gateway_url=str(DiscordWebSocket.DEFAULT_GATEWAY))


DEFAULT_ENDPOINTS: Endpoints = current_endpoints()
"""discord.py's own endpoints, captured when this module was first imported."""


def _normalise_api_url(api_url: str) -> str:
    url = yarl.URL(api_url)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"DISCORD_API_URL must be an http(s) URL, got {api_url!r}")
    if url.query_string or url.fragment:
        raise ValueError(f"DISCORD_API_URL must not have a query or fragment, got {api_url!r}")
    path = url.path.rstrip("/")
    if not path:
        # A bare host ("http://127.0.0.1:8080") means "the API root there", versioned like discord.py's own.
        path = f"/api/v{_discord_http.INTERNAL_API_VERSION}"
    # Any other path is kept as written: a proxy may mount the API under its own prefix.
    return str(url.with_path(path))


def _normalise_gateway_url(gateway_url: str) -> yarl.URL:
    url = yarl.URL(gateway_url)
    if url.scheme not in ("ws", "wss") or not url.host:
        raise ValueError(f"DISCORD_GATEWAY_URL must be a ws(s) URL, got {gateway_url!r}")
    # discord.py replaces the query (v, encoding, compress) on every connect, so any query here is dropped.
    return url.with_query(None).with_fragment(None)


def override_endpoints(api_url: str | None, gateway_url: str | None) -> Endpoints:
    """Send discord.py's REST calls to ``api_url`` and its gateway connections to ``gateway_url``.

    ``None`` leaves that endpoint as it is, so passing two unset environment variables is a no-op.
    ``api_url`` is the full REST base like ``https://discord.com/api/v10``; a bare ``http://host:port`` gets
    ``/api/v10`` appended. Returns the endpoints in force before the call; pass them back to undo::

        previous = override_endpoints(fake.api_url, fake.gateway_url)
        try:
            ...
        finally:
            override_endpoints(previous.api_url, previous.gateway_url)

    Call it after any ``discord.http._set_api_version`` (which rewrites ``Route.BASE``) and before the client
    connects. ``Route`` objects build their URL when created, so requests already queued keep their old URL.
    """
    previous = current_endpoints()
    if api_url is not None:
        Route.BASE = _normalise_api_url(api_url)
    if gateway_url is not None:
        DiscordWebSocket.DEFAULT_GATEWAY = _normalise_gateway_url(gateway_url)
    return previous
