"""Who is who in the workspace, cached briefly in memory: display names (`users.info`), whether a channel is a
DM (`conversations.info`), and user group members (`usergroups.users.list`) for approval checks.

Concurrent lookups of the same key share one request (Slack sends `message` and `app_mention` for one post at
the same moment; both need the author's name).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from slack_sdk.web.async_client import AsyncWebClient

from adapters.bridge import RateGovernor, TransportError
from adapters.slack._api import SlackCallError, SlackPermanentError, call

log = logging.getLogger("adapters.slack")

V = TypeVar("V")


class TtlCache(Generic[V]):
    """A small LRU map whose values expire; `get_or_load` coalesces concurrent loads of one key."""

    def __init__(self, ttl: float, max_size: int = 2048) -> None:
        self.ttl = ttl
        self.max_size = max_size
        self._values: OrderedDict[str, tuple[float, V]] = OrderedDict()
        self._loading: dict[str, asyncio.Future[V]] = {}

    def get(self, key: str) -> V | None:
        found = self._values.get(key)
        if found is None:
            return None
        if time.monotonic() - found[0] > self.ttl:
            del self._values[key]
            return None
        self._values.move_to_end(key)
        return found[1]

    def put(self, key: str, value: V) -> None:
        self._values[key] = (time.monotonic(), value)
        self._values.move_to_end(key)
        while len(self._values) > self.max_size:
            self._values.popitem(last=False)

    async def get_or_load(self, key: str, load: Callable[[], Awaitable[V]]) -> V:
        cached = self.get(key)
        if cached is not None:
            return cached
        pending = self._loading.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            value = await load()
        except BaseException as exc:
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: waiters re-raise it, nobody else needs to
            raise
        else:
            self.put(key, value)
            if not future.done():
                future.set_result(value)
            return value
        finally:
            self._loading.pop(key, None)


class Directory:
    def __init__(
        self,
        client: AsyncWebClient,
        governor: RateGovernor,
        *,
        user_ttl: float,
        group_ttl: float,
        lookup_timeout: float,
    ) -> None:
        self.client = client
        self.governor = governor
        self.lookup_timeout = lookup_timeout
        self._names: TtlCache[str] = TtlCache(user_ttl)
        self._dm: dict[str, bool] = {}
        self._groups: TtlCache[frozenset[str]] = TtlCache(group_ttl)

    # --- display names ------------------------------------------------------------------------------------------

    async def name(self, user_id: str, fallback: str | None = None) -> str:
        """The user's display name (then real name, then handle). A failed or slow lookup never blocks
        intake: the fallback (or the id) stands in, and is not cached."""
        try:
            return await self._names.get_or_load(
                user_id, lambda: asyncio.wait_for(self._load_name(user_id), self.lookup_timeout)
            )
        except (TransportError, SlackPermanentError, TimeoutError) as exc:
            log.warning("users.info for %s failed (%s); using %s", user_id, exc, fallback or user_id)
            return fallback or user_id

    async def _load_name(self, user_id: str) -> str:
        data = await call("users.info", self.client.users_info(user=user_id), self.governor)
        user: dict[str, Any] = data.get("user") or {}
        profile: dict[str, Any] = user.get("profile") or {}
        for candidate in (
            profile.get("display_name"),
            profile.get("real_name"),
            user.get("real_name"),
            user.get("name"),
        ):
            if isinstance(candidate, str) and candidate.strip():
                return candidate.strip()
        return user_id

    def remember_name(self, user_id: str, name: str) -> None:
        self._names.put(user_id, name)

    # --- channels -----------------------------------------------------------------------------------------------

    def note_channel_type(self, channel: str, channel_type: str | None) -> None:
        if channel_type:
            self._dm[channel] = channel_type == "im"

    async def is_dm(self, channel: str) -> bool:
        known = self._dm.get(channel)
        if known is not None:
            return known
        try:
            data = await call("conversations.info", self.client.conversations_info(channel=channel))
            info: dict[str, Any] = data.get("channel") or {}
            known = bool(info.get("is_im"))
        except (TransportError, SlackPermanentError) as exc:
            log.warning("conversations.info for %s failed (%s); guessing from the id", channel, exc)
            return channel.startswith("D")
        self._dm[channel] = known
        return known

    # --- user groups --------------------------------------------------------------------------------------------

    async def groups_of(self, user_id: str, groups: list[str]) -> list[str]:
        """Which of `groups` the user belongs to. Raises `TransportError` if Slack cannot tell right now."""
        found: list[str] = []
        for group in groups:
            members = await self._groups.get_or_load(group, functools.partial(self._load_group, group))
            if user_id in members:
                found.append(group)
        return found

    async def _load_group(self, group: str) -> frozenset[str]:
        try:
            data = await call(
                "usergroups.users.list", self.client.usergroups_users_list(usergroup=group), self.governor
            )
        except SlackPermanentError as exc:
            log.warning("user group %s cannot be read (%s); treating it as empty", group, exc)
            return frozenset()
        except SlackCallError as exc:
            if exc.error not in ("no_such_subteam", "subteam_not_found"):
                raise
            log.warning("user group %s does not exist (%s); treating it as empty", group, exc)
            return frozenset()
        return frozenset(str(u) for u in data.get("users") or [])
