"""Provider error classification shared by the HTTP providers.

Every provider failure ends a stream as an `ErrorInfo`; this module decides its flags:

| failure                                                     | retryable | overflow |
|-------------------------------------------------------------|-----------|----------|
| HTTP 408, 409, 429 (except `insufficient_quota`), 5xx, 529  | yes       | no       |
| an "overloaded" error (status, type or error event)         | yes       | no       |
| connect / read / write errors, timeouts, peer closing early | yes       | no       |
| a stream that ends before the provider's final event        | yes       | no       |
| context overflow (per-provider codes and known wording)     | no        | yes      |
| malformed SSE line, unparsable event JSON                   | no        | no       |
| anything else (400, 401, 403, 404, ...)                     | no        | no       |

Overflow wins over retryable (llama.cpp reports an overflow with status 500; retrying cannot help) and is never
inferred from a 429. `retry-after-ms` (milliseconds) and `retry-after` (seconds or an HTTP date) become
`retry_after_ms`. Messages carry the provider's own error text, with any secret (the API key) masked.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from harness_core.messages import ErrorInfo

from ._sse import excerpt

RETRYABLE_STATUS = frozenset({408, 409, 429})
_NON_RETRYABLE_CODES = frozenset({"insufficient_quota", "billing_error", "invalid_api_key"})

# Wording used by OpenAI, Anthropic and OpenAI-compatible servers (vLLM, llama.cpp, Ollama, LM Studio,
# Mistral, Groq, OpenRouter, xAI, Gemini's compatibility layer) when the prompt does not fit.
_OVERFLOW_PATTERNS = [
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        r"context[_ ]length[_ ]exceeded",
        r"maximum context length",
        r"context (?:length|size|window|limit)[^.\n]{0,60}(?:exceed|too (?:long|large|many))",
        r"exceed\w*[^.\n]{0,40}\bcontext\b",
        r"too many tokens",
        r"(?:prompt|input) (?:is )?too long",
        r"longer than the maximum model length",
        r"maximum prompt length",
        r"reduce the length of the messages",
        r"input token count[^.\n]{0,40}exceeds",
    )
]


def looks_like_overflow(text: str) -> bool:
    return any(pattern.search(text) for pattern in _OVERFLOW_PATTERNS)


@dataclass(frozen=True, slots=True)
class ProviderError:
    """What an error body or error event said, provider-neutral."""

    message: str
    type: str | None = None
    code: str | None = None


def _text(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def parse_error_payload(payload: Any) -> ProviderError | None:
    """Read the error out of the JSON shapes providers use.

    OpenAI / llama.cpp / Ollama: `{"error": {"message", "type", "code"}}`; Anthropic:
    `{"type": "error", "error": {"type", "message"}}`; vLLM: `{"object": "error", "message", "type", "code"}`;
    some proxies: `{"error": "text"}` or FastAPI's `{"detail": ...}`.
    """
    if not isinstance(payload, dict):
        return None
    inner = payload.get("error")
    if isinstance(inner, dict):
        message = _text(inner.get("message")) or _text(inner.get("msg")) or json.dumps(inner)[:500]
        return ProviderError(message, _text(inner.get("type")), _text(inner.get("code")))
    if isinstance(inner, str) and inner.strip():
        return ProviderError(inner.strip(), None, _text(payload.get("code")))
    if payload.get("object") == "error" or "message" in payload:
        top = _text(payload.get("message"))
        if top:
            return ProviderError(top, _text(payload.get("type")), _text(payload.get("code")))
    detail = payload.get("detail")
    if detail is not None:
        text = _text(detail) or json.dumps(detail)[:500]
        return ProviderError(text)
    return None


def parse_error_body(body: str) -> ProviderError:
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    parsed = parse_error_payload(payload)
    if parsed is not None:
        return parsed
    return ProviderError(excerpt(body, 500) if body.strip() else "(empty response body)")


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> int | None:
    """`retry-after-ms`, else `retry-after` (delta seconds or an HTTP date), as milliseconds."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            value = float(raw_ms)
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return math.ceil(value)
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        current = time.time() if now is None else now
        return max(0, math.ceil((when.timestamp() - current) * 1000))
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return math.ceil(seconds * 1000)


def redact(text: str, secrets: Iterable[str | None]) -> str:
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


class Classifier:
    """Builds `ErrorInfo`s for one provider. `overflow_codes` are error types/codes meaning context overflow."""

    def __init__(
        self, provider: str, *, overflow_codes: Iterable[str] = (), secrets: Iterable[str | None] = ()
    ):
        self.provider = provider
        self._overflow_codes = frozenset(overflow_codes)
        self._secrets = [s for s in secrets if s]

    def _info(
        self,
        message: str,
        *,
        retryable: bool,
        overflow: bool = False,
        retry_after_ms: int | None = None,
        status: int | None = None,
    ) -> ErrorInfo:
        return ErrorInfo(
            message=redact(f"{self.provider}: {message}", self._secrets),
            retryable=retryable and not overflow,
            overflow=overflow,
            retry_after_ms=retry_after_ms,
            status=status,
        )

    def is_overflow(self, error: ProviderError, status: int | None) -> bool:
        if status == 429:
            return False
        if status == 413:
            return True
        if error.type in self._overflow_codes or error.code in self._overflow_codes:
            return True
        return looks_like_overflow(error.message)

    @staticmethod
    def _overloaded(error: ProviderError) -> bool:
        markers = f"{error.type or ''} {error.code or ''}".lower()
        return "overloaded" in markers or "overloaded" in error.message.lower()

    def http_error(self, status: int, headers: Mapping[str, str], body: str) -> ErrorInfo:
        """An error response (status >= 400) before any event."""
        error = parse_error_body(body)
        overflow = self.is_overflow(error, status)
        quota = error.type in _NON_RETRYABLE_CODES or error.code in _NON_RETRYABLE_CODES
        retryable = (status in RETRYABLE_STATUS or status >= 500 or self._overloaded(error)) and not quota
        label = " ".join(part for part in (error.type, error.code) if part and part != str(status))
        prefix = f"HTTP {status}" + (f" {label}" if label else "")
        return self._info(
            f"{prefix}: {error.message}",
            retryable=retryable,
            overflow=overflow,
            retry_after_ms=parse_retry_after(headers),
            status=status,
        )

    def event_error(
        self, error: ProviderError, *, status: int | None = None, retryable_types: Iterable[str] = ()
    ) -> ErrorInfo:
        """An error reported inside a 200 event stream."""
        overflow = self.is_overflow(error, status)
        retry_types = frozenset(retryable_types)
        retryable = (
            self._overloaded(error)
            or error.type in retry_types
            or error.code in retry_types
            or (status is not None and (status in RETRYABLE_STATUS or status >= 500))
        )
        label = " ".join(part for part in (error.type, error.code) if part)
        return self._info(
            f"stream error{f' {label}' if label else ''}: {error.message}",
            retryable=retryable,
            overflow=overflow,
            status=status,
        )

    def transport_error(self, exc: httpx.HTTPError, *, mid_stream: bool) -> ErrorInfo:
        where = "mid-stream" if mid_stream else "before the response"
        detail = str(exc) or type(exc).__name__
        if isinstance(exc, httpx.TimeoutException):
            return self._info(f"timed out {where} ({type(exc).__name__}: {detail})", retryable=True)
        if isinstance(exc, httpx.TransportError) and isinstance(
            exc, httpx.NetworkError | httpx.RemoteProtocolError | httpx.ProxyError
        ):
            return self._info(f"connection failed {where} ({type(exc).__name__}: {detail})", retryable=True)
        return self._info(f"HTTP client error {where} ({type(exc).__name__}: {detail})", retryable=False)

    def stream_cut(self) -> ErrorInfo:
        return self._info(
            "the response stream ended before the provider's final event (stream cut mid-way)", retryable=True
        )

    def format_error(self, exc: Exception) -> ErrorInfo:
        return self._info(f"unreadable response stream: {exc}", retryable=False)

    def plain(self, message: str, *, retryable: bool = False, status: int | None = None) -> ErrorInfo:
        return self._info(message, retryable=retryable, status=status)
