"""A run's own log: the lines its handler logged through ``ctx.logger`` (and, in a child
process, wrote to stdout and stderr), held in memory within the job's bounds until the
settler sends them with the run's settlement (store/joblogs.py keeps them in Redis).

A run that logs nothing creates no buffer and sends nothing. A flood is cut here: the
buffer keeps only the newest lines within ``[retention] logs``, so a handler writing a
gigabyte costs the worker CPU, never memory, and Redis gets at most one bounded write.
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
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import FrameType
from typing import Any

from runner.observe.logs import HELD, JsonFormatter, plain_json
from runner.store.codec import shown_text
from runner.store.urls import scrub

# One line is cut to this many characters (a bound of its own: a single huge line
# would otherwise push every other line out of the byte budget).
MAX_LINE_CHARS = 8192
# A child process hands each of its handler's lines (and ctx.stream's chunks) to the worker
# as it comes, before the handler goes past it (a child that dies then, killed or crashed,
# has lost none), up to SINK_BURST of them within SINK_EVERY_S; past that (a flood), the
# rest wait, bounded there, for the next line after that while, a worker's ask or the end.
SINK_EVERY_S = 0.5
SINK_BURST = 200
# ctx.stream's output is kept within these bounds (the newest chunks) for a late reader.
STREAM_CHUNKS = 10_000
STREAM_BYTES = 1_048_576
# One chunk's bound, encoded: the bytes bound trims old chunks, never the newest, so one
# huge chunk would be kept (and served to every reader) whole.
STREAM_CHUNK_BYTES = 65_536
# Stands for the count in a log's dropped-lines marker (lua/joblog.lua puts it in).
LOST = "#LOST#"


# The Redis server's clock less this host's, in ms, as the last claim said: a line's and a
# chunk's time is the server's, as every time a user sees (a worker host hours off showed
# its lines hours off). Set by the fetcher at each claim, in a child from its job's message.
_skew_ms = 0


def set_server_now(server_ms: int) -> None:
    """This host's clock against the server's: ``server_ms`` is the server's time now."""
    global _skew_ms
    _skew_ms = int(server_ms) - int(time.time() * 1000)


def skew_ms() -> int:
    """The server's clock less this host's, in ms (for a child, which shares the host's
    clock: a server time sent to it would age by its start-up before it read it)."""
    return _skew_ms


def set_skew(ms: int) -> None:
    global _skew_ms
    _skew_ms = int(ms)


def server_ms() -> int:
    """Now, by the server's clock (this host's, corrected by the last claim's)."""
    return int(time.time() * 1000) + _skew_ms


def line(level: str, msg: str, source: str = "log", ts_ms: int | None = None) -> str:
    """One log line as it is kept: a JSON object with its time (ms, the server's clock as
    the last claim said it), level, source (log, stdout or stderr) and message.

    Built as text around each string's JSON (what json.dumps writes for the object, key
    order and spacing too: lua/joblog.lua reads ``{"ts": N, "level": ...`` at a line's
    head): a line is built per ctx.logger call, and the dict and encoder cost more than
    the rest of its capture."""
    if len(msg) > MAX_LINE_CHARS:
        msg = f"{msg[:MAX_LINE_CHARS]}... [{len(msg) - MAX_LINE_CHARS:,} characters cut]"
    ts = server_ms() if ts_ms is None else ts_ms
    head = _HEADS.get((level, source))
    if head is None:
        head = _HEADS[(level, source)] = f', "level": {_quoted(level)}, "src": {_quoted(source)}, "msg": '
    return shown_text(f'{{"ts": {int(ts)}{head}{_quoted(msg)}}}')


# (level, source) -> the part of a line between its time and its message.
_HEADS: dict[tuple[str, str], str] = {}
# A string as json.dumps(..., ensure_ascii=False) writes it (the C encoder).
_quoted: Callable[[str], str] = json.encoder.encode_basestring


class JobLog:
    """The newest lines of one run within its bounds, and which of them are not sent yet."""

    __slots__ = ("dropped", "lines", "lock", "max_bytes", "max_lines", "size", "taken", "unsent")

    def __init__(self, max_lines: int, max_bytes: int) -> None:
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self.lines: deque[str] = deque()
        self.size = 0
        self.unsent = 0  # the newest this many lines are not in Redis yet
        # Lines lost before they were sent (pushed out by newer ones here, or in a child
        # before they reached this worker), since the last send: the write passes the
        # count on, and the log's marker (lua/joblog.lua) adds it to those Redis trimmed.
        self.dropped = 0
        self.taken = (0, 0)  # what the last take took (lines, dropped), for put_back
        # The handler's thread adds while the renewer (live lines) or the settler takes.
        self.lock = threading.Lock()

    def add(self, encoded: str) -> None:
        with self.lock:
            self._add(encoded)

    def _add(self, encoded: str) -> None:
        self.lines.append(encoded)
        self.size += len(encoded)
        self.unsent += 1
        while len(self.lines) > self.max_lines or (self.size > self.max_bytes and len(self.lines) > 1):
            self.size -= len(self.lines.popleft())
            if self.unsent > len(self.lines):
                self.unsent -= 1
                self.dropped += 1

    def extend(self, encoded: Iterable[str], dropped: int = 0) -> None:
        """Lines to keep; ``dropped``: how many older ones were lost before they got here
        (a child's flood)."""
        with self.lock:
            self.dropped += max(0, dropped)
            for one in encoded:
                self._add(one)

    def take(self) -> list[str]:
        """The lines not sent yet, oldest first; they count as sent from here."""
        return self.take_counted()[0]

    def take_counted(self) -> tuple[list[str], int]:
        """take(), and how many lines were lost unsent ahead of them (for the marker)."""
        with self.lock:
            if not self.unsent and not self.dropped:
                return [], 0
            out = list(self.lines)[len(self.lines) - self.unsent:]
            dropped = self.dropped
            self.taken = (self.unsent, dropped)
            self.unsent, self.dropped = 0, 0
        return out, dropped

    def put_back(self) -> None:
        """The last take's lines did not reach Redis: they count as not sent again, ahead
        of any added since, within the bounds (those pushed out meanwhile count as
        dropped, so the next write's marker says so)."""
        with self.lock:
            n, dropped = self.taken
            self.taken = (0, 0)
            back = min(n, len(self.lines) - self.unsent)
            self.unsent += back
            self.dropped += dropped + n - back

    def pending(self) -> bool:
        return bool(self.unsent or self.dropped)


def marker(max_lines: int, max_bytes: int) -> str:
    """The line at the head of a log that lost lines, as lua/joblog.lua writes it: LOST
    stands for the count, which only the script knows (it trims the lines sent before)."""
    return line("WARNING", f"[{LOST} earlier line(s) dropped: a job's log keeps its newest "
                           f"{max_lines:,} lines and {max_bytes:,} bytes]", "runner")


class JobLogger(logging.LoggerAdapter[logging.Logger]):
    """``ctx.logger``: logs as before, and keeps each line at INFO or above (DEBUG too when
    the logger is enabled for it) in the run's JobLog, made at its first line."""

    # Defaults as class attributes, set on the instance when they change: one is made for
    # every job, and most jobs log nothing (each attribute set in __init__ cost them all).
    buf: JobLog | None = None
    # In a child process: where its lines go while it runs (to the worker, which sends
    # them on with the lease renewal), as they come (SINK_BURST), with how many were lost
    # here before them (the worker's marker counts them too), and the lock held around a
    # take and its send (the channel's: lines taken by two threads go in the order they
    # were taken).
    sink: Callable[[list[str], list[str], int], None] | None = None
    sink_lock: threading.Lock | None = None
    # A child's lines held back past SINK_BURST are copied here too, where its worker
    # finds them should the child die before it sends them (spill.py).
    spill: Any = None
    _sunk = 0.0  # when the current SINK_EVERY_S began
    _sunk_n = 0  # lines and chunks handed on since then
    chunks: JobLog | None = None  # ctx.stream's output not sent yet, made at its first chunk
    _seq = 0  # the next chunk's number: a reader's position, whatever was trimmed
    _echoed = 0  # lines and characters echoed to the worker's own log so far
    _echoed_chars = 0
    _unechoed = 0  # lines past those bounds, not echoed
    # A durable function's run that replays what an earlier run did: true until it is
    # past the recorded steps (journal.py), and its lines and chunks are dropped till
    # then (that run wrote them). None: the job had no step log at its claim.
    replaying: Callable[[], bool] | None = None
    # In a child process: its MEMORY_MB (child.MemoryCap), which a line's echo keeps
    # under too (its ``capped``: the handler runs under it).
    limits: Any = None

    def __init__(self, logger: logging.Logger, extra: dict[str, Any], max_lines: int, max_bytes: int) -> None:
        super().__init__(logger, extra)
        self.bounds = (max_lines, max_bytes)
        # Held by the renewer from taking a running job's lines until they are in Redis,
        # and by the settler while it takes the rest: the job's end is never visible
        # before lines the renewer took just ahead of it.
        self.sending = threading.Lock()

    def quiet(self) -> bool:
        """Whether what the handler writes now was written by an earlier run (a replay)."""
        return self.replaying is not None and self.replaying()

    def pending(self) -> bool:
        """Lines or chunks not sent yet."""
        return (self.buf is not None and self.buf.pending()) or (self.chunks is not None and self.chunks.pending())

    def stream(self, data: Any, send: bool = True) -> None:
        """One chunk of ctx.stream's output (text or JSON), numbered from 0. A replayed
        chunk is dropped but keeps its number, so the chunks after the replay follow those
        the earlier run wrote. ``send``: False keeps it for the caller's send_due()."""
        if self.quiet():
            self._seq += 1
            return
        attempt = (self.extra or {}).get("attempt", 0)
        try:
            chunk = json.dumps({"a": attempt, "i": self._seq, "ts": server_ms(), "data": data},
                               ensure_ascii=False, allow_nan=False)
        except ValueError:  # a reader's JSON.parse takes no NaN or Infinity
            raise TypeError("ctx.stream takes text or JSON, and NaN and Infinity are not JSON; "
                            "send them as strings or null") from None
        chunk = shown_text(chunk)  # (a lone surrogate: no JSON encoder downstream takes it)
        size = len(chunk.encode())
        if size > STREAM_CHUNK_BYTES:
            raise ValueError(f"ctx.stream: a chunk of {size:,} bytes is over the limit of {STREAM_CHUNK_BYTES:,}; "
                             "send the output in smaller pieces")
        self._seq += 1
        self.keep_chunks((chunk,), send)

    def keep_chunks(self, encoded: Iterable[str], send: bool = True) -> None:
        if self.chunks is None:
            self.chunks = JobLog(STREAM_CHUNKS, STREAM_BYTES)
        self.chunks.extend(encoded)
        if send:
            self.send_due()

    def send_due(self) -> None:
        """What was kept goes to the sink now, unless this is a flood (_due)."""
        if self.sink is not None and self._due():
            self.flush()

    def keep(self, encoded: Iterable[str], dropped: int = 0) -> None:
        """Lines already encoded (a child's, or its captured output); ``dropped``: how many
        older ones a child lost before handing these over."""
        if self.bounds[0] <= 0:
            return
        if self.buf is None:
            self.buf = JobLog(*self.bounds)
        if self.spill is not None:
            encoded = list(encoded)
        self.buf.extend(encoded, dropped)
        if self.sink is not None:
            if self._due():
                self.flush()
            elif self.spill is not None:
                for one in encoded:
                    self.spill.add(one)

    def _due(self) -> bool:
        """Whether what was just added goes to the sink now: yes, unless SINK_BURST lines
        and chunks went within this SINK_EVERY_S (a flood: the worker would decode it
        all, to keep the newest; the rest go after)."""
        now = time.monotonic()
        if now - self._sunk >= SINK_EVERY_S:
            self._sunk, self._sunk_n = now, 0
        return self._sunk_n < SINK_BURST

    def flush(self, sink: Callable[[list[str], list[str], int], None] | None = None) -> None:
        """The lines not handed on yet go to the sink (a child's, to its worker); ``sink``:
        another one, this time."""
        buf, chunks, sink = self.buf, self.chunks, sink or self.sink
        if sink is None:
            return
        with self.sink_lock or contextlib.nullcontext():
            lines: list[str] = []
            streamed: list[str] = []
            dropped = 0
            try:
                lines, dropped = buf.take_counted() if buf is not None else ([], 0)
                streamed = chunks.take() if chunks is not None else []
                if (lines or dropped) and self.spill is not None:
                    self.spill.clear()  # (before the send: a line is never read back twice)
                if lines or streamed or dropped:
                    self._sunk_n += len(lines) + len(streamed)
                    sink(lines, streamed, dropped)
            except MemoryError:
                # A child's handler at its MEMORY_MB, which a line's send does not lift
                # (child.Child.log_sink): what was taken goes with a later send (the next
                # line's, the worker's ask, the run's end).
                if buf is not None and (lines or dropped):
                    buf.put_back()
                if chunks is not None and streamed:
                    chunks.put_back()

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if self.replaying is not None and self.replaying():
            return  # (written by the run that recorded this part, to both logs)
        given = _mapping(args)
        text = message(msg, given)
        kept = encoded(self.logger, level, text, msg, given, kwargs)
        if kept is not None and self.bounds[0] > 0:  # (as keep, for one line)
            if self.buf is None:
                self.buf = JobLog(*self.bounds)
            self.buf.add(kept)
            if self.sink is not None:
                if self._due():
                    self.flush()
                elif self.spill is not None:
                    self.spill.add(kept)
            if not self.echo(kept):
                return
        within = self.limits is not None and self.limits.capped
        if not kwargs and echoed(self.logger, level, msg, given, text, self.extra, within):
            return
        super().log(level, msg, *args, **kwargs)

    def echo(self, kept: str) -> bool:
        """Whether a line kept in the job's log goes to the worker's own log too: only
        within the job log's bounds, so a flood does not go whole to the worker's output
        (a log drain); past them, echo_end says at the run's end how many are in the job's
        log only."""
        most_lines, most_chars = self.bounds
        if self._echoed < 0:
            self._unechoed += 1
            return False
        if self._echoed < most_lines and self._echoed_chars + len(kept) <= most_chars:
            self._echoed += 1
            self._echoed_chars += len(kept)
            return True
        self._echoed = -1  # nothing more is echoed; echo_end says how many were not
        self._unechoed = 1
        return False

    def echo_end(self) -> None:
        """The run ended: one line in the worker's output says how many of its lines were
        not echoed there (none: nothing is said)."""
        if self._echoed >= 0:
            return
        job_id = (self.extra or {}).get("job_id", "")
        self.logger.warning(
            "job %s: %d more ctx.logger line(s), past the bounds of its log (%d lines, %d bytes), are in "
            "its own log only (runner logs %s)", job_id, self._unechoed, *self.bounds, job_id,
            extra=dict(self.extra or {}))
        self._unechoed = 0


def _mapping(args: tuple[Any, ...]) -> Any:
    """A call's arguments as a record keeps them: logger.info("%(n)s", {"n": 1}) formats
    with the mapping itself (as logging.LogRecord does)."""
    return args[0] if len(args) == 1 and isinstance(args[0], Mapping) and args[0] else args


def message(msg: object, args: Any) -> str | None:
    """A ctx.logger call's message, as LogRecord.getMessage makes it (None: ``msg`` does
    not format with ``args``)."""
    try:
        return str(msg) % args if args else str(msg)
    except Exception:
        return None


def encoded(logger: logging.Logger, level: int, text: str | None, msg: object, args: Any,
            kwargs: dict[str, Any]) -> str | None:
    """A ctx.logger call as the job's log keeps it (``text``: its message): INFO and above
    (DEBUG too when the logger is enabled for it), else None."""
    if level < logging.INFO and not logger.isEnabledFor(level):
        return None
    if text is None:  # a bad format: keep what was given, as logging would show it
        text = f"{msg} {args!r}"
    exc = kwargs.get("exc_info")
    if exc:
        info = exc if isinstance(exc, tuple) else \
            (type(exc), exc, exc.__traceback__) if isinstance(exc, BaseException) else sys.exc_info()
        if info[0] is not None:
            text = f"{text}\n{logging.Formatter().formatException(info)}"
    return line(logging.getLevelName(level), text)


# What every record this process echoes shares: the attributes logging.LogRecord sets on
# this Python, with those of no caller, made at the first echo (again in a forked child:
# its process differs).
_base: dict[str, Any] | None = None
# A caller's code -> (pathname, filename, module, funcName), as LogRecord derives them.
_callers: dict[Any, tuple[str, str, str, str]] = {}
_NO_CALLER = ("(unknown file)", 0, "(unknown function)")


def _forget_base() -> None:
    global _base
    _base = None


os.register_at_fork(after_in_child=_forget_base)


def echoed(logger: logging.Logger, level: int, msg: object, args: Any, text: str | None,
           extra: Any, within: bool = False) -> bool:
    """A ctx.logger line echoed to the worker's own log (its handlers, filters and levels
    as logging.Logger.log would; ``text``: its message, ``args`` as _mapping gives them):
    whether it was, here (False: the caller goes through logging.Logger.log, for a record
    factory of the application's own).

    A line is echoed at every ctx.logger call, and LogRecord.__init__, Logger.findCaller
    and the formatting cost most of it. With nothing but runner's own JSON output to reach
    (logs.plain_json), the line it would write is built from the message and the fields
    and held there; otherwise the record is the one Logger.log makes (the same
    attributes, the caller being the handler's line, not this module's), made from a copy
    of one made once. ``within``: the line is made under a child's MEMORY_MB, by an
    encoder that fails with MemoryError there (it is then not echoed)."""
    global _base
    if not logger.isEnabledFor(level):
        return True
    if text is not None and (out := plain_json(logger, level)) is not None:
        now = time.time()
        fields = {"ts": round(now, 6), "level": logging.getLevelName(level).lower(), "logger": logger.name,
                  "msg": scrub(text)}
        if extra:
            fields.update(extra)
        if not within:
            out.hold(JsonFormatter.line(fields))
            return True
        # (``within`` a child's MEMORY_MB, never lifted for a line: a thread that logs
        # without a pause lifted it so often that another thread went far past it.)
        try:
            formatted = JsonFormatter.line_within_limits(fields)
        except MemoryError:  # the handler left no room: the job's log has the line, the output goes without
            return True
        out.hold(formatted)
        return True
    if logging.getLogRecordFactory() is not logging.LogRecord:
        return False
    if _base is None:
        _base = vars(logging.LogRecord("", logging.INFO, *_NO_CALLER[:2], "", (), None, _NO_CALLER[2]))
    rec = logging.LogRecord.__new__(logging.LogRecord)
    d = rec.__dict__
    d.update(_base)
    now = time.time()
    d["name"] = logger.name
    d["msg"] = msg
    d["args"] = args
    d["levelno"] = level
    d["levelname"] = logging.getLevelName(level)
    d["created"] = now
    d["msecs"] = int((now - int(now)) * 1000) + 0.0
    d["relativeCreated"] = _base["relativeCreated"] + (now - _base["created"]) * 1000
    if logging.logThreads:
        d["thread"] = threading.get_ident()
        d["threadName"] = threading.current_thread().name
    if "taskName" in d:  # (Python 3.12 on: the asyncio task that logged, if any)
        d["taskName"] = None
        aio = sys.modules.get("asyncio")
        if getattr(logging, "logAsyncioTasks", False) and aio is not None and aio._get_running_loop() is not None:
            task = aio.current_task()
            d["taskName"] = task.get_name() if task is not None else None
    if logging._srcfile is not None:  # (None: callers not looked up)
        f: FrameType | None = sys._getframe(1)
        while f is not None and f.f_code.co_filename in _SKIPPED:
            f = f.f_back
        if f is not None:
            code = f.f_code
            where = _callers.get(code)
            if where is None:
                path = code.co_filename
                name = os.path.basename(path)
                where = _callers[code] = (path, name, os.path.splitext(name)[0], code.co_name)
                if len(_callers) > 10_000:  # (code made on the fly, again and again)
                    _callers.clear()
            d["pathname"], d["filename"], d["module"], d["funcName"] = where
            d["lineno"] = f.f_lineno
    if extra:
        d.update(extra)
    d[HELD] = True  # (written with others: observe/logs.py's Output)
    logger.handle(rec)
    return True


class SharedLogger(logging.LoggerAdapter[logging.Logger]):
    """A batch's ``ctx.logger``: a line about the whole batch goes to the worker's log once
    and into the log of every member (``ctx.jobs[i].logger`` writes to one member's), so
    whoever reads any one job's log sees what its batch said."""

    def __init__(self, logger: logging.Logger, extra: dict[str, Any], members: Sequence[JobLogger]) -> None:
        super().__init__(logger, extra)
        self.members = members

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        given = _mapping(args)
        text = message(msg, given)
        kept = encoded(self.logger, level, text, msg, given, kwargs)
        if kept is not None:
            for m in self.members:
                m.keep((kept,))
            # Echoed within the first member's bounds, as its own lines are (its run's
            # end says how many were not): a batch's flood is bounded in the worker's
            # output as a single job's is.
            first = self.members[0] if self.members else None
            if first is not None and first.buf is not None and not first.echo(kept):
                return
        if not kwargs and echoed(self.logger, level, msg, given, text, self.extra):
            return
        super().log(level, msg, *args, **kwargs)


class MemberLoggers(Sequence[JobLogger]):
    """A batch's members' loggers (``ctx.jobs[i].logger``), each made at its first use: a
    member nobody logs for costs no logger (one per member made up front was about a
    seventh of a no-op batch's worker CPU per job). ``kept``: a member's logger made
    earlier (its run's, holding lines already), used as it is; ``on_made(i, logger)``
    hears of each one made here (its run sends its lines)."""

    __slots__ = ("_bounds", "_jobs", "_lock", "_logger", "_made", "_on_made", "_type")

    def __init__(self, logger: logging.Logger, type_: str, jobs: list[tuple[str, int]], bounds: tuple[int, int],
                 kept: Sequence[JobLogger | None] | None = None,
                 on_made: Callable[[int, JobLogger], None] | None = None) -> None:
        self._logger, self._type, self._jobs, self._bounds = logger, type_, jobs, bounds
        self._made: list[JobLogger | None] = list(kept) if kept is not None else [None] * len(jobs)
        self._on_made = on_made
        self._lock = threading.Lock()  # (a handler's own threads may log for the same member)

    def __len__(self) -> int:
        return len(self._jobs)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self._jobs)))]
        made = self._made[i]
        if made is not None:
            return made
        with self._lock:
            made = self._made[i]
            if made is None:
                job_id, attempt = self._jobs[i]
                made = self._made[i] = JobLogger(self._logger, {"job_id": job_id, "type": self._type,
                                                                "attempt": attempt, "batch": len(self._jobs)},
                                                 *self._bounds)
                if self._on_made is not None:
                    self._on_made(i, made)
        return made

    def made(self, i: int) -> JobLogger | None:
        """Member ``i``'s logger if one was made (None: nothing was logged for it)."""
        return self._made[i]


def batch_loggers(logger: logging.Logger, type_: str, jobs: list[tuple[str, int]], bounds: tuple[int, int],
                  kept: Sequence[JobLogger | None] | None = None,
                  on_made: Callable[[int, JobLogger], None] | None = None) -> tuple[MemberLoggers, SharedLogger]:
    """The members' loggers of a batch (its ids, attempts), each made at its first use
    (see MemberLoggers), and the batch's shared one."""
    members = MemberLoggers(logger, type_, jobs, bounds, kept, on_made)
    first = jobs[0][0] if jobs else ""
    return members, SharedLogger(logger, {"job_id": first, "type": type_, "batch": len(jobs)}, members)


class Capture(io.TextIOBase):
    """A text stream (sys.stdout or sys.stderr in a child, while its handler runs) whose
    complete lines go to the run's log.

    It stands in for the real stream, so it answers what handler code asks of one: its
    ``encoding`` and ``errors``, a ``buffer`` for bytes (decoded into the log too), and the
    real ``fileno()``, for a subprocess or faulthandler that writes to the descriptor
    (those writes go to the worker's output, not to the job's log)."""

    def __init__(self, logger: JobLogger | Callable[[], JobLogger], source: str, real: Any = None) -> None:
        super().__init__()
        # The run's logger, or what makes it at the first write (a run that writes
        # nothing makes none).
        self._logger = logger
        self.source = source
        self.real = real
        self.partial = ""
        self._cut = False  # the last write ended in a long line's chunk, kept with no newline
        self._buffer: _CapturedBytes | None = None

    @property
    def logger(self) -> JobLogger:
        got = self._logger
        if not isinstance(got, JobLogger):
            got = self._logger = got()
        return got

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self.real, "encoding", None) or "utf-8")

    @property
    def errors(self) -> str:  # type: ignore[override]
        return str(getattr(self.real, "errors", None) or "strict")

    @property
    def buffer(self) -> _CapturedBytes:
        if self._buffer is None:
            self._buffer = _CapturedBytes(self)
        return self._buffer

    @property
    def name(self) -> str:
        return str(getattr(self.real, "name", None) or f"<{self.source}>")

    @property
    def line_buffering(self) -> bool:
        return True  # lines go to the log at each newline, whatever was asked

    def reconfigure(self, *, encoding: str | None = None, errors: str | None = None, newline: str | None = None,
                    line_buffering: bool | None = None, write_through: bool | None = None) -> None:
        """Taken and let be, as the real stream's keywords: the log is kept in lines of text
        (bytes through ``buffer`` are decoded as UTF-8, bad ones replaced) however set."""

    def fileno(self) -> int:
        if self.real is None:
            raise io.UnsupportedOperation("fileno")
        return int(self.real.fileno())

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            # As a text stream does: click.echo (and typer) write b"" to find a binary
            # stream, then write bytes to ``buffer`` when this refuses them.
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if self.logger.quiet():  # a replay: the run that recorded this part wrote it
            return len(text)
        data = self.partial + text
        if self._cut and data:
            # A newline right after a long line's chunk ends that line: print writes it
            # apart, and it made an empty line of its own.
            self._cut = False
            if data[0] == "\n":
                data = data[1:]
        *whole, self.partial = data.split("\n")
        if len(self.partial) > MAX_LINE_CHARS:  # no newline for a long while: a line of its own
            whole.append(self.partial)
            self.partial = ""
            self._cut = True
        if whole:
            self.logger.keep(line("INFO", w, self.source) for w in whole)
        return len(text)

    def flush(self) -> None:
        """(Lines go on newlines; the rest at the run's end, finish.)"""

    def finish(self) -> None:
        """The run ended: its last line without a newline goes to the log too."""
        if self.partial:
            self.logger.keep((line("INFO", self.partial, self.source),))
            self.partial = ""

    def isatty(self) -> bool:
        return False


class _CapturedBytes(io.RawIOBase):
    """``sys.stdout.buffer`` of a Capture: bytes written here are decoded (UTF-8, bad
    bytes replaced) into the same log."""

    def __init__(self, text: Capture) -> None:
        super().__init__()
        self.text = text

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        raw = bytes(data)
        self.text.write(raw.decode("utf-8", "replace"))
        return len(raw)

    def fileno(self) -> int:
        return self.text.fileno()


# Frames a ctx.logger call passes through before its record is made: the caller is the
# first frame past them (the handler's line).
_SKIPPED = frozenset({logging.addLevelName.__code__.co_filename, echoed.__code__.co_filename})
