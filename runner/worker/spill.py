"""A child process's log lines held back in a flood, in memory its worker reads when the
child dies.

A child hands each line to its worker as it comes, up to joblog.SINK_BURST of them within
joblog.SINK_EVERY_S; past that the rest wait in the child for its next send (a worker
that decoded a flood whole would spend its CPU on it). A child that dies then (SIGKILL,
a segfault, the OOM killer), runs no code of its own on the way out: the lines it held,
the last ones, the ones that explain the crash, died with it. So a held line is also
copied here, into a shared memory file the worker made (memfd, Linux; elsewhere there is
none and held lines die with the child as before), and the worker reads it only when the
child dies while running a job. A line the child sends clears it first (never kept twice).

Two halves of HALF_BYTES each: a line goes into the current half; a line that does not fit
there switches halves, and the lines of the half written over count as lost. So the newest
HALF_BYTES of held lines, at least, are kept (a job's log keeps 256 KiB by default), at the
cost of one copy and one header write per held line, and none for a line sent at once.
A child killed at any point leaves lines the worker reads whole, the newest ones in order:
each header write is one field (the current half, the lines lost) or one half's bytes used
and lines (only the bytes are read), in an order where every prefix reads right. A line's
bytes go in before the count that covers them; a switch first empties the other half in
the header, then names it current, and only then writes the line over it (a line written
over the old lines while the header still counted them would be read as the oldest, and
the bytes after it misaligned); a clear empties the older half first. The handler's
threads may hold lines at once: add and clear take a lock.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import threading

HALF_BYTES = 256 * 1024
# Header: the current half, then for each half its bytes used and lines, then the lines lost.
_HEAD = struct.Struct("<IIIIII")
_LEN = struct.Struct("<I")
_PAIR = struct.Struct("<II")  # one half's bytes used and lines, in the header at _AT_USED[half]
_AT_USED = (4, 12)
_AT_LOST = 20
SIZE = _HEAD.size + 2 * HALF_BYTES
_MAX_LINE = HALF_BYTES - _LEN.size


class Spill:
    """The shared memory of one child: written by the child (add, clear), read by its
    worker (read)."""

    __slots__ = ("_half", "_lock", "_lost", "_mm", "_n", "_used", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._mm = mmap.mmap(fd, SIZE)
        # The child's own copy of the header (it alone writes): one write per line, no read.
        self._half, self._used, self._n, self._lost = 0, [0, 0], [0, 0], -1  # (-1: not cleared yet)
        self._lock = threading.Lock()

    @classmethod
    def create(cls) -> Spill | None:
        """A new one for a child about to start (its fd to pass on), None where the
        system has no memfd."""
        try:
            fd = os.memfd_create("runner-held-lines", os.MFD_CLOEXEC)
        except (AttributeError, OSError):
            return None
        try:
            os.ftruncate(fd, SIZE)
            return cls(fd)
        except BaseException:
            os.close(fd)
            raise

    def clear(self) -> None:
        with self._lock:
            if self._lost or self._n[0] or self._n[1]:  # (a line sent at once clears nothing: no write)
                # The older half empties first (what is left between is the newest lines),
                # then the current one: nothing is read whatever the other fields say.
                mm = self._mm
                _PAIR.pack_into(mm, _AT_USED[1 - self._half], 0, 0)
                _PAIR.pack_into(mm, _AT_USED[self._half], 0, 0)
                _LEN.pack_into(mm, 0, 0)
                _LEN.pack_into(mm, _AT_LOST, 0)
                self._half, self._used, self._n, self._lost = 0, [0, 0], [0, 0], 0

    def add(self, line: str) -> None:
        """One held line (the child's)."""
        data = line.encode(errors="replace")
        size = min(len(data), _MAX_LINE)
        mm = self._mm
        with self._lock:  # (each write below in the order the module's docstring gives)
            half, used, n = self._half, self._used, self._n
            if used[half] + _LEN.size + size > HALF_BYTES:  # the other half, written over
                half = 1 - half
                self._lost += n[half]
                used[half] = n[half] = 0
                _PAIR.pack_into(mm, _AT_USED[half], 0, 0)
                _LEN.pack_into(mm, _AT_LOST, self._lost)
                _LEN.pack_into(mm, 0, half)
                self._half = half
            at = _HEAD.size + half * HALF_BYTES + used[half]
            mm[at:at + _LEN.size + size] = _LEN.pack(size) + data[:size]
            used[half] += _LEN.size + size
            n[half] += 1
            _PAIR.pack_into(mm, _AT_USED[half], used[half], n[half])

    def read(self) -> tuple[list[str], int]:
        """The lines held (oldest first) and how many were written over (the worker's,
        once the child is gone)."""
        half, used_a, _, used_b, _, lost = _HEAD.unpack_from(self._mm, 0)
        used = (used_a, used_b)
        out: list[str] = []
        for h in (1 - half, half):
            base, at, end = _HEAD.size + h * HALF_BYTES, 0, min(used[h], HALF_BYTES)
            while at + _LEN.size <= end:
                (size,) = _LEN.unpack_from(self._mm, base + at)
                at += _LEN.size
                if at + size > end:
                    break
                out.append(self._mm[base + at:base + at + size].decode(errors="replace"))
                at += size
        return out, lost

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self._mm.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)
