"""End to end through the ``alma`` command: simulate, grid and report on a small MNIST stream."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from alma_daemon.core.records import StepRecord
from alma_daemon.data.datasets import resolve_data_root
from alma_daemon.infra.unreachable import unreachable_line
from tests.helpers.data import TINY_MNIST
from tests.helpers.servers import free_port

pytestmark = pytest.mark.skipif(
    not (resolve_data_root(None) / "mnist").is_dir(), reason="MNIST files not in the data folder (see README: data)"
)

SMALL = [arg for item in TINY_MNIST if item != "device=cpu" for arg in ("--set", item)]


def alma(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "alma_daemon", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_simulate_writes_results_and_prints_a_summary(tmp_path):
    out = tmp_path / "run"
    result = alma("simulate", "--config", "examples/mnist-sm.yaml", *SMALL, "--out", str(out), "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "CER" in result.stdout and "cumulative training FLOPs" in result.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["learner"]["width"] == 8
    series = results["series"]
    assert [r["t"] for r in series] == [1, 2, 3, 4]
    assert [StepRecord.from_row(row).as_row() for row in series] == series  # every field, and nothing else
    summary = results["summary"]
    assert summary["cer"] == pytest.approx(sum(r["test_error"] for r in series))
    assert summary["final_test_error"] == series[-1]["test_error"] < 0.9
    assert summary["cumulative_parameters"] == 4 * series[0]["parameters"]
    assert (out / "series.csv").read_text().splitlines()[0].startswith("t,chunk,examples_seen")


@pytest.mark.slow
def test_a_bad_config_exits_non_zero_with_one_line_naming_the_key():
    result = alma("simulate", "--set", "learner.widht=3")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "learner.widht" in lines[0]


@pytest.mark.slow
def test_grid_runs_every_combination_skips_failures_and_report_plots_them(tmp_path):
    grid = tmp_path / "grid.yaml"
    overrides = dict(item.split("=", 1) for item in SMALL[1::2])
    grid.write_text(
        yaml.safe_dump(
            {
                "base": str((__import__("pathlib").Path("examples/mnist-sm.yaml")).resolve()),
                "set": {k: yaml.safe_load(v) for k, v in overrides.items()},
                "grid": {"learner.name": ["sm", "no-such-learner"], "policy.wait": [1, 2]},
            }
        )
    )
    out = tmp_path / "grid"
    result = alma("grid", str(grid), "--out", str(out), "--no-progress")
    assert result.returncode == 1, result.stderr  # some runs failed
    status = json.loads((out / "grid.json").read_text())
    assert [r["status"] for r in status["runs"]] == ["ok", "ok", "failed", "failed"]
    assert "no-such-learner" in status["runs"][2]["error"]
    # Each combination the config refuses is reported once, and not run.
    assert (result.stdout + result.stderr).count("unknown learner 'no-such-learner'") == 2, result
    assert not (out / "name=no-such-learner,wait=1").exists()
    assert (
        result.stdout.splitlines()[-1]
        == "2 run(s) ok, 2 failed: name=no-such-learner,wait=1, name=no-such-learner,wait=2"
    )

    result = alma("report", str(out))
    assert result.returncode == 0, result.stderr
    for name in ("error_vs_time.png", "cer_vs_flops.png", "cer_vs_parameters.png"):
        assert (out / name).stat().st_size > 1000
    table = (out / "report.md").read_text()
    assert "name=sm,wait=1" in table and "name=sm,wait=2" in table


def test_replay_without_a_kafka_broker_fails_at_once_with_one_line_saying_what_to_do():
    servers = f"127.0.0.1:{free_port()}"
    result = alma("replay", "--dataset", "mnist", "--megabatches", "4", "--bootstrap-servers", servers, "--no-progress")
    assert result.returncode == 1
    assert result.stderr == f"alma replay: error: {unreachable_line('kafka', servers, 'connection refused')}\n"


@pytest.mark.slow
def test_dash_vv_prints_the_traceback_of_a_failing_command_in_both_log_formats(tmp_path):
    (tmp_path / "results.json").write_text("{not json")  # a run folder whose results cannot be read
    for extra in ([], ["--log-json"]):
        result = alma("-vv", *extra, "report", str(tmp_path))
        assert result.returncode == 1
        assert "Traceback (most recent call last)" in result.stderr, result.stderr
        if extra:
            logged = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
            assert any("Traceback" in entry.get("traceback", "") for entry in logged)


@pytest.mark.parametrize(
    ("argv", "verbose", "log_json"),
    [
        (["simulate", "--config", "c.yaml", "-v"], 1, False),
        (["-v", "simulate", "--config", "c.yaml"], 1, False),
        (["config", "check", "c.yaml", "-vv", "--log-json"], 2, True),
        (["--log-json", "status"], 0, True),
        (["simulate"], 0, False),
    ],
)
def test_the_global_options_work_before_the_command_and_after_it(argv, verbose, log_json):
    from alma_daemon.cli import build_parser

    args = build_parser().parse_args(argv)
    assert (args.verbose, args.log_json) == (verbose, log_json)


def test_versions_shows_each_versions_validation_value_of_the_tasks_measure():
    from alma_daemon.commands.versions import format_table, validation_values

    assert validation_values({"val_cost": 0.25, "kind": "finetune"}) == {"validation_cost": 0.25}
    assert validation_values({"kind": "finetune"}) == {"validation_error": None}
    table = format_table([{"version": 1, "live": True, "validation_cost": 0.25, "kind": "finetune"}])
    assert table.splitlines()[0].split() == ["version", "live", "validation_cost", "kind"]
    assert table.splitlines()[1].split() == ["1", "yes", "0.2500", "finetune"]


def test_the_stream_is_named_after_the_dataset_unless_the_config_names_it():
    from alma_daemon.config import build_config

    def stream(dataset: dict, **daemon) -> str:
        return build_config({"dataset": dataset, "daemon": daemon}).daemon.stream

    assert stream({"name": "mnist"}) == "mnist"
    assert stream({"name": "river", "river_stream": "sea"}) == "river-sea"
    assert stream({"name": "table", "files": ["h/transactions.csv.gz"], "label_column": "y"}) == "transactions"
    assert stream({"name": "table", "files": "my history.csv", "label_column": "y"}) == "my-history"
    assert stream({"name": "table", "files": "t.csv", "label_column": "y"}, stream="fraud") == "fraud"
