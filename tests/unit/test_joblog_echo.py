"""What a ctx.logger line leaves behind (worker/joblog.py, observe/logs.py): one line in the
job's own log, and, at INFO, one in the process's output (its stderr), in the order they
were logged, around the process's other records, whichever way the line is made (built
from its parts for runner's own JSON output, or a LogRecord for any other handler,
filter or format). Each case runs in a process of its own, its stderr the output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from typing import Any

from conftest import REPO

HEAD = '''
import json, logging, os, sys
from runner.config import LogConfig
from runner.observe import logs
from runner.worker import joblog
from runner.worker.joblog import JobLogger

logs.setup(LogConfig(level=os.environ.get("LEVEL", "INFO"), format=os.environ.get("FORMAT", "json")))
worker = logging.getLogger("runner.worker")


def job(job_id="J1", lines=500, size=262144):
    return JobLogger(logging.getLogger("runner.job"), {"job_id": job_id, "type": "t", "attempt": 1}, lines, size)


def kept(lg):
    return [json.loads(x) for x in (lg.buf.lines if lg.buf is not None else ())]
'''


def _run(body: str, **env: str) -> tuple[list[str], list[str]]:
    """(stdout lines, stderr lines) of a process that runs HEAD then ``body``."""
    got = subprocess.run([sys.executable, "-c", HEAD + textwrap.dedent(body)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO), **env}, timeout=60, check=False)
    assert got.returncode == 0, got.stderr
    return got.stdout.splitlines(), got.stderr.splitlines()


def _json(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(x) for x in lines]


def test_a_jobs_lines_go_once_to_its_log_and_once_to_the_output_in_order() -> None:
    """Each line lands once in the job's log (its JSON as lua/joblog.lua reads it) and
    once in the output with the job's fields; the worker's own records between them keep
    their places, a WARNING among them too; none is lost at the process's exit."""
    out, err = _run('''
        lg = job()
        lg.info("one %d", 1)
        worker.info("the worker says a")
        lg.info("two \\u009b\\x1b %s", "x")
        lg.warning("three")
        lg.info("four")
        worker.warning("the worker says b")
        lg.info("five")
        for x in lg.buf.lines:
            print(x)
    ''')
    assert [re.match(r'\{"ts": \d+, "level": "(\w+)", "src": "log", "msg": "', x)[1] for x in out] == \
        ["INFO", "INFO", "WARNING", "INFO", "INFO"], out
    assert [x["msg"] for x in _json(out)] == ["one 1", "two \x9b\x1b x", "three", "four", "five"]
    got = _json(err)
    assert [(x["logger"], x["msg"]) for x in got] == [
        ("runner.job", "one 1"), ("runner.worker", "the worker says a"), ("runner.job", "two \x9b\x1b x"),
        ("runner.job", "three"), ("runner.job", "four"), ("runner.worker", "the worker says b"),
        ("runner.job", "five")]
    assert all((x["job_id"], x["type"], x["attempt"]) == ("J1", "t", 1) for x in got if x["logger"] == "runner.job")
    assert [x["level"] for x in got] == ["info", "info", "info", "warning", "info", "warning", "info"]
    assert "\\u009b" in err[2] and "\x9b" not in err[2]  # (escaped for whoever tails the output)


def test_the_output_line_is_the_same_however_it_is_made() -> None:
    """A line built from its parts (runner's own output alone) and one formatted from a
    record (a filter on the handler makes the record path) say the same, field for
    field, but the time."""
    _, err = _run('''
        lg = job()
        lg.info("same %s and %d", "text", 2)
        logging.getLogger().handlers[0].addFilter(lambda r: True)
        lg.info("same %s and %d", "text", 2)
    ''')
    a, b = _json(err)
    assert abs(a.pop("ts") - b.pop("ts")) < 5
    assert a == b == {"level": "info", "logger": "runner.job", "msg": "same text and 2",
                      "job_id": "J1", "type": "t", "attempt": 1}


def test_an_applications_handler_sees_the_handlers_own_line_as_the_caller() -> None:
    """A handler or filter of the application's own gets every echoed line as a record,
    its caller the handler's line (it named runner/worker/joblog.py), its message
    formatted from the call's arguments; a filter that drops a record drops its echo,
    never its line in the job's log."""
    _, err = _run('''
        seen = []

        class Keep(logging.Handler):
            def emit(self, record):
                seen.append((record.filename, record.funcName, record.lineno, record.getMessage(), record.job_id))

        logging.getLogger("runner.job").addHandler(Keep())

        def handle(lg):
            lg.info("from %s", "the handler")  # the caller
            return sys._getframe().f_lineno - 1

        lg = job()
        at = handle(lg)
        assert seen == [("<string>", "handle", at, "from the handler", "J1")], seen
        logging.getLogger().handlers[0].addFilter(lambda r: "secret" not in r.getMessage())
        lg.info("a secret")
        lg.info("not hidden")
        assert [m["msg"] for m in kept(lg)] == ["from the handler", "a secret", "not hidden"]
        assert [s[3] for s in seen] == ["from the handler", "a secret", "not hidden"]
    ''')
    assert [x["msg"] for x in _json(err)] == ["from the handler", "not hidden"]


def test_a_mapping_argument_formats_the_line() -> None:
    """ctx.logger.info("%(n)s items", {"n": 3}) says "3 items", in the job's log and in
    the output, as logging does (the job's log kept "%(n)s items ({'n': 3},)")."""
    _, err = _run('''
        lg = job()
        lg.info("%(n)s items", {"n": 3})
        logging.getLogger().handlers[0].addFilter(lambda r: True)  # (the record's way)
        lg.info("%(n)s more", {"n": 4})
        lg.info("%(n)s and a traceback", {"n": 5}, exc_info=ValueError("v"))
        assert [m["msg"].splitlines()[0] for m in kept(lg)] == ["3 items", "4 more", "5 and a traceback"], kept(lg)
    ''')
    got = _json(err)
    assert [x["msg"] for x in got] == ["3 items", "4 more", "5 and a traceback"]
    assert "ValueError: v" in got[2]["exc"]


def test_the_text_output_and_warning_level_and_the_flood_bound() -> None:
    """Readable output (runner dev) shows each line with its fields; at WARNING the lines
    are in the job's log only; past the job log's bounds the output says once how many
    more are in the job's log."""
    _, err = _run('''
        lg = job()
        lg.info("readable %d", 1)
    ''', FORMAT="text")
    assert len(err) == 1 and "INFO" in err[0] and "runner.job: readable 1" in err[0] and "job_id=J1" in err[0]
    out, err = _run('''
        lg = job()
        lg.info("quiet")
        lg.warning("loud")
        print(json.dumps([m["msg"] for m in kept(lg)]))
    ''', LEVEL="WARNING")
    assert json.loads(out[0]) == ["quiet", "loud"] and [x["msg"] for x in _json(err)] == ["loud"]
    _, err = _run('''
        lg = job(lines=5)
        for i in range(12):
            lg.info("flood %d", i)
        lg.echo_end()
    ''')
    got = _json(err)
    assert [x["msg"] for x in got[:5]] == [f"flood {i}" for i in range(5)]
    assert len(got) == 6 and "7 more ctx.logger line(s)" in got[5]["msg"]


def test_a_critical_record_then_an_immediate_exit_keeps_the_lines_before_it() -> None:
    """A process that logs an error and ends at once (a dying worker thread, a second
    signal: os._exit) has written every line logged before that record."""
    _, err = _run('''
        lg = job()
        for i in range(3):
            lg.info("before %d", i)
        worker.critical("dying")
        lg.info("after")  # (may be lost: the process ends within the moment)
        os._exit(0)
    ''')
    assert [x["msg"] for x in _json(err)][:4] == ["before 0", "before 1", "before 2", "dying"]


def test_a_forked_child_writes_none_of_its_parents_lines() -> None:
    """A line the parent logged just before a fork is written once, by the parent; the
    child's own lines are written by the child, at its exit at the latest."""
    _, err = _run('''
        lg = job()
        lg.info("parent's")
        pid = os.fork()
        if pid == 0:
            job("J2").info("child's")
            logging.shutdown()
            os._exit(0)
        os.waitpid(pid, 0)
    ''')
    assert sorted(x["msg"] for x in _json(err)) == ["child's", "parent's"]


def test_lines_held_for_the_output_are_written_while_the_process_runs(tmp_path: Any) -> None:
    """A long run's lines reach the output while it runs, not only at its end."""
    output = tmp_path / "output.log"
    with output.open("w") as f:
        got = subprocess.run([sys.executable, "-c", HEAD + textwrap.dedent('''
            import time
            job().info("early")
            deadline = time.monotonic() + 10
            while "early" not in open("/proc/self/fd/2").read():
                assert time.monotonic() < deadline, "not written within 10 s"
                time.sleep(0.01)
            print("seen")
        ''')], stdout=subprocess.PIPE, stderr=f, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=60, check=False)
    assert got.returncode == 0 and got.stdout == "seen\n", output.read_text()
    assert [x["msg"] for x in _json(output.read_text().splitlines())] == ["early"]


def test_a_line_written_any_other_way_comes_after_the_echoed_lines_before_it() -> None:
    """Whatever else writes to the process's output through sys.stderr or sys.stdout (a
    handler of the application's own on a logger that does not propagate, warnings.warn,
    print, bytes to sys.stderr.buffer) comes after the ctx.logger lines logged before it,
    in both formats (it came ahead of the lines still held to be written together)."""
    for fmt in ("json", "text"):
        got = subprocess.run([sys.executable, "-c", HEAD + textwrap.dedent('''
            import warnings
            lg = job()
            usr = logging.getLogger("usr.lib")
            mine = logging.StreamHandler(sys.stderr)
            mine.setFormatter(logging.Formatter("USR %(message)s"))
            usr.addHandler(mine)
            usr.propagate = False
            warnings.simplefilter("always")
            for i in range(3):
                lg.info("A%d", i)
                usr.warning("U%d", i)
                lg.info("B%d", i)
                warnings.warn("W%d" % i)
                lg.info("C%d", i)
                print("P%d" % i, flush=True)
                lg.info("D%d", i)
                sys.stderr.buffer.write(b"R%d\\n" % i)
                sys.stderr.buffer.flush()
        ''')], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO), "FORMAT": fmt}, timeout=60, check=False)
        assert got.returncode == 0, got.stdout
        order = re.findall(r"\b([ABCDUWPR]\d)\b", got.stdout)
        assert order == [f"{k}{i}" for i in range(3) for k in "AUBWCPDR"], (fmt, got.stdout)


def test_an_output_that_fails_is_reported_once_and_never_raises() -> None:
    """An echoed line the output does not take (ENOSPC on /dev/full) neither raises into
    the handler that logged it (a process-isolated job died of it) nor reports once per
    line: one report (logging's handleError, on sys.stderr) while the output keeps
    failing, again after a write went through and it fails anew; held lines too."""
    out, err = _run('''
        full = open("/dev/full", "w")
        h = logs.Output(full)
        logs._holding = False  # (a child process: each line written at once)
        for i in range(100):
            h.hold(f"line {i}")
        h.stream = sys.stdout
        h.hold("through")
        h.stream = full
        for i in range(100):
            h.hold(f"again {i}")
        logs._holding = True
        h.hold("held")
        h.flush()
        logs.flush_held()
        print("went on")
    ''')
    assert out == ["through", "went on"], out
    reports = [x for x in err if x == "--- Logging error ---"]
    assert len(reports) == 2, err
    assert sum("No space left on device" in x for x in err) == 2, err
