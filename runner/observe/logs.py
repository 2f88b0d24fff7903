"""Structured logs: JSON lines in production, readable lines in development.

Job events carry job_id, type, version, queue, attempt, idempotency_key, resource_key,
duration_ms and outcome as fields (``extra=``), so they survive either format.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, ClassVar

from runner.config import LogConfig
from runner.store import codec

# Record attributes that are not fields: the standard ones, and the ANSI-coloured copy of
# the message that uvicorn attaches to its own records.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in vars(record).items():
            if k not in _STANDARD and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return codec.dumps(out) if _jsonable(out) else str(out)


def _jsonable(obj: Any) -> bool:
    try:
        codec.dumps(obj)
        return True
    except TypeError:
        return False


class TextFormatter(logging.Formatter):
    COLORS: ClassVar[dict[str, str]] = {
        "DEBUG": "\033[2m", "INFO": "\033[36m", "WARNING": "\033[33m", "ERROR": "\033[31m",
    }

    def __init__(self, color: bool) -> None:
        super().__init__()
        self.color = color

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%H:%M:%S", time.localtime(record.created))
        extras = " ".join(
            f"{k}={v}" for k, v in vars(record).items()
            if k not in _STANDARD and not k.startswith("_") and v is not None
        )
        level = record.levelname
        if self.color:
            level = f"{self.COLORS.get(level, '')}{level:<7}\033[0m"
        line = f"{ts} {level} {record.name}: {record.getMessage()}"
        if extras:
            line += f"  [{extras}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(cfg: LogConfig, force_format: str | None = None) -> None:
    fmt = force_format or cfg.format
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(sys.stderr.isatty()))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(cfg.level)
