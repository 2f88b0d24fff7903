"""The memory a child shares with its worker for the log lines it holds back in a flood
(worker/spill.py): the worker reads back the newest lines, oldest first, and a count of
those written over; a clear empties it; a line whose bytes went in without its header
(the child killed in between) is not read."""

from __future__ import annotations

import re
import sys
import threading
from types import FrameType
from typing import Any

import pytest

from runner.worker import spill as spill_module
from runner.worker.spill import _HEAD, HALF_BYTES, Spill


@pytest.fixture
def spill() -> Spill:
    s = Spill.create()
    if s is None:
        pytest.skip("no memfd_create on this system: held lines die with their child")
    s.clear()
    return s


def test_lines_come_back_in_order_and_a_clear_empties_it(spill: Spill) -> None:
    """Lines read back oldest first, whole (text beyond ASCII too); nothing after a clear."""
    for i in range(5):
        spill.add(f"line {i} ü")
    assert spill.read() == ([f"line {i} ü" for i in range(5)], 0)
    spill.clear()
    assert spill.read() == ([], 0)


def test_a_flood_keeps_at_least_the_newest_half_and_counts_the_rest(spill: Spill) -> None:
    """Past both halves the newest lines are kept, oldest first and contiguous to the last,
    at least HALF_BYTES of them, and kept plus lost is every line written."""
    line = "x" * 1000
    total = 3 * HALF_BYTES // 1000
    for i in range(total):
        spill.add(f"{i:05d} {line}")
    lines, lost = spill.read()
    numbers = [int(x[:5]) for x in lines]
    assert numbers == list(range(total - len(lines), total))
    assert len(lines) + lost == total and sum(len(x) for x in lines) >= HALF_BYTES - 1010


def test_a_line_whose_header_was_not_written_is_not_read(spill: Spill) -> None:
    """The child killed between a line's bytes and the header that counts them: the lines
    before it come back, that one does not."""
    spill.add("kept")
    before = _HEAD.unpack_from(spill._mm, 0)
    spill.add("torn")
    _HEAD.pack_into(spill._mm, 0, *before)
    assert spill.read() == (["kept"], 0)


def test_threads_adding_at_once_lose_no_line_uncounted(spill: Spill) -> None:
    """A handler's threads hold lines at once (ctx.logger from each): every line is read
    back whole or counted lost, none twice. The switch interval is forced down so the
    threads interleave inside an add."""
    threads, each = 16, 3000
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(20):  # (a race seen in about 2 runs of 5 without the lock)
            spill.clear()

            def hold(t: int) -> None:
                for i in range(each):
                    spill.add(f"t{t} {i} " + "x" * (i % 200))

            workers = [threading.Thread(target=hold, args=(t,)) for t in range(threads)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            lines, lost = spill.read()
            assert all(re.fullmatch(r"t\d+ \d+ x{0,199}", x) for x in lines)
            assert len(set(lines)) == len(lines)
            assert len(lines) + lost == threads * each
    finally:
        sys.setswitchinterval(before)


def test_a_child_killed_at_any_step_of_an_add_leaves_the_newest_lines_whole(spill: Spill) -> None:
    """The worker reads the memory as a kill can leave it before any statement of an add
    (a trace stops there and reads it, as the worker does once the child is gone): the
    lines read are always the newest ones added, whole and in order, across switches of
    halves and in a clear, and never more counted than were added."""
    reader = Spill(spill.fd)  # (a second map of the same memory, as the worker's)
    added: list[str] = []
    states = 0

    def check() -> None:
        nonlocal states
        states += 1
        lines, lost = reader.read()
        # The newest lines added before this add, or with the one being added, whole.
        assert lines in (added[:-1][len(added) - 1 - len(lines):], added[len(added) - len(lines):])
        assert len(lines) + lost <= len(added)

    def local(frame: FrameType, event: str, arg: object) -> Any:
        if event in ("line", "return"):
            check()
        return local

    def trace(frame: FrameType, event: str, arg: object) -> Any:
        return local if frame.f_code.co_filename == spill_module.__file__ and frame.f_code.co_name != "read" else None

    halves: set[int] = set()
    sys.settrace(trace)
    try:
        # Lines of about 20 KB: 12 to a half, so 17, 30 and 45 lines switch halves once to
        # three times and leave either half current for the clear that follows.
        for total in (17, 30, 45):
            for i in range(total):
                added.append(f"{i:04d} " + "y" * (20_000 + 37 * i % 500))
                spill.add(added[-1])
            lines, lost = reader.read()
            assert lines == added[len(added) - len(lines):] and len(lines) + lost == total
            halves.add(spill._half)
            spill.clear()
            assert reader.read() == ([], 0)
            added.clear()
    finally:
        sys.settrace(None)
    assert halves == {0, 1} and states > 4 * (17 + 30 + 45)
    reader.close()
