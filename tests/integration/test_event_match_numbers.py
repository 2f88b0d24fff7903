"""ctx.wait_for_event's match compares JSON numbers by value at every size: a whole float
of 2**53 or more in the event's data matches the equal integer in the match, and the
reverse, while a neighbouring integer that no float can hold does not."""

from __future__ import annotations

from conftest import Project, wait_for

WAITER = '''
QUEUE = "fast"

def handle(payload, ctx):
    event = ctx.wait_for_event("order.paid", match={"order_id": payload["order_id"]}, timeout=60)
    return {"data": event["data"] if event else None}
'''


def test_whole_floats_past_2_53_match_equal_integers_both_ways(project: Project) -> None:
    """Data 2.0**53 matches a match of 2**53, data 2**60 a match of 2.0**60; data 2.0**53
    does not match 2**53 + 1 (not equal by value), and data 2**53 + 1 then does."""
    project.add_function("waiter", WAITER)
    c = project.client
    project.spawn_worker("fast")
    big = c.enqueue("waiter", {"order_id": 2**53}).id
    bigger = c.enqueue("waiter", {"order_id": float(2**60)}).id
    odd = c.enqueue("waiter", {"order_id": 2**53 + 1}).id
    for job in (big, bigger, odd):
        wait_for(lambda job=job: c.get(job).status == "waiting", timeout=60, what=f"job {job} to wait")
    c.emit("order.paid", {"order_id": float(2**53)})
    c.emit("order.paid", {"order_id": 2**60})
    assert c.wait(big, 30).as_dict()["result"] == {"data": {"order_id": float(2**53)}}
    assert c.wait(bigger, 30).as_dict()["result"] == {"data": {"order_id": 2**60}}
    assert c.get(odd).status == "waiting"  # 2.0**53 is not 2**53 + 1
    c.emit("order.paid", {"order_id": 2**53 + 1})
    assert c.wait(odd, 30).as_dict()["result"] == {"data": {"order_id": 2**53 + 1}}


def test_whole_floats_past_64_bits_wait_and_match(project: Project) -> None:
    """A match of a whole float of 2**64 or more (1e20, 2.0**64, -1e300) waits, and the
    event holding that float resumes it (the match was kept as an integer no record can
    hold, and the run failed, was retried and buried instead of waiting)."""
    project.add_function("waiter", WAITER)
    c = project.client
    project.spawn_worker("fast")
    values = [1e20, 2.0**64, -1e300]
    jobs = [c.enqueue("waiter", {"order_id": v}).id for v in values]
    for job in jobs:
        wait_for(lambda job=job: c.get(job).status == "waiting", timeout=60, what=f"job {job} to wait")
    for v in values:
        c.emit("order.paid", {"order_id": v})
    for job, v in zip(jobs, values, strict=True):
        assert c.wait(job, 30).as_dict()["result"] == {"data": {"order_id": v}}
