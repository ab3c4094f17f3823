"""How a post carries the bridge's durable key where Discord can give it back.

Two places, for two windows:

- the **nonce** (≤ 25 chars) with ``enforce_nonce``: for "a few minutes" Discord answers a repeated create by
  the same author with the same nonce with the message it already stored. That collapses discord.py's own
  retries (5xx, connection resets) and a restart soon after a crash into one message. Discord echoes the
  nonce in the POST response and MESSAGE_CREATE only, not in channel history.
- an **embed footer** ``ref <hash>``: embeds are returned by history, do not count against the 2000
  characters of content, and render below the text, so the answer text stays clean for readers, copy/paste
  and screen readers. `find` scans the bot's recent messages for it, which works at any age.

Both derive from the place and the key, so every process computes the same values.
"""

from __future__ import annotations

import hashlib

import discord

from adapters.bridge import Place

MARKER_COLOUR = discord.Colour(0x4F545C)


def ref_for(target: Place, key: str) -> str:
    """20 hex characters identifying (place, key): the nonce, and (shortened) the footer marker."""
    return hashlib.sha256(f"{target.key}|{key}".encode()).hexdigest()[:20]


def nonce_for(target: Place, key: str, *, attempt: int = 0) -> str:
    ref = ref_for(target, key)
    return ref if attempt == 0 else f"{ref}~{attempt}"


def footer_for(target: Place, key: str) -> str:
    return f"ref {ref_for(target, key)[:12]}"


def marker_embed(target: Place, key: str) -> discord.Embed:
    """The embed an answer part carries: only the footer marker."""
    return discord.Embed(colour=MARKER_COLOUR).set_footer(text=footer_for(target, key))


def has_marker(message: discord.Message, footer: str) -> bool:
    return any(embed.footer.text == footer for embed in message.embeds)
