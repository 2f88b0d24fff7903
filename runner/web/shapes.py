"""The JSON shapes of the API for the OpenAPI document: component schemas and every path
but the per-function enqueue operations (openapi.py adds those)."""

from __future__ import annotations

from typing import Any

from runner.catalog.templates import MAX_KEY_BYTES
from runner.store.records import STATUSES

_JSON = "application/json"
_PROBLEM = "application/problem+json"

_STR = {"type": "string"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_OPT_STR = {"type": ["string", "null"]}
_OPT_INT = {"type": ["integer", "null"]}
_OPT_NUM = {"type": ["number", "null"]}
_ANY: dict[str, Any] = {}
# Redis Cluster: the partitions a read left out, their master stalled or down (GET /queues,
# /throughput; there only then): the figures are the other partitions'.
_LEFT_OUT: dict[str, Any] = {
    "type": "array", "description": "Redis Cluster: the partitions left out (their master did not answer within "
    "2 s, or is down); the figures are the others'. There only then.",
    "items": {"type": "object", "properties": {"queue": _STR, "partition": _STR}, "required": ["queue", "partition"],
              "additionalProperties": False}}


def _obj(props: dict[str, Any], required: list[str] | None = None, extra: bool = False) -> dict[str, Any]:
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required, "additionalProperties": extra}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


# A list's key another program made another Redis type (store/damage.py): read as empty,
# named with what it holds and what to do.
_DAMAGED_KEYS = {"type": "array", "description": "keys that hold another Redis type than runner keeps there, "
                 "read as empty: each with what to do (its next writer sets it aside as <key>:corrupt)",
                 "items": _obj({"key": _STR, "type": _STR, "detail": _STR})}

_TIMING = _obj({"count": _INT, "sum_ms": _INT, "mean_ms": _OPT_NUM, "p50_ms": _OPT_NUM, "p95_ms": _OPT_NUM,
                "p99_ms": _OPT_NUM})

# A job record's meta lays extra fields at the top level of the job view: a tick of a
# schedule carries these two; other producers may add their own (hence extra=True).
_JOB_META: dict[str, Any] = {
    "schedule": {"type": "string", "description": "The schedule whose tick enqueued this job"},
    "tick": {"type": "string", "description": "The tick's time, ISO 8601 UTC"},
    "member": {"type": "integer", "description": "A group's member: its place in the group, from 1"},
}
_JOB_FIELDS = ["id", "type", "version", "queue", "status", "attempt", "max_attempts", "payload", "created_at",
               "enqueued_at", "ready_at", "started_at", "finished_at", "idempotency_key", "resource_key",
               "deferrals", "requeued", "priority", "last_error", "reason", "history", "result", "checkpoint",
               "duplicate_of", "parent", "children", "group"]
_GROUP_JOB = {
    "type": "object", "required": ["type", "payload"], "additionalProperties": False,
    "properties": {"type": {"type": "string", "minLength": 1}, "payload": {},
                   "version": {"type": "integer", "minimum": 1}, "delay": {"type": "number", "minimum": 0},
                   "run_at": {"type": "number", "minimum": 0}, "priority": {"type": "integer", "minimum": 0,
                                                                            "maximum": 9}},
}

COMPONENTS: dict[str, Any] = {
    "Problem": {
        "type": "object",
        "description": "RFC 9457 problem details; `type` is stable, `detail` is for humans.",
        "properties": {
            "type": {"type": "string", "format": "uri"},
            "title": _STR, "status": _INT, "detail": _STR, "instance": _STR,
            "errors": {"type": "array", "items": ref("FieldError")},
            "job_id": _STR,
            "scope": {"type": "string", "description": "403: the scope the token lacks"},
            "token_name": {"type": "string", "description": "403: the token's name"},
        },
        "required": ["type", "title", "status", "detail", "instance"],
        "additionalProperties": True,
    },
    "FieldError": _obj({"path": {"type": "string", "description": "JSON path into the payload, e.g. $.to[0]"},
                        "message": _STR}),
    "Enqueued": _obj({"id": _STR, "type": _STR, "version": _INT, "queue": _STR,
                      "status": {"type": "string", "description": "queued or scheduled; for a duplicate, the "
                                 "first job's status (expired once its record is gone)"},
                      "duplicate": {"type": "boolean"}}),
    "EnqueuedBatch": _obj({"jobs": {"type": "array", "items": {"oneOf": [ref("Enqueued"), ref("Problem")]}}}),
    "Job": _obj({
        "id": _STR, "type": _OPT_STR, "version": _OPT_INT, "queue": _STR,
        "status": {"type": ["string", "null"], "enum": [*STATUSES, None]},
        "attempt": _INT, "max_attempts": _OPT_INT, "payload": _ANY,
        "created_at": _OPT_NUM, "enqueued_at": _OPT_NUM, "ready_at": _OPT_NUM, "started_at": _OPT_NUM,
        "finished_at": _OPT_NUM, "idempotency_key": _OPT_STR, "resource_key": _OPT_STR, "deferrals": _INT,
        "requeued": {"type": ["integer", "null"], "minimum": 0,
                     "description": "Times requeued from the dead-letter set; null once done"},
        "priority": {"type": ["integer", "null"], "minimum": 0, "maximum": 9,
                     "description": "0-9, higher first; null once done (the outcome does not keep it)"},
        "last_error": _ANY, "reason": _OPT_STR, "history": {"type": "array"}, "result": _ANY,
        "checkpoint": _ANY, "duplicate_of": _OPT_STR,
        "parent": {"type": ["string", "null"], "description": "The job whose ctx.enqueue, ON_SUCCESS or "
                   "ON_FAILURE wrote this one (from its id: <parent>.<i>, .s, .f, .f2 ...)"},
        "children": {"type": "array", "items": _STR, "description": "The follow-ups and destination "
                     "jobs this job wrote (when its ack or burial landed): of a fan-out, the first 100 "
                     "and the ON_SUCCESS job"},
        "children_count": {"type": "integer", "description": "Of a fan-out past 100 follow-ups: how many "
                           "it wrote; the ones not in children are <id>.<i> for every i below it"},
        "group": {"type": ["string", "null"], "description": "The group of a member or then-job"},
        "worker": {"type": "string", "description": "While processing: the worker holding the job"},
        "lease_expires_at": {"type": "number", "description": "While processing, in a job list: when the "
                                                              "worker's lease runs out unless renewed"},
        "truncated": {"type": "object", "additionalProperties": _INT,
                      "description": "In a job list: the fields too big to list (payload, result, "
                      "checkpoint, last_error, progress, history), each with its full size in bytes. Such a "
                      "field is null (history empty) and <field>_preview holds the first 4,096 bytes of its "
                      "JSON text (a state value past the page's share of reads: none); GET /jobs/{id} gives "
                      "it whole. A durable job's steps show their size, not their value"},
        "payload_preview": _STR, "result_preview": _STR,
        "damaged": {"type": "array", "items": _STR,
                    "description": "The record's fields read back out of their range (a count or a time "
                    "another writer set): each is shown as absent (null, or 0 for attempt and deferrals); a "
                    "damaged step count shows one unreadable step"},
    } | _JOB_META, required=_JOB_FIELDS, extra=True),
    "GroupRequest": _obj({"members": {"type": "array", "minItems": 1, "items": _GROUP_JOB,
                                      "description": "jobs of one queue"},
                          "then": _GROUP_JOB | {"description": "runs once after every member finished; its "
                                                "payload (an object) gets the group field in front"}}),
    "GroupCreated": _obj({"id": _STR, "queue": _STR, "members": {"type": "array", "items": _STR},
                          "then": _obj({"id": _STR, "type": _STR, "queue": _STR, "status": _STR})}),
    "Group": _obj({
        "id": _STR, "queue": _STR, "total": _INT, "done": _INT, "dead": _INT, "cancelled": _INT,
        "pending": _INT, "sealed": {"type": "boolean"}, "complete": {"type": "boolean"},
        "created_at": _OPT_NUM, "completed_at": _OPT_NUM,
        "damaged": {"type": "array", "items": _STR,
                    "description": "The group record's fields read back out of their range (a count past "
                    "100,000 or a time another writer set) or unreadable (then): each is shown as absent "
                    "(0, or null for a time; an empty then id)"},
        "then": _obj({"id": _STR, "type": _STR, "queue": _STR, "status": {
            "type": ["string", "null"], "description": "waiting until the last member finished, then the "
            "then-job's status (pending while it is relayed to another queue)"}}),
    }),
    "GroupMembers": _obj({
        "id": _STR, "total": _INT,
        "members": {"type": "array", "items": _obj({
            "member": _INT, "id": _STR, "status": {
                "type": "string", "enum": ["done", "dead", "cancelled", "pending"],
                "description": "the outcome the group counted for the member; pending until it finished"}})},
        "cursor": {"type": ["string", "null"], "description": "the next page's (null: the last page)"},
        "listed": {"type": "boolean", "description": "false for a group written before its members were "
                                                     "listed (none then)"},
    }),
    "Function": _obj({
        "type": _STR, "doc": _STR, "queue": _STR, "max_attempts": _INT, "timeout": _NUM,
        "backoff": _obj({"base": _NUM, "cap": _NUM, "jitter": _STR}),
        "idempotency_key": _OPT_STR, "resource_key": _OPT_STR, "async": {"type": "boolean"},
        "isolation": {"type": "string", "enum": ["thread", "process"]}, "memory_mb": _OPT_NUM, "keep_result": _OPT_NUM,
        "versions": {"type": "array", "items": _INT}, "newest_version": _INT, "has_upgrade": {"type": "boolean"},
        "schemas": {"type": "array", "items": _obj({"version": _INT, "schema": {"type": "object"}})},
        "schedules": {"type": "array", "items": ref("ScheduleDefinition")},
        "concurrency": {"type": ["object", "null"], "properties": {"limit": _INT, "key": _OPT_STR}},
        "rate_limit": {"type": ["object", "null"], "properties": {"limit": _INT, "period": _NUM, "key": _OPT_STR}},
        "priority": _INT, "on_success": _OPT_STR, "on_failure": _OPT_STR, "max_age": _OPT_NUM,
        "triggers": {"type": "array", "items": _STR},
        "debounce": {"type": ["object", "null"], "properties": {"key": _STR, "period": _NUM, "max_wait": _NUM}},
        "batch": {"type": ["object", "null"], "properties": {"size": {"type": "integer"}, "wait": _NUM,
                                                              "key": {"type": ["string", "null"]}}},
        "hold_locks_while_suspended": {"type": "boolean"},
        "flow": _obj({"paused": {"type": "boolean"}, "held_by_pause": _INT, "concurrency": {
            "type": ["object", "null"],
            "properties": {"limit": _INT, "key": _OPT_STR, "running": _OPT_INT, "waiting": _OPT_INT}}}),
    }, required=["type", "queue", "max_attempts", "timeout", "versions", "newest_version"]),
    "ScheduleDefinition": _obj({"id": _STR, "function": _STR, "queue": _STR, "cron": _STR, "tz": _STR,
                                "payload": _ANY, "missed": _STR, "overlap": _STR}),
    "FunctionList": _obj({
        "functions": {"type": "array", "items": ref("Function")},
        "errors": {"type": "array", "items": _obj({"path": _STR, "line": _OPT_INT, "message": _STR})},
        "warnings": {"type": "array", "items": _STR},
    }),
    "FunctionFigures": _obj({
        "enqueued": _INT, "succeeded": _INT, "retried": _INT, "dead": _INT, "cancelled": _INT, "duplicates": _INT,
        "deduplicated": _INT, "deferred": _INT, "paused": _INT, "ratelimited": _INT, "lost": _INT,
        "expired": _INT, "followups": _INT, "relayed": _INT, "abandoned": _INT,
        "steps": _INT, "replays": _INT, "sleeps": _INT, "waits": _INT, "signals": _INT, "invokes": _INT,
        "latency": _TIMING, "run_time": _TIMING,
    }),
    "Queue": _obj({
        "name": _STR, "ready": _INT, "processing": _INT, "lease_expired": _INT,
        "scheduled": {"type": "integer", "description": "delayed, retrying or deferred jobs (not sleeping or waiting)"},
        "scheduled_due": _INT,
        "sleeping": {"type": "integer", "description": "durable jobs at ctx.sleep"},
        "waiting": {"type": "integer", "description": "durable jobs waiting for a signal, an event or a child"},
        "dead": _INT,
        "cancelled": {"type": "integer", "description": "cancelled jobs still kept (the done retention)"},
        "oldest_ready_age_s": _OPT_NUM, "visibility_timeout_s": _NUM,
        "concurrency": _INT, "max_attempts": _INT, "paused": {"type": "boolean"},
        "paused_functions": {"type": "array", "items": _STR}, "groups_completed": _INT,
        "events_emitted": {"type": "integer", "description": "events whose home is this queue"},
        "events_jobs": {"type": "integer", "description": "the jobs those events started"},
        "functions": {"type": "object", "additionalProperties": ref("FunctionFigures")},
        "partitions": {"type": "array", "items": ref("Partition"),
                       "description": "each partition of a queue of several (empty for one)"},
        "stats_fields_left_out": {"type": "integer", "description": "fields of the queue's stats hash not read: "
                                  "one too wide to read whole is read by the names of the functions loaded"},
        "held": {"type": "array", "items": _STR,
                 "description": "the tags of its partitions whose master has fewer replicas than "
                                "[redis] wait_replicas: none of their jobs runs until a replica is back"},
    }),
    "Partition": _obj({
        "partition": _INT, "tag": _STR,
        "draining": {"type": "boolean", "description": "of another partitions count, served until it drains"},
        "ready": _INT, "processing": _INT, "scheduled": _INT, "dead": _INT,
        "held": {"type": "boolean", "description": "its master short of [redis] wait_replicas: nothing of it runs"},
    }),
    "QueueList": _obj({"queues": {"type": "array", "items": ref("Queue")}, "left_out": _LEFT_OUT}, ["queues"]),
    "Throughput": _obj({
        "times": {"type": "array", "items": _INT, "description": "start of each minute, epoch seconds"},
        "queues": {"type": "object", "additionalProperties": {
            "type": "object", "additionalProperties": {"type": "array", "items": _INT}}},
        "left_out": _LEFT_OUT,
    }, ["times", "queues"]),
    "DeadPage": _obj({"queue": _STR, "total": _INT, "offset": _INT, "limit": _INT,
                      "jobs": {"type": "array", "items": ref("Job")},
                      "cursor": {"type": ["string", "null"], "description": "the next page's (null: the last)"}},
                     required=["queue", "total", "limit", "jobs", "cursor"]),
    "RequeueRequest": _obj({"payload": {"description": "an edited payload (default: the stored one)"},
                            "version": {"type": "integer", "minimum": 1}}, required=[]),
    "BulkRequest": _obj({
        "action": {"type": "string", "enum": ["requeue", "delete", "cancel"]},
        "jobs": {"type": "array", "minItems": 1, "maxItems": 500,
                 "items": _obj({"queue": _STR, "id": _STR})},
    }),
    "BulkResult": _obj({
        "action": _STR, "done": _INT,
        "jobs": {"type": "array", "description": "one per job sent, in order", "items": _obj({
            "queue": _STR, "id": _STR,
            "outcome": {"type": "string", "enum": ["requeued", "deleted", "cancelled", "requested", "gone",
                                                   "refused"]},
            "error": _STR}, required=["queue", "id", "outcome"])},
    }),
    "Health": _obj({"status": {"const": "ok"}, "checks": {"type": "object"}}),
    "AuditEntry": _obj({
        "at": _OPT_NUM, "by": _STR,
        "action": {"type": "string", "description": "requeue, delete, purge, ..."},
        "queue": _STR, "job_id": _STR, "type": _STR, "edited": {"type": "boolean"}, "count": _INT,
    }, required=["at", "by", "action"], extra=True),
    "AuditPage": _obj({"total": _INT, "offset": _INT, "limit": _INT,
                       "entries": {"type": "array", "items": ref("AuditEntry")},
                       "cursor": {"type": ["string", "null"], "description": "the next page's (null: the last)"},
                       "damaged_keys": _DAMAGED_KEYS},
                      required=["total", "limit", "entries", "cursor"]),
    "WhoAmI": _obj({"name": _STR, "scopes": {"type": "array", "items": _STR},
                    "auth": {"type": "boolean", "description": "false: the API is open to anyone"}}),
    "Schedule": _obj({
        "id": _STR, "function": _STR, "queue": _STR, "cron": _STR, "tz": _STR, "payload": _ANY,
        "missed": {"type": "string", "enum": ["skip", "latest", "all"]},
        "overlap": {"type": "string", "enum": ["skip", "allow"]},
        "next": {"type": "string", "description": "the next tick by the server's clock, ISO 8601 UTC"},
        "last": {"type": ["string", "null"], "description": "the last tick that fired, ISO 8601 UTC"},
        "last_job": {"oneOf": [{"type": "null"}, _obj({"id": _STR, "status": _STR})]},
        "state": {"type": "string", "enum": ["active", "pending", "superseded"],
                  "description": "active: the workers fire this definition; pending: none registered it "
                                 "yet; superseded: another release's definition is in force"},
        "late_s": _OPT_NUM,
        "counts": _obj({"fired": _INT, "missed": _INT, "overlap": _INT, "manual": _INT}),
    }),
    "ScheduleList": _obj({"schedules": {"type": "array", "items": ref("Schedule")}}),
    "Worker": _obj({
        "id": _STR, "host": _STR, "pid": _INT, "queues": {"type": "array", "items": _STR},
        "concurrency": {"type": "integer", "description": "handlers it runs at once, over its queues"},
        "isolation": {"type": "string", "description": "thread, process or mixed (its functions' ISOLATION)"},
        "version": {"type": "string", "description": "runner's version"},
        "release": {"type": ["string", "null"], "description": "the deploy's release as the platform names it "
                                                              "(RUNNER_RELEASE, HEROKU_RELEASE_VERSION, "
                                                              "SOURCE_VERSION, GIT_COMMIT), if it does"},
        "started_at": _OPT_NUM, "last_seen": {"type": ["number", "null"], "description": "its last heartbeat "
                                              "(epoch s; null, as started_at, for a time past the year 9999)"},
        "running": {"type": "array", "items": _obj({"id": _STR, "type": _STR, "started": _OPT_NUM},
                                                   ["id", "type", "started"]),
                    "description": "the jobs its handlers ran at its last heartbeat"},
        "functions": {"type": "object", "additionalProperties": _INT,
                      "description": "each function it serves, with the newest payload version it knows"},
    }, required=["id", "host", "pid", "queues", "concurrency", "isolation", "started_at", "last_seen", "running"]),
    "WorkerList": _obj({"workers": {"type": "array", "items": ref("Worker")}, "damaged_keys": _DAMAGED_KEYS},
                       required=["workers"]),
}


def problem(description: str) -> dict[str, Any]:
    return {"description": description, "content": {_PROBLEM: {"schema": ref("Problem")}}}


def ok(description: str, schema: str, media: str = _JSON) -> dict[str, Any]:
    return {"description": description, "content": {media: {"schema": ref(schema)}}}


def _path_param(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema, "description": description}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def _enum_or_str(values: list[str]) -> dict[str, Any]:
    return {"type": "string", "enum": values} if values else {"type": "string"}


def _paused_ok(description: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": {"type": "object", "properties": {
        "queue": {"type": "string"}, "function": {"type": "string"}, "paused": {"type": "boolean"},
        "paused_functions": {"type": "array", "items": {"type": "string"}},
        "resumed_jobs": {"type": "integer"}}}}}}


def paths(queues: list[str], functions: list[str], max_wait_s: float = 30.0) -> dict[str, Any]:
    queue = _path_param("queue", _enum_or_str(queues), "a configured queue")
    job_id = _path_param("id", {"type": "string", "minLength": 1, "maxLength": 200}, "a job id")
    bad = problem("A malformed query parameter")
    return {
        "/jobs/{id}": {"get": {
            "operationId": "get_job", "tags": ["jobs"], "summary": "One job: status, attempts, history, result",
            "parameters": [job_id, _query("wait", {"type": "number", "minimum": 0, "maximum": max_wait_s},
                                          "seconds to wait for the job to end (up to api.max_wait)")],
            "responses": {"200": ok("The job (once ended, or at the end of the wait)", "Job"),
                          "400": problem("A malformed query parameter"), "404": problem("No such job"),
                          "429": problem("?wait= while this token, or the process, holds its most waits "
                                         "(Retry-After); without ?wait= the job is read at once")},
        }, "delete": {
            "operationId": "cancel_job", "tags": ["jobs"],
            "summary": "Cancel: a job not started ends cancelled, a running one is asked to stop",
            "parameters": [job_id],
            "responses": {"200": {"description": "cancelled, or a stop requested", "content": {_JSON: {
                              "schema": _obj({"id": {"type": "string"},
                                              "cancel": {"type": "string", "enum": ["cancelled", "requested"]}},
                                             ["id", "cancel"])}}},
                          "404": problem("No such job"), "409": problem("The job has ended already")},
        }},
        "/jobs/{id}/run-now": {"post": {
            "operationId": "run_job_now", "tags": ["jobs"],
            "summary": "Run a scheduled, retrying or sleeping job now: to ready at once, its id kept, no "
                       "attempt spent",
            "parameters": [job_id],
            "responses": {"200": {"description": "moved to ready; was: the status it had", "content": {_JSON: {
                              "schema": _obj({"id": _STR, "run_now": {"const": "queued"},
                                              "was": {"type": "string", "enum": ["scheduled", "retrying",
                                                                                 "sleeping"]}},
                                             ["id", "run_now", "was"])}}},
                          "404": problem("No such job"),
                          "409": problem("The job waits for no time (job_status: processing, queued, waiting, "
                                         "done, dead, ...); nothing changed")},
        }},
        "/jobs/{id}/signals/{signal}": {"post": {
            "operationId": "signal_job", "tags": ["jobs"],
            "summary": "A signal for a durable function's ctx.wait_for_signal (its body: any JSON)",
            "parameters": [job_id, _path_param("signal", {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,100}$"},
                                               "the signal's name"),
                           {"name": "Idempotency-Key", "in": "header", "required": False,
                            "description": "the delivery's key: sent again with the key of the last signal of "
                                           "that name the job took, it is answered 200 duplicate",
                            "schema": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_BYTES}}],
            "requestBody": {"required": True, "content": {_JSON: {"schema": {}}}},
            "responses": {"202": {"description": "resumed: the job waited for it and runs on; kept: for its "
                                                 "next wait of that name", "content": {_JSON: {
                              "schema": _obj({"id": {"type": "string"}, "signal": {"type": "string"},
                                              "delivery": {"type": "string", "enum": ["resumed", "kept"]}},
                                             ["id", "signal", "delivery"])}}},
                          "200": {"description": "a duplicate: the job took a signal of that name with this "
                                                 "Idempotency-Key already (kept or read); nothing delivered",
                                  "content": {_JSON: {
                              "schema": _obj({"id": {"type": "string"}, "signal": {"type": "string"},
                                              "delivery": {"const": "duplicate"}, "duplicate": {"const": True}},
                                             ["id", "signal", "delivery", "duplicate"])}}},
                          "400": problem("A malformed signal name or body"), "404": problem("No such job"),
                          "409": problem("The job has ended, or holds an unread signal of that name")},
        }},
        "/jobs": {"get": {
            "operationId": "list_jobs", "tags": ["jobs"], "summary": "One page of jobs in a status, newest first",
            "description": "With idempotency_key: the jobs holding that key instead (of the function type "
                           "given, or of any loaded function), whatever their status, on one page; the key is "
                           "looked up as the enqueue stored it, so no status, queue, limit or cursor goes "
                           "with it.",
            "parameters": [
                _query("idempotency_key", {"type": "string", "maxLength": MAX_KEY_BYTES},
                       "find the jobs holding this idempotency key (with type: of that function only)"),
                {"name": "status", "in": "query", "required": False,
                 "description": "the status listed (default queued)",
                 "schema": {"type": "string", "enum": ["queued", "scheduled", "processing", "deferred", "done",
                                                       "dead", "cancelled"]}},
                _query("queue", _enum_or_str(queues), "one queue (default: every queue, one after another)"),
                _query("type", _enum_or_str(functions), "one function type"),
                _query("limit", {"type": "integer", "minimum": 1, "maximum": 500}, "jobs per page (50)"),
                _query("cursor", {"type": "string"}, "the cursor of the previous page"),
            ],
            "responses": {"200": {"description": "The page and the cursor of the next (null: the last); "
                                                 "left_out (Redis Cluster): the partitions whose master did not "
                                                 "answer, which the cursor reads once the others are read",
                                  "content": {_JSON: {"schema": _obj({
                                      "jobs": {"type": "array", "items": ref("Job")},
                                      "cursor": {"type": ["string", "null"]},
                                      "left_out": {"type": "array", "items": _obj({
                                          "queue": {"type": "string"}, "partition": {"type": "string"}})}},
                                      ["jobs", "cursor"])}}},
                          "400": bad, "404": problem("No such queue")},
        }},
        "/groups": {"post": {
            "operationId": "create_group", "tags": ["groups"],
            "summary": "Fan-out/fan-in: members of one queue, and a then-job that runs once after them all",
            "requestBody": {"required": True, "content": {_JSON: {"schema": ref("GroupRequest")}}},
            "responses": {
                "202": ok("Accepted: the group, its member ids in order and its then-job", "GroupCreated"),
                "400": problem("Malformed JSON, or not an object"),
                "413": problem("The body is over api.max_body_bytes"),
                "415": problem("The body is not application/json"),
                "422": problem("The group cannot run (members on several queues, a payload, the then-job...): "
                               "every problem with its path; nothing was written"),
            },
        }},
        "/groups/{group_id}": {"get": {
            "operationId": "get_group", "tags": ["groups"],
            "summary": "A group's progress: members done, dead, pending, and its then-job",
            "parameters": [_path_param("group_id", {"type": "string", "minLength": 1, "maxLength": 200},
                                       "a group id")],
            "responses": {"200": ok("The group", "Group"), "404": problem("No such group")},
        }},
        "/groups/{group_id}/members": {"get": {
            "operationId": "get_group_members", "tags": ["groups"],
            "summary": "A group's members in member order, a page at a time, each with its outcome",
            "parameters": [_path_param("group_id", {"type": "string", "minLength": 1, "maxLength": 200},
                                       "a group id"),
                           _query("status", {"type": "string"}, "only the members of these outcomes, "
                                  "comma-separated: done, dead, cancelled, pending"),
                           _query("limit", {"type": "integer", "minimum": 1, "maximum": 500},
                                  "members per page (100)"),
                           _query("cursor", {"type": "string"}, "the cursor of the previous page")],
            "responses": {"200": ok("The page", "GroupMembers"), "400": bad, "404": problem("No such group")},
        }},
        "/events": {"get": {
            "operationId": "events", "tags": ["meta"],
            "summary": "Live updates as server-sent events: queue figures as they change, and watched jobs",
            "description": "text/event-stream. Events: health {redis}, first and on change; queues {queues, "
                           "full}: every queue first (as GET /queues), then the queues whose figures changed; "
                           "job: a watched job (as GET /jobs/{id}) first and whenever it changed; job-gone "
                           "{id}: a watched job that does not exist. A stream ends after a few minutes and "
                           "the server's retry field says when to reconnect; a comment line comes every few "
                           "seconds when nothing else does. With Accept: application/json (and not "
                           "text/event-stream), the recent emitted events instead, newest first, each with the "
                           "jobs it started (?limit 1-500, default 50; ?name one event name).",
            "parameters": [{"name": "job", "in": "query", "required": False, "style": "form", "explode": True,
                            "description": "a job id to watch (repeatable, up to 20)",
                            "schema": {"type": "array", "maxItems": 20,
                                       "items": {"type": "string", "minLength": 1, "maxLength": 200}}}],
            "responses": {"200": {"description": "The stream", "content": {
                              "text/event-stream": {"schema": {"type": "string"}}}},
                          "400": bad,
                          "429": problem("This token holds the most event streams one token may on this "
                                         "process: close a page that shows live updates (Retry-After)"),
                          "503": problem("This process watches its most jobs, and this token its fair share of "
                                         "them or more (Retry-After)")},
        }},
        "/functions": {"get": {
            "operationId": "list_functions", "tags": ["functions"],
            "summary": "Every loaded function with its queue, options and schema versions",
            "parameters": [_query("schemas", {"type": "boolean"}, "include every schema version")],
            "responses": {"200": ok("The functions and any load errors", "FunctionList"), "400": bad},
        }},
        "/functions/{type}": {"get": {
            "operationId": "get_function", "tags": ["functions"], "summary": "One function with its schemas",
            "parameters": [_path_param("type", _enum_or_str(functions), "a function type")],
            "responses": {"200": ok("The function", "Function"), "404": problem("No such function")},
        }},
        "/queues": {"get": {
            "operationId": "list_queues", "tags": ["queues"],
            "summary": "Per queue: ready, processing, scheduled, dead, and per-function figures",
            "responses": {"200": ok("Cluster-wide queue figures", "QueueList")},
        }},
        **{f"/queues/{{queue}}/{verb}": {"post": {
            "operationId": f"{verb}_queue", "tags": ["queues"],
            "summary": "Pause the queue: workers claim nothing from it; running jobs finish" if verb == "pause"
            else "Lift the queue's pause",
            "parameters": [queue],
            "responses": {"200": _paused_ok("The queue's pause state"), "404": problem("No such queue")},
        }} for verb in ("pause", "resume")},
        **{f"/functions/{{type}}/{verb}": {"post": {
            "operationId": f"{verb}_function", "tags": ["functions"],
            "summary": "Pause the function: its jobs are held, queued, spending nothing" if verb == "pause"
            else "Lift the function's pause: its held jobs go back in order",
            "parameters": [_path_param("type", _enum_or_str(functions), "a function type")],
            "responses": {"200": _paused_ok("The function's pause state"), "404": problem("No such function")},
        }} for verb in ("pause", "resume")},
        "/throughput": {"get": {
            "operationId": "throughput", "tags": ["queues"], "summary": "Jobs done per minute, per queue",
            "parameters": [_query("minutes", {"type": "integer", "minimum": 1, "maximum": 360},
                                  "how many minutes back (default 60)")],
            "responses": {"200": ok("One series per queue", "Throughput"), "400": bad},
        }},
        "/dead/{queue}": {"get": {
            "operationId": "list_dead", "tags": ["dead letters"], "summary": "Dead jobs, newest first",
            "parameters": [queue,
                           _query("cursor", {"type": "string"}, "the cursor of the previous page"),
                           _query("offset", {"type": "integer", "minimum": 0, "maximum": 10_000_000},
                                  "skip (not stable while jobs die: the cursor is)"),
                           _query("limit", {"type": "integer", "minimum": 1, "maximum": 500}, "page size")],
            "responses": {"200": ok("One page", "DeadPage"), "400": bad, "404": problem("No such queue")},
        }},
        "/dead/{queue}/{id}/requeue": {"post": {
            "operationId": "requeue_dead", "tags": ["dead letters"],
            "summary": "Move a dead job back to ready, optionally with an edited, validated payload",
            "parameters": [queue, job_id],
            "requestBody": {"required": False, "content": {_JSON: {"schema": ref("RequeueRequest")}}},
            "responses": {
                "200": ok("Requeued", "Job"), "400": problem("Malformed JSON"),
                "404": problem("No such queue, or no such job in its dead-letter set"),
                "413": problem("The body is over api.max_body_bytes"),
                "415": problem("The body is not application/json"),
                "422": problem("The payload does not validate; the job stays dead"),
            },
        }},
        "/dead/{queue}/{id}": {"delete": {
            "operationId": "delete_dead", "tags": ["dead letters"], "summary": "Delete a dead job and its record",
            "parameters": [queue, job_id],
            "responses": {"204": {"description": "Deleted"},
                          "404": problem("No such queue, or no such job in its dead-letter set")},
        }},
        "/bulk": {"post": {
            "operationId": "bulk", "tags": ["dead letters"],
            "summary": "Requeue or delete dead jobs, or cancel jobs, up to 500 in one request; on the "
                       "audit trail as one entry per queue (its count and first 100 ids)",
            "requestBody": {"required": True, "content": {_JSON: {"schema": ref("BulkRequest")}}},
            "responses": {
                "200": ok("What became of each job", "BulkResult"),
                "400": problem("Not a bulk request, or not 1 to 500 jobs"),
                "413": problem("The body is over api.max_body_bytes"),
                "415": problem("The body is not application/json"),
                "422": problem("An unknown action or queue, or a job without an id; nothing was done"),
            },
        }},
        "/audit": {"get": {
            "operationId": "audit", "tags": ["meta"],
            "summary": "Who did what (requeue, delete, purge), newest first; bounded",
            "parameters": [_query("cursor", {"type": "string"}, "the cursor of the previous page"),
                           _query("offset", {"type": "integer", "minimum": 0, "maximum": 10_000_000},
                                  "skip (not stable while actions land: the cursor is)"),
                           _query("limit", {"type": "integer", "minimum": 1, "maximum": 500}, "page size")],
            "responses": {"200": ok("One page of the audit trail", "AuditPage"), "400": bad},
        }},
        "/whoami": {"get": {
            "operationId": "whoami", "tags": ["meta"],
            "summary": "The calling token's name and scopes (any token may ask)",
            "responses": {"200": ok("The token", "WhoAmI")},
        }},
        "/schedules": {"get": {
            "operationId": "list_schedules", "tags": ["schedules"],
            "summary": "Every schedule (SCHEDULE in a function file) with its next and last tick and last job",
            "responses": {"200": ok("The schedules, by id", "ScheduleList")},
        }},
        "/schedules/{name}/trigger": {"post": {
            "operationId": "trigger_schedule", "tags": ["schedules"],
            "summary": "Run one tick of a schedule now; its own ticks go on as before",
            "description": "The run's job carries the schedule, the time as its tick and trigger: manual. It is "
                           "not held back by OVERLAP = \"skip\" (it was asked for); the next tick is, by it.",
            "parameters": [_path_param("name", {"type": "string"}, "a schedule's id (runner schedules)")],
            "responses": {"202": {"description": "The run's job", "content": {_JSON: {"schema": _obj({
                              "id": _STR, "type": _STR, "version": _INT, "queue": _STR, "status": _STR,
                              "schedule": _STR}, ["id", "type", "queue", "status", "schedule"], extra=True)}}},
                          "404": problem("No such schedule")},
        }},
        "/workers": {"get": {
            "operationId": "list_workers", "tags": ["meta"],
            "summary": "The worker processes alive now, with what each serves and runs (as of its last "
                       "heartbeat)",
            "responses": {"200": ok("The workers, oldest first", "WorkerList")},
        }},
        "/openapi.json": {"get": {
            "operationId": "openapi", "tags": ["meta"], "summary": "This document",
            "responses": {"200": {"description": "OpenAPI 3.1", "content": {_JSON: {"schema": {"type": "object"}}}}},
        }},
        "/metrics": {"get": {
            "operationId": "metrics", "tags": ["meta"], "summary": "Prometheus text format, cluster-wide",
            "responses": {"200": {"description": "Metrics", "content": {
                "text/plain": {"schema": {"type": "string"}},
                "application/openmetrics-text": {"schema": {"type": "string"}}}}},
        }},
        "/healthz": {"get": {
            "operationId": "health", "tags": ["meta"], "summary": "Liveness and Redis reachability (no auth)",
            "responses": {"200": ok("Alive, Redis reachable", "Health"),
                          "503": problem("Alive, but Redis is unreachable")},
        }},
        "/": {"get": {
            "operationId": "dashboard", "tags": ["meta"], "summary": "The dashboard",
            "responses": {"200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}},
        }},
    }


def emit_op(event: str, subscribers: list[str]) -> dict[str, Any]:
    """POST /events/<event>: one operation per event some function subscribes to (as one
    enqueue operation per function), so its scope is emit:<event>."""
    return {
        "operationId": "emit_" + "".join(c if c.isalnum() else "_" for c in event), "tags": ["events"],
        "summary": f"Emit {event}: one job for each of {', '.join(subscribers)}",
        "description": "The body is the event's data, validated against every subscriber's newest schema "
                       "first. An Idempotency-Key dedupes the whole emit. Scope emit or emit:<name>.",
        "parameters": [{"name": "Idempotency-Key", "in": "header", "required": False,
                        "schema": {"type": "string", "minLength": 1, "maxLength": 512}}],
        "requestBody": {"required": True, "content": {_JSON: {"schema": {}}}},
        "responses": {
            "202": {"description": "Emitted: the event's id and its jobs",
                    "content": {_JSON: {"schema": {"type": "object"}}}},
            "200": {"description": "A duplicate of an earlier emit's Idempotency-Key: its record",
                    "content": {_JSON: {"schema": {"type": "object"}}}},
            "400": problem("Malformed JSON, or an invalid Idempotency-Key"),
            "409": problem("The Idempotency-Key is held by an emit of other data"),
            "413": problem("The body is over api.max_body_bytes, or its copies (one per subscriber) over the "
                           "8 MiB an emit may write: the bound, the subscribers and the bytes; nothing was written"),
            "415": problem("The body is not application/json"),
            "422": problem("Some subscriber rejects the data: each function and every error; nothing was written"),
        },
    }
