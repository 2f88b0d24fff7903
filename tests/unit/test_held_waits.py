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
