"""POST /jobs/{type} (enqueue) and GET /jobs/{id} (one job). Both share one route, as
the path segment is a function type for POST and a job id for GET."""

from __future__ import annotations

import falcon

from runner.client import Client
from runner.templates import MAX_KEY_BYTES
from runner.web.body import int_param, only_params, read_json, seconds_param, send
from runner.web.problems import Problem

# A year and a day: a longer delay is almost surely a unit mistake (ms for s).
MAX_DELAY_S = 366 * 86_400.0


def idempotency_key(req: falcon.Request) -> str | None:
    raw = req.get_header("Idempotency-Key")
    if raw is None:
        return None
    # WSGI hands headers over as latin-1 text of the raw bytes; keys are UTF-8.
    data = raw.encode("latin-1", "replace")
    try:
        key = data.decode("utf-8")
    except UnicodeDecodeError:
        key = ""
    if not key or len(data) > MAX_KEY_BYTES:
        raise Problem(400, "invalid-header", f"Idempotency-Key must be 1 to {MAX_KEY_BYTES} bytes of UTF-8",
                      title="Invalid header", header="Idempotency-Key")
    return key


class Jobs:
    def __init__(self, client: Client) -> None:
        self.client = client

    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        """Validate and enqueue. 202 new, 200 duplicate; nothing touches Redis before the
        payload, the options and the key have passed every check."""
        rt = self.client.runtime
        fn = rt.registry.get(name)  # 404 before the body is read
        only_params(req, "version", "delay", "run_at")
        payload = read_json(req, rt.config.api.max_body_bytes)
        version = int_param(req, "version", 1, 1_000_000)
        delay = seconds_param(req, "delay", MAX_DELAY_S)
        run_at = seconds_param(req, "run_at", 1e11)
        if delay is not None and run_at is not None:
            raise Problem(400, "invalid-parameter", "give either delay or run_at, not both",
                          title="Invalid parameter", parameter="run_at")
        key = idempotency_key(req)
        job = self.client.enqueue(fn.name, payload, version=version, delay=delay, run_at=run_at,
                                  idempotency_key=key)
        if not job.duplicate:
            resp.location = f"/jobs/{job.id}"
        send(resp, job.as_dict(), 200 if job.duplicate else 202)

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        only_params(req)
        send(resp, self.client.get(name).as_dict())
