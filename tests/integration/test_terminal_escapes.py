"""A producer's text never acts on an operator's terminal, and the CLI's own styling is
not escaped with it: the worker's outcome log lines write out every control character in
text lines (ESC sequences) and C1 controls, separators and bidi controls in JSON lines;
the CLI writes out U+2028 and U+202E in `runner job`, `dead ls` and --json as it does C0
and C1 controls, and prints its own colours as colours."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import Project, wait_for

EVIL = "A\x1b]0;PWNED\x07B\x1b[2JC\u009b31mD\u2028E\u202eF"
RAW = ("\x1b", "\u009b", "\u2028", "\u202e", "\x07")
FAILS = '''
QUEUE = "fast"
MAX_ATTEMPTS = 1


def handle(payload, ctx):
    raise RuntimeError(payload["m"])
'''


def _cli(project: Project, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), *args],
                          env=project.env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_worker_log_writes_out_a_producers_controls(project: Project, fmt: str) -> None:
    project.add_function("fails", FAILS)
    job_id = project.client.enqueue("fails", {"m": EVIL}).id
    project.spawn_worker("fast", env={"RUNNER_LOG_FORMAT": fmt}, log_name=f"w-{fmt}.log")
    assert project.client.wait(job_id, timeout_s=20).status == "dead"
    log = project.root / f"w-{fmt}.log"
    wait_for(lambda: job_id in log.read_text(), timeout=10, what="the outcome line")
    text = log.read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if job_id in line and "PWNED" in line]
    assert lines, text[-2000:]
    for line in lines:
        assert not any(c in line for c in RAW), repr(line)
        if fmt == "json":
            assert any(EVIL in str(v) for v in json.loads(line).values()), line  # the same text, escaped


def test_the_cli_writes_out_separators_and_bidi_controls_in_job_data(project: Project) -> None:
    project.add_function("fails", FAILS)
    job_id = project.client.enqueue("fails", {"m": EVIL}).id
    project.spawn_worker("fast")
    assert project.client.wait(job_id, timeout_s=20).status == "dead"
    for args in (("job", job_id), ("job", job_id, "--json"), ("dead", "ls", "--queue", "fast"),
                 ("dead", "ls", "--queue", "fast", "--json"), ("jobs", "--status", "dead", "--json")):
        out = _cli(project, *args)
        assert out.returncode == 0, (args, out.stderr)
        assert "PWNED" in out.stdout, (args, out.stdout[-500:])
        assert not any(c in out.stdout + out.stderr for c in RAW), (args, repr(out.stdout[-800:]))


def test_the_cli_keeps_its_own_colours(project: Project) -> None:
    """A function that fails to load is listed in red by `runner functions`: the colour
    codes click adds are printed as colours, not written out as ``\\x1b[31m``."""
    project.add_function("broken", 'QUEUE = "fast"\nIDEMPOTENCY_KEY = "k:{nope}"\n\ndef handle(p, ctx):\n    pass\n')
    out = subprocess.run(["script", "-qec", f"{sys.executable} -m runner.cli --config "
                          f"{project.root / 'runner.toml'} functions", "/dev/null"],
                         env=project.env, capture_output=True, text=True, timeout=30)
    row = [line for line in out.stdout.splitlines() if "broken" in line]
    assert row, out.stdout
    assert "\\x1b" not in out.stdout, row
    assert "\x1b[31m" in out.stdout, row
