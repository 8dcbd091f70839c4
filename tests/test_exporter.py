"""The Prometheus exporter: its HTTP endpoints, the metric catalogue, and MetricsObserver fed by a real engine.

The metric objects live in one process-wide registry, so counters are checked as differences
between a scrape before and a scrape after the run under test.
"""

from __future__ import annotations

import math
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from alma_daemon import metrics
from alma_daemon.cli import main
from alma_daemon.config import build_config
from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.core.records import StepRecord
from alma_daemon.infra.unreachable import ServerUnreachable
from alma_daemon.observability.exporter import MetricsObserver, start_exporter
from alma_daemon.research import simulate
from alma_daemon.research.simulate import run_simulation
from tests.helpers.configs import sea_stream_config
from tests.helpers.data import TINY_MNIST as TINY
from tests.helpers.servers import free_ports, http_request, port_open
from tests.helpers.team_records import team_record

#: docs/observability.md, as exposed (prometheus_client adds ``_total`` to counters).
DESIGN_METRICS = {
    "alma_chunks_received_total": "counter",
    "alma_examples_received_total": "counter",
    "alma_records_rejected_total": "counter",
    "alma_buffer_chunks": "gauge",
    "alma_error_ratio": "gauge",
    "alma_cumulative_error": "gauge",
    "alma_train_flops_total": "counter",
    "alma_parameters": "gauge",
    "alma_cumulative_parameters": "gauge",
    "alma_model_updates_total": "counter",
    "alma_reservoir_restarts_total": "counter",
    "alma_train_duration_seconds": "histogram",
    "alma_swap_duration_seconds": "histogram",
    "alma_model_version": "gauge",
    "alma_ingest_lag_records": "gauge",
}
#: The only label names allowed: small fixed vocabularies (and ``le`` of histogram buckets).
ALLOWED_LABELS = {"set", "kind", "action", "reason", "stage", "server", "le", "measure"}


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """``/metrics`` as {(sample name, sorted labels): value}."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def exporter():
    with start_exporter(0) as running:
        yield running


class EngineCatcher(EngineObserver):
    """Keeps the engine of a run so a test can look at it after run_simulation returns."""

    engine: Engine | None = None

    def on_step(self, record: StepRecord, engine: Engine) -> None:
        self.engine = engine


def test_endpoints_health_readiness_and_404(exporter):
    base = exporter.url
    assert http_request("GET", f"{base}/healthz")[0] == 200
    assert http_request("GET", f"{base}/readyz") == (503, b"not ready\n")
    exporter.set_ready(True)
    assert http_request("GET", f"{base}/readyz") == (200, b"ready\n")
    exporter.set_ready(False)
    assert http_request("GET", f"{base}/readyz")[0] == 503
    assert http_request("GET", f"{base}/nothing-here")[0] == 404

    request = urllib.request.Request(f"{base}/metrics")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert b"# TYPE alma_cumulative_error gauge" in response.read()


def test_metrics_speak_openmetrics_when_prometheus_asks(exporter):
    # Prometheus 2.x sends this Accept header; the answer must be OpenMetrics, ending in # EOF.
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    status, body = http_request("GET", f"{exporter.url}/metrics", headers={"Accept": accept})
    assert status == 200
    assert body.rstrip().endswith(b"# EOF")
    assert b"alma_train_flops_total" in body and b"_created" not in body


def test_stop_frees_the_port_and_can_be_repeated():
    running = start_exporter(0)
    port = running.port
    assert port_open(port)
    running.stop()
    running.stop()
    assert not port_open(port)
    start_exporter(port).stop()  # the port is free again for a restarted daemon


def test_a_taken_port_is_an_error_naming_metrics_port(exporter):
    with pytest.raises(ServerUnreachable) as caught:
        start_exporter(exporter.port)
    assert str(caught.value) == (
        f"Metrics exporter at 127.0.0.1:{exporter.port} (metrics.port) cannot listen: address already in use; "
        "stop what listens there (another daemon?), or choose another metrics.port (0 turns the exporter off)"
    )


def test_catalogue_follows_design_and_naming_rules(exporter):
    with urllib.request.urlopen(f"{exporter.url}/metrics", timeout=10) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    types = {name: family.type for name, family in families.items()}
    for name, kind in DESIGN_METRICS.items():
        # The text parser names a counter family without ``_total``.
        assert types.get(name.removesuffix("_total")) == kind, name
    for family in families.values():
        assert family.name.startswith("alma_"), family.name
        for sample in family.samples:
            assert not sample.name.endswith("_created"), sample.name
            assert set(sample.labels) <= ALLOWED_LABELS, sample
            if family.type == "counter":
                assert sample.name.endswith("_total"), sample.name
        if family.type == "histogram":
            assert family.name.endswith("_seconds"), family.name


def test_labelled_series_exist_before_any_event(exporter):
    samples = scrape(exporter.url)
    for label, values, name in [
        ("set", metrics.ERROR_SETS, "alma_error_ratio"),
        ("kind", metrics.UPDATE_KINDS, "alma_model_updates_total"),
        ("action", metrics.DECISION_ACTIONS, "alma_policy_decisions_total"),
        ("stage", metrics.SWAP_STAGES, "alma_swap_failures_total"),
        ("reason", metrics.REJECT_REASONS, "alma_records_rejected_total"),
        ("server", metrics.SERVERS, "alma_server_up"),
    ]:
        found = {dict(labels)[label] for sample, labels in samples if sample == name}
        assert found == set(values), name


def test_observer_reports_what_the_engine_recorded(exporter):
    before = scrape(exporter.url)
    catcher = EngineCatcher()
    config = build_config({}, TINY)
    results = run_simulation(config, None, progress=False, observers=[MetricsObserver(in_process_source=True), catcher])
    after = scrape(exporter.url)
    series, summary = results["series"], results["summary"]
    last = series[-1]

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert value(after, "alma_error_ratio", set="test") == last["test_error"]
    assert value(after, "alma_error_ratio", set="prequential") == last["prequential_error"]
    assert value(after, "alma_cumulative_error") == pytest.approx(summary["cer"])
    assert value(after, "alma_cumulative_prequential_error") == pytest.approx(summary["cumulative_prequential_error"])
    assert math.isnan(value(after, "alma_perplexity", set="test"))  # a classifier has no perplexity
    # The task's measure's families show the paper's error rate too; its task records no baseline.
    assert value(after, "alma_task_measure", measure="error", set="test") == last["test_error"]
    assert value(after, "alma_task_measure", measure="error", set="prequential") == last["prequential_error"]
    assert value(after, "alma_cumulative_measure", measure="error", set="test") == pytest.approx(summary["cer"])
    assert math.isnan(value(after, "alma_baseline_measure", measure="error"))
    assert not any(name == "alma_measure_detail" for name, _ in after)
    assert value(after, "alma_parameters") == summary["final_parameters"]
    assert value(after, "alma_cumulative_parameters") == summary["cumulative_parameters"]
    assert value(after, "alma_model_version") == catcher.engine.state.model_version == summary["stages"]
    assert delta("alma_train_flops_total") == summary["cumulative_train_flops"] > 0
    assert delta("alma_model_updates_total", kind="finetune") == summary["stages"]
    assert delta("alma_policy_decisions_total", action="train") == sum(r["decision"] == "train" for r in series)
    assert delta("alma_train_duration_seconds_count") == summary["stages"]
    assert delta("alma_train_duration_seconds_sum") == pytest.approx(summary["train_seconds"])
    assert delta("alma_chunks_received_total") == len(series)
    assert delta("alma_examples_received_total") == last["examples_seen"] == 1200
    assert value(after, "alma_buffer_chunks") == 0  # greedy policy: every chunk trained on
    assert value(after, "alma_prequential_window_measure", measure="error") == last["prequential_window_error"]
    assert value(after, "alma_model_age_chunks") == last["model_age_chunks"] == 0
    assert value(after, "alma_last_stage_timestamp_seconds") == catcher.engine.state.last_stage_at
    # The freshness bound the engine runs by: none in chunks, and a simulation leaves the one in seconds out.
    assert math.isnan(value(after, "alma_freshness_bound_chunks"))
    assert math.isnan(value(after, "alma_freshness_bound_examples"))
    assert math.isnan(value(after, "alma_freshness_bound_seconds"))


def test_a_stage_that_restarted_the_reservoirs_is_counted(exporter):
    pytest.importorskip("river")
    before = value(scrape(exporter.url), "alma_reservoir_restarts_total")
    config = sea_stream_config({}, stream={"drift": {"kind": "permute_labels", "at": 3}})
    series = run_simulation(config, None, progress=False, observers=[MetricsObserver(in_process_source=True)])["series"]
    restarted = sum(bool(row.get("restarted")) for row in series)
    assert restarted == 1  # the stage on the first permuted chunk
    assert value(scrape(exporter.url), "alma_reservoir_restarts_total") - before == restarted


def test_the_models_age_rises_between_stages_and_the_bounds_are_the_configs(exporter):
    """Every second chunk trains: the age in chunks goes 1, 0, 1, 0, and the time the age in seconds counts
    from (time() minus it) is the stream's start until the first stage ends, then each stage's end."""
    seen: list[tuple[dict, float]] = []

    class ScrapeEachStep(EngineObserver):
        def on_step(self, record: StepRecord, engine: Engine) -> None:
            state = engine.state
            seen.append((scrape(exporter.url), state.last_stage_at or state.started_at))

    config = build_config(
        {
            "policy": {
                "name": "fixed",
                "wait": 2,
                "max_model_age_chunks": 3,
                "max_model_age_examples": 10**6,
                "max_model_age_seconds": None,
            }
        },
        TINY,
    )
    results = run_simulation(
        config, None, progress=False, observers=[MetricsObserver(in_process_source=True), ScrapeEachStep()]
    )
    assert [r["model_age_chunks"] for r in results["series"]] == [1, 0, 1, 0]
    assert [value(samples, "alma_model_age_chunks") for samples, _ in seen] == [1, 0, 1, 0]
    assert [value(samples, "alma_last_stage_timestamp_seconds") for samples, _ in seen] == [at for _, at in seen]
    assert seen[0][1] < seen[1][1] == seen[2][1] < seen[3][1]  # the start, stage 1's end twice, stage 2's end
    for samples, _ in seen:
        assert value(samples, "alma_freshness_bound_chunks") == 3
        assert value(samples, "alma_freshness_bound_examples") == 10**6
        assert math.isnan(value(samples, "alma_freshness_bound_seconds"))


def test_a_teams_measure_its_baseline_and_details_are_exported_labelled_by_name(exporter):
    MetricsObserver.show(team_record(test=0.7, prequential=0.6, cumulative=1.3, baseline=0.0, prequential_window=0.65))
    samples = scrape(exporter.url)
    assert value(samples, "alma_task_measure", measure="recall", set="test") == 0.7
    assert value(samples, "alma_task_measure", measure="recall", set="prequential") == 0.6
    assert value(samples, "alma_cumulative_measure", measure="recall", set="test") == 1.3
    assert value(samples, "alma_cumulative_measure", measure="recall", set="prequential") == 0.6
    assert value(samples, "alma_baseline_measure", measure="recall") == 0.0
    assert value(samples, "alma_measure_detail", measure="precision", set="test") == 0.5
    assert value(samples, "alma_measure_detail", measure="pr_auc", set="prequential") == 0.35
    assert value(samples, "alma_measure_detail", measure="error", set="test") == 0.02
    assert value(samples, "alma_prequential_window_measure", measure="recall") == 0.65
    # The paper's families hold the error rate only: a sum of recalls is no CER.
    assert math.isnan(value(samples, "alma_cumulative_error"))
    assert math.isnan(value(samples, "alma_error_ratio", set="test"))

    # Another stream's measure (a regression without a test set) replaces the recall's series.
    MetricsObserver.show(
        team_record(
            measure="mse", test=None, prequential=2.5, cumulative=None, test_measures={}, prequential_measures={}
        )
    )
    samples = scrape(exporter.url)
    measures = {dict(labels).get("measure") for name, labels in samples if name.startswith("alma_") and labels}
    assert measures - {None} == {"mse"}
    assert math.isnan(value(samples, "alma_task_measure", measure="mse", set="test"))
    assert value(samples, "alma_task_measure", measure="mse", set="prequential") == 2.5
    assert math.isnan(value(samples, "alma_cumulative_measure", measure="mse", set="test"))
    assert not any(name == "alma_measure_detail" for name, _ in samples)


def test_sync_shows_a_resumed_engine_at_once(exporter):
    catcher = EngineCatcher()
    results = run_simulation(build_config({}, TINY), None, progress=False, observers=[catcher])
    # Gauges as a fresh process has them, so only sync() can set them right.
    metrics.MODEL_VERSION.set(0)
    metrics.CUMULATIVE_ERROR.set(0)
    metrics.ERROR_RATIO.labels("test").set(math.nan)
    metrics.MODEL_AGE_CHUNKS.set(math.nan)
    metrics.LAST_STAGE_TIMESTAMP.set(math.nan)
    before = scrape(exporter.url)

    observer = MetricsObserver()
    observer.sync(catcher.engine)  # what a restarted daemon does before its next chunk

    after = scrape(exporter.url)
    summary = results["summary"]
    assert value(after, "alma_model_version") == summary["stages"]
    assert value(after, "alma_cumulative_error") == pytest.approx(summary["cer"])
    assert value(after, "alma_cumulative_parameters") == summary["cumulative_parameters"]
    assert value(after, "alma_error_ratio", set="test") == results["series"][-1]["test_error"]
    assert value(after, "alma_model_age_chunks") == catcher.engine.model_age()[0] == 0
    assert value(after, "alma_last_stage_timestamp_seconds") == catcher.engine.state.last_stage_at
    # FLOPs count over the whole stream: the counter resumes from the saved total.
    flops = value(after, "alma_train_flops_total") - value(before, "alma_train_flops_total")
    assert flops == summary["cumulative_train_flops"]
    # A reload from Redis (after an outage) syncs again: the stream's FLOPs are not counted twice.
    observer.sync(catcher.engine)
    again = value(scrape(exporter.url), "alma_train_flops_total") - value(before, "alma_train_flops_total")
    assert again == summary["cumulative_train_flops"]
    # A daemon's ingest counts arrivals itself: the observer leaves those counters alone.
    assert value(after, "alma_chunks_received_total") == value(before, "alma_chunks_received_total")


def simulate_cli(monkeypatch, observer: EngineObserver, *args: str) -> int:
    """``alma simulate`` on the tiny stream, with ``observer`` added to the run's observers."""
    real_run = simulate.run_simulation

    def with_observer(*run_args, observers, **kwargs):
        return real_run(*run_args, observers=[*observers, observer], **kwargs)

    monkeypatch.setattr(simulate, "run_simulation", with_observer)
    argv = ["simulate", "--no-progress", *args]
    for item in TINY:
        argv += ["--set", item]
    return main(argv)


def test_simulate_metrics_port_serves_while_running_and_overrides_config(monkeypatch):
    port, config_port = free_ports(2)
    seen: list[dict] = []

    class ScrapeEachStep(EngineObserver):
        def on_step(self, record: StepRecord, engine: Engine) -> None:
            seen.append(scrape(f"http://127.0.0.1:{port}"))

    assert (
        simulate_cli(monkeypatch, ScrapeEachStep(), "--metrics-port", str(port), "--set", f"metrics.port={config_port}")
        == 0
    )
    assert len(seen) == 4
    chunks = [value(s, "alma_chunks_received_total") for s in seen]
    assert [b - a for a, b in zip(chunks, chunks[1:])] == [1, 1, 1]
    assert [value(s, "alma_model_version") for s in seen] == [1, 2, 3, 4]
    assert not port_open(port) and not port_open(config_port)


def test_simulate_metrics_port_zero_turns_the_config_port_off(monkeypatch):
    config_port = free_ports(1)[0]
    probes: list[tuple[bool, list[type]]] = []

    class PortProbe(EngineObserver):
        def on_step(self, record: StepRecord, engine: Engine) -> None:
            probes.append((port_open(config_port), [type(o) for o in engine.observers]))

    assert simulate_cli(monkeypatch, PortProbe(), "--metrics-port", "0", "--set", f"metrics.port={config_port}") == 0
    assert len(probes) == 4
    assert not any(listening for listening, _ in probes)
    assert MetricsObserver not in probes[0][1]


@pytest.mark.integration
def test_daemon_serves_metrics_while_running_and_resumes_from_its_state(tmp_path, redis_db):
    from alma_daemon.service.daemon import Daemon
    from alma_daemon.transports.redis_stream import RedisStreamPublisher
    from alma_daemon.transports.replay import dataset_chunks, replay

    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    config = build_config(
        {
            "dataset": {"name": "mnist", "test_examples": 200},
            "stream": {"megabatches": 4, "train_examples": 600},
            "learner": {"width": 8},
            "train": {"epochs": 1, "patience": 0},
            "kafka": {"transport": "redis", "topic": "alma.watched"},
            "daemon": {
                "stream": "watched",
                "state_dir": str(tmp_path / "state"),
                "checkpoint_dir": str(tmp_path / "model_store"),
                "poll_seconds": 0.2,
            },
            "metrics": {"port": port},
        }
    )
    replay(dataset_chunks(config), RedisStreamPublisher(redis_db, config.kafka.topic), "watched", progress=False)
    seen: list[tuple[int, dict, StepRecord]] = []

    class Probe(EngineObserver):
        def on_step(self, record: StepRecord, engine: Engine) -> None:
            seen.append((http_request("GET", f"{url}/readyz")[0], scrape(url), record))

    Daemon(config, redis_db, until_chunks=2, observers=[Probe()]).run()
    assert not port_open(port)
    assert [status for status, _, _ in seen] == [200, 200]
    for _, samples, record in seen:
        assert value(samples, "alma_model_version") == record.model_version
        assert value(samples, "alma_error_ratio", set="prequential") == record.prequential
        assert value(samples, "alma_cumulative_error") == pytest.approx(record.cumulative)

    # A restart: before its first chunk the metrics already show the saved state.
    restarted = Daemon(config, redis_db, until_chunks=4, observers=[Probe()])
    flops_before = metrics.REGISTRY.get_sample_value("alma_train_flops_total")
    metrics.MODEL_VERSION.set(0)
    engine = restarted.restore()
    assert engine.state.model_version == 2
    assert metrics.REGISTRY.get_sample_value("alma_model_version") == 2
    resumed = metrics.REGISTRY.get_sample_value("alma_train_flops_total") - flops_before
    assert resumed == engine.state.cumulative_train_flops > 0
    restarted.run()
    assert [r.chunk for _, _, r in seen] == [1, 2, 3, 4]
