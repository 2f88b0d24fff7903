"""runner.toml + environment -> one frozen Config; every error names the file, the key and
what was expected.

Environment overrides (they win over the file): REDIS_URL, RUNNER_REDIS_PREFIX,
RUNNER_REDIS_TLS_VERIFY, RUNNER_REDIS_CA_CERT, RUNNER_REDIS_WAIT_REPLICAS,
RUNNER_REDIS_WAIT_TIMEOUT, RUNNER_API_TOKEN, RUNNER_API_AUTH,
RUNNER_LOG_LEVEL, RUNNER_LOG_FORMAT, RUNNER_GRACE_PERIOD, RUNNER_CPU_AFFINITY,
RUNNER_FUNCTIONS_DIR, RUNNER_SCHEMAS_DIR.

API tokens: ``[api.tokens.NAME]`` tables, each with ``scopes`` and its secret in an
environment variable (``env``) or as a hash (``hash = "sha256:<hex>"``); RUNNER_API_TOKEN is
one more token, named "default", with every scope. Only SHA-256 digests are kept.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.errors import ConfigError
from runner.store import urls

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# The project's own files beside runner.toml: `runner dev`'s session and embedded server,
# and the schema check cache.
STATE_DIR = ".runner"


def state_dir(root: Path) -> Path:
    """The project's STATE_DIR under ``root``, made if missing, with a .gitignore of its own
    ("*"): no commit picks up the embedded server's data or the caches, whatever the
    project's own .gitignore says."""
    d = root / STATE_DIR
    d.mkdir(parents=True, exist_ok=True)
    ignore = d / ".gitignore"
    if not ignore.exists():
        with contextlib.suppress(OSError):  # a read-only checkout still runs
            ignore.write_text("*\n")
    return d
JITTER_MODES = ("full", "equal", "none")
ISOLATIONS = ("thread", "process")
# wait_replicas: more than a deployment could have is a typo; a timeout of 0 would make
# WAIT block for ever, and a long one holds every producer as long when a replica is down.
MAX_REPLICAS = 16
# Past this, a partition's share of the slots gets small and a worker's idle cost (a
# waiting connection per partition on Redis Cluster) large.
MAX_PARTITIONS = 64
MAX_WAIT_TIMEOUT_S = 60.0
# The largest duration and size any setting takes. A finite 1e308 overflows where a worker
# turns seconds into milliseconds, a timer or an expiry; ten years is longer than any
# setting means, and 512 MiB is Redis's largest string (so the largest value it could keep).
MAX_SECONDS = 315_360_000
# A queue's executors (threads, or child processes) per worker: each is built at start, so
# 100,000,000 passed `runner check`, then held a worker at 2.3 GB running nothing.
MAX_CONCURRENCY = 1000
# The largest of the other counts (attempts, jobs per child, done jobs kept): far past any
# use, and well inside what Redis and Lua keep exactly.
MAX_COUNT = 1_000_000_000
MAX_BYTES = 536_870_912
MAX_RSS_MB = 1_048_576
# [worker] max_result_bytes by default: a result or checkpoint as large as a request body.
MAX_RESULT_BYTES = 1_048_576


@dataclass(frozen=True, slots=True)
class Backoff:
    base_s: float = 1.0
    cap_s: float = 300.0
    jitter: str = "full"


@dataclass(frozen=True, slots=True)
class QueueConfig:
    name: str
    visibility_timeout_s: float = 30.0
    concurrency: int = 16
    max_attempts: int = 5
    backoff: Backoff = field(default_factory=Backoff)
    # The longest TIMEOUT a function on this queue may declare (see registry.check_timeout).
    max_timeout_s: float = 0.0
    # Jobs claimed per round trip when the queue is deep.
    batch: int = 64
    # Jobs a worker may claim ahead of its free executors (default: concurrency).
    prefetch: int = 16
    # Where handlers run by default: threads of the worker, or warm child processes.
    isolation: str = "thread"
    # Child processes are replaced after this many jobs, or once above this RSS.
    # A child costs about 0.3 s of CPU to start: recycled every 1,000 no-op jobs that was 0.3 ms
    # a job, ten times the thread executor's whole cost. max_rss_mb catches leaks.
    max_jobs_per_child: int = 20000
    max_rss_mb: float = 1024.0
    # Hash tags the queue's keys are spread over (see docs/partitions.md); 1: one, as ever.
    partitions: int = 1


@dataclass(frozen=True, slots=True)
class RedisConfig:
    url: str = DEFAULT_REDIS_URL
    prefix: str = "runner"
    tls_verify: bool = True
    ca_cert: str | None = None
    # Set when the url came from the file or REDIS_URL rather than the default.
    configured: bool = False
    # Where the url came from: "REDIS_URL", "file" ([redis] url) or "default".
    url_source: str = "default"
    # An enqueue is answered only once this many replicas hold it (WAIT after the script);
    # 0 sends no WAIT at all. wait_timeout_s bounds that wait; past it the caller gets
    # NotReplicated rather than an answer that a failover could take back.
    wait_replicas: int = 0
    wait_timeout_s: float = 1.0


# What a token may do: enqueue any function ("enqueue") or one ("enqueue:<type>"), read
# everything, or operate (requeue, delete, purge, cancel, pause, resume); emit any event
# ("emit") or one ("emit:<name>").
SCOPES = ("enqueue", "read", "operate", "signal", "emit")  # signal: POST /jobs/{id}/signals/{name} only
_EVENT_SCOPE = re.compile(r"emit:[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
# The name RUNNER_API_TOKEN goes by, in the audit trail and the dashboard.
DEFAULT_TOKEN = "default"


@dataclass(frozen=True, slots=True)
class ApiToken:
    """One bearer token: its name (on record for what it does) and scopes, and the SHA-256
    of its secret. The secret itself is never kept."""

    name: str
    scopes: frozenset[str]
    # None while the environment variable ``env`` is not set: no request matches it, and
    # `runner web` and `runner check` refuse the config.
    digest: bytes | None
    env: str | None = None
    chars: int | None = None  # the secret's length (None: given by its hash, not known)


@dataclass(frozen=True, slots=True)
class ApiConfig:
    max_body_bytes: int = 1_048_576
    max_wait_s: float = 30.0  # the longest ?wait= a request may hold (call and wait)
    # A connection's request line and headers must be in within this (from its opening or
    # the request's first byte); a body may pause this long between bytes, and must be in
    # whole within body_timeout_s of its head; and a process holds at most max_connections
    # (the oldest idle ones, then the slowest bodies, are closed to make room).
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0
    body_timeout_s: float = 60.0
    max_connections: int = 1000
    token: str | None = field(default=None, repr=False)  # RUNNER_API_TOKEN, also in tokens
    auth: bool = True
    tokens: tuple[ApiToken, ...] = ()

    @property
    def secured(self) -> bool:
        """Requests need a token: auth is on and at least one token is configured."""
        return self.auth and bool(self.tokens)

    def unset(self) -> list[ApiToken]:
        """Tokens whose environment variable is not set."""
        return [t for t in self.tokens if t.digest is None]


@dataclass(frozen=True, slots=True)
class Retention:
    done_s: float = 86_400.0
    # The most done jobs a queue keeps (they go a quarter at a time: see lua/includes/done.lua),
    # so a busy queue's memory is bounded whatever its rate.
    done_max: int = 1_000_000
    # Keep each done job's payload with its outcome (the payload's bytes per done job):
    # for debugging and for the test harness's assertions; off by default.
    done_payload: bool = False
    dead_s: float = 604_800.0
    idempotency_s: float = 86_400.0
    # Each job's log (ctx.logger, and a child's stdout and stderr) keeps its newest lines
    # within both bounds ([retention] logs = {lines, bytes}; lines = 0 keeps none).
    log_lines: int = 500
    log_bytes: int = 262_144


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    grace_period_s: float = 25.0
    scheduler_interval_s: float = 0.5
    # How long a job whose type or version no worker here knows waits for one that does
    # (a rolling deploy) before it goes dead.
    unknown_grace_s: float = 900.0
    # Seconds past TIMEOUT before a stuck child is killed or a stuck thread abandoned.
    timeout_grace_s: float = 1.0
    # "auto": a `runner worker` process keeps its threads on one core (worker/affinity.py).
    cpu_affinity: str = "auto"
    # A handler's return value (and checkpoint) is kept in Redis with its job: at most this
    # many bytes of JSON, else the job goes to the dead letters (worker/execute.py, context.py).
    max_result_bytes: int = MAX_RESULT_BYTES
    # A durable function's step result is kept in its job's step log: at most this many
    # bytes of JSON, else the step raises StepTooLarge (worker/journal.py).
    max_step_bytes: int = 262_144


@dataclass(frozen=True, slots=True)
class LogConfig:
    level: str = "INFO"
    format: str = "json"


@dataclass(frozen=True, slots=True)
class Config:
    root: Path
    source: str
    redis: RedisConfig
    queues: Mapping[str, QueueConfig]
    api: ApiConfig
    retention: Retention
    worker: WorkerConfig
    log: LogConfig
    functions_dir: Path
    schemas_dir: Path

    def redis_origin(self) -> str:
        """Where the Redis URL came from, as messages name it."""
        if self.redis.url_source == "REDIS_URL":
            return "REDIS_URL"
        if self.redis.url_source == "file":
            return f"[redis] url in {self.source}"
        return "the default: nothing configured"

    def queue(self, name: str) -> QueueConfig:
        try:
            return self.queues[name]
        except KeyError:
            raise ConfigError(f"no queue {name!r} in {self.source} (have: {', '.join(self.queues)})") from None


# --- a tiny typed reader: each section is a table of key -> (checker, description) ---

Checker = Callable[[Any], bool]


def _is_num(v: Any) -> bool:
    # Finite: TOML has inf and nan, and no setting means forever (a worker's timers overflow).
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _pos_num(v: Any) -> bool:
    return _is_num(v) and v > 0


def _nonneg_num(v: Any) -> bool:
    return _is_num(v) and v >= 0


def _pos_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _secs(v: Any, least: float = 0, above: bool = False) -> bool:
    """A duration: at least ``least`` (more than it with ``above``), at most MAX_SECONDS."""
    return _is_num(v) and (v > least if above else v >= least) and v <= MAX_SECONDS


_AT_MOST_S = f"at most {MAX_SECONDS:,}"
_POS_S = (lambda v: _secs(v, above=True), f"a positive number of seconds, {_AT_MOST_S}")
_NONNEG_S = (_secs, f"a number of seconds >= 0, {_AT_MOST_S}")
_SIZE = (lambda v: _pos_int(v) and v <= MAX_BYTES, f"a positive integer, at most {MAX_BYTES:,}")
_COUNT = (lambda v: _pos_int(v) and v <= MAX_COUNT, f"a positive integer, at most {MAX_COUNT:,}")


def _str(v: Any) -> bool:
    return isinstance(v, str) and v != ""


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _likely(name: str, known: Iterable[str]) -> str:
    """"; did you mean X?" for a probable misspelling of a known name, else nothing."""
    import difflib  # here: only a typo pays for it

    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


def _check_table(
    source: str, where: str, table: Any, spec: Mapping[str, tuple[Checker, str]]
) -> dict[str, Any]:
    path = tuple(where.split("."))
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [{where}] must be a table, got {type(table).__name__}", path)
    for key, value in table.items():
        if key not in spec:
            raise ConfigError(
                f"{source}: unknown key {where}.{key}{_likely(key, spec)} "
                f"(expected one of: {', '.join(sorted(spec))})", (*path, key)
            )
        check, expected = spec[key]
        if not check(value):
            raise ConfigError(f"{source}: {where}.{key} must be {expected}, got {value!r}", (*path, key))
    return table


_QUEUE_SPEC: dict[str, tuple[Checker, str]] = {
    "visibility_timeout": (lambda v: _secs(v, 1), f"a number of seconds >= 1, {_AT_MOST_S}"),
    "concurrency": (lambda v: _pos_int(v) and v <= MAX_CONCURRENCY, f"a positive integer, at most {MAX_CONCURRENCY:,}"),
    "max_attempts": _COUNT,
    "backoff": (lambda v: isinstance(v, dict), "a table {base, cap, jitter}"),
    "max_timeout": _POS_S,
    "batch": (lambda v: _pos_int(v) and v <= 1000, "an integer from 1 to 1000"),
    "prefetch": (lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 10000,
                 "an integer from 0 to 10000"),
    "isolation": (lambda v: v in ISOLATIONS, "thread or process"),
    "max_jobs_per_child": _COUNT,
    "max_rss_mb": (lambda v: _pos_num(v) and v <= MAX_RSS_MB,
                   f"a positive number of megabytes, at most {MAX_RSS_MB:,}"),
    "partitions": (lambda v: _pos_int(v) and v <= MAX_PARTITIONS, f"an integer from 1 to {MAX_PARTITIONS}"),
}
_BACKOFF_SPEC: dict[str, tuple[Checker, str]] = {
    "base": _NONNEG_S,
    "cap": _NONNEG_S,
    "jitter": (lambda v: v in JITTER_MODES, f"one of {', '.join(JITTER_MODES)}"),
}
_SPECS: dict[str, dict[str, tuple[Checker, str]]] = {
    "redis": {
        "url": (_str, "a redis://, rediss://, unix://, redis+sentinel:// or redis+cluster:// URL"),
        "prefix": (lambda v: _str(v) and "{" not in v and "}" not in v, "a string without braces"),
        "tls_verify": (_bool, "true or false"),
        "ca_cert": (_str, "a path to a PEM file"),
        "wait_replicas": (lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_REPLICAS,
                          f"an integer from 0 to {MAX_REPLICAS} (replicas that must hold an enqueue)"),
        "wait_timeout": (lambda v: _is_num(v) and 0.001 <= v <= MAX_WAIT_TIMEOUT_S,
                         f"a number of seconds from 0.001 to {MAX_WAIT_TIMEOUT_S:g}"),
    },
    "api": {
        "max_body_bytes": _SIZE,
        "max_wait": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 3600,
                     "a number of seconds from 0 to 3600"),
        "auth": (_bool, "true or false (false switches bearer-token auth off)"),
        "header_timeout": (lambda v: _is_num(v) and 0.1 <= v <= 3600, "a number of seconds from 0.1 to 3600"),
        "idle_timeout": (lambda v: _is_num(v) and 0.1 <= v <= 3600, "a number of seconds from 0.1 to 3600"),
        "body_timeout": (lambda v: _is_num(v) and 0.1 <= v <= 3600, "a number of seconds from 0.1 to 3600"),
        "max_connections": (lambda v: _pos_int(v) and v <= 1_000_000, "an integer from 1 to 1000000"),
        "tokens": (lambda v: isinstance(v, dict), "tables [api.tokens.NAME] with scopes and env or hash"),
    },
    "retention": {
        "done": _NONNEG_S,
        "done_max": (_COUNT[0], f"{_COUNT[1]} (done jobs kept per queue)"),
        "done_payload": (_bool, "true or false (keep a finished job's payload with its outcome)"),
        "dead": _NONNEG_S,
        "idempotency": _NONNEG_S,
        "logs": (lambda v: _log_bounds(v) is not None,
                 "a table { lines = 0 to 100000, bytes = 1024 to 16777216 } (each job's log)"),
    },
    "worker": {
        "grace_period": _NONNEG_S,
        "scheduler_interval": _POS_S,
        "unknown_grace": _NONNEG_S,
        "timeout_grace": _POS_S,
        "cpu_affinity": (lambda v: v in ("auto", "off"), '"auto" (one core per worker process) or "off"'),
        "max_result_bytes": (_SIZE[0], f"{_SIZE[1]} (bytes of a handler's JSON result)"),
        "max_step_bytes": (_SIZE[0], f"{_SIZE[1]} (bytes of a durable step's JSON result)"),
    },
    "log": {
        "level": (lambda v: v in ("DEBUG", "INFO", "WARNING", "ERROR"), "DEBUG/INFO/WARNING/ERROR"),
        "format": (lambda v: v in ("json", "text"), "json or text"),
    },
    "functions": {
        "dir": (_str, "a folder path"),
        "schemas": (_str, "a folder path"),
    },
}


def _queue(source: str, name: str, raw: Any) -> QueueConfig:
    t = _check_table(source, f"queues.{name}", raw, _QUEUE_SPEC)
    b = _check_table(source, f"queues.{name}.backoff", t.get("backoff", {}), _BACKOFF_SPEC)
    vt = float(t.get("visibility_timeout", 30.0))
    backoff = Backoff(
        base_s=float(b.get("base", 1.0)), cap_s=float(b.get("cap", 300.0)),
        jitter=str(b.get("jitter", "full")),
    )
    if backoff.cap_s < backoff.base_s:
        raise ConfigError(f"{source}: queues.{name}.backoff.cap must be >= base", ("queues", name, "backoff"))
    return QueueConfig(
        name=name,
        visibility_timeout_s=vt,
        concurrency=int(t.get("concurrency", 16)),
        max_attempts=int(t.get("max_attempts", 5)),
        backoff=backoff,
        max_timeout_s=float(t.get("max_timeout", vt * 10)),
        batch=int(t.get("batch", 64)),
        prefetch=int(t.get("prefetch", t.get("concurrency", 16))),
        isolation=str(t.get("isolation", "thread")),
        max_jobs_per_child=int(t.get("max_jobs_per_child", 20000)),
        max_rss_mb=float(t.get("max_rss_mb", 1024.0)),
        partitions=int(t.get("partitions", 1)),
    )


_HASH = re.compile(r"sha256:[0-9a-f]{64}")
_TOKEN_SPEC: dict[str, tuple[Checker, str]] = {
    "env": (lambda v: _str(v) and "=" not in v, "the name of the environment variable that holds the token"),
    "hash": (lambda v: isinstance(v, str) and _HASH.fullmatch(v.lower()) is not None,
             '"sha256:<64 hex digits>" (`runner token new` prints it)'),
    "scopes": (lambda v: isinstance(v, list) and bool(v) and all(isinstance(x, str) for x in v),
               'a non-empty list of scopes, e.g. ["read", "operate"]'),
}


def scope_error(scope: str) -> str | None:
    """Why ``scope`` is not a scope (None: it is one)."""
    if scope in SCOPES or (scope.startswith("enqueue:") and scope[len("enqueue:"):].isidentifier()):
        return None
    if _EVENT_SCOPE.fullmatch(scope):
        return None
    return (f"unknown scope {scope!r} (expected enqueue, enqueue:<type>, read, operate, signal, emit or "
            "emit:<event name>)")


def digest(secret: str) -> bytes:
    """What is kept of a token: the SHA-256 of its UTF-8 bytes."""
    import hashlib  # here: loading a config without tokens (every CLI call) skips it

    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


def _token(source: str, name: str, raw: Any, env: Mapping[str, str]) -> ApiToken:
    where = f"api.tokens.{name}"
    if not name.replace("_", "").replace("-", "").isalnum():
        raise ConfigError(f"{source}: token name {name!r} must be letters, digits, - or _")
    t = _check_table(source, where, raw, _TOKEN_SPEC)
    if ("env" in t) == ("hash" in t):
        raise ConfigError(f"{source}: {where} needs exactly one of env (the variable that holds the "
                          'token) or hash ("sha256:<hex>", from `runner token new`)')
    if "scopes" not in t:
        raise ConfigError(f'{source}: {where}.scopes is missing: list what the token may do, e.g. ["read"]')
    for scope in t["scopes"]:
        why = scope_error(scope)
        if why:
            raise ConfigError(f"{source}: {where}.scopes: {why}")
    if "hash" in t:
        return ApiToken(name, frozenset(t["scopes"]), bytes.fromhex(t["hash"].lower()[len("sha256:"):]))
    secret = env_secret(env, t["env"])
    return ApiToken(name, frozenset(t["scopes"]), digest(secret) if secret else None, env=t["env"],
                    chars=len(secret) if secret else None)


def env_secret(env: Mapping[str, str], name: str) -> str:
    """A token's secret from the environment, without the whitespace around it: a secret
    mounted from a file often ends in a newline, and a header value never carries one, so
    kept as is the token could never be presented."""
    return (env.get(name) or "").strip()


def _tokens(source: str, raw: Mapping[str, Any], env: Mapping[str, str]) -> tuple[ApiToken, ...]:
    """[api.tokens.*] and RUNNER_API_TOKEN; two tokens with one secret would blur who did what."""
    out = [_token(source, name, table, env) for name, table in raw.items()]
    if env_secret(env, "RUNNER_API_TOKEN"):
        if DEFAULT_TOKEN in raw:
            raise ConfigError(f"{source}: api.tokens.{DEFAULT_TOKEN}: the name {DEFAULT_TOKEN!r} is "
                              "RUNNER_API_TOKEN's; rename the table")
        out.append(ApiToken(DEFAULT_TOKEN, frozenset(SCOPES), digest(env_secret(env, "RUNNER_API_TOKEN")),
                            env="RUNNER_API_TOKEN", chars=len(env_secret(env, "RUNNER_API_TOKEN"))))
    seen: dict[bytes, str] = {}
    for t in out:
        label = "RUNNER_API_TOKEN" if t.env == "RUNNER_API_TOKEN" else f"api.tokens.{t.name}"
        if t.digest is not None and t.digest in seen:
            raise ConfigError(f"{source}: {label} has the same secret as {seen[t.digest]}; "
                              "give each token its own (`runner token new`)")
        if t.digest is not None:
            seen[t.digest] = label
    return tuple(out)


def unset_secrets(cfg: Config) -> list[str]:
    """A line per token whose environment variable is not set: `runner web` refuses to
    serve with one (no request could use it), and `runner check` reports it."""
    return [f"{cfg.source}: api.tokens.{t.name}.env: the variable {t.env} is not set; set it to the "
            "token, or remove the table" for t in cfg.api.unset()]


# A token shorter than this is guessable (`runner token new` makes 43 characters, 256
# bits); `runner check` and the web app name each one (a warning: it still works).
MIN_SECRET_CHARS = 16


def short_secrets(cfg: Config) -> list[str]:
    """A line per token whose secret (from its variable) is shorter than MIN_SECRET_CHARS;
    never the secret itself."""
    out = []
    for t in cfg.api.tokens:
        if t.chars is not None and t.chars < MIN_SECRET_CHARS:
            own = t.env == "RUNNER_API_TOKEN"
            label = "RUNNER_API_TOKEN" if own else f"api.tokens.{t.name} ({t.env})"
            made = "`runner token new NAME --scope ...`" if own else f"`runner token new {t.name} --scope ...`"
            how = f"{made} prints a random one of 256 bits" + (" (RUNNER_API_TOKEN may take it)" if own else "")
            out.append(f"{cfg.source}: {label} is {t.chars} character(s), easy to guess; a token should be at "
                       f"least {MIN_SECRET_CHARS}: {how}")
    return out


def _env_bool(name: str, value: str) -> bool:
    low = value.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"environment: {name} must be true or false, got {value!r}")


def _cpu_affinity(from_env: str | None, from_file: object) -> str:
    if from_env is None:
        return str(from_file)  # checked with the file's other keys
    if from_env not in ("auto", "off"):
        raise ConfigError(f'environment: RUNNER_CPU_AFFINITY must be "auto" or "off", got {from_env!r}')
    return from_env


def _env_num(name: str, value: str) -> float:
    try:
        out = float(value)
    except ValueError:
        raise ConfigError(f"environment: {name} must be a number, got {value!r}") from None
    if out < 0:
        raise ConfigError(f"environment: {name} must be >= 0, got {value!r}")
    if not out <= MAX_SECONDS:  # (inf and nan too)
        raise ConfigError(f"environment: {name} must be a number of seconds, at most {MAX_SECONDS:,}, got {value!r}")
    return out


def _env_int(name: str, value: str, most: int) -> int:
    try:
        out = int(value)
    except ValueError:
        raise ConfigError(f"environment: {name} must be an integer, got {value!r}") from None
    if not 0 <= out <= most:
        raise ConfigError(f"environment: {name} must be from 0 to {most}, got {value!r}")
    return out


def _env_timeout(name: str, value: str) -> float:
    out = _env_num(name, value)
    if not 0.001 <= out <= MAX_WAIT_TIMEOUT_S:
        raise ConfigError(f"environment: {name} must be from 0.001 to {MAX_WAIT_TIMEOUT_S:g} seconds, got {value!r}")
    return out


def parse(data: Mapping[str, Any], root: Path, source: str, env: Mapping[str, str]) -> Config:
    """Build a Config from a parsed TOML document and an environment. The sections are
    checked first, then read one by one (in this order, so a config with two faults
    reports the first read); each section's environment overrides win."""
    sec = _sections(source, data)
    queues = _queues(source, data.get("queues", {"default": {}}))
    redis = _redis(source, sec["redis"], env)
    api = _api(source, sec["api"], env)
    log = _log(sec["log"], env)
    worker = _worker(sec["worker"], env)
    f = sec["functions"]
    return Config(
        root=root,
        source=source,
        redis=redis,
        queues=queues,
        api=api,
        retention=_retention(sec["retention"]),
        worker=worker,
        log=log,
        functions_dir=root / (env.get("RUNNER_FUNCTIONS_DIR") or f.get("dir", "functions")),
        schemas_dir=root / (env.get("RUNNER_SCHEMAS_DIR") or f.get("schemas", "schemas")),
    )


def _sections(source: str, data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every section but [queues], each key checked against its spec (an unknown section
    or key, or a value of the wrong kind, is refused here)."""
    allowed = {*_SPECS, "queues"}
    for key in data:
        if key not in allowed:
            raise ConfigError(
                f"{source}: unknown section [{key}]{_likely(key, allowed)} "
                f"(expected one of: {', '.join(sorted(allowed))})", (key,)
            )
    return {name: _check_table(source, name, data.get(name, {}), spec) for name, spec in _SPECS.items()}


def _queues(source: str, raw_queues: Any) -> dict[str, QueueConfig]:
    if not isinstance(raw_queues, dict) or not raw_queues:
        raise ConfigError(f"{source}: [queues] must define at least one queue, e.g. [queues.fast]")
    queues: dict[str, QueueConfig] = {}
    for name, raw in raw_queues.items():
        if not name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"{source}: queue name {name!r} must be letters, digits, - or _", ("queues", name))
        queues[name] = _queue(source, name, raw)
    return queues


def _redis(source: str, r: Mapping[str, Any], env: Mapping[str, str]) -> RedisConfig:
    url = env.get("REDIS_URL") or r.get("url")
    url_source = "REDIS_URL" if env.get("REDIS_URL") else "file" if url else "default"
    if url and (wrong := urls.problem(url)) is not None:
        where = "environment: REDIS_URL" if url_source == "REDIS_URL" else f"{source}: redis.url"
        raise ConfigError(f"{where}: {wrong}", ("redis", "url"))
    redis = RedisConfig(
        url=url or DEFAULT_REDIS_URL,
        prefix=env.get("RUNNER_REDIS_PREFIX") or r.get("prefix", "runner"),
        tls_verify=(
            _env_bool("RUNNER_REDIS_TLS_VERIFY", env["RUNNER_REDIS_TLS_VERIFY"])
            if "RUNNER_REDIS_TLS_VERIFY" in env
            else r.get("tls_verify", True)
        ),
        ca_cert=env.get("RUNNER_REDIS_CA_CERT") or r.get("ca_cert"),
        configured=bool(url),
        url_source=url_source,
        wait_replicas=(
            _env_int("RUNNER_REDIS_WAIT_REPLICAS", env["RUNNER_REDIS_WAIT_REPLICAS"], MAX_REPLICAS)
            if "RUNNER_REDIS_WAIT_REPLICAS" in env
            else int(r.get("wait_replicas", 0))
        ),
        wait_timeout_s=(
            _env_timeout("RUNNER_REDIS_WAIT_TIMEOUT", env["RUNNER_REDIS_WAIT_TIMEOUT"])
            if "RUNNER_REDIS_WAIT_TIMEOUT" in env
            else float(r.get("wait_timeout", 1.0))
        ),
    )
    if "{" in redis.prefix or "}" in redis.prefix:
        raise ConfigError("environment: RUNNER_REDIS_PREFIX must not contain braces")
    return redis


def _api(source: str, a: Mapping[str, Any], env: Mapping[str, str]) -> ApiConfig:
    return ApiConfig(
        max_body_bytes=int(a.get("max_body_bytes", 1_048_576)),
        max_wait_s=float(a.get("max_wait", 30.0)),
        header_timeout_s=float(a.get("header_timeout", 10.0)),
        idle_timeout_s=float(a.get("idle_timeout", 30.0)),
        body_timeout_s=float(a.get("body_timeout", 60.0)),
        max_connections=int(a.get("max_connections", 1000)),
        token=env_secret(env, "RUNNER_API_TOKEN") or None,
        auth=(
            _env_bool("RUNNER_API_AUTH", env["RUNNER_API_AUTH"])
            if "RUNNER_API_AUTH" in env
            else a.get("auth", True)
        ),
        tokens=_tokens(source, a.get("tokens", {}), env),
    )


def _log(lg: Mapping[str, Any], env: Mapping[str, str]) -> LogConfig:
    level = env.get("RUNNER_LOG_LEVEL", lg.get("level", "INFO")).upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"environment: RUNNER_LOG_LEVEL must be DEBUG/INFO/WARNING/ERROR, got {level!r}")
    fmt = env.get("RUNNER_LOG_FORMAT", lg.get("format", "json"))
    if fmt not in ("json", "text"):
        raise ConfigError(f"environment: RUNNER_LOG_FORMAT must be json or text, got {fmt!r}")
    return LogConfig(level=level, format=fmt)


def _worker(w: Mapping[str, Any], env: Mapping[str, str]) -> WorkerConfig:
    return WorkerConfig(
        grace_period_s=(
            _env_num("RUNNER_GRACE_PERIOD", env["RUNNER_GRACE_PERIOD"])
            if "RUNNER_GRACE_PERIOD" in env
            else float(w.get("grace_period", 25.0))
        ),
        scheduler_interval_s=float(w.get("scheduler_interval", 0.5)),
        unknown_grace_s=float(w.get("unknown_grace", 900.0)),
        timeout_grace_s=float(w.get("timeout_grace", 1.0)),
        cpu_affinity=_cpu_affinity(env.get("RUNNER_CPU_AFFINITY"), w.get("cpu_affinity", "auto")),
        max_result_bytes=int(w.get("max_result_bytes", MAX_RESULT_BYTES)),
        max_step_bytes=int(w.get("max_step_bytes", 262_144)),
    )


def _log_bounds(v: Any) -> tuple[int, int] | None:
    """``[retention] logs``: (lines, bytes), or None when it is not a valid table."""
    if not isinstance(v, dict) or not set(v) <= {"lines", "bytes"}:
        return None
    lines, size = v.get("lines", 500), v.get("bytes", 262_144)
    if not (isinstance(lines, int) and not isinstance(lines, bool) and 0 <= lines <= 100_000):
        return None
    if not (isinstance(size, int) and not isinstance(size, bool) and 1024 <= size <= 16_777_216):
        return None
    return lines, size


def _retention(rt: Mapping[str, Any]) -> Retention:
    lines, size = _log_bounds(rt.get("logs", {})) or (500, 262_144)
    return Retention(
        done_s=float(rt.get("done", 86_400)),
        done_max=int(rt.get("done_max", 1_000_000)),
        done_payload=bool(rt.get("done_payload", False)),
        dead_s=float(rt.get("dead", 604_800)),
        idempotency_s=float(rt.get("idempotency", 86_400)),
        log_lines=lines,
        log_bytes=size,
    )


def find(start: Path | None = None) -> Path:
    """The project's runner.toml, as a command run in a subfolder finds it: ./runner.toml,
    else the nearest one in a parent folder, searched up to the root of the repository
    the folder is in (the first folder holding ``.git``) or of the file system.
    ./runner.toml when there is none (a missing file means the defaults)."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "runner.toml").is_file():
            return folder / "runner.toml" if folder != here else Path("runner.toml")
        if (folder / ".git").exists():
            break
    return Path("runner.toml")


def load(path: Path | str | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Load runner.toml (default: RUNNER_CONFIG, or ./runner.toml, or the nearest one in a
    parent folder: ``find``) with environment overrides.

    A missing file is allowed: the defaults plus the environment make a one-queue setup.
    """
    env = os.environ if env is None else env
    named = path or env.get("RUNNER_CONFIG")
    p = Path(named) if named else find()
    source = str(p)
    text = ""
    if p.exists():
        try:
            text = p.read_text(encoding="utf-8")
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{source}: not valid TOML: {exc}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{source}: not UTF-8 text") from None
    elif path is not None:
        raise ConfigError(f"{source}: no such file")
    else:
        data = {}
    try:
        return parse(data, p.resolve().parent, source, env)
    except ConfigError as exc:
        line = key_line(text, exc.key) if exc.key else None
        prefix = f"{source}: "
        if line is None or not str(exc).startswith(prefix):
            raise
        raise ConfigError(f"{source}:{line}: {str(exc)[len(prefix):]}", exc.key) from None


_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_ASSIGN = re.compile(r"^\s*([A-Za-z0-9_\-.\"' ]+?)\s*=")


def _dotted(raw: str) -> tuple[str, ...]:
    return tuple(part.strip().strip("\"'") for part in raw.split("."))


def key_line(text: str, key: tuple[str, ...]) -> int | None:
    """The line (from 1) of a key or section of a TOML text: its own ``key =`` line, or the
    line of the inline table that holds it, or its ``[section]`` header. Best effort (a
    key inside a multi-line value is not found); only for pointing at an error."""
    table: tuple[str, ...] = ()
    header_line = None
    for n, line in enumerate(text.splitlines(), 1):
        m = _HEADER.match(line)
        if m:
            table = _dotted(m.group(1))
            if table == key and header_line is None:
                header_line = n
            continue
        m = _ASSIGN.match(line)
        if not m:
            continue
        full = (*table, *_dotted(m.group(1)))
        if full == key or (len(full) < len(key) and key[:len(full)] == full and "{" in line):
            return n
    return header_line
