"""The error record kept on a job: its traceback is bounded (a dead job's size is mostly
its traceback), keeping where it started and the frames nearest the raise."""

from __future__ import annotations

from runner.errors import MAX_TRACEBACK, describe


def _deep(n: int) -> None:
    if n == 0:
        raise ValueError("the innermost frame raised this")
    _deeper(n - 1)  # two functions in turn: a traceback folds a frame repeated in a row


def _deeper(n: int) -> None:
    _deep(n)


def test_a_deep_traceback_is_kept_within_its_bound_with_its_ends() -> None:
    """A 60-frame traceback (about 5 KB) is stored in at most MAX_TRACEBACK characters: its
    first line, a marker of what was left out, and the last frames with the exception."""
    try:
        _deep(60)
    except ValueError as exc:
        err = describe(exc)
    tb = err["traceback"]
    assert len(tb) <= MAX_TRACEBACK <= 1200
    assert tb.startswith("Traceback (most recent call last):")
    assert tb.rstrip().endswith("ValueError: the innermost frame raised this")
    assert "frames left out" in tb
    assert err["type"] == "ValueError" and err["message"] == "the innermost frame raised this"


def test_a_short_traceback_is_kept_whole() -> None:
    try:
        _deep(0)
    except ValueError as exc:
        err = describe(exc)
    assert "left out" not in err["traceback"] and err["traceback"].count("_deep") == 2
