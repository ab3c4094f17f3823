"""The platform bridge: places to conversations, exactly-once intake, reconciled delivery, streaming,
approval gates and scheduling, shared by the Slack, Discord and devchat adapters."""

from adapters.bridge.approvals import ApprovalPolicy, ClickOrigin, Decision
from adapters.bridge.bridge import Bridge
from adapters.bridge.delivery import is_reply_key
from adapters.bridge.docs import ApprovalDoc, MessageDoc, PlaceDoc, PlaceOfDoc, ReplyDoc
from adapters.bridge.governor import RateGovernor
from adapters.bridge.ingress import Ingress, IngressPayloadError, IngressRecordLike
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
from adapters.bridge.partitions import partition_of_gate, partition_of_place
from adapters.bridge.router import Router
from adapters.bridge.surface import BridgeLike
from adapters.bridge.text import split_text
from adapters.bridge.transport import GateView, Transport

__all__ = [
    "ApprovalDoc",
    "ApprovalPolicy",
    "Bridge",
    "BridgeConfig",
    "BridgeLike",
    "ChannelPolicy",
    "ClickOrigin",
    "Decision",
    "DeleteRefused",
    "EditExpired",
    "GateView",
    "IncomingMessage",
    "Ingress",
    "IngressPayloadError",
    "IngressRecordLike",
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
    "Router",
    "Transport",
    "TransportError",
    "is_reply_key",
    "may_hold_surrogates",
    "partition_of_gate",
    "partition_of_place",
    "split_text",
    "valid_payload",
    "valid_text",
]
