"""The platform bridge: places to conversations, exactly-once intake, reconciled delivery, streaming,
approval gates and scheduling, shared by the Slack, Discord and devchat adapters."""

from adapters.bridge.approvals import ApprovalPolicy, ClickOrigin, Decision
from adapters.bridge.bridge import Bridge
from adapters.bridge.delivery import is_reply_key
from adapters.bridge.docs import ApprovalDoc, MessageDoc, PlaceDoc, PlaceOfDoc, ReplyDoc
from adapters.bridge.governor import RateGovernor
from adapters.bridge.intake import IntakeResult
from adapters.bridge.model import (
    BridgeConfig,
    ChannelPolicy,
    DeleteRefused,
    EditExpired,
    IncomingMessage,
    MessageGone,
    Place,
    RetryLater,
    TransportError,
)
from adapters.bridge.outside import PayloadTooDeep, may_hold_surrogates, valid_payload, valid_text
from adapters.bridge.text import split_text
from adapters.bridge.transport import GateView, Transport

__all__ = [
    "ApprovalDoc",
    "ApprovalPolicy",
    "Bridge",
    "BridgeConfig",
    "ChannelPolicy",
    "ClickOrigin",
    "Decision",
    "DeleteRefused",
    "EditExpired",
    "GateView",
    "IncomingMessage",
    "IntakeResult",
    "MessageDoc",
    "MessageGone",
    "PayloadTooDeep",
    "Place",
    "PlaceDoc",
    "PlaceOfDoc",
    "RateGovernor",
    "ReplyDoc",
    "RetryLater",
    "Transport",
    "TransportError",
    "is_reply_key",
    "may_hold_surrogates",
    "split_text",
    "valid_payload",
    "valid_text",
]
