"""The store's own connection for one-shot reads (store/link.py) against real servers:
every URL form it takes connects as the URL says (AUTH, SELECT, the client's name), each
failure comes with redis-py's words and kind, a flushed script cache is loaded again, and
`runner stats` and `runner job` print the same through it as through redis-py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from runner.cli import cli
from runner.config import RedisConfig
from runner.errors import RedisUnavailable
from runner.store import connection, link, records, transport
from runner.store.aiolink import AsyncLink
from runner.store.embedded import Server, free_port
from runner.store.sources import SHAS
from runner.worker.worker import Worker

from conftest import LoopTicks, Project, wait_for

PASSWORD = "pw-default"
ALICE = "pw-alice"


@dataclass
class Guarded:
    """A server that wants a password (requirepass), with an ACL user alice and a unix socket."""

    server: Server
    sock: str

    @property
    def port(self) -> int:
        return self.server.port


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    short = Path(tempfile.mkdtemp(prefix="rl"))  # a socket path must stay under ~100 bytes
    sock = str(short / "r.sock")
    s = Server(tmp_path_factory.mktemp("guarded"), appendonly=False,
               extra=["--unixsocket", sock, "--unixsocketperm", "700"]).start()
    admin = redis.Redis(port=s.port)
    admin.acl_setuser("alice", enabled=True, passwords=[f"+{ALICE}"], keys=["~*"], channels=["&*"],
                      commands=["+@all"])
    admin.config_set("requirepass", PASSWORD)
    admin.close()
    yield Guarded(s, sock)
    s.stop(kill=True)
    shutil.rmtree(short, ignore_errors=True)


def _cfg(url: str) -> RedisConfig:
    return RedisConfig(url=url)


def _identity(info: str, user: str) -> tuple[str, int, str]:
    """A CLIENT INFO line and an ACL WHOAMI as (name, db, user)."""
    fields = dict(f.split("=", 1) for f in info.split() if "=" in f)
    return fields["name"], int(fields["db"]), user


def _seen(client: Any) -> tuple[str, int, str]:
    """The client as the server sees it: its name, its db and its ACL user."""
    return _identity(client.execute_command("CLIENT", "INFO"), client.execute_command("ACL", "WHOAMI"))


def _url_forms(server: Server, guarded: Guarded) -> list[str]:
    """Every URL form a Link takes: with and without a db, a password alone or a user and
    password (in the URL or its query), unix:// with a db and a password, timeouts."""
    p, g = server.port, guarded.port
    return [
        server.url,
        f"redis://127.0.0.1:{p}",
        f"redis://127.0.0.1:{p}/4?socket_timeout=3&socket_connect_timeout=1",
        f"redis://:{PASSWORD}@127.0.0.1:{g}/0",
        f"redis://alice:{ALICE}@127.0.0.1:{g}/3",
        f"redis://127.0.0.1:{g}/2?password={PASSWORD}",
        f"unix://{guarded.sock}?password={PASSWORD}&db=1",
        f"unix://alice:{ALICE}@{guarded.sock}?db=5",
        f"unix://{guarded.sock}?username=alice&password={ALICE}",
    ]


def _failures(guarded: Guarded) -> dict[str, str]:
    """URLs that cannot serve, and the kind of failure each is."""
    g = guarded.port
    return {
        f"redis://127.0.0.1:{free_port()}/0": "unavailable",
        "redis://no-such-host.invalid:6379/0": "unavailable",
        f"unix://{guarded.sock}.missing": "unavailable",
        f"redis://127.0.0.1:{g}/0": "unavailable",
        f"redis://:wrong@127.0.0.1:{g}/0": "unavailable",
        f"redis://alice:wrong@127.0.0.1:{g}/0": "unavailable",
        f"redis://bob:{ALICE}@127.0.0.1:{g}/0": "unavailable",
        f"redis://:{PASSWORD}@127.0.0.1:{g}/999": "refused",
    }


def test_every_url_form_connects_as_the_url_says(server: Server, guarded: Guarded) -> None:
    """redis:// with and without a db, a password alone or a user and password (in the
    URL or its query), unix:// with a db and a password, a timeout in the query: the
    server sees the same client name, db and user as from redis-py's client."""
    urls = _url_forms(server, guarded)
    for url in urls:
        ours = link.from_config(_cfg(url))
        assert ours is not None, url
        theirs = connection.connect(_cfg(url))
        try:
            assert _seen(ours) == _seen(theirs), url
            assert ours.ping()
        finally:
            ours.close()
            theirs.close()


def _outcome(call: Callable[[], Any]) -> tuple[str, str]:
    """("unavailable" | "refused" | "ok", message) of a call, whichever client made it."""
    try:
        call()
    except RedisUnavailable as exc:
        return "unavailable", str(exc)
    except connection.UNAVAILABLE as exc:
        return "unavailable", str(exc)
    except (link.ReplyError, redis.ResponseError) as exc:
        return "refused", str(exc)
    return "ok", ""


def _both(url: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """The outcome of one pipelined read through a Link and through redis-py."""
    ours = link.from_config(_cfg(url))
    assert ours is not None
    theirs = connection.connect(_cfg(url))
    try:
        return (_outcome(lambda: ours.pipeline().llen("k").hgetall("h").execute()),
                _outcome(lambda: theirs.pipeline(transaction=False).llen("k").hgetall("h").execute()))
    finally:
        ours.close()
        theirs.close()


def test_each_failure_is_redis_pys_in_kind_and_words(server: Server, guarded: Guarded) -> None:
    """No server on the port, a name that does not resolve, no socket file, no password,
    a wrong one, an unknown user: an outage (exit 3 in the CLI) with redis-py's message;
    a db out of range: a refusal with redis-py's message (as today, not an outage)."""
    cases = {**_failures(guarded), f"{server.url}?socket_timeout=5": "ok"}
    for url, kind in cases.items():
        ours, theirs = _both(url)
        assert ours == theirs, url
        assert ours[0] == kind, (url, ours)


@contextlib.contextmanager
def _silent_server() -> Iterator[int]:
    """A listener on a free port that accepts and never says anything: its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        listener.close()


def test_a_server_that_never_answers_times_out_as_with_redis_py() -> None:
    """A listener that accepts and says nothing: "Timeout reading from <host>:<port>"
    after the URL's socket_timeout, from both clients."""
    with _silent_server() as port:
        ours, theirs = _both(f"redis://127.0.0.1:{port}/0?socket_timeout=0.2")
        assert ours == theirs == ("unavailable", f"Timeout reading from 127.0.0.1:{port}")


def test_a_server_going_away_is_an_outage_and_its_return_is_served(tmp_path: Path) -> None:
    """A Link that read once, its server stopped: the next read is RedisUnavailable with
    one of redis-py's messages for it; the server back on its port, the Link connects again."""
    s = Server(tmp_path / "gone", appendonly=False).start()
    ours = link.from_config(_cfg(s.url))
    assert ours is not None
    try:
        assert ours.pipeline().llen("k").execute() == [0]
        s.stop(kill=True)
        kind, message = _outcome(lambda: ours.pipeline().llen("k").execute())
        assert kind == "unavailable"
        assert message in ("Connection closed by server.", f"Error 111 connecting to 127.0.0.1:{s.port}. "
                           "Connection refused.") or message.startswith("Error while reading from")
        s.start()
        assert ours.pipeline().llen("k").execute() == [0]
    finally:
        ours.close()
        s.stop(kill=True)


def test_a_reply_nobody_asked_for_drops_the_loop_connection_and_the_next_call_is_served(server: Server) -> None:
    """A real server speaking out of turn: after MONITOR, Redis sends a line for every
    command anyone runs. With no call waiting on the loop's connection, such a reply
    fails that connection (the stream is out of step) instead of raising inside the
    protocol; the loop's exception handler hears nothing, and the next call connects
    afresh and is answered."""
    ours = AsyncLink(link.address(server.url))
    other = redis.Redis.from_url(server.url)

    async def scenario() -> tuple[Any, Any, list[dict[str, Any]]]:
        loop = asyncio.get_running_loop()
        raised: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, context: raised.append(context))
        assert ours.usable()
        first = await ours.send([("MONITOR",)])
        monitored = ours._live
        assert monitored is not None
        other.ping()  # monitored: a reply no call of ours waits for
        for _ in range(500):
            if ours._live is not monitored:
                break
            await asyncio.sleep(0.01)
        assert ours._live is None, "the out-of-step connection was kept"
        assert monitored.transport is not None and monitored.transport.is_closing()
        try:
            second = await ours.send([("PING",), ("ECHO", "after")])
        finally:
            ours.close()
        return first, second, raised

    try:
        first, second, raised = asyncio.run(scenario())
    finally:
        other.close()
    assert first == ["OK"]
    assert second == ["PONG", "after"]
    assert raised == []


def test_a_flushed_script_cache_is_loaded_again(project: Project) -> None:
    """`runner job` after a SCRIPT FLUSH (a restarted Redis): the lookup answers NOSCRIPT,
    is loaded and run in one more round trip, finds the same job as redis-py's Scripts,
    and leaves the script loaded."""
    ids = [project.client.enqueue("record", {"n": i}).id for i in range(2)]
    r = project.runtime.redis
    r.script_flush()
    ours = link.from_config(_cfg(project.server.url))
    assert ours is not None
    keys = [k for parts in project.runtime.parts.values() for k in parts]
    try:
        found = records.lookup_many(transport.LinkScripts(ours), keys, ids)
        assert r.script_exists(SHAS["lookup"]) == [True]
        assert found == records.lookup_many(project.runtime.scripts, keys, ids)
        assert {i: f[1]["payload"] for i, f in found.items()} == {ids[0]: '{"n":0}', ids[1]: '{"n":1}'}
    finally:
        ours.close()


def _cli(project: Project, url: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--config", str(project.root / "runner.toml"), *args],
                                env={**project.env, "REDIS_URL": url}, catch_exceptions=False)
    return result.exit_code, result.stdout.replace(url, "<url>"), result.stderr.replace(url, "<url>")


def test_stats_and_job_print_the_same_through_either_connection(project: Project) -> None:
    """Jobs queued, scheduled, done, dead and unknown: `runner stats` (table and --json)
    and `runner job` (view and --json) print the same through a Link as through redis-py
    (a URL option only redis-py honours, at its default value, sends them there)."""
    c = project.client
    done = c.enqueue("noop", {"n": 1, "é": "\u2603"}).id
    dead = c.enqueue("perm", {"i": 1}).id
    w = Worker(project.runtime, ["fast"])
    w.start()
    try:
        wait_for(lambda: c.get(done).status == "done" and c.get(dead).status == "dead", timeout=15,
                 what="a done and a dead job")
    finally:
        w.stop(2)
    queued = c.enqueue("noop", {"n": 2}).id
    later = c.enqueue("noop", {"n": 3, "é": "\u2603"}, delay=600).id
    plain = project.server.url
    via_redis_py = f"{plain}?health_check_interval=15"
    assert link.from_config(_cfg(plain)) is not None and link.from_config(_cfg(via_redis_py)) is None
    for args in (["stats"], *(["job", i] for i in (done, dead, queued, later, "no-such-job")),
                 *(["job", i, "--json"] for i in (done, dead, queued, later))):
        assert _cli(project, plain, *args) == _cli(project, via_redis_py, *args), args
    ours, theirs = (json.loads(_cli(project, url, "stats", "--json")[1]) for url in (plain, via_redis_py))
    age = [q.pop("oldest_ready_age_s") for out in (ours, theirs) for q in out["queues"]]
    assert ours == theirs
    assert age[0] is not None and abs(age[0] - age[2]) < 30
    table = _cli(project, plain, "stats")[1].splitlines()
    # the figures are there at all: ready, processing, scheduled, sleeping, waiting, dead, succeeded
    assert table[2].split()[:8] == ["fast", "1", "0", "1", "0", "0", "1", "1"]
    down = f"redis://127.0.0.1:{free_port()}/0"
    assert _cli(project, down, "stats") == _cli(project, f"{down}?health_check_interval=15", "stats")
    assert _cli(project, down, "job", done)[0] == 3


def test_a_job_id_not_utf8_reads_back_as_redis_py_reads_it(project: Project) -> None:
    """Bytes that are not UTF-8 in a record decode with surrogateescape, as redis-py's
    client of connection.py decodes them."""
    k = project.keys()
    raw = redis.Redis(port=project.server.port)
    raw.set(k.job("bad"), b"1\x1frecord\x1f1\x1f3\x1f1700000000000\x1f\x1f\x1f\x1f\x1f\x1f\xff\xfe")
    raw.close()
    ours = link.from_config(_cfg(project.server.url))
    assert ours is not None
    try:
        got = records.lookup(transport.LinkScripts(ours), [k], "bad")
        assert got is not None and got == records.lookup(project.runtime.scripts, [k], "bad")
        assert got.fields["payload"] == "\udcff\udcfe"
    finally:
        ours.close()


def test_the_reader_runtime_takes_a_link_only_where_the_url_allows(project: Project) -> None:
    """Runtime.create(reader=True): a Link for redis:// (its lookups on the Link's own
    batches), redis-py's client for a URL with an option only redis-py honours."""
    from runner.runtime import Runtime

    cfg = project.config()
    rt = Runtime.create(cfg, lazy=True, reader=True)
    assert isinstance(rt.redis, link.Link) and isinstance(rt.read_scripts, transport.LinkScripts)
    rt.close()
    other = replace(cfg, redis=replace(cfg.redis, url=f"{cfg.redis.url}?health_check_interval=15"))
    rt = Runtime.create(other, lazy=True, reader=True)
    assert isinstance(rt.redis, redis.Redis) and rt.read_scripts is rt.scripts
    rt.close()


def test_check_prints_the_same_through_either_connection(project: Project, tmp_path: Path) -> None:
    """`runner check` (text and --json) gives the same report through a Link as through
    redis-py: stranded jobs counted by the census, a worker in the roster that does not
    know a function, risky Redis settings (and --strict), and an unreachable server. The
    Link's reads behind it (CONFIG GET, INFO, TIME, HVALS) answer as redis-py's do."""
    from runner.store import roster

    c = project.client
    for i in range(3):
        c.enqueue("record", {"n": i})
    c.enqueue("noop", {}, delay=600)
    (project.root / "functions" / "noop.py").unlink()  # its waiting job is stranded now
    roster.beat(project.runtime.scripts, project.runtime.config.redis.prefix, roster.Member(
        id="old-worker", host="h", pid=1, queues=("fast",), functions={"record": 1}, started_ms=0, seen_ms=0))
    plain = project.server.url
    via_redis_py = f"{plain}?health_check_interval=15"
    for args in (["check"], ["check", "--json"], ["check", "--strict"]):
        ours, theirs = _cli(project, plain, *args), _cli(project, via_redis_py, *args)
        assert ours == theirs, args
    code, out, _ = _cli(project, plain, "check")
    assert code == 1 and "deploy gate: 1 waiting job(s)" in out and "worker old-worker" in out, out
    with Server(tmp_path / "risky", appendonly=False, extra=["--maxmemory-policy", "allkeys-lru"]) as risky:
        for args in (["check"], ["check", "--strict", "--json"]):
            slow = f"{risky.url}?health_check_interval=15"
            assert _cli(project, risky.url, *args) == _cli(project, slow, *args), args
        assert "maxmemory-policy is allkeys-lru" in _cli(project, risky.url, "check")[1]
        theirs_py = redis.Redis(port=risky.port, decode_responses=True)
        ours_link = link.from_config(_cfg(risky.url))
        assert ours_link is not None
        try:
            for name in ("maxmemory-policy", "appendonly", "save"):
                assert ours_link.config_get(name) == theirs_py.config_get(name)
            # The fields the guard reads, with their types; a section's fields named alike.
            for section, field in (("replication", "connected_slaves"), ("persistence", "aof_enabled"),
                                   ("memory", "maxmemory_policy"), (None, "maxmemory_policy")):
                a, b = ours_link.info(section), theirs_py.info(section)
                assert a[field] == b[field] and type(a[field]) is type(b[field]), (section, field)
                assert section is None or a.keys() == b.keys()
            assert abs(ours_link.time()[0] - theirs_py.time()[0]) <= 1
            theirs_py.hset("h", mapping={"a": "1", "b": "\u2603"})
            assert sorted(ours_link.hvals("h")) == sorted(theirs_py.hvals("h"))
        finally:
            ours_link.close()
            theirs_py.close()
    down = f"redis://127.0.0.1:{free_port()}/0"
    assert _cli(project, down, "check") == _cli(project, f"{down}?health_check_interval=15", "check")
    assert _cli(project, down, "check")[0] == 3


# --- the event loop's connection (store/aiolink.py): the same connect and the same words

def _async_outcome(url: str, *commands: tuple[Any, ...]) -> tuple[str, Any]:
    """("unavailable" | "refused" | "ok", message or replies) of one send on an AsyncLink."""
    where = link.address(url)
    assert where is not None

    async def run() -> list[Any]:
        ours = AsyncLink(where)
        try:
            return await ours.send(list(commands))
        finally:
            ours.close()

    try:
        replies = asyncio.run(run())
    except RedisUnavailable as exc:
        return "unavailable", str(exc)
    except link.ReplyError as exc:
        return "refused", str(exc)
    return "ok", replies


def test_the_event_loops_connection_connects_and_fails_as_the_link_does(server: Server, guarded: Guarded) -> None:
    """Every URL form connects as the URL says (the server sees the same name, db and
    user as through the Link), and every failure is the same kind with the same words."""
    for url in _url_forms(server, guarded):
        theirs = link.from_config(_cfg(url))
        assert theirs is not None
        try:
            kind, replies = _async_outcome(url, ("CLIENT", "INFO"), ("ACL", "WHOAMI"))
            assert kind == "ok", (url, replies)
            assert _identity(*replies) == _seen(theirs), url
        finally:
            theirs.close()
    for url, kind in _failures(guarded).items():
        theirs = link.from_config(_cfg(url))
        assert theirs is not None
        try:
            expected = _outcome(lambda: theirs.send([("LLEN", "k")]))  # noqa: B023
        finally:
            theirs.close()
        got = _async_outcome(url, ("LLEN", "k"))
        assert got == expected, url
        assert got[0] == kind, (url, got)


def test_the_event_loops_connection_times_out_as_the_link_does() -> None:
    """A listener that accepts and says nothing: "Timeout reading from <host>:<port>"
    after the URL's socket_timeout, and the loop is never blocked meanwhile."""
    with _silent_server() as port:
        where = link.address(f"redis://127.0.0.1:{port}/0?socket_timeout=0.2")
        assert where is not None
        ticks = LoopTicks()

        async def run() -> tuple[str, str]:
            async with ticks:
                try:
                    await AsyncLink(where).send([("LLEN", "k")])
                except RedisUnavailable as exc:
                    return "unavailable", str(exc)
            return "ok", ""

        assert asyncio.run(run()) == ("unavailable", f"Timeout reading from 127.0.0.1:{port}")
        assert ticks.count >= 5  # the loop went on while the reply was awaited
