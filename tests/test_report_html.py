"""``alma report`` on a daemon-style results log (running, finished, without a test set) and ``--html``."""

from __future__ import annotations

import base64
from html.parser import HTMLParser
from pathlib import Path

from alma_daemon.cli import main
from alma_daemon.config import build_config, to_dict
from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.core.records import StepRecord
from alma_daemon.observability.report import TABLE_HEADER, cer_target, find_runs, write_report
from alma_daemon.observability.results import ResultsWriter, read_results
from alma_daemon.research.simulate import build_engine, run_simulation, simulated_stream
from tests.helpers.data import TINY_MNIST as TINY

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class PageParser(HTMLParser):
    """Collects the table cells and every src/href of a report page."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[str] = []
        self.links: list[str] = []
        self._in_cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.links += [value for name, value in attrs if name in ("src", "href") and value]
        self._in_cell = tag in ("td", "th")
        if self._in_cell:
            self.cells.append("")

    def handle_endtag(self, tag: str) -> None:
        self._in_cell = False

    def handle_data(self, data: str) -> None:
        if self._in_cell:
            self.cells[-1] += data


def parse_page(path: Path) -> PageParser:
    parser = PageParser()
    parser.feed(path.read_text())
    return parser


class ReportMidStream(EngineObserver):
    """Renders the HTML report of the state folder after chunk ``at``, while the stream runs."""

    def __init__(self, folder: Path, at: int):
        self.folder, self.at = folder, at
        self.page: PageParser | None = None

    def on_step(self, record: StepRecord, engine: Engine) -> None:
        if record.t == self.at:
            self.page = parse_page(write_report(self.folder, html=True))


def test_html_report_of_a_running_then_finished_stream_is_self_contained(tmp_path):
    state_dir = tmp_path / "daemon-state"
    mid_stream = ReportMidStream(state_dir, at=2)
    # Observers run after the results writer, so results.json already holds chunk 2 when it reports.
    results = run_simulation(build_config({}, TINY), state_dir, progress=False, observers=[mid_stream])

    running = mid_stream.page
    assert running is not None
    assert running.cells[: len(TABLE_HEADER)] == TABLE_HEADER
    row = dict(zip(TABLE_HEADER, running.cells[len(TABLE_HEADER) :]))
    cer_after_two = results["series"][1]["cumulative_error"]
    assert row["CER"] == f"{cer_after_two:.4f}"

    finished = parse_page(write_report(state_dir, html=True))
    row = dict(zip(TABLE_HEADER, finished.cells[len(TABLE_HEADER) :]))
    assert row["CER"] == f"{results['summary']['cer']:.4f}"
    assert row["prequential CER"] == f"{results['summary']['cumulative_prequential_error']:.4f}"
    # One run: its error curves and its model's age; a CER plot would be one dot.
    assert len(finished.links) == 2
    for link in finished.links:
        assert link.startswith("data:image/png;base64,")  # nothing fetched from disk or network
        assert base64.b64decode(link.split(",", 1)[1]).startswith(PNG_MAGIC)
    assert (state_dir / "report.md").is_file()


def test_report_of_a_stream_without_a_test_set_uses_the_prequential_error(tmp_path):
    # A production stream: the engine gets no test set, exactly as a daemon without one.
    config = build_config({}, TINY)
    stream = simulated_stream(config)
    stream.test = None
    writer = ResultsWriter(tmp_path, to_dict(config))
    engine = build_engine(config, stream, [writer])
    for chunk in stream.chunks:
        engine.on_chunk(chunk)
    summary = read_results(tmp_path)["summary"]
    assert summary["cer"] is None and summary["cumulative_prequential_error"] > 0

    page = parse_page(write_report(tmp_path, html=True))
    row = dict(zip(TABLE_HEADER, page.cells[len(TABLE_HEADER) :]))
    assert row["CER"] == "" and row["prequential CER"] == f"{summary['cumulative_prequential_error']:.4f}"
    # The CER plots show the prequential sum instead of coming out empty.
    assert cer_target(find_runs(tmp_path)) == ("cumulative_prequential_error", "cumulative prequential error")


def test_cli_report_html(tmp_path, capsys):
    run_simulation(build_config({}, TINY), tmp_path / "run", progress=False)
    assert main(["report", str(tmp_path), "--html"]) == 0
    assert capsys.readouterr().out.strip() == f"report: {tmp_path / 'report.html'}"
    assert parse_page(tmp_path / "report.html").cells[0] == "run"


def test_the_table_says_which_runs_trained_compiled():
    """Compiled runs round differently from eager ones: a reader comparing two must see which is which."""
    from alma_daemon.observability.report import Run, table_rows

    runs = [Run(f"run{flag}", {"config": {"train": {"compile": flag}}, "summary": {}}) for flag in (True, False)]
    assert [dict(zip(TABLE_HEADER, row))["compiled"] for row in table_rows(runs)] == ["True", "False"]
