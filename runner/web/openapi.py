"""GET /openapi.json: an OpenAPI 3.1 document generated from the loaded functions.

Each function gets its own enqueue operation (POST /jobs/<type>) whose request body is
its newest payload schema, so generated clients and fuzzers see the real payloads. The
document is rebuilt when the registry object changes (hot reload swaps it whole).
"""

from __future__ import annotations

import threading
from typing import Any

import falcon
import falcon.asgi

from runner import __version__
from runner.catalog.registry import Function, Registry
from runner.catalog.templates import MAX_KEY_BYTES
from runner.errors import MAX_DELAY_S
from runner.runtime import Runtime
from runner.store import codec
from runner.web import auth, shapes
from runner.web.jobs import MAX_BATCH_JOBS

_JSON = "application/json"
_ref, _ok, _problem = shapes.ref, shapes.ok, shapes.problem
# Paths that ignore the query string.
_NO_PARAMS = frozenset({"/", "/healthz", "/metrics", "/openapi.json"})


def _rebase(node: Any, base: str) -> Any:
    """Point a payload schema's local $refs ("#/$defs/x") at where it now lives."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "$id":
                continue  # its own base URI would take the refs away from this document
            if k == "$ref" and isinstance(v, str) and v.startswith("#"):
                out[k] = base + v[1:]
            else:
                out[k] = _rebase(v, base)
        return out
    if isinstance(node, list):
        return [_rebase(v, base) for v in node]
    return node


def _payload_name(fn: Function) -> str:
    return f"{fn.name}_v{fn.versions.newest}"


def _timing_params(fn: Function) -> list[dict[str, Any]]:
    versions = sorted(fn.versions.schemas)
    return [
        {"name": "version", "in": "query", "required": False,
         "description": f"Payload version (default: the newest, {fn.versions.newest}).",
         "schema": {"type": "integer", "enum": versions}},
        {"name": "delay", "in": "query", "required": False,
         "description": "Seconds to wait before the job may run.",
         "schema": {"type": "number", "minimum": 0, "maximum": MAX_DELAY_S}},
        {"name": "run_at", "in": "query", "required": False,
         "description": "Epoch seconds at which the job may run (instead of delay).",
         "schema": {"type": "number", "minimum": 0, "maximum": 1e11}},
    ]


def _enqueue_op(fn: Function, max_wait_s: float) -> dict[str, Any]:
    params: list[dict[str, Any]] = [
        *_timing_params(fn),
        {"name": "priority", "in": "query", "required": False,
         "description": f"0-9, higher first within the queue (default: the function's PRIORITY, {fn.priority}).",
         "schema": {"type": "integer", "minimum": 0, "maximum": 9}},
        {"name": "wait", "in": "query", "required": False,
         "description": "Call and wait: seconds to wait for the job to end. 200 with the ended job "
                        "(done with its result, or dead with its error) when it ends in time, else 202; "
                        "202 at once while this token, or the process, holds its most waits.",
         "schema": {"type": "number", "minimum": 0, "maximum": max_wait_s}},
        {"name": "Idempotency-Key", "in": "header", "required": False,
         "description": "A second enqueue with the same key returns the first job (200); "
                        "the same key with another payload is a 409."
                        + (f" Default: the template {fn.idempotency_key.source!r}." if fn.idempotency_key else ""),
         "schema": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_BYTES}},
    ]
    doc = fn.doc.splitlines()[0] if fn.doc else f"Enqueue a {fn.name} job."
    return {
        "operationId": f"enqueue_{fn.name}",
        "summary": doc,
        "description": f"Validate the payload against {fn.name} v{fn.versions.newest} (or ?version=) and "
                       f"enqueue it on queue {fn.queue!r}.",
        "tags": ["jobs"],
        "parameters": params,
        "requestBody": {"required": True, "content": {_JSON: {"schema": _ref(_payload_name(fn))}}},
        "responses": {
            "202": _ok("Accepted: a new job", "Enqueued"),
            "200": {"description": "A duplicate: the job that already holds the idempotency key "
                                   "(Enqueued); or, with ?wait=, the job once ended (Job)",
                    "content": {_JSON: {"schema": {"oneOf": [_ref("Enqueued"), _ref("Job")]}}}},
            "400": _problem("Malformed JSON, query parameter or header"),
            "409": _problem("The idempotency key is held by a job with another payload"),
            "413": _problem("The body is over api.max_body_bytes"),
            "415": _problem("The body is not application/json"),
            "422": _problem("The payload does not validate: every error with its JSON path (past 4 KiB of "
                            "payload, the first error and a note that more may exist)"),
            "503": _problem("Redis is unreachable (the request not confirmed), or, with [redis] wait_replicas, "
                            "the job was written but too few replicas confirmed it in time (not-replicated: "
                            "retry with the same Idempotency-Key)"),
        },
    }


def _batch_op(fn: Function) -> dict[str, Any]:
    return {
        "operationId": f"enqueue_{fn.name}_batch",
        "summary": f"Enqueue up to {MAX_BATCH_JOBS} {fn.name} jobs in one request.",
        "description": f"Validate every payload against {fn.name} v{fn.versions.newest} (or ?version=), then "
                       f"enqueue them all on queue {fn.queue!r}. One invalid payload is a 422 naming every "
                       "error by index ($[i]...), and nothing is enqueued. Each job is keyed by the "
                       "function's IDEMPOTENCY_KEY template, if any; a job whose key is held with another "
                       "payload gets a 409 problem as its answer while the others go in.",
        "tags": ["jobs"],
        "parameters": _timing_params(fn),
        "requestBody": {"required": True, "content": {_JSON: {"schema": {
            "type": "array", "minItems": 1, "maxItems": MAX_BATCH_JOBS, "items": _ref(_payload_name(fn))}}}},
        "responses": {
            "202": _ok("One answer per payload, in order: the job, or a 409 problem", "EnqueuedBatch"),
            "400": _problem("Malformed JSON, not an array of 1 to "
                            f"{MAX_BATCH_JOBS} payloads, a query parameter or an Idempotency-Key header"),
            "413": _problem("The body is over api.max_body_bytes"),
            "415": _problem("The body is not application/json"),
            "422": _problem("A payload does not validate: every error, with its index and JSON path (past 4 KiB "
                            "of payloads in all, an invalid payload's first error and a note)"),
            "503": _problem("Redis is unreachable, or refused or lost the batch part-way (then 'jobs' has one "
                            "entry per payload, in order, with its outcome: written with its id, not_written, "
                            "conflict or unknown), or, with [redis] wait_replicas, jobs were written but too "
                            "few replicas confirmed them in time (not-replicated, naming job_ids): a retry "
                            "is safe when the function has an IDEMPOTENCY_KEY"),
        },
    }


def _mark_scope(op: dict[str, Any], scope: str, secured: bool) -> None:
    """The operation's scope (auth.ROUTES), as ``x-runner-scope`` and, with auth on, as
    its security requirement: one of the listed scopes is enough."""
    if scope == auth.PUBLIC:
        op["security"] = []
        return
    if scope == auth.SIGNED_IN:
        needed: list[list[str]] = [[]]
    else:
        op["x-runner-scope"] = scope
        needed = [["enqueue"], [scope]] if scope.startswith("enqueue:") else \
            [[scope], [auth.OPERATE]] if scope == auth.SIGNAL else [[scope]]
    if secured:
        op["security"] = [{"bearer": names} for names in needed]
        op["responses"]["401"] = _problem("Missing or unknown bearer token")
        if scope != auth.SIGNED_IN:
            op["responses"]["403"] = _problem(f"The token lacks the scope {scope}")


def build(rt: Runtime, reg: Registry) -> dict[str, Any]:
    schemas: dict[str, Any] = dict(shapes.COMPONENTS)
    paths: dict[str, Any] = {}
    for name, fn in sorted(reg.functions.items()):
        pname = _payload_name(fn)
        schemas[pname] = _rebase(dict(fn.versions.schema(fn.versions.newest).document),
                                 f"#/components/schemas/{pname}")
        paths[f"/jobs/{name}"] = {"post": _enqueue_op(fn, rt.config.api.max_wait_s)}
        paths[f"/jobs/{name}/batch"] = {"post": _batch_op(fn)}
    paths.update(shapes.paths(sorted(rt.keys), sorted(reg.functions), rt.config.api.max_wait_s))
    events = sorted({e for fn in reg.functions.values() for e in fn.triggers})
    for event in events:
        paths[f"/events/{event}"] = {"post": shapes.emit_op(event, [f.name for f in reg.subscribers(event)])}
    secured = rt.config.api.secured
    for path, item in paths.items():
        for method, op in item.items():
            _mark_scope(op, auth.lookup(method.upper(), path)[0], secured)
    for path, item in paths.items():
        for op in item.values():
            responses = op["responses"]
            if path not in _NO_PARAMS:
                responses.setdefault("400", _problem("An unknown or malformed query parameter"))
            if "requestBody" in op:
                responses.setdefault("411", _problem("A chunked body this server cannot read; send Content-Length"))
            responses.setdefault("503", _problem("Redis is unreachable; the request was not confirmed"))
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "runner", "version": __version__,
                 "description": "Enqueue and inspect jobs. Every error is application/problem+json "
                                "(RFC 9457)."},
        "paths": paths,
        "components": {"schemas": schemas},
    }
    if secured:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc


class OpenApi:
    """Serves the document, rebuilt only when the registry object was swapped."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self._lock = threading.Lock()
        self._cached: tuple[Registry, bytes] | None = None

    def document(self) -> bytes:
        reg = self.rt.registry
        with self._lock:
            # Holding the registry itself (not its id) keeps the comparison sound.
            if self._cached is None or self._cached[0] is not reg:
                self._cached = (reg, codec.dumpb(build(self.rt, reg)))
            return self._cached[1]

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = self.document()
