"""Discord messages as the bridge sees them: which place, who (by the name people see), what they said
(mentions resolved, replies attributed), whether the bot was addressed. Live events and startup history go
through the same conversion, so a message gets the same request id and text either way."""

from __future__ import annotations

import logging
from collections.abc import Callable

import discord

from adapters.bridge import IncomingMessage, Place

log = logging.getLogger("adapters.discord")

PLATFORM = "discord"
DM_WORKSPACE = "@me"
HUMAN_TYPES = (
    discord.MessageType.default,
    discord.MessageType.reply,
)  # not joins, pins, thread starters (21)
QUOTE_CHARS = 80
NAME_CACHE_LIMIT = 10_000


def shorten(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def is_human(message: discord.Message, bot_id: int) -> bool:
    """A message a person typed: not the bot's own, not another bot's or a webhook's, not a system message."""
    author = message.author
    return (
        author.id != bot_id and not author.bot and message.webhook_id is None and message.type in HUMAN_TYPES
    )


class Converter:
    def __init__(
        self, client: discord.Client, *, get_guild: Callable[[int], discord.Guild | None] | None = None
    ) -> None:
        self.client = client
        # The REST client caches no guilds: the adapter looks them up in the cache of the shard serving them.
        self._get_guild = get_guild if get_guild is not None else client.get_guild
        self._names: dict[tuple[int, int], str] = {}  # (guild id, user id) -> display name (server nickname)

    # --- places ---------------------------------------------------------------------------------------------

    async def place_of(self, message: discord.Message) -> Place | None:
        """The place of a live message (the channel may have to be fetched when it is not cached)."""
        channel: object = message.channel
        if isinstance(channel, discord.PartialMessageable):
            try:
                channel = await self.client.fetch_channel(channel.id)
            except discord.HTTPException as error:
                log.warning("message %s: cannot resolve channel %s: %s", message.id, channel.id, error)
                return None
        if isinstance(channel, discord.Thread):
            return Place(PLATFORM, str(channel.guild.id), str(channel.parent_id), thread=str(channel.id))
        if isinstance(channel, (discord.DMChannel, discord.GroupChannel)):
            return Place(PLATFORM, DM_WORKSPACE, str(channel.id))
        if isinstance(channel, discord.abc.GuildChannel):
            return Place(PLATFORM, str(channel.guild.id), str(channel.id))
        return None

    # --- names ----------------------------------------------------------------------------------------------

    def remember(self, message: discord.Message) -> None:
        """Live messages carry the author's member record (with the server nickname): keep the name."""
        author = message.author
        if isinstance(author, discord.Member):
            self._store(author.guild.id, author.id, author.display_name)

    def _store(self, guild_id: int, user_id: int, name: str) -> None:
        if len(self._names) >= NAME_CACHE_LIMIT:
            self._names.clear()
        self._names[(guild_id, user_id)] = name

    def cached_name(self, guild_id: int | None, user: discord.abc.User) -> str:
        if isinstance(user, discord.Member):
            return user.display_name
        if guild_id is not None:
            found = self._names.get((guild_id, user.id))
            if found is not None:
                return found
        return user.display_name

    async def name_of(self, guild_id: int | None, user: discord.abc.User) -> str:
        """The name people see in that server: nickname, else global name, else username. History messages
        carry no member record, so the nickname is fetched once per user and cached."""
        if isinstance(user, discord.Member) or guild_id is None:
            return self.cached_name(guild_id, user)
        found = self._names.get((guild_id, user.id))
        if found is not None:
            return found
        name = user.display_name
        guild = self._get_guild(guild_id)
        member = guild.get_member(user.id) if guild is not None else None
        if member is not None:
            name = member.display_name
        else:
            try:
                fetched = await (guild or await self.client.fetch_guild(guild_id)).fetch_member(user.id)
                name = fetched.display_name
            except discord.HTTPException:
                pass  # left the server, or no access: the account's own name will do
        self._store(guild_id, user.id, name)
        return name

    # --- messages -------------------------------------------------------------------------------------------

    async def convert(self, message: discord.Message, place: Place, bot_id: int) -> IncomingMessage | None:
        if not is_human(message, bot_id):
            return None
        text = message.clean_content.strip()
        attachments = [f"[attachment: {a.filename}]" for a in message.attachments]
        if attachments:
            text = "\n".join([text, *attachments]).strip()
        if not text:
            return None  # a sticker, or text Discord withheld (no MESSAGE_CONTENT): nothing to read
        guild_id = None if place.workspace == DM_WORKSPACE else int(place.workspace)
        reply_to: str | None = None
        reference = message.reference
        if (
            reference is not None
            and reference.message_id is not None
            and message.type is discord.MessageType.reply
        ):
            reply_to = str(reference.message_id)
            text = f"{self._reply_prefix(guild_id, reference.resolved)} {text}"
        return IncomingMessage(
            place=place,
            message_id=str(message.id),
            user_id=str(message.author.id),
            user_name=await self.name_of(guild_id, message.author),
            text=text,
            mentions_bot=self._mentions_bot(message, bot_id),
            is_dm=place.workspace == DM_WORKSPACE,
            reply_to=reply_to,
        )

    def _reply_prefix(
        self, guild_id: int | None, resolved: discord.Message | discord.DeletedReferencedMessage | None
    ) -> str:
        if isinstance(resolved, discord.Message):
            name = self.cached_name(guild_id, resolved.author)
            quote = shorten(resolved.clean_content, QUOTE_CHARS)
            return f'(replying to {name}: "{quote}")' if quote else f"(replying to {name})"
        return "(replying to an earlier message)"

    @staticmethod
    def _mentions_bot(message: discord.Message, bot_id: int) -> bool:
        if any(user.id == bot_id for user in message.mentions):
            return True  # an @mention, or a reply to the bot that pings it
        replied = message.reference.resolved if message.reference is not None else None
        if isinstance(replied, discord.Message) and replied.author.id == bot_id:
            return True  # a reply to the bot with the ping switched off still talks to it
        return any(
            role.is_bot_managed() and role.tags is not None and role.tags.bot_id == bot_id
            for role in message.role_mentions
        )  # @ the bot's own integration role
