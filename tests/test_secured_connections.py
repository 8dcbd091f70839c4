"""Secured connections: Redis with a password, an ACL user and TLS; Kafka with TLS and SASL settings;
secrets read from files and never shown.

Real servers (tests/helpers/servers.py): Redis with ``requirepass`` and an ACL user, the same on TLS only with
client certificates required, and the Tansu broker behind a TLS relay. Tansu offers no usable SASL,
so the SASL keys are checked where they land: in the ``.config`` of kafka-python's clients.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from kafka import KafkaConsumer, KafkaProducer

from alma_daemon.config import ConfigError, KafkaConfig, RedisConfig, build_config, to_dict
from alma_daemon.config.masking import MASK, mask_url
from alma_daemon.infra.connections import kafka_client, kafka_security, redis_client
from alma_daemon.infra.credentials import read_secret
from alma_daemon.infra.redis_keys import StreamKeys
from tests.helpers.servers import free_port

REPO = Path(__file__).resolve().parents[1]
#: Bounds a hang on a loaded 2-core machine; it measures nothing.
PROCESS_LIMIT_SECONDS = 300


def secret_file(folder: Path, name: str, value: str) -> str:
    path = folder / name
    path.write_text(value + "\n")  # as `echo` or a Kubernetes Secret written from a literal leaves it
    return str(path)


def alma(*args: str, timeout: float = PROCESS_LIMIT_SECONDS) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "alma_daemon", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def tiny_service(tmp_path: Path, name: str, **sections: dict) -> dict:
    """A 3-chunk MNIST stream a width-4 MLP trains on for one epoch: seconds per chunk."""
    data = {
        "dataset": {"name": "mnist", "test_examples": 100},
        "stream": {"megabatches": 3, "train_examples": 300},
        "learner": {"width": 4},
        "train": {"epochs": 1, "patience": 0},
        "kafka": {"topic": f"alma.{name}"},
        "daemon": {
            "stream": name,
            "state_dir": str(tmp_path / "state"),
            "checkpoint_dir": str(tmp_path / "models"),
            "poll_seconds": 0.2,
        },
    }
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    return data


def write_config(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


# -- config: the keys, their checks, the secret files, masking ------------------------------------------
@pytest.mark.parametrize(
    "data,key",
    [
        (
            {"kafka": {"security_protocol": "SASL_SSL", "sasl_password_file": "/run/secrets/kafka"}},
            "kafka.sasl_username",
        ),
        ({"kafka": {"security_protocol": "SASL_SSL", "sasl_username": "alma"}}, "kafka.sasl_password_file"),
        ({"kafka": {"sasl_username": "alma"}}, "kafka.sasl_username"),
        (
            {
                "kafka": {
                    "security_protocol": "SASL_PLAINTEXT",
                    "sasl_username": "a",
                    "sasl_password_file": "f",
                    "ssl_cafile": "ca.pem",
                }
            },
            "kafka.ssl_cafile",
        ),
        ({"kafka": {"security_protocol": "SSL", "sasl_mechanism": "GSSAPI"}}, "kafka.sasl_mechanism"),
        ({"kafka": {"security_protocol": "TLS"}}, "kafka.security_protocol"),
        ({"redis": {"url": "redis://127.0.0.1:6379/0", "ssl_ca_certs": "ca.pem"}}, "redis.ssl_ca_certs"),
        (
            {"redis": {"url": "redis://:inline@127.0.0.1:6379/0", "password_file": "/run/secrets/redis"}},
            "redis.password_file",
        ),
        ({"redis": {"url": "redis://alma@127.0.0.1:6379/0", "username": "other"}}, "redis.username"),
    ],
)
def test_inconsistent_security_keys_fail_at_start_up_naming_the_key(data, key) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_config(data)


def test_the_embedded_redis_ignores_the_production_connection_keys() -> None:
    """`alma run --embedded` with a production config: redis.url=null, the TLS and login keys unused."""
    config = build_config(
        {
            "redis": {
                "url": "rediss://redis.internal:6380/0",
                "password_file": "/run/secrets/redis",
                "ssl_ca_certs": "/etc/ca.pem",
            }
        },
        ["redis.url=null"],
    )
    assert config.redis.url is None


def test_a_secret_file_loses_its_final_newline_and_a_bad_one_names_the_key(tmp_path) -> None:
    assert read_secret(secret_file(tmp_path, "pw", "p@ss word"), "redis.password_file") == "p@ss word"
    with pytest.raises(ConfigError, match=r"redis\.password_file: cannot read .*missing"):
        read_secret(str(tmp_path / "missing"), "redis.password_file")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match=r"kafka\.sasl_password_file: .*empty"):
        read_secret(str(tmp_path / "empty"), "kafka.sasl_password_file")


@pytest.mark.parametrize(
    "url,masked",
    [
        ("redis://:s3cret@host:6379/0", f"redis://:{MASK}@host:6379/0"),
        ("rediss://alma:s3cret@host:6380/0", f"rediss://alma:{MASK}@host:6380/0"),
        ("rediss://alma:s3@cr@t@host:6380/0", f"rediss://alma:{MASK}@host:6380/0"),  # an unescaped @ in it
        ("http://admin:s3cret@torchserve:8081", f"http://admin:{MASK}@torchserve:8081"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("redis://alma@host:6379/0", "redis://alma@host:6379/0"),
        ("http://host:8080/path?mail=a:b", "http://host:8080/path?mail=a:b"),
    ],
)
def test_mask_url_hides_the_password_only(url, masked) -> None:
    assert mask_url(url) == masked


def test_the_resolved_config_saved_with_results_masks_url_passwords() -> None:
    config = build_config(
        {
            "redis": {"url": "rediss://alma:planted-secret@redis:6380/0"},
            "serving": {"management_url": "http://admin:planted-secret@torchserve:8081"},
        }
    )
    saved = json.dumps(to_dict(config))
    assert "planted-secret" not in saved
    assert to_dict(config)["redis"]["url"] == f"rediss://alma:{MASK}@redis:6380/0"
    assert config.redis.url == "rediss://alma:planted-secret@redis:6380/0"  # the client still gets it


# -- Kafka: the settings reach kafka-python ------------------------------------------------------------
def test_kafka_security_keys_reach_the_consumer_and_producer_of_kafka_python(tmp_path, test_ca) -> None:
    password = secret_file(tmp_path, "kafka-password", "planted-kafka-secret")
    kafka = KafkaConfig(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="alma",
        sasl_password_file=password,
        ssl_cafile=str(test_ca.ca),
        ssl_certfile=str(test_ca.client_cert),
        ssl_keyfile=str(test_ca.client_key),
    )
    expected = {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alma",
        "sasl_plain_password": "planted-kafka-secret",
        "ssl_cafile": str(test_ca.ca),
        "ssl_certfile": str(test_ca.client_cert),
        "ssl_keyfile": str(test_ca.client_key),
    }
    assert kafka_security(kafka) == expected
    # A given api_version spares the bootstrap (and so the probe), so no broker is needed to see
    # what the clients hold.
    for client_class in (KafkaConsumer, KafkaProducer):
        client = kafka_client(client_class, "127.0.0.1:9", kafka_security(kafka), probe=False, api_version=(2, 8))
        try:
            assert {key: client.config[key] for key in expected} == expected
        finally:
            client.close()
    assert kafka_security(KafkaConfig()) == {}
    assert kafka_security(KafkaConfig(security_protocol="SSL")) == {"security_protocol": "SSL"}


# -- Redis: ACL user, password file, TLS ---------------------------------------------------------------
@pytest.mark.integration
def test_redis_client_logs_in_with_the_password_file_as_default_or_acl_user(tmp_path, redis_secured) -> None:
    requirepass = secret_file(tmp_path, "requirepass", redis_secured.password)
    acl = secret_file(tmp_path, "acl", redis_secured.users["alma"])
    for config in (
        RedisConfig(url=redis_secured.url, password_file=requirepass),
        RedisConfig(url=redis_secured.url, username="alma", password_file=acl),
    ):
        client = redis_client(config)
        try:
            client.set("alma:probe", b"1")
            assert client.acl_whoami() == (config.username or "default")
        finally:
            client.close()


@pytest.mark.integration
def test_wrong_redis_credentials_fail_here_naming_the_server_and_the_keys(tmp_path, redis_secured) -> None:
    wrong = secret_file(tmp_path, "wrong", "not-the-password")
    for config in (
        RedisConfig(url=redis_secured.url, username="alma", password_file=wrong),
        RedisConfig(url=redis_secured.url),
    ):
        with pytest.raises(ConfigError) as info:
            redis_client(config)
        message = str(info.value)
        assert f"127.0.0.1:{redis_secured.port}" in message and "redis.password_file" in message
        assert "not-the-password" not in message


@pytest.mark.integration
def test_redis_over_tls_needs_the_ca_and_the_client_certificate(tmp_path, redis_tls) -> None:
    ca = redis_tls.tls
    acl = secret_file(tmp_path, "acl", redis_tls.users["alma"])
    login = {"url": redis_tls.url, "username": "alma", "password_file": acl}
    client = redis_client(
        RedisConfig(**login, ssl_ca_certs=str(ca.ca), ssl_certfile=str(ca.client_cert), ssl_keyfile=str(ca.client_key))
    )
    try:
        assert client.ping() and client.connection_pool.connection_kwargs["ssl_ca_certs"] == str(ca.ca)
    finally:
        client.close()
    with pytest.raises(ConfigError, match=r"TLS handshake failed \(certificate verify failed.*redis\.ssl_ca_certs"):
        redis_client(RedisConfig(**login, ssl_certfile=str(ca.client_cert), ssl_keyfile=str(ca.client_key)))
    # The server's "certificate required" alert may come after the client saw the connection close.
    with pytest.raises(ConfigError, match=r"TLS handshake failed .*redis\.ssl_certfile"):
        redis_client(RedisConfig(**login, ssl_ca_certs=str(ca.ca)))


@pytest.mark.integration
def test_alma_run_and_status_with_a_wrong_password_stop_with_one_line(tmp_path, redis_secured) -> None:
    wrong = secret_file(tmp_path, "wrong", "not-the-password")
    config = write_config(
        tmp_path,
        tiny_service(
            tmp_path,
            "wrongpass",
            kafka={"transport": "redis"},
            redis={"url": redis_secured.url, "username": "alma", "password_file": wrong},
        ),
    )
    for command in (["run", "--config", config, "--no-progress"], ["status", "--config", config]):
        done = alma(*command)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert lines[0].startswith(f"alma {command[0]}: config error: Redis at 127.0.0.1:{redis_secured.port} refused")
        assert "redis.password_file" in lines[0] and "not-the-password" not in done.stderr + done.stdout


@pytest.mark.integration
def test_the_redis_stream_transport_runs_through_an_acl_user(tmp_path, redis_secured) -> None:
    acl = secret_file(tmp_path, "acl", redis_secured.users["alma"])
    data = tiny_service(
        tmp_path,
        "aclstream",
        kafka={"transport": "redis"},
        redis={"url": redis_secured.url, "username": "alma", "password_file": acl},
    )
    config = write_config(tmp_path, data)
    done = alma("run", "--config", config, "--replay", "mnist", "--until-chunks", "3", "--no-progress")
    assert done.returncode == 0, done.stderr
    keys = StreamKeys("aclstream")
    with redis_secured.client() as client:
        assert client.hget(keys.offsets, "stream"), "no offset stored for the Redis-stream transport"
        assert json.loads(client.get(keys.engine))["chunks_seen"] == 3


# -- the whole service over TLS, and where a secret must not show up -------------------------------------
@pytest.mark.integration
@pytest.mark.slow
def test_a_tls_service_keeps_its_secrets_out_of_logs_status_metrics_and_results(tmp_path, redis_tls, kafka_tls) -> None:
    """Replay and daemon over TLS Kafka with a client certificate, buffer on TLS Redis as an ACL user.

    Planted: the ACL password written in redis.url (what masking must hide) and the requirepass
    password that `alma status` reads from its file. Neither may appear anywhere a user can look.
    """
    ca = redis_tls.tls
    acl_secret, requirepass_secret = redis_tls.users["alma"], redis_tls.password
    metrics_port = free_port()
    data = tiny_service(
        tmp_path,
        "secured",
        kafka={
            "transport": "kafka",
            "bootstrap_servers": kafka_tls.bootstrap_servers,
            "security_protocol": "SSL",
            "ssl_cafile": str(ca.ca),
            "ssl_certfile": str(ca.client_cert),
            "ssl_keyfile": str(ca.client_key),
        },
        redis={
            "url": redis_tls.url.replace("rediss://", f"rediss://alma:{acl_secret}@"),
            "ssl_ca_certs": str(ca.ca),
            "ssl_certfile": str(ca.client_cert),
            "ssl_keyfile": str(ca.client_key),
        },
        metrics={"port": metrics_port},
    )
    config = write_config(tmp_path, data)
    seen: dict[str, str] = {}

    replayed = alma("-v", "replay", "--config", config, "--no-progress")
    assert replayed.returncode == 0, replayed.stderr
    seen["replay output"] = replayed.stdout + replayed.stderr

    log_path = tmp_path / "daemon.log"
    with log_path.open("w") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "alma_daemon", "-v", "run", "--config", config, "--no-progress"],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        keys = StreamKeys("secured")
        with redis_tls.client() as client:
            deadline = time.monotonic() + PROCESS_LIMIT_SECONDS
            while json.loads(client.get(keys.engine) or "{}").get("chunks_seen", 0) < 3:
                assert daemon.poll() is None, f"the daemon exited early:\n{log_path.read_text()}"
                assert time.monotonic() < deadline, "3 chunks not processed in time"
                time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as response:
            seen["metrics"] = response.read().decode()
        status_login = [
            "--set",
            "redis.url=" + redis_tls.url,
            "--set",
            "redis.password_file=" + secret_file(tmp_path, "requirepass", requirepass_secret),
        ]
        for form in ([], ["--json"]):
            status = alma("status", "--config", config, *status_login, *form)
            assert status.returncode == 0, status.stderr
            seen[f"status {form}"] = status.stdout + status.stderr
        assert json.loads(status.stdout)["chunks_trained"] == 3
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=PROCESS_LIMIT_SECONDS)
    seen["daemon log"] = log_path.read_text()
    for folder in (tmp_path / "state", tmp_path / "models"):
        for path in folder.rglob("*"):
            if path.is_file():
                seen[str(path)] = path.read_bytes().decode(errors="replace")
    assert "results.json" in " ".join(seen) and "redis connected" in seen["daemon log"]
    results = json.loads((tmp_path / "state" / "results.json").read_text())
    assert results["config"]["redis"]["url"] == f"rediss://alma:{MASK}@127.0.0.1:{redis_tls.port}/0"
    for secret in (acl_secret, requirepass_secret):
        leaks = [where for where, text in seen.items() if secret in text]
        assert not leaks, f"a planted secret shows in {leaks}"
