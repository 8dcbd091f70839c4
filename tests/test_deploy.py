"""The deployment files fit together: Dockerfile, deploy/docker-compose.yml (with the files laid over
it), deploy/k8s/ (with TorchServe, and with KServe's model server: deploy/k8s/kserve/).

No container is started (there is no Docker engine in CI): these tests read the files and check
what would otherwise fail only at `docker compose up` or `kubectl apply` time. Configs load with
the daemon's own loader, commands parse with the real ``alma`` parser, and the ports, paths and
names that one file expects of another agree (metrics port, scrape targets, mounts, topics).
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the test extra installs tomli
    import tomli as tomllib
import yaml

from alma_daemon.cli import build_parser
from alma_daemon.config import Config, build_config, load_config

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
COMPOSE_CONFIG = DEPLOY / "config.compose.yaml"
COMPOSE_SECRETS = DEPLOY / "docker-compose.secrets.yml"
COMPOSE_KSERVE = DEPLOY / "docker-compose.kserve.yml"
COMPOSE_KSERVE_CONFIG = DEPLOY / "config.compose.kserve.yaml"
K8S = DEPLOY / "k8s"
#: KServe's model server in place of TorchServe: kserve/10-config.yaml instead of 10-config.yaml, and
#: kserve/30-kserve.yaml or kserve/inferenceservice.yaml instead of 30-torchserve.yaml.
K8S_KSERVE = K8S / "kserve"
#: Where every alma container reads its config.
CONFIG_IN_CONTAINER = "/etc/alma/config.yaml"


# -- helpers --------------------------------------------------------------------------------------
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def services() -> dict[str, dict]:
    return compose()["services"]


#: Compose's ``!reset`` tag: the key is removed from what the files before set.
RESET = object()


class ComposeLoader(yaml.SafeLoader):
    """YAML's safe loader (plain data only, as ``yaml.safe_load``) with compose's ``!reset`` tag, which
    a file laid over the stack uses."""


ComposeLoader.add_constructor("!reset", lambda loader, node: RESET)


def layered(base: Any, layer: Any, key: str = "") -> Any:
    """``layer`` laid over ``base`` by compose's merge rules, those the files here rely on: mappings
    merge, ``!reset`` removes a key, a service's volumes are merged by their target, ``command`` and
    a health check's ``test`` are replaced, other sequences appended."""
    if isinstance(base, dict) and isinstance(layer, dict):
        merged = dict(base)
        for name, value in layer.items():
            if value is RESET:
                merged.pop(name, None)
            else:
                merged[name] = layered(merged[name], value, name) if name in merged else value
        return merged
    if isinstance(base, list) and isinstance(layer, list) and key not in ("command", "test"):
        if key == "volumes":
            return list({parse_mount(mount)[1]: mount for mount in base + layer}.values())
        return base + layer
    return layer


def kserve_compose() -> dict:
    """The stack with deploy/docker-compose.kserve.yml laid over it."""
    return layered(compose(), yaml.load(COMPOSE_KSERVE.read_text(), Loader=ComposeLoader))


def started(stack: dict) -> dict[str, dict]:
    """The services ``docker compose up`` starts: those without a profile."""
    return {name: service for name, service in stack["services"].items() if not service.get("profiles")}


def port_of(url: str) -> int:
    return urlsplit(url).port


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    lines, current = [], ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def dockerfile_healthcheck_port() -> int:
    (check,) = [args for name, args in dockerfile_instructions() if name == "HEALTHCHECK"]
    match = re.search(r"http://(?:127\.0\.0\.1|localhost):(\d+)/healthz", check)
    assert match, f"the HEALTHCHECK does not ask /healthz on a local port: {check}"
    return int(match.group(1))


def interpolate(text: str) -> str:
    """Compose's ``${VAR:-default}`` with VAR unset: the default (no default: empty)."""
    return re.sub(r"\$\{\w+(?::?-([^}]*))?\}", lambda m: m.group(1) or "", text)


def short_mounts(service: dict) -> list[tuple[str, str, str]]:
    """(source, target, mode) of a compose service's volumes in the short syntax; a source the user
    sets through a variable keeps its ``$`` form, so callers can tell it from a repository path."""
    return [parse_mount(volume) for volume in service.get("volumes", [])]


def parse_mount(volume: str) -> tuple[str, str, str]:
    """(source, target, mode) of one volume in the short syntax."""
    assert isinstance(volume, str), f"use the short syntax for volumes, not {volume!r}"
    variable = re.match(r"\$\{[^}]*\}", volume)
    rest = volume[variable.end() :] if variable else volume
    parts = rest.split(":")
    source = variable.group(0) + parts[0] if variable else parts[0]
    return source, parts[1], parts[2] if len(parts) > 2 else "rw"


def is_bind(source: str) -> bool:
    return interpolate(source).startswith((".", "/"))


def parse_alma(argv: list[str]) -> argparse.Namespace:
    try:
        return build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"`alma {shlex.join(argv)}` is rejected by the alma command line")


def container_config(argv: list[str], mounted: dict[str, Path]) -> Config:
    """The config a `run` or `serve` container resolves: its --config file (a mounted one) + --set."""
    args = parse_alma(argv)
    assert args.config in mounted, f"`alma {shlex.join(argv)}` reads {args.config}, which nothing mounts"
    return load_config(mounted[args.config], args.overrides)


def compose_config_mounts(service: dict) -> dict[str, Path]:
    return {
        target: (DEPLOY / source).resolve()
        for source, target, _ in short_mounts(service)
        if is_bind(source) and "$" not in source
    }


def torchserve_manifests() -> list[Path]:
    """Every manifest of the stack with TorchServe: all of deploy/k8s/ but kserve/."""
    return [path for path in sorted(K8S.rglob("*.yaml")) if K8S_KSERVE not in path.parents]


def kserve_manifests(server: str = "30-kserve.yaml") -> list[Path]:
    """The stack with KServe's model server: kserve/'s config and ``server`` in place of TorchServe's."""
    replaced = {K8S / "10-config.yaml", K8S / "30-torchserve.yaml"}
    return [p for p in torchserve_manifests() if p not in replaced] + [
        K8S_KSERVE / "10-config.yaml",
        K8S_KSERVE / server,
    ]


def k8s_documents(paths: list[Path] | None = None) -> list[tuple[Path, dict]]:
    """The documents of ``paths`` (every manifest under deploy/k8s/ by default)."""
    docs = []
    for path in sorted(K8S.rglob("*.yaml")) if paths is None else paths:
        docs.extend((path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc is not None)
    return docs


def k8s_objects(kind: str, paths: list[Path] | None = None) -> list[dict]:
    """The objects of ``kind`` in ``paths`` (the stack with TorchServe by default)."""
    return [doc for _, doc in k8s_documents(paths or torchserve_manifests()) if doc["kind"] == kind]


def k8s_config_data(paths: list[Path] | None = None) -> dict:
    (configmap,) = [c for c in k8s_objects("ConfigMap", paths) if c["metadata"]["name"] == "alma-config"]
    return yaml.safe_load(configmap["data"]["config.yaml"])


def k8s_config(paths: list[Path] | None = None) -> Config:
    return build_config(k8s_config_data(paths))


def mounts_configmap(pod_spec: dict, path: str) -> bool:
    """Whether ``path`` is config.yaml of the alma-config ConfigMap in this pod."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    folder, name = path.rsplit("/", 1)
    for mount in pod_spec["containers"][0]["volumeMounts"]:
        volume = volumes.get(mount["name"], {})
        if mount["mountPath"] == folder and volume.get("configMap", {}).get("name") == "alma-config":
            return name == "config.yaml"
    return False


def secret_behind(pod_spec: dict, path: str) -> str | None:
    """The Secret whose volume holds file ``path`` in the pod's first container, or None."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    folder, name = path.rsplit("/", 1)
    for mount in pod_spec["containers"][0]["volumeMounts"]:
        secret = volumes.get(mount["name"], {}).get("secret")
        if mount["mountPath"] == folder and secret:
            items = secret.get("items")
            return secret["secretName"] if items is None or name in {i["path"] for i in items} else None
    return None


def k8s_container(kind: str, name: str, paths: list[Path] | None = None) -> dict:
    (workload,) = [w for w in k8s_objects(kind, paths) if w["metadata"]["name"] == name]
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return container


# -- Dockerfile -----------------------------------------------------------------------------------
def test_dockerfile_runs_alma_run_with_the_mounted_config():
    instructions = dict(dockerfile_instructions())  # the last of each kind: the runtime stage's
    assert yaml.safe_load(instructions["ENTRYPOINT"]) == ["tini", "--", "alma"]
    assert yaml.safe_load(instructions["CMD"]) == ["run", "--config", CONFIG_IN_CONTAINER]
    assert instructions["USER"] not in ("root", "0"), "the image must not run as root"
    assert "ALMA_DATA_DIR=/data" in instructions["ENV"]


def test_dockerfile_pins_the_torch_of_pyproject():
    pins = [
        d
        for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
        if re.match(r"torch\s*==", d)
    ]
    assert len(pins) == 1, "pyproject.toml no longer pins torch; the Dockerfile's pin must follow it"
    installs = [args for name, args in dockerfile_instructions() if name == "RUN" and "--index-url" in args]
    assert len(installs) == 1 and '"${TORCH_INDEX_URL}"' in installs[0]
    assert re.search(r'"torch==([^"]+)"', installs[0]).group(1) == pins[0].split("==")[1].strip()


def test_dockerfile_copies_only_what_the_build_context_keeps():
    """A COPY of a path that .dockerignore drops fails the build ("not found"), only at build time."""
    patterns = [
        p.strip().rstrip("/")
        for p in (ROOT / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    assert not any(p.startswith("!") for p in patterns), "negated patterns: extend this check first"

    def ignored(path: str) -> bool:
        prefixes = ["/".join(path.split("/")[: i + 1]) for i in range(path.count("/") + 1)]
        return any(
            fnmatch.fnmatch(prefix, pattern.removeprefix("**/")) or fnmatch.fnmatch(prefix, pattern)
            for pattern in patterns
            for prefix in prefixes
        )

    sources = []
    for name, args in dockerfile_instructions():
        if name == "COPY" and "--from=" not in args:
            sources.extend(args.split()[:-1])
    assert "pyproject.toml" in sources and "deploy/config.compose.yaml" in sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
        assert not ignored(source), f"COPY {source}: .dockerignore drops it from the build context"
    for heavy in ("runs", "model_store", ".git", "data", "alma_daemon/__pycache__"):
        assert ignored(heavy), f".dockerignore should drop {heavy}"
    # pyproject.toml names README.md as the package's readme: the install fails without it.
    assert "README.md" in sources


def test_healthcheck_port_is_the_metrics_port_everywhere():
    port = dockerfile_healthcheck_port()
    assert load_config(COMPOSE_CONFIG).metrics.port == port
    assert k8s_config().metrics.port == port
    exposed = [args for name, args in dockerfile_instructions() if name == "EXPOSE"]
    assert str(port) in " ".join(exposed).split()


# -- docker compose -------------------------------------------------------------------------------
def test_compose_services_all_have_an_image_and_known_dependencies():
    found = services()
    assert {"kafka", "kafka-init", "redis", "torchserve", "daemon", "replay", "prometheus", "grafana"} <= set(found)
    for name, service in found.items():
        assert service.get("image") or service.get("build"), f"service {name} has neither image nor build"
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert dependency in found, f"{name} depends on unknown service {dependency}"
            assert condition["condition"] in ("service_healthy", "service_completed_successfully", "service_started")
            if condition["condition"] == "service_healthy":
                assert found[dependency].get("healthcheck", {}).get("disable") is not True
                assert "healthcheck" in found[dependency] or found[dependency].get("build"), (
                    f"{name} waits for {dependency} to be healthy, but {dependency} has no healthcheck"
                )
    assert services()["replay"]["profiles"] == ["replay"]


def test_compose_mounts_exist_and_named_volumes_are_declared():
    declared = set(compose().get("volumes") or {})
    binds = []
    for name, service in services().items():
        for source, target, mode in short_mounts(service):
            if not is_bind(source):
                assert source in declared, f"{name} mounts undeclared volume {source}"
            elif "$" in source:
                # The user's data folder (${ALMA_DATA:-../data}): not part of the repository.
                assert mode == "ro" and target == "/data", f"{name}: {source} should be the read-only data mount"
            else:
                path = (DEPLOY / source).resolve()
                assert path.exists(), f"{name} mounts {source}, which does not exist ({path})"
                binds.append(path.relative_to(ROOT).as_posix())
    for required in (
        "deploy/prometheus.yml",
        "deploy/grafana/provisioning",
        "deploy/grafana/dashboards",
        "deploy/config.compose.yaml",
    ):
        assert required in binds


def test_compose_daemon_config_loads_and_names_the_compose_services():
    config = load_config(COMPOSE_CONFIG)
    found = services()
    assert config.kafka.transport == "kafka"
    assert config.kafka.bootstrap_servers.split(":")[0] == "kafka"
    assert urlsplit(config.redis.url).hostname == "redis"
    assert config.serving.kind == "torchserve"
    for url in (config.serving.management_url, config.serving.inference_url, config.serving.metrics_url):
        assert urlsplit(url).hostname == "torchserve" and "torchserve" in found
    assert config.metrics.host == "0.0.0.0", "Prometheus scrapes from another container"
    # The checkpoints TorchServe reads through file:// URLs are mounted at the same path in both.
    mounts = {
        name: {target: source for source, target, _ in short_mounts(found[name])} for name in ("daemon", "torchserve")
    }
    assert mounts["daemon"][config.daemon.checkpoint_dir] == mounts["torchserve"][config.daemon.checkpoint_dir]
    assert config.daemon.state_dir in mounts["daemon"], "the daemon's state must be on a volume"


def test_compose_commands_parse_and_the_daemon_reaches_torchserve_where_it_listens():
    found = services()
    daemon = container_config(found["daemon"]["command"], compose_config_mounts(found["daemon"]))
    served = container_config(found["torchserve"]["command"], compose_config_mounts(found["torchserve"]))
    for key in ("management_url", "inference_url", "metrics_url"):
        assert urlsplit(getattr(served.serving, key)).hostname == "0.0.0.0", (
            f"TorchServe's {key} must bind all interfaces"
        )
        assert port_of(getattr(served.serving, key)) == port_of(getattr(daemon.serving, key)), key
    published = {p.rsplit(":", 2)[-1] for p in found["torchserve"].get("ports", [])}
    assert str(port_of(daemon.serving.management_url)) not in published, "keep the management API unpublished"
    assert all(p.startswith("127.0.0.1:") for s in found.values() for p in s.get("ports", []))
    assert str(port_of(daemon.serving.inference_url)) in " ".join(found["torchserve"]["healthcheck"]["test"])


def test_compose_replay_publishes_the_stream_the_daemon_consumes():
    from alma_daemon.commands.replay import replay_config

    found = services()
    daemon = load_config(COMPOSE_CONFIG)
    args = parse_alma(found["replay"]["command"])
    assert args.command == "replay"
    produced = replay_config(args)
    assert produced.kafka.topic == daemon.kafka.topic
    assert produced.kafka.bootstrap_servers == daemon.kafka.bootstrap_servers
    assert produced.daemon.stream == daemon.daemon.stream
    assert produced.dataset.name == daemon.dataset.name
    assert produced.stream.megabatches == daemon.stream.megabatches
    init = found["kafka-init"]["command"]
    assert init[init.index("--topic") + 1] == daemon.kafka.topic


def test_compose_secrets_override_gives_redis_and_the_daemon_one_password_file():
    override = yaml.safe_load(COMPOSE_SECRETS.read_text())
    found, layered = services(), override["services"]
    assert set(layered) <= set(found)
    daemon = layered["daemon"]
    assert daemon["command"][: len(found["daemon"]["command"])] == found["daemon"]["command"]
    config = container_config(daemon["command"], compose_config_mounts(found["daemon"]))
    secret = config.redis.password_file.removeprefix("/run/secrets/")
    assert config.redis.password_file == f"/run/secrets/{secret}", "compose mounts secrets under /run/secrets"
    assert secret in override["secrets"] and secret in daemon["secrets"] and secret in layered["redis"]["secrets"]
    redis_command = " ".join(layered["redis"]["command"])
    assert f'--requirepass "$$(cat /run/secrets/{secret})"' in redis_command
    assert all(flag in redis_command for flag in found["redis"]["command"][1:]), "keep AOF and noeviction"
    assert f"/run/secrets/{secret}" in " ".join(layered["redis"]["healthcheck"]["test"])
    # The password file stays out of git and out of the image's build context.
    folder = Path(override["secrets"][secret]["file"]).parent.as_posix().removeprefix("./")
    for ignore in (".gitignore", ".dockerignore"):
        assert f"deploy/{folder}/" in (ROOT / ignore).read_text().split(), f"{ignore} should list deploy/{folder}/"


def test_compose_kserve_override_starts_kserve_in_place_of_torchserve():
    stack = kserve_compose()
    found, running = stack["services"], started(stack)
    assert "torchserve" not in running and "kserve" in running, "TorchServe is off with KServe"
    assert {"kafka", "redis", "daemon", "prometheus", "grafana"} <= set(running)
    for name, service in running.items():
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert dependency in running, f"{name} depends on {dependency}, which this stack does not start"
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in found[dependency] or found[dependency].get("build")
    assert found["daemon"]["depends_on"]["kserve"]["condition"] == "service_healthy"
    # The anchor of docker-compose.yml does not reach into another file: the same image, spelled out.
    base = compose()["x-alma-image"]
    assert found["kserve"]["image"] == base["image"] and found["kserve"]["build"] == base["build"]
    declared = set(stack.get("volumes") or {})
    for name, service in running.items():
        for source, _, _ in short_mounts(service):
            if not is_bind(source):
                assert source in declared, f"{name} mounts undeclared volume {source}"
            elif "$" not in source:
                assert (DEPLOY / source).exists(), f"{name} mounts {source}, which does not exist"
    assert all(p.startswith("127.0.0.1:") for s in running.values() for p in s.get("ports", []))


def test_compose_kserve_commands_parse_and_the_daemon_reaches_kserve_where_it_listens():
    found = kserve_compose()["services"]
    daemon = container_config(found["daemon"]["command"], compose_config_mounts(found["daemon"]))
    args = parse_alma(found["kserve"]["command"])
    assert (args.command, args.kind, args.foreground) == ("serve", "kserve", True)
    served = container_config(found["kserve"]["command"], compose_config_mounts(found["kserve"]))
    assert daemon.serving.kind == served.serving.kind == "kserve"
    assert urlsplit(daemon.serving.inference_url).hostname == "kserve"
    # `alma serve --kind kserve` listens on the port of serving.inference_url (all interfaces).
    port = port_of(served.serving.inference_url)
    assert port == port_of(daemon.serving.inference_url)
    assert f"127.0.0.1:{port}:{port}" in found["kserve"]["ports"]
    assert f"127.0.0.1:{port}/v2/health/live" in " ".join(found["kserve"]["healthcheck"]["test"])
    # The server reads the versions and the default-version file where the daemon writes them.
    assert served.serving.model_name == daemon.serving.model_name
    assert served.daemon.checkpoint_dir == daemon.daemon.checkpoint_dir
    mounts = {
        name: {target: source for source, target, _ in short_mounts(found[name])} for name in ("daemon", "kserve")
    }
    assert mounts["daemon"][daemon.daemon.checkpoint_dir] == mounts["kserve"][daemon.daemon.checkpoint_dir]
    # The server's folder (log, pid file, the repository token it writes) is a volume of its own; the
    # daemon reads the token from it at the same path, read-only.
    folder = f"{served.daemon.state_dir}/kserve"
    assert served.serving.repository_token_file is None and daemon.serving.repository_token_file is None
    assert folder in mounts["kserve"] and mounts["daemon"][folder] == mounts["kserve"][folder]
    assert [m for m in found["daemon"]["volumes"] if m.startswith(f"{mounts['kserve'][folder]}:")][0].endswith(":ro")
    # It listens on every interface of its container: the daemon's is another.
    assert served.serving.bind_host == "0.0.0.0"


def test_compose_kserve_config_is_the_compose_config_but_for_serving():
    """Two copies of one config: a key changed in one must be changed in the other."""
    torchserve, kserve = (yaml.safe_load(path.read_text()) for path in (COMPOSE_CONFIG, COMPOSE_KSERVE_CONFIG))
    assert {k: v for k, v in torchserve.items() if k != "serving"} == {
        k: v for k, v in kserve.items() if k != "serving"
    }
    assert load_config(COMPOSE_KSERVE_CONFIG).serving.kind == "kserve"


def test_prometheus_scrapes_kserve_in_the_kserve_stack():
    running = started(kserve_compose())
    base, variant = (
        yaml.safe_load((DEPLOY / name).read_text()) for name in ("prometheus.yml", "prometheus.kserve.yml")
    )
    assert {k: v for k, v in base.items() if k != "scrape_configs"} == {
        k: v for k, v in variant.items() if k != "scrape_configs"
    }, "the same alerts and intervals"
    jobs = {job["job_name"]: job for job in variant["scrape_configs"]}
    assert {name: job for name, job in jobs.items() if name != "kserve"} == {
        job["job_name"]: job for job in base["scrape_configs"] if job["job_name"] != "torchserve"
    }
    targets = [t for job in jobs.values() for c in job["static_configs"] for t in c["targets"]]
    assert all(t.startswith("localhost:") or t.rsplit(":", 1)[0] in running for t in targets), targets
    served = container_config(running["kserve"]["command"], compose_config_mounts(running["kserve"]))
    assert jobs["kserve"]["static_configs"][0]["targets"] == [f"kserve:{port_of(served.serving.inference_url)}"]
    mounts = {target: source for source, target, _ in short_mounts(running["prometheus"])}
    assert mounts["/etc/prometheus/prometheus.yml"] == "./prometheus.kserve.yml"


def test_kafka_cluster_id_is_a_base64_uuid():
    """KRaft's storage format refuses any other id, and the broker never starts."""
    cluster_id = str(services()["kafka"]["environment"]["CLUSTER_ID"])
    assert len(cluster_id) == 22
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_prometheus_and_grafana_files_fit_the_compose_services():
    found = services()
    daemon = load_config(COMPOSE_CONFIG)
    served = container_config(found["torchserve"]["command"], compose_config_mounts(found["torchserve"]))
    expected_ports = {"daemon": daemon.metrics.port, "torchserve": port_of(served.serving.metrics_url)}
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = [t for job in prometheus["scrape_configs"] for c in job.get("static_configs", []) for t in c["targets"]]
    for target in targets:
        host, port = target.rsplit(":", 1)
        if host != "localhost":
            assert host in found, f"prometheus.yml scrapes {target}, not a compose service"
        if host in expected_ports:
            assert int(port) == expected_ports[host], (
                f"prometheus.yml scrapes {target}; the service listens on {expected_ports[host]}"
            )
    assert {"daemon", "torchserve"} <= {t.rsplit(":", 1)[0] for t in targets}

    grafana_mounts = {source.rstrip("/"): target for source, target, _ in short_mounts(found["grafana"])}
    provisioning = DEPLOY / "grafana" / "provisioning"
    providers = [
        p
        for f in sorted((provisioning / "dashboards").glob("*.y*ml"))
        for p in yaml.safe_load(f.read_text())["providers"]
    ]
    assert providers, "no dashboard provider under deploy/grafana/provisioning/dashboards"
    for provider in providers:
        assert provider["options"]["path"] == grafana_mounts["./grafana/dashboards"]
    for source in sorted((provisioning / "datasources").glob("*.y*ml")):
        for datasource in yaml.safe_load(source.read_text())["datasources"]:
            assert urlsplit(datasource["url"]).hostname in found


# -- Kubernetes -----------------------------------------------------------------------------------
def test_k8s_manifests_parse_and_are_named():
    documents = k8s_documents()
    assert len(documents) >= 8
    for path, doc in documents:
        where = path.relative_to(ROOT)
        assert doc.get("apiVersion") and doc.get("kind"), f"{where}: a document without apiVersion or kind"
        assert doc.get("metadata", {}).get("name"), f"{where}: a {doc['kind']} without metadata.name"
        if doc["kind"] not in ("Namespace", "KafkaTopic"):
            assert doc["metadata"].get("namespace") == "alma", f"{where}: {doc['kind']} outside namespace alma"


def test_k8s_config_loads_and_points_at_the_torchserve_service():
    config = k8s_config()
    assert config.serving.kind == "torchserve" and config.metrics.host == "0.0.0.0"
    (service,) = [s for s in k8s_objects("Service") if s["metadata"]["name"] == "alma-torchserve"]
    ports = {p["port"] for p in service["spec"]["ports"]}
    for url in (config.serving.management_url, config.serving.inference_url, config.serving.metrics_url):
        assert urlsplit(url).hostname.startswith("alma-torchserve.alma.svc"), url
        assert port_of(url) in ports


def test_k8s_daemon_is_a_probed_singleton_with_persistent_state():
    (daemon,) = [s for s in k8s_objects("StatefulSet") if s["metadata"]["name"] == "alma-daemon"]
    assert daemon["spec"]["replicas"] == 1, "one daemon per stream"
    container = k8s_container("StatefulSet", "alma-daemon")
    config = k8s_config()
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/healthz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert named.get(get["port"], get["port"]) == config.metrics.port
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    templates = {t["metadata"]["name"] for t in daemon["spec"]["volumeClaimTemplates"]}
    assert mounts[config.daemon.state_dir] in templates, "the daemon's state must survive the pod"
    assert config.daemon.checkpoint_dir in mounts and "/data" in mounts and "/etc/alma" in mounts


@pytest.mark.parametrize(
    "manifests,server", [(torchserve_manifests, "alma-torchserve"), (kserve_manifests, "alma-kserve")]
)
def test_k8s_commands_parse_and_volumes_exist(manifests, server):
    paths = manifests()
    configmaps = {c["metadata"]["name"] for c in k8s_objects("ConfigMap", paths)}
    claims = {c["metadata"]["name"] for c in k8s_objects("PersistentVolumeClaim", paths)}
    daemon_config = k8s_config(paths)
    for kind, name in (("StatefulSet", "alma-daemon"), ("Deployment", server)):
        (workload,) = [w for w in k8s_objects(kind, paths) if w["metadata"]["name"] == name]
        spec = workload["spec"]["template"]["spec"]
        templates = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for mount in spec["containers"][0]["volumeMounts"]:
            volume = volumes.get(mount["name"])
            if volume is None:
                assert mount["name"] in templates, f"{name} mounts unknown volume {mount['name']}"
            elif "configMap" in volume:
                assert volume["configMap"]["name"] in configmaps
            elif "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims
        # Kubernetes expands $(VAR) in args from the container's env, and leaves it as is when VAR
        # is not defined there; give each one a plausible value.
        container = spec["containers"][0]
        env = {e["name"] for e in container.get("env", [])}
        argv = []
        for arg in container["args"]:
            for variable in re.findall(r"\$\((\w+)\)", arg):
                assert variable in env, f"{name}: args use $({variable}), which the container's env lacks"
                arg = arg.replace(f"$({variable})", "redis://:secret@redis:6379/0")
            argv.append(arg)
        args = parse_alma(argv)
        assert args.config == CONFIG_IN_CONTAINER
        assert mounts_configmap(spec, CONFIG_IN_CONTAINER)
        config = build_config(k8s_config_data(paths), args.overrides)
        if args.command != "serve":
            assert args.command == "run"
        elif args.kind == "kserve":
            # `alma serve --kind kserve` listens on serving.inference_url's port, all interfaces, and
            # its repository wants the token the daemon reads, from the same Secret.
            assert config.serving.kind == "kserve" and args.foreground and config.serving.bind_host == "0.0.0.0"
            token = config.serving.repository_token_file
            assert token and secret_behind(spec, token) == "alma-kserve-token"
            assert token == daemon_config.serving.repository_token_file
            ports = {p["containerPort"] for p in container["ports"]}
            assert port_of(config.serving.inference_url) == port_of(daemon_config.serving.inference_url)
            assert port_of(config.serving.inference_url) in ports
        else:
            for key in ("management_url", "inference_url", "metrics_url"):
                assert urlsplit(getattr(config.serving, key)).hostname == "0.0.0.0"
                assert port_of(getattr(config.serving, key)) == port_of(getattr(daemon_config.serving, key))


def test_k8s_kserve_config_is_the_config_but_for_serving_and_points_at_the_kserve_service():
    torchserve, kserve = k8s_config_data(), k8s_config_data(kserve_manifests())
    assert {k: v for k, v in torchserve.items() if k != "serving"} == {
        k: v for k, v in kserve.items() if k != "serving"
    }
    config = build_config(kserve)
    assert config.serving.kind == "kserve"
    (service,) = [s for s in k8s_objects("Service", kserve_manifests()) if s["metadata"]["name"] == "alma-kserve"]
    assert urlsplit(config.serving.inference_url).hostname == "alma-kserve.alma.svc.cluster.local"
    assert port_of(config.serving.inference_url) in {p["port"] for p in service["spec"]["ports"]}
    (deployment,) = k8s_objects("Deployment", kserve_manifests())
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    # The server's probes: the server's health, not the model's (the daemon publishes through the Service).
    container = k8s_container("Deployment", "alma-kserve", kserve_manifests())
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["path"] in ("/v2/health/live", "/v2/health/ready")


def test_k8s_inferenceservice_runs_the_kserve_server_over_the_daemons_model_store():
    paths = kserve_manifests("inferenceservice.yaml")
    (service,) = k8s_objects("InferenceService", paths)
    assert service["apiVersion"] == "serving.kserve.io/v1beta1"
    assert service["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"
    predictor = service["spec"]["predictor"]
    assert predictor["minReplicas"] == predictor["maxReplicas"] == 1, "one server holds what the daemon loaded"
    (container,) = predictor["containers"]
    assert container["name"] == "kserve-container"
    assert container["command"] == ["tini", "--", "python", "-m", "serving.runtimes.kserve_server"]
    options = dict(zip(container["args"][::2], container["args"][1::2], strict=True))
    usage = subprocess.run(
        [sys.executable, "-m", "serving.runtimes.kserve_server", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    assert all(option in usage.split() for option in options), f"{sorted(options)} against:\n{usage}"
    config = k8s_config(paths)
    assert options["--model-name"] == config.serving.model_name
    # Every interface of the pod; the repository closed with the daemon's token, from the same Secret.
    assert options["--host"] == "0.0.0.0"
    assert options["--repository-token-file"] == config.serving.repository_token_file
    assert secret_behind(predictor, options["--repository-token-file"]) == "alma-kserve-token"
    (statefulset_spec,) = [s["spec"]["template"]["spec"] for s in k8s_objects("StatefulSet", paths)]
    assert secret_behind(statefulset_spec, config.serving.repository_token_file) == "alma-kserve-token"
    (port,) = container["ports"]
    assert int(options["--http-port"]) == port["containerPort"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] == port["containerPort"]
    # The model store the daemon writes, at the same path, from the same ReadWriteMany claim.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in predictor["volumes"]}
    claim = volumes[mounts[options["--model-store"]]]["persistentVolumeClaim"]["claimName"]
    assert options["--model-store"] == config.daemon.checkpoint_dir
    daemon = k8s_container("StatefulSet", "alma-daemon", paths)
    (statefulset,) = k8s_objects("StatefulSet", paths)
    daemon_volumes = {v["name"]: v for v in statefulset["spec"]["template"]["spec"]["volumes"]}
    daemon_mount = next(m for m in daemon["volumeMounts"] if m["mountPath"] == config.daemon.checkpoint_dir)
    assert daemon_volumes[daemon_mount["name"]]["persistentVolumeClaim"]["claimName"] == claim
    (pvc,) = [c for c in k8s_objects("PersistentVolumeClaim", paths) if c["metadata"]["name"] == claim]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    # The daemon reaches it at KServe's predictor Service, which the config names for this case.
    predictor_url = f"http://{service['metadata']['name']}-predictor.alma.svc.cluster.local"
    assert f"inference_url: {predictor_url}\n" in (K8S_KSERVE / "10-config.yaml").read_text()


def test_k8s_daemon_reads_its_passwords_from_mounted_secrets():
    (daemon,) = [s for s in k8s_objects("StatefulSet") if s["metadata"]["name"] == "alma-daemon"]
    spec = daemon["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert not any("valueFrom" in e for e in container.get("env", [])), "secrets come as files, not variables"
    redis = k8s_config().redis
    assert urlsplit(redis.url).password is None, "a password in redis.url would sit in the ConfigMap"
    assert secret_behind(spec, redis.password_file) == "alma-redis"
    # The files docs/deploy.md has the Kafka keys name for a TLS + SCRAM cluster are mounted, optionally.
    guide = (ROOT / "docs" / "deploy.md").read_text()
    for path, secret in (
        ("/var/run/secrets/alma/kafka/password", "alma-kafka"),
        ("/var/run/secrets/alma/kafka-ca/ca.crt", "alma-kafka-ca"),
    ):
        assert path in guide and secret_behind(spec, path) == secret
    optional = {v["secret"]["secretName"] for v in spec["volumes"] if v.get("secret", {}).get("optional")}
    # The model repository's token is KServe's stack's only (deploy/k8s/kserve/).
    assert optional == {"alma-kafka", "alma-kafka-ca", "alma-kserve-token"}
