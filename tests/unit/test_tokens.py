"""API tokens without a server: [api.tokens.NAME] in runner.toml (every error names the
token and the key), the scope every route needs (auth.ROUTES), and the comparison that
looks at every token whichever one matches."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any

import pytest

from runner import config
from runner.errors import ConfigError
from runner.web import auth

OPS_HASH = hashlib.sha256(b"ops-secret").hexdigest()


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> config.Config:
    p = tmp_path / "runner.toml"
    p.write_text("[queues.fast]\n" + text)
    return config.load(p, env=env or {})


def test_tokens_come_from_a_variable_or_a_hash_and_runner_api_token_is_default(tmp_path: Path) -> None:
    """Only digests are kept; RUNNER_API_TOKEN is one more token, "default", with every
    scope; a token whose variable is not set is kept, marked unset, and named."""
    cfg = load(tmp_path, f"""
[api.tokens.producer]
env = "RUNNER_TOKEN_PRODUCER"
scopes = ["enqueue:send_email"]
[api.tokens.ops]
hash = "sha256:{OPS_HASH.upper()}"
scopes = ["read", "operate"]
[api.tokens.later]
env = "RUNNER_TOKEN_LATER"
scopes = ["read"]
""", env={"RUNNER_TOKEN_PRODUCER": "p-secret", "RUNNER_API_TOKEN": "main-secret"})
    tokens = {t.name: t for t in cfg.api.tokens}
    assert set(tokens) == {"producer", "ops", "later", "default"}
    assert tokens["producer"].digest == hashlib.sha256(b"p-secret").digest()
    assert tokens["producer"].scopes == {"enqueue:send_email"}
    assert tokens["ops"].digest == hashlib.sha256(b"ops-secret").digest() and tokens["ops"].env is None
    assert tokens["default"].scopes == set(config.SCOPES)
    assert tokens["later"].digest is None and cfg.api.unset() == [tokens["later"]]
    assert config.unset_secrets(cfg) == [
        f"{tmp_path / 'runner.toml'}: api.tokens.later.env: the variable RUNNER_TOKEN_LATER is not set; "
        "set it to the token, or remove the table"]
    assert cfg.api.secured
    assert "main-secret" not in repr(cfg) and "p-secret" not in repr(cfg)
    assert not load(tmp_path, "").api.secured
    assert not load(tmp_path, "[api]\nauth = false\n", env={"RUNNER_API_TOKEN": "t"}).api.secured


@pytest.mark.parametrize("text,env,needle", [
    ('[api.tokens.ci]\nenv = "X"\nscopes = ["reed"]\n', {}, "api.tokens.ci.scopes: unknown scope 'reed'"),
    ('[api.tokens.ci]\nenv = "X"\nscopes = ["enqueue:not a name"]\n', {}, "api.tokens.ci.scopes: unknown scope"),
    ('[api.tokens.ci]\nenv = "X"\nscopes = []\n', {}, "api.tokens.ci.scopes must be a non-empty list"),
    ('[api.tokens.ci]\nenv = "X"\n', {}, "api.tokens.ci.scopes is missing"),
    ('[api.tokens.ci]\nscopes = ["read"]\n', {}, "api.tokens.ci needs exactly one of env"),
    (f'[api.tokens.ci]\nenv = "X"\nhash = "sha256:{OPS_HASH}"\nscopes = ["read"]\n', {},
     "api.tokens.ci needs exactly one of env"),
    ('[api.tokens.ci]\nhash = "md5:abc"\nscopes = ["read"]\n', {}, 'api.tokens.ci.hash must be "sha256:<64'),
    ('[api.tokens.ci]\nenv = "X"\nscope = ["read"]\n', {}, "unknown key api.tokens.ci.scope"),
    ('[api.tokens."a b"]\nenv = "X"\nscopes = ["read"]\n', {}, "token name 'a b' must be"),
    ('[api]\ntokens = 3\n', {}, "api.tokens must be tables"),
    ('[api.tokens.default]\nenv = "X"\nscopes = ["read"]\n', {"RUNNER_API_TOKEN": "t"},
     "the name 'default' is RUNNER_API_TOKEN's"),
    ('[api.tokens.a]\nenv = "A"\nscopes = ["read"]\n[api.tokens.b]\nenv = "B"\nscopes = ["read"]\n',
     {"A": "same", "B": "same"}, "api.tokens.b has the same secret as api.tokens.a"),
])
def test_a_bad_token_table_names_the_file_the_token_and_the_key(tmp_path: Path, text: str, env: dict[str, str],
                                                                  needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, text, env)
    assert str(tmp_path / "runner.toml") in str(err.value)
    assert needle in str(err.value)


@pytest.mark.parametrize("method,path,scope", [
    ("POST", "/jobs/send_email", "enqueue:send_email"),
    ("POST", "/jobs/send_email/batch", "enqueue:send_email"),
    ("GET", "/jobs/0123abcd", "read"),
    ("GET", "/dead/fast", "read"),
    ("GET", "/audit", "read"),
    ("GET", "/metrics", "read"),
    ("POST", "/dead/fast/0123/requeue", "operate"),
    ("DELETE", "/dead/fast/0123", "operate"),
    ("GET", "/healthz", auth.PUBLIC),
    ("GET", "/", auth.PUBLIC),
    ("GET", "/static/app.js", auth.PUBLIC),
    ("GET", "/whoami", auth.SIGNED_IN),
    # The next round's routes have their scopes before they are served.
    ("DELETE", "/jobs/0123", "operate"),
    ("POST", "/queues/fast/pause", "operate"),
    ("POST", "/functions/send_email/resume", "operate"),
    ("GET", "/jobs", "read"),
    ("GET", "/schedules", "read"),
    ("POST", "/groups", "enqueue"),
])
def test_every_route_maps_to_one_scope(method: str, path: str, scope: str) -> None:
    assert auth.lookup(method, path) == (scope, True)


def test_a_path_that_is_no_route_needs_read_to_get_and_operate_for_the_rest() -> None:
    """So a scoped token learns nothing of which paths exist, and an unlisted route could
    never be more open than operate."""
    assert auth.lookup("GET", "/no/such/path") == ("read", False)
    assert auth.lookup("POST", "/no/such/path") == ("operate", False)
    assert auth.lookup("PUT", "/jobs/send_email") == ("operate", False)
    assert auth.lookup("GET", "/jobs/") == ("read", False)  # an empty segment is no job id
    assert auth.lookup("POST", "/jobs/") == ("operate", False)


def test_templates_resolve_by_their_shape_whatever_their_field_names() -> None:
    assert auth.route_scope("DELETE", "/dead/{queue}/{job_id}") == "operate"
    assert auth.route_scope("DELETE", "/jobs/{name}") == "operate"
    assert auth.route_scope("POST", "/jobs/{name}") == "enqueue"
    assert auth.route_scope("GET", "/static/{name}") == auth.PUBLIC
    assert auth.route_scope("PATCH", "/dead/{queue}") is None


def test_enqueue_covers_every_function_and_enqueue_type_one() -> None:
    one = config.ApiToken("p", frozenset({"enqueue:send_email"}), None)
    anyfn = config.ApiToken("q", frozenset({"enqueue"}), None)
    assert auth.allows(one, "enqueue:send_email") and not auth.allows(one, "enqueue:other")
    assert auth.allows(anyfn, "enqueue:other") and auth.allows(anyfn, "enqueue")
    assert not auth.allows(one, "enqueue") and not auth.allows(anyfn, "read")
    assert auth.allows(one, auth.SIGNED_IN) and auth.allows(one, auth.PUBLIC)


def test_identify_compares_every_token_whichever_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    """No early exit: a match on the first token, the last or none costs one
    compare_digest per configured token, each over two SHA-256 digests."""
    tokens = [(config.ApiToken(f"t{i}", frozenset({"read"}), None), config.digest(f"secret-{i}")) for i in range(50)]
    seen: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def counting(a: Any, b: Any) -> bool:
        seen.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    for secret, name in ((b"secret-0", "t0"), (b"secret-49", "t49"), (b"nope", None)):
        seen.clear()
        found = auth.identify(tokens, secret)
        assert (found.name if found else None) == name
        assert seen == [(32, 32)] * 50


@pytest.mark.parametrize("args", [
    ["opé", "--scope", "read"], ["a.b", "--scope", "read"], ["a b", "--scope", "read"],
    ["ok", "--scope", "read", "--env", "A\\B"], ["ok", "--scope", "read", "--env", "A B"],
    ["ok", "--scope", "read", "--env", "1ABC"], ["ok", "--scope", "read", "--env", "AÉ"],
    ["ok", "--scope", "enqueue:op\"é"],
])
def test_token_new_refuses_what_would_print_invalid_toml(args: list[str]) -> None:
    from click.testing import CliRunner

    from runner.cli import cli

    out = CliRunner().invoke(cli, ["token", "new", *args])
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output


@pytest.mark.parametrize("args", [
    ["producer-1", "--scope", "read,enqueue:send_email"], ["ops_2", "--scope", "operate", "--env", "RUNNER_TOKEN_OPS"],
])
def test_token_new_prints_lines_that_load(tmp_path: Path, args: list[str]) -> None:
    import tomllib

    from click.testing import CliRunner

    from runner.cli import cli

    out = CliRunner().invoke(cli, ["token", "new", *args, "--json"])
    assert out.exit_code == 0, out.output
    import json

    body = json.loads(out.output)
    tomllib.loads(body["toml"])
    (tmp_path / "runner.toml").write_text(body["toml"])
    cfg = config.load(tmp_path / "runner.toml", env={"RUNNER_TOKEN_OPS": body["token"]})
    assert any(t.name == args[0] for t in cfg.api.tokens)


def test_a_short_token_is_named_by_runner_check(tmp_path: Path) -> None:
    """A token shorter than config.MIN_SECRET_CHARS (16) is guessable: RUNNER_API_TOKEN=a
    gave every scope with no word from `runner web` or `runner check`. Each short one is
    named (never its secret), with how to make a good one, as a warning of `runner
    check` (the web app logs the same lines at start); a token given by its hash cannot
    be measured and is not named, nor is one of 16 characters or more."""
    from runner.catalog.checks import token_problems
    from runner.catalog.registry import Registry

    cfg = load(tmp_path, """
[api.tokens.ci]
env = "RUNNER_TOKEN_CI"
scopes = ["read"]
[api.tokens.long]
env = "RUNNER_TOKEN_LONG"
scopes = ["read"]
[api.tokens.ops]
hash = "sha256:{OPS_HASH}"
scopes = ["read"]
""".replace("{OPS_HASH}", OPS_HASH), env={"RUNNER_API_TOKEN": "a", "RUNNER_TOKEN_CI": " shortish-secret\n",
                     "RUNNER_TOKEN_LONG": "x" * 16})
    lines = config.short_secrets(cfg)
    assert len(lines) == 2, lines
    assert any("RUNNER_API_TOKEN is 1 character(s)" in line for line in lines), lines
    assert any("api.tokens.ci (RUNNER_TOKEN_CI) is 15 character(s)" in line for line in lines), lines
    assert all("runner token new" in line and "at least 16" in line for line in lines)
    assert not any("shortish" in line for line in lines)
    problems = [p for p in token_problems(cfg, Registry()) if "at least 16" in p.message]
    assert [p.severity for p in problems] == ["warning", "warning"]
    assert config.short_secrets(load(tmp_path, "", env={"RUNNER_API_TOKEN": "y" * 16})) == []
