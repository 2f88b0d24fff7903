"""A job's log buffer (worker/joblog.py): a write that did not land puts its lines back
once, ahead of those added since, and never twice; a child's captured output splits
into lines there."""

from __future__ import annotations

import json
import logging

from runner.worker.joblog import MAX_LINE_CHARS, Capture, JobLog, JobLogger


def test_lines_put_back_after_a_failed_write_go_once_with_the_next() -> None:
    """The settler's write of a run's last lines failed (Redis away): it put them back by
    adding them again (extend), so the next write sent them twice. put_back marks the
    same lines unsent again: the next take has each once, in order, then the new ones."""
    buf = JobLog(max_lines=10, max_bytes=10_000)
    buf.extend(["a", "b"])
    assert buf.take() == ["a", "b"]
    buf.add("c")
    assert buf.take() == ["c"]
    buf.put_back()  # "c" did not land
    buf.add("d")
    assert buf.take() == ["c", "d"]
    assert list(buf.lines) == ["a", "b", "c", "d"]
    assert not buf.pending()


def test_a_put_back_past_the_bounds_counts_what_was_pushed_out() -> None:
    """Lines put back that newer ones pushed out meanwhile are counted with the next take
    (for the log's marker), not sent twice or lost silently."""
    buf = JobLog(max_lines=3, max_bytes=10_000)
    buf.extend(["a", "b", "c"])
    assert buf.take() == ["a", "b", "c"]
    buf.put_back()
    buf.extend(["d", "e"])  # a and b pushed out unsent
    assert buf.take_counted() == (["c", "d", "e"], 2)


def test_lines_a_child_lost_are_counted_with_the_next_take() -> None:
    """A child's flood lost lines before it handed the rest to its worker: the worker's
    buffer counts them with its own drops, so the log's one marker says every line lost."""
    buf = JobLog(max_lines=3, max_bytes=10_000)
    buf.extend(["a", "b"], dropped=5)
    buf.extend(["c", "d"])  # a pushed out unsent here
    assert buf.take_counted() == (["b", "c", "d"], 6)
    assert buf.take_counted() == ([], 0)


def test_a_long_line_is_split_into_chunks_and_its_newline_adds_no_empty_line() -> None:
    """Capture (a child's sys.stdout) keeps a line with no newline past MAX_LINE_CHARS as a
    line of its own; a newline that comes right after it ends that line (print writes it
    apart), while a second newline, or text, starts lines of their own."""
    lg = JobLogger(logging.getLogger("t"), {}, 100, 1 << 20)
    out = Capture(lg, "stdout")
    for piece in ["x" * (MAX_LINE_CHARS + 1), "\n", "y" * (MAX_LINE_CHARS + 1), "", "\n", "\n", "z" * 5,
                  "w" * MAX_LINE_CHARS, "tail\n", "q" * (MAX_LINE_CHARS + 1), "more\nlast"]:
        out.write(piece)
    out.finish()
    got = [json.loads(x)["msg"] for x in (lg.buf.lines if lg.buf is not None else ())]
    cut = [m.split("...")[0][:1] + str(len(m.split("...")[0])) for m in got]
    assert cut == ["x8192", "y8192", "0", "z8192", "t4", "q8192", "m4", "l4"], cut


def test_lines_a_sink_had_no_memory_for_go_once_with_the_next_send() -> None:
    """A child's handler at its MEMORY_MB: a send that raised MemoryError (the cap is not
    lifted for a line) leaves its lines and chunks for the next send, once each, in order;
    the call that logged does not raise."""
    lg = JobLogger(logging.getLogger("t"), {}, 100, 1 << 20)
    sent: list[tuple[list[str], list[str]]] = []
    full = [True]

    def sink(lines: list[str], chunks: list[str], dropped: int) -> None:
        if full[0]:
            raise MemoryError
        sent.append(([json.loads(x)["msg"] for x in lines], chunks))

    lg.sink = sink
    lg.info("one")
    lg.stream({"a": 1})
    lg.info("two")
    assert sent == []
    full[0] = False
    lg.info("three")
    assert [s[0] for s in sent] == [["one", "two", "three"]] and len(sent[0][1]) == 1
    lg.flush()
    assert len(sent) == 1
