"""Diagnostics on stderr, as text (the default) or as JSON lines (`--log-format json`, `[logging] format`).

A JSON line is one object: `time` (UTC, ISO 8601 with milliseconds), `level`, `logger`, `message`, the ids in
play where there are any (`place`, `conversation`, `task`, `submission`, `platform_message`: bound with
`harness_core.log_context` by the bridge and the scheduler) and `exception` (the formatted traceback) when a
record carries one. Log collectors (journald, Loki, CloudWatch, Datadog) take it as is.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import Any, Literal

from adapters.redact import install_log_redaction, redact_text
from harness_core import log_ids

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LogFormat = Literal["text", "json"]


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        when = dt.datetime.fromtimestamp(record.created, tz=dt.UTC)
        line: dict[str, Any] = {
            "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(log_ids())
        if record.exc_info:
            # The redacted traceback the log-record factory left in exc_text (formatting exc_info afresh would
            # bring back any credential URL an exception message quotes).
            line["exception"] = redact_text(record.exc_text or self.formatException(record.exc_info))
        return json.dumps(line, ensure_ascii=False, default=str)


def setup_logging(level: str, log_format: LogFormat = "text") -> None:
    """(Re)configure the root logger: one stderr handler in the chosen format."""
    install_log_redaction()  # no URL credentials, query values or tokens in any log line, at any level
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level))
