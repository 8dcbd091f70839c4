"""What the deployment and observability guides tell a user to type, checked against the real thing.

tests/test_deploy.py checks that the files of deploy/ fit together, tests/test_dashboard.py the
dashboard. This module checks the prose around them: every ``alma`` command of docs/deploy.md parses
with the real ``alma`` parser (also through ``docker run``, ``docker compose exec`` and
``kubectl exec``) and its ``--set`` overrides load, every config key the guides name exists,
every ``docker compose`` command names the stack's compose file and every
compose file the guide asks for, docs/observability.md's metric table is the registry's catalogue
(names, types, labels), and its PromQL and the dashboard's apply ``rate()`` and ``increase()`` to
counters only and pass ``promtool``. The Kubernetes pods ask to be scraped where compose's
Prometheus scrapes them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from alma_daemon import metrics
from alma_daemon.cli import build_parser
from alma_daemon.config import Config, load_config
from alma_daemon.config.measure_traits import measure_traits
from tests.helpers.team_records import metrics_of_a_team

ROOT = Path(__file__).resolve().parents[1]
DEPLOY_GUIDE = ROOT / "docs" / "deploy.md"
OBSERVABILITY_GUIDE = ROOT / "docs" / "observability.md"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "alma.json"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus.yml"
ALERT_RULES = ROOT / "deploy" / "prometheus-alerts.yml"
STACK = "deploy/docker-compose.yml"
#: ``docker run`` options the guide uses that take a value; any other option fails the test, so that
#: the split between docker's arguments and the image's stays exact.
DOCKER_RUN_VALUE_OPTIONS = {"-v", "--volume", "-p", "--publish", "--name", "-e", "--env", "--network", "--gpus"}
DOCKER_RUN_FLAGS = {"--rm", "-d", "--detach", "-i", "-t", "-it", "--init"}
#: PromQL functions whose argument must be a counter (or a histogram's series, which are counters).
COUNTER_FUNCTIONS = ("rate", "irate", "increase")


# -- reading the guides ---------------------------------------------------------------------------
def fenced_blocks(path: Path, languages: tuple[str, ...]) -> list[str]:
    return re.findall(rf"^```(?:{'|'.join(languages)})\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def shell_commands(path: Path) -> list[list[str]]:
    """The commands of the guide's shell blocks, as argv lists: continuation lines joined, comments
    dropped, pipelines and ``&&`` lists split into their commands."""
    commands = []
    for block in fenced_blocks(path, ("bash", "sh")):
        # A line ending in a backslash or a pipe goes on on the next line.
        for line in re.sub(r"(\\|\|)\n\s*", lambda m: " " if m.group(1) == "\\" else "| ", block).splitlines():
            command: list[str] = []
            for token in shlex.split(line, comments=True):
                if token in ("|", "&&", "||", ";"):
                    commands.append(command)
                    command = []
                else:
                    command.append(token)
            commands.append(command)
    # Leading VAR=value assignments set the command's environment; the command follows them.
    commands = [list(itertools.dropwhile(lambda token: re.fullmatch(r"\w+=.*", token), c)) for c in commands]
    return [c for c in commands if c]


def inline_code(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", text)


def image_files() -> dict[str, Path]:
    """Container path -> repository path of what the Dockerfile copies into the image's /etc/alma."""
    copies = {}
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"] and not any(p.startswith("--from=") for p in parts) and len(parts) == 3:
            copies[parts[2]] = ROOT / parts[1]
    return copies


def in_image(container_path: str) -> Path | None:
    for target, source in image_files().items():
        if container_path == target:
            return source
        if container_path.startswith(target.rstrip("/") + "/"):
            return source / container_path[len(target.rstrip("/")) + 1 :]
    return None


def alma_argv(command: list[str]) -> tuple[str, list[str]] | None:
    """(how it runs, the argv ``alma`` is given) for a command that runs alma; None for others."""
    if command[0] == "alma":
        return "alma", command[1:]
    if command[:2] == ["docker", "run"]:
        rest = command[2:]
        while rest and rest[0].startswith("-"):
            option = rest.pop(0)
            if option in DOCKER_RUN_VALUE_OPTIONS:
                rest.pop(0)
            else:
                assert option in DOCKER_RUN_FLAGS, f"`{shlex.join(command)}`: unknown docker run option {option}"
        image, args = rest[0], rest[1:]
        # The image's ENTRYPOINT runs alma (under tini); no arguments run its CMD.
        return ("docker run", args) if re.search(r"(^|/)alma-daemon(:|$)", image) else None
    if command[:2] == ["docker", "compose"] and "exec" in command:
        service_and_command = command[command.index("exec") + 1 :]
        return ("docker compose exec", service_and_command[2:]) if service_and_command[1:2] == ["alma"] else None
    if command[0] == "kubectl" and "--" in command:
        after = command[command.index("--") + 1 :]
        return ("kubectl exec", after[1:]) if after[:1] == ["alma"] else None
    return None


def parse_alma(argv: list[str]):
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exit:
        if exit.code == 0:  # --help
            return None
        pytest.fail(f"`alma {shlex.join(argv)}` is rejected by the alma command line")


# -- docs/deploy.md -------------------------------------------------------------------------------
def test_every_alma_command_of_the_deploy_guide_parses():
    runs = [found for command in shell_commands(DEPLOY_GUIDE) if (found := alma_argv(command))]
    assert {how for how, _ in runs} == {"docker run", "docker compose exec", "kubectl exec"}
    for how, argv in runs:
        args = parse_alma(argv)
        config = getattr(args, "config", None)
        if how in ("docker run", "docker compose exec") and config:
            # What a bare `docker run` reads must come with the image (compose mounts the same file
            # over it), and the --set overrides must be keys and values the loader takes.
            source = in_image(config)
            assert source is not None and source.is_file(), f"`{shlex.join(argv)}`: {config} is not in the image"
            load_config(source, args.overrides)


def test_every_config_key_the_guides_name_exists():
    sections = {f.name: f.type for f in dataclasses.fields(Config)}
    named = 0
    for guide in (DEPLOY_GUIDE, OBSERVABILITY_GUIDE):
        for code in inline_code(guide):
            match = re.fullmatch(r"(?:--set )?([a-z_]+)\.([a-z_]+)(?:[:=].*)?", code)
            # learner.* and policy.* belong to the chosen plugin's own model (config/plugins.py).
            if match and match.group(1) in sections and match.group(1) not in ("learner", "policy"):
                section = getattr(Config(), match.group(1))
                assert match.group(2) in {f.name for f in dataclasses.fields(section)}, f"{guide.name}: `{code}`"
                named += 1
    assert named > 20


def compose_files(command: list[str]) -> list[str]:
    """The files of ``-f`` among compose's own options, before the subcommand (``logs -f`` follows)."""
    files, rest = [], command[2:]
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        assert option in ("-f", "--file", "--profile", "-p"), f"`{shlex.join(command)}`: unknown option {option}"
        value = rest.pop(0)
        if option in ("-f", "--file"):
            files.append(value)
    return files


def test_every_compose_command_of_the_deploy_guide_names_the_stack_and_each_file_it_asks_for():
    commands = [c for c in shell_commands(DEPLOY_GUIDE) if c[:2] == ["docker", "compose"]]
    # Inline commands too; a bare `docker compose exec` is a name, not a command.
    commands += [
        c for c in map(shlex.split, inline_code(DEPLOY_GUIDE)) if c[:2] == ["docker", "compose"] and len(c) > 3
    ]
    assert len(commands) > 10
    passed: set[str] = set()
    for command in commands:
        files = compose_files(command)
        # Compose finds a file by itself only in the current folder (and reads
        # docker-compose.override.yml only when no -f is given): the guide runs from the repository root.
        assert files[:1] == [STACK], f"`{shlex.join(command)}` does not name {STACK} first"
        passed |= set(files)
    # A compose file the guide asks the user to write (or ships) is used only if it is passed with -f.
    mentioned = set(re.findall(r"deploy/docker-compose[\w.-]*\.yml", DEPLOY_GUIDE.read_text()))
    assert mentioned <= passed, f"compose files the guide names but never passes with -f: {mentioned - passed}"
    # Every file passed ships, but the one whose content the guide gives for a GPU host to write.
    assert {path for path in passed if not (ROOT / path).is_file()} <= {"deploy/docker-compose.gpu.yml"}


# -- metric names and types -----------------------------------------------------------------------
def exposition() -> str:
    """/metrics as a team's stream has it: every family with its series (tests/helpers/team_records.py)."""
    with metrics_of_a_team():
        return generate_latest(metrics.REGISTRY).decode()


def exposed_families() -> dict[str, object]:
    """Sample name -> its family, as /metrics exposes them (counters with _total, histogram series)."""
    text = exposition()
    return {sample.name: family for family in text_string_to_metric_families(text) for sample in family.samples}


def is_counter_series(name: str, families: dict) -> bool:
    family = families[name]
    return family.type == "counter" or (family.type == "histogram" and name.endswith(("_bucket", "_sum", "_count")))


def check_promql(where: str, expr: str, families: dict) -> None:
    used = re.findall(r"\balma_\w+", expr)
    assert used, f"{where}: {expr} names no alma metric"
    for name in used:
        # Exported sample names: a histogram is queried through _bucket, _sum or _count.
        assert name in families, f"{where}: {name} is not exported"
    for function, name in re.findall(rf"\b({'|'.join(COUNTER_FUNCTIONS)})\(\s*(alma_\w+)", expr):
        assert is_counter_series(name, families), f"{where}: {function}() of {name}, a {families[name].type}"


def observability_queries() -> list[str]:
    (block,) = fenced_blocks(OBSERVABILITY_GUIDE, ("promql",))
    return [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]


def dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    found = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    return found + [(a["name"], a["expr"]) for a in dashboard["annotations"]["list"] if "expr" in a]


def test_dashboard_queries_take_rates_of_counters_only():
    families = exposed_families()
    for where, expr in dashboard_queries():
        check_promql(where, expr, families)


def test_the_observability_guides_queries_name_real_counters_and_pass_promtool(tmp_path):
    families = exposed_families()
    queries = observability_queries()
    assert len(queries) >= 3
    for expr in queries:
        check_promql("docs/observability.md", expr, families)
    rules = {
        "groups": [{"name": "guide", "rules": [{"record": f"guide:q{i}", "expr": q} for i, q in enumerate(queries)]}]
    }
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# -- alert rules ----------------------------------------------------------------------------------
def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERT_RULES.read_text())["groups"] for rule in group["rules"]]


def test_the_shipped_prometheus_loads_the_alert_rules_from_beside_its_config():
    """Prometheus looks a relative rule file up beside its config file: compose mounts it there, and
    ``promtool check config`` (tests/test_dashboard.py) finds it beside deploy/prometheus.yml."""
    assert yaml.safe_load(PROMETHEUS_CONFIG.read_text())["rule_files"] == [ALERT_RULES.name]
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    mounts = dict(m.split(":")[:2] for m in compose["services"]["prometheus"]["volumes"] if m.startswith("./"))
    folder = Path(mounts[f"./{PROMETHEUS_CONFIG.name}"]).parent
    assert mounts[f"./{ALERT_RULES.name}"] == str(folder / ALERT_RULES.name)


def test_the_alert_rules_name_exported_metrics_and_pass_promtool():
    families = exposed_families()
    rules = alert_rules()
    assert {rule["alert"] for rule in rules} == {"AlmaModelStale", "AlmaWindowedMeasureWorse"}
    for rule in rules:
        check_promql(rule["alert"], rule["expr"], families)
        assert rule["labels"]["severity"] and rule["annotations"]["summary"] and rule["annotations"]["description"]
    # The measure rule compares the other way round where higher is better: the measures named are those.
    (measure_rule,) = (rule for rule in rules if rule["alert"] == "AlmaWindowedMeasureWorse")
    higher = {name for name, traits in measure_traits().items() if traits.higher_is_better}
    for regex in re.findall(r'measure[!=]~"([^"]+)"', measure_rule["expr"]):
        assert set(regex.split("|")) == higher, regex
    if shutil.which("promtool"):
        result = subprocess.run(
            ["promtool", "check", "rules", str(ALERT_RULES)], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stdout + result.stderr


def alert_test(name: str, series: dict[str, str], expected: dict[str, list[dict[str, str]]]) -> dict:
    """A ``promtool test rules`` case: ``series`` (selector -> values) and, per evaluation time, the
    labels of each alert ``name`` firing then."""
    return {
        "interval": "1m",
        "input_series": [{"series": selector, "values": values} for selector, values in series.items()],
        "alert_rule_test": [
            {"eval_time": at, "alertname": name, "exp_alerts": [{"exp_labels": labels} for labels in firing]}
            for at, firing in expected.items()
        ],
    }


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (apt-get install prometheus)")
def test_the_alerts_fire_once_the_bound_or_the_baseline_is_passed_for_an_hour(tmp_path):
    """The rules run by ``promtool test rules`` on made-up series (one a minute, 200 minutes): their
    expressions, ``for`` and labels (the annotations are ``promtool check rules``' business, above)."""
    groups = yaml.safe_load(ALERT_RULES.read_text())["groups"]
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    stale = {"severity": "warning", "bound": "chunks"}
    overdue = {"severity": "warning", "bound": "seconds"}
    worse = {"severity": "warning"}
    tests = [
        # In chunks: at the bound (not under it, not with no bound set), for an hour.
        alert_test(
            "AlmaModelStale",
            {
                'alma_model_age_chunks{instance="at"}': "5x200",
                'alma_freshness_bound_chunks{instance="at"}': "5x200",
                'alma_model_age_chunks{instance="under"}': "4x200",
                'alma_freshness_bound_chunks{instance="under"}': "5x200",
                'alma_model_age_chunks{instance="unbounded"}': "9x200",
                'alma_freshness_bound_chunks{instance="unbounded"}': "NaN+0x200",
            },
            {"30m": [], "70m": [{"instance": "at", **stale}]},
        ),
        # In seconds: the last stage at Unix time 0 and a bound of 10 min, so the bound is passed from
        # minute 10 on; it fires an hour later, and only with chunks waiting.
        alert_test(
            "AlmaModelStale",
            {
                'alma_last_stage_timestamp_seconds{instance="waiting"}': "0x200",
                'alma_freshness_bound_seconds{instance="waiting"}': "600x200",
                'alma_model_age_chunks{instance="waiting"}': "1x200",
                'alma_last_stage_timestamp_seconds{instance="idle"}': "0x200",
                'alma_freshness_bound_seconds{instance="idle"}': "600x200",
                'alma_model_age_chunks{instance="idle"}': "0x200",
            },
            {"60m": [], "80m": [{"instance": "waiting", **overdue}]},
        ),
        # What users saw lately against the input-blind baseline, each measure its way round.
        alert_test(
            "AlmaWindowedMeasureWorse",
            {
                'alma_prequential_window_measure{instance="a", measure="error"}': "0.05x200",
                'alma_baseline_measure{instance="a", measure="error"}': "0.02x200",
                'alma_prequential_window_measure{instance="b", measure="error"}': "0.01x200",
                'alma_baseline_measure{instance="b", measure="error"}': "0.02x200",
                'alma_prequential_window_measure{instance="c", measure="recall"}': "0x200",
                'alma_baseline_measure{instance="c", measure="recall"}': "0x200",
                'alma_prequential_window_measure{instance="d", measure="recall"}': "0.5x200",
                'alma_baseline_measure{instance="d", measure="recall"}': "0x200",
                'alma_prequential_window_measure{instance="e", measure="error"}': "0.05x200",
                'alma_baseline_measure{instance="e", measure="error"}': "NaN+0x200",
            },
            {
                "30m": [],
                "70m": [
                    {"instance": "a", "measure": "error", **worse},
                    {"instance": "c", "measure": "recall", **worse},
                ],
            },
        ),
    ]
    (tmp_path / "tests.yml").write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "tests": tests}))
    result = subprocess.run(
        ["promtool", "test", "rules", str(tmp_path / "tests.yml")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def metric_table() -> dict[str, tuple[str, dict[str, list[str]]]]:
    """docs/observability.md's table: metric -> (type, {label: values listed, or [] where it links})."""
    rows = {}
    for line in OBSERVABILITY_GUIDE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and re.fullmatch(r"`alma_\w+`", cells[0]):
            labels = {}
            for name, values in re.findall(r"`(\w+)` = ([^;]*)", cells[2]):
                labels[name] = re.findall(r"`([^`]+)`", values)
            rows[cells[0].strip("`")] = (cells[1], labels)
    return rows


def test_the_observability_guides_metric_table_is_the_registry():
    table = metric_table()
    text = exposition()
    catalogue = {}
    for family in text_string_to_metric_families(text):
        exposed = family.name + "_total" if family.type == "counter" else family.name
        labels: dict[str, set[str]] = {}
        for sample in family.samples:
            for name, value in sample.labels.items():
                if name != "le":
                    labels.setdefault(name, set()).add(value)
        catalogue[exposed] = (family.type, labels)
    assert set(table) == set(catalogue), set(table) ^ set(catalogue)
    for metric, (kind, labels) in table.items():
        assert kind == catalogue[metric][0], f"{metric}: the guide says {kind}, the registry {catalogue[metric][0]}"
        assert set(labels) == set(catalogue[metric][1]), f"{metric}: labels {set(labels)}"
        for name, values in labels.items():
            if values:
                assert set(values) == catalogue[metric][1][name], f"{metric}{{{name}}}: {values}"


def seconds(duration: str) -> float:
    """A PromQL duration of one unit (``90s``, ``15m``, ``1h``) in seconds."""
    number, unit = re.fullmatch(r"(\d+)([smhd])", duration).groups()
    return int(number) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


def test_the_share_of_time_training_averages_over_the_longest_stage_the_histogram_measures():
    """A stage's seconds reach the histogram's _sum when the stage ends, so over a window W the rate
    shows a stage of length L as L / W: a share stays below 100% only with W at least the longest
    stage. The histogram's top finite bucket is the longest stage it is meant to measure."""
    dashboard = json.loads(DASHBOARD.read_text())
    shares = [
        target["expr"]
        for panel in dashboard["panels"]
        if panel.get("fieldConfig", {}).get("defaults", {}).get("unit") == "percentunit"
        for target in panel.get("targets", [])
        if "alma_train_duration_seconds_sum" in target["expr"]
    ]
    assert shares, "no panel shows the share of time spent training"
    longest = max(
        float(sample.labels["le"])
        for family in text_string_to_metric_families(generate_latest(metrics.REGISTRY).decode())
        for sample in family.samples
        if sample.name == "alma_train_duration_seconds_bucket" and sample.labels["le"] != "+Inf"
    )
    for expr in shares:
        (window,) = re.findall(r"alma_train_duration_seconds_sum\{[^}]*\}\[([^\]]+)\]", expr)
        assert not window.startswith("$") and seconds(window) >= longest, f"{expr}: window {window} < {longest:g} s"


def test_k8s_pods_with_a_metrics_port_ask_to_be_scraped_on_it():
    """Compose's Prometheus scrapes the daemon and the model server; the pods say the same to a
    Prometheus that discovers pods by annotation, on the port the container names for metrics, or,
    for KServe's model server (its /metrics beside inference), on its one port."""
    scraped = set()
    for path in sorted((ROOT / "deploy" / "k8s").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc["kind"] not in ("Deployment", "StatefulSet", "InferenceService"):
                continue
            if doc["kind"] == "InferenceService":  # a pod template of KServe's own shape
                pod, annotations = doc["spec"]["predictor"], doc["spec"]["predictor"].get("annotations", {})
            else:
                pod, annotations = (
                    doc["spec"]["template"]["spec"],
                    doc["spec"]["template"]["metadata"].get("annotations", {}),
                )
            (container,) = pod["containers"]
            ports = {p["name"]: p["containerPort"] for p in container["ports"] if p["name"].endswith("metrics")}
            if not ports:
                ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            assert len(ports) == 1, f"{doc['metadata']['name']}: metrics ports {ports}"
            assert annotations.get("prometheus.io/scrape") == "true", doc["metadata"]["name"]
            assert annotations["prometheus.io/port"] == str(*ports.values()), doc["metadata"]["name"]
            assert annotations.get("prometheus.io/path", "/metrics") == "/metrics"
            scraped.add(doc["metadata"]["name"])
    assert scraped == {"alma-daemon", "alma-torchserve", "alma-kserve", "alma"}
