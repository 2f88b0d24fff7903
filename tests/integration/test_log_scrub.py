"""The log scrubber (urls.scrub, run on every log line) costs a bounded, linear pass, so a
producer's data in a handler's log line cannot freeze a worker: a long run of word
characters beside an ``@`` made it quadratic while holding the GIL (32,000 letters: 4 s),
the worker's lease renewer stopped, and another producer's job on that worker lost its
lease and ran twice. A line past the scan cap is cut, never printed unscrubbed."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from runner.store import urls

from conftest import Project, size, wait_for

WELCOME = '''QUEUE = "fast"

def handle(payload, ctx):
    ctx.logger.info("sending the welcome email to %s <%s>", payload["name"], payload["email"])
'''
LONG = '''import os
import time

QUEUE = "fast"
TIMEOUT = 30


def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"{ctx.attempt}\\n")
    time.sleep(5)
'''


def test_a_long_word_in_a_log_line_does_not_freeze_the_worker(project: Project) -> None:
    """Worker W1 runs another producer's 5 s job under a 2 s lease; then it logs a
    100,000-letter name beside an e-mail address; a second worker stands by to reclaim
    any lease W1 fails to renew. The long job runs once."""
    project.write_config(vt=2, prefetch=0, fast="max_timeout = 60")
    project.add_function("welcome", WELCOME)
    project.add_function("long", LONG)
    c = project.client
    project.spawn_worker("fast", log_name="w1.log")
    long = c.enqueue("long", {})
    wait_for(lambda: project.runs(long.id), timeout=30, what="the long job to start on W1")
    hostile = c.enqueue("welcome", {"name": "a" * 100_000, "email": "someone@example.com"})
    wait_for(lambda: c.get(hostile.id).status in ("processing", "done"), timeout=30,
             what="W1 to claim the hostile job")
    project.spawn_worker("fast", log_name="w2.log")
    assert c.wait(long.id, timeout_s=60).status == "done"
    assert c.wait(hostile.id, timeout_s=60).status == "done"
    assert len(project.runs(long.id)) == 1, project.runs(long.id)


def test_scrub_cuts_a_line_past_the_cap_and_hides_what_it_keeps() -> None:
    """A line longer than SCAN_CHARS keeps its scrubbed head and says how much was cut: a
    password past the cap is dropped with the tail, not printed unscrubbed."""
    assert urls.scrub("a" * (urls.SCAN_CHARS + 10) + "@x") == f"[{urls.SCAN_CHARS + 12:,} more characters cut]"
    head = "Connection(db=0,password=Zq7SECRET,socket_timeout=15.0) "
    line = head + "a" * urls.SCAN_CHARS + " redis://u:Zq7SECRET2@h:1/0"
    shown = urls.scrub(line)
    assert "SECRET" not in shown and "password=***" in shown
    # The word across the cut goes too: it could be half a URL whose "@" is past it.
    assert shown == urls.scrub(head) + f"[{len(line) - len(head):,} more characters cut]", shown[-80:]
    # A long line without anything to hide is left whole: no reason to cut it.
    plain = json.dumps({"name": "a" * (urls.SCAN_CHARS * 2)})
    assert urls.scrub(plain) == plain


def test_scrub_hides_the_same_secrets_after_a_long_word() -> None:
    """The linear form hides what the old one did, next to a long word too."""
    word = "a" * 50_000
    for text, hidden in ((f"{word} password=Zq7SECRET,db=0", "password=***,db=0"),
                         (f"{word}_password: 'Zq7SECRET'", "_password: '***'"),
                         (f"{word}redis://user:Zq7SECRET@h:1", "redis://user:***@h:1"),
                         (f"{word}@example.com {word}", "@example.com")):
        shown = urls.scrub(text)
        assert "SECRET" not in shown and hidden in shown, shown[-120:]


# The single pattern scrub used before it was linear: the reference for what it hides.
_PATTERN = re.compile(r"""(?im)(\w*password['"]?\s*[=:]\s*)(?:(['"]).*?\2(?=\s*[,})\]]|\s*$)"""
                      r"""|.*?(?=,\s*['"]?\w+['"]?\s*[=:]|&\w+=|\)?>|\)\s*$|$))""")
_PIECES = ["password", "PassWord", "=", ":", " ", "\n", "'", '"', ",", "&", ")", ">", "]", "}", "a", "b_",
           "x=", "\t", "é", "1", "\u00a0", "İ"]


@settings(max_examples=int(size("MODEL_EXAMPLES", 500, 3000)), deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=30).map("".join))
def test_scrub_hides_exactly_what_the_pattern_hid(text: str) -> None:
    """On short texts (where the old pattern was quick) the one-pass scan gives the same
    text, byte for byte: the same values hidden, the same left."""
    want = _PATTERN.sub(lambda m: m.group(1) + (m.group(2) or "") + "***" + (m.group(2) or ""), text)
    assert urls._hide_passwords(text) == want
