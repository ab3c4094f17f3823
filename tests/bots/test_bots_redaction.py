"""`adapters.redact`: what is printed or logged never carries URL credentials, query values, tokens in URL paths
or token-shaped text (the rules are in the README's "Security" section)."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.redact import install_log_redaction, redact_text, redact_url

SECRET = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=8, max_size=40
)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "https://u:p4ss@deploy.example:8443/hook?token=abc&x=1#f",
            "https://***@deploy.example:8443/hook?token=***&x=***#***",
        ),
        (
            "https://discord.com/api/v10/webhooks/123/aW50ZXJ/messages/@original",
            "https://discord.com/api/v10/webhooks/123/***/messages/@original",
        ),
        (
            "https://discord.com/api/v10/interactions/55/aW50ZXJ/callback",
            "https://discord.com/api/v10/interactions/55/***/callback",
        ),
        ("https://hooks.slack.com/services/T0/B0/XXXXSECRET", "https://hooks.slack.com/services/T0/B0/***"),
        (
            "wss://wss-primary.slack.com/link/?ticket=abc-123&app_id=A1",
            "wss://wss-primary.slack.com/link/?ticket=***&app_id=***",
        ),
        ("http://127.0.0.1:8765/", "http://127.0.0.1:8765/"),
    ],
)
def test_urls_are_shown_without_their_secrets(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_token_shaped_text_is_masked_wherever_it_appears() -> None:
    text = (
        "bot xoxb-1234-5678-abcdefgh user xoxe.xoxp-1-abcdefgh app xapp-1-A1-2233 discord "
        "MTA1MjM0NTY3ODkwMTIzNDU2Nzg5.GaBcDe.abcdefghijklmnopqrstuvwxyz0123 header Bearer abcdefghijklmnopqrstu "
        "payload {'token': 'aW50ZXJhY3Rpb24'}"
    )
    assert redact_text(text) == (
        "bot xoxb-*** user xoxe.xoxp-*** app xapp-*** discord *** header Bearer *** payload {'token': '***'}"
    )


@settings(max_examples=150, deadline=None)
@given(
    user=SECRET,
    password=SECRET,
    value=SECRET,
    name=st.sampled_from(["token", "key", "sig", "ticket", "x"]),
    path=st.lists(st.text(alphabet="abc-_", min_size=1, max_size=6), max_size=3),
)
def test_no_credential_or_query_value_survives(
    user: str, password: str, value: str, name: str, path: list[str]
) -> None:
    url = f"https://{user}:{password}@example.test/{'/'.join(path)}?{name}={value}"
    for shown in (redact_url(url), redact_text(f"POST {url} failed")):
        assert user not in shown and password not in shown and value not in shown
        assert "example.test" in shown


def test_log_records_are_redacted_for_every_logger_and_traceback(caplog: pytest.LogCaptureFixture) -> None:
    install_log_redaction()
    caplog.set_level(logging.DEBUG)
    try:
        raise RuntimeError("POST https://a:b@h.test/x?token=t0psecret failed")
    except RuntimeError:
        logging.getLogger("httpx").exception("request %s", "https://h.test/?ticket=t1cket")
    logging.getLogger("some.library.deep").debug(
        "Authorization: Bot %s", "MTA1MjM0NTY3ODkwMTIzNDU2Nzg5.GaBcDe.abcdefghijklmnopqrstuvwxyz0123"
    )
    assert "t0psecret" not in caplog.text and "t1cket" not in caplog.text and "GaBcDe" not in caplog.text
    assert "ticket=***" in caplog.text and "token=***" in caplog.text


def test_console_lines_are_redacted() -> None:
    import io

    from bots.runtime import Console

    out = io.StringIO()
    Console(out).say(
        "durable-bots: the storage failed (lost: postgresql://bot:hunter2@db.internal/ops?sslkey=k)"
    )
    assert "hunter2" not in out.getvalue() and "postgresql://***@db.internal/ops?sslkey=***" in out.getvalue()


def test_json_log_lines_are_redacted_in_message_and_traceback() -> None:
    """`--log-format json` formats the traceback itself: it must use the redacted one, not re-format it."""
    import json

    from bots.logs import JsonLines

    install_log_redaction()
    try:
        raise RuntimeError("cannot reach postgresql://bot:hunter2@db.internal/ops")
    except RuntimeError:
        import sys

        record = logging.getLogger("bots").makeRecord(
            "bots",
            logging.ERROR,
            __file__,
            1,
            "lost %s",
            ("postgresql://bot:hunter2@db.internal/ops",),
            sys.exc_info(),
        )
    line = json.loads(JsonLines().format(record))
    assert "hunter2" not in line["message"] and "postgresql://***@db.internal/ops" in line["message"]
    assert "hunter2" not in line["exception"] and "RuntimeError" in line["exception"]


def test_json_log_lines_redact_the_traceback() -> None:
    """`--log-format json` formats the exception itself: it must not bypass the redaction the text format gets."""
    import io
    import json

    from bots.logs import JsonLines

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonLines())
    logger = logging.getLogger("tests.redaction.json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise RuntimeError("POST https://deploy:hunter2@h.test/x?token=t0psecret failed")
        except RuntimeError:
            logger.exception("deploy failed")
    finally:
        logger.removeHandler(handler)
    line = json.loads(out.getvalue())
    assert "hunter2" not in line["exception"] and "t0psecret" not in line["exception"]
    assert "https://***@h.test/x?token=***" in line["exception"]


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://bot:hunter2@db1:5432,db2:5432/ops?sslpassword=t0psecret",  # libpq multi-host (standby)
        "https://deploy:hunter2@deploy.example:99999/hook?token=t0psecret",  # port out of range
        "https://deploy:hunter2#x@deploy.example/hook?token=t0psecret",  # unencoded '#' in the password
        "https://deploy:hunter2?x@deploy.example/hook?token=t0psecret",  # unencoded '?' in the password
    ],
)
def test_urls_urlsplit_cannot_take_apart_still_lose_their_secrets(url: str) -> None:
    for shown in (redact_url(url), redact_text(f"connect to {url} failed")):
        assert "hunter2" not in shown and "t0psecret" not in shown, shown


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://deploy:hunter2@deploy.example:8443/hook?token=t0psecret", "https://deploy.example:8443"),
        ("https://deploy:hunter2#x@deploy.example/hook", "https://deploy.example"),  # unencoded '#'
        ("https://deploy:hunter2@deploy.example:99999/hook", "https://deploy.example:99999"),  # bad port
    ],
)
def test_doctor_names_a_url_by_its_origin_even_when_urlsplit_cannot_read_it(url: str, shown: str) -> None:
    """doctor's origin() raised ValueError on these (a crash quoting part of the password), or showed a
    username as the host."""
    from bots.doctor import origin

    assert origin(url) == shown


def test_secret_query_values_in_relative_request_lines_are_masked() -> None:
    """A request line (aiohttp's parse errors and DEBUG lines quote it) has no scheme, so it is not a URL to
    redact: `?token=` (devchat's first visit) and the like are masked anyway."""
    shown = redact_text(
        "Error handling request: GET /?token=t0k3n-for-devchat-tests&x=1 HTTP/1.1; /ws?ticket=abc123"
    )
    assert "t0k3n" not in shown and "abc123" not in shown
    assert "/?token=***&x=1" in shown and "/ws?ticket=***" in shown  # other values stay readable
