"""Property-based run of the API against its own /openapi.json (schemathesis), through a
real gunicorn: generated valid and invalid requests for every operation find no 5xx and
no response that breaks the document (status code, content type, body schema, headers)."""

from __future__ import annotations

import time

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

from conftest import Project

TOKEN = "fuzz-token"
EXAMPLES = 10
# Bounds the whole run well under a minute on two cores whatever the generator does.
BUDGET_S = 55.0
CONFORMANCE = [not_a_server_error, status_code_conformance, content_type_conformance,
               response_schema_conformance, response_headers_conformance]


def test_api_conforms_to_its_openapi_document(project: Project) -> None:
    """Every operation, positive and negative data: no 5xx, nothing outside the spec, and
    data the spec calls invalid is refused with a 4xx."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with gunicorn(project, token=TOKEN) as web:
        schema = schemathesis.openapi.from_url(web.url + "/openapi.json", headers=auth)
        ops = [r.ok() for r in schema.get_all_operations()]
        assert len(ops) > 15
        start = time.monotonic()
        tried = 0
        for op in ops:
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
