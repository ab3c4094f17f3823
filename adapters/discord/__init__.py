"""Discord adapter (discord.py). `adapters.discord.testing` holds the loopback fake Discord used in tests."""
