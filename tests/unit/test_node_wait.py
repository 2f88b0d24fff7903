"""A call to one Redis Cluster master given up past the node wait (transport.NodeLanes.
bounded): the caller gets NodeStalled at once, later calls to that master fail at once
while the call is out, and its result, when it comes, goes to ``late``."""

from __future__ import annotations

import threading
import time

import pytest

from runner.store import transport
from runner.store.connection import NodeStalled


def test_a_stalled_node_is_given_up_once_and_its_late_reply_handed_over() -> None:
    transport._import_redis()
    lanes = transport.NodeLanes(None)  # type: ignore[arg-type]  (bounded needs no client)
    release = threading.Event()
    came: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(NodeStalled, match=r"did not answer within 0\.05 s"):
        lanes.bounded("n1:1", lambda: release.wait(5) and "claimed", 0.05, came.append)
    assert time.monotonic() - t0 < 1.0
    ran = []
    with pytest.raises(NodeStalled, match="has not answered"):  # not sent: nothing piles up behind it
        lanes.bounded("n1:1", lambda: ran.append(1), 1.0)
    assert not ran
    assert lanes.bounded("n2:2", lambda: "other", 1.0) == "other"  # another master answers
    release.set()
    deadline = time.monotonic() + 5
    while not came and time.monotonic() < deadline:
        time.sleep(0.01)
    assert came == ["claimed"]
    assert lanes.bounded("n1:1", lambda: "back", 1.0) == "back"
