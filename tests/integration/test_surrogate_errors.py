"""A handler's error whose message holds a lone surrogate (a name decoded with
surrogateescape, such as a file name that was not UTF-8) is recorded as that error, with
U+FFFD in its place: the record is JSON, so the outcome lands and the job is not re-run
as "worker lost"."""

from __future__ import annotations

from conftest import Project, wait_for

RAISES = '''
QUEUE = "fast"
MAX_ATTEMPTS = 1


def handle(payload, ctx):
    name = b"report-\\xff.csv".decode("utf-8", "surrogateescape")
    raise ValueError("cannot open " + name)
'''


def test_an_error_message_with_a_lone_surrogate_is_recorded_as_that_error(project: Project) -> None:
    project.add_function("opens", RAISES)
    c = project.client
    job = c.enqueue("opens", {}).id
    project.spawn_worker("fast")
    wait_for(lambda: c.get(job).status == "dead", timeout=20, what="the job to go dead")
    view = c.get(job).as_dict()
    assert view["last_error"]["type"] == "ValueError", view
    assert view["last_error"]["message"] == "cannot open report-\ufffd.csv"
    assert [h["outcome"] for h in view["history"]] == ["max attempts reached"], view["history"]
    project.stop_all()
