"""Who is calling and what they may do: bearer tokens, and the one scope of every route.

A request names its token in ``Authorization: Bearer <token>``, never in the URL (a URL
ends up in logs, proxies and browser histories). The token is hashed once (SHA-256) and
that digest compared with every configured token's digest, each with
``hmac.compare_digest`` and without stopping at a match, so the time taken says nothing
of which token matched or how close a guess came, however many tokens there are. Headers
that were admitted are kept, per scope (a producer sends the same one with every request),
for as long as the config they passed under; a header that failed is hashed again every
time.

Every route needs one scope, from ROUTES, looked up by method and path before routing:

    enqueue:{}  POST /jobs/{type}, /jobs/{type}/batch: "enqueue" or "enqueue:<that type>"
    enqueue     POST /groups (its members may be of any types)
    read        every GET but /healthz, /whoami and the dashboard's static shell
    operate     requeue, delete, purge, cancel, pause and resume, bulk actions, run now,
                a schedule's trigger
    signal      POST /jobs/{id}/signals/{name} (operate may send one too)
    emit:{}     POST /events/{name}: "emit" or "emit:<that name>"

The app refuses to serve at all (refusal(), checked by ``app_for``, which every server
of it calls: `runner web`, and ``runner.web.asgi:app`` under uvicorn or gunicorn) without
a token, unless auth is switched off explicitly (``[api] auth = false``) or `runner dev`
builds it (``create_app``).

A missing or unknown token is a 401; a known one without the scope a 403 naming the
scope it lacks. A path that is no route needs ``read`` to GET and ``operate`` for
anything else, so a scoped token learns nothing of which paths exist, and a route served
without an entry in ROUTES (tests/integration/test_access.py walks the router) would be no more
open than ``operate``. With auth off (``[api] auth = false``, or no token configured) the
caller is ANONYMOUS, with every scope. The token a request came with is
``req.context.token``, whose name goes on record for what it does.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence

import falcon
import falcon.asgi

from runner import config as config_mod
from runner.config import SCOPES, ApiConfig, ApiToken, Config
from runner.runtime import Runtime
from runner.web.body import only_params, send
from runner.web.problems import Problem


def refusal(cfg: Config) -> str | None:
    """Why a server must not serve the API under ``cfg``, or None: auth on and no token
    to check (every request would pass), or a token whose variable is unset."""
    if not cfg.api.auth:
        return None
    if not cfg.api.tokens:
        return ("refusing to serve the API without a token: set RUNNER_API_TOKEN, add [api.tokens.NAME] "
                f"(`runner token new`), or switch auth off explicitly with `[api] auth = false` in {cfg.source}")
    unset = config_mod.unset_secrets(cfg)
    return "configuration error: " + "; ".join(unset) if unset else None


PUBLIC = "public"          # no token needed
SIGNED_IN = "signed-in"    # any known token, whatever its scopes
ENQUEUE = "enqueue:{}"     # "enqueue", or "enqueue:" + the function type in the path
READ, OPERATE = "read", "operate"
SIGNAL = "signal"          # a durable function's signal; a token with operate may send one too
EMIT = "emit:{}"           # "emit", or "emit:" + the event name in the path

# (method, path, scope); "{}" stands for one path segment. Looked up by method and path,
# so a route is covered by its line here whatever its resource or its field names.
ROUTES: tuple[tuple[str, str, str], ...] = (
    ("GET", "/healthz", PUBLIC),
    ("GET", "/", PUBLIC),
    ("GET", "/static/{}", PUBLIC),
    ("GET", "/whoami", SIGNED_IN),
    ("POST", "/jobs/{}", ENQUEUE),
    ("POST", "/jobs/{}/batch", ENQUEUE),
    ("GET", "/jobs/{}", READ),
    ("GET", "/jobs/{}/logs", READ),                  # a job's log, as reading the job
    ("GET", "/jobs/{}/stream", READ),                # its ctx.stream output
    ("POST", "/groups", "enqueue"),                  # members of any types: no one type in the path
    ("GET", "/groups/{}", READ),
    ("GET", "/groups/{}/members", READ),
    ("GET", "/functions", READ),
    ("GET", "/functions/{}", READ),
    ("GET", "/queues", READ),
    ("GET", "/throughput", READ),
    ("GET", "/dead/{}", READ),
    ("GET", "/openapi.json", READ),
    ("GET", "/metrics", READ),
    ("GET", "/audit", READ),
    ("GET", "/workers", READ),
    ("GET", "/events", READ),
    ("POST", "/dead/{}/{}/requeue", OPERATE),
    ("DELETE", "/dead/{}/{}", OPERATE),
    ("POST", "/queues/{}/pause", OPERATE),
    ("POST", "/queues/{}/resume", OPERATE),
    ("POST", "/functions/{}/pause", OPERATE),
    ("POST", "/functions/{}/resume", OPERATE),
    ("POST", "/bulk", OPERATE),
    ("POST", "/jobs/{}/run-now", OPERATE),
    ("POST", "/schedules/{}/trigger", OPERATE),
    ("POST", "/jobs/{}/signals/{}", SIGNAL),        # or operate (see allows)
    ("POST", "/events/{}", EMIT),
    # Not served yet: the routes of the next round, here so that each has its scope the
    # day it lands.
    ("GET", "/jobs", READ),                          # the job lists
    ("DELETE", "/jobs/{}", OPERATE),                 # cancel
    ("GET", "/schedules", READ),
)

SCOPE_MEMO = 1024
# Bearer headers admitted lately, per scope, by either route (see Access.admits).
ADMIT_MEMO = 256

ANONYMOUS = ApiToken("anonymous", frozenset(SCOPES), None)

_FIELD = re.compile(r"\{[^}]*\}")
_WILD = "{}"


def _segments(path: str) -> tuple[str, ...]:
    return tuple(path.split("/")[1:])


def _table() -> dict[tuple[str, int], list[tuple[tuple[str, ...], str]]]:
    table: dict[tuple[str, int], list[tuple[tuple[str, ...], str]]] = {}
    for method, path, scope in ROUTES:
        segs = _segments(path)
        table.setdefault((method, len(segs)), []).append((segs, scope))
    for rows in table.values():
        rows.sort(key=lambda row: row[0].count(_WILD))  # literal segments win: /jobs/x/batch
    return table


_TABLE = _table()


def lookup(method: str, path: str) -> tuple[str, bool]:
    """The scope a request needs, resolved ("enqueue:send_email"), and whether a line of
    ROUTES gave it (False: the fallback for paths that are no route). A segment written
    as a URI template field ("{id}") matches only a "{}" of ROUTES."""
    segs = _segments(path)
    for pattern, scope in _TABLE.get((method, len(segs)), ()):
        values = []
        for want, got in zip(pattern, segs, strict=True):
            if want == _WILD:
                if not got:
                    break
                values.append(got)
            elif want != got:
                break
        else:
            if scope == ENQUEUE:
                return "enqueue" if _FIELD.fullmatch(values[0]) else f"enqueue:{values[0]}", True
            if scope == EMIT:
                return "emit" if _FIELD.fullmatch(values[0]) else f"emit:{values[0]}", True
            return scope, True
    return (READ if method in ("GET", "HEAD", "OPTIONS") else OPERATE), False


def route_scope(method: str, template: str) -> str | None:
    """The scope ROUTES gives a route by its URI template ("/dead/{queue}/{job_id}"); None
    when no line covers it."""
    scope, explicit = lookup(method, _FIELD.sub(_WILD, template))
    return scope if explicit else None


def identify(tokens: Sequence[tuple[ApiToken, bytes]], presented: bytes) -> ApiToken | None:
    """The token whose digest is the presented token's: every digest is compared, in
    constant time each, whichever matches."""
    given = hashlib.sha256(presented).digest()
    found = None
    for token, expected in tokens:
        if hmac.compare_digest(given, expected):
            found = token
    return found


def allows(token: ApiToken, scope: str) -> bool:
    if scope in (PUBLIC, SIGNED_IN) or scope in token.scopes:
        return True
    if scope == SIGNAL:
        return OPERATE in token.scopes
    if scope.startswith("emit:"):
        return "emit" in token.scopes
    return scope.startswith("enqueue:") and "enqueue" in token.scopes


class Access:
    """Falcon middleware; runs before routing, so unknown paths do not leak either. It
    follows ``runtime.config`` (`runner dev` swaps it when runner.toml changes)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._api: ApiConfig | None = None
        self.secured = False
        self.tokens: list[tuple[ApiToken, bytes]] = []
        # The scope of each (method, path) seen lately: a producer posts to the same few
        # paths, and matching ROUTES again cost a tenth of the enqueue route's time.
        self._scopes: dict[tuple[str, str], str] = {}
        self._admitted: dict[tuple[bytes, str], ApiToken] = {}
        self._follow()

    def _follow(self) -> None:
        api = self.runtime.config.api
        if api is not self._api:
            self.secured = api.secured
            self.tokens = [(t, t.digest) for t in api.tokens if t.digest is not None]
            self._admitted = {}  # a token taken out of the config is out from this request on
            self._api = api

    def scope_of(self, method: str, path: str) -> str:
        key = (method, path)
        scope = self._scopes.get(key)
        if scope is None:
            scope = lookup(*key)[0]
            if len(self._scopes) >= SCOPE_MEMO:  # bounded whatever paths clients send
                self._scopes.clear()
            self._scopes[key] = scope
        return scope

    def admits(self, method: str, path: str, authorization: bytes | None) -> bool:
        """Whether a request with this Authorization header passes (the HTTP fast lane
        asks; a request it refuses goes to process_request, which says why)."""
        self._follow()
        if not self.secured:
            return True
        scope = self.scope_of(method, path)
        if scope == PUBLIC:
            return True
        if authorization is None:
            return False
        # A producer sends the same header with every request, and hashing it again cost
        # the enqueue route a tenth of its requests/s under load (SHA-256 through OpenSSL,
        # cold between requests). Only headers that passed are kept, for as long as the
        # config they passed under, so a wrong guess is hashed and compared every time.
        if (authorization, scope) in self._admitted:
            return True
        kind, _, given = authorization.partition(b" ")
        given = given.strip()
        if kind.lower() != b"bearer" or not given:
            return False
        token = identify(self.tokens, given)
        if token is None or not allows(token, scope):
            return False
        self._remember(authorization, scope, token)
        return True

    def _remember(self, authorization: bytes, scope: str, token: ApiToken) -> None:
        if len(self._admitted) >= ADMIT_MEMO:  # bounded whatever tokens and paths come
            self._admitted.clear()
        self._admitted[(authorization, scope)] = token

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        self._follow()
        if not self.secured:
            req.context.token = ANONYMOUS
            return
        scope = self.scope_of(req.method, req.path)
        req.context.token = None
        header = req.get_header("Authorization") or ""
        if scope == PUBLIC:
            # Open to all; a known token sent anyway is noted (/healthz says more to it).
            kind, _, given = header.partition(" ")
            if kind.lower() == "bearer" and given.strip():
                req.context.token = identify(self.tokens, given.strip().encode("latin-1", "replace"))
            return
        # Header strings are latin-1 over the raw bytes: the fast lane's key for the same header.
        raw = header.encode("latin-1", "replace")
        known = self._admitted.get((raw, scope))
        if known is not None:
            req.context.token = known
            return
        kind, _, given = header.partition(" ")
        given = given.strip()
        if kind.lower() != "bearer" or not given:
            if "access_token" in req.params or "token" in req.params:
                raise _unauthorized("a token is never accepted in a URL (it ends up in logs): send "
                                    "'Authorization: Bearer <token>', and rotate the one just sent", "missing")
            raise _unauthorized("send an API token as 'Authorization: Bearer <token>'", "missing")
        # Header strings are latin-1 over the raw bytes, so this hashes the bytes sent.
        token = identify(self.tokens, given.encode("latin-1", "replace"))
        if token is None:
            raise _unauthorized("the bearer token is not one of this server's tokens: check it, or make one "
                                "with `runner token new` and add it to runner.toml", "wrong")
        req.context.token = token
        if not allows(token, scope):
            raise _forbidden(token, scope, req)
        self._remember(raw, scope, token)


def _unauthorized(detail: str, why: str) -> Problem:
    challenge = 'Bearer realm="runner"' + (', error="invalid_token"' if why == "wrong" else "")
    return Problem(401, "unauthorized", detail, title="Unauthorized",
                   headers={"WWW-Authenticate": challenge})


def _forbidden(token: ApiToken, scope: str, req: falcon.asgi.Request) -> Problem:
    either = " (or enqueue)" if scope.startswith("enqueue:") else ""
    has = ", ".join(sorted(token.scopes)) or "none"
    return Problem(
        403, "forbidden",
        f"the token {token.name!r} lacks the scope {scope!r}{either} that {req.method} {req.path} needs "
        f"(it has: {has}); use a token with that scope, or add it to [api.tokens.{token.name}] scopes",
        title="Forbidden", scope=scope, token_name=token.name,
        headers={"WWW-Authenticate": 'Bearer realm="runner", error="insufficient_scope"'
                 + (f', scope="{scope}"' if _SCOPE_CHARS.fullmatch(scope) else "")},
    )


# RFC 6750's scope-token characters: printable ASCII but space, '"' and '\'. The scope of an
# enqueue carries the path's type segment, which the caller wrote: one with a quote or a
# control character (a NUL, a CR/LF) stays out of the header (the problem body names it).
_SCOPE_CHARS = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")


def caller(req: falcon.Request) -> str:
    """The name that goes on record for what this request does."""
    token: ApiToken | None = getattr(req.context, "token", None)
    return token.name if token is not None else ANONYMOUS.name


class WhoAmI:
    """GET /whoami: the token's name and scopes, for the dashboard to show and to hide
    what they do not allow. Any known token may ask, whatever its scopes."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        only_params(req)
        token: ApiToken = req.context.token
        resp.cache_control = ["no-store"]
        send(resp, {"name": token.name, "scopes": sorted(token.scopes),
                    "auth": self.runtime.config.api.secured})

