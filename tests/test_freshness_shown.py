"""What an endless stream's users saw, and how old its model is, as a person sees them (issue 43): the
served measure and the longest wait in the results summary and ``alma simulate``'s lines, ``alma
status``'s model age and windowed measure, and ``alma report``'s windowed panel and policies judged on
the served measure. Rows are made up (tests/helpers/team_records.py) but for the Redis of ``alma status``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from alma_daemon.cli import main
from alma_daemon.commands.simulate import format_summary
from alma_daemon.core.engine_state import EngineState
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.observability import figures
from alma_daemon.observability.report import write_report
from alma_daemon.observability.report_policies import PICK_BY_SERVED
from alma_daemon.observability.results import summarize
from alma_daemon.service.engine_store import state_fields
from alma_daemon.service.status import duration_words, measure_rows, measure_status, model_age_row
from tests.helpers.team_records import team_record


def error_rows(prequential: list[float], trained: list[bool], test: float = 0.2) -> list[dict]:
    """The rows of a stream judged by the error rate: each chunk's prequential error, whether it
    trained, the same test error after each chunk; the mean of the last two chunks' as the windowed one."""
    rows, age = [], 0
    for t, (value, stage) in enumerate(zip(prequential, trained, strict=True), start=1):
        age = 0 if stage else age + 1
        row = team_record(
            t,
            measure="error",
            test=test,
            prequential=value,
            cumulative=test * t,
            baseline=None,
            test_measures={},
            prequential_measures={},
            prequential_window=sum(prequential[max(0, t - 2) : t]) / min(t, 2),
            model_age_chunks=age,
            model_age_seconds=0.0,
        ).as_row()
        rows.append(row | {"trained": stage})
    return rows


def write_run(folder: Path, rows: list[dict], config: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(
        json.dumps({"config": config, "series": rows, "summary": summarize(rows, 1.0)})
    )


@pytest.fixture
def drawn(monkeypatch) -> Iterator[dict]:
    """The report's figures by file name, kept open to be looked at."""
    kept: dict = {}
    save, close = figures.plt.Figure.savefig, figures.plt.close

    def keep(fig, path, *args, **kwargs):
        kept[Path(path).name] = fig
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(figures.plt.Figure, "savefig", keep)
    monkeypatch.setattr(figures.plt, "close", lambda fig=None: None)
    yield kept
    for fig in kept.values():
        close(fig)


# ------------------------------------------------------------------------------------------- summary


def test_the_summary_holds_the_served_measure_and_the_longest_wait_and_simulate_prints_them():
    rows = [
        team_record(t, measure="error", prequential=v, baseline=None).as_row()
        for t, v in enumerate((0.9, 0.5, 0.2, 0.4), 1)
    ]
    summary = summarize(rows, 1.0)
    # The second half's prequential error; no row trained (team records carry no stage): a wait of 4.
    assert summary["served_error"] == pytest.approx(0.3) and summary["longest_wait_chunks"] == 4
    lines = format_summary(summary).splitlines()
    assert any(line.split() == ["served", "error", "(prequential,", "2nd", "half)", "0.3000"] for line in lines)
    assert any(line.split() == ["longest", "wait", "(chunks)", "4"] for line in lines)


# -------------------------------------------------------------------------------------------- status


def test_the_model_age_row_says_how_old_the_model_is_against_its_bound():
    status = {
        "chunks_processed": 40,
        "stages": 3,
        "model_age_chunks": 12,
        "model_age_seconds": 3 * 3600.0,
        "freshness_bound": {"chunks": 50, "seconds": 86400.0},
    }
    assert model_age_row(status) == ("model age", "12 chunk(s), 3 h since the last stage (bound: 50 chunks, 24 h)")
    passed = status | {"model_age_chunks": 50}
    assert model_age_row(passed)[1].endswith("(bound: 50 chunks, 24 h: passed, a stage is due)")
    # Past the bound in time with nothing waiting: there is nothing to train on.
    idle = status | {"model_age_chunks": 0, "model_age_seconds": 2 * 86400.0}
    assert (
        model_age_row(idle)[1]
        == "0 chunk(s), 2 d since the last stage (bound: 50 chunks, 24 h: passed, no chunk waits)"
    )
    in_examples = status | {"freshness_bound": {"chunks": None, "examples": 500, "seconds": None}}
    assert model_age_row(in_examples)[1].endswith("(bound: 500 examples)")
    unbounded = status | {"stages": 0, "freshness_bound": {"chunks": None, "seconds": None}}
    assert model_age_row(unbounded)[1] == "12 chunk(s), 3 h since the stream started (no stage yet) (no bound)"
    assert model_age_row(status | {"model_age_chunks": None})[1] == "n/a (not recorded)"
    assert model_age_row({"chunks_processed": 0})[1] == "n/a (no chunk yet)"
    assert [duration_words(s) for s in (40, 720, 5400, 9000, 86400, 3 * 86400)] == [
        "40 s",
        "12 min",
        "1.5 h",
        "2.5 h",
        "24 h",
        "3 d",
    ]


def test_the_measure_row_adds_the_mean_of_the_last_chunks():
    record = team_record(measure="error", test=0.0412, prequential=0.0501, baseline=None, test_measures={})
    window = {"chunks": 50, "mean": 0.048}
    rows = dict(measure_rows({"measure": measure_status(record), "prequential_window": window}))
    assert rows["measure"] == "error (lower is better): test 0.0412, prequential 0.0501, last 50 chunks 0.0480"
    # Rows written before the window was kept: the row as it was.
    rows = dict(measure_rows({"measure": measure_status(record), "prequential_window": None}))
    assert rows["measure"] == "error (lower is better): test 0.0412, prequential 0.0501"


@pytest.mark.integration
def test_alma_status_reads_the_models_age_and_the_windowed_measure_from_redis(redis_server, redis_db, capsys):
    keys = StreamKeys("fresh")
    state = EngineState(
        chunks_seen=15,
        stages_done=3,
        model_version=3,
        last_stage_chunks_seen=3,
        last_stage_at=time.time() - 3 * 3600,
        recent_prequential=[0.05] * 15,
    )
    redis_db.set(keys.engine, json.dumps(state_fields(state)))
    row = team_record(15, measure="error", test=0.0412, prequential=0.0501, baseline=None, test_measures={})
    redis_db.rpush(keys.series, json.dumps(row.as_row() | {"prequential_window_error": 0.048}))
    settings = [f"redis.url={redis_server.url}", "daemon.stream=fresh", "serving.kind=none"]
    argv = ["status", *(a for s in [*settings, "policy.max_model_age_chunks=50"] for a in ("--set", s))]

    assert main([*argv, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["model_age_chunks"] == 12
    assert status["model_age_seconds"] == pytest.approx(3 * 3600, abs=600)
    assert status["freshness_bound"] == {"chunks": 50, "examples": None, "seconds": 86400.0}
    assert status["prequential_window"] == {"chunks": 15, "mean": 0.048}

    assert main(argv) == 0
    shown = capsys.readouterr().out.splitlines()
    (age,) = [line for line in shown if line.startswith("model age")]
    assert age.split(None, 2)[2] == "12 chunk(s), 3 h since the last stage (bound: 50 chunks, 24 h)"
    (measure,) = [line for line in shown if line.startswith("measure ")]
    assert measure.endswith("prequential 0.0501, last 15 chunks 0.0480")

    # A running daemon recorded the bound it runs by: shown whatever config status itself is given.
    redis_db.hset(keys.daemon, "freshness_bound", json.dumps({"chunks": 10, "seconds": None}))
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["freshness_bound"] == {"chunks": 10, "seconds": None}


# -------------------------------------------------------------------------------------------- report

PAPER_CONFIG = {"learner": {"name": "sm", "width": 8}, "stream": {"megabatches": 4, "prequential_window": 2}}


def test_the_report_draws_the_windowed_measure_under_the_prequential_one(tmp_path, drawn):
    write_run(tmp_path / "run", error_rows([0.9, 0.5, 0.3, 0.1], [True] * 4), PAPER_CONFIG)
    write_report(tmp_path)
    test, prequential, windowed = drawn["error_vs_time.png"].axes
    assert windowed.get_title() == "prequential error, mean over the last 2 chunks: what users saw lately"
    assert list(windowed.get_lines()[0].get_ydata()) == pytest.approx([0.9, 0.7, 0.4, 0.2])
    assert "model_age.png" in drawn


def test_policies_are_judged_by_what_users_saw_beside_the_cer(tmp_path):
    """Adaptive has the worst CER (its test error is higher) but users saw the least error from it on the
    stream's second half: the served measure, table and figure say so, beside the CER's verdict."""
    runs = {
        "fixed-1": ({"name": "fixed", "wait": 1}, [0.5, 0.4, 0.3, 0.2], [True] * 4, 0.2),
        "fixed-2": ({"name": "fixed", "wait": 2}, [0.5, 0.5, 0.4, 0.4], [False, True, False, True], 0.2),
        "adaptive": ({"name": "adaptive"}, [0.5, 0.45, 0.1, 0.1], [True, False, False, True], 0.3),
    }
    for name, (policy, prequential, trained, test) in runs.items():
        for seed in (0, 1):
            config = {**PAPER_CONFIG, "policy": policy, "seed": seed}
            write_run(tmp_path / f"{name}-{seed}", error_rows(prequential, trained, test), config)

    report = write_report(tmp_path, html=True)
    text = (tmp_path / "report.md").read_text()
    assert PICK_BY_SERVED in text
    assert "| policy | kind | CER | served error | longest wait (chunks) | training FLOPs |" in text
    assert "| policy=adaptive | policy | 1.2 | 0.1 | 2 | 400 |" in text
    assert "| policy=fixed wait=2 | schedule | 0.8 | 0.4 | 1 | 400 |" in text
    # Worse by the CER, better by what users saw: each verdict against its own best schedule.
    assert "- policy=adaptive: CER x1.500 and FLOPs x1.00 of the best schedule (policy=fixed wait=1)" in text
    assert (
        "- policy=adaptive: served error x0.400 and FLOPs x1.00 of the best schedule (policy=fixed wait=1), "
        "regret -0.1500 +- 0.0000 served error" in text
    )
    assert "![policies against schedules, what users saw: sm](policies-served.png)" in text
    assert (tmp_path / "policies-served.png").stat().st_size > 0

    page = report.read_text()
    assert "<h2>Policies against the best schedule in hindsight: sm (2 seed(s))</h2>" in page
    assert "<th>served error</th>" in page and "<td>policy=adaptive</td>" in page

    # Runs without schedules and policies side by side: no section, and no stale figures.
    for name in ("fixed-2", "adaptive"):
        for seed in (0, 1):
            (tmp_path / f"{name}-{seed}" / "results.json").unlink()
    assert "served error" not in write_report(tmp_path).read_text()
    assert not list(tmp_path.glob("policies*.png"))
