"""Discord adapter (discord.py) for the platform bridge.

``create(options, env)`` builds it from the ``[adapters.discord]`` TOML table and the environment
(``DISCORD_BOT_TOKEN``; ``DISCORD_API_URL`` / ``DISCORD_GATEWAY_URL`` to point it at a proxy or the loopback
fake in ``adapters.discord.testing``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from adapters.discord._adapter import DiscordAdapter, DiscordStartError, MessageContentNotEnabled
from adapters.discord._components import ApprovalButton, custom_id
from adapters.discord._options import DiscordConfigError, DiscordOptions, DiscordSettings, load_settings
from adapters.discord._transport import DiscordTransport

__all__ = [
    "ApprovalButton",
    "DiscordAdapter",
    "DiscordConfigError",
    "DiscordOptions",
    "DiscordSettings",
    "DiscordStartError",
    "DiscordTransport",
    "MessageContentNotEnabled",
    "create",
    "custom_id",
]


def create(
    options: Mapping[str, Any], env: Mapping[str, str], *, clock: Callable[[], float] = time.time
) -> DiscordAdapter:
    """The adapter for the ``[adapters.discord]`` table ``options``; secrets and endpoints from ``env``.
    ``clock`` (Unix seconds) dates messages for the edit age limit. Raises `DiscordConfigError` (a ValueError
    naming the key) for invalid options or a missing token."""
    return DiscordAdapter(load_settings(options, env), clock=clock)
