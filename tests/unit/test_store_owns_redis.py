"""The store is the only code that talks to Redis: no module outside runner/store/ issues a
Redis command, read off the source with ``ast`` as test_layers.py reads the imports.

A Redis command is a method of redis-py's client, pipeline or cluster client called (or
taken, as ``offload(rt.redis.ping)`` does) on one. Names Python's own types share (``get``,
``set``, ``append``, ``close``, ``info``, ``execute``...) count only on a receiver known to
be a client: ``<anything>.redis``, or a name bound to one, to ``.pipeline(...)`` or to
``connect(...)``. Handing the client to a store function (``roster.read(rt.redis, ...)``)
is how the rest of the code reaches Redis, and is no command.

A name is bound to a client however it is assigned: plainly, annotated, by a walrus,
pairwise in a tuple (a starred target too), by a loop over clients, or as an attribute
(``self.conn = rt.redis``, and then ``<anything>.conn``); a client made by redis-py's
classes, a pool's ``get_connection`` or a function of the module that returns one is one,
and so is a parameter of a function of the module that is handed one. ``getattr(rt.redis,
"hset")`` (or any computed name) is a command too, and so are a bound method kept in a name
and called, redis-py's methods called on the class (``Redis.get(c, k)``),
``operator.methodcaller("hset", ...)``, a connection's ``send_command`` and
``read_response``, and any method of what a helper named ``*pipe`` or ``*pipeline``
returns. Not seen, on purpose: ``get``/``set`` on a parameter that is
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


# A connection's own sends (one taken from a pool) are commands too.
RAW = frozenset({"send_command", "send_packed_command", "read_response"})
COMMANDS = frozenset(n for t in (redis.Redis, redis.client.Pipeline, redis.cluster.RedisCluster)
                     for n in dir(t) if not n.startswith("_")) | RAW
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
# Calls that hand back a client, a pipeline or a connection: a name bound to one is a
# client; so is a parameter of these names (the store's own spelling of a client handed
# in), or one annotated with a redis-py type. A call whose name ends in "pipe" or
# "pipeline" (a helper handing one back) makes one too, and so does a function of the
# module that returns a client.
CLASSES = frozenset({"Redis", "StrictRedis", "RedisCluster", "Pipeline", "ClusterPipeline"})
MAKERS = frozenset({"pipeline", "connect", "from_url", "get_connection", "master_for", "slave_for"}) | CLASSES
CLIENT_PARAMS = frozenset({"redis", "pipe"})
CLIENT_TYPES = ("Redis", "Pipeline", "StrictRedis")


def _name(node: ast.expr) -> str:
    """The last name of ``a.b.c`` or ``c``; '' for anything else."""
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


class _Walk:
    """What a module binds to a client: names and attributes (``self.conn``; any
    ``<x>.conn`` then), the functions of the module that return one, and the parameters
    of its functions that are handed one."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.clients: set[str] = set()
        self.makers: set[str] = set()  # the module's functions that return a client
        self.attrs: set[str] = set()  # the last names of the attributes bound to one
        self.defs = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.owner = {id(r): name for name, fn in self.defs.items() for r in ast.walk(fn) if isinstance(r, ast.Return)}

    def is_client(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Attribute):
            return (node.attr == "redis" or node.attr in CLASSES or node.attr in self.attrs
                    or ast.unparse(node) in self.clients)
        if isinstance(node, ast.Name):
            return node.id in self.clients or node.id in CLASSES
        if isinstance(node, ast.NamedExpr):
            return self.is_client(node.value)
        if isinstance(node, ast.Starred):
            return self.is_client(node.value)
        if isinstance(node, ast.Call):
            name = _name(node.func)
            return name in MAKERS or name in self.makers or name.endswith(("pipe", "pipeline"))
        return False

    def bound(self, target: ast.expr, value: ast.expr) -> set[str]:
        """What an assignment of ``value`` to ``target`` binds to a client: a name or an
        attribute (``self.conn``), pairwise through tuples (``r, n = rt.redis, 1``, a
        starred target taking the middle)."""
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)):
            ts, vs = target.elts, value.elts
            star = next((i for i, t in enumerate(ts) if isinstance(t, ast.Starred)), None)
            if star is None and len(ts) == len(vs):
                return {b for t, v in zip(ts, vs, strict=True) for b in self.bound(t, v)}
            if star is not None and len(vs) >= len(ts) - 1:
                tail = len(ts) - star - 1
                pairs = list(zip(ts[:star], vs[:star], strict=True))
                pairs += list(zip(ts[star + 1:], vs[len(vs) - tail:], strict=True)) if tail else []
                return {b for t, v in pairs for b in self.bound(t, v)}
            return set()
        if isinstance(target, (ast.Name, ast.Attribute)) and self.is_client(value):
            return {ast.unparse(target)}
        return set()

    def handed(self, call: ast.Call) -> set[str]:
        """The parameters of a function of the module a call hands a client to."""
        fn = self.defs.get(_name(call.func))
        if fn is None:
            return set()
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        if isinstance(call.func, ast.Attribute) and params[:1] in (["self"], ["cls"]):
            params = params[1:]
        out = {params[i] for i, a in enumerate(call.args) if i < len(params) and self.is_client(a)}
        return out | {k.arg for k in call.keywords if k.arg is not None and self.is_client(k.value)}

    def step(self, node: ast.AST) -> set[str]:
        """The names ``node`` binds to a client."""
        if isinstance(node, ast.arg) and _client_arg(node):
            return {node.arg}
        if isinstance(node, ast.Assign):
            return {b for t in node.targets for b in self.bound(t, node.value)}
        if isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            return self.bound(node.target, node.value)
        if isinstance(node, ast.withitem) and node.optional_vars is not None:
            return self.bound(node.optional_vars, node.context_expr)
        if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and isinstance(node.target, ast.Name):
            over = node.iter.elts if isinstance(node.iter, (ast.Tuple, ast.List, ast.Set)) else []
            return {node.target.id} if any(self.is_client(e) for e in over) else set()
        if isinstance(node, ast.Call):
            return self.handed(node)
        if isinstance(node, ast.Return) and id(node) in self.owner and node.value is not None \
                and self.is_client(node.value):
            self.makers.add(self.owner[id(node)])
        return set()

    def run(self) -> set[str]:
        while True:  # to a fixed point: an alias of an alias, a helper's helper
            before = (len(self.clients), len(self.makers), len(self.attrs))
            for node in ast.walk(self.tree):
                self.clients |= self.step(node)
            self.attrs = {c.rsplit(".", 1)[1] for c in self.clients if "." in c}
            if (len(self.clients), len(self.makers), len(self.attrs)) == before:
                return self.clients


def _client_arg(arg: ast.arg) -> bool:
    if arg.arg in CLIENT_PARAMS:
        return True
    return arg.annotation is not None and any(t in ast.unparse(arg.annotation) for t in CLIENT_TYPES)


def commands(source: str) -> list[tuple[int, str]]:
    """Each Redis command the source issues: (line, the expression)."""
    tree = ast.parse(source)
    walk = _Walk(tree)
    walk.run()
    # Names an import binds are modules and classes: ``census.scan(...)`` is a store
    # function, not SCAN (redis-py's own classes excepted: ``Redis.get(c, k)`` is GET).
    imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names} - CLASSES
    called, kept = _called_or_kept(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) == "getattr" and len(node.args) >= 2:
            what = node.args[1]
            named = isinstance(what, ast.Constant) and what.value in COMMANDS
            # getattr(rt.redis, "hset"), getattr(rt.redis, name), getattr(x, "hset")
            if (walk.is_client(node.args[0]) and (named or not isinstance(what, ast.Constant))) \
                    or (named and what.value not in GENERIC):
                out.append((node.lineno, ast.unparse(node)))
        if isinstance(node, ast.Call) and _name(node.func) == "methodcaller" and node.args \
                and isinstance(node.args[0], ast.Constant) and node.args[0].value in COMMANDS:
            out.append((node.lineno, ast.unparse(node)))  # operator.methodcaller("hset", ...)
        if not isinstance(node, ast.Attribute) or node.attr not in COMMANDS or node.attr in NOT_SENT:
            continue
        if isinstance(node.value, ast.Name) and node.value.id in imported:
            continue
        if walk.is_client(node.value) or (node.attr not in GENERIC and (node in called or node in kept)):
            out.append((node.lineno, ast.unparse(node)))
    return sorted(set(out))


def _called_or_kept(tree: ast.AST) -> tuple[set[ast.AST], set[ast.AST]]:
    """The attributes called (``x.hset(...)``), and those kept in a name that is called
    (a bound method: ``h = conn.hset; h(...)``)."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    called_names = {n.func.id for n in calls if isinstance(n.func, ast.Name)}
    kept = {n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Attribute)
            and any(isinstance(t, ast.Name) and t.id in called_names for t in n.targets)}
    return {n.func for n in calls}, kept


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


# Each form a person could plausibly write to reach Redis from outside the store; the
# walk must flag every one (none is used by real code: the tree test keeps it so).
MORE_FORMS = {
    "getattr on a client made here":
        "import redis\ndef f(k):\n    r = redis.Redis(port=1)\n    getattr(r, 'hset')(k, 'a', 1)\n",
    "getattr with a computed name": "def f(rt, k, name):\n    getattr(rt.redis, name)(k)\n",
    "a bound method kept in a name": "def f(conn, k):\n    h = conn.hset\n    h(k, 'a', 1)\n",
    "a client from a local helper":
        "def conn(rt):\n    return rt.redis\n"
        "def f(rt, k):\n    c = conn(rt)\n    c.get(k)\n",
    "a client handed to a local helper":
        "def put(c, k):\n    c.set(k, 1)\n"
        "class A:\n    def f(self, rt, k):\n        put(rt.redis, k)\n",
    "a client handed to a local method":
        "class A:\n    def put(self, c, k):\n        c.set(k, 1)\n"
        "    def f(self, rt, k):\n        self.put(rt.redis, k=k)\n",
    "the class's method, unbound": "import redis\ndef f(c, k):\n    redis.Redis.get(c, k)\n",
    "the class's method, imported": "from redis import Redis\ndef f(c, k):\n    Redis.get(c, k)\n",
    "a connection's raw command":
        "def f(rt, k):\n    conn = rt.redis.connection_pool.get_connection('GET')\n"
        "    conn.send_command('GET', k)\n    return conn.read_response()\n",
    "an attribute of an attribute":
        "class A:\n    def __init__(self, rt):\n        self.conn = rt.redis\n"
        "def f(w, k):\n    w.conn.get(k)\n",
    "a starred tuple": "def f(rt, k):\n    r, *rest = rt.redis, 1, 2\n    r.get(k)\n",
    "a loop over clients": "def f(rt, other, k):\n    for r in (rt.redis, other):\n        r.get(k)\n",
    "a method caller": "import operator\ndef f(rt, k):\n    operator.methodcaller('get', k)(rt.redis)\n",
}


def test_the_walk_sees_every_plausible_form() -> None:
    """Each plausible way to issue a command outside the store is flagged: getattr with
    a constant or computed name, a bound method kept in a name, a client made by or
    handed to a helper of the module, redis-py's class methods called unbound, a
    connection's raw send, a client bound as an attribute reached from another object,
    star-unpacking, a loop over clients, operator.methodcaller. A client handed to a
    function or method defined in the same module is a client there."""
    missed = [name for name, src in MORE_FORMS.items() if not commands(src)]
    assert missed == []
