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
from runner.store import codec, urls

# Record attributes that are not fields: the standard ones, and the ANSI-coloured copy of
# the message that uvicorn attaches to its own records.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": urls.scrub(record.getMessage()),  # an error may quote a Redis password
        }
        for k, v in vars(record).items():
            if k not in _STANDARD and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exc"] = urls.scrub(self.formatException(record.exc_info))
        # JSON escapes C0 itself; C1 controls (U+009B is an 8-bit CSI), separators and
        # bidi controls from a producer's text would reach whoever tails the log raw.
        return codec.escaped_json(codec.dumps(out)) if _jsonable(out) else codec.escaped(str(out))


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
        # A field (an error's message) or the message may quote a producer's text: its
        # escapes are written out, so they never act on the terminal that shows the line.
        extras = " ".join(
            f"{k}={codec.escaped(str(v))}" for k, v in vars(record).items()
            if k not in _STANDARD and not k.startswith("_") and v is not None
        )
        level = record.levelname
        if self.color:
            level = f"{self.COLORS.get(level, '')}{level:<7}\033[0m"
        line = f"{ts} {level} {record.name}: {codec.escaped(urls.scrub(record.getMessage()), keep_lines=True)}"
        if extras:
            line += f"  [{extras}]"
        if record.exc_info:
            line += "\n" + codec.escaped(urls.scrub(self.formatException(record.exc_info)), keep_lines=True)
        return line


def setup(cfg: LogConfig, force_format: str | None = None) -> None:
    fmt = force_format or cfg.format
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(sys.stderr.isatty()))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(cfg.level)
