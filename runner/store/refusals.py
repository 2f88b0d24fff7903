"""How Redis refused while it answered, and the one wording of an outage per kind: what
the client, the CLI and HTTP all say (``unreachable``). Apart from connection.py so that a
command on the raw link (`runner job`, `runner stats`) words its outage without importing
redis-py; connection.py re-exports both functions.
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING, Any

from runner.errors import RedisUnavailable
from runner.store import link

if TYPE_CHECKING:
    from collections.abc import Sequence

    from runner.store.keys import QueueKeys


def _classes() -> tuple[tuple[type[BaseException], str], ...]:
    """redis-py's refused error classes and their kinds, once redis-py is loaded: before
    that no error of its can exist, and a raw link's command does not pay for loading it."""
    if "redis" not in sys.modules:
        return ()
    from runner.store.connection import _REFUSED_CLASSES

    return _REFUSED_CLASSES


# What Redis said when it answered but refused (its error code), and the next step for
# each: unlike a lost connection, checking that Redis runs or where REDIS_URL points
# helps with none of these.
_REFUSALS: dict[str, str] = {
    "OOM": "Redis refused the write: {exc}{told}; it is at its maxmemory: free memory (shorter "
           "retention, drained queues) or raise maxmemory, then retry",
    "MISCONF": "Redis refused the write: {exc}{told}; it cannot save its data (see its log: a full disk, "
               "a failing save) and refuses writes until it can: fix that, then retry",
    "READONLY": "Redis refused the write: {exc}{told}; this server is a read-only replica (a failover "
                "under way, or REDIS_URL pointing at a replica): retry once the master is back, or point "
                "REDIS_URL or [redis] url at the master",
    "BUSY": "Redis is busy: {exc}{told}; a script runs past its time limit and Redis answers nothing "
            "else: retry once it ends (SCRIPT KILL ends a script that wrote nothing)",
    "LOADING": "Redis is loading its data: {exc}{told}; retry once it has loaded",
    "CLUSTER": "Redis Cluster cannot serve this now: {exc}{told}; a failover or slot migration is under "
               "way: retry shortly (if it lasts, check the cluster with redis-cli --cluster check)",
}
_REFUSED_CODES = {"OOM": "OOM", "MISCONF": "MISCONF", "READONLY": "READONLY", "BUSY": "BUSY",
                  "LOADING": "LOADING", "CLUSTERDOWN": "CLUSTER", "MASTERDOWN": "CLUSTER", "TRYAGAIN": "CLUSTER"}


def refusal(exc: BaseException | None) -> str | None:
    """How Redis refused while it answered, None for anything else (a connection lost or
    refused): "OOM", "MISCONF", "READONLY", "BUSY", "LOADING" or "CLUSTER". Read off
    redis-py's error classes, an event-loop link's reply code, or the cause of a
    RedisUnavailable made from either. A refused command ran nowhere: nothing of it was
    written."""
    found = _refused(exc)
    return None if found is None else found[0]


_PIPELINED = re.compile(r"^Command # \d+ \(.*\) of pipeline caused error: ", re.S)


def _refused(exc: BaseException | None) -> tuple[str, BaseException] | None:
    """The refusal's kind and the error that carries Redis's own words, along a short
    chain (a RedisUnavailable, worded already or not, <- the reply)."""
    seen = 0
    while exc is not None and seen < 4:
        for cls, code in _classes():
            if isinstance(exc, cls):
                return code, exc
        if isinstance(exc, link.ReplyError) and exc.code in _REFUSED_CODES:
            return _REFUSED_CODES[exc.code], exc
        exc, seen = exc.__cause__, seen + 1
    return None


def unreachable(exc: BaseException, told: str = "") -> RedisUnavailable:
    """What an outage (one of UNAVAILABLE) becomes for a caller of the public API, the
    CLI and HTTP: one error, RedisUnavailable, in one wording per kind: what happened,
    ``told`` (what became of the call: a batch's count, "nothing was written"), and what
    to do. Redis refusing while it answers (maxmemory, a read-only replica, a failed
    save, a long script, loading, a cluster failover) gets its own next step, in Redis's
    own words (never those of an error worded here already); anything else is
    unreachable. Raise it ``from exc``."""
    found = _refused(exc)
    if found is not None:
        code, said = found
        # (redis-py names the pipeline's command before Redis's words: its keys are no
        # reader's business)
        words = _PIPELINED.sub("", str(said))
        return RedisUnavailable(_REFUSALS[code].format(exc=words, told=told))
    return RedisUnavailable(f"Redis is unreachable: {exc}{told}; retry once it answers (check that it runs "
                            "and that REDIS_URL or [redis] url points at it)")


def left_out(job_ids: Sequence[str], away: Sequence[tuple[QueueKeys, BaseException]],
             redis: Any) -> RedisUnavailable:
    """The outage for jobs found on none of the masters that answered while ``away``'s
    partitions did not: they may be there, so no "no such job" (which a caller takes for
    good), but the outage's one wording, naming the partitions and their masters."""
    from runner.store.shards import node_of

    held = ", ".join(f"{{{k.tag}}}" + (f" on {node}" if (node := node_of(redis, k.ready)) else "")
                     for k, _ in away)
    what = f"job {job_ids[0]}" if len(job_ids) == 1 else f"{len(job_ids)} jobs"
    said = unreachable(away[0][1], f"; {what} not found on the masters that answered, and may be in "
                                   f"partition {held}")
    return RedisUnavailable(str(said), left_out=[(k.queue, k.tag) for k, _ in away])
