"""Whether a binary task's served probabilities are calibrated: each step records the reliability bins of
its prequential sample (the probabilities users were served, before the model trained on them), from the
pass that measured it, and ``alma report`` draws them over the stream's second half beside the diagonal."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from itertools import pairwise

import pytest
import torch

from alma_daemon.config import build_config, to_dict
from alma_daemon.core.assembly import assemble_engine
from alma_daemon.core.chunk_buffer import MemoryBuffer
from alma_daemon.core.records import StepRecord, csv_columns
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.streams import Chunk, partition, prequential_sample
from alma_daemon.data.task_terms import configured_task
from alma_daemon.data.tensors import LabeledData
from alma_daemon.measures.decision import RELIABILITY_EDGES, reliability
from alma_daemon.observability import figures
from alma_daemon.observability.report import write_report
from alma_daemon.observability.report_reliability import (
    FEW_EXAMPLES,
    LINEAR_EDGES,
    LOG_EDGES,
    merged,
    plot_reliability,
    served_bins,
)
from alma_daemon.observability.results import results_of

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
COST_TASK = {"classes": ["ok", "fraud"], "measure": "cost", "false_negative_cost": 20, "class_weights": [1, 20]}
SAMPLE = 150


def fraud_data(n: int, seed: int, classes: int = 2) -> LabeledData:
    """5 % of the last class, told apart by its first two features."""
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, generator=g) < 0.05).long() * (classes - 1)
    if classes > 2:
        y = torch.where(torch.rand(n, generator=g) < 0.5, torch.randint(0, classes - 1, (n,), generator=g), y)
    x = torch.randn(n, 6, generator=g) * 2 + 10
    x[:, :2] += 3.0 * (y == classes - 1).view(-1, 1)
    return LabeledData(x, y)


def engine_for(task: dict, classes: int = 2):
    config = build_config(
        {
            "task": task,
            "stream": {"prequential_examples": SAMPLE},
            "dataset": {"normalization": "standardize"},
            "train": {"epochs": 2, "patience": 1, "batch_size": 64, "optimizer": "adam", "lr": 0.01},
            "learner": {"width": 8},
            "policy": {"name": "fixed", "wait": 1},
            "device": "cpu",
        }
    )
    task_info = configured_task(TaskInfo("classification", (6,), classes, normalization="standardize"), config)
    return config, assemble_engine(config, task_info, MemoryBuffer(), test_set=fraud_data(400, 99, classes))


def chunks(count: int = 6, classes: int = 2) -> list[Chunk]:
    data = fraud_data(400 * count, seed=1, classes=classes)
    return [Chunk(i, part) for i, part in enumerate(partition(data, count, 0), start=1)]


def test_a_binary_tasks_steps_record_the_reliability_of_the_prequential_sample_from_the_pass_that_measured_it():
    config, engine = engine_for(COST_TASK)
    learner = engine.learner
    assessed: list[tuple[LabeledData, torch.Tensor]] = []
    passes: list[LabeledData] = []
    assess_outputs, outputs = learner.assess_outputs, learner.outputs

    def spy_assess(data):
        measured = assess_outputs(data)
        assessed.append((data, measured[2]))
        return measured

    def spy_outputs(data):
        passes.append(data)
        return outputs(data)

    learner.assess_outputs, learner.outputs = spy_assess, spy_outputs  # type: ignore[method-assign]
    records = []
    for chunk in chunks():
        assessed.clear()
        records.append(engine.on_chunk(chunk))
        data, served = assessed[0]  # the prequential sample's, before the test set's
        sample = prequential_sample(chunk, SAMPLE, config.stream.seed)
        assert torch.equal(data.y, sample.y)
        assert sum(seen is data for seen in passes) == 1  # the bins come from the pass that measured the chunk
        bins = records[-1].reliability
        assert bins is not None and len(bins) == len(RELIABILITY_EDGES) - 1
        assert sum(n for n, _, _ in bins) == SAMPLE
        assert sum(k for _, _, k in bins) == int((sample.y == 1).sum())
        assert sum(p for _, p, _ in bins) == pytest.approx(float(served[:, 1].double().sum()), abs=1e-4)
        for (low, high), (n, p, _) in zip(pairwise(RELIABILITY_EDGES), bins):
            assert n == 0 or low <= p / n <= high
    # From the first stage on, the samples were served the calibrated probabilities the version answers.
    assert learner.task.calibration is not None and sum(k for r in records for _, _, k in r.reliability or []) > 0
    row = engine.state.series[-1]
    assert row["reliability"] == records[-1].reliability
    assert StepRecord.from_row(json.loads(json.dumps(row))).reliability == records[-1].reliability
    assert "reliability" not in csv_columns("cost")
    # Rows written before it was recorded load without it.
    assert StepRecord.from_row({k: v for k, v in row.items() if k != "reliability"}).reliability is None


def test_a_multiclass_tasks_rows_have_no_reliability():
    _, engine = engine_for({}, classes=3)
    for chunk in chunks(3, classes=3):
        assert engine.on_chunk(chunk).reliability is None
    assert not any("reliability" in row for row in engine.state.series)


def test_reliability_bins_between_edges_hold_their_lower_edge_and_no_probability_that_is_not_finite():
    p = torch.tensor([0.0, 0.0005, 0.001, 0.05, 0.55, 1.0, math.nan])
    y = torch.tensor([0, 0, 1, 0, 1, 1, 1])
    bins = reliability(p, y, edges=RELIABILITY_EDGES)
    filled = {i: b for i, b in enumerate(bins) if b[0]}
    assert [RELIABILITY_EDGES[i] for i in filled] == [0.0, 0.001, 0.05, 0.5, 0.999]
    assert sum(b[0] for b in bins) == 6 and sum(b[2] for b in bins) == 3
    assert reliability(p, y)[0] == pytest.approx([4, 0.0515, 1])  # ten equal bins, as before


# -- the figure ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class FakeRun:
    config: dict
    summary: dict
    series: list = dataclasses.field(default_factory=list)


def binary_run(crowded: bool, *, wait: int = 1, steps: int = 10, seed: int = 0) -> FakeRun:
    """A run whose model was calibrated over its second half (positives drawn at the probability served)
    and served three times too little in its first; ``crowded``: most probabilities near 0 (a 2 % task)."""
    g = torch.Generator().manual_seed(seed)
    series = []
    for t in range(1, steps + 1):
        p = torch.sigmoid(torch.randn(2000, generator=g) * 1.5 - 4.5) if crowded else torch.rand(2000, generator=g)
        truth = p if t > steps // 2 else (3 * p).clamp(max=1)
        y = (torch.rand(2000, generator=g) < truth).long()
        series.append(
            {
                "t": t,
                "trained": True,
                "prequential_cost": 0.1,
                "reliability": reliability(p, y, edges=RELIABILITY_EDGES),
            }
        )
    config = {
        "learner": {"name": "sm"},
        "policy": {"name": "fixed", "wait": wait},
        "stream": {"megabatches": steps},
        "task": {"classes": ["ok", "fraud"], "measure": "cost"},
    }
    return FakeRun(config, {"chunks": steps}, series)


@pytest.fixture
def drawn(monkeypatch) -> Iterator[list]:
    kept: list = []
    close = figures.plt.close
    monkeypatch.setattr(figures.plt, "close", kept.append)
    yield kept
    for fig in kept:
        close(fig)


def test_the_figure_sums_the_second_half_and_draws_crowded_probabilities_on_log_axes_beside_the_diagonal(
    tmp_path, drawn
):
    run = binary_run(crowded=True)
    summed = served_bins([run])
    assert summed == [[sum(row["reliability"][i][j] for row in run.series[5:]) for j in range(3)] for i in range(22)]
    assert plot_reliability([run], tmp_path / "reliability.png")
    assert (tmp_path / "reliability.png").read_bytes().startswith(PNG_MAGIC)

    (fig,) = drawn
    ax, counts = fig.axes
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    assert ax.get_xlim() == ax.get_ylim() and ax.get_xlim()[1] > 1
    diagonal = [
        line for line in ax.get_lines() if list(line.get_xdata()) == list(line.get_ydata()) == list(ax.get_xlim())
    ]
    assert len(diagonal) == 1
    assert "log scale" in counts.get_xlabel() and "% of the examples are fraud" in counts.get_xlabel()
    assert counts.get_ylabel() == "examples per bin"
    # Calibrated in the second half: each filled bin's interval holds the probability served.
    bins = [b for b in merged(summed, LOG_EDGES) if b.examples >= 100]
    assert len(bins) >= 6 and all(b.interval()[0] <= b.served <= b.interval()[1] for b in bins)
    # The counts are written over their points; the bins too small to read are left out of the top panel.
    labels = {text.get_text() for text in counts.texts}
    assert {f"{b.examples:,.0f}" for b in merged(summed, LOG_EDGES) if b.examples} == labels
    few = [b for b in merged(summed, LOG_EDGES) if 0 < b.examples < FEW_EXAMPLES]
    assert few and "left out above" in fig.get_supxlabel()


def test_spread_probabilities_are_drawn_in_tenths_on_linear_axes_one_line_per_configuration(tmp_path, drawn):
    runs = [binary_run(crowded=False, wait=1), binary_run(crowded=False, wait=1, seed=1), binary_run(False, wait=5)]
    assert plot_reliability(runs, tmp_path / "reliability.png")
    (fig,) = drawn
    ax, _ = fig.axes
    assert (ax.get_xscale(), ax.get_xlim(), ax.get_ylim()) == ("linear", (0.0, 1.0), (0.0, 1.0))
    curves = [line for line in ax.get_lines() if line.get_label() and not line.get_label().startswith("_")]
    assert [line.get_label() for line in curves] == ["sm wait=1", "sm wait=5"]
    assert all(len(line.get_xdata()) == len(LINEAR_EDGES) - 1 for line in curves)
    assert fig.legends[0].get_title().get_text() == "configuration (sum of up to 2 runs)"


def test_runs_without_the_bins_draw_no_figure(tmp_path):
    run = binary_run(crowded=True)
    for row in run.series:
        del row["reliability"]
    assert not plot_reliability([run], tmp_path / "reliability.png")
    assert not (tmp_path / "reliability.png").exists()


def test_the_report_of_a_binary_run_lists_the_figure_and_a_paper_run_leaves_none_behind(tmp_path):
    config, engine = engine_for(COST_TASK)
    for chunk in chunks(4):
        engine.on_chunk(chunk)
    (tmp_path / "fraud").mkdir()
    (tmp_path / "fraud" / "results.json").write_text(json.dumps(results_of(engine, to_dict(config))))
    page = write_report(tmp_path / "fraud", tmp_path / "out", html=True)
    assert (tmp_path / "out" / "reliability.png").read_bytes().startswith(PNG_MAGIC)
    assert "![reliability: " in (tmp_path / "out" / "report.md").read_text()
    assert page.read_text().count("data:image/png;base64,") == len(list((tmp_path / "out").glob("*.png")))

    config, engine = engine_for({}, classes=3)
    for chunk in chunks(2, classes=3):
        engine.on_chunk(chunk)
    (tmp_path / "three").mkdir()
    (tmp_path / "three" / "results.json").write_text(json.dumps(results_of(engine, to_dict(config))))
    write_report(tmp_path / "three", tmp_path / "out")  # an earlier report's figure, no longer true: removed
    assert not (tmp_path / "out" / "reliability.png").exists()
    assert "reliability" not in (tmp_path / "out" / "report.md").read_text()
