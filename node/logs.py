"""Structured logs for the daemon modes: one JSON object per line, with the `extra` fields of each call."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Format a record as JSON: time, level, logger, message, and every extra field."""

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as one JSON line."""
        body: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        body.update({k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str)


def configure_logging(level: int = logging.INFO, path: Path | None = None) -> None:
    """Send every log record to stderr (or to the file at path) as JSON lines, replacing earlier handlers."""
    handler: logging.Handler = logging.FileHandler(path) if path else logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("urllib3", "web3.providers", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
