"""The script transport: single calls go out on connections the Scripts keep for
themselves (not through redis-py's per-command pool checks). These pin what that must
not cost: NOSCRIPT reloads, error replies, dropped connections, threads and forks."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.exceptions import ResponseError

from runner.client import Request
from runner.store import transport
from runner.store.scripts import NewJob
from runner.worker.fetcher import CLAIM_FIELDS

from conftest import Project, wait_for

NOW = 1_800_000_000_000  # the scripts' test clock


def _job(job_id: str) -> NewJob:
    return NewJob(id=job_id, type="record", version=1, payload='{"n":1}', max_attempts=3,
                  run_at_ms=0, delay_ms=0, idem_key="", payload_hash="-", resource_key="", limits="")


def _enqueue(p: Project, job_id: str) -> Any:
    return p.runtime.scripts.enqueue(p.keys(), [_job(job_id)], now_ms=NOW)


def test_a_flushed_script_cache_is_reloaded_and_the_call_runs_once(project: Project) -> None:
    """After SCRIPT FLUSH the call answers NOSCRIPT, is loaded and sent again, and the job
    is enqueued exactly once."""
    _enqueue(project, "a")
    project.runtime.redis.script_flush()
    assert _enqueue(project, "b") == [1, "b", "queued"]
    assert project.runtime.redis.lrange(project.keys().ready, 0, -1) == ["b", "a"]


def test_an_error_reply_leaves_the_connection_in_step(project: Project) -> None:
    """A script that fails in Redis raises, and the next call on the same connection reads
    its own reply, not a leftover."""
    k = project.keys()
    project.runtime.redis.set(k.ready, "not a list")
    with pytest.raises(ResponseError):
        _enqueue(project, "a")
    project.runtime.redis.delete(k.ready)
    assert _enqueue(project, "b") == [1, "b", "queued"]


def test_a_connection_killed_by_the_server_is_replaced(project: Project) -> None:
    """CLIENT KILL of every runner connection: the next call fails at most once with a
    connection error, then a fresh connection carries the calls again."""
    _enqueue(project, "a")
    r = project.runtime.redis
    r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    try:
        _enqueue(project, "b")
    except Exception as exc:  # the killed socket may be noticed on this call
        assert "Connection" in type(exc).__name__ or "Timeout" in type(exc).__name__, exc
    assert _enqueue(project, "c") == [1, "c", "queued"]


def test_threads_never_share_a_connection(project: Project) -> None:
    """Eight threads enqueueing at once: every reply belongs to its own call."""
    errors: list[str] = []

    def run(t: int) -> None:
        for i in range(200):
            job_id = f"t{t}-{i}"
            out = _enqueue(project, job_id)
            if out != [1, job_id, "queued"]:
                errors.append(f"{job_id}: {out}")

    threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert project.runtime.redis.llen(project.keys().ready) == 1600


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_uses_connections_of_its_own(project: Project) -> None:
    """A child forked after the parent has called scripts must not read from the parent's
    sockets: both keep enqueueing correctly."""
    _enqueue(project, "parent-1")
    pid = os.fork()
    if pid == 0:  # the child: exit code 0 only when its own calls were answered right
        try:
            ok = all(_enqueue(project, f"child-{i}") == [1, f"child-{i}", "queued"] for i in range(50))
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    parent_ok = all(_enqueue(project, f"parent-{i}") == [1, f"parent-{i}", "queued"] for i in range(2, 52))
    _, status = os.waitpid(pid, 0)
    assert parent_ok and os.waitstatus_to_exitcode(status) == 0
    assert project.runtime.redis.llen(project.keys().ready) == 101


def _send(stream: Any, p: Project, *ids: str) -> None:
    stream.send(*p.runtime.scripts.enqueue_call(p.keys(), [_job(i) for i in ids], now_ms=NOW), tag=ids)


def test_a_stream_reads_replies_in_the_order_sent(project: Project) -> None:
    """Calls sent back to back without reading come back one reply each, in order, with
    their tags; the jobs land in ready in that order; the connection is then reused."""
    st = project.runtime.scripts.stream()
    _send(st, project, "a", "b")
    _send(st, project, "c")
    _send(st, project, "d")
    assert len(st) == 3
    got = [st.read() for _ in range(3)]
    assert [t for t, _ in got] == [("a", "b"), ("c",), ("d",)]
    assert got[0][1] == [1, "a", "queued", 1, "b", "queued"]
    assert project.runtime.redis.lrange(project.keys().ready, 0, -1) == ["d", "c", "b", "a"]
    assert st.conn is None and len(project.runtime.scripts._lanes.idle) >= 1  # type: ignore[union-attr]
    assert _enqueue(project, "e") == [1, "e", "queued"]


def test_a_stream_after_script_flush_runs_every_call_once_in_order(project: Project) -> None:
    """Every streamed call answered NOSCRIPT did not run: each is loaded and sent again
    when its reply is read, so each job is enqueued exactly once, in order."""
    _enqueue(project, "a")
    project.runtime.redis.script_flush()
    st = project.runtime.scripts.stream()
    for i in "bcd":
        _send(st, project, i)
    assert [st.read()[1] for _ in range(3)] == [[1, i, "queued"] for i in "bcd"]
    assert project.runtime.redis.lrange(project.keys().ready, 0, -1) == ["d", "c", "b", "a"]


def test_a_stream_error_drops_the_connection_and_the_replies_still_owed(project: Project) -> None:
    """An error reply raises and drops the connection with the replies still owed on it,
    so the next call reads its own reply, not a leftover of the stream."""
    k, r = project.keys(), project.runtime.redis
    r.set(k.ready, "not a list")
    st = project.runtime.scripts.stream()
    _send(st, project, "a")
    _send(st, project, "b")
    with pytest.raises(ResponseError):
        st.read()
    assert len(st) == 0 and st.conn is None
    r.delete(k.ready)
    assert _enqueue(project, "c") == [1, "c", "queued"]
    assert r.lrange(k.ready, 0, -1) == ["c"]


def test_enqueue_many_streams_chunks_across_queues_and_keeps_request_order(project: Project) -> None:
    """Far more jobs than one chunk, for two queues, with refusals in between: every
    request gets its own answer in its own place, and each queue's ready list holds its
    jobs in the order given."""
    from runner.client import STREAM_CHUNK, Request
    from runner.errors import UnknownFunction, ValidationFailed

    reqs: list[Request] = []
    for i in range(STREAM_CHUNK * 5 + 7):
        if i % 97 == 3:
            reqs.append(Request("nope", {}))
        elif i % 89 == 5:
            reqs.append(Request("record", {"n": "not a number"}))
        else:
            reqs.append(Request("record", {"n": i}) if i % 3 else Request("slow", {"seconds": i}))
    out = project.client.enqueue_many(reqs, batch=10_000)
    assert len(out) == len(reqs)
    fast: list[str] = []
    slow: list[str] = []
    for req, res in zip(reqs, out, strict=True):
        if req.type == "nope":
            assert isinstance(res, UnknownFunction)
        elif req.payload.get("n") == "not a number":
            assert isinstance(res, ValidationFailed)
        else:
            assert not isinstance(res, Exception), res
            assert res.queue == ("fast" if req.type == "record" else "slow") and not res.duplicate
            (fast if res.queue == "fast" else slow).append(res.id)
    r = project.runtime.redis
    assert r.lrange(project.keys("fast").ready, 0, -1)[::-1] == fast
    assert r.lrange(project.keys("slow").ready, 0, -1)[::-1] == slow


def _spin_enqueue(p: Project, job_id: str) -> Any:
    return p.runtime.scripts.enqueue(p.keys(), [_job(job_id)], spin=True, now_ms=NOW)


def test_polling_for_a_reply_reads_the_same_replies_and_errors(project: Project) -> None:
    """A call that polls for its reply reads its own reply, through a NOSCRIPT reload, an
    error reply and a dropped connection alike (a kept connection the server closed while
    idle is reopened as it is taken, before anything is sent on it)."""
    assert _spin_enqueue(project, "a") == [1, "a", "queued"]
    project.runtime.redis.script_flush()
    assert _spin_enqueue(project, "b") == [1, "b", "queued"]
    project.runtime.redis.set(project.keys().ready, "not a list")
    with pytest.raises(ResponseError):
        _spin_enqueue(project, "c")
    project.runtime.redis.delete(project.keys().ready)
    project.runtime.redis.client_kill_filter(_type="normal", skipme=True)
    assert _spin_enqueue(project, "d") == [1, "d", "queued"]
    assert _spin_enqueue(project, "e") == [1, "e", "queued"]
    assert sorted(project.runtime.redis.lrange(project.keys().ready, 0, -1)) == ["d", "e"]


def test_polling_pauses_while_replies_keep_coming_late(project: Project) -> None:
    """Replies held up past the polling budget (the server paused): after MISSES of them
    in a row the calls stop polling for the next SKIP calls; every reply is still read."""
    spin = project.runtime.scripts._spin
    admin = project.runtime.redis
    for i in range(spin.MISSES):
        # The script writes, so it waits out the pause. 50 ms, not 5: the server ends a pause
        # at its next cron tick, every 2 ms at the high hz it takes on with many clients, so
        # a 5 ms pause could end before a test process under load sent its call.
        admin.execute_command("CLIENT", "PAUSE", 50, "WRITE")
        assert _spin_enqueue(project, f"late{i}") == [1, f"late{i}", "queued"]
    assert spin.skip == spin.SKIP and spin.misses == 0
    assert _spin_enqueue(project, "next") == [1, "next", "queued"]
    assert spin.skip == spin.SKIP - 1


def test_the_poll_returns_at_once_when_the_reply_is_there_and_after_the_budget_when_not() -> None:
    import socket
    import time

    from runner.store.transport import _Spin

    class Conn:
        def __init__(self, sock: socket.socket) -> None:
            self._sock = sock

    a, b = socket.socketpair()
    try:
        spin = _Spin()
        spin.misses = 3
        b.sendall(b"+OK\r\n")
        spin.wait(Conn(a))
        assert spin.misses == 0  # found the reply: a wait past the budget would count a miss
        a.recv(16)
        t = time.perf_counter()
        spin.wait(Conn(a))
        assert time.perf_counter() - t >= spin.BUDGET_S and spin.misses == 1
        conn = Conn(a)
        for _ in range(spin.MISSES - 1):  # one miss is counted already
            spin.wait(conn)
        assert spin.skip == spin.SKIP
        spin.wait(conn)  # skipped: no polling at all
        assert spin.skip == spin.SKIP - 1 and spin.misses == 0
    finally:
        a.close()
        b.close()


def test_a_batch_after_script_flush_runs_every_call_once(project: Project) -> None:
    """A settle batch goes out in one write on a kept connection: after SCRIPT FLUSH each
    call answers NOSCRIPT, is loaded and sent again on its own, and runs once."""
    sc, k = project.runtime.scripts, project.keys()
    project.runtime.redis.script_flush()
    batch = sc.batch()
    sc.enqueue(k, [_job("a")], pipe=batch, now_ms=NOW)
    sc.enqueue(k, [_job("b")], pipe=batch, now_ms=NOW)
    assert batch.execute() == [[1, "a", "queued"], [1, "b", "queued"]]
    assert project.runtime.redis.lrange(k.ready, 0, -1) == ["b", "a"]


PAD = "p" * 6000  # a payload's padding: two such calls pass the WRITE_BYTES the tests set


def _held_in_pause(p: Project, send: Callable[[], Any]) -> tuple[int, Any]:
    """Runs ``send`` on a thread while writes are paused: the bytes Redis read of it and
    holds (the command parsed and held, argv-mem, and those behind it, qbuf; it reads a
    held client on, and would run all it read back to back), then its result once the
    pause ends."""
    own = redis.Redis.from_url(p.server.url)  # (not the pool's: the kept connections come from it)
    me = own.client_id()
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(send()))

    def held() -> int:
        return sum(int(c["qbuf"]) + int(c["argv-mem"]) for c in own.client_list() if int(c["id"]) != me)

    own.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")
    try:
        t.start()
        wait_for(lambda: held() > len(PAD), what="a first write to wait in the pause")
        time.sleep(0.2)  # (a second write, were one sent, would be read within it)
        read = held()
    finally:
        own.execute_command("CLIENT", "UNPAUSE")
        own.close()
    t.join(10)
    return read, out[0]


def test_a_batch_past_the_write_bound_goes_in_writes_each_once_the_last_is_answered(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past transport.WRITE_BYTES a batch goes in several writes on one connection: with
    writes paused Redis holds the first alone, and once let go every call runs once, in
    order, each reply in its place, the scripts' loads (after SCRIPT FLUSH) ahead of the
    first."""
    sc, k, r = project.runtime.scripts, project.keys(), project.runtime.redis
    monkeypatch.setattr(transport, "WRITE_BYTES", 10_000)
    r.script_flush()
    sc.loaded.clear()
    batch = sc.batch()
    for name in ("a", "b", "c"):
        sc.enqueue(k, [_job(name)._replace(payload=f'{{"pad":"{PAD}"}}')], pipe=batch, now_ms=NOW)
    held, replies = _held_in_pause(project, batch.execute)
    assert held < 2 * len(PAD)
    assert replies == [[1, "a", "queued"], [1, "b", "queued"], [1, "c", "queued"]]
    assert r.lrange(k.ready, 0, -1) == ["c", "b", "a"]


def _cut_before_write(monkeypatch: pytest.MonkeyPatch, r: Any, which: tuple[int, ...],
                      after_send: bool = False) -> list[int]:
    """Kills the kept connection (CLIENT KILL by the server) at each ``which``-th write of
    a split round trip (from 0, the writes sent again counted), before it goes out or,
    ``after_send``, once it went out and before its reply is read; the list counts the
    kills."""
    real = transport.Transport._exchange
    kills: list[int] = []
    seen = [0]

    def exchange(self: Any, conn: Any, packed: Any, n: int, replies: list[Any]) -> None:
        seen[0] += 1
        if seen[0] - 1 not in which:
            return real(self, conn, packed, n, replies)
        host, port = conn._sock.getsockname()[:2]
        if after_send:
            conn.send_packed_command(packed)
        r.execute_command("CLIENT", "KILL", "ADDR", f"{host}:{port}")
        kills.append(1)
        if after_send:
            conn.read_response()  # (the reply is lost with the connection: this raises)
        return real(self, conn, packed, n, replies)

    monkeypatch.setattr(transport.Transport, "_exchange", exchange)
    return kills


def _claimed(project: Project, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """Jobs enqueued and claimed to start: (id, token) each."""
    sc, k = project.runtime.scripts, project.keys()
    sc.enqueue(k, [_job(n) for n in names], now_ms=NOW)
    reply = sc.claim(k, n=len(names), start=len(names), lease_ms=60_000, token_base="t", dead_ttl_ms=10**9,
                     done_ttl_ms=10**9, now_ms=NOW)
    return [(reply[i], reply[i + 1]) for i in range(2, len(reply), CLAIM_FIELDS)]


def test_a_split_settlement_cut_between_writes_keeps_the_answered_replies_and_sends_the_rest(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection lost after the first writes of a split round trip of settlements were
    answered (and the fresh one lost too, before its first write): their replies are kept,
    and only the calls not yet answered go out again on a fresh connection, so each ack
    lands once and the caller gets every reply in its place (the whole batch sent again
    had the landed acks refused by their fences: false "lease lost" warnings, and
    successes never counted)."""
    from runner.store.scripts import Ack

    sc, k, r = project.runtime.scripts, project.keys(), project.runtime.redis
    held = _claimed(project, ("a", "b", "c"))
    monkeypatch.setattr(transport, "WRITE_BYTES", 10_000)
    r.script_flush()
    sc.loaded.clear()  # (the script's load is the first write; the ack of "b" the third)
    kills = _cut_before_write(monkeypatch, r, which=(2, 3))  # (the second before a fresh write)
    batch = sc.batch()
    for jid, token in held:
        sc.ack(k, [Ack(jid, token, f'{{"pad":"{PAD}"}}', "", "")], 10**9, pipe=batch, now_ms=NOW)
    replies = batch.execute()
    assert kills == [1, 1] and [int(x[0]) if isinstance(x, list) else int(x) for x in replies] == [1, 1, 1], replies


def test_a_split_enqueue_cut_between_writes_is_not_sent_again(project: Project,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Enqueues are not fenced: a split round trip of them cut after some were answered
    raises (the caller says which jobs are undetermined), never sends a call again (a
    job without an idempotency key would be written twice)."""
    sc, k, r = project.runtime.scripts, project.keys(), project.runtime.redis
    monkeypatch.setattr(transport, "WRITE_BYTES", 10_000)
    kills = _cut_before_write(monkeypatch, r, which=(1,), after_send=True)
    batch = sc.batch()
    for name in ("a", "b", "c"):
        sc.enqueue(k, [_job(name)._replace(payload=f'{{"pad":"{PAD}"}}')], pipe=batch, now_ms=NOW)
    with pytest.raises(redis.ConnectionError):
        batch.execute()
    assert kills == [1]
    assert sorted(r.lrange(k.ready, 0, -1)) in (["a"], ["a", "b"])  # (each at most once; "c" never sent)


def test_enqueue_many_streams_within_the_write_bound(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """enqueue_many sends a call once those in flight and it hold WRITE_BYTES of payloads
    at most (one call whatever its size): with writes paused Redis holds one call, not the
    window's; every job is enqueued once, in order."""
    monkeypatch.setattr(transport, "WRITE_BYTES", 10_000)
    client = project.client
    first = client.enqueue_many([Request("record", {"n": 0})])  # (its producer's tags recorded: a write)
    held, out = _held_in_pause(project, lambda: client.enqueue_many(
        [Request("record", {"n": i, "pad": PAD}) for i in range(1, 6)], batch=1))
    assert held < 2 * len(PAD)
    assert [o.status for o in out] == ["queued"] * 5
    assert project.runtime.redis.lrange(project.keys().ready, 0, -1) == [o.id for o in reversed(first + out)]


def test_a_batch_with_an_error_reply_raises_it_and_leaves_the_connection_in_step(project: Project) -> None:
    """One call of a batch failing in Redis: every reply is read (the call after it ran),
    the error is raised, and the next call on the kept connection reads its own reply."""
    sc, k, r = project.runtime.scripts, project.keys(), project.runtime.redis
    other = project.keys("slow")
    r.set(k.ready, "not a list")
    batch = sc.batch()
    sc.enqueue(k, [_job("a")], pipe=batch, now_ms=NOW)
    sc.enqueue(other, [_job("b")], pipe=batch, now_ms=NOW)
    with pytest.raises(ResponseError):
        batch.execute()
    assert r.lrange(other.ready, 0, -1) == ["b"]
    r.delete(k.ready)
    for _ in range(3):  # whichever kept connection a call takes, it is in step
        assert _enqueue(project, "c")[1] == "c"
        r.delete(k.job("c"))


def _woken(p: Project, wait_s: float = 0.2) -> tuple[Any, Any]:
    return p.runtime.scripts.claim_woken(p.keys(), wait_s, n=4, start=4, lease_ms=30_000, token_base="w.1",
                                         dead_ttl_ms=10**7, done_ttl_ms=10**7)


def test_a_claim_behind_a_wake_up_runs_when_the_wake_up_comes(project: Project) -> None:
    """claim_woken sends the BLPOP of the notify list and the claim in one write: with a
    wake-up waiting, the claim runs at once and takes the job; the token is consumed."""
    _enqueue(project, "a")  # (it pushes a wake-up)
    rang, reply = _woken(project)
    assert rang == [project.keys().notify, "1"]
    assert reply[2] == "a" and len(reply) == 2 + CLAIM_FIELDS
    assert project.runtime.redis.llen(project.keys().notify) == 0


def test_a_claim_behind_a_wake_up_runs_at_the_timeout_too(project: Project) -> None:
    """No wake-up within the wait: the claim runs when the BLPOP times out, and finds a job
    that came without one (a wake-up lost to a restart of Redis costs at most the wait)."""
    r, k = project.runtime.redis, project.keys()
    _enqueue(project, "a")
    r.delete(k.notify)
    rang, reply = _woken(project, 0.1)
    assert rang is None and reply[2] == "a"



@pytest.mark.parametrize("first_wait", [True, False])
def test_unblock_ends_a_wait_at_once_and_the_claim_behind_it_still_runs(project: Project, first_wait: bool) -> None:
    """unblock(notify) ends a claim_woken blocked on that list as if its wait had timed
    out (a stopping worker's fetcher waited out the whole second): the claim behind it
    runs and its reply is read, here taking a job that came without a wake-up; on a
    connection's first wait (its id asked in the same write) and on a later one."""
    r, k = project.runtime.redis, project.keys()
    if not first_wait:
        _woken(project, 0.01)
    _enqueue(project, "a")
    r.delete(k.notify)
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(_woken(project, 30)))
    t.start()
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:  # until it blocks, then once more for the race
        project.runtime.scripts.unblock(k.notify)
        t.join(0.02)
    t.join(5)
    assert got, "the wait was not ended"
    rang, reply = got[0]
    assert rang is None and reply[2] == "a"
    assert _enqueue(project, "b") == [1, "b", "queued"]  # the connection is in step

def test_a_failed_wake_up_still_returns_what_the_claim_took(project: Project) -> None:
    """A notify list damaged to another type fails the BLPOP, but the claim behind it ran:
    its reply comes back beside the error (the caller takes the jobs, then reports the
    error), and the connection stays in step."""
    r, k = project.runtime.redis, project.keys()
    _enqueue(project, "a")
    r.delete(k.notify)
    r.set(k.notify, "not a list")
    rang, reply = _woken(project)
    assert isinstance(rang, ResponseError) and "WRONGTYPE" in str(rang)
    assert reply[2] == "a"
    assert _enqueue(project, "b") == [1, "b", "queued"]


def test_a_claim_behind_a_wake_up_is_reloaded_after_a_script_flush(project: Project) -> None:
    """After SCRIPT FLUSH the claim behind the BLPOP answers NOSCRIPT: it is loaded and
    sent again alone, and takes the job once."""
    _enqueue(project, "a")
    project.runtime.redis.script_flush()
    rang, reply = _woken(project)
    assert rang is not None and reply[2] == "a"
    assert _woken(project, 0.05)[1][2:] == []


def test_a_script_flush_storm_never_reaches_a_caller(project: Project) -> None:
    """SCRIPT FLUSH every millisecond for 2 s from another client while single calls,
    batches, streams, enqueue_many and aenqueue run: a flush can land between a reload and
    its call, so each call is reloaded until it runs. No NOSCRIPT reaches a caller and
    every job is written exactly once."""
    import asyncio
    import time

    import redis as redis_py

    from runner.client import Request

    sc, k, client = project.runtime.scripts, project.keys(), project.client
    flusher = redis_py.Redis.from_url(project.server.url)
    stop = threading.Event()
    ids: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def flush() -> None:
        while not stop.is_set():
            flusher.script_flush()
            time.sleep(0.001)

    def run(name: str, step: Any) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                got = step(f"{name}{n}")
            except BaseException as exc:  # counted, then asserted on
                with lock:
                    errors.append(exc)
                continue
            with lock:
                ids.extend(got)

    def single(i: str) -> list[str]:
        assert sc.enqueue(k, [_job(i)], now_ms=NOW)[0] == 1
        return [i]

    def batch(i: str) -> list[str]:
        b = sc.batch()
        for j in "ab":
            sc.enqueue(k, [_job(i + j)], pipe=b, now_ms=NOW)
        assert [r[0] for r in b.execute()] == [1, 1]
        return [i + "a", i + "b"]

    def stream(i: str) -> list[str]:
        st = sc.stream()
        for j in "ab":
            _send(st, project, i + j)
        assert [st.read()[1][0] for _ in "ab"] == [1, 1]
        return [i + "a", i + "b"]

    def many(i: str) -> list[str]:
        return [e.id for e in client.enqueue_many([Request("record", {"n": n}) for n in range(20)])]

    def aenqueue(i: str) -> list[str]:
        async def go() -> list[str]:
            return [(await client.aenqueue("record", {"n": n})).id for n in range(10)]
        return asyncio.run(go())

    threads = [threading.Thread(target=flush)] + [
        threading.Thread(target=run, args=(name, step))
        for name, step in (("s", single), ("b", batch), ("t", stream), ("m", many), ("a", aenqueue))]
    for t in threads:
        t.start()
    time.sleep(2)
    stop.set()
    for t in threads:
        t.join(30)
    flusher.close()
    assert errors == [], errors[:3]
    ready = project.runtime.redis.lrange(k.ready, 0, -1)
    assert len(ids) > 100 and sorted(ready) == sorted(ids)


def test_a_call_answered_noscript_runs_by_its_source_on_the_first_reload(project: Project) -> None:
    """A call answered NOSCRIPT is sent again by its source (EVAL, which cannot answer
    NOSCRIPT) behind a SCRIPT LOAD: it runs on that one reload even when its SHA never
    matches (here: sent by a SHA that is not its source's, as if a flush came between
    every load and call). A single call, a batch, a stream, the event loop's path and a
    Link's batch: each job written once, one load and one EVAL per call."""
    import asyncio

    from runner.store import link, transport
    from runner.store.aiolink import AsyncLink
    from runner.store.sources import SHAS

    class Forgotten(dict[str, str]):
        def __missing__(self, name: str) -> str:
            return SHAS[name]

    sc, k = project.runtime.scripts, project.keys()
    sc.shas = Forgotten(enqueue="0" * 40)
    sc.loaded.add("enqueue")  # known loaded (then flushed): a batch sends no load ahead of its call
    r = project.runtime.redis
    r.config_resetstat()

    assert sc.enqueue(k, [_job("a")], now_ms=NOW) == [1, "a", "queued"]
    b = sc.batch()
    sc.enqueue(k, [_job("b")], pipe=b, now_ms=NOW)
    assert b.execute() == [[1, "b", "queued"]]
    st = sc.stream()
    _send(st, project, "c")
    assert st.read()[1] == [1, "c", "queued"]

    async def on_loop() -> list[Any]:
        aio = AsyncLink(link.address(project.server.url))  # type: ignore[arg-type]
        try:
            return await transport.send_on_loop(aio, sc, [sc.enqueue_call(k, [_job("d")], NOW)])
        finally:
            aio.close()

    assert asyncio.run(on_loop()) == [[1, "d", "queued"]]
    raw = link.Link(link.address(project.server.url))  # type: ignore[arg-type]
    try:
        lb = transport.LinkScripts(raw).batch()
        lb.add(*sc.enqueue_call(k, [_job("e")], NOW))
        with pytest.MonkeyPatch.context() as mp:
            mp.setitem(SHAS, "enqueue", "0" * 40)
            assert lb.execute() == [[1, "e", "queued"]]
    finally:
        raw.close()
    stats = r.info("commandstats")
    assert int(stats["cmdstat_script|load"]["calls"]) == 5 and int(stats["cmdstat_eval"]["calls"]) == 5
    assert sorted(r.lrange(k.ready, 0, -1)) == list("abcde")


def test_a_server_that_flushes_before_every_write_runs_each_call_once_on_its_one_reload(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis forgets every script just before each write reaches it (a SCRIPT FLUSH sent
    first, on a connection of its own, before every write of redis-py's connections, a
    Link and the event loop's link): each EVALSHA answers NOSCRIPT, and so would any retry
    by SHA, however often repeated. The one reload sends the call by its source (EVAL,
    behind a SCRIPT LOAD in one write), which cannot answer NOSCRIPT even though a flush
    precedes it too, so every path ends on its first reload: a single call, a batch, a
    stream, enqueue, enqueue_many, the shared round trip, aenqueue and a Link's batch each
    write their jobs once, no NoScriptError reaches the caller, and no call goes out a
    third time (one EVALSHA and one EVAL per call)."""
    import asyncio

    import redis.connection

    from runner.client import Request
    from runner.store import aiolink, link, transport

    flusher = link.Link(link.address(project.server.url))  # type: ignore[arg-type]
    flushes = [0]

    def flush() -> None:
        flusher.send([("SCRIPT", "FLUSH")])
        flushes[0] += 1

    packed = redis.connection.AbstractConnection.send_packed_command

    def flushed_first(conn: Any, command: Any, check_health: bool = True) -> None:
        flush()
        packed(conn, command, check_health)

    sent = link.Link.send

    def link_flushed_first(self: link.Link, commands: Any) -> list[Any]:
        if self is not flusher:
            flush()
        return sent(self, commands)

    asent = aiolink.AsyncLink.send

    async def aio_flushed_first(self: aiolink.AsyncLink, commands: Any) -> list[Any]:
        flush()
        return await asent(self, commands)

    sc, k, client, r = project.runtime.scripts, project.keys(), project.client, project.runtime.redis
    sc.prepare()
    r.config_resetstat()
    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", flushed_first)
    monkeypatch.setattr(link.Link, "send", link_flushed_first)
    monkeypatch.setattr(aiolink.AsyncLink, "send", aio_flushed_first)
    ids = []
    assert sc.enqueue(k, [_job("a")], now_ms=NOW)[0] == 1
    b = sc.batch()
    sc.enqueue(k, [_job("b")], pipe=b, now_ms=NOW)
    sc.enqueue(k, [_job("c")], pipe=b, now_ms=NOW)
    assert [x[0] for x in b.execute()] == [1, 1]
    st = sc.stream()
    _send(st, project, "d")
    _send(st, project, "e")
    assert [st.read()[1][0] for _ in "de"] == [1, 1]
    ids += ["a", "b", "c", "d", "e"]
    ids.append(client.enqueue("record", {"n": 1}).id)
    ids += [e.id for e in client.enqueue_many([Request("record", {"n": n}) for n in range(3)])]  # type: ignore[union-attr]
    ids += [e.id for e in client._send_prepared([client.prepare(Request("record", {"n": n})) for n in range(2)])]  # type: ignore[attr-defined]

    async def on_loop() -> list[str]:
        return [(await client.aenqueue("record", {"n": n})).id for n in range(2)]

    ids += asyncio.run(on_loop())
    raw = link.Link(link.address(project.server.url))  # type: ignore[arg-type]
    try:
        lb = transport.LinkScripts(raw).batch()
        lb.add(*sc.enqueue_call(k, [_job("f")], NOW))
        assert lb.execute()[0][0] == 1
    finally:
        raw.close()
    ids.append("f")
    monkeypatch.undo()
    flusher.close()
    stats = r.info("commandstats")
    # Each call went out by SHA once (one of a batch that loads ahead in its write runs at
    # once) and, answered NOSCRIPT, once by its source: none was sent by SHA a second time.
    calls = 11  # single 1, batch 2, stream 2, enqueue 1, enqueue_many 1, shared 1, aenqueue 2, Link 1
    evalsha, noscript = int(stats["cmdstat_evalsha"]["calls"]), int(stats["cmdstat_evalsha"]["failed_calls"])
    assert evalsha == calls and noscript == int(stats["cmdstat_eval"]["calls"])
    assert flushes[0] >= evalsha + noscript
    assert sorted(r.lrange(k.ready, 0, -1)) == sorted(ids) and len(set(ids)) == 14


def test_enqueues_on_every_path_under_a_flush_every_30_ms_are_all_written_once(project: Project) -> None:
    """SCRIPT FLUSH every 30 ms from another client while 500 jobs go through each enqueue
    path at once (enqueue one by one, enqueue_many and enqueue_all in tens, the shared
    round trip in tens, aenqueue one by one): no call fails, no NoScriptError reaches a
    caller, and every job answered is in ready, once."""
    import asyncio

    import redis as redis_py

    from runner.client import Request

    client = project.client
    flusher = redis_py.Redis.from_url(project.server.url)
    stop = threading.Event()
    errors: list[BaseException] = []
    ids: list[str] = []

    def flush() -> None:
        while not stop.wait(0.03):
            flusher.script_flush()

    def tens(send: Any) -> Any:
        def run() -> None:
            for _ in range(50):
                try:
                    ids.extend(e.id for e in send([Request("record", {"n": n}) for n in range(10)]))
                except BaseException as exc:  # counted, then asserted on
                    errors.append(exc)
        return run

    def single() -> None:
        for n in range(500):
            try:
                ids.append(client.enqueue("record", {"n": n}).id)
            except BaseException as exc:
                errors.append(exc)

    def on_loop() -> None:
        async def go() -> None:
            for n in range(500):
                try:
                    ids.append((await client.aenqueue("record", {"n": n})).id)
                except BaseException as exc:
                    errors.append(exc)
        asyncio.run(go())

    paths = [single, on_loop, tens(client.enqueue_many), tens(client.enqueue_all),
             tens(lambda reqs: client._send_prepared([client.prepare(r) for r in reqs]))]
    flushing = threading.Thread(target=flush)
    flushing.start()
    threads = [threading.Thread(target=p) for p in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    flushing.join()
    flusher.close()
    assert errors == [], errors[:3]
    assert len(ids) == 2500 and sorted(project.runtime.redis.lrange(project.keys().ready, 0, -1)) == sorted(ids)
