"""Property-based run of the API against its own /openapi.json (schemathesis), through a
real gunicorn: generated valid and invalid requests for every operation find no 5xx and
no response that breaks the document (status code, content type, body schema, headers);
and with a token lacking each scope, no operation that needs it answers anything but a
403 naming it."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.specs.openapi.checks import negative_data_rejection
from test_web_support import gunicorn

from conftest import FULL, Project, size

TOKEN = "fuzz-token"
EXAMPLES = int(size("FUZZ_EXAMPLES", 6, 50))
# Bounds the whole run well under a minute on two cores whatever the generator does.
BUDGET_S = 55.0 if not FULL else 600.0
CONFORMANCE = [not_a_server_error, status_code_conformance, content_type_conformance,
               response_schema_conformance, response_headers_conformance]
# An event stream never ends by itself, and a case reads its whole body: test_events.py
# covers it (its scope too).
STREAM = "/events"


def test_api_conforms_to_its_openapi_document(project: Project) -> None:
    """Every operation, positive and negative data: no 5xx, nothing outside the spec, and
    data the spec calls invalid is refused with a 4xx."""
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
                checks = CONFORMANCE + ([negative_data_rejection] if mode is GenerationMode.NEGATIVE else [])

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
    return scope in scopes or (scope.startswith("enqueue:") and "enqueue" in scopes)


def _scoped_run(op: Any, web: Any, name: str, scope: str, refused: dict[str, int]) -> Any:
    """A property over op's valid requests, sent with the token ``name``."""
    ok = _allowed(LACKING[name], scope)

    @given(case=op.as_strategy(generation_mode=GenerationMode.POSITIVE))
    @settings(max_examples=SCOPE_EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def run(case: schemathesis.Case) -> None:
        r = case.call(base_url=web.url, headers={"Authorization": f"Bearer {name}"}, session=web.session)
        if ok:
            assert r.status_code not in (401, 403), (name, case.method, case.formatted_path, r.text)
            return
        assert r.status_code == 403, (name, case.method, case.formatted_path, r.status_code, r.text)
        body: dict[str, Any] = r.json()
        assert body["scope"] == scope and body["token_name"] == name, body
        refused[name] += 1

    return run


def test_no_operation_answers_without_its_scope(project: Project) -> None:
    """Generated valid requests to every operation, sent with tokens that lack one scope
    each: an operation needing that scope answers a 403 problem naming it, whatever the
    request; the others never answer 401 or 403."""
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
            for name in LACKING:
                _scoped_run(op, web, name, scope, refused)()
                assert time.monotonic() - start < BUDGET_S, "schemathesis run over its time budget"
        assert all(n >= SCOPE_EXAMPLES for n in refused.values()), refused
