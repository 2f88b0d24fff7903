"""`runner token new NAME --scope S ...`: a fresh random API token, printed once, and the
``[api.tokens.NAME]`` lines for runner.toml, which hold its SHA-256 and never the token
(so the file can be committed). With ``--env VAR`` the lines name the variable instead."""

from __future__ import annotations

import re

import click

from runner import config as config_mod
from runner.cli.root import cli, emit

# 32 random bytes; the prefix lets secret scanners and people tell what a leaked string is.
PREFIX = "runner_"
# What the printed lines can hold as they are: a TOML bare key (ASCII letters, digits, -
# and _), and a portable environment variable's name.
_NAME = re.compile(r"[A-Za-z0-9_-]+")
_ENV_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def toml_lines(name: str, scopes: list[str], hex_digest: str | None, env_var: str | None) -> list[str]:
    secret = f'env = "{env_var}"' if env_var else f'hash = "sha256:{hex_digest}"'
    return [f"[api.tokens.{name}]", secret, "scopes = [" + ", ".join(f'"{s}"' for s in scopes) + "]"]


def _check_types(types: list[str]) -> None:
    """In a project (its functions folder there), an ``enqueue:<type>`` scope of a type no
    function defines is refused, with a did-you-mean: that token could never enqueue.
    Outside one (a token made on an operator's machine), the scope's shape is all there is
    to check. A type whose file is broken now is let through with a warning."""
    if not types:
        return
    from runner.catalog import registry
    from runner.errors import ConfigError, UnknownFunction

    ctx = click.get_current_context()
    try:
        cfg = config_mod.load(ctx.find_root().params.get("config_path"))
    except ConfigError:
        return
    if not cfg.functions_dir.is_dir():
        return
    reg = registry.load(cfg)
    for type_ in types:
        try:
            reg.get(type_)
        except UnknownFunction as exc:
            if exc.broken:
                click.secho(f"warning: --scope enqueue:{type_}: {exc}", fg="yellow", err=True)
                continue
            raise click.UsageError(f"--scope enqueue:{type_}: {exc}") from None


@cli.group()
def token() -> None:
    """API tokens: `runner token new`."""


@token.command("new")
@click.argument("name")
@click.option("--scope", "scope_args", multiple=True, required=True, metavar="SCOPE",
              help="enqueue, enqueue:<type>, read or operate; repeat it or separate by commas.")
@click.option("--env", "env_var", default=None, metavar="VAR",
              help="Keep the token in this environment variable instead of a hash in runner.toml.")
@click.option("--json", "as_json", is_flag=True)
def token_new(name: str, scope_args: tuple[str, ...], env_var: str | None, as_json: bool) -> None:
    """Print a new random token (once: it is not stored anywhere) and the runner.toml lines
    that let it in. Rotate a token by adding a new one, deploying, then removing the old."""
    if not _NAME.fullmatch(name):
        raise click.UsageError(f"token name {name!r} must be ASCII letters, digits, - or _ (a TOML bare key)")
    if name == config_mod.DEFAULT_TOKEN:
        raise click.UsageError(f"the name {name!r} is RUNNER_API_TOKEN's (the token with every scope); "
                               "pick another name for this one")
    scopes = list(dict.fromkeys(s.strip() for arg in scope_args for s in arg.split(",") if s.strip()))
    for scope in scopes:
        why = config_mod.scope_error(scope)
        if why:
            raise click.UsageError(why)
    _check_types([s.removeprefix("enqueue:") for s in scopes if s.startswith("enqueue:")])
    if env_var is not None and not _ENV_VAR.fullmatch(env_var):
        raise click.UsageError(f"--env {env_var!r} is not an environment variable's name (ASCII letters, "
                               "digits and _, not starting with a digit)")
    import secrets

    secret = PREFIX + secrets.token_urlsafe(32)
    hex_digest = config_mod.digest(secret).hex()
    lines = toml_lines(name, scopes, None if env_var else hex_digest, env_var)
    if as_json:
        emit({"name": name, "token": secret, "scopes": scopes, "hash": f"sha256:{hex_digest}",
              "env": env_var, "toml": "\n".join(lines) + "\n"}, True)
        return
    where = (f"set {env_var} to it where `runner web` and `runner check` run" if env_var
             else "keep it in your secret store")
    click.echo(f"# the token {name!r}, shown once ({where}):\n\n{secret}\n\n"
               "# add these lines to runner.toml and deploy:\n\n" + "\n".join(lines))
