"""A call to one Redis Cluster master given up past the node wait (transport.NodeLanes.
bounded): the caller gets NodeStalled at once, later calls to that master fail at once
while the call is out, and its result, when it comes, goes to ``late``."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from runner.store import transport
from runner.store.connection import NodeStalled


def _lanes() -> transport.NodeLanes:
    # bounded needs no client; a call's end reads the transport's node wait (its round
    # trip's bound), so the stand-in has one (without it the end of a call given up
    # raised in the pool's thread, after the test, into another test's log)
    return transport.NodeLanes(SimpleNamespace(node_wait_s=None, one_server=True))  # type: ignore[arg-type]


def test_a_stalled_node_is_given_up_once_and_its_late_reply_handed_over() -> None:
    transport._import_redis()
    lanes = _lanes()
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


def test_a_node_stays_stalled_until_every_call_given_up_on_it_ends() -> None:
    """Two callers give up on one master at once: it answers one of them, and is still
    stalled for the other; its calls go again once both ended."""
    transport._import_redis()
    lanes = _lanes()
    gates = [threading.Event(), threading.Event()]
    errors: list[BaseException] = []

    def caller(gate: threading.Event) -> None:
        try:
            lanes.bounded("n1:1", lambda: gate.wait(5), 1.0)  # (both callers are out by then)
        except NodeStalled as exc:
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(g,)) for g in gates]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 2
    gates[0].set()
    time.sleep(0.1)
    with pytest.raises(NodeStalled):
        lanes.bounded("n1:1", lambda: "sent", 1.0)
    gates[1].set()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            assert lanes.bounded("n1:1", lambda: "sent", 1.0) == "sent"
            break
        except NodeStalled:
            time.sleep(0.01)
    else:
        raise AssertionError("the node stayed stalled after both calls ended")


def test_a_call_given_up_names_its_node_and_what_it_was() -> None:
    """A call given up names the master (host:port) and the call; a read over several
    masters names the stalled one among them, and fails at once while it is stalled."""
    transport._import_redis()
    lanes = _lanes()
    release = threading.Event()
    try:
        with pytest.raises(NodeStalled, match=r"Redis node n1:1 did not answer a claim within 0\.05 s"):
            lanes.bounded("n1:1", lambda: release.wait(5), 0.05, what="a claim")
        ran: list[int] = []
        with pytest.raises(NodeStalled, match=r"Redis node n1:1 has not answered .*the heartbeat not sent") as err:
            lanes.bounded("the heartbeat", lambda: ran.append(1), 1.0, what="the heartbeat", among=["n1:1", "n2:2"])
        assert "n2:2" not in str(err.value) and not ran
        assert lanes.bounded("the index", lambda: "read", 1.0, what="the index", among=["n2:2", "n3:3"]) == "read"
    finally:
        release.set()
