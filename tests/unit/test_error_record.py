"""The error record kept on a job: its traceback is bounded (a dead job's size is mostly
its traceback), keeping where it started and the frames nearest the raise, without
runner's own frames or the carets under each line."""

from __future__ import annotations

import json
from pathlib import Path

from runner.errors import MAX_TRACEBACK, describe
from runner.testing import run_inline


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
    assert len(tb) <= MAX_TRACEBACK <= 600
    assert tb.startswith("Traceback (most recent call last):")
    assert tb.rstrip().endswith("ValueError: the innermost frame raised this")
    assert "frame(s), " in tb and "characters left out" in tb
    assert err["type"] == "ValueError" and err["message"] == "the innermost frame raised this"


def test_a_short_traceback_is_kept_whole() -> None:
    try:
        _deep(0)
    except ValueError as exc:
        err = describe(exc)
    assert "left out" not in err["traceback"] and err["traceback"].count("_deep") == 2


DEEP = '''"""Fails through 20 frames of a client library, as a handler calling one does."""

QUEUE = "fast"
MAX_ATTEMPTS = 1


def handle(payload, ctx):
    return layer_0(payload["order"])


{layers}

def layer_19(order_reference):
    raise ConnectionError(f"upstream billing service refused the connection for order {{order_reference}}")
'''


def test_a_handlers_20_frame_traceback_is_stored_within_600_characters(tmp_path: Path) -> None:
    """A handler failing 20 frames deep (about 3 KB of traceback): the stored traceback is
    at most MAX_TRACEBACK (600) characters and its error record under 800 bytes of JSON
    (it was 1,200 and about 1,350: most of a dead job's 2.9 KB). It starts at the
    handler's own frame (runner's frames that call it are left out), holds no line of
    carets, says how many frames it cut, and ends with the frames nearest the raise and
    the exception line."""
    layers = "\n".join(f"def layer_{i}(order_reference):\n    return layer_{i + 1}(order_reference)  # "
                       f"calls the next layer of the client, as libraries do\n\n" for i in range(19))
    (tmp_path / "functions").mkdir()
    (tmp_path / "functions" / "deep.py").write_text(DEEP.format(layers=layers))
    (tmp_path / "schemas" / "deep").mkdir(parents=True)
    (tmp_path / "schemas" / "deep" / "v1.json").write_text('{"type": "object"}')
    (tmp_path / "runner.toml").write_text("[queues.fast]\n")
    out = run_inline("deep", {"order": "A-1042"}, project=str(tmp_path))
    assert out.status == "dead" and out.error is not None, out
    tb = out.error["traceback"]
    assert len(tb) <= MAX_TRACEBACK <= 600, (len(tb), tb)
    assert len(json.dumps(out.error)) < 800, len(json.dumps(out.error))
    assert tb.splitlines()[1].endswith(", in handle"), tb  # the handler's frame, first
    assert "/runner/" not in tb and not any(set(ln.strip()) <= {"^", "~"} for ln in tb.splitlines()), tb
    assert "frame(s), " in tb and "left out" in tb, tb
    assert "in layer_19" in tb and tb.rstrip().endswith(
        "ConnectionError: upstream billing service refused the connection for order A-1042"), tb
