"""functions/ + schemas/ -> an immutable snapshot of the loaded functions.

A snapshot is built whole and swapped in by reference, so a job that started on one
snapshot finishes on the code it started with. A broken file never stops the others
from loading: its error is kept in the snapshot (with path and line) and, on a reload,
the function keeps its last good version.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import inspect
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from runner.catalog import limits, options, templates
from runner.catalog import schedules as schedules_mod
from runner.catalog.checked import Checked
from runner.catalog.schemas import Versions, load_versions
from runner.config import Backoff, Config
from runner.errors import FieldError, FunctionLoadError, UnknownFunction, ValidationFailed

# What an ON_SUCCESS / ON_FAILURE destination receives (the shapes its schema must take):
# a failure's error carries a traceback, and a record found unfit at claim carries none,
# but for an invalid payload the errors (path, message) and the version.
DESTINATION_JOB = {"id": "0", "type": "t", "version": 1, "attempt": 1, "queue": "q"}
DESTINATION_RECORDS: dict[str, tuple[dict[str, Any], ...]] = {
    "ON_SUCCESS": ({"job": DESTINATION_JOB, "result": None},),
    "ON_FAILURE": tuple({"job": DESTINATION_JOB, "error": error} for error in (
        {"type": "E", "message": "m", "traceback": "Traceback (most recent call last): ..."},
        {"type": "InvalidJob", "message": "m", "errors": [{"path": "$", "message": "m"}], "version": 1},
        {"type": "InvalidJob", "message": "m"})),
}
# Function modules are executed under one lock: two Runtimes loading the same file at
# once would otherwise swap each other's sys.modules entry mid-import.
_import_lock = threading.RLock()
# ast.parse is not thread-safe on CPython 3.11: two threads building ASTs at once can fail
# with "SystemError: AST constructor recursion depth mismatch" (the depth counter is
# per interpreter). Registries are loaded from many threads (a Runtime each), so parse
# one at a time.
_ast_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Function:
    name: str
    path: str
    doc: str
    queue: str
    max_attempts: int
    timeout_s: float
    backoff: Backoff
    idempotency_key: templates.Template | None
    resource_key: templates.Template | None
    handle: Callable[..., Any]
    is_async: bool
    versions: Versions
    isolation: str = "thread"
    memory_mb: float | None = None  # process isolation: the handler's memory cap
    keep_result_s: float | None = None  # KEEP_RESULT: a done job's outcome kept this long on its own
    schedules: tuple[schedules_mod.Schedule, ...] = ()
    on_success: str | None = None  # ON_SUCCESS: a function that gets {"job", "result"} after a success
    on_failure: str | None = None  # ON_FAILURE: one that gets {"job", "error"} when the job goes dead
    concurrency: limits.Concurrency | None = None  # CONCURRENCY: running jobs at most
    rate: limits.Rate | None = None  # RATE_LIMIT: starts per period at most
    priority: int = 0  # PRIORITY: 0-9, higher first (an enqueue may override)
    max_age_s: float | None = None  # MAX_AGE: an attempt not started this long after the enqueue expires
    # HOLD_LOCKS_WHILE_SUSPENDED: a durable function keeps its RESOURCE_KEY and CONCURRENCY
    # slots while it sleeps or waits (default: released at the suspension, see suspend.lua).
    hold_locks: bool = False
    debounce: options.Debounce | None = None  # DEBOUNCE: one job per burst (see docs/events.md)
    triggers: tuple[str, ...] = ()  # TRIGGERS: the events this function runs for (see docs/events.md)
    batch: options.Batch | None = None  # BATCH: many jobs per handle_batch call (see docs/events.md)
    handle_batch: Callable[..., Any] | None = None  # handle_batch(payloads, ctx), with BATCH
    # The line of each option in the file, for errors found after the file itself loaded
    # (a destination checked against the other functions).
    lines: Mapping[str, int] = field(default_factory=dict, repr=False, compare=False)
    # The file's bytes as loaded: a child process runs exactly these, never the file on disk
    # now (which may have changed since, or be broken).
    source: bytes = field(default=b"", repr=False, compare=False)

    @property
    def flow(self) -> limits.Flow:
        return limits.Flow(resource_key=self.resource_key, concurrency=self.concurrency, rate=self.rate)

    def refuse_stranded(self, version: int) -> None:
        """Raise ValidationFailed for a job of an older ``version`` this function cannot
        upgrade (no ``upgrade()``): its claim would bury it, so every enqueue refuses it (the
        client, a handler's follow-up, ``run_inline``'s), as `runner check` flags a waiting one."""
        if version != self.versions.newest and self.versions.upgrade is None:
            raise ValidationFailed(self.name, version, [FieldError("$", (
                f"v{version} cannot run: {os.path.basename(self.path)} has no upgrade() to bring it to "
                f"v{self.versions.newest}; enqueue v{self.versions.newest}, or add "
                "upgrade(payload, from_version) to the function"))])

    def render_limits(self, payload: Any) -> tuple[str, str]:
        """(resource key, limits) of one job of this function (see catalog.limits)."""
        if self.resource_key is None and self.concurrency is None and self.rate is None:
            return "", ""  # most functions: no Flow built per job
        return self.flow.render(self.name, payload)

    def describe(self) -> dict[str, Any]:
        return {
            "type": self.name,
            "doc": self.doc,
            "queue": self.queue,
            "max_attempts": self.max_attempts,
            "timeout": self.timeout_s,
            "backoff": {"base": self.backoff.base_s, "cap": self.backoff.cap_s,
                        "jitter": self.backoff.jitter},
            "idempotency_key": self.idempotency_key.source if self.idempotency_key else None,
            "resource_key": self.resource_key.source if self.resource_key else None,
            "concurrency": self.concurrency.describe() if self.concurrency else None,
            "rate_limit": self.rate.describe() if self.rate else None,
            "priority": self.priority,
            "async": self.is_async,
            "isolation": self.isolation,
            "memory_mb": self.memory_mb,
            "keep_result": self.keep_result_s,
            "on_success": self.on_success,
            "on_failure": self.on_failure,
            "max_age": self.max_age_s,
            "hold_locks_while_suspended": self.hold_locks,
            "versions": sorted(self.versions.schemas),
            "newest_version": self.versions.newest,
            "has_upgrade": self.versions.upgrade is not None,
            "schedules": [s.describe() for s in self.schedules],
            "triggers": list(self.triggers),
            "debounce": self.debounce.describe() if self.debounce else None,
            "batch": self.batch.describe() if self.batch else None,
        }


@dataclass(frozen=True, slots=True)
class Registry:
    functions: Mapping[str, Function] = field(default_factory=dict)
    errors: Mapping[str, FunctionLoadError] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def get(self, name: str) -> Function:
        try:
            return self.functions[name]
        except KeyError:
            broken = next((e.shown() for p, e in self.errors.items() if Path(p).stem == name), None)
            # Nothing loaded because there is no folder: say where it was looked for (a
            # command run from a subfolder of the project, a project= or config not given).
            nowhere = next((p for p, e in self.errors.items() if e.message == NO_FOLDER), None)
            raise UnknownFunction(name, sorted(self.functions), broken,
                                  nowhere if not self.functions else None) from None

    def for_queue(self, queue: str) -> list[Function]:
        return [f for f in self.functions.values() if f.queue == queue]

    def subscribers(self, event: str) -> list[Function]:
        """The functions whose TRIGGERS name ``event``, by name."""
        return sorted((f for f in self.functions.values() if event in f.triggers), key=lambda f: f.name)

    def broken_subscribers(self, event: str) -> dict[str, FunctionLoadError]:
        """The function files that failed to load and whose text may subscribe to ``event``,
        by function name: an emit must not leave one out silently."""
        out: dict[str, FunctionLoadError] = {}
        for path, err in self.errors.items():
            p = Path(path)
            if p.suffix != ".py":
                continue
            try:
                source = p.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            # Read as text (it failed to load): TRIGGERS and the name quoted anywhere, a list
            # over several lines included; a false match only refuses while the file is broken.
            if "TRIGGERS" in source and (f'"{event}"' in source or f"'{event}'" in source):
                out[p.stem] = err
        return out

    def schedules(self) -> list[schedules_mod.Schedule]:
        """Every schedule of every loaded function, by id."""
        return sorted((s for f in self.functions.values() for s in f.schedules), key=lambda s: s.id)

    @staticmethod
    def of(*functions: Function) -> Registry:
        return Registry(functions={f.name: f for f in functions})


def _assign_lines(source: str) -> dict[str, int]:
    lines: dict[str, int] = {}
    try:
        with _ast_lock:
            tree = ast.parse(source)
    except SyntaxError:
        return lines
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for t in targets:
            if isinstance(t, ast.Name):
                lines.setdefault(t.id, node.lineno)
    return lines


PACKAGE = "runner_functions"  # the function files' modules are its submodules


def _package() -> None:
    """The package of the function files' modules in sys.modules (under _import_lock), so
    pickle finds what a file defines by name (a ProcessPoolExecutor's function, a
    dataclass): importing ``runner_functions.<name>`` needs the parent first. Its path is
    empty: its submodules are the loaded files, never looked for on disk."""
    if PACKAGE not in sys.modules:
        pkg = ModuleType(PACKAGE, "The function files runner loaded, each as runner_functions.<file stem>.")
        pkg.__path__ = []
        sys.modules[PACKAGE] = pkg


def _import(path: Path, raw: bytes) -> ModuleType:
    # One name per function file, replaced by each load: running jobs keep the module they
    # started with through their function's globals, and sys.modules keeps one per file.
    name = f"{PACKAGE}.{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FunctionLoadError(str(path), "cannot be imported")
    module = importlib.util.module_from_spec(spec)
    with _import_lock:
        _package()
        before = sys.modules.get(name)
        sys.modules[name] = module
        try:
            return _exec(path, name, module, raw)
        except FunctionLoadError:
            # The last good version keeps serving: so does its module entry.
            if before is not None:
                sys.modules[name] = before
            else:
                sys.modules.pop(name, None)
            raise


def _exec(path: Path, name: str, module: ModuleType, raw: bytes) -> ModuleType:
    try:
        # Compile from the source bytes, never a cached .pyc: the cache is keyed on a
        # whole-second mtime and the size, so two quick saves could load stale code.
        code = compile(raw, str(path), "exec", dont_inherit=True)
        exec(code, module.__dict__)
    except SyntaxError as exc:
        raise FunctionLoadError(str(path), f"syntax error: {exc.msg}", exc.lineno) from None
    except Exception as exc:
        tb = exc.__traceback__
        line = None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == str(path):
                line = tb.tb_lineno
            tb = tb.tb_next
        raise FunctionLoadError(str(path), f"import failed: {type(exc).__name__}: {exc}", line) from None
    return module


def _misspelt(module: ModuleType, fail: Callable[[str, str | None], FunctionLoadError]) -> None:
    """An upper-case name one typo away from an option (QUEUEE) is refused; any other is
    the author's own."""
    for name in vars(module):
        if name.isupper() and name not in options.OPTIONS:
            close = difflib.get_close_matches(name, options.OPTIONS, n=1, cutoff=0.75)
            if close:
                raise fail(f"{name} is not an option; did you mean {close[0]}?", name)


def _handle(module: ModuleType, p: str, fail: Callable[[str, str | None], FunctionLoadError]) -> Callable[..., Any]:
    handle = getattr(module, "handle", None)
    if handle is None and getattr(module, "BATCH", None) is not None \
            and callable(getattr(module, "handle_batch", None)):
        return _batch_only  # a batch function needs no handle of its own
    if not callable(handle):
        raise fail("no handle(payload, ctx) function", None)
    params = [
        q for q in inspect.signature(handle).parameters.values()
        if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)
    ]
    if len(params) != 2:
        raise FunctionLoadError(p, "handle must take exactly (payload, ctx)", handle.__code__.co_firstlineno)
    return cast(Callable[..., Any], handle)


def _batch_only(payload: Any, ctx: Any) -> Any:
    """The ``handle`` of a BATCH function whose file defines only handle_batch: never called
    by a worker (it calls handle_batch); a direct call says so."""
    raise TypeError("this function has BATCH and no handle(payload, ctx): its jobs run through "
                    "handle_batch(payloads, ctx); run_inline takes a list of payloads for it")


def _handle_batch(module: ModuleType, p: str, batch: options.Batch | None,
                  fail: Callable[[str, str | None], FunctionLoadError]) -> Callable[..., Any] | None:
    """handle_batch(payloads, ctx): required with BATCH, refused without it."""
    hb = getattr(module, "handle_batch", None)
    if batch is None:
        if hb is not None:
            raise fail('handle_batch is defined but BATCH is not: add BATCH = {"size": 100, "wait": 1.0} to '
                       "run jobs in batches, or rename handle_batch", "handle_batch")
        return None
    if not callable(hb):
        raise fail("BATCH needs a handle_batch(payloads, ctx) function that takes a list of payloads and "
                   "returns one result per payload (or None)", "BATCH")
    params = [q for q in inspect.signature(hb).parameters.values()
              if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)]
    if len(params) != 2:
        raise FunctionLoadError(p, "handle_batch must take exactly (payloads, ctx)", hb.__code__.co_firstlineno)
    return cast(Callable[..., Any], hb)


def _versions(module: ModuleType, path: Path, config: Config, checked: Checked | None,
              fail: Callable[[str, str | None], FunctionLoadError]) -> tuple[Versions, list[str]]:
    """The function's schemas and its upgrade(), and their warnings."""
    upgrade = getattr(module, "upgrade", None)
    if upgrade is not None and not callable(upgrade):
        raise fail("upgrade must be a function upgrade(payload, from_version)", "upgrade")
    folder = config.schemas_dir / path.stem
    schemas = load_versions(folder, checked)
    if not schemas:
        raise fail(f"no schema: expected {folder}/v1.json", None)
    versions = Versions(type=path.stem, schemas=schemas, upgrade=upgrade)
    warnings: list[str] = [w for v in sorted(schemas) for w in schemas[v].warnings]
    if len(schemas) > 1 and upgrade is None:
        warnings.append(f"{path}: several schema versions but no upgrade(); older jobs cannot run")
    return versions, warnings


def load_function(path: Path, config: Config, checked: Checked | None = None,
                  payload_check: schedules_mod.PayloadCheck | None = None,
                  raw: bytes | None = None) -> tuple[Function, list[str]]:
    """Load one function file and its schemas; raise FunctionLoadError naming the file.
    ``raw``: the file's bytes as another process loaded them (else read now, once)."""
    if raw is None:
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise FunctionLoadError(str(path), f"cannot be read: {exc.strerror or exc}") from None
    lines = _assign_lines(raw.decode("utf-8", errors="replace"))
    module = _import(path, raw)
    p = str(path)

    def fail(message: str, name: str | None = None) -> FunctionLoadError:
        return FunctionLoadError(p, message, lines.get(name) if name else None)

    _misspelt(module, fail)
    handle = _handle(module, p, fail)
    try:
        seen = options.Seen(options.queue_of(module, config))
        options.read(module, options.BEFORE_SCHEMAS, seen)
        versions, warnings = _versions(module, path, config, checked, fail)
        seen.newest, seen.version = versions.schemas[versions.newest].document, versions.newest
        options.read(module, options.AFTER_SCHEMAS, seen)  # (keys and limits: over the newest schema)
    except options.Refused as exc:
        raise fail(str(exc), exc.option) from None
    v, queue = seen.values, seen.queue
    handle_batch = _handle_batch(module, p, v["BATCH"], fail)
    flow = limits.Flow(resource_key=v["RESOURCE_KEY"], concurrency=v["CONCURRENCY"], rate=v["RATE_LIMIT"])
    scheds, sched_warnings = schedules_mod.parse(
        module, function=path.stem, queue=queue.name, max_attempts=int(v["MAX_ATTEMPTS"]), versions=versions,
        flow=flow, fail=fail, max_payload_bytes=config.api.max_body_bytes, priority=v["PRIORITY"],
        payload_check=payload_check,
    )
    warnings += [f"{p}: {w}" for w in sched_warnings]
    if v["TIMEOUT"] > queue.visibility_timeout_s:
        warnings.append(
            f"{p}: TIMEOUT {v['TIMEOUT']} s is longer than queue {queue.name!r}'s visibility timeout "
            f"({queue.visibility_timeout_s:g} s); it relies on lease renewal"
        )
    fn = Function(
        name=path.stem, path=p, doc=(inspect.getdoc(module) or "").strip(), queue=queue.name,
        max_attempts=int(v["MAX_ATTEMPTS"]), timeout_s=float(v["TIMEOUT"]), backoff=v["BACKOFF"],
        idempotency_key=v["IDEMPOTENCY_KEY"], resource_key=v["RESOURCE_KEY"], handle=handle,
        is_async=inspect.iscoroutinefunction(handle), versions=versions, isolation=str(v["ISOLATION"]),
        memory_mb=_float_or_none(v["MEMORY_MB"]), keep_result_s=_float_or_none(v["KEEP_RESULT"]),
        schedules=scheds, on_success=v["ON_SUCCESS"], on_failure=v["ON_FAILURE"], concurrency=v["CONCURRENCY"],
        rate=v["RATE_LIMIT"], priority=v["PRIORITY"], max_age_s=_float_or_none(v["MAX_AGE"]),
        hold_locks=bool(v["HOLD_LOCKS_WHILE_SUSPENDED"]), triggers=v["TRIGGERS"], debounce=v["DEBOUNCE"],
        batch=v["BATCH"], handle_batch=handle_batch, lines=lines, source=raw,
    )
    return fn, warnings


def _float_or_none(v: Any) -> float | None:
    return None if v is None else float(v)


def _destination_error(fn: Function, functions: Mapping[str, Function]) -> FunctionLoadError | None:
    """A destination must be a loaded function whose newest schema takes the record it
    will be sent (checked at load, so `runner check` and a worker both refuse it)."""
    for opt, dest in (("ON_SUCCESS", fn.on_success), ("ON_FAILURE", fn.on_failure)):
        if dest is None:
            continue
        target = functions.get(dest)
        line = fn.lines.get(opt)
        if target is None:
            close = difflib.get_close_matches(dest, list(functions), n=1, cutoff=0.75)
            names = sorted(functions)
            hint = f"; did you mean {close[0]!r}?" if close else \
                f" (loaded: {', '.join(names[:10])}{', ...' if len(names) > 10 else ''})"
            return FunctionLoadError(fn.path, f"{opt} names no function: {dest!r}{hint}", line)
        try:
            for record in DESTINATION_RECORDS[opt]:
                target.versions.validate(record, target.versions.newest)
        except ValidationFailed as exc:
            return FunctionLoadError(fn.path, f"{opt}: the v{target.versions.newest} schema of {dest!r} "
                                              f"rejects the record it would get: {exc}", line)
    return None


def _destination_cycle(fn: Function, functions: Mapping[str, Function]) -> FunctionLoadError | None:
    """A chain of destinations that comes back to ``fn``: one failure of a notifier whose
    ON_FAILURE is itself (or A -> B -> A, by either option) would send a job that fails
    and sends another, for ever, each id longer than the last."""
    def walk(name: str, path: list[str]) -> list[str] | None:
        here = functions.get(name)
        if here is None:
            return None
        for dest in dict.fromkeys(d for d in (here.on_success, here.on_failure) if d is not None):
            if dest == fn.name:
                return [*path, dest]
            if dest not in path:
                found = walk(dest, [*path, dest])
                if found:
                    return found
        return None

    for opt, dest in (("ON_SUCCESS", fn.on_success), ("ON_FAILURE", fn.on_failure)):
        if dest is None:
            continue
        cycle = [fn.name, dest] if dest == fn.name else walk(dest, [fn.name, dest])
        if cycle:
            return FunctionLoadError(
                fn.path, f"{opt} leads back to {fn.name!r} ({' -> '.join(cycle)}): each job on the way would "
                         "send the next for ever; end the chain in a function with no destination", fn.lines.get(opt))
    return None


def _fresh_helpers(folder: Path) -> None:
    """Helper modules next to the functions (``functions/_shared.py``, imported by name
    as ``import _shared``) are importable, and imported afresh by every load: a module of
    the folder left in sys.modules from the last load would keep its old code."""
    root = str(folder.resolve())
    dirs: dict[str, str] = {}
    with _import_lock:
        if root not in sys.path:
            sys.path.append(root)
        for name, mod in list(sys.modules.items()):
            file = getattr(mod, "__file__", None)
            if file and not name.startswith("runner_functions.") and _resolved(file, dirs).startswith(root + "/"):
                del sys.modules[name]


def _resolved(file: str, dirs: dict[str, str]) -> str:
    """The real path of a module's file, as Path.resolve() gives it, resolving each
    directory once (``dirs``): hundreds of modules share a few dozen, and resolving
    every file on its own was most of a load. A file that is no symlink is its real
    directory joined with its name."""
    head, tail = os.path.split(file)
    real = dirs.get(head)
    if real is None:
        real = dirs[head] = os.path.realpath(head)
    path = os.path.join(real, tail)
    return os.path.realpath(path) if os.path.islink(path) else path


NO_FOLDER = "no functions folder"


def load(config: Config, previous: Registry | None = None,
         payload_check: schedules_mod.PayloadCheck | None = None,
         sources: Mapping[str, bytes] | None = None) -> Registry:
    """Load every ``functions/*.py`` (not starting with ``_``). ``payload_check``: the
    store's refusal of a value no job may carry (codec.payload_problem), for each SCHEDULE
    payload; every process that runs or checks functions passes it. ``sources``: the
    function files to load instead, by path, as another registry loaded them (``code``),
    so a child process runs what its worker loaded whatever the files hold now."""
    functions: dict[str, Function] = {}
    errors: dict[str, FunctionLoadError] = {}
    warnings: list[str] = []
    folder = config.functions_dir
    if not folder.is_dir() and sources is None:
        return Registry(errors={str(folder): FunctionLoadError(str(folder), NO_FOLDER)})
    _fresh_helpers(folder)
    checked = Checked.open(config)
    paths = sorted(folder.glob("*.py")) if sources is None else sorted(Path(p) for p in sources)
    for path in paths:
        if path.name.startswith("_"):
            continue
        if not path.stem.isidentifier():
            errors[str(path)] = FunctionLoadError(str(path), "the file stem must be a Python identifier")
            continue
        try:
            fn, w = load_function(path, config, checked, payload_check,
                                  None if sources is None else sources[str(path)])
        except FunctionLoadError as exc:
            errors[str(path)] = exc
            if previous is not None and path.stem in previous.functions:
                functions[path.stem] = previous.functions[path.stem]
            continue
        except Exception as exc:  # a check that blew up on user data (a builtin as handle, ...)
            errors[str(path)] = FunctionLoadError(str(path), f"{type(exc).__name__}: {exc}")
            if previous is not None and path.stem in previous.functions:
                functions[path.stem] = previous.functions[path.stem]
            continue
        functions[fn.name] = fn
        warnings.extend(w)
    # A rendered limit key is one budget for every function: one template sized two ways
    # is refused in each function that declares it.
    for name, why in limits.clashes({fn.name: fn.flow for fn in functions.values()},
                                    {fn.name: fn.queue for fn in functions.values()}).items():
        refused_at = functions.pop(name).path
        errors[refused_at] = FunctionLoadError(refused_at, why)
    while True:  # until no refusal leaves another function's destination dangling
        refused = {fn.name: err for fn in functions.values()
                   if (err := _destination_error(fn, functions) or _destination_cycle(fn, functions)) is not None}
        if not refused:
            break
        for name, err in refused.items():
            errors[functions.pop(name).path] = err
    checked.save()
    return Registry(functions=functions, errors=errors, warnings=tuple(warnings))


def code(registry: Registry) -> dict[str, bytes] | None:
    """The bytes of each function file ``registry`` loaded, by path (for ``load``'s
    ``sources``): a last good version it kept for a broken file is among them. None when a
    function came from elsewhere (made in code, not loaded from its file)."""
    if any(not fn.source for fn in registry.functions.values()):
        return None
    return {fn.path: fn.source for fn in registry.functions.values()}
