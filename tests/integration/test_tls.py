"""TLS and auth: a redis-server with TLS (Debian's build), throwaway certificates made by
the test, and an ACL user with a password. rediss:// works with a CA and in insecure
mode; a wrong CA or a wrong password is a clear RedisUnavailable, never a hang."""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from runner.errors import RedisUnavailable
from runner.store.embedded import Server, debian_binary, free_port

from conftest import Endpoint, Project, make_project

PASSWORD = "s3cret-pass"


def _certs(d: Path) -> tuple[Path, Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("test ca")).issuer_name(name("test ca"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(name("127.0.0.1")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    d.mkdir(parents=True, exist_ok=True)
    (d / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (d / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "server.key").write_bytes(pem(key))
    return d / "ca.pem", d / "server.pem", d / "server.key"


@dataclass
class Tls:
    server: Server
    tls_port: int
    ca: Path

    def url(self, user: str = "runner", password: str = PASSWORD) -> str:
        return f"rediss://{user}:{password}@127.0.0.1:{self.tls_port}/0"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tls]:
    binary = debian_binary()
    if binary is None:
        if os.environ.get("CI"):
            raise RuntimeError("CI must install Debian's redis-server (built with TLS)")
        pytest.skip("Debian's redis-server is not installed here (apt-get install redis-server runs these)")
    root = tmp_path_factory.mktemp("tls")
    ca, cert, key = _certs(root / "certs")
    tls_port = free_port()
    s = Server(root / "data", binary=binary, extra=[
        "--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
        "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no",
    ]).start()
    admin = redis.Redis(port=s.port)
    admin.acl_setuser("runner", enabled=True, passwords=[f"+{PASSWORD}"], keys=["~*"], channels=["*"],
                      commands=["+@all"])
    # (redis-py writes the "&" of each channel pattern itself: "&*" allowed only the channel
    # named "&*", so the user could subscribe to none and each wait ran out its timeout.)
    admin.acl_setuser("default", enabled=False)  # no anonymous access from here on
    admin.close()
    yield Tls(s, tls_port, ca)
    s.stop(kill=True)


def _project(tmp_path: Path, url: str, redis_extra: str) -> Project:
    p = make_project(tmp_path / "p", Endpoint(url))  # type: ignore[arg-type]
    toml = (p.root / "runner.toml").read_text()
    toml = toml.replace("[redis]\n", "[redis]\n" + redis_extra, 1)
    (p.root / "runner.toml").write_text(toml)
    p._runtime = None
    return p


def test_rediss_with_a_ca_and_an_acl_user_runs_jobs(tmp_path: Path, tls: Tls) -> None:
    """Producer and worker both over TLS, verified against the test CA, as an ACL user."""
    p = _project(tmp_path, tls.url(), f'ca_cert = "{tls.ca}"\n')
    try:
        assert p.runtime.redis.acl_whoami() == "runner"
        conn = p.runtime.redis.connection_pool.get_connection()
        assert type(conn).__name__ == "SSLConnection"
        p.runtime.redis.connection_pool.release(conn)
        job = p.client.enqueue("record", {"n": 1})
        p.spawn_worker("fast")
        assert p.client.wait(job.id, timeout_s=20).status == "done"
    finally:
        p.stop_all()


def test_rediss_insecure_mode_accepts_the_self_signed_server(tmp_path: Path, tls: Tls) -> None:
    """tls_verify = false (PaaS add-ons with self-signed certificates): no CA needed."""
    p = _project(tmp_path, tls.url(), "tls_verify = false\n")
    assert p.client.ping()
    assert p.client.enqueue("noop", {}).status == "queued"


def test_rediss_without_the_ca_is_refused_clearly(tmp_path: Path, tls: Tls) -> None:
    p = _project(tmp_path, tls.url(), "")
    with pytest.raises(RedisUnavailable, match="certificate"):
        p.client.enqueue("noop", {})


def test_wrong_password_is_refused_clearly(tmp_path: Path, tls: Tls) -> None:
    p = _project(tmp_path, tls.url(password="wrong"), "tls_verify = false\n")
    with pytest.raises(RedisUnavailable, match=r"(?i)password|auth"):
        p.client.enqueue("noop", {})


def test_plain_port_refuses_anonymous_clients(tls: Tls) -> None:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    c = redis.Redis(port=tls.server.port, retry=Retry(NoBackoff(), 0))
    with pytest.raises(redis.exceptions.RedisError):
        c.ping()
    c.close()


def test_the_one_shot_readers_connection_speaks_tls_as_redis_py_does(tls: Tls) -> None:
    """The store's own connection of `runner stats` and `runner job` (store/link.py) over
    rediss://: verified against the CA or in insecure mode, it connects as the ACL user; a
    missing CA and a wrong password fail as redis-py's client fails, in kind and words."""
    from runner.config import RedisConfig
    from runner.store import connection, link

    def outcome(cfg: RedisConfig, client: object) -> tuple[str, str]:
        try:
            who = client.execute_command("ACL", "WHOAMI")  # type: ignore[attr-defined]
        except RedisUnavailable as exc:
            return "unavailable", str(exc)
        except connection.UNAVAILABLE as exc:
            return "unavailable", str(exc)
        finally:
            client.close()  # type: ignore[attr-defined]
        return "ok", who

    cases = {
        RedisConfig(url=tls.url(), ca_cert=str(tls.ca)): "ok",
        RedisConfig(url=tls.url(), tls_verify=False): "ok",
        RedisConfig(url=tls.url()): "unavailable",
        RedisConfig(url=tls.url(password="wrong"), tls_verify=False): "unavailable",
    }
    for cfg, kind in cases.items():
        ours = link.from_config(cfg)
        assert ours is not None
        got = outcome(cfg, ours)
        assert got == outcome(cfg, connection.connect(cfg)), cfg
        assert got[0] == kind and (kind == "unavailable" or got[1] == "runner"), (cfg, got)
