"""Structured logging: one JSON object per line, one line per event, naming the objects involved.

Use ``log_event(logger, "event.name", pod=..., container=...)``; fields with value None are
dropped so every line carries only what is known.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}


class JsonLineFormatter(logging.Formatter):
    """Format a record as one JSON line: time, level, logger, event, then the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in getattr(record, "fields", {}).items():
            doc[key] = value
        for key, value in record.__dict__.items():
            if key not in _RESERVED and key != "fields" and value is not None:
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, separators=(",", ":"))


def configure(level: str = "info") -> None:
    """Send all kubegpu logs to stderr as JSON lines at the given level."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event with its fields (None values omitted)."""
    if logger.isEnabledFor(level):
        # Under one key, so a field may be called anything ("name", "module"...) without clashing
        # with LogRecord's own attributes.
        logger.log(level, event, extra={"fields": {k: v for k, v in fields.items() if v is not None}})
