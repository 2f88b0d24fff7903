"""`runner new NAME`: write a function file and its v1 schema that load and run as they are.

The scaffold is a working example rather than a blank page: a docstring, the options a
function usually sets, a handler that uses ``ctx`` and returns a result, and a schema
that rejects what the handler cannot take. Nothing outside the two new files is touched,
except in a folder with no project yet (no runner.toml here or in a parent folder): there
``new_project`` writes a runner.toml with the defaults and the queue asked for, so the
scaffold's QUEUE names a queue of a file, and commands run in functions/ find the project.
"""

from __future__ import annotations

import keyword
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from runner.config import Config, parse
from runner.errors import ConfigError, RunnerError


class ScaffoldError(RunnerError):
    """The name is not usable or the files exist already."""


@dataclass(frozen=True, slots=True)
class Scaffolded:
    function: Path
    schema: Path


FUNCTION_TEMPLATE = '''"""{title}: describe what this job does and what it touches.

Enqueue it with:  runner enqueue {name} '{{"name": "world"}}'
"""

from __future__ import annotations

from runner import Context, PermanentFailure

QUEUE = "{queue}"  # a queue defined in runner.toml
MAX_ATTEMPTS = {max_attempts}  # tries (with backoff between them) before the dead-letter list
TIMEOUT = {timeout:g}  # seconds the handler may run
# IDEMPOTENCY_KEY = "{{name}}"  # enqueueing the same key twice returns the first job
# RESOURCE_KEY = "greeting:{{name}}"  # jobs with the same key never run at once


def handle(payload: dict, ctx: Context) -> dict:
    """The payload was validated against schemas/{name}/v1.json before it got here."""
    if payload["name"] == "nobody":
        # A failure no retry can fix: straight to the dead-letter list with this reason.
        raise PermanentFailure("there is nobody to greet")
    ctx.logger.info("greeting %s (attempt %d)", payload["name"], ctx.attempt)
    return {{"greeting": f"Hello, {{payload['name']}}!"}}
'''

SCHEMA_TEMPLATE = """{{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "{name} v1",
  "type": "object",
  "properties": {{
    "name": {{"type": "string", "minLength": 1, "maxLength": 200}}
  }},
  "required": ["name"],
  "additionalProperties": false
}}
"""


PROJECT_TEMPLATE = """# runner's project file: this folder is the project (functions/ and schemas/ beside this
# file), and commands run in a subfolder find it. Environment variables override
# (REDIS_URL, ...); an unknown key or a wrong type is an error. See docs/configuration.md.

[redis]
# url = "redis://127.0.0.1:6379/0" # the default; REDIS_URL overrides. Left unset,
#                                  # `runner dev` starts an embedded server of its own.
prefix = "runner"                  # several apps can share one Redis

[queues.{queue}]{pad} # the queue a scaffolded function names in QUEUE
"""
# A folder a project keeps its functions or schemas in: `runner new` there, with no
# runner.toml found, is a project of old (functions alone) seen from inside.
PROJECT_PARTS = ("functions", "schemas")


def project_missing_here(folder: Path) -> Path | None:
    """The project folder above ``folder`` when ``folder`` is its functions/ or schemas/
    (a project with no runner.toml, seen from inside); None otherwise."""
    if folder.name in PROJECT_PARTS and all((folder.parent / part).is_dir() for part in PROJECT_PARTS):
        return folder.parent
    return None


def project_text(queue: str = "default") -> str:
    """The runner.toml of a new project: the defaults, and one queue, ``queue``."""
    head = f"[queues.{queue}]"
    return PROJECT_TEMPLATE.format(queue=queue, pad=" " * max(0, 34 - len(head)))


def project_config(folder: Path, queue: str = "default") -> Config:
    """The config a new project in ``folder`` would load (``project_text(queue)`` with the
    environment's overrides), before anything is written: a queue name no runner.toml can
    hold is refused here, as a --queue option rather than a line of a file."""
    if not queue.replace("_", "").replace("-", "").isalnum():
        raise ConfigError(f"--queue {queue!r}: a queue name is letters, digits, - or _ (e.g. fast)")
    return parse(tomllib.loads(project_text(queue)), folder.resolve(), "runner.toml", os.environ)


def new_project(folder: Path, queue: str = "default") -> Path:
    """Write ``folder``/runner.toml with the defaults and one queue, ``queue``; returns it."""
    toml = folder / "runner.toml"
    toml.write_text(project_text(queue), encoding="utf-8")
    return toml


def check_name(name: str) -> None:
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ScaffoldError(
            f"{name!r} is not a usable function name: use letters, digits and _ "
            "(a Python identifier), e.g. send_invoice"
        )
    if name.startswith("_"):
        raise ScaffoldError(f"{name!r} starts with _, and files starting with _ are not loaded as functions")


def scaffold(config: Config, name: str, queue: str | None = None, force: bool = False) -> Scaffolded:
    """Write functions/NAME.py and schemas/NAME/v1.json; refuse to overwrite unless forced."""
    check_name(name)
    queue_name = queue or next(iter(config.queues))
    if queue_name not in config.queues:
        raise ConfigError(f"no queue {queue_name!r} in {config.source} (have: {', '.join(config.queues)}): "
                          f"add a [queues.{queue_name}] table to it, or pass one of those")
    q = config.queue(queue_name)
    fn_path = config.functions_dir / f"{name}.py"
    schema_dir = config.schemas_dir / name
    schema_path = schema_dir / "v1.json"
    if not force:
        taken = [str(p) for p in (fn_path, schema_dir) if p.exists()]
        if taken:
            raise ScaffoldError(f"{' and '.join(taken)} already exist(s); pick another name or pass --force")
    # A TIMEOUT the queue can hold without relying on lease renewal, so the scaffold
    # loads without a warning on any queue.
    timeout = min(30.0, q.visibility_timeout_s, q.max_timeout_s)
    fn_path.parent.mkdir(parents=True, exist_ok=True)
    schema_dir.mkdir(parents=True, exist_ok=True)
    fn_path.write_text(
        FUNCTION_TEMPLATE.format(
            title=name.replace("_", " ").capitalize(), name=name, queue=queue_name,
            max_attempts=q.max_attempts, timeout=timeout,
        ),
        encoding="utf-8",
    )
    schema_path.write_text(SCHEMA_TEMPLATE.format(name=name), encoding="utf-8")
    return Scaffolded(function=fn_path, schema=schema_path)
