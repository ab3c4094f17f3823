"""`DevchatAdapter`: devchat as a platform adapter. `start(bridge)` opens the chat store, attaches the transport,
feeds posts the bot has not seen yet through the bridge's exactly-once intake, then serves the page."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from adapters.bridge import Bridge, BridgeLike, Place
from adapters.devchat.options import DevchatConfigError, DevchatOptions, parse_options, remote_warning
from adapters.devchat.server import DevchatServer
from adapters.devchat.store import ChatStore
from adapters.devchat.transport import DevchatTransport

log = logging.getLogger("adapters.devchat")


def workspace_of(workspace: str, store_id: str) -> str:
    """The workspace part of this store's places: the configured one plus the store's id, so a new store (the
    old file deleted) is a new workspace and none of its message ids can collide with an old request id."""
    return f"{workspace}.{store_id}" if store_id else workspace


class DevchatAdapter:
    name = "devchat"

    def __init__(self, options: DevchatOptions) -> None:
        self.options = options
        self.store: ChatStore | None = None
        self.transport: DevchatTransport | None = None
        self.server: DevchatServer | None = None
        self.bridge: Bridge | None = None

    @property
    def warnings(self) -> list[str]:
        """Shown by `check-config` and logged at start."""
        warning = remote_warning(self.options)
        return [] if warning is None else [warning]

    @property
    def url(self) -> str:
        """Where the page is served (after `start`)."""
        return "" if self.server is None else self.server.url

    async def start(self, bridge: BridgeLike) -> None:
        if self.server is not None:
            return
        if not isinstance(bridge, Bridge):
            # The page reads the harness directly (conversations, tasks, gates): one process, one store.
            raise DevchatConfigError(
                "devchat runs in a single process over the whole store; it cannot run as one of several "
                "workers (set [storage] partitions = 1, or use the Slack or Discord adapter)"
            )
        self.bridge = bridge
        for warning in self.warnings:
            log.warning("%s", warning)
        store = await ChatStore.open(self.options.store, keep_events=self.options.keep_events)
        try:
            for channel in self.options.channels:
                await store.add_channel(channel, None)
            transport = DevchatTransport(
                store,
                workspace=workspace_of(self.options.workspace, store.store_id),
                bot_name=self.options.bot_name,
                max_chars=self.options.max_chars,
                edit_interval=self.options.edit_interval,
            )
            bridge.attach(transport)
            caught = await bridge.catch_up(transport, await self._places(store, transport, bridge))
            if caught:
                log.info("devchat: %d message(s) posted while the bot was down handed over", caught)
            server = DevchatServer(self.options, store, transport, bridge)
            await server.start()
        except BaseException:
            await store.close()
            raise
        self.store, self.transport, self.server = store, transport, server
        log.info("devchat: serving %s", server.url)  # the `bots` CLI prints `url` for the operator

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()
            self.server = None
        if self.store is not None:
            await self.store.close()
            self.store = None

    async def _places(self, store: ChatStore, transport: DevchatTransport, bridge: Bridge) -> list[Place]:
        """Every place with human posts, plus those the bridge knows: a post stored just before a crash, in a
        channel or thread the bot never saw, is caught up too."""
        places = {transport.place(channel, thread) for channel, thread in await store.human_places()}
        places.update(
            p for p in await bridge.known_places(transport.platform) if p.workspace == transport.workspace
        )
        return sorted(places, key=lambda p: (p.channel, p.thread is not None, int(p.thread or 0)))


def create(options: Mapping[str, Any], env: Mapping[str, str]) -> DevchatAdapter:
    """Build the adapter from the `[adapters.devchat]` table of a bot config (errors name the key)."""
    return DevchatAdapter(parse_options(options, env))
