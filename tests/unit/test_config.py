"""runner.toml + environment -> Config; every error names the file, the key and what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner import config
from runner.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "runner.toml"
    p.write_text(text)
    return p


def test_shipped_config_loads(tmp_path: Path) -> None:
    cfg = config.load(Path(__file__).parents[2] / "runner.toml", env={})
    assert set(cfg.queues) == {"fast", "slow"}
    assert cfg.queues["fast"].visibility_timeout_s == 30
    assert cfg.queues["slow"].visibility_timeout_s == 900
    assert cfg.queues["fast"].backoff.jitter == "full"
    assert cfg.retention.done_s == 86400 and cfg.retention.dead_s == 604800
    assert cfg.worker.grace_period_s < 30


def test_env_overrides(tmp_path: Path) -> None:
    p = write(tmp_path, '[redis]\nurl = "redis://a:1/0"\n[queues.q]\n')
    cfg = config.load(p, env={"REDIS_URL": "rediss://u:pw@h:2/0", "RUNNER_API_TOKEN": "t",
                              "RUNNER_REDIS_TLS_VERIFY": "false", "RUNNER_LOG_LEVEL": "debug"})
    assert cfg.redis.url == "rediss://u:pw@h:2/0" and cfg.redis.configured
    assert cfg.api.token == "t" and cfg.redis.tls_verify is False
    assert cfg.log.level == "DEBUG"


@pytest.mark.parametrize("text,needle", [
    ("[queues.fast]\nvisibilty_timeout = 3\n", "unknown key queues.fast.visibilty_timeout"),
    ("[queues.fast]\nconcurrency = \"8\"\n", "queues.fast.concurrency must be a positive integer"),
    ("[queues.fast]\nbackoff = { base = 1, jitter = \"weird\" }\n", "queues.fast.backoff.jitter must be one of"),
    ("[redis]\nprefix = \"a{b}\"\n", "redis.prefix must be a string without braces"),
    ("[bogus]\nx = 1\n", "unknown section [bogus]"),
    ("[queues]\n", "must define at least one queue"),
    ("[queues.fast]\nvisibility_timeout = 0.5\n", "visibility_timeout must be a number of seconds >= 1"),
    ("[api]\nmax_body_bytes = -1\n", "api.max_body_bytes must be a positive integer"),
    ("[queues.fast\n", "not valid TOML"),
    ("[worker]\ncpu_affinity = \"on\"\n", 'worker.cpu_affinity must be "auto"'),
    ("[queues.q]\n[worker]\nmax_result_bytes = 0\n", "worker.max_result_bytes must be a positive integer"),
    ("[queues.q]\n[worker]\nmax_result_bytes = \"1MB\"\n", "worker.max_result_bytes must be a positive integer"),
])
def test_bad_config_names_file_and_key(tmp_path: Path, text: str, needle: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        config.load(p, env={})
    assert str(p) in str(err.value)
    assert needle in str(err.value)


@pytest.mark.parametrize("text,needle", [
    ("[queues.fast]\nconcurrency = 100000000\n",
     "queues.fast.concurrency must be a positive integer, at most 1,000, got 100000000"),
    ("[queues.fast]\nconcurrency = 1001\n", "queues.fast.concurrency must be a positive integer, at most 1,000"),
    ("[queues.fast]\nmax_attempts = 10000000000\n",
     "queues.fast.max_attempts must be a positive integer, at most 1,000,000,000"),
    ("[queues.fast]\nmax_jobs_per_child = 10000000000\n",
     "queues.fast.max_jobs_per_child must be a positive integer, at most 1,000,000,000"),
    ("[queues.fast]\n[retention]\ndone_max = 10000000000\n",
     "retention.done_max must be a positive integer, at most 1,000,000,000"),
])
def test_every_count_is_capped_at_load_naming_its_largest_value(tmp_path: Path, text: str, needle: str) -> None:
    """A count past its cap is an error at load (so `runner check` says it), naming the
    option and its largest value: concurrency = 100000000 passed, then the worker built
    its executors' slots for it, held 2.3 GB and ran nothing."""
    with pytest.raises(ConfigError) as err:
        config.load(write(tmp_path, text), env={})
    assert needle in str(err.value), err.value
    cfg = config.load(write(tmp_path, "[queues.fast]\nconcurrency = 1000\nmax_attempts = 1000000000\n"), env={})
    assert (cfg.queues["fast"].concurrency, cfg.queues["fast"].max_attempts) == (1000, 1_000_000_000)


def test_a_result_is_bounded_by_a_mebibyte_unless_raised(tmp_path: Path) -> None:
    assert config.load(write(tmp_path, "[queues.q]\n"), env={}).worker.max_result_bytes == 1_048_576
    p = write(tmp_path, "[queues.q]\n[worker]\nmax_result_bytes = 8_000_000\n")
    assert config.load(p, env={}).worker.max_result_bytes == 8_000_000


def test_bad_env_is_named(tmp_path: Path) -> None:
    p = write(tmp_path, "[queues.q]\n")
    with pytest.raises(ConfigError, match="RUNNER_REDIS_TLS_VERIFY"):
        config.load(p, env={"RUNNER_REDIS_TLS_VERIFY": "maybe"})
    with pytest.raises(ConfigError, match="RUNNER_GRACE_PERIOD"):
        config.load(p, env={"RUNNER_GRACE_PERIOD": "soon"})
    with pytest.raises(ConfigError, match="RUNNER_CPU_AFFINITY"):
        config.load(p, env={"RUNNER_CPU_AFFINITY": "yes"})


def test_cpu_affinity_is_on_by_default_and_the_environment_wins(tmp_path: Path) -> None:
    assert config.load(write(tmp_path, "[queues.q]\n"), env={}).worker.cpu_affinity == "auto"
    p = write(tmp_path, "[queues.q]\n[worker]\ncpu_affinity = \"off\"\n")
    assert config.load(p, env={}).worker.cpu_affinity == "off"
    assert config.load(p, env={"RUNNER_CPU_AFFINITY": "auto"}).worker.cpu_affinity == "auto"


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        config.load(tmp_path / "nope.toml", env={})


def test_wait_replicas_from_the_file_and_the_environment(tmp_path: Path) -> None:
    """[redis] wait_replicas and wait_timeout (seconds); the environment wins; 0 (no WAIT)
    is the default; a timeout of 0 (WAIT for ever) and a count out of range are refused."""
    assert config.load(write(tmp_path, "[queues.q]\n"), env={}).redis.wait_replicas == 0
    p = write(tmp_path, "[redis]\nwait_replicas = 1\nwait_timeout = 0.5\n[queues.q]\n")
    cfg = config.load(p, env={})
    assert (cfg.redis.wait_replicas, cfg.redis.wait_timeout_s) == (1, 0.5)
    cfg = config.load(p, env={"RUNNER_REDIS_WAIT_REPLICAS": "2", "RUNNER_REDIS_WAIT_TIMEOUT": "2.5"})
    assert (cfg.redis.wait_replicas, cfg.redis.wait_timeout_s) == (2, 2.5)
    for text, needle in [("wait_timeout = 0", "redis.wait_timeout must be"),
                         ("wait_replicas = -1", "redis.wait_replicas must be"),
                         ("wait_replicas = true", "redis.wait_replicas must be")]:
        bad = tmp_path / "bad"
        bad.mkdir(exist_ok=True)
        with pytest.raises(ConfigError, match=needle):
            config.load(write(bad, f"[redis]\n{text}\n[queues.q]\n"), env={})
    with pytest.raises(ConfigError, match="RUNNER_REDIS_WAIT_REPLICAS"):
        config.load(p, env={"RUNNER_REDIS_WAIT_REPLICAS": "one"})
    with pytest.raises(ConfigError, match="RUNNER_REDIS_WAIT_TIMEOUT"):
        config.load(p, env={"RUNNER_REDIS_WAIT_TIMEOUT": "0"})


def test_an_unchosen_url_follows_a_running_dev_and_a_chosen_one_does_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one rule of the CLI's client commands, Client.from_config() and the framework
    integrations' shared client: a running `runner dev`'s embedded server serves the
    project unless REDIS_URL or a file named by the caller says which server."""
    import json
    import os

    from runner.contrib.shared import close_all, shared_client
    from runner.store.session import follow_dev

    dev_url = "redis://127.0.0.1:1/0"
    (tmp_path / ".runner").mkdir()
    (tmp_path / ".runner" / "dev.json").write_text(json.dumps({"url": dev_url, "pid": os.getpid()}))
    bare = write(tmp_path, "[queues.q]\n")
    assert follow_dev(config.load(bare, env={}), config_named=False).redis.url == dev_url
    assert follow_dev(config.load(bare, env={}), config_named=True).redis.url == dev_url
    env = {"REDIS_URL": "redis://elsewhere:6379/0"}
    assert follow_dev(config.load(bare, env=env), config_named=False).redis.url == env["REDIS_URL"]
    named = write(tmp_path, '[redis]\nurl = "redis://named:6379/0"\n[queues.q]\n')
    assert follow_dev(config.load(named, env={}), config_named=True).redis.url == "redis://named:6379/0"
    # ./runner.toml's own url, not named, gives way to dev, as the CLI's commands do.
    assert follow_dev(config.load(named, env={}), config_named=False).redis.url == dev_url

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("RUNNER_CONFIG", raising=False)
    (tmp_path / "runner.toml").write_text("[queues.q]\n")
    try:
        assert shared_client().runtime.config.redis.url == dev_url
        assert shared_client(env={"REDIS_URL": env["REDIS_URL"]}).runtime.config.redis.url == env["REDIS_URL"]
    finally:
        close_all()
    (tmp_path / ".runner" / "dev.json").write_text(json.dumps({"url": dev_url, "pid": 2**22 + 1}))
    assert follow_dev(config.load(bare, env={}), config_named=False).redis.url == "redis://127.0.0.1:6379/0"


def test_a_subfolder_finds_the_projects_runner_toml_up_to_its_repository(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from a subfolder, the nearest runner.toml above is the project's (its folders
    are its own, not the subfolder's); the search stops at the repository's root, so a
    runner.toml outside the repository is never picked up."""
    outside = tmp_path / "runner.toml"
    outside.write_text('[functions]\ndir = "not-this-one"\n')
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    deep = repo / "app" / "functions" / "more"
    deep.mkdir(parents=True)
    (repo / "app" / "runner.toml").write_text('[functions]\ndir = "functions"\n')
    monkeypatch.chdir(deep)
    assert config.find() == repo / "app" / "runner.toml"
    cfg = config.load(env={})
    assert cfg.root == repo / "app" and cfg.functions_dir == repo / "app" / "functions"
    assert config.load(env={"RUNNER_CONFIG": str(outside)}).root == tmp_path  # a named file wins
    (repo / "app" / "runner.toml").unlink()
    monkeypatch.chdir(deep)
    assert config.find() == Path("runner.toml")  # none in the repository: the defaults, here
    assert config.load(env={}).functions_dir == deep / "functions"
    monkeypatch.chdir(repo / "app")
    (repo / "app" / "runner.toml").write_text("")
    assert config.find() == Path("runner.toml")  # here: the relative name, as before
