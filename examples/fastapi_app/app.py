"""The example FastAPI app: sign a user up and send the welcome email as a job.

Run it: ``RUNNER_CONFIG=runner.toml uvicorn app:app`` beside ``runner worker``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from runner import JobNotFound, ValidationFailed
from runner.contrib.fastapi import RunnerClient, lifespan

app = FastAPI(lifespan=lifespan)


class Signup(BaseModel):
    user_id: int
    email: str
    name: str


@app.post("/signup", status_code=202)
async def signup(body: Signup, runner: RunnerClient) -> dict[str, Any]:
    try:
        job = await runner.aenqueue("send_email", {"user_id": body.user_id, "to": [body.email],
                                                   "name": body.name, "template": "welcome"})
    except ValidationFailed as exc:  # the function's schema is the contract
        raise HTTPException(422, [e.as_dict() for e in exc.errors]) from None
    return {"job": job.id, "status": job.status}


@app.post("/signup/now")
async def signup_now(body: Signup, runner: RunnerClient) -> dict[str, Any]:
    """Call and wait: the handler's result within the request (pushed, not polled)."""
    try:
        result = await runner.acall("send_email", {"user_id": body.user_id, "to": [body.email],
                                                   "name": body.name, "template": "welcome"}, timeout=10)
    except ValidationFailed as exc:
        raise HTTPException(422, [e.as_dict() for e in exc.errors]) from None
    return {"result": result}


@app.get("/jobs/{job_id}")
async def job_status(job_id: str, runner: RunnerClient) -> dict[str, Any]:
    """A job's state, for a caller that did not wait."""
    try:
        job = await run_in_threadpool(runner.get, job_id)  # a blocking read: off the event loop
    except JobNotFound:
        raise HTTPException(404, "no such job") from None
    return job.as_dict()
