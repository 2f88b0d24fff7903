"""The bound on requests held in a ?wait= (web/holding.py): per token, and per process
over every token, each a part of [api] max_connections; a wait that ends frees its place."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import pytest

from runner.config import ApiToken
from runner.web.holding import Waits
from runner.web.problems import Problem


def _req(name: str) -> Any:
    return SimpleNamespace(context=SimpleNamespace(token=ApiToken(name, frozenset({"read"}), b"x")))


def test_a_token_holds_its_part_and_the_process_half_of_the_connections() -> None:
    """max_connections 40: a token holds 5 waits, every token together 20; past either,
    holding yields False and admit is a 429 with Retry-After; a wait that ends frees its
    place."""
    waits = Waits(40)
    with contextlib.ExitStack() as held:
        for _ in range(5):
            assert held.enter_context(waits.holding(_req("a")))
        with waits.holding(_req("a")) as more:
            assert more is False
        with pytest.raises(Problem) as refused:
            waits.admit(_req("a"))
        assert refused.value.status_code == 429 and "Retry-After" in refused.value.headers
        for name in ("b", "c", "d"):
            for _ in range(5):
                assert held.enter_context(waits.admit(_req(name)))
        assert sum(waits.held.values()) == 20
        with waits.holding(_req("e")) as newcomer:  # within its own part, past the process's
            assert newcomer is False
    assert waits.held == {}
    with waits.admit(_req("a")) as again:
        assert again


def test_the_bounds_are_parts_of_the_connections_the_open_file_limit_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under an open-file limit of 180, the server takes 116 connections, not the 1,000
    configured: a token's part and the process's are of those (one token's 125 waits took
    all 116, and an operator's request was reset)."""
    import resource

    from runner.web import holding

    monkeypatch.setattr(holding.resource, "getrlimit", lambda which: (180, 180))
    assert holding.open_file_room(1000) == 180 - holding.SPARE_FILES
    waits = Waits(1000)
    assert (waits.per_token, waits.most) == (116 // 8, 116 // 2)
    monkeypatch.setattr(holding.resource, "getrlimit", lambda which: (resource.RLIM_INFINITY,) * 2)
    assert holding.open_file_room(1000) == 1000


def test_event_streams_and_follows_count_against_the_process_bound_with_the_waits() -> None:
    """max_connections 40: the process holds at most 20 requests open, waits, event streams
    and follows together (each kind's per-token cap alone let four tokens' waits and one
    token's 25 streams fill the 40); past it a wait answers at once and a stream is
    refused naming the bound."""
    from runner.web.hub import Hub

    waits = Waits(40)
    streams = {"n": 0}
    waits.others.append(lambda: streams["n"])
    hub = Hub.__new__(Hub)
    hub.streams = set()
    hub.full = waits.full
    hub.room_cap = waits.per_token
    with contextlib.ExitStack() as held:
        for name in ("a", "b"):
            for _ in range(5):
                assert held.enter_context(waits.holding(_req(name)))
        assert hub.too_many_streams("c") is None
        streams["n"] = 10  # ten event streams or follows open
        assert waits.total() == 20
        assert "requests open" in (hub.too_many_streams("c") or "")
        with waits.holding(_req("c")) as more:
            assert more is False


def test_a_tokens_streams_are_held_to_its_part_of_a_small_processs_room() -> None:
    """max_connections 40: a token's event streams and follows are held to its part of
    the room (5), as its waits are, not to the fixed 32 (one token's 20 streams filled
    the process's bound of 20, refusing every other token's live feed)."""
    from runner.web.hub import STREAMS_PER_TOKEN, Hub, Stream
    from runner.web.watching import Followers

    waits = Waits(40)
    hub = Hub.__new__(Hub)
    hub.streams = {Stream(frozenset(), "a") for _ in range(5)}
    hub.full = waits.full
    hub.room_cap = 1 << 30
    assert hub.per_token == STREAMS_PER_TOKEN and hub.too_many_streams("a") is None
    hub.room_cap = waits.per_token
    assert "already holds 5 event streams" in (hub.too_many_streams("a") or "")
    assert hub.too_many_streams("b") is None
    followers = Followers()
    followers.room_cap = waits.per_token
    followers.open["a"] = 5
    with pytest.raises(Problem) as refused:
        followers.admit(_req("a"))
    assert refused.value.status_code == 429 and "5 follow streams" in str(refused.value.to_dict())
