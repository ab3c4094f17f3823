"""A tiny discord.py bot run as a subprocess by test_fake_discord.py (the tests SIGKILL it).

Reads DISCORD_API_URL, DISCORD_GATEWAY_URL, DISCORD_BOT_TOKEN, CHANNEL_ID, NONCE from the environment. On
ready it sends one message with that nonce (enforce_nonce, as discord.py always does), prints what Discord
answered, and stays connected until killed.
"""

from __future__ import annotations

import asyncio
import os

import discord

from adapters.discord._endpoints import override_endpoints


class Sender(discord.Client):
    async def on_ready(self) -> None:
        channel = self.get_channel(int(os.environ["CHANNEL_ID"]))
        assert isinstance(channel, discord.TextChannel)
        sent = await channel.send("hello from the bot process", nonce=os.environ["NONCE"])
        print(f"sent {sent.id}", flush=True)


async def main() -> None:
    override_endpoints(os.environ["DISCORD_API_URL"], os.environ["DISCORD_GATEWAY_URL"])
    client = Sender(intents=discord.Intents.default(), guild_ready_timeout=0.05)
    await client.start(os.environ["DISCORD_BOT_TOKEN"])


if __name__ == "__main__":
    asyncio.run(main())
