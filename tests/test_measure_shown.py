"""The task's measure as a person sees it (issue 42): the results summary and ``alma simulate``'s lines,
``alma report`` (its axis, the dashed baseline, a binary task's recall, precision and PR-AUC, the
table, the title of a team's model on an event stream, policies judged on the measure's loss) and
``alma status``. Rows are made up (tests/helpers/team_records.py): nothing trains here."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from alma_daemon.commands.simulate import format_summary
from alma_daemon.observability import figures
from alma_daemon.observability.policy_regret import regrets
from alma_daemon.observability.report import find_runs, table_header, table_rows, write_report
from alma_daemon.observability.report_policies import policy_outcomes
from alma_daemon.observability.results import summarize
from alma_daemon.service.status import measure_rows, measure_status
from tests.helpers.team_records import fraud_rows, team_record

#: A team's run: its own network (learner.model) on an event stream cut every 1000 examples, judged by recall.
TEAM_CONFIG = {
    "learner": {"name": "sm", "width": 64, "model": "fraud_model:build"},
    "policy": {"name": "fixed", "wait": 1},
    "stream": {"megabatches": 10, "chunk_examples": 1000, "replay": False, "seed": 0},
    "task": {"measure": "recall", "classes": ["ok", "fraud"], "positive_class": "fraud"},
    "seed": 0,
}


def write_run(folder: Path, rows: list[dict], config: dict = TEAM_CONFIG) -> dict:
    """A results.json as the results writer leaves it."""
    results = {"config": config, "series": rows, "summary": summarize(rows, 1.0)}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results))
    return results


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


def test_the_summary_of_a_recall_task_names_its_measure_its_baseline_and_its_other_measures():
    rows = fraud_rows(4)
    summary = summarize(rows, 1.0)
    assert summary["measure"] == "recall" and summary["higher_is_better"] is True
    assert summary["final_test_recall"] == rows[-1]["test_recall"] == 0.8
    assert summary["cumulative_recall"] == pytest.approx(0.2 + 0.4 + 0.6 + 0.8)
    assert summary["cumulative_prequential_recall"] == rows[-1]["cumulative_prequential_recall"]
    assert summary["final_test_measures"] == rows[-1]["test_measures"]
    assert summary["final_prequential_measures"] == rows[-1]["prequential_measures"]
    assert summary["baseline_recall"] == 0.0
    # A sum of recalls is no CER: the error's keys are the error's only.
    assert "cer" not in summary and "final_test_error" not in summary


def test_the_summary_of_a_regression_is_in_mse():
    rows = [
        team_record(
            t,
            measure="mse",
            test=4.0 / t,
            cumulative=sum(4.0 / k for k in range(1, t + 1)),
            baseline=9.0,
            test_measures={},
            prequential_measures={},
        ).as_row()
        for t in (1, 2)
    ]
    summary = summarize(rows, 1.0)
    assert summary["measure"] == "mse" and summary["higher_is_better"] is False
    assert (summary["final_test_mse"], summary["cumulative_mse"], summary["baseline_mse"]) == (2.0, 6.0, 9.0)
    assert "final_test_measures" not in summary and "cer" not in summary


def test_the_summary_of_the_error_rate_keeps_the_cer_and_adds_the_measure():
    rows = [
        team_record(
            t,
            measure="error",
            test=0.1,
            cumulative=0.1 * t,
            baseline=None,
            test_measures={},
            prequential_measures={},
        ).as_row()
        for t in (1, 2)
    ]
    summary = summarize(rows, 1.0)
    assert summary["cer"] == summary["cumulative_error"] == pytest.approx(0.2)
    assert summary["final_test_error"] == 0.1 and summary["measure"] == "error"
    assert summary["higher_is_better"] is False and "baseline_error" not in summary


def test_alma_simulate_prints_the_measure_by_its_name():
    shown = format_summary(summarize(fraud_rows(4), 1.0))
    lines = {line.split("  ")[0]: line.split()[-1] for line in shown.splitlines()}
    assert "recall (higher is better)" in shown
    assert lines["cumulative recall"] == "2.0000" and lines["final test recall"] == "0.8000"
    assert lines["baseline (majority class)"] == "0.0000"
    assert lines["final test precision"] == "0.7000"
    assert "CER" not in lines


def test_alma_simulate_prints_the_papers_lines_for_the_error_rate():
    shown = format_summary({"cer": 0.3651, "final_test_error": 0.032, "measure": "error", "cumulative_error": 0.3651})
    assert [line.split("  ")[0] for line in shown.splitlines()] == ["CER", "final test error"]


def test_a_binary_task_judged_by_the_error_rate_prints_its_cer_baseline_and_other_measures():
    details = {"recall": 0.6, "precision": 0.5, "pr_auc": 0.45}  # the headline left out
    rows = [
        team_record(t, measure="error", test=0.01, cumulative=0.01 * t, baseline=0.02, test_measures=details).as_row()
        for t in (1, 2)
    ]
    shown = format_summary(summarize(rows, 1.0))
    names = [line.split("  ")[0] for line in shown.splitlines()][:6]
    assert names == [
        "CER",
        "final test error",
        "baseline (majority class)",
        "final test recall",
        "final test precision",
        "final test pr_auc",
    ]


# -------------------------------------------------------------------------------------------- report


def test_the_report_of_a_binary_task_draws_its_measure_the_baseline_and_recall_precision_pr_auc(tmp_path, drawn):
    write_run(tmp_path / "fraud", fraud_rows(4))
    report = write_report(tmp_path).read_text()

    curves = drawn["error_vs_time.png"]
    test, prequential = curves.axes
    assert test.get_ylabel() == "recall (higher is better)"
    assert test.get_title().startswith("test recall") and prequential.get_title().startswith("prequential recall")
    (baseline,) = [line for line in test.get_lines() if line.get_linestyle() == "--"]
    assert list(baseline.get_ydata()) == [0.0] * 4
    assert "dashed: baseline (majority class)" in curves.get_supxlabel()
    # The title names the team's model and its event stream, not a width and a B it does not have.
    assert curves.get_suptitle() == (
        "Recall after each mega-batch: sm model=fraud_model:build policy=fixed wait=1 chunk_examples=1000 "
        "measure=recall no replay"
    )

    details = drawn["measures_vs_time.png"]
    assert [ax.get_title() for ax in details.axes] == ["test recall", "test precision", "test PR-AUC"]
    precision = details.axes[1].get_lines()[0]
    assert list(precision.get_ydata()) == pytest.approx([0.4, 0.5, 0.6, 0.7])

    assert "![recall vs time](error_vs_time.png)" in report
    assert "![recall, precision and PR-AUC of the positive class vs time](measures_vs_time.png)" in report
    assert "recall: higher is better" in report and "baseline recall: the recall of the majority class" in report


def test_the_report_table_has_the_measures_columns_instead_of_the_cer(tmp_path):
    write_run(tmp_path / "fraud", fraud_rows(4))
    runs = find_runs(tmp_path)
    (row,) = table_rows(runs)
    cells = dict(zip(table_header(runs), row, strict=True))
    assert "CER" not in cells and "final test error" not in cells
    assert (cells["cumulative recall"], cells["final test recall"], cells["baseline recall"]) == (
        "2.0000",
        "0.8000",
        "0.0000",
    )
    assert cells["final other measures"] == "error 0.0125, precision 0.7000, pr_auc 0.6500"


def test_a_binary_stream_without_a_test_set_draws_the_chunks_measures(tmp_path, drawn):
    write_run(tmp_path / "live", fraud_rows(4, with_test=False))
    write_report(tmp_path)
    (prequential,) = drawn["error_vs_time.png"].axes
    assert prequential.get_title().startswith("prequential recall")
    assert any(line.get_linestyle() == "--" for line in prequential.get_lines())  # the chunks' baseline
    assert [ax.get_title() for ax in drawn["measures_vs_time.png"].axes] == [
        "prequential recall",
        "prequential precision",
        "prequential PR-AUC",
    ]


def test_the_papers_report_has_no_details_figure_and_loses_an_earlier_one(tmp_path):
    rows = [
        team_record(
            t,
            measure="error",
            test=0.1,
            cumulative=0.1 * t,
            baseline=None,
            test_measures={},
            prequential_measures={},
        ).as_row()
        for t in (1, 2)
    ]
    write_run(tmp_path / "paper", rows, {"learner": {"name": "sm", "width": 8}, "stream": {"megabatches": 2}})
    (tmp_path / "measures_vs_time.png").write_bytes(b"an earlier report's")
    report = write_report(tmp_path).read_text()
    assert not (tmp_path / "measures_vs_time.png").exists() and "measures_vs_time" not in report


def test_policies_are_judged_on_the_measures_loss_a_larger_recall_is_better(tmp_path):
    for seed in (0, 1):
        for name, policy, lift in (
            ("fixed", {"name": "fixed", "wait": 1}, 0.0),
            ("adaptive", {"name": "adaptive"}, 0.05),
        ):
            config = {**TEAM_CONFIG, "policy": policy, "seed": seed, "stream": {**TEAM_CONFIG["stream"], "seed": seed}}
            write_run(tmp_path / f"{name}-{seed}", fraud_rows(4, lift=lift), config)

    (outcomes,) = policy_outcomes(find_runs(tmp_path)).values()
    (regret,) = regrets(outcomes)
    # Adaptive caught more fraud (0.05 more recall on each of 4 chunks): it is the better one.
    assert regret.difference == pytest.approx(-0.2) and regret.cer_ratio < 1
    assert regret.unit == "cumulative (1 - recall)"
    assert "regret -0.20 +- 0.00 cumulative (1 - recall)" in regret.line()
    assert "cumulative (1 - recall) x" in write_report(tmp_path).read_text()


# -------------------------------------------------------------------------------------------- status


def rows_of(record) -> dict[str, str]:
    return dict(measure_rows({"measure": measure_status(record)}))


def test_alma_status_shows_the_measure_its_sum_its_baseline_and_its_other_measures():
    rows = rows_of(team_record(test=0.7, prequential=0.6, cumulative=1.3, baseline=0.0))
    assert rows["measure"] == "recall (higher is better): test 0.7000, prequential 0.6000"
    assert rows["cumulative recall so far"] == "1.3000"
    assert rows["baseline (majority class)"] == "0.0000"
    assert rows["other measures"] == "error 0.0200, precision 0.5000, pr_auc 0.4500 (test set)"


def test_alma_status_of_a_stream_without_a_test_set():
    rows = rows_of(team_record(test=None, cumulative=None, test_measures={}))
    assert rows["measure"] == "recall (higher is better): test n/a, prequential 0.6000"
    assert rows["cumulative recall so far"].startswith("n/a")
    assert rows["other measures"].endswith("(latest chunk)")


def test_alma_status_keeps_the_papers_cer_and_a_language_models_perplexity():
    paper = rows_of(
        team_record(
            measure="error",
            test=0.03,
            prequential=0.05,
            cumulative=0.36,
            baseline=None,
            test_measures={},
            prequential_measures={},
        )
    )
    assert paper == {"measure": "error (lower is better): test 0.0300, prequential 0.0500", "CER so far": "0.3600"}
    lm = rows_of(
        team_record(
            measure="perplexity",
            test=120.0,
            prequential=130.0,
            cumulative=None,
            baseline=None,
            test_measures={},
            prequential_measures={},
        )
    )
    assert lm == {"test perplexity": "120.00 (prequential 130.00)"}
    assert measure_rows({"measure": None}) == [("CER so far", "n/a (no test set or no chunk yet)")]
