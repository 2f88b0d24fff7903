"""Structured logs: JSON lines in production, readable lines in development.

Job events carry job_id, type, version, queue, attempt, idempotency_key, resource_key,
duration_ms and outcome as fields (``extra=``), so they survive either format.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import threading
import time
import weakref
from typing import Any, ClassVar, TextIO

from runner.config import LogConfig
from runner.store import codec, urls

_std_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
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
        out.update(fields(record))
        if record.exc_info:
            out["exc"] = urls.scrub(self.formatException(record.exc_info))
        return self.line(out)

    @staticmethod
    def line(out: dict[str, Any]) -> str:
        """The line of a record's parts."""
        # JSON escapes C0 itself; C1 controls (U+009B is an 8-bit CSI), separators and
        # bidi controls from a producer's text would reach whoever tails the log raw.
        try:
            return codec.escaped_json(codec.dumps(out))
        except TypeError:  # (a field orjson does not encode)
            return codec.escaped(str(out))

    @staticmethod
    def line_within_limits(out: dict[str, Any]) -> str:
        """line(), the same text, by the stdlib's encoder: where an allocation fails (a
        child's handler at its MEMORY_MB) it raises MemoryError, where orjson's crashes
        the process with SIGSEGV."""
        try:
            return codec.escaped_json(_std_dumps(out))
        except (TypeError, ValueError):
            return codec.escaped(str(out))


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """A record's fields (``extra=``), in the order they were set: its attributes that
    are neither LogRecord's own nor private."""
    d = record.__dict__
    own = d.keys() - _STANDARD  # (in C: most records have a few fields among 20-odd attributes)
    if not own:
        return {}
    keys = list(d)
    tail = keys[-len(own):]  # (set after the record was made, as extra= and filters do)
    return {k: d[k] for k in (tail if own.issuperset(tail) else keys) if k in own and not k.startswith("_")}


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
        extras = " ".join(f"{k}={codec.escaped(str(v))}" for k, v in fields(record).items() if v is not None)
        level = record.levelname
        if self.color:
            level = f"{self.COLORS.get(level, '')}{level:<7}\033[0m"
        line = f"{ts} {level} {record.name}: {codec.escaped(urls.scrub(record.getMessage()), keep_lines=True)}"
        if extras:
            line += f"  [{extras}]"
        if record.exc_info:
            line += "\n" + codec.escaped(urls.scrub(self.formatException(record.exc_info)), keep_lines=True)
        return line


# How long a job's echoed ctx.logger line may wait in the process's output for others to
# go with it (Output).
HOLD_S = 0.05
# The attribute that marks a record as a job's echoed line (worker/joblog.py sets it).
HELD = "_runner_held"


class Output(logging.StreamHandler[TextIO]):
    """The process's log output (its stderr), each record written as it comes but a job's
    ``ctx.logger`` line echoed here (a record marked HELD, or a line held by hold()):
    those are formatted in the thread that logged, outside the handler's lock, and held
    to be written together, at most HOLD_S later (one writer thread per process), ahead
    of any other record or write through sys.stderr or sys.stdout (Ordered), and at
    flush() (the worker's settlement, the process's exit). A process that holds none
    (setup's ``hold``: a child process) writes each at once.
    Each write was a system call under the lock that a worker's other threads, logging
    too, waited on: for ten lines a job in sixteen threads, most of a line's CPU."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._fresh()
        _outputs.add(self)

    def _fresh(self) -> None:
        self._held: list[str] = []
        self._held_lock = threading.Lock()  # only to add a line or take them all
        self._failing = False  # the last write of echoed lines failed (reported once)

    def hold(self, text: str) -> None:
        """A formatted line, to be written with the held ones (at once in a process that
        holds none: setup's ``hold``). Never raises: an echo the output does not take
        (a full disk, a reader gone) is the output's failure, not the job's."""
        if not _holding:
            with self.lock:  # type: ignore[union-attr]  # (StreamHandler's, made in __init__)
                failed = self._echo(text + self.terminator)
            if failed is not None:
                self._report(failed, text)
            return
        with self._held_lock:
            self._held.append(text)
            first = len(self._held) == 1
        if first:
            _kick()

    def handle(self, record: logging.LogRecord) -> bool:
        if not record.__dict__.get(HELD):
            return bool(super().handle(record))
        rv = self.filter(record)
        if not rv:
            return False
        if isinstance(rv, logging.LogRecord):  # (Python 3.12 on: a filter may give another)
            record = rv
        try:
            text = self.format(record)
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)
            return True
        self.hold(text)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._write(self.format(record) + self.terminator)
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        """The held lines, then the stream's buffer. Never raises (hold): the worker's
        settlement calls it between taking its jobs' log lines and writing them."""
        with self.lock:  # type: ignore[union-attr]  # (StreamHandler's, made in __init__)
            failed = self._echo("")
        if failed is not None:
            self._report(failed, "")

    def _echo(self, then: str) -> Exception | None:
        """_write, and what it raised (the lines it took are dropped: the job's own log
        has them, and an output that keeps failing must not keep them all)."""
        try:
            self._write(then)
        except RecursionError:
            raise
        except Exception as exc:
            return exc
        self._failing = False
        return None

    def _report(self, exc: Exception, text: str) -> None:
        """An echo the output did not take, reported as logging reports a handler's
        failure (handleError: a traceback on sys.stderr, which may fail as well), once
        while the output keeps failing, not once per line (a flood of tracebacks, each a
        write that fails too)."""
        if self._failing:
            return
        self._failing = True
        record = logging.makeLogRecord({"name": "runner", "levelno": logging.WARNING, "levelname": "WARNING",
                                        "msg": "a job's echoed line(s) not written to this process's output: %r "
                                               "(the job's own log keeps them; later failures are not reported "
                                               "until a write goes through)", "args": (text[:200],)})
        try:
            raise exc
        except Exception:
            with contextlib.suppress(Exception):  # (a report that fails too: nothing more to do)
                self.handleError(record)

    def _write(self, then: str) -> None:
        """The held lines, then ``then``, in one write (under the handler's lock)."""
        with self._held_lock:
            held, self._held = self._held, []
        text = "".join(h + self.terminator for h in held) + then if held else then
        if text:
            self.stream.write(text)
        self.stream.flush()


_outputs: weakref.WeakSet[Output] = weakref.WeakSet()
# Whether this process holds echoed lines to write them together (setup's ``hold``).
_holding = True
_wake = threading.Event()
_writer: threading.Thread | None = None
_writer_lock = threading.Lock()


def _kick() -> None:
    """The writer writes the held lines in HOLD_S (started at the first line held)."""
    global _writer
    if _writer is None:
        with _writer_lock:
            if _writer is None:
                _writer = threading.Thread(target=_write_held, name="runner-log-output", daemon=True)
                _writer.start()
    _wake.set()


def _write_held() -> None:
    while True:
        _wake.wait()
        time.sleep(HOLD_S)
        _wake.clear()  # (a line held from here on wakes it again; the flushes take those before)
        for out in list(_outputs):
            if out._held:
                with contextlib.suppress(Exception):  # (its stream is closed: the process is ending)
                    out.flush()


def _after_fork() -> None:
    """A forked child holds none of its parent's lines (the parent writes them) and has
    no writer thread."""
    global _wake, _writer, _writer_lock
    _wake, _writer, _writer_lock = threading.Event(), None, threading.Lock()
    for out in list(_outputs):
        out._fresh()


os.register_at_fork(after_in_child=_after_fork)


# logging's own, unpatched (an SDK that wraps them sees every record: no line skips them).
_HANDLE, _CALL_HANDLERS = logging.Logger.handle, logging.Logger.callHandlers


def plain_json(logger: logging.Logger, level: int) -> Output | None:
    """The Output a record of ``logger`` at ``level`` (enabled) would reach and nothing
    else, formatted by JsonFormatter with nothing in between (no filter, no other handler,
    logging's own Logger.handle, the logger enabled): a line for such a record may be
    made from its parts (JsonFormatter.line) and held there (Output.hold), without the
    record. None: the record must be made."""
    kind = type(logger)
    if kind.handle is not _HANDLE or kind.callHandlers is not _CALL_HANDLERS:
        return None
    c: logging.Logger | None = logger
    while c is not None:
        if c.filters or c.disabled:
            return None
        if c.handlers:
            if c.parent is not None or len(c.handlers) != 1:
                return None
            h = c.handlers[0]
            if type(h) is not Output or h.filters or level < h.level or type(h.formatter) is not JsonFormatter:
                return None
            return h
        if not c.propagate:
            return None
        c = c.parent
    return None


def flush_held() -> None:
    """Every held line written now: the worker's settlement calls it, so a job's echoed
    lines are in its output before anyone can see the job ended; and whatever else writes
    to sys.stderr or sys.stdout (Ordered), so it comes after them."""
    for h in list(_outputs):
        if h._held:
            h.flush()


class Ordered(io.TextIOBase):
    """sys.stderr or sys.stdout of a process that holds echoed lines (setup): what is
    written through it by anything but runner's Output (a handler of the application's
    own, warnings.warn, print, bytes to its ``buffer``) goes after the lines held before
    it. (Writes to the file descriptor itself, by C code or a subprocess, are not seen.)
    Everything else is the stream's own. A text stream (io.TextIOBase), as libraries check
    for: each method io.TextIOBase defines is the wrapped stream's here (else the base's
    would answer, "not supported"), and letting a wrapper go closes nothing (the base
    closes a stream it finalises)."""

    def __init__(self, real: TextIO) -> None:
        super().__init__()
        self._real = real

    def write(self, text: str) -> int:
        flush_held()
        return self._real.write(text)

    def writelines(self, lines: Any) -> None:
        flush_held()
        self._real.writelines(lines)

    def flush(self) -> None:
        flush_held()
        self._real.flush()

    @property
    def buffer(self) -> Any:
        flush_held()  # (its bytes are written next)
        return self._real.buffer

    def read(self, size: int | None = -1) -> str:
        return self._real.read(-1 if size is None else size)

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        return self._real.readline(-1 if size is None else size)

    def readlines(self, hint: int | None = -1) -> list[str]:  # type: ignore[override]
        return self._real.readlines(-1 if hint is None else hint)

    def fileno(self) -> int:
        return self._real.fileno()

    def isatty(self) -> bool:
        return self._real.isatty()

    def readable(self) -> bool:
        return self._real.readable()

    def writable(self) -> bool:
        return self._real.writable()

    def seekable(self) -> bool:
        return self._real.seekable()

    def seek(self, offset: int, whence: int = 0) -> int:
        flush_held()
        return self._real.seek(offset, whence)

    def tell(self) -> int:
        return self._real.tell()

    def truncate(self, size: int | None = None) -> int:
        flush_held()
        return self._real.truncate(size)

    def detach(self) -> Any:
        flush_held()
        return self._real.detach()  # type: ignore[attr-defined]

    def close(self) -> None:
        flush_held()
        self._real.close()

    @property
    def closed(self) -> bool:
        return self._real.closed

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._real.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self._real.errors

    @property
    def newlines(self) -> Any:  # type: ignore[override]
        return self._real.newlines

    def __del__(self) -> None:
        pass  # the stream is the process's, not this wrapper's: never closed when it goes

    def __copy__(self) -> Ordered:
        return Ordered(self._real)

    def __getattr__(self, name: str) -> Any:
        if name == "_real":  # (not set yet: copied or unpickled without __init__)
            raise AttributeError(name)
        return getattr(self._real, name)


def _unwrapped(stream: Any) -> Any:
    return stream._real if isinstance(stream, Ordered) else stream


def ordered_output() -> None:
    """sys.stderr and sys.stdout as Ordered, from here on: a process that will hold
    echoed lines (a worker) calls it before it loads the application's code, whose
    handlers take the stream they write to as they are made (setup does it too)."""
    if sys.stderr is not None and not isinstance(sys.stderr, Ordered):
        sys.stderr = Ordered(sys.stderr)
    if sys.stdout is not None and not isinstance(sys.stdout, Ordered):
        sys.stdout = Ordered(sys.stdout)


def setup(cfg: LogConfig, force_format: str | None = None, hold: bool = True) -> None:
    """The process's log output, at ``cfg``'s level and format. ``hold``: a job's echoed
    lines are held to be written together (Output); False writes each at once, with no
    writer thread: a child process, whose held lines would die with it when its handler
    kills it, and whose threads left running after a job are its handler's."""
    global _holding
    _holding = hold
    fmt = force_format or cfg.format
    real = _unwrapped(sys.stderr)
    handler = Output(real)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(real.isatty()))
    if hold:  # what else writes to the process's output comes after the lines held before it
        ordered_output()
    elif isinstance(sys.stderr, Ordered):
        sys.stderr = real
    root = logging.getLogger()
    for old in root.handlers:
        if isinstance(old, Output):
            old.flush()  # (its held lines, ahead of the new handler's)
    root.handlers[:] = [handler]
    root.setLevel(cfg.level)
