"""Property-based run of the API against its own /openapi.json (schemathesis), through a
real gunicorn: generated valid and invalid requests for every operation find no 5xx and
no response that breaks the document (status code, content type, body schema, headers);
and with a token lacking each scope, no operation that needs it answers anything but a
403 naming it."""

from __future__ import annotations

import hashlib
import time
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from test_web_support import gunicorn

from conftest import FULL, Project, size

if TYPE_CHECKING:
    import schemathesis

# schemathesis is imported by the tests that use it, not at collection: every test process
# collects this module, and only the one that runs these tests needs the library.

TOKEN = "fuzz-token"
EXAMPLES = int(size("FUZZ_EXAMPLES", 6, 50))
# A guard against a generator that runs away, not a speed check: about 45 s on two quiet
# cores with the suite beside it, and a loaded machine takes twice that.
BUDGET_S = 150.0 if not FULL else 600.0
# An event stream never ends by itself, and a case reads its whole body: test_events.py
# covers it (its scope too).
STREAM = "/events"


def test_api_conforms_to_its_openapi_document(project: Project) -> None:
    """Every operation, positive and negative data: no 5xx, nothing outside the spec, and
    data the spec calls invalid is refused with a 4xx."""
    import schemathesis
    from schemathesis import GenerationMode
    from schemathesis.checks import (
        content_type_conformance,
        not_a_server_error,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )
    from schemathesis.specs.openapi.checks import negative_data_rejection

    conformance = [not_a_server_error, status_code_conformance, content_type_conformance,
                   response_schema_conformance, response_headers_conformance]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    # No worker runs here: a ?wait= holds its request for the whole wait, so keep it short.
    project.write_config(extra="\n[api]\nmax_wait = 0.2\n")
    with gunicorn(project, token=TOKEN) as web:
        schema = schemathesis.openapi.from_url(web.url + "/openapi.json", headers=auth)
        ops = [r.ok() for r in schema.get_all_operations()]
        assert len(ops) > 15
        start = time.monotonic()
        tried = 0
        for op in ops:
            if op.path == STREAM:
                continue
            if op.path in ("/metrics", "/"):
                modes = [GenerationMode.POSITIVE]  # no inputs: nothing to make invalid
            else:
                modes = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
            for mode in modes:
                checks = conformance + ([negative_data_rejection] if mode is GenerationMode.NEGATIVE else [])

                @given(case=op.as_strategy(generation_mode=mode))
                @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                          phases=[Phase.explicit, Phase.generate],
                          suppress_health_check=list(HealthCheck))
                def run(case: schemathesis.Case) -> None:
                    nonlocal tried
                    tried += 1
                    case.call_and_validate(base_url=web.url, headers=auth, checks=checks,  # noqa: B023 - run() now
                                           session=web.session)

                try:
                    run()
                except Unsatisfiable:
                    # No parameter to break (e.g. /healthz): there is no invalid request to make.
                    assert mode is GenerationMode.NEGATIVE, op.label
                assert time.monotonic() - start < BUDGET_S, "schemathesis run over its time budget"
        assert tried > len(ops) * 5


# Each token lacks one scope (or enqueue for every function but one).
LACKING = {"no-enqueue": ["read", "operate"], "no-read": ["enqueue", "operate"],
           "no-operate": ["enqueue", "read"], "one-function": ["enqueue:noop", "read", "operate"]}
SCOPE_EXAMPLES = int(size("FUZZ_EXAMPLES", 6, 50)) // 2


def _allowed(scopes: list[str], scope: str) -> bool:
    return (scope in scopes or (scope.startswith("enqueue:") and "enqueue" in scopes)
            or (scope == "signal" and "operate" in scopes))  # operate may send a signal too


def _scoped_run(op: Any, web: Any, scope: str, refused: dict[str, int]) -> Any:
    """A property over op's valid requests, each sent with every token of LACKING (the
    cases are made once for all of them: making them was most of a run's time, and a
    derandomized run made the same cases for each token anyway)."""
    from schemathesis import GenerationMode

    @given(case=op.as_strategy(generation_mode=GenerationMode.POSITIVE))
    @settings(max_examples=SCOPE_EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def run(case: schemathesis.Case) -> None:
        for name in LACKING:
            r = case.call(base_url=web.url, headers={"Authorization": f"Bearer {name}"}, session=web.session)
            if _allowed(LACKING[name], scope):
                assert r.status_code not in (401, 403), (name, case.method, case.formatted_path, r.text)
                continue
            assert r.status_code == 403, (name, case.method, case.formatted_path, r.status_code, r.text)
            body: dict[str, Any] = r.json()
            assert body["scope"] == scope and body["token_name"] == name, body
            refused[name] += 1

    return run


def test_no_operation_answers_without_its_scope(project: Project) -> None:
    """Generated valid requests to every operation, sent with tokens that lack one scope
    each: an operation needing that scope answers a 403 problem naming it, whatever the
    request; the others never answer 401 or 403."""
    import schemathesis

    toml = "".join(f'\n[api.tokens.{name}]\nhash = "sha256:{hashlib.sha256(name.encode()).hexdigest()}"\n'
                   f"scopes = {scopes!r}\n".replace("'", '"') for name, scopes in LACKING.items())
    project.write_config(extra="\n[api]\nmax_wait = 0.2\n" + toml)  # no worker: keep ?wait= short
    with gunicorn(project, token=TOKEN) as web:
        schema = schemathesis.openapi.from_url(web.url + "/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"})
        start = time.monotonic()
        refused: dict[str, int] = dict.fromkeys(LACKING, 0)
        for op in [r.ok() for r in schema.get_all_operations()]:
            scope = op.definition.raw.get("x-runner-scope")
            if scope is None or op.path == STREAM:
                continue  # /healthz, / and /whoami need no scope
            _scoped_run(op, web, scope, refused)()
            assert time.monotonic() - start < BUDGET_S, "schemathesis run over its time budget"
        assert all(n >= SCOPE_EXAMPLES for n in refused.values()), refused


def _hostile_bodies() -> list[bytes]:
    """Deep nesting (at the limit, past it, past the encoder's and the parser's), integers
    past 64 bits either way, strings that make a backtracking pattern slow, long names that
    make a backtracking key regex slow, and many names over a propertyNames bound."""
    def nest(levels: int, inner: bytes = b"1") -> bytes:
        return b'{"a":' * levels + inner + b"}" * levels

    slow = b'"' + b"a" * int(size("FUZZ_PATTERN_CHARS", 20_000, 200_000))
    # Long names failing a key regex with a lookaround; many names over a propertyNames bound.
    names = b",".join(b'"%05d' % i + b"a" * 9995 + b'":1' for i in range(int(size("FUZZ_NAMES", 30, 90))))
    many = b",".join(b'"%05d' % i + b"a" * 95 + b'":1' for i in range(4000))
    return [
        b"{" + names + b"}", b'{"names":{' + many + b"}}",
        b'{"free":' + nest(126) + b"}", b'{"free":' + nest(129) + b"}", b'{"free":' + nest(300) + b"}",
        nest(1100), b"[" + nest(200) + b"]", b'{"free":' + nest(900, b"12345678901234567890") + b"}",
        b'{"n":-9223372036854775809}', b'{"n":18446744073709551616}', b'{"n":-1000000000000000000000000000000}',
        b'{"n":1e400}', b'{"capped":' + slow + b'","free":' + slow + b'","plain":' + slow + b'!"}',
        b'{"capped":"A1A1A1A1","free":' + slow + b'"}',
    ]


def test_hostile_bodies_never_get_a_server_error(project: Project) -> None:
    """Every operation that takes a JSON body, with each hostile body in place of a valid
    one: a 4xx problem or a 2xx, never a 5xx; and the process answers /healthz throughout."""
    import json as json_mod

    import requests
    import schemathesis

    project.add_function("signup", 'QUEUE = "fast"\n\n\ndef handle(payload, ctx):\n    return None\n',
                         json_mod.dumps({"type": "object", "properties": {
                             "capped": {"type": "string", "maxLength": 64, "pattern": "(?=.*[A-Z])(?=.*[0-9]).{8,}"},
                             "free": {"type": "string", "pattern": "(?=.*[A-Z])(?=.*[0-9]).{8,}"},
                             "plain": {"type": "string", "pattern": "^(a+)+$"},
                             "names": {"type": "object", "propertyNames": {"maxLength": 64}}},
                             "patternProperties": {"(?=.*[A-Z])(?=.*[0-9]).{8,}": {"type": "integer"}}}))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    project.write_config(extra="\n[api]\nmax_wait = 0.2\n")
    bodies = _hostile_bodies()
    with gunicorn(project, token=TOKEN) as web:
        schema = schemathesis.openapi.from_url(web.url + "/openapi.json", headers=auth)
        ops = [r.ok() for r in schema.get_all_operations()]
        posts = [op for op in ops if op.method.upper() in ("POST", "PUT", "PATCH") and op.body]
        assert any(op.path == "/jobs/signup" for op in posts), [op.path for op in posts]
        sent = 0
        for op in posts:
            path = op.path
            for name, value in (("type", "signup"), ("queue", "fast"), ("job_id", "no-such-job"), ("id", "no-such"),
                                ("group_id", "no-such-group"), ("signal", "go")):
                path = path.replace("{" + name + "}", value)
            assert "{" not in path, op.path
            for body in bodies:
                r = web.post(path, data=body, headers={"Content-Type": "application/json"})
                assert r.status_code < 500, (path, body[:80], r.status_code, r.text[:300])
                if r.status_code >= 400:
                    assert r.headers["Content-Type"] == "application/problem+json", (path, r.text[:200])
                sent += 1
                assert requests.get(web.url + "/healthz", timeout=2).status_code == 200
        assert sent >= len(bodies) * 5
