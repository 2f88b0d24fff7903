"""FastAPI: the process's shared client as a dependency::

    from runner.contrib.fastapi import RunnerClient, lifespan

    app = FastAPI(lifespan=lifespan)

    @app.post("/signup")
    async def signup(body: Signup, runner: RunnerClient) -> dict:
        job = await runner.aenqueue("send_email", body.model_dump())
        return {"job": job.id}

``aenqueue`` validates in the route and shares round trips between concurrent requests
without blocking the event loop; ``await runner.acall(type, payload, timeout=10)``
enqueues and waits for the handler's result within the request (the end is pushed
over one subscriber per process, not polled).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request

from runner.client import Client
from runner.contrib.shared import pinned_client, shared_client


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Build the shared client at start-up (a bad config fails the start, not a request)."""
    app.state.runner_client = shared_client()
    yield


def get_client(request: Request) -> Client:
    """The pinned client (a test's), else the one the lifespan built, else the shared one."""
    client: Any = pinned_client() or getattr(request.app.state, "runner_client", None)
    return client if isinstance(client, Client) else shared_client()


RunnerClient = Annotated[Client, Depends(get_client)]
