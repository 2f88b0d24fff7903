"""The memory a child shares with its worker for the log lines it holds back in a flood
(worker/spill.py): the worker reads back the newest lines, oldest first, and a count of
those written over; a clear empties it; a line whose bytes went in without its header
(the child killed in between) is not read."""

from __future__ import annotations

import pytest

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
