"""Every credential a Redis URL can carry stays out of what runner prints (stats, check,
the worker's start-up log, "Redis unavailable" errors), and a URL with a bad port or an
unknown option, or a setting of inf, is a clear configuration error, not a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runner import config
from runner.store import urls
from runner.store.urls import redact, scrub

from conftest import Project, wait_for

SECRET = "s3cr3t-PW"


def _run(project: Project, *args: str, url: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**project.env, **({"REDIS_URL": url} if url is not None else {})}
    return subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), *args],
                          env=env, capture_output=True, text=True, timeout=timeout)


def _said(project: Project, args: tuple[str, ...], url: str, process: bool) -> tuple[int, str]:
    """A command's exit code and what it printed, with REDIS_URL ``url``, as a process of
    its own (with a traceback, had one been printed) or in this one (where an exception
    other than the command's exit stands for the traceback a process would print). The
    URL's reading, and so its message, is the same whichever command meets it: a process
    per URL and command was most of this file's CPU, so each test runs its commands as
    processes for its first URL and the quick ones in this process for the others (a
    worker or a web server always as a process: one that came up would serve on here)."""
    if process or args[0] in ("worker", "web"):
        out = _run(project, *args, url=url)
        return out.returncode, out.stdout + out.stderr
    from click.testing import CliRunner

    from runner.cli import cli

    got = CliRunner().invoke(cli, ["--config", str(project.root / "runner.toml"), *args],
                             env={**project.env, "REDIS_URL": url})
    raised = got.exception if got.exception is not None and not isinstance(got.exception, SystemExit) else None
    return got.exit_code, got.output + (f"\nTraceback: {raised!r}" if raised is not None else "")


@pytest.mark.parametrize("url", [
    "redis://:{s}@h:1/0", "redis://user:{s}@h/0", "redis://{s}@h/0", "redis://h/0?password={s}&db=1",
    "redis+sentinel://:{s}@h1:1,h2:2/m?sentinel_password={s}&password={s}",
    "rediss+cluster://u:{s}@h1:1,h2:2", "redis://h/0?Password={s}",
    # Keys percent-encoded: redis-py decodes them, so each is its password.
    "redis://h/0?pass%77ord={s}", "redis://h/0?%70%61%73%73%77%6f%72%64={s}&db=1",
    "redis+sentinel://h1:1/m?sentinel_pass%77ord={s}",
])
def test_redact_hides_every_credential(url: str) -> None:
    shown = redact(url.format(s=SECRET))
    assert SECRET not in shown and "***" in shown, shown


@pytest.mark.parametrize("secret", ["Zq7ab,SECRETcd", "Zq7ab SECRETcd", "Zq7ab'SECRETcd", 'Zq7ab"SECRETcd',
                                    "Zq7ab)SECRETcd", "Zq7ab&SECRETcd"])
def test_scrub_hides_a_password_with_a_comma_space_or_quote_in_it(secret: str) -> None:
    """redis-py's errors repeat a connection's settings (``password=...,socket_timeout=``)
    and a URL's query: the whole value is hidden, up to the next setting, ``&`` or the end."""
    for text in (f"Error connecting: Connection(db=0,username=None,password={secret},socket_timeout=15.0,x=1)",
                 f"Connection(db=0,password={secret})",
                 f"no master at redis+sentinel://h:1/m?sentinel_password={secret}",
                 f"redis://h:1/0?sentinel_password={secret}&db=1 refused",
                 f"{{'password': {secret!r}, 'db': 0}}"):
        shown = scrub(text)
        assert "SECRET" not in shown and "***" in shown, shown
    assert scrub("Connection(db=0,password=x,socket_timeout=15.0)").endswith("socket_timeout=15.0)")


# A password holding a character a URL reserves, not percent-encoded (a base64 secret's
# "/"): the URL reads as a host "app:<start of the password>" with a bad port, and the
# rest of the password as the path, the query or a fragment.
UNENCODED = ["redis://app:Zq7/{s}@127.0.0.1:1/0", "redis://app:Zq7#{s}@127.0.0.1:1/0",
             "redis://app:Zq7?{s}@127.0.0.1:1/0", "redis://app:{s}/x#y?z@127.0.0.1:1/0",
             "rediss+cluster://app:Zq7/{s}@h1:1,h2:2", "redis://127.0.0.1:1/0?password=Zq7#{s}"]


@pytest.mark.parametrize("url", UNENCODED)
def test_a_password_not_percent_encoded_never_prints(url: str) -> None:
    """redact, scrub and the configuration error read such a URL as text: everything
    between the ``//`` and the last ``@`` is hidden, whatever it holds, and the error says
    to percent-encode the password (it said "the port of 'app:Zq7' must be a number")."""
    url = url.format(s=SECRET)
    for shown in (redact(url), scrub(f"error: {url}: refused"), urls.problem(url) or ""):
        assert SECRET not in shown and "Zq7" not in shown and "***" in shown, shown
    assert "percent-encode" in (urls.problem(url) or ""), urls.problem(url)


def test_an_at_sign_outside_the_userinfo_is_no_error() -> None:
    """A socket's path or an option's value may hold an "@": not a password's."""
    for url in ("unix:///run/redis@main.sock?db=1", "redis://127.0.0.1:6379/0?client_name=a@b"):
        assert urls.problem(url) is None, url
    assert redact("unix:///run/redis@main.sock?db=1") == "unix:///run/redis@main.sock?db=1"


@pytest.mark.parametrize("url", UNENCODED[:3])
def test_every_command_refuses_such_a_url_without_printing_it(project: Project, url: str) -> None:
    process = url == UNENCODED[0]  # (see _said)
    url = url.format(s=SECRET)
    for args in (("stats",), ("check", "--offline"), ("worker", "--queue", "fast"), ("web", "--port", "1")):
        code, text = _said(project, args, url, process)
        assert code != 0, (args, text[-2000:])
        assert SECRET not in text and "Zq7" not in text and "Traceback" not in text, (args, text[-2000:])
        assert "percent-encode" in text, (args, text[-2000:])


# A URL written without its "//": the scheme left out, or its slashes. Read as a path,
# such a URL's userinfo was quoted as a bad scheme or a bad database.
NO_SLASHES = ["app:{s}@127.0.0.1:1", "redis:app:{s}@127.0.0.1:1/0", "{s}@127.0.0.1:1", "rediss:/app:{s}@h:1/0"]


@pytest.mark.parametrize("url", NO_SLASHES)
def test_a_url_without_its_slashes_is_refused_without_its_password(url: str) -> None:
    url = url.format(s=SECRET)
    wrong = urls.problem(url) or ""
    for shown in (redact(url), wrong):
        assert SECRET not in shown, shown
    assert "as in redis://host:6379/0" in wrong, wrong


@pytest.mark.parametrize("url", NO_SLASHES[:2])
def test_every_command_refuses_a_url_without_its_slashes(project: Project, url: str) -> None:
    process = url == NO_SLASHES[0]  # (see _said)
    url = url.format(s=SECRET)
    for args in (("stats",), ("check", "--offline"), ("check",), ("check", "--json"), ("worker", "--queue", "fast")):
        code, text = _said(project, args, url, process)
        assert code != 0, (args, text[-2000:])
        assert SECRET not in text and "Traceback" not in text, (args, text[-2000:])
        assert "as in redis://host:6379/0" in text, (args, text[-2000:])


def test_redact_leaves_a_url_without_credentials_alone() -> None:
    for url in ("unix:///tmp/redis.sock?db=1", "redis://127.0.0.1:6379/0", "redis://[::1]:6379/2"):
        assert redact(url) == url


@pytest.mark.parametrize("where", ["query", "encoded", "sentinel"])
def test_query_passwords_never_print(project: Project, where: str) -> None:
    """A server that takes no password (and is no sentinel): each command fails to
    connect (Redis unavailable), and says so without the password, also one given as a
    percent-encoded key (``?pass%77ord=``, which redis-py decodes and sends)."""
    host_port = project.server.url.split("://", 1)[1].split("/", 1)[0]
    url = {"query": f"redis://{host_port}/0?password={SECRET}",
           "encoded": f"redis://{host_port}/0?pass%77ord={SECRET}",
           "sentinel": f"redis+sentinel://:{SECRET}@{host_port}/mymaster?sentinel_password={SECRET}&password={SECRET}",
           }[where]
    for args in (("stats",), ("check",)):
        code, text = _said(project, args, url, process=where == "query")
        assert code != 0, text
        assert SECRET not in text, (args, text[-2000:])
        assert "Traceback" not in text, (args, text[-2000:])
    log = project.root / "worker.log"
    worker = project.spawn_worker("fast", env={"REDIS_URL": url}, log_name=log.name)
    # A query password sent to a server that has none is named as such ("has no
    # password"); a sentinel URL at a plain server reads as Redis unavailable.
    wait_for(lambda: worker.poll() is not None or any(
        w in log.read_text() for w in ("navailable", "has no password")), timeout=30,
        what="the worker to meet the server")
    project.stop_all()
    text = log.read_text()
    assert SECRET not in text and "Traceback" not in text, text[-2000:]


MALFORMED = [
    ("redis://127.0.0.1:99999/0", "port"), ("redis://127.0.0.1:abc/0", "port"),
    ("redis://127.0.0.1:1/0?bogus=1", "unknown option"),
    ("redis://127.0.0.1:1/0?socket_timeout=abc", "socket_timeout"),
    ("redis://127.0.0.1:1/0?health_check_interval=-1", "health_check_interval"),
    ("redis://127.0.0.1:1/x", "database"), ("redis://127.0.0.1:1/0?db=x", "db"),
    ("redis://127.0.0.1:1/0?max_connections=0", "max_connections"),
    ("redis://127.0.0.1:1/0?retry_on_timeout=maybe", "retry_on_timeout"),
    ("redis://127.0.0.1:1/0?protocol=9", "protocol"),
    ("redis://127.0.0.1:1/0?ssl_cert_reqs=none", "rediss://"),
    ("rediss://127.0.0.1:1/0?ssl_cert_reqs=bogus", "ssl_cert_reqs"),
    # Past their bound (an OverflowError or ValueError in redis-py), or an option only
    # redis-py's blocking pool takes (its TypeError).
    ("redis://127.0.0.1:1/0?socket_timeout=1e308", "socket_timeout='1e308' must be seconds (a number from 0"),
    ("redis://127.0.0.1:1/0?socket_connect_timeout=1e308", "socket_connect_timeout='1e308' must be"),
    ("redis://127.0.0.1:1/0?health_check_interval=1e308", "health_check_interval='1e308' must be whole"),
    ("redis://127.0.0.1:1/0?health_check_interval=1.5", "health_check_interval='1.5' must be whole"),
    ("redis://127.0.0.1:1/0?timeout=5", "unknown option(s) timeout"),
]


@pytest.mark.parametrize("url,needle", MALFORMED)
def test_a_malformed_redis_url_is_a_clear_error(project: Project, url: str, needle: str) -> None:
    process = url == MALFORMED[0][0]  # (see _said)
    for args in (("check",), ("stats",), ("worker", "--queue", "fast")):
        code, text = _said(project, args, url, process)
        assert code != 0, text
        assert needle in text and "Traceback" not in text, (args, text[-2000:])


@pytest.mark.parametrize("old,new", [
    ("visibility_timeout = 2\n", "visibility_timeout = inf\n"), ("done = 3600", "done = inf"),
    ("visibility_timeout = 2\n", "visibility_timeout = nan\n"), ("grace_period = 5", "grace_period = inf"),
])
def test_inf_and_nan_settings_are_refused_at_check(project: Project, old: str, new: str) -> None:
    path = project.root / "runner.toml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    for args in (("check",), ("worker", "--queue", "fast")):
        out = _run(project, *args)
        text = out.stdout + out.stderr
        assert out.returncode != 0 and "Traceback" not in text, text[-2000:]
        assert "must be" in text, text[-2000:]


@pytest.mark.parametrize("old,new,option", [
    ("visibility_timeout = 2\n", "visibility_timeout = 1e308\n", "queues.fast.visibility_timeout"),
    ("done = 3600", "done = 1e308", "retention.done"),
    ("max_timeout = 600", "max_timeout = 1e308", "queues.slow.max_timeout"),
    ("grace_period = 5", "grace_period = 1e308", "worker.grace_period"),
])
def test_a_huge_finite_setting_is_refused_at_check_naming_its_largest_value(
        project: Project, old: str, new: str, option: str) -> None:
    """1e308 is finite, and a worker turning it into milliseconds overflowed at start:
    every duration is bounded at load, and the error names the option and its largest value."""
    path = project.root / "runner.toml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    for args in (("check",), ("worker", "--queue", "fast")):
        out = _run(project, *args)
        text = out.stdout + out.stderr
        assert out.returncode != 0 and "Traceback" not in text and "OverflowError" not in text, text[-2000:]
        assert option in text and f"at most {config.MAX_SECONDS:,}" in text, text[-2000:]


def test_a_huge_grace_period_from_the_environment_is_refused(project: Project) -> None:
    env = {**project.env, "RUNNER_GRACE_PERIOD": "1e308"}
    out = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), "check"],
                         env=env, capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "Traceback" not in text, text[-2000:]
    assert "RUNNER_GRACE_PERIOD" in text and f"at most {config.MAX_SECONDS:,}" in text, text[-2000:]


def test_a_cluster_with_no_node_up_is_an_outage_not_a_traceback(project: Project) -> None:
    """The cluster client reads the layout as it is made: with no node answering, stats
    and jobs ended with redis-py's traceback (exit 1) and the worker exited. Now as a
    single server: exit 3 with advice, and the worker waits for Redis."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # (closed: nothing listens there)
    url = f"redis+cluster://127.0.0.1:{port}"
    for args in (("stats",), ("jobs",)):
        out = _run(project, *args, url=url)
        text = out.stdout + out.stderr
        assert out.returncode == 3 and "Traceback" not in text, (args, out.returncode, text[-2000:])
        assert "Redis unavailable" in text, text[-2000:]
    log = project.root / "worker.log"
    worker = project.spawn_worker("fast", env={"REDIS_URL": url}, log_name=log.name)
    wait_for(lambda: worker.poll() is not None or log.read_text().count("retrying in") >= 2, timeout=30,
             what="the worker to retry")
    assert worker.poll() is None, log.read_text()[-2000:]
    project.stop_all()
    assert "Traceback" not in log.read_text(), log.read_text()[-2000:]


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0?password=Zq7&{s}", "redis://127.0.0.1:1/0?password=Zq7&{s}=x",
                                 "redis+sentinel://127.0.0.1:1/m?sentinel_password=Zq7&{s}",
                                 "redis://127.0.0.1:1/0?my_token={s}"])
def test_the_rest_of_a_query_password_after_an_ampersand_never_prints(url: str) -> None:
    """An unencoded "&" in a query password made its rest an unknown option's name, shown
    in the redacted URL and in "unknown option(s)"; an unknown option named for a secret
    showed its value."""
    url = url.format(s=SECRET)
    for shown in (redact(url), urls.problem(url) or ""):
        assert SECRET not in shown and "Zq7" not in shown, shown
    assert "unknown option" in (urls.problem(url) or "")
