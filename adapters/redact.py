"""Keeping secrets out of what is printed and logged.

Rules (README "Security"): a URL is shown without its user:password, with every query value and fragment
replaced by `***`, and with the secret path segments of the URLs that carry one (Discord interaction and webhook
tokens, Slack incoming webhooks) replaced too. Token-shaped text (Slack `xox…-`/`xapp-` tokens, Discord bot
tokens, `Bearer …`) is replaced wherever it appears. `install_log_redaction()` applies `redact_text` to every log
record the process creates (its message and its traceback), whichever library logs it: httpx and aiohttp log
request URLs, slack_sdk and discord.py log URLs carrying tickets and interaction tokens at DEBUG.
"""

from __future__ import annotations

import logging
import re
import traceback
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

MASK = "***"

# The userinfo of a URL: everything from the scheme to the first '@' before any '/' (a Discord path such as
# /messages/@original is not userinfo).
_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@]*@")
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>`]+")
_TOKENS = (  # group 1 is kept (says what kind of secret was there), the rest is masked
    re.compile(r"\b(xox[a-z]\.xox[a-z]-)[A-Za-z0-9-]+"),  # Slack rotating tokens (xoxe.xoxp-...)
    re.compile(r"\b(xox[a-z]-)[A-Za-z0-9-]{6,}"),  # Slack bot, user, app-config tokens
    re.compile(r"\b(xapp-)[A-Za-z0-9-]{6,}"),  # Slack app-level tokens
    re.compile(r"\b()[A-Za-z0-9_-]{23,28}\.[A-Za-z0-9_-]{6,7}\.[A-Za-z0-9_-]{27,45}\b"),  # Discord bot tokens
    re.compile(r"(?i)\b(bearer |bot )[A-Za-z0-9._~+/=-]{16,}"),  # Authorization header values
    # a secret query value outside a full URL (a request line such as `GET /?token=...` has no scheme)
    re.compile(r"(?i)([?&](?:[a-z_]*token|ticket|password|secret|sig|signature|key|api_key)=)[^&\s'\"#]+"),
    # a secret field in a dumped payload, e.g. discord.py's DEBUG dump of INTERACTION_CREATE ('token': '...')
    re.compile(
        r"""(?i)(['"](?:token|[a-z_]*_token|ticket|password|secret|[a-z_]*_secret)['"]\s*:\s*['"])[^'"]+"""
    ),
)
# Path segments that are secrets: /webhooks/{application or webhook id}/{token}[/...],
# /interactions/{id}/{token}/callback, and Slack's /services/T…/B…/{secret}.
_SECRET_PATHS = (
    re.compile(r"(/webhooks/[^/]+/)([^/?#]+)"),
    re.compile(r"(/interactions/[^/]+/)([^/?#]+)"),
    re.compile(r"(/services/[^/]+/[^/]+/)([^/?#]+)"),
)


def redact_url(url: str) -> str:
    """`url` safe to print: no credentials, no query values, no fragment, no token in its path. Text that does
    not parse as a URL is returned with its token-shaped parts masked."""
    # user:password first, by text: urlsplit misreads a password holding an unencoded '#' or '?' and refuses
    # a bad port, and libpq's multi-host URLs (`postgresql://u:p@db1,db2/x`) have no single host.
    url = _USERINFO.sub(lambda m: m.group(1) + MASK + "@", url, count=1)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port urlsplit cannot read
    except ValueError:
        # Not a URL urlsplit can take apart: keep it up to its query, which may carry secrets.
        cut = re.search(r"[?#]", url)
        head = url if cut is None else url[: cut.start()]
        for pattern in _SECRET_PATHS:
            head = pattern.sub(lambda m: m.group(1) + MASK, head)
        return _mask_tokens(head if cut is None else head + "?" + MASK)
    netloc = parts.netloc
    path = parts.path
    for pattern in _SECRET_PATHS:
        path = pattern.sub(lambda m: m.group(1) + MASK, path)
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = "&".join(f"{name}={MASK}" for name, _ in pairs) if pairs else MASK
    fragment = MASK if parts.fragment else ""
    return _mask_tokens(urlunsplit((parts.scheme, netloc, path, query, fragment)))


def _mask_tokens(text: str) -> str:
    for pattern in _TOKENS:
        text = pattern.sub(lambda m: m.group(1) + MASK, text)
    return text


def redact_text(text: str) -> str:
    """`text` with every URL in it redacted (`redact_url`) and every token-shaped word masked."""
    return _mask_tokens(_URL.sub(lambda m: redact_url(m.group(0)), text))


_installed = False


def install_log_redaction() -> None:
    """Redact every log record this process creates from now on (idempotent). Done at record creation, so it
    holds for every handler and logger, including ones added later (pytest's caplog, a JSON formatter)."""
    global _installed
    if _installed:
        return
    _installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        redact_record(record)
        return record

    logging.setLogRecordFactory(factory)


def redact_record(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # a broken format string: leave it to logging's own error report
        return
    clean = redact_text(message)
    if clean != message:
        record.msg = clean
        record.args = None
    if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
        formatted = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        clean_trace = redact_text(formatted)
        if clean_trace != formatted:
            record.exc_text = clean_trace
