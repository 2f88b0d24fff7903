"""One helper words every outage for a caller, and says the next step that fits: Redis
refusing while it answers (maxmemory, a read-only replica, a failed save, a long
script, loading, a cluster failover) is no unreachable Redis, and checking that it runs
or where REDIS_URL points helps with none of them."""

from __future__ import annotations

import pytest
import redis
from redis.exceptions import ClusterDownError, OutOfMemoryError, ReadOnlyError, TryAgainError

from runner.errors import RedisUnavailable
from runner.store import link
from runner.store.connection import PersistenceFailed, RedisBusy, refusal, unreachable

UNREACHABLE = "check that it runs and that REDIS_URL"


@pytest.mark.parametrize(("exc", "code", "step"), [
    (OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), "OOM", "raise maxmemory"),
    (PersistenceFailed("Redis is configured to save RDB snapshots, but it's unable"), "MISCONF", "see its log"),
    (ReadOnlyError("You can't write against a read only replica."), "READONLY", "at the master"),
    (RedisBusy("Redis is busy running a script."), "BUSY", "SCRIPT KILL"),
    (redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"), "LOADING", "once it has loaded"),
    (ClusterDownError("The cluster is down"), "CLUSTER", "slot migration"),
    (TryAgainError("Multiple keys request during rehashing of slot"), "CLUSTER", "slot migration"),
])
def test_a_refusal_says_what_redis_refused_and_what_helps(exc: BaseException, code: str, step: str) -> None:
    assert refusal(exc) == code
    text = str(unreachable(exc, "; 3 of 5 job(s) written"))
    assert step in text and "3 of 5 job(s) written" in text, text
    assert "unreachable" not in text and UNREACHABLE not in text, text


def test_a_refusal_from_the_event_loop_link_is_told_apart_by_its_code() -> None:
    """The raw links raise RedisUnavailable for an OOM reply with the reply as cause: the
    wording reads the code there."""
    reply = link.reply_error("OOM command not allowed when used memory > 'maxmemory'.")
    raised = link.raised(reply)
    assert isinstance(raised, RedisUnavailable)
    assert refusal(raised) == "OOM"
    assert "raise maxmemory" in str(unreachable(raised))


@pytest.mark.parametrize("exc", [redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused."),
                                 redis.TimeoutError("Timeout reading from socket"),
                                 RedisUnavailable("Connection closed by server.")])
def test_a_lost_connection_is_unreachable(exc: BaseException) -> None:
    assert refusal(exc) is None
    text = str(unreachable(exc))
    assert text.startswith("Redis is unreachable: ") and UNREACHABLE in text


def test_a_refusal_in_a_pipeline_is_worded_without_redis_py_s_command_prefix() -> None:
    """redis-py puts the pipeline's command (its keys) before Redis's words: the helper
    says Redis's words only, as for a single command (client.stats() under BUSY)."""
    exc = RedisBusy("Command # 1 (LLEN app:{fast}:ready) of pipeline caused error: Redis is busy running a script.")
    text = str(unreachable(exc))
    assert text.startswith("Redis is busy: Redis is busy running a script.;"), text
    assert "pipeline" not in text and "LLEN" not in text, text
