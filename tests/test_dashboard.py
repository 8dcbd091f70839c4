"""The Grafana dashboard and the Prometheus configs of deploy/.

Grafana is not installable here, so the dashboard is checked in two ways: its JSON model is
checked for structure (datasource uids, ids, layout, metric names), and every query of every panel,
annotation and variable is run against a real Prometheus scraping a real exporter while a real
engine replays a small stream: the paper's (MNIST, the error rate), and for the panels of the task's
measure a team's (a binary River stream judged by recall, with its baseline and other measures).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from alma_daemon import metrics
from alma_daemon.config import build_config
from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.observability.exporter import MetricsObserver, start_exporter
from alma_daemon.research.simulate import run_simulation
from tests.helpers.data import TINY_MNIST as TINY
from tests.helpers.servers import PrometheusServer, http_request
from tests.helpers.team_records import forget_measures, metrics_of_a_team

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
GRAFANA = DEPLOY / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
#: Grafana 9.4 (36) to 11.x (41) read these JSON models without migrating them.
SCHEMA_VERSIONS = range(36, 42)
#: Panels allowed to hold only NaN on an image-classification stream in process: perplexity is for
#: LMs, server reachability for the daemon, the policy's estimates for the adaptive and forecast policies.
NAN_PANELS = {
    "Perplexity (language models)",
    "Servers reachable (Redis, Kafka)",
    "Policy: live and previous model's error",
    "Policy: stage gain, drift score, wait",
    "Policy (forecast): learning curve, wait ratio, forecast gain",
}
#: The row of the task's measure (task.measure): its panels show any measure, the error rate's too.
MEASURE_ROW = "The task's measure (task.measure)"
#: Queries (panel, refId) allowed to hold only NaN on the paper's stream: its task records no baseline.
PAPER_NAN_QUERIES = {
    ("The task's measure and its baseline", "C"),
    # The paper's images have no reference learner (docs/results.md, "The reference learner").
    ("Prequential measure, latest chunk and last chunks", "C"),
    ("Prequential measure, latest chunk and last chunks", "D"),
    # The stream sets a bound in chunks only (BOUND_CHUNKS): the one in seconds is NaN from its first
    # step, and only a scrape that came before it saw the gauge's initial 0.
    ("Model age (time)", "B"),
}
#: The row of an endless stream's freshness: what users saw lately, the model's age and its bound.
FRESHNESS_ROW = "Freshness: what users saw lately, the model's age"
#: The scraped paper stream's freshness bound in chunks, so that its line has numbers (unset by default).
#: The greedy policy trains every chunk, so it never forces a stage.
BOUND_CHUNKS = 3
#: And a bound in examples that never binds (the stream's chunks are far smaller), for its line's numbers.
BOUND_EXAMPLES = 10**6
#: Label values each labelled family must show in full (from alma_daemon.metrics' fixed vocabularies).
KNOWN_VALUES = {
    "set": metrics.ERROR_SETS,
    "kind": metrics.UPDATE_KINDS,
    "action": metrics.DECISION_ACTIONS,
    "stage": metrics.SWAP_STAGES,
    "reason": metrics.REJECT_REASONS,
    "server": metrics.SERVERS,
}


def load_dashboards() -> list[dict]:
    return [json.loads(path.read_text()) for path in DASHBOARDS]


def datasource_uids() -> set[str]:
    uids = set()
    for path in (GRAFANA / "provisioning" / "datasources").glob("*.y*ml"):
        uids |= {ds["uid"] for ds in yaml.safe_load(path.read_text())["datasources"]}
    return uids


def query_panels(dashboard: dict) -> list[dict]:
    return [panel for panel in dashboard["panels"] if panel["type"] != "row"]


def row_panels(dashboard: dict, row: str) -> list[dict]:
    """The panels under the row titled ``row``, up to the next row."""
    panels = sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == row)
    end = next((i for i, p in enumerate(panels[start + 1 :], start + 1) if p["type"] == "row"), len(panels))
    return panels[start + 1 : end]


def run_measures(results: dict) -> set[str]:
    """The measure a run was judged by and its other measures: what ``{{measure}}`` legends may show."""
    series = results["series"]
    details = {name for row in series for on in ("test", "prequential") for name in row.get(f"{on}_measures", {})}
    return {results["summary"]["measure"], *details}


def queries(dashboard: dict) -> list[tuple[str, dict]]:
    """(where, target) for every PromQL expression: panel targets and Prometheus annotations."""
    found = [(panel["title"], target) for panel in query_panels(dashboard) for target in panel["targets"]]
    found += [(f"annotation {a['name']}", a) for a in dashboard["annotations"]["list"] if "expr" in a]
    return found


# ------------------------------------------------------------------------------------- structure


def test_there_is_a_dashboard():
    assert [p.name for p in DASHBOARDS] == ["alma.json"]


@pytest.mark.parametrize("dashboard", load_dashboards(), ids=[p.name for p in DASHBOARDS])
def test_dashboard_model_is_well_formed(dashboard):
    assert dashboard["schemaVersion"] in SCHEMA_VERSIONS
    assert dashboard["uid"] and dashboard["title"]
    uids = datasource_uids()
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"

    for panel in query_panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": panel["datasource"]["uid"]}, panel["title"]
        assert panel["datasource"]["uid"] in uids, panel["title"]
        assert panel["targets"], panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] in uids and target["expr"].strip(), panel["title"]
    for annotation in dashboard["annotations"]["list"]:
        if "expr" in annotation:
            assert annotation["datasource"]["uid"] in uids, annotation["name"]
    for variable in dashboard["templating"]["list"]:
        assert variable["datasource"]["uid"] in uids, variable["name"]


@pytest.mark.parametrize("dashboard", load_dashboards(), ids=[p.name for p in DASHBOARDS])
def test_panels_tile_the_24_column_grid_without_overlap(dashboard):
    taken: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and 0 <= g["x"] and g["x"] + g["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


@pytest.mark.parametrize("dashboard", load_dashboards(), ids=[p.name for p in DASHBOARDS])
def test_every_metric_the_dashboard_names_is_exported(dashboard):
    with metrics_of_a_team():
        exported = {
            sample.name
            for family in text_string_to_metric_families(generate_latest(metrics.REGISTRY).decode())
            for sample in family.samples
        }
    used = {name for _, target in queries(dashboard) for name in re.findall(r"\balma_[a-z_]+", target["expr"])}
    assert used and used <= exported, used - exported
    # Every metric of the catalogue is shown somewhere (histograms through their series).
    families = {family.name for family in metrics.REGISTRY.collect()}
    shown = {family for family in families if any(name.startswith(family) for name in used)}
    assert shown == families


def test_the_freshness_row_shows_the_windowed_measure_and_the_models_age_against_its_bound():
    (dashboard,) = load_dashboards()
    panels = {p["title"]: p for p in row_panels(dashboard, FRESHNESS_ROW)}
    assert set(panels) == {
        "Prequential measure, latest chunk and last chunks",
        "Model age (chunks)",
        "Model age (time)",
    }
    windowed = [t["expr"] for t in panels["Prequential measure, latest chunk and last chunks"]["targets"]]
    assert any("alma_prequential_window_measure" in e for e in windowed)
    assert any('alma_task_measure{instance="$instance", set="prequential"}' == e for e in windowed)
    for title, age, bound in (
        ("Model age (chunks)", "alma_model_age_chunks", "alma_freshness_bound_chunks"),
        ("Model age (time)", "time() - alma_last_stage_timestamp_seconds", "alma_freshness_bound_seconds"),
    ):
        panel = panels[title]
        (age_target,) = (t for t in panel["targets"] if t["expr"].startswith(age))
        (bound_target,) = (t for t in panel["targets"] if t["expr"].startswith(bound))
        # The bound is a dashed red line: an override matching its legend, and not the age's.
        (override,) = panel["fieldConfig"]["overrides"]
        pattern = override["matcher"]["options"]
        assert re.search(pattern, bound_target["legendFormat"]) and not re.search(pattern, age_target["legendFormat"])
        properties = {p["id"]: p["value"] for p in override["properties"]}
        assert properties["custom.lineStyle"]["fill"] == "dash"
        assert properties["color"] == {"mode": "fixed", "fixedColor": "red"}
    assert panels["Model age (time)"]["fieldConfig"]["defaults"]["unit"] == "s"


def test_provisioning_points_grafana_at_the_dashboards():
    (provider,) = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "alma.yml").read_text())["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]
    (datasource,) = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert datasource["type"] == "prometheus" and datasource["url"].startswith("http://")


def test_deploy_prometheus_config_is_valid_and_scrapes_daemon_and_torchserve():
    result = subprocess.run(
        ["promtool", "check", "config", str(DEPLOY / "prometheus.yml")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {"alma", "torchserve"} <= jobs
    datasource = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    # $__rate_interval is derived from the datasource's interval: it must be the real scrape interval.
    assert datasource["datasources"][0]["jsonData"]["timeInterval"] == config["global"]["scrape_interval"]


# ----------------------------------------------------------------------------------- live queries


class ScrapeBarrier(EngineObserver):
    """Holds the engine after each chunk until Prometheus has scraped the metrics of that chunk.

    Every chunk then has its own sample in the TSDB, as it would on a daemon whose chunks arrive
    minutes apart, and the test does not depend on how fast the machine trains.
    """

    def __init__(self, prometheus: PrometheusServer, timeout: float = 30.0):
        self.prometheus = prometheus
        self.timeout = timeout

    def wait_for_scrape_after(self, moment: float) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            # The timestamp of ``up`` is the start of the latest scrape.
            result = self.prometheus.query('timestamp(up{job="alma"})')
            if result and float(result[0]["value"][1]) > moment:
                return
            time.sleep(0.1)
        raise TimeoutError(f"Prometheus did not scrape within {self.timeout} s")

    def on_step(self, record: dict, engine: Engine) -> None:
        self.wait_for_scrape_after(time.time())


class PublisherStandIn(EngineObserver):
    """Updates the serving metrics the way the publisher does on a live daemon (no serving here).

    Version 2 fails at the probe and version 3 is refused by the promotion guard, so the failure
    series and annotations have something to show; the other versions are promoted.
    """

    def on_checkpoint(self, version: int, path: str, checkpoint_metrics: dict, engine: Engine) -> None:
        if version == 2:
            metrics.SWAP_FAILURES.labels("probe").inc()
        elif version == 3:
            metrics.PROMOTIONS_REFUSED.inc()
        else:
            metrics.SWAP_DURATION.observe(0.2 * version)
            metrics.SWAPS.inc()
            metrics.LIVE_VERSION.set(version)


def query_range(prometheus: PrometheusServer, promql: str, start: float, end: float) -> list[dict]:
    url = f"{prometheus.url}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": promql, "start": start, "end": end, "step": 1}
    )
    status, body = http_request("GET", url)
    answer = json.loads(body)
    assert status == 200 and answer["status"] == "success", (promql, answer)
    return answer["data"]["result"]


def grafana_substitute(expr: str, instance: str, range_seconds: int) -> str:
    # What Grafana sends for a 1 s scrape interval and 1 s step: $__rate_interval is
    # max($__interval + scrape interval, 4 x scrape interval).
    return (
        expr.replace("$__rate_interval", "4s")
        .replace("$__interval", "1s")
        .replace("$__range", f"{range_seconds}s")
        .replace("$instance", instance)
    )


def finite_values(series: list[dict]) -> list[float]:
    values = [v for s in series for _, v in s.get("values", [s.get("value")])]
    return [float(v) for v in values if math.isfinite(float(v))]


def scrape_a_stream(tmp_path_factory, config):
    """A real engine replaying ``config``'s stream into an exporter that a real Prometheus scrapes every
    second; yields (prometheus, its target, results, start, end, the FLOPs counter before)."""
    forget_measures()  # an earlier test's measure is not this stream's
    with start_exporter(0) as exporter:
        target = f"127.0.0.1:{exporter.port}"
        prometheus = PrometheusServer(tmp_path_factory.mktemp("prometheus"), [target])
        prometheus.start()
        try:
            barrier = ScrapeBarrier(prometheus)
            start = time.time()
            barrier.wait_for_scrape_after(0)  # the state before the stream is in the TSDB too
            before = prometheus.query("alma_train_flops_total")
            run = tmp_path_factory.mktemp("run")
            results = run_simulation(
                config,
                run / "results",
                progress=False,
                checkpoint_dir=run / "model_store",
                observers=[MetricsObserver(in_process_source=True), PublisherStandIn(), barrier],
            )
            yield prometheus, target, results, start, time.time(), float(before[0]["value"][1])
        finally:
            prometheus.stop()


@pytest.fixture(scope="module")
def scraped_stream(tmp_path_factory):
    """The paper's stream (4 MNIST chunks), scraped by a real Prometheus.

    Module-scoped (one Prometheus for both live tests), hence PrometheusServer rather than the
    function-scoped ``prometheus_server`` factory; the exporter stays up until the tests are done.
    """
    config = build_config(
        {},
        [*TINY, f"policy.max_model_age_chunks={BOUND_CHUNKS}", f"policy.max_model_age_examples={BOUND_EXAMPLES}"],
    )
    yield from scrape_a_stream(tmp_path_factory, config)


@pytest.fixture(scope="module")
def scraped_team_stream(tmp_path_factory):
    """A team's stream: River's binary Agrawal stream judged by the recall of its second class, scraped
    by a real Prometheus (after the paper's stream's tests, which its measure would confuse)."""
    pytest.importorskip("river", reason="River is not installed: pip install -e '.[river]' (CI installs it)")
    config = build_config(
        {
            "dataset": {"name": "river", "river_stream": "agrawal", "river_examples": 1200},
            "stream": {"megabatches": 4, "seed": 0},
            "task": {"measure": "recall", "classes": ["ok", "fraud"]},
            "train": {"epochs": 2},
            "device": "cpu",
        }
    )
    yield from scrape_a_stream(tmp_path_factory, config)


@pytest.mark.integration
def test_every_dashboard_query_returns_data_from_a_live_engine(scraped_stream):
    prometheus, target, results, start, end, flops_before = scraped_stream
    (dashboard,) = load_dashboards()

    (variable,) = dashboard["templating"]["list"]
    metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["definition"]).groups()
    status, body = http_request("GET", f"{prometheus.url}/api/v1/label/{label}/values?match[]={metric}")
    assert status == 200 and json.loads(body)["data"] == [target]

    for where, query in queries(dashboard):
        series = run_query(prometheus, query, target, start, end, results)
        if where not in NAN_PANELS and (where, query.get("refId")) not in PAPER_NAN_QUERIES:
            assert finite_values(series), f"{where}: {query['expr']} holds no number"


def run_query(prometheus: PrometheusServer, query: dict, target: str, start: float, end: float, results: dict):
    """The series a dashboard query gives over the stream, checked for shape: some series, each legend
    label showing its whole vocabulary (the measure's: the run's measures), one series if none."""
    span = math.ceil(end - start) + 2
    expr = grafana_substitute(query["expr"], target, span)
    if query.get("instant"):
        series = prometheus.query(expr)
    else:
        series = query_range(prometheus, expr, start - 1, end + 1)
    assert series, f"{expr} returned nothing"
    legend_labels = re.findall(r"{{\s*(\w+)\s*}}", query.get("legendFormat", ""))
    for name in legend_labels:
        shown = {s["metric"].get(name) for s in series}
        if name == "measure":
            assert shown and shown <= run_measures(results), f"{expr}: {name} = {shown}"
        else:
            assert shown == set(KNOWN_VALUES[name]), f"{expr}: {name} = {shown}"
    if not legend_labels:
        assert len(series) == 1, f"{expr} gave {len(series)} series for one daemon"
    return series


@pytest.mark.integration
def test_prometheus_holds_the_engine_numbers(scraped_stream):
    prometheus, _, results, start, end, flops_before = scraped_stream
    series, summary = results["series"], results["summary"]

    def history(expr: str) -> list[float]:
        (result,) = query_range(prometheus, expr, start - 1, end + 1)
        return [float(v) for _, v in result["values"]]

    # Each chunk was scraped (ScrapeBarrier), so each chunk's value is in the TSDB.
    assert {r["test_error"] for r in series} <= set(history('alma_error_ratio{set="test"}'))
    assert {r["prequential_error"] for r in series} <= set(history('alma_error_ratio{set="prequential"}'))
    assert history("alma_cumulative_error")[-1] == pytest.approx(summary["cer"])
    assert history("alma_train_flops_total")[-1] - flops_before == summary["cumulative_train_flops"]
    assert history("alma_cumulative_parameters")[-1] == summary["cumulative_parameters"]
    assert history("alma_model_version")[-1] == summary["stages"] == 4
    assert history("alma_live_model_version")[-1] == 4
    assert {r["prequential_window_error"] for r in series} <= set(
        history('alma_prequential_window_measure{measure="error"}')
    )
    assert history("alma_model_age_chunks")[-1] == series[-1]["model_age_chunks"] == 0
    assert history("alma_freshness_bound_chunks")[-1] == BOUND_CHUNKS
    # A simulation leaves the bound in seconds out (no arrival times): NaN, which Prometheus keeps.
    assert math.isnan(history("alma_freshness_bound_seconds")[-1])
    # The age in time keeps rising after the last chunk: the stored timestamp stays, time() does not.
    (after,) = query_range(prometheus, "time() - alma_last_stage_timestamp_seconds", end + 1, end + 3)
    ages = [float(v) for _, v in after["values"]]
    assert ages[0] > 0 and [b - a for a, b in zip(ages, ages[1:])] == pytest.approx([1.0, 1.0])


@pytest.mark.integration
def test_the_panels_of_the_task_measure_show_a_teams_measure_baseline_and_details(scraped_team_stream):
    prometheus, target, results, start, end, _ = scraped_team_stream
    (dashboard,) = load_dashboards()
    panels = row_panels(dashboard, MEASURE_ROW)
    assert {p["title"] for p in panels} == {
        "The task's measure and its baseline",
        "Cumulative measure",
        "Every measure of the task (binary: recall, precision, PR-AUC)",
    }
    shown: set[str] = set()
    for panel in panels:
        for query in panel["targets"]:
            series = run_query(prometheus, query, target, start, end, results)
            assert finite_values(series), f"{panel['title']}: {query['expr']} holds no number"
            shown |= {s["metric"]["measure"] for s in series}
    assert shown == {"recall", "error", "precision", "pr_auc"}

    series, summary = results["series"], results["summary"]

    def history(expr: str) -> list[float]:
        (result,) = query_range(prometheus, expr, start - 1, end + 1)
        return [float(v) for _, v in result["values"]]

    assert {r["test_recall"] for r in series} <= set(history('alma_task_measure{measure="recall", set="test"}'))
    assert history('alma_cumulative_measure{measure="recall", set="test"}')[-1] == pytest.approx(
        summary["cumulative_recall"]
    )
    assert history('alma_baseline_measure{measure="recall"}')[-1] == summary["baseline_recall"]
    precision = history('alma_measure_detail{measure="precision", set="test"}')
    assert precision[-1] == pytest.approx(summary["final_test_measures"]["precision"], nan_ok=True)
    # The paper's families hold the error rate only: a recall is not a CER.
    assert math.isnan(history("alma_cumulative_error")[-1])
    assert math.isnan(history('alma_error_ratio{set="test"}')[-1])
    # The reference learner's line beside the network's: its last chunk's recall, as the results have it.
    reference = history('alma_reference_prequential_measure{measure="recall"}')
    assert reference[-1] == pytest.approx(series[-1]["reference_recall"])
