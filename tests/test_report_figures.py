"""The report's figures and table as a reader sees them: legends that name configurations by what
they learn, outside the axes; the prequential error beside the test error, and its mean over the last
chunks; the model's age against its bound; no one-dot CER plot; how far each run got."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from alma_daemon.config import build_config
from alma_daemon.observability import figures
from alma_daemon.observability.figures import configurations, describe, plot_cer_lines, plot_error_curves
from alma_daemon.observability.report import TABLE_HEADER, Run, find_runs, table_rows, write_report
from alma_daemon.research.simulate import run_simulation
from tests.helpers.data import TINY_MNIST as TINY

#: Where a run kept its state and which servers it talked to: never a legend's business.
WHERE = {
    "daemon": {"state_dir": "/srv/alma/runs/daemon-7", "checkpoint_dir": "/srv/alma/model_store-7"},
    "kafka": {"bootstrap_servers": "10.0.0.7:9092", "transport": "kafka"},
    "redis": {"url": "redis://10.0.0.7:6379/0"},
}


@dataclasses.dataclass
class FakeRun:
    config: dict
    summary: dict
    series: list = dataclasses.field(default_factory=list)


def fake_run(width: int, wait: int, *, chunks: int = 4, megabatches: int = 4, where: int = 0, **stream) -> FakeRun:
    """A run of SM ``width`` at ``wait`` that processed ``chunks`` of ``megabatches``, its state kept
    in places numbered ``where``."""
    config = {
        "learner": {"name": "sm", "width": width},
        "policy": {"name": "fixed", "wait": wait},
        "stream": {"megabatches": megabatches, "seed": 0, **stream},
        "seed": 0,
        **{section: {k: f"{v}-{where}" for k, v in keys.items()} for section, keys in WHERE.items()},
    }
    series = [
        {"t": t, "trained": True, "test_error": 0.5 / t, "prequential_error": 0.6 / t} for t in range(1, chunks + 1)
    ]
    summary = {"chunks": chunks, "cer": 1.0 + width + wait, "cumulative_train_flops": 1e9 * width * wait}
    return FakeRun(config, summary, series)


@pytest.fixture
def drawn(monkeypatch) -> Iterator[list]:
    """The figures the plot functions draw, kept open to be looked at."""
    kept: list = []
    close = figures.plt.close
    monkeypatch.setattr(figures.plt, "close", kept.append)
    yield kept
    for fig in kept:
        close(fig)


def legend_labels(fig) -> list[str]:
    return [text.get_text() for legend in fig.legends for text in legend.get_texts()]


def test_legends_name_runs_by_their_learner_policy_and_stream_keys_not_where_they_keep_state(tmp_path, drawn):
    runs = [fake_run(8, 1, where=0), fake_run(8, 5, where=1), fake_run(16, 1, megabatches=8, chunks=8, where=2)]
    plot_error_curves(runs, [("test_error", "test error")], "error", tmp_path / "e.png")
    plot_cer_lines(runs, "cumulative_train_flops", "FLOPs", "cer", "CER", tmp_path / "c.png")

    curves, cer = drawn
    assert legend_labels(curves) == ["sm width=8 wait=1 B=4", "sm width=8 wait=5 B=4", "sm width=16 wait=1 B=8"]
    assert legend_labels(cer) == ["sm width=8 B=4", "sm width=16 B=8"]  # a line joins the waits
    for fig in (curves, cer):
        text = " ".join(legend_labels(fig))
        for hidden in ("state_dir", "checkpoint_dir", "bootstrap_servers", "url", "redis", "transport", "/srv"):
            assert hidden not in text
        # Titled, and the legend right of every axes, so it covers no curve and no axis label.
        assert fig.get_suptitle() and fig.legends[0].get_title().get_text() == "configuration"
        fig.canvas.draw()
        legend = fig.legends[0].get_window_extent()
        assert all(legend.x0 >= ax.get_tightbbox().x1 for ax in fig.axes)


def test_runs_that_differ_only_in_where_they_keep_state_are_one_configuration():
    assert len(configurations([fake_run(8, 1, where=0), fake_run(8, 1, where=1)])) == 1


def test_a_legend_value_too_long_to_read_is_cut_to_its_end():
    label = describe({"learner.name": "sm", "dataset.files": ("/data/corpora/english/wikitext-103/wiki.train",)})
    assert label == "sm files=…wikitext-103/wiki.train"


def test_a_run_cut_short_says_so_in_its_legend_and_the_table_says_how_far_each_got(tmp_path, drawn):
    runs = [fake_run(8, 1, megabatches=10, chunks=5), fake_run(8, 1, megabatches=10, chunks=10)]
    plot_error_curves(runs, [("test_error", "test error")], "error", tmp_path / "e.png")
    assert legend_labels(drawn[0]) == ["sm", "sm (5 of 10 chunks)"]

    named = [Run(name, {"config": r.config, "summary": r.summary}) for name, r in zip("ab", runs, strict=True)]
    event_stream = Run("c", {"config": fake_run(8, 1, chunk_examples=100).config, "summary": {"chunks": 7}})
    past_b = Run("d", {"config": fake_run(8, 1).config, "summary": {"chunks": 12}})  # a live stream goes on
    cells = [dict(zip(TABLE_HEADER, row))["chunks"] for row in table_rows([*named, event_stream, past_b])]
    assert cells == ["5 of 10", "10 of 10", "7", "12"]


def test_the_prequential_error_is_drawn_beside_the_test_error(tmp_path, drawn):
    runs = [fake_run(8, 1), fake_run(16, 1)]
    panels = [("test_error", "test error"), ("prequential_error", "prequential error")]
    plot_error_curves(runs, panels, "error", tmp_path / "e.png")

    test, prequential = drawn[0].axes
    assert (test.get_title(), prequential.get_title()) == ("test error", "prequential error")
    curves = [line for line in prequential.get_lines() if line.get_linestyle() != "None"]
    assert [list(line.get_ydata()) for line in curves] == [[0.6 / t for t in range(1, 5)] for _ in runs]
    # The first chunk's, untrained, is above the range the trained curves set: a triangle on its edge.
    above = [list(line.get_xdata()) for line in prequential.get_lines() if line.get_marker() == "^"]
    assert above == [[1], [1]]
    assert "▲: an untrained point above it, drawn on its edge (highest 0.6)" in drawn[0].get_supxlabel()


def test_one_configuration_has_no_cer_plot_and_a_title_instead_of_a_legend(tmp_path, drawn):
    one = [fake_run(8, 1), dataclasses.replace(fake_run(8, 1), config={**fake_run(8, 1).config, "seed": 1})]
    assert not plot_cer_lines(one, "cumulative_train_flops", "FLOPs", "cer", "CER", tmp_path / "c.png")
    assert not (tmp_path / "c.png").exists()

    plot_error_curves(one, [("test_error", "test error")], "error", tmp_path / "e.png")
    assert drawn[-1].legends == []
    assert drawn[-1].get_suptitle() == (
        "Error after each mega-batch: sm width=8 policy=fixed wait=1 B=4 (mean of 2 runs)"
    )


@pytest.mark.slow
def test_the_report_of_one_run_leaves_the_cer_plots_out_and_says_why(tmp_path, drawn):
    run_simulation(build_config({}, TINY), tmp_path, progress=False)
    (tmp_path / "cer_vs_flops.png").write_bytes(b"an earlier report's")  # no longer true: removed

    report = write_report(tmp_path).read_text()
    assert "CER vs FLOPs and CER vs parameters: left out, the runs give a single point" in report
    assert "cer_vs" not in report and not list(tmp_path.glob("cer_vs_*.png"))
    curves, age = drawn
    assert [ax.get_title().split(":")[0] for ax in curves.axes] == [
        "test error",
        "prequential error",
        "prequential error, mean over every chunk so far",  # 4 chunks: never 50 to take the mean of
    ]
    # A backtest's seconds are how fast this machine trained, not the stream's time: not drawn.
    assert [ax.get_title() for ax in age.axes] == ["chunks since the last training stage"]
    assert "its age in seconds is not the history's time" in age.get_supxlabel()
    (row,) = table_rows(find_runs(tmp_path))
    assert dict(zip(TABLE_HEADER, row))["chunks"] == "4 of 4"


def aged_run(width: int, wait: int, chunks_bound: int | None, seconds_bound: float | None) -> FakeRun:
    """A run whose policy trains every ``wait`` chunks, 30 minutes apart, under the given freshness bounds."""
    run = fake_run(width, wait)
    run.config["policy"] |= {"max_model_age_chunks": chunks_bound, "max_model_age_seconds": seconds_bound}
    for row in run.series:
        row["model_age_chunks"] = row["t"] % wait
        row["model_age_seconds"] = 1800.0 * (row["t"] % wait)
    return run


def test_the_models_age_is_drawn_in_chunks_and_in_time_with_the_bounds_that_fit(tmp_path, drawn):
    runs = [aged_run(8, 2, chunks_bound=3, seconds_bound=86400), aged_run(8, 1, chunks_bound=None, seconds_bound=3600)]
    assert figures.plot_model_age(runs, tmp_path / "age.png")

    (fig,) = drawn
    chunks, seconds = fig.axes
    assert (chunks.get_ylabel(), seconds.get_ylabel()) == ("chunks", "minutes")  # 30 min at most
    curves = [line for line in chunks.get_lines() if line.get_linestyle() == "-"]
    assert [list(line.get_ydata()) for line in curves] == [[0, 0, 0, 0], [1, 0, 1, 0]]  # wait=1 first
    # The bound in chunks is drawn; in time, an hour is drawn and a day, over 30-minute ages, is named.
    bounds = [list(line.get_ydata()) for ax in fig.axes for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert bounds == [[3, 3], [60, 60]]
    assert "bound above the plot: policy.max_model_age_seconds=86400" in fig.get_supxlabel()
    assert legend_labels(fig) == [
        "sm max_model_age_seconds=3600 wait=1",
        "sm max_model_age_chunks=3 max_model_age_seconds=86400 wait=2",
    ]

    # Results written before the age was recorded: no figure.
    assert not figures.plot_model_age([fake_run(8, 1)], tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
