"""Every function option's refusal, word for word and on the option's line; which one a
file with two broken options gets (the options in their order, the schemas between the
plain options and those that name payload fields); and each option's default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner import config
from runner.catalog import registry
from runner.config import Backoff

HANDLE = "def handle(p, c):\n    pass\n"
TOML = """
[queues.fast]
visibility_timeout = 30
[queues.slow]
visibility_timeout = 900
max_attempts = 7
max_timeout = 600
isolation = "process"
backoff = { base = 2.0, cap = 60.0, jitter = "equal" }
"""
SCHEMA = {"type": "object", "properties": {"user_id": {"type": "integer"}}}


def load(tmp_path: Path, files: dict[str, str], schemas: dict[str, object] | None = None) -> registry.Registry:
    (tmp_path / "runner.toml").write_text(TOML)
    (tmp_path / "functions").mkdir()
    for name, src in files.items():
        (tmp_path / "functions" / f"{name}.py").write_text(src)
    for rel, doc in (schemas if schemas is not None else {f"{n}/v1.json": SCHEMA for n in files}).items():
        (tmp_path / "schemas" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "schemas" / rel).write_text(json.dumps(doc))
    return registry.load(config.load(tmp_path / "runner.toml", env={}))


def load_one(tmp_path: Path, src: str, schemas: dict[str, object] | None = None) -> registry.Registry:
    return load(tmp_path, {"fn": src, "ok": HANDLE}, schemas)


def error_of(reg: registry.Registry) -> str:
    (err,) = reg.errors.values()
    return str(err)


@pytest.mark.parametrize("options,message", [
    ("QUEUE = 3", "QUEUE must be a string, got 3"),
    ("MAX_ATTEMPTS = 0", "MAX_ATTEMPTS must be a positive integer, at most 1,000,000,000, got 0"),
    ("MAX_ATTEMPTS = True", "MAX_ATTEMPTS must be a positive integer, at most 1,000,000,000, got True"),
    ("MAX_ATTEMPTS = None", "MAX_ATTEMPTS must be a positive integer, at most 1,000,000,000, got None"),
    ("MAX_ATTEMPTS = 10**10", "MAX_ATTEMPTS must be a positive integer, at most 1,000,000,000, got 10000000000"),
    ('TIMEOUT = "x"', "TIMEOUT must be a positive number of seconds, got 'x'"),
    ("TIMEOUT = -1", "TIMEOUT must be a positive number of seconds, got -1"),
    ("TIMEOUT = 900", "TIMEOUT 900 s does not fit queue 'fast': its max_timeout is 300 s (10 x visibility_timeout "
                      "unless set); use a queue with a longer lease or raise queues.fast.max_timeout"),
    ("BACKOFF = 3", "BACKOFF must be a dict with keys base, cap, jitter"),
    ('BACKOFF = {"bse": 1}', "BACKOFF must be a dict with keys base, cap, jitter"),
    ('BACKOFF = {"base": 5, "cap": 1}', "BACKOFF needs 0 <= base <= cap and jitter in ('full', 'equal', 'none')"),
    ('BACKOFF = {"jitter": "some"}', "BACKOFF needs 0 <= base <= cap and jitter in ('full', 'equal', 'none')"),
    ('ISOLATION = "fork"', "ISOLATION must be one of 'thread', 'process', got 'fork'"),
    ("MEMORY_MB = 8", "MEMORY_MB must be a number of megabytes >= 16, got 8"),
    ("MEMORY_MB = 64", 'MEMORY_MB caps a child process: it needs ISOLATION = "process"'),
    ("KEEP_RESULT = 0", "KEEP_RESULT must be a positive number of seconds, got 0"),
    ('MAX_AGE = "1h"', "MAX_AGE must be a positive number of seconds, got '1h'"),
    ("KEEP_RESULT = 1e308", "KEEP_RESULT must be at most 315,360,000 seconds, got 1e+308"),
    ("MAX_AGE = 1e308", "MAX_AGE must be at most 315,360,000 seconds, got 1e+308"),
    ('KEEP_RESULT = float("inf")', "KEEP_RESULT must be a positive number of seconds, got inf"),
    ("ON_SUCCESS = 3", "ON_SUCCESS must name a function (a string), got 3"),
    ('ON_FAILURE = "a-b"', "ON_FAILURE must name a function (a string), got 'a-b'"),
    ("upgrade = 3", "upgrade must be a function upgrade(payload, from_version)"),
    ('IDEMPOTENCY_KEY = "{missing}"',
     "IDEMPOTENCY_KEY names field 'missing', which the v1 schema does not declare"),
    ('RESOURCE_KEY = "{x.__class__}"',
     "RESOURCE_KEY: template '{x.__class__}': {x.__class__} must be a field name (dotted for nested fields)"),
    ("CONCURRENCY = 0", "CONCURRENCY the limit must be an integer from 1 to 1000000, got 0"),
    ('CONCURRENCY = {"limit": 1, "key": "{nope}"}',
     "CONCURRENCY key names field 'nope', which the v1 schema does not declare"),
    ("RATE_LIMIT = 5", 'RATE_LIMIT must be a dict with "limit" and "period" (seconds) and an optional "key", got 5'),
    ('RATE_LIMIT = {"limit": 5, "period": 1, "key": "{nope}"}',
     "RATE_LIMIT key names field 'nope', which the v1 schema does not declare"),
    ("PRIORITY = 10", "PRIORITY must be an integer from 0 to 9, got 10"),
])
def test_each_option_is_refused_word_for_word_on_its_line(tmp_path: Path, options: str, message: str) -> None:
    src = f'\n{options}\nQUEUE = "fast"\n' + HANDLE if not options.startswith("QUEUE") else f"\n{options}\n" + HANDLE
    path = tmp_path / "functions" / "fn.py"
    assert error_of(load_one(tmp_path, src)) == f"{path}:2: {message}"


def test_a_queue_that_does_not_exist_names_the_config_and_its_queues(tmp_path: Path) -> None:
    reg = load_one(tmp_path, '\nQUEUE = "nope"\n' + HANDLE)
    path = tmp_path / "functions" / "fn.py"
    assert error_of(reg) == f"{path}:2: QUEUE 'nope' is not defined in {tmp_path / 'runner.toml'} (have: fast, slow)"


NO_SCHEMA = {"ok/v1.json": {"type": "object"}}


@pytest.mark.parametrize("options,schemas,needle", [
    ("MAX_ATTEMPTS = 0\nTIMEOUT = 'x'", None, "MAX_ATTEMPTS must be"),
    ("PRIORITY = 10\nMAX_AGE = 0", None, "MAX_AGE must be"),
    ("ON_SUCCESS = 3\nISOLATION = 'fork'", None, "ISOLATION must be"),
    ("ON_FAILURE = 3", NO_SCHEMA, "ON_FAILURE must name"),
    ("upgrade = 3", NO_SCHEMA, "upgrade must be"),
    ("IDEMPOTENCY_KEY = 3", NO_SCHEMA, "no schema: expected"),
    ("CONCURRENCY = 0", NO_SCHEMA, "no schema: expected"),
    ("PRIORITY = 10", NO_SCHEMA, "no schema: expected"),
    ("PRIORITY = 10\nRATE_LIMIT = 5", None, "RATE_LIMIT must be"),
    ("RESOURCE_KEY = '{nope}'\nIDEMPOTENCY_KEY = '{none}'", None, "IDEMPOTENCY_KEY names field"),
])
def test_the_first_broken_option_in_order_is_the_one_reported(tmp_path: Path, options: str,
                                                              schemas: dict[str, object] | None, needle: str) -> None:
    assert needle in error_of(load_one(tmp_path, f'QUEUE = "fast"\n{options}\n' + HANDLE, schemas))


def test_options_left_out_take_their_queues_settings(tmp_path: Path) -> None:
    reg = load(tmp_path, {"plain": 'QUEUE = "slow"\n' + HANDLE,
                          "capped": 'QUEUE = "slow"\nBACKOFF = {"cap": 9}\nMEMORY_MB = 32\n' + HANDLE,
                          "first": HANDLE})
    assert not reg.errors
    plain, capped, first = reg.get("plain"), reg.get("capped"), reg.get("first")
    assert (plain.max_attempts, plain.timeout_s, plain.isolation, plain.priority) == (7, 600.0, "process", 0)
    assert plain.backoff == Backoff(2.0, 60.0, "equal")
    assert (plain.memory_mb, plain.keep_result_s, plain.max_age_s, plain.on_success, plain.on_failure,
            plain.idempotency_key, plain.resource_key, plain.concurrency, plain.rate) == (None,) * 9
    assert capped.backoff == Backoff(2.0, 9.0, "equal") and capped.memory_mb == 32.0
    assert (first.queue, first.timeout_s, first.max_attempts) == ("fast", 30.0, 5)


def test_a_timeout_past_the_lease_is_a_warning(tmp_path: Path) -> None:
    reg = load_one(tmp_path, 'QUEUE = "fast"\nTIMEOUT = 45\n' + HANDLE)
    path = tmp_path / "functions" / "fn.py"
    assert f"{path}: TIMEOUT 45 s is longer than queue 'fast''s visibility timeout (30 s); it relies on lease " \
           "renewal" in reg.warnings
    assert reg.get("fn").timeout_s == 45.0
