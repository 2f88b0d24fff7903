"""The store is the only code that talks to Redis: no module outside runner/store/ issues a
Redis command, read off the source with ``ast`` as test_layers.py reads the imports.

A Redis command is a method of redis-py's client, pipeline or cluster client called (or
taken, as ``offload(rt.redis.ping)`` does) on one. Names Python's own types share (``get``,
``set``, ``append``, ``close``, ``info``, ``execute``...) count only on a receiver known to
be a client: ``<anything>.redis``, or a name bound to one, to ``.pipeline(...)`` or to
``connect(...)``. Handing the client to a store function (``roster.read(rt.redis, ...)``)
is how the rest of the code reaches Redis, and is no command.

A name is bound to a client however it is assigned: plainly, annotated, by a walrus,
pairwise in a tuple, or as an attribute (``self.conn = rt.redis``); ``getattr(rt.redis,
"hset")`` is a command too, and so is any method of what a helper named ``*pipe`` or
``*pipeline`` returns. Not seen, on purpose: ``get``/``set`` on a parameter that is
not a known client (``def f(client: Any)``): runner's own ``Client`` is handed around as
``client``, and its ``get`` is no Redis command. Such code is left to review."""

from __future__ import annotations

import ast
import collections
import io
import logging
import pathlib
import queue
import socket
import threading
from pathlib import Path

import redis
import redis.client
import redis.cluster

PACKAGE = Path(__file__).parents[2] / "runner"


COMMANDS = frozenset(n for t in (redis.Redis, redis.client.Pipeline, redis.cluster.RedisCluster)
                     for n in dir(t) if not n.startswith("_"))
# Method names Python's own objects (and click, a logger, an event loop) share: a command
# only on a receiver known to be a client.
_OWN = frozenset(n for t in (list, dict, set, str, bytes, threading.Event, threading.Thread, queue.Queue,
                             collections.deque, socket.socket, io.IOBase, pathlib.Path, logging.Logger, object)
                 for n in dir(t))
GENERIC = (COMMANDS & _OWN) | {"command", "echo", "time", "select", "save", "reset", "execute", "wait",
                              # runner's own methods of those names: an HTTP connection's
                              # expire (web/server.py), the scripts' watch (store/scripts.py)
                              "expire", "watch"}
# Closing a client sends Redis nothing: the one who made the connection may close it.
NOT_SENT = frozenset({"close"})
# Calls that hand back a client or pipeline: a name bound to one is a client; so is a
# parameter of these names (the store's own spelling of a client handed in), or one
# annotated with a redis-py type. A call whose name ends in "pipe" or "pipeline" (a
# helper handing one back) makes one too.
MAKERS = frozenset({"pipeline", "connect", "from_url"})
CLIENT_PARAMS = frozenset({"redis", "pipe"})
CLIENT_TYPES = ("Redis", "Pipeline", "StrictRedis")


def _is_client(node: ast.expr, clients: set[str]) -> bool:
    if isinstance(node, ast.Attribute) and (node.attr == "redis" or ast.unparse(node) in clients):
        return True
    if isinstance(node, ast.Name):
        return node.id in clients
    if isinstance(node, ast.NamedExpr):
        return _is_client(node.value, clients)
    if isinstance(node, ast.Call):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        return name in MAKERS or name.endswith(("pipe", "pipeline"))
    return False


def _bound(target: ast.expr, value: ast.expr, clients: set[str]) -> set[str]:
    """What an assignment of ``value`` to ``target`` binds to a client: a name or an
    attribute (``self.conn``), pairwise through tuples (``r, n = rt.redis, 1``)."""
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
            and len(target.elts) == len(value.elts):
        return {b for t, v in zip(target.elts, value.elts, strict=True) for b in _bound(t, v, clients)}
    if isinstance(target, (ast.Name, ast.Attribute)) and _is_client(value, clients):
        return {ast.unparse(target)}
    return set()


def _client_arg(arg: ast.arg) -> bool:
    if arg.arg in CLIENT_PARAMS:
        return True
    return arg.annotation is not None and any(t in ast.unparse(arg.annotation) for t in CLIENT_TYPES)


def commands(source: str) -> list[tuple[int, str]]:
    """Each Redis command the source issues: (line, the expression)."""
    tree = ast.parse(source)
    clients: set[str] = set()
    # Names an import binds are modules and classes: ``census.scan(...)`` is a store
    # function, not SCAN.
    imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    for _ in range(2):  # twice: an alias of an alias bound before it in the walk
        for node in ast.walk(tree):  # names bound to a client, a pipeline or a connection
            if isinstance(node, ast.arg) and _client_arg(node):
                clients.add(node.arg)
            elif isinstance(node, ast.Assign):
                clients.update(b for t in node.targets for b in _bound(t, node.value, clients))
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                clients.update(_bound(node.target, node.value, clients))
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                clients.update(_bound(node.optional_vars, node.context_expr, clients))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) >= 2 and _is_client(node.args[0], clients) \
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in COMMANDS:
            out.append((node.lineno, ast.unparse(node)))  # getattr(rt.redis, "hset")
        if not isinstance(node, ast.Attribute) or node.attr not in COMMANDS or node.attr in NOT_SENT:
            continue
        if isinstance(node.value, ast.Name) and node.value.id in imported:
            continue
        if _is_client(node.value, clients) or (node.attr not in GENERIC and _called(tree, node)):
            out.append((node.lineno, ast.unparse(node)))
    return sorted(set(out))


def _called(tree: ast.AST, attr: ast.Attribute) -> bool:
    return any(isinstance(n, ast.Call) and n.func is attr for n in ast.walk(tree))


def test_no_module_outside_the_store_issues_a_redis_command() -> None:
    assert commands((PACKAGE / "store" / "followups.py").read_text(encoding="utf-8")), "the walk finds nothing"
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("store/"):
            continue
        hits = commands(path.read_text(encoding="utf-8"))
        if hits:
            found[f"runner/{rel}"] = [f"{line}: {what}" for line, what in hits]
    assert found == {}, "move these into a named function of runner/store/"


def test_the_walk_sees_a_command_and_not_a_lookalike() -> None:
    """The check can fail: raw commands on a runtime's client, on a pipeline, on a
    connection and taken uncalled are found; a dict's get, a list's append, a logger's
    info, a store function handed the client (by its module's name too) and closing a
    connection one made are not."""
    bad = (
        "def f(rt, k):\n"
        "    rt.redis.hset(k, 'a', 1)\n"
        "    pipe = rt.redis.pipeline(transaction=False)\n"
        "    pipe.get(k)\n"
        "    pipe.execute()\n"
        "    client = connect(rt.config.redis)\n"
        "    client.set(k, 1)\n"
        "    offload(rt.redis.ping)\n"
        "    r.lrange(k, 0, -1)\n"
        "def g(redis, k):\n"
        "    return redis.get(k)\n"
    )
    assert [line for line, _ in commands(bad)] == [2, 3, 4, 5, 7, 8, 9, 11]
    fine = (
        "from runner.store import census\n"
        "def f(rt, d, xs, log):\n"
        "    d.get('a')\n"
        "    xs.append(1)\n"
        "    log.info('x')\n"
        "    roster.read(rt.redis, rt.config.redis.prefix)\n"
        "    rt.scripts.batch().execute()\n"
        "    time.time()\n"
        "    client = connect(rt.config.redis)\n"
        "    guard(client)\n"
        "    client.close()\n"
        "    conn.expire(now)\n"
        "    census.scan(rt.redis, k)\n"
    )
    assert commands(fine) == []


def test_the_walk_sees_a_client_however_it_is_named() -> None:
    """A client reached through an alias of any assignment form, an attribute, getattr,
    a parameter annotated with a redis-py type, or a pipeline a helper returns is still
    a client; runner's own Client handed in as ``client`` is not."""
    forms = {
        "annotated": "def f(rt, k):\n    r: object = rt.redis\n    r.set(k, 1)\n",
        "walrus": "def f(rt, k):\n    if (r := rt.redis):\n        r.set(k, 1)\n",
        "tuple": "def f(rt, k):\n    r, n = rt.redis, 1\n    r.get(k)\n",
        "attribute": "class A:\n    def __init__(self, rt):\n        self.conn = rt.redis\n"
                     "    def f(self, k):\n        return self.conn.get(k)\n",
        "alias of an alias": "def f(rt, k):\n    r = rt.redis\n    s = r\n    s.get(k)\n",
        "getattr": "def f(rt, k):\n    getattr(rt.redis, 'hset')(k, 'a', 1)\n",
        "typed parameter": "def f(r: redis.Redis, k):\n    r.get(k)\n",
        "helper's pipeline": "def f(rt, k):\n    p = rt.scripts.redis_pipe()\n    p.set(k, 1)\n    p.execute()\n",
        "with": "def f(rt, k):\n    with rt.redis.pipeline() as p:\n        p.get(k)\n",
    }
    missed = [name for name, src in forms.items() if not commands(src)]
    assert missed == []
    fine = (
        "def f(client: Any, job_id: str, d: dict, rt):\n"
        "    client.get(job_id)\n"
        "    x, y = d, 1\n"
        "    x.get('a')\n"
        "    self.store = d\n"
        "    self.store.get('a')\n"
        "    getattr(d, 'get')('a')\n"
        "    getattr(rt.redis, 'connection_pool')\n"
        "    rt.scripts.batch().execute()\n"
    )
    assert commands(fine) == []
