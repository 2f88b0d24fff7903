"""Every setting of runner.toml lands in its field, the environment wins where it may,
each environment refusal reads word for word, and a config with two faults gets the
first in the order the sections are read: [sections], queues, redis, api, log, worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner import config
from runner.config import (
    ApiConfig,
    ApiToken,
    Backoff,
    LogConfig,
    QueueConfig,
    RedisConfig,
    Retention,
    WorkerConfig,
)
from runner.errors import ConfigError

HASH = "sha256:" + "ab" * 32
FULL = f"""
[redis]
url = "redis://h:1/2"
prefix = "app"
tls_verify = false
ca_cert = "ca.pem"
wait_replicas = 2
wait_timeout = 0.5

[queues.fast]
visibility_timeout = 20
concurrency = 4
max_attempts = 9
backoff = {{ base = 2.0, cap = 20.0, jitter = "equal" }}
max_timeout = 100
batch = 10
prefetch = 3
isolation = "process"
max_jobs_per_child = 50
max_rss_mb = 256
partitions = 4

[queues.slow]
concurrency = 2

[api]
max_body_bytes = 2048
max_wait = 12
auth = false
header_timeout = 5
idle_timeout = 6
body_timeout = 7
max_connections = 99

[api.tokens.ops]
hash = "{HASH}"
scopes = ["read", "operate"]

[api.tokens.ci]
env = "CI_TOKEN"
scopes = ["enqueue:hello"]

[retention]
done = 60
done_max = 1000
done_payload = true
dead = 120
idempotency = 30

[worker]
grace_period = 3
scheduler_interval = 0.25
unknown_grace = 10
timeout_grace = 2
cpu_affinity = "off"
max_result_bytes = 4096

[log]
level = "WARNING"
format = "text"

[functions]
dir = "fns"
schemas = "sch"
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "runner.toml"
    p.write_text(text)
    return p


def test_every_setting_of_the_file_lands_in_its_field(tmp_path: Path) -> None:
    p = write(tmp_path, FULL)
    cfg = config.load(p, env={"CI_TOKEN": " s3cret\n"})
    assert cfg == config.Config(
        root=tmp_path, source=str(p),
        redis=RedisConfig(url="redis://h:1/2", prefix="app", tls_verify=False, ca_cert="ca.pem", configured=True,
                          url_source="file", wait_replicas=2, wait_timeout_s=0.5),
        queues={"fast": QueueConfig("fast", 20.0, 4, 9, Backoff(2.0, 20.0, "equal"), 100.0, 10, 3, "process", 50,
                                    256.0, 4),
                "slow": QueueConfig("slow", 30.0, 2, 5, Backoff(), 300.0, 64, 2, "thread", 20000, 1024.0, 1)},
        api=ApiConfig(max_body_bytes=2048, max_wait_s=12.0, header_timeout_s=5.0, idle_timeout_s=6.0,
                      body_timeout_s=7.0, max_connections=99, token=None, auth=False,
                      tokens=(ApiToken("ops", frozenset({"read", "operate"}), bytes.fromhex("ab" * 32)),
                              ApiToken("ci", frozenset({"enqueue:hello"}), config.digest("s3cret"), env="CI_TOKEN",
                                       chars=6))),
        retention=Retention(done_s=60.0, done_max=1000, done_payload=True, dead_s=120.0, idempotency_s=30.0),
        worker=WorkerConfig(grace_period_s=3.0, scheduler_interval_s=0.25, unknown_grace_s=10.0, timeout_grace_s=2.0,
                            cpu_affinity="off", max_result_bytes=4096),
        log=LogConfig(level="WARNING", format="text"),
        functions_dir=tmp_path / "fns", schemas_dir=tmp_path / "sch",
    )


def test_the_environment_wins(tmp_path: Path) -> None:
    env = {"REDIS_URL": "redis://e:3/0", "RUNNER_REDIS_PREFIX": "env", "RUNNER_REDIS_TLS_VERIFY": "yes",
           "RUNNER_REDIS_CA_CERT": "env.pem", "RUNNER_REDIS_WAIT_REPLICAS": "0", "RUNNER_REDIS_WAIT_TIMEOUT": "2",
           "RUNNER_API_TOKEN": "tok", "RUNNER_API_AUTH": "on", "RUNNER_LOG_LEVEL": "error",
           "RUNNER_LOG_FORMAT": "json", "RUNNER_GRACE_PERIOD": "8", "RUNNER_CPU_AFFINITY": "auto",
           "RUNNER_FUNCTIONS_DIR": "f2", "RUNNER_SCHEMAS_DIR": "s2", "CI_TOKEN": "other"}
    cfg = config.load(write(tmp_path, FULL), env=env)
    assert cfg.redis == RedisConfig(url="redis://e:3/0", prefix="env", tls_verify=True, ca_cert="env.pem",
                                    configured=True, url_source="REDIS_URL", wait_replicas=0, wait_timeout_s=2.0)
    assert cfg.api.token == "tok" and cfg.api.auth is True
    assert [t.name for t in cfg.api.tokens] == ["ops", "ci", "default"]
    assert cfg.log == LogConfig("ERROR", "json")
    assert (cfg.worker.grace_period_s, cfg.worker.cpu_affinity) == (8.0, "auto")
    assert (cfg.functions_dir, cfg.schemas_dir) == (tmp_path / "f2", tmp_path / "s2")


def test_nothing_set_is_the_defaults(tmp_path: Path) -> None:
    cfg = config.load(write(tmp_path, ""), env={})
    assert cfg.queues == {"default": QueueConfig("default", max_timeout_s=300.0)}
    assert (cfg.redis, cfg.api, cfg.retention, cfg.worker, cfg.log) == (
        RedisConfig(), ApiConfig(), Retention(), WorkerConfig(), LogConfig())


@pytest.mark.parametrize("env,message", [
    ({"RUNNER_REDIS_TLS_VERIFY": "maybe"}, "environment: RUNNER_REDIS_TLS_VERIFY must be true or false, got 'maybe'"),
    ({"RUNNER_REDIS_WAIT_REPLICAS": "one"}, "environment: RUNNER_REDIS_WAIT_REPLICAS must be an integer, got 'one'"),
    ({"RUNNER_REDIS_WAIT_REPLICAS": "17"}, "environment: RUNNER_REDIS_WAIT_REPLICAS must be from 0 to 16, got '17'"),
    ({"RUNNER_REDIS_WAIT_TIMEOUT": "x"}, "environment: RUNNER_REDIS_WAIT_TIMEOUT must be a number, got 'x'"),
    ({"RUNNER_REDIS_WAIT_TIMEOUT": "-1"}, "environment: RUNNER_REDIS_WAIT_TIMEOUT must be >= 0, got '-1'"),
    ({"RUNNER_REDIS_WAIT_TIMEOUT": "0"},
     "environment: RUNNER_REDIS_WAIT_TIMEOUT must be from 0.001 to 60 seconds, got '0'"),
    ({"RUNNER_REDIS_PREFIX": "a{b"}, "environment: RUNNER_REDIS_PREFIX must not contain braces"),
    ({"RUNNER_API_AUTH": "x"}, "environment: RUNNER_API_AUTH must be true or false, got 'x'"),
    ({"RUNNER_LOG_LEVEL": "loud"}, "environment: RUNNER_LOG_LEVEL must be DEBUG/INFO/WARNING/ERROR, got 'LOUD'"),
    ({"RUNNER_LOG_FORMAT": "xml"}, "environment: RUNNER_LOG_FORMAT must be json or text, got 'xml'"),
    ({"RUNNER_GRACE_PERIOD": "soon"}, "environment: RUNNER_GRACE_PERIOD must be a number, got 'soon'"),
    ({"RUNNER_CPU_AFFINITY": "yes"}, "environment: RUNNER_CPU_AFFINITY must be \"auto\" or \"off\", got 'yes'"),
])
def test_each_environment_refusal_reads_word_for_word(tmp_path: Path, env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config.load(write(tmp_path, "[queues.q]\n"), env=env)
    assert str(err.value) == message


BAD_URL = "redis://h:notaport/0"


@pytest.mark.parametrize("text,env,needle", [
    ("[bogus]\n[redis]\nnope = 1\n", {}, "unknown section [bogus]"),
    ("[api]\nnope = 1\n[redis]\nnope = 1\n", {}, "unknown key redis.nope"),
    ("[log]\nnope = 1\n[retention]\nnope = 1\n", {}, "unknown key retention.nope"),
    ("[queues.q]\nnope = 1\n[redis]\nnope = 1\n", {}, "unknown key redis.nope"),
    ('[queues."a b"]\n', {"RUNNER_REDIS_TLS_VERIFY": "x"}, "queue name 'a b' must be letters"),
    ("[queues.q]\nbackoff = { base = 5, cap = 1 }\n", {"REDIS_URL": BAD_URL}, "backoff.cap must be >= base"),
    ("[queues.q]\n", {"REDIS_URL": BAD_URL, "RUNNER_REDIS_TLS_VERIFY": "x"}, "environment: REDIS_URL"),
    ("[queues.q]\n", {"RUNNER_REDIS_PREFIX": "{", "RUNNER_API_AUTH": "x"}, "RUNNER_REDIS_PREFIX"),
    ("[queues.q]\n", {"RUNNER_API_AUTH": "x", "RUNNER_LOG_LEVEL": "x"}, "RUNNER_API_AUTH"),
    ("[queues.q]\n[api.tokens.a]\nscopes = []\n", {"RUNNER_LOG_LEVEL": "x"}, "api.tokens.a.scopes must be"),
    ("[queues.q]\n", {"RUNNER_LOG_LEVEL": "x", "RUNNER_LOG_FORMAT": "x"}, "RUNNER_LOG_LEVEL"),
    ("[queues.q]\n", {"RUNNER_LOG_FORMAT": "x", "RUNNER_GRACE_PERIOD": "x"}, "RUNNER_LOG_FORMAT"),
    ("[queues.q]\n", {"RUNNER_GRACE_PERIOD": "x", "RUNNER_CPU_AFFINITY": "x"}, "RUNNER_GRACE_PERIOD"),
])
def test_of_two_faults_the_first_read_is_reported(tmp_path: Path, text: str, env: dict[str, str],
                                                  needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        config.load(write(tmp_path, text), env=env)
    assert needle in str(err.value)
