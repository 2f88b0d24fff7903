"""What a warm child does to put its signal settings back after a job (child.Signals):
nothing to the actions a job left as they were, and each one a job changed set again.
Run in a fresh interpreter, as a child process is (Signals takes over SIGTERM and SIGINT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = '''
import json, signal
from runner.worker import child

signals = child.Signals()
calls = []
real = signal.signal
def counted(sig, action):
    calls.append(int(sig))
    return real(sig, action)
signal.signal = counted

signals.put_back()  # a job that changed nothing
untouched = list(calls)
calls.clear()
real(signal.SIGCHLD, signal.SIG_IGN)  # a job that ignored SIGCHLD, and left SIGPIPE at its default
real(signal.SIGPIPE, signal.SIG_DFL)
signals.put_back()
print(json.dumps({"untouched": untouched, "changed": sorted(calls),
                  "sigchld": int(signal.getsignal(signal.SIGCHLD)), "sigpipe": int(signal.getsignal(signal.SIGPIPE))}))
'''


def test_put_back_sets_no_action_a_job_left_as_it_was_and_each_one_it_changed() -> None:
    """A job that changed no signal costs no sigaction call at its end (SIG_DFL and
    SIG_IGN read back from Python's record as plain integers, which an identity check
    took for changed: three calls a job, for SIGCHLD, SIGPIPE and SIGXFSZ); one that
    changed SIGCHLD and SIGPIPE gets those two put back."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["untouched"] == []
    assert got["changed"] == sorted([13, 17])  # SIGPIPE, SIGCHLD
    assert got["sigchld"] == 0 and got["sigpipe"] == 1  # SIG_DFL, SIG_IGN again
