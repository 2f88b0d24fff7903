"""A worker's sys.stdout and sys.stderr (observe/logs.py's Ordered: what else writes to
the process's output goes after the job lines held before it) are text streams as
libraries expect them: io.TextIOBase instances that iterate, copy, give their file
descriptor, say whether they are a terminal, take faulthandler's tracebacks and
reconfigure as the streams they wrap do. Each case runs in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from conftest import REPO

HEAD = '''
import copy, faulthandler, gc, io, json, logging, sys
from runner.config import LogConfig
from runner.observe import logs

logs.setup(LogConfig(level="INFO", format="json"))  # holds echoed lines, as a worker's does
assert type(sys.stdout) is logs.Ordered and type(sys.stderr) is logs.Ordered
'''


def _run(body: str) -> tuple[list[str], list[str]]:
    """(stdout lines, stderr lines) of a process that runs HEAD then ``body``."""
    got = subprocess.run([sys.executable, "-c", HEAD + textwrap.dedent(body)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60, check=False)
    assert got.returncode == 0, got.stderr
    return got.stdout.splitlines(), got.stderr.splitlines()


def test_the_wrapped_streams_are_text_streams_as_libraries_check() -> None:
    """isinstance(sys.stdout, io.TextIOBase) holds for both; iter() gives the stream and
    reading it fails as the wrapped one does (not readable); fileno, isatty, encoding,
    errors, readable and writable are the wrapped stream's."""
    out, _ = _run('''
        real = logs._unwrapped(sys.stdout)
        got = {}
        for name, s in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            r = logs._unwrapped(s)
            got[name] = [isinstance(s, io.TextIOBase), iter(s) is s, s.fileno() == r.fileno(),
                         s.isatty() == r.isatty(), s.encoding == r.encoding, s.errors == r.errors,
                         s.readable() == r.readable(), s.writable() == r.writable(), s.closed]
        try:
            next(iter(sys.stdout))
            got["read"] = "read"
        except io.UnsupportedOperation:
            got["read"] = "not readable"
        print(json.dumps(got))
    ''')
    assert json.loads(out[-1]) == {"stdout": [True, True, True, True, True, True, True, True, False],
                                   "stderr": [True, True, True, True, True, True, True, True, False],
                                   "read": "not readable"}


def test_a_copy_writes_in_order_and_a_dropped_wrapper_leaves_the_stream_open() -> None:
    """copy.copy(sys.stdout) (it recursed for ever) is a stream that writes after the
    lines held before it, as the original does; a wrapper let go (setup without holding
    puts the real stderr back) closes nothing: the stream it wrapped still writes."""
    out, err = _run('''
        dup = copy.copy(sys.stderr)
        assert isinstance(dup, io.TextIOBase) and dup is not sys.stderr
        logging.getLogger("runner.job").info("held first")
        dup.write("written second\\n")
        dup.flush()
        del dup
        logs.setup(LogConfig(level="INFO", format="json"), hold=False)
        gc.collect()
        print("stdout still open", flush=True)
        sys.stderr.write("stderr still open\\n")
    ''')
    assert out == ["stdout still open"]
    held = next(i for i, line in enumerate(err) if "held first" in line)
    assert err[held + 1:] == ["written second", "stderr still open"]


def test_faulthandler_and_reconfigure_work_through_the_wrapper() -> None:
    """faulthandler.enable() (it asks sys.stderr for its descriptor) writes a traceback
    there; sys.stdout.reconfigure(line_buffering=True) reaches the wrapped stream."""
    out, err = _run('''
        faulthandler.enable()
        faulthandler.dump_traceback()
        sys.stdout.reconfigure(line_buffering=True)
        print(json.dumps([sys.stdout.line_buffering, logs._unwrapped(sys.stdout).line_buffering]))
    ''')
    assert json.loads(out[-1]) == [True, True]
    assert any("most recent call first" in line for line in err)
