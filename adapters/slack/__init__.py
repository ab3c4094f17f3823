"""Slack adapter: Socket Mode or HTTP Events API intake (commit, then ack), metadata-reconciled delivery with
native streaming in threads, Block Kit approval buttons. ``adapters.slack.testing`` holds a loopback fake Slack.

    adapter = create(config["adapters"]["slack"], os.environ)   # secrets only from the environment
    await adapter.start(bridge)                                  # attach, auth.test, catch up, start intake
    ...
    await adapter.stop()
"""

from adapters.slack.adapter import SlackAdapter, create
from adapters.slack.config import SlackConfigError, SlackOptions, SlackSecrets
from adapters.slack.payloads import signature_valid
from adapters.slack.transport import REPLY_EVENT, SlackTransport

__all__ = [
    "REPLY_EVENT",
    "SlackAdapter",
    "SlackConfigError",
    "SlackOptions",
    "SlackSecrets",
    "SlackTransport",
    "create",
    "signature_valid",
]
