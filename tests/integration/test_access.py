"""Scoped API tokens through a real `runner web`: each token gets what its scopes allow
and a 403 naming the scope it lacks everywhere else, an operator's actions are on record
under its token's name, `runner token new` prints lines that let its token in, a token is
rotated with no downtime, and no route is served without a scope."""

from __future__ import annotations

import getpass
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import falcon
import falcon.testing
import requests
from click.testing import CliRunner
from openapi_spec_validator import validate as validate_openapi
from test_web_api import assert_problem
from test_web_support import RunnerWeb, runner_web

from runner import config as config_mod
from runner.cli import cli
from runner.client import Request
from runner.store import audit
from runner.web import auth, create_app
from runner.worker.worker import Worker

from conftest import Project, wait_for

SECRETS = {"producer": "producer-secret", "support": "support-secret", "ops": "ops-secret"}
SCOPES = {"producer": {"enqueue:record"}, "support": {"read"}, "ops": {"read", "operate"}}
TOKENS = f"""
[api.tokens.producer]
env = "RUNNER_TOKEN_PRODUCER"
scopes = ["enqueue:record"]

[api.tokens.support]
hash = "sha256:{hashlib.sha256(SECRETS["support"].encode()).hexdigest()}"
scopes = ["read"]

[api.tokens.ops]
env = "RUNNER_TOKEN_OPS"
scopes = ["read", "operate"]
"""
# RUNNER_API_TOKEN unset: only the tokens of runner.toml.
ENV = {"RUNNER_API_TOKEN": "", "RUNNER_TOKEN_PRODUCER": SECRETS["producer"], "RUNNER_TOKEN_OPS": SECRETS["ops"]}


def call(web: RunnerWeb, secret: str | None, method: str, path: str, **kw: Any) -> requests.Response:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    return requests.request(method, web.url + path, headers=headers, timeout=10, **kw)


def allowed(scopes: set[str], scope: str) -> bool:
    return scope in scopes or (scope.startswith("enqueue:") and "enqueue" in scopes) or (
        scope == "signal" and "operate" in scopes) or (scope.startswith("emit") and "emit" in scopes)


def dead_jobs(project: Project, n: int) -> list[str]:
    c = project.client
    ids = [c.enqueue("perm", {}).id for _ in range(n)]
    worker = Worker(project.runtime, ["fast"])
    worker.start()
    try:
        wait_for(lambda: all(c.get(i).status == "dead" for i in ids), what="the jobs to die")
    finally:
        worker.stop(2)
    return ids


def operations(doc: dict[str, Any], values: dict[str, str]) -> list[tuple[str, str, str]]:
    """(method, path with its parameters filled in, scope) of every operation that needs one."""
    out = []
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if "x-runner-scope" in op:
                out.append((method.upper(), path.format(**values), op["x-runner-scope"]))
    return out


@contextmanager
def serving(project: Project, name: str, tokens: str = TOKENS, env: dict[str, str] | None = None
            ) -> Iterator[RunnerWeb]:
    project.write_config(extra=tokens)
    with runner_web(project, name, workers=1, env={**ENV, **(env or {})}) as web:
        yield web


def test_each_token_gets_what_its_scopes_allow_and_a_403_naming_the_scope_elsewhere(project: Project) -> None:
    """A producer token scoped to one function enqueues it (202) and gets a 403 for another
    function and for every read and operate route; a read token gets every GET and a 403 on
    each write; an operate token requeues and deletes. Every 403 names the scope missing;
    the OpenAPI document marks each operation's scope."""
    requeue_me, delete_me = dead_jobs(project, 2)
    group = project.client.group([Request("record", {"n": 1})], then=Request("noop", {}))
    with serving(project, "access") as web:
        doc = call(web, SECRETS["support"], "GET", "/openapi.json").json()
        validate_openapi(doc)
        ops = operations(doc, {"queue": "fast", "id": requeue_me, "type": "record", "group_id": group.id,
                                "signal": "approval", "name": "order.created"})
        scopes = {s for _, _, s in ops}
        assert {"read", "operate", "enqueue:record", "enqueue:noop"} <= scopes
        for path, item in doc["paths"].items():
            for op in item.values():
                scope = op.get("x-runner-scope")
                if path in ("/", "/healthz"):
                    assert op["security"] == [] and scope is None
                elif path == "/whoami":
                    assert op["security"] == [{"bearer": []}]
                elif scope.startswith("enqueue:"):
                    assert op["security"] == [{"bearer": ["enqueue"]}, {"bearer": [scope]}]
                    assert scope == "enqueue:" + path.split("/")[2]
                elif scope == "signal":  # or operate
                    assert op["security"] == [{"bearer": ["signal"]}, {"bearer": ["operate"]}]
                else:
                    assert op["security"] == [{"bearer": [scope]}] and "403" in op["responses"]

        for name, secret in SECRETS.items():
            for method, path, scope in ops:
                if allowed(SCOPES[name], scope):
                    continue
                body = assert_problem(call(web, secret, method, path, json={}), 403, "forbidden")
                # An emit needs "emit" or "emit:<the event's name>": the refusal names the latter.
                want = "emit:order.created" if path.startswith("/events/") else scope
                assert body["scope"] == want and body["token_name"] == name, body
                assert repr(want) in body["detail"] and name in body["detail"]
        assert project.client.get(requeue_me).status == "dead" and project.client.get(delete_me).status == "dead"

        assert call(web, SECRETS["producer"], "POST", "/jobs/record", json={"n": 1}).status_code == 202
        assert call(web, SECRETS["producer"], "POST", "/jobs/record/batch", json=[{"n": 2}]).status_code == 202
        for name in ("support", "ops"):
            for method, path, _ in ops:
                if method == "GET":
                    # Streamed: GET /events answers at once, then never ends by itself.
                    with call(web, SECRETS[name], method, path, stream=True) as r:
                        assert r.status_code == 200, (name, path, r.status_code)

        done = call(web, SECRETS["ops"], "POST", f"/dead/fast/{requeue_me}/requeue")
        assert done.status_code == 200, done.text
        entry = done.json()["history"][-1]
        assert entry["outcome"] == "requeued" and entry["by"] == "ops" and entry["at_ms"] > 0
        assert call(web, SECRETS["support"], "GET", f"/jobs/{requeue_me}").json()["history"][-1] == entry
        assert call(web, SECRETS["ops"], "DELETE", f"/dead/fast/{delete_me}").status_code == 204

        trail = call(web, SECRETS["support"], "GET", "/audit").json()
        assert trail["total"] == 2
        assert [(e["action"], e["by"], e["job_id"]) for e in trail["entries"]] == [
            ("delete", "ops", delete_me), ("requeue", "ops", requeue_me)]
        assert trail["entries"][0]["at"] >= trail["entries"][1]["at"] > 0
        page = call(web, SECRETS["ops"], "GET", "/audit?limit=1&offset=1").json()
        assert [e["action"] for e in page["entries"]] == ["requeue"]
        assert call(web, SECRETS["producer"], "GET", "/audit").status_code == 403

    log = (project.root / "access.log").read_text()
    lines = [json.loads(ln) for ln in log.splitlines() if ln.startswith("{")]
    audit = [ln for ln in lines if ln.get("logger") == "runner.audit"]
    assert [(ln["audit"], ln["by"], ln["job_id"]) for ln in audit] == [
        ("requeue", "ops", requeue_me), ("delete", "ops", delete_me)]
    for secret in SECRETS.values():
        assert secret not in log


def test_a_missing_or_unknown_token_is_a_401_and_a_url_never_carries_one(project: Project) -> None:
    """No token, an unknown one, or one sent in the query string (where it would end up in
    logs) is a 401; /healthz and the dashboard's shell need none; a known token may always
    ask who it is, and a path that is no route tells a scoped token nothing."""
    with serving(project, "access-401") as web:
        assert_problem(call(web, None, "GET", "/queues"), 401, "unauthorized")
        r = call(web, "not-a-token", "GET", "/queues")
        assert_problem(r, 401, "unauthorized")
        assert 'error="invalid_token"' in r.headers["WWW-Authenticate"]
        for query in (f"access_token={SECRETS['ops']}", f"token={SECRETS['ops']}"):
            body = assert_problem(call(web, None, "GET", f"/queues?{query}"), 401, "unauthorized")
            assert "never accepted in a URL" in body["detail"]
        assert_problem(call(web, None, "POST", "/jobs/record", json={"n": 1}), 401, "unauthorized")
        assert call(web, None, "GET", "/healthz").status_code == 200
        assert call(web, None, "GET", "/").status_code == 200
        assert call(web, None, "GET", "/static/app.js").status_code == 200
        me = call(web, SECRETS["producer"], "GET", "/whoami")
        assert me.json() == {"name": "producer", "scopes": ["enqueue:record"], "auth": True}
        r = call(web, SECRETS["producer"], "GET", "/no/such/path")
        assert assert_problem(r, 403, "forbidden")["scope"] == "read"
        assert 'error="insufficient_scope", scope="read"' in r.headers["WWW-Authenticate"]
        assert assert_problem(call(web, SECRETS["ops"], "GET", "/no/such/path"), 404, "not-found")
        assert assert_problem(call(web, SECRETS["producer"], "POST", "/jobs/nope", json={}), 403,
                              "forbidden")["scope"] == "enqueue:nope"
    assert SECRETS["ops"] not in (project.root / "access-401.log").read_text()


def test_a_token_is_rotated_by_adding_the_new_one_deploying_and_removing_the_old(project: Project) -> None:
    """Two tokens with the same scopes both work, each on record under its own name; once the
    old one is removed and the web restarted, it is a 401 and the new one still works."""
    def ops_token(name: str, var: str) -> str:
        return f'\n[api.tokens.{name}]\nenv = "{var}"\nscopes = ["read", "operate"]\n'

    old, new = ops_token("ops-old", "RUNNER_TOKEN_OPS_OLD"), ops_token("ops-new", "RUNNER_TOKEN_OPS_NEW")
    env = {"RUNNER_TOKEN_OPS_OLD": "old-secret", "RUNNER_TOKEN_OPS_NEW": "new-secret"}
    first, second = dead_jobs(project, 2)
    with serving(project, "rotate-1", old, env) as web:
        assert call(web, "old-secret", "GET", "/queues").status_code == 200
        assert_problem(call(web, "new-secret", "GET", "/queues"), 401, "unauthorized")
    with serving(project, "rotate-2", old + new, env) as web:
        assert call(web, "old-secret", "POST", f"/dead/fast/{first}/requeue").status_code == 200
        assert call(web, "new-secret", "POST", f"/dead/fast/{second}/requeue").status_code == 200
        by = [e["by"] for e in call(web, "new-secret", "GET", "/audit").json()["entries"]]
        assert by == ["ops-new", "ops-old"]
    with serving(project, "rotate-3", new, env) as web:
        assert_problem(call(web, "old-secret", "GET", "/queues"), 401, "unauthorized")
        assert call(web, "new-secret", "GET", "/queues").status_code == 200


def test_runner_token_new_prints_lines_that_let_its_token_in(project: Project) -> None:
    """The token is printed once, the runner.toml lines hold its hash and not the token;
    pasted into runner.toml they let it in with exactly the scopes asked for."""
    made = subprocess.run([sys.executable, "-m", "runner.cli", "token", "new", "ci", "--scope", "enqueue:record",
                           "--scope", "read"], capture_output=True, text=True, timeout=30, env=project.env,
                          cwd=project.root)
    assert made.returncode == 0, made.stderr
    lines = made.stdout.splitlines()
    secret = next(ln for ln in lines if ln.startswith("runner_"))
    toml = "\n".join(lines[lines.index("[api.tokens.ci]"):])
    assert secret not in toml and hashlib.sha256(secret.encode()).hexdigest() in toml
    with serving(project, "token-new", "\n" + toml + "\n") as web:
        me = call(web, secret, "GET", "/whoami").json()
        assert me == {"name": "ci", "scopes": ["enqueue:record", "read"], "auth": True}
        assert call(web, secret, "POST", "/jobs/record", json={"n": 1}).status_code == 202
        assert call(web, secret, "GET", "/queues").status_code == 200
        assert_problem(call(web, secret, "DELETE", "/dead/fast/x"), 403, "forbidden")
        assert_problem(call(web, "runner_" + "x" * 43, "GET", "/queues"), 401, "unauthorized")
    again = subprocess.run([sys.executable, "-m", "runner.cli", "token", "new", "ci", "--scope", "read"],
                           capture_output=True, text=True, timeout=30, env=project.env)
    assert secret not in again.stdout
    refused = CliRunner().invoke(cli, ["token", "new", "ci", "--scope", "reed"])
    assert refused.exit_code == 2 and "unknown scope 'reed'" in refused.output
    # "default" is RUNNER_API_TOKEN's name: lines under it would stop `runner web` from
    # starting wherever that variable is set, so the name is refused here already.
    reserved = CliRunner().invoke(cli, ["token", "new", "default", "--scope", "read"])
    assert reserved.exit_code == 2 and "RUNNER_API_TOKEN" in reserved.output, reserved.output
    assert "[api.tokens.default]" not in reserved.output


def test_check_and_web_name_the_token_and_key_that_cannot_work(project: Project) -> None:
    """`runner check` fails on a scope naming no function and on a token whose variable is
    not set; `runner web` refuses to serve with the latter (exit 2), naming both."""
    project.write_config(extra='\n[api.tokens.ci]\nenv = "RUNNER_TOKEN_CI"\nscopes = ["enqueue:record", '
                               '"enqueue:recrod"]\n')
    args = ["--config", str(project.root / "runner.toml")]
    env = {**project.env, "RUNNER_TOKEN_CI": ""}
    check = CliRunner().invoke(cli, [*args, "check", "--offline", "--json"], env=env)
    assert check.exit_code == 1, check.output
    messages = [p["message"] for p in json.loads(check.stdout)["problems"] if p["severity"] == "error"]
    assert any("api.tokens.ci.scopes: enqueue:recrod names no function" in m for m in messages), messages
    assert any("api.tokens.ci.env: the variable RUNNER_TOKEN_CI is not set" in m for m in messages), messages
    web = CliRunner().invoke(cli, [*args, "web"], env=env)
    assert web.exit_code == 2 and "api.tokens.ci.env: the variable RUNNER_TOKEN_CI is not set" in web.output
    fixed = CliRunner().invoke(cli, [*args, "check", "--offline"], env={**env, "RUNNER_TOKEN_CI": "s"})
    assert fixed.exit_code == 1 and "enqueue:recrod" in fixed.output


def test_cli_actions_are_on_record_as_cli_and_the_user(project: Project) -> None:
    """`runner dead requeue` and `runner dead purge` record "cli:<user>": in the job's
    history and on the audit trail."""
    requeued, purged = dead_jobs(project, 2)
    args = ["--config", str(project.root / "runner.toml"), "dead"]
    ok = CliRunner().invoke(cli, [*args, "requeue", requeued, "--payload", "{}"], env=project.env)
    assert ok.exit_code == 0, ok.output
    who = f"cli:{getpass.getuser()}"
    entry = project.client.get(requeued).as_dict()["history"][-1]
    assert (entry["outcome"], entry["by"], entry["edited"]) == ("requeued", who, True)
    assert CliRunner().invoke(cli, [*args, "purge", purged], env=project.env).exit_code == 0
    _, trail = project.client.audit()
    assert [(e["action"], e["by"], e["job_id"]) for e in trail] == [("delete", who, purged),
                                                                      ("requeue", who, requeued)]
    assert trail[1]["edited"] is True and trail[1]["type"] == "perm"


def test_cancel_pause_and_resume_are_on_record_with_the_token_name(project: Project) -> None:
    """Every operate action is on record, not only the dead-letter ones: a cancel over
    HTTP puts "by" in the job's history and an entry on the trail; a queue's and a
    function's pause and resume each put an entry on the trail and a line in the log."""
    c = project.client
    later = c.enqueue("record", {"n": 1}, delay=600).id
    with serving(project, "operate") as web:
        r = call(web, SECRETS["ops"], "DELETE", f"/jobs/{later}")
        assert r.status_code == 200 and r.json()["cancel"] == "cancelled", r.text
        job = call(web, SECRETS["support"], "GET", f"/jobs/{later}").json()
        assert job["status"] == "cancelled"
        assert [(e["outcome"], e["by"]) for e in job["history"]] == [("cancel", "ops")], job["history"]
        for path in ("/queues/fast/pause", "/queues/fast/resume", "/functions/record/pause",
                     "/functions/record/resume"):
            assert call(web, SECRETS["ops"], "POST", path).status_code == 200, path
        trail = call(web, SECRETS["support"], "GET", "/audit").json()["entries"]
    assert [(e["action"], e["by"], e["queue"], e.get("function"), e.get("job_id")) for e in trail] == [
        ("resume", "ops", "fast", "record", None), ("pause", "ops", "fast", "record", None),
        ("resume", "ops", "fast", None, None), ("pause", "ops", "fast", None, None),
        ("cancel", "ops", "fast", None, later)]
    log = (project.root / "operate.log").read_text()
    lines = [json.loads(ln) for ln in log.splitlines() if ln.startswith("{")]
    assert [ln["audit"] for ln in lines if ln.get("logger") == "runner.audit"] == [
        "cancel", "pause", "resume", "pause", "resume"]


def test_cli_cancel_pause_and_resume_are_on_record(project: Project) -> None:
    """`runner cancel`, `runner pause` and `runner resume` record "cli:<user>" as the
    dead-letter commands do."""
    later = project.client.enqueue("record", {"n": 1}, delay=600).id
    args = ["--config", str(project.root / "runner.toml")]
    for argv in (["cancel", later], ["pause", "fast"], ["resume", "fast"]):
        done = CliRunner().invoke(cli, [*args, *argv], env=project.env)
        assert done.exit_code == 0, (argv, done.output)
    who = f"cli:{getpass.getuser()}"
    history = project.client.get(later).as_dict()["history"]
    assert [(e["outcome"], e["by"]) for e in history] == [("cancel", who)]
    _, trail = project.client.audit()
    assert [(e["action"], e["by"]) for e in trail] == [("resume", who), ("pause", who), ("cancel", who)]


def test_every_route_the_app_serves_has_its_scope_in_the_table(project: Project) -> None:
    """A route added without a line in auth.ROUTES fails here (walking falcon's router),
    before it is ever served under the fallback scope."""
    def unscoped(app: Any) -> list[tuple[str, str]]:
        out, nodes = [], list(app._router._roots)
        while nodes:
            node = nodes.pop()
            nodes.extend(node.children)
            for method, responder in (node.method_map or {}).items():
                if getattr(responder, "__self__", None) is node.resource \
                        and auth.route_scope(method, node.uri_template) is None:
                    out.append((method, node.uri_template))
        return out

    app = create_app(project.runtime).app.app  # inside the fast lane and the size guard
    assert unscoped(app) == []
    assert len(app._router._roots) >= 8

    class Bulk:
        async def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
            pass

    app.add_route("/dead/{queue}/bulk-requeue", Bulk())
    assert unscoped(app) == [("POST", "/dead/{queue}/bulk-requeue")]


def test_the_audit_trail_is_bounded_and_newest_first(project: Project, monkeypatch: Any) -> None:
    """Past MAX_ENTRIES the oldest entries go (the log keeps every one); a client call
    without ``by`` (library code) puts nothing on record and leaves the history as it was."""
    monkeypatch.setattr(audit, "MAX_ENTRIES", 5)
    c = project.client
    *doomed, job = dead_jobs(project, 9)
    for i, doomed_id in enumerate(doomed):
        c.delete_dead("fast", doomed_id, by=f"op{i}")
    total, trail = c.audit()
    assert total == 5 and [e["by"] for e in trail] == ["op7", "op6", "op5", "op4", "op3"]
    assert all(e["action"] == "delete" and e["queue"] == "fast" and e["job_id"] in doomed for e in trail)
    history = c.get(job).as_dict()["history"]
    c.requeue("fast", job)
    assert c.get(job).as_dict()["history"] == history
    assert c.audit()[0] == 5 and c.audit()[1][0]["by"] == "op7"


def test_the_app_follows_a_reloaded_config(project: Project) -> None:
    """`runner dev` swaps runtime.config when runner.toml changes: a token added there is
    needed and works from the next request on, and the API is open again once it goes."""
    rt = project.runtime
    client = falcon.testing.TestClient(create_app(rt))
    assert client.simulate_get("/queues").status_code == 200  # no token configured: open
    assert client.simulate_get("/whoami").json == {
        "name": "anonymous", "scopes": ["emit", "enqueue", "operate", "read", "signal"], "auth": False}
    open_api = rt.config.api
    (project.root / "tokens.toml").write_text("[queues.fast]\n[queues.slow]\n" + TOKENS)
    rt.config = replace(rt.config, api=config_mod.load(project.root / "tokens.toml", env=ENV).api)
    assert client.simulate_get("/queues").status_code == 401
    ops = {"Authorization": f"Bearer {SECRETS['ops']}"}
    assert client.simulate_get("/queues", headers=ops).status_code == 200
    assert client.simulate_get("/whoami", headers=ops).json["name"] == "ops"
    rt.config = replace(rt.config, api=open_api)
    assert client.simulate_get("/queues").status_code == 200


def test_an_admitted_header_is_hashed_once_per_config(project: Project, monkeypatch: Any) -> None:
    """A producer's enqueues send the same Authorization header each time: it is hashed the
    first time only, whether the request takes the fast lane or the full route (a query
    string). A wrong token is hashed and refused every time, and a token taken out of the
    config is refused from the next request on."""
    hashed: list[bytes] = []
    identify = auth.identify

    def counted(tokens: Any, presented: bytes) -> Any:
        hashed.append(presented)
        return identify(tokens, presented)

    monkeypatch.setattr(auth, "identify", counted)
    rt = project.runtime
    (project.root / "tokens.toml").write_text("[queues.fast]\n[queues.slow]\n" + TOKENS)
    rt.config = replace(rt.config, api=config_mod.load(project.root / "tokens.toml", env=ENV).api)
    client = falcon.testing.TestClient(create_app(rt))

    def enqueue(secret: str, query: str = "") -> int:
        return client.simulate_post("/jobs/record", json={"n": 1}, query_string=query,
                                    headers={"Authorization": f"Bearer {secret}"}).status_code

    assert [enqueue(SECRETS["producer"]) for _ in range(3)] == [202, 202, 202]
    assert enqueue(SECRETS["producer"], "priority=5") == 202
    assert hashed.count(SECRETS["producer"].encode()) == 1
    # Kept per scope: the same header is no pass to a route its token lacks the scope of.
    producer = {"Authorization": f"Bearer {SECRETS['producer']}"}
    assert client.simulate_get("/queues", headers=producer).status_code == 403
    assert client.simulate_post("/jobs/other", json={}, headers=producer).status_code == 403
    assert [enqueue("a-guess") for _ in range(2)] == [401, 401]
    assert hashed.count(b"a-guess") >= 2
    without = TOKENS.replace('[api.tokens.producer]\nenv = "RUNNER_TOKEN_PRODUCER"\nscopes = ["enqueue:record"]\n', "")
    (project.root / "tokens.toml").write_text("[queues.fast]\n[queues.slow]\n" + without)
    rt.config = replace(rt.config, api=config_mod.load(project.root / "tokens.toml", env=ENV).api)
    assert enqueue(SECRETS["producer"]) == 401
