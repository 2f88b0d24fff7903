"""A schema's $refs resolve only from schemas/ (and the metaschemas): a remote one is an
error at load that names it, nothing is fetched, even by `runner check --offline`."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest
from test_cli_check import check

from runner.errors import ValidationFailed

from conftest import Project

SOURCE = 'QUEUE = "fast"\n\n\ndef handle(payload, ctx):\n    return None\n'


@pytest.fixture
def served() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server that would serve any schema, and the paths it was asked for."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = json.dumps({"type": "string"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


def test_a_remote_ref_is_an_error_at_load_and_never_fetched(project: Project,
                                                            served: tuple[str, list[str]]) -> None:
    url, hits = served
    ref = f"{url}/name.json"
    project.add_function("remote", SOURCE, json.dumps({"type": "object", "properties": {"name": {"$ref": ref}}}))
    for args in (("--offline",), ()):
        out = check(project, *args)
        assert out.exit_code != 0, out.output
        assert ref in out.output and "not allowed" in out.output, out.output
    assert any(k.endswith("remote.py") for k in project.runtime.registry.errors)
    assert hits == []


def test_a_relative_ref_into_schemas_resolves_and_one_outside_is_refused(project: Project) -> None:
    common = project.root / "schemas" / "common"
    common.mkdir(parents=True)
    (common / "name.json").write_text(json.dumps({"type": "string", "minLength": 2}))
    (project.root / "secret.json").write_text(json.dumps({"type": "string"}))
    project.add_function("local", SOURCE, json.dumps(
        {"type": "object", "properties": {"name": {"$ref": "../common/name.json"}}}))
    project.add_function("escape", SOURCE, json.dumps(
        {"type": "object", "properties": {"name": {"$ref": "../../../secret.json"}}}))
    c = project.client
    assert c.enqueue("local", {"name": "Ann"}).id
    with pytest.raises(ValidationFailed):
        c.enqueue("local", {"name": "A"})
    [error] = [e for k, e in project.runtime.registry.errors.items() if k.endswith("escape.py")]
    assert "secret.json" in str(error)
