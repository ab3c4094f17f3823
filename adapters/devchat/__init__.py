"""devchat: a local web chat (channels, threads, live streaming, approval buttons, a task panel) that the bridge
talks to like any platform. The embedded default, so a bot runs with no platform account.

    adapter = create({"port": 8765, "store": "var/devchat.sqlite"}, os.environ)
    await adapter.start(bridge)   # attach, catch up, serve http://127.0.0.1:8765/
    ...
    await adapter.stop()
"""

from adapters.devchat.adapter import DevchatAdapter, create
from adapters.devchat.options import DevchatConfigError, DevchatOptions
from adapters.devchat.store import ChatStore, StoreLocked
from adapters.devchat.transport import DevchatTransport

__all__ = [
    "ChatStore",
    "DevchatAdapter",
    "DevchatConfigError",
    "DevchatOptions",
    "DevchatTransport",
    "StoreLocked",
    "create",
]
