"""Typed step and stage records, and their rows in results files (this version's and earlier ones)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from alma_daemon.cli import main
from alma_daemon.core.records import StageRecord, StepRecord, read_rows
from alma_daemon.observability.report import find_runs
from alma_daemon.observability.results import summarize

#: results.json of the README's main job (MNIST, SM, wait 1), written before records were typed.
RESULTS_BEFORE_TYPED_RECORDS = Path(__file__).parent / "data" / "results-before-typed-records.json"


def language_model_step(**changes) -> StepRecord:
    stage = StageRecord(
        stage=1,
        kind="finetune",
        measure="perplexity",
        val=180.5,
        train_flops=1000,
        train_seconds=1.5,
        steps=20,
        epochs=1,
        best_epoch=1,
        model_version=1,
        parameters=400,
        train_flops_per_example=10.0,
        chunks=[1],
        examples=110,
    )
    fields = dict(
        t=1,
        chunk=1,
        examples_seen=110,
        decision="train",
        reason="1 chunk(s) pending >= wait 1",
        measure="perplexity",
        test=200.25,
        prequential=900.0,
        cumulative_prequential=900.0,
        cumulative=None,
        train_flops=1000,
        cumulative_train_flops=1000,
        parameters=400,
        cumulative_parameters=400,
        inference_flops_per_example=800.0,
        train_seconds=1.5,
        cumulative_train_seconds=1.5,
        model_version=1,
        wall_seconds=2.0,
        stage=stage,
    )
    return StepRecord(**(fields | changes))


def test_rows_written_before_typed_records_read_back_to_the_same_rows_and_summary():
    written = json.loads(RESULTS_BEFORE_TYPED_RECORDS.read_text())
    records = read_rows(written["series"])
    assert [list(r.as_row().items()) for r in records] == [list(row.items()) for row in written["series"]]
    assert all(r.measure == "error" and r.trained for r in records)
    assert records[-1].cumulative == written["summary"]["cer"]
    # The same summary figures; this version's summary adds the measure's keys (measure, cumulative_error).
    assert summarize(written["series"], written["summary"]["wall_seconds"]).items() >= written["summary"].items()


def test_alma_report_reads_results_written_before_typed_records(tmp_path, capsys):
    shutil.copy(RESULTS_BEFORE_TYPED_RECORDS, tmp_path / "results.json")
    out = tmp_path / "report"
    assert main(["report", str(tmp_path), "--out", str(out)]) == 0
    table = (out / "report.md").read_text()
    assert "| 0.3652 | 0.0301 |" in table
    assert (out / "error_vs_time.png").stat().st_size > 0
    assert [r.test for r in find_runs(tmp_path)[0].records][-1] == 0.0301


def test_a_language_model_row_names_its_measure_perplexity_and_has_no_cer():
    record = language_model_step()
    row = record.as_row()
    assert row["test_perplexity"] == 200.25 and row["val_perplexity"] == 180.5
    assert row["cumulative_prequential_perplexity"] == 900.0
    assert not {"test_error", "prequential_error", "cumulative_error", "val_error"} & set(row)
    assert record.measured("perplexity") == 200.25 and record.measured("error") is None
    assert record.measured("perplexity", on="prequential") == 900.0
    again = StepRecord.from_row(json.loads(json.dumps(row)))
    assert again.as_row() == row and again.stage is not None and again.stage.val == 180.5


def test_a_step_that_waited_has_no_stage_keys():
    row = language_model_step(stage=None, decision="wait").as_row()
    assert row["trained"] is False
    assert not {"stage", "kind", "steps", "val_perplexity", "growth"} & set(row)
    assert StepRecord.from_row(row).stage is None


def test_a_checkpoints_metrics_hold_the_stages_row_but_its_growth_report():
    stage = language_model_step().stage
    assert stage is not None and "growth" in stage.as_row()
    metrics = stage.checkpoint_metrics()
    assert metrics["kind"] == "finetune" and metrics["chunks"] == [1] and metrics["val_perplexity"] == 180.5
    assert "growth" not in metrics


def test_a_row_without_a_needed_key_is_refused_naming_the_key_and_the_chunk():
    row = language_model_step().as_row()
    del row["cumulative_train_flops"]
    with pytest.raises(ValueError, match="'cumulative_train_flops'.*chunk 1"):
        StepRecord.from_row(row)
    with pytest.raises(ValueError, match="prequential_<measure>"):
        StepRecord.from_row({"t": 1, "chunk": 3})


def test_series_csv_columns_follow_the_step_fields_with_the_measured_ones_in_one_block():
    from alma_daemon.observability.results import CSV_HEADER

    assert CSV_HEADER == (
        "t,chunk,examples_seen,chunk_time,trained,decision,test_error,prequential_error,prequential_window_error,"
        "cumulative_error,reference_error,test_perplexity,prequential_perplexity,prequential_window_perplexity,model_age_chunks,"
        "train_flops,cumulative_train_flops,parameters,"
        "cumulative_parameters,inference_flops_per_example,train_seconds,model_version,wall_seconds\r\n"
    )


def test_a_trained_steps_row_ends_with_the_stage_keys_a_late_one_says_so_and_reads_back():
    record = language_model_step(late=True)
    row = record.as_row()
    assert list(row)[-8:] == [
        "late",
        "stage",
        "kind",
        "epochs",
        "best_epoch",
        "steps",
        "val_perplexity",
        "train_flops_per_example",
    ]
    again = StepRecord.from_row(row)
    assert again.late and again.trained and again.stage is not None
    assert again.stage.as_row() | {"chunks": [1], "examples": 110} == record.stage.as_row()
    assert "late" not in language_model_step().as_row()
