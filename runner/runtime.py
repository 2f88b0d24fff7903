"""The runtime: configuration, one Redis client, its scripts and the current registry.

Every entry point (CLI, web app, worker, dev supervisor) builds one Runtime and passes it
down. The registry is replaced whole on reload; readers take one reference per job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runner.catalog import registry
from runner.catalog.registry import Registry
from runner.config import Config
from runner.store import connection
from runner.store.keys import QueueKeys, for_queue
from runner.store.scripts import Scripts


@dataclass(slots=True)
class Runtime:
    config: Config
    redis: Any
    scripts: Scripts
    registry: Registry
    keys: dict[str, QueueKeys] = field(default_factory=dict)

    @classmethod
    def create(cls, config: Config, reg: Registry | None = None, **redis_overrides: Any) -> Runtime:
        client = connection.connect(config.redis, **redis_overrides)
        return cls(
            config=config,
            redis=client,
            scripts=Scripts(client),
            registry=reg if reg is not None else registry.load(config),
            keys={q: for_queue(config.redis.prefix, q) for q in config.queues},
        )

    def reload(self) -> Registry:
        """Load functions/ and schemas/ again; broken files keep their last good version."""
        self.registry = registry.load(self.config, previous=self.registry)
        return self.registry

    def close(self) -> None:
        self.redis.close()
