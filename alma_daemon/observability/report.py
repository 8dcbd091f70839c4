"""``alma report``: plots and a markdown table over every run found under a folder.

- ``error_vs_time.png``: test error (or perplexity) vs mega-batches received (the paper's Fig. 3);
- ``cer_vs_flops.png`` and ``cer_vs_parameters.png``: one line per (method, size) joining its
  waiting times (the paper's Fig. 2);
- ``replay.png``, when runs differ in ``stream.replay``: arrows from without to with (Fig. 4);
- ``report.md``: one row per run with the summary figures;
- ``report.html`` (``html=True``): the table and the plots in one self-contained page.

A stream without a test set (a production daemon) has no CER: its plots use the prequential error
and its running sum instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from alma_daemon.core.records import StepRecord, read_rows
from alma_daemon.observability.figures import plot_cer_lines, plot_error_curves, plot_replay_arrows
from alma_daemon.observability.report_html import html_page
from alma_daemon.observability.results import read_results

#: The plots of a report: file name, caption.
PLOTS = (
    ("error_vs_time.png", "error vs time"),
    ("cer_vs_flops.png", "CER vs FLOPs"),
    ("cer_vs_parameters.png", "CER vs parameters"),
)
#: Drawn when some runs differ only in ``stream.replay``.
REPLAY_PLOT = ("replay.png", "replay: CER vs FLOPs without and with")


@dataclass
class Run:
    """One run's results, named by its folder relative to the report root."""

    name: str
    results: dict

    @property
    def summary(self) -> dict:
        return self.results.get("summary", {})

    @property
    def series(self) -> list[dict]:
        return self.results.get("series", [])

    @property
    def records(self) -> list[StepRecord]:
        return read_rows(self.series)

    @property
    def config(self) -> dict:
        return self.results.get("config", {})


def find_runs(root: str | Path) -> list[Run]:
    root = Path(root)
    paths = sorted(root.rglob("results.json"))
    if not paths:
        raise FileNotFoundError(f"no results.json under {root}")
    return [
        Run(str(p.parent.relative_to(root)) if p.parent != root else root.resolve().name, read_results(p))
        for p in paths
    ]


def _measure(runs: list[Run]) -> tuple[str, str]:
    """What the error-vs-time plot shows, as (measure, set measured on)."""
    records = [r for run in runs for r in run.records]
    for measure in ("error", "perplexity"):
        if any(r.measured(measure) is not None for r in records):
            return measure, "test"
    return "error", "prequential"


def plot_error_vs_time(runs: list[Run], path: Path) -> None:
    measure, on = _measure(runs)
    plot_error_curves(runs, f"{on}_{measure}", f"{on} {measure}", path, log=measure == "perplexity")


_CER_TARGETS = (
    ("cer", "CER"),
    ("cumulative_prequential_error", "cumulative prequential error"),
    ("average_test_perplexity", "average test perplexity"),
)


def cer_target(runs: list[Run]) -> tuple[str, str]:
    """The summary key a CER plot shows, and its axis label: the CER, else the prequential sum (a
    stream without a test set), else the average perplexity (language models)."""
    for key, label in _CER_TARGETS:
        if any(run.summary.get(key) is not None for run in runs):
            return key, label
    return _CER_TARGETS[0]


def plot_cer_vs(runs: list[Run], key: str, label: str, path: Path) -> None:
    target, target_label = cer_target(runs)
    plot_cer_lines(runs, key, label, target, target_label, path)


def plot_replay(runs: list[Run], path: Path) -> bool:
    """CER vs training FLOPs with an arrow from each run without replay to its twin with replay;
    False when no configuration was run both ways."""
    target, target_label = cer_target(runs)
    return plot_replay_arrows(runs, "cumulative_train_flops", "cumulative training FLOPs", target, target_label, path)


def _fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


TABLE_HEADER = [
    "run",
    "learner",
    "width",
    "wait",
    "replay",
    "compiled",
    "CER",
    "final test error",
    "prequential CER",
    "avg test ppl",
    "train FLOPs",
    "cum. parameters",
    "final parameters",
    "wall s",
]


def table_rows(runs: list[Run]) -> list[list[str]]:
    """One row of :data:`TABLE_HEADER` cells per run."""
    rows = []
    for run in runs:
        c, s = run.config, run.summary
        rows.append(
            [
                run.name,
                str(c.get("learner", {}).get("name", "")),
                str(c.get("learner", {}).get("width", "")),
                str(c.get("policy", {}).get("wait", "")),
                str(c.get("stream", {}).get("replay", "")),
                str(c.get("train", {}).get("compile", "")),
                _fmt(s.get("cer"), ".4f"),
                _fmt(s.get("final_test_error"), ".4f"),
                _fmt(s.get("cumulative_prequential_error"), ".4f"),
                _fmt(s.get("average_test_perplexity"), ".2f"),
                _fmt(s.get("cumulative_train_flops"), ".3g"),
                _fmt(s.get("cumulative_parameters"), ","),
                _fmt(s.get("final_parameters"), ","),
                _fmt(s.get("wall_seconds"), ".1f"),
            ]
        )
    return rows


def markdown_table(runs: list[Run]) -> str:
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(runs)]
    return "\n".join(lines) + "\n"


def write_report(root: str | Path, out: str | Path | None = None, *, html: bool = False) -> Path:
    """Write the plots and report.md for every run under ``root`` into ``out`` (default: ``root``).

    With ``html``, also report.html (returned instead of report.md). ``root`` may be a daemon's
    ``daemon.state_dir`` while it runs: results.json is replaced atomically after every chunk.
    """
    runs = find_runs(root)
    out = Path(out or root)
    out.mkdir(parents=True, exist_ok=True)
    plot_error_vs_time(runs, out / PLOTS[0][0])
    plot_cer_vs(runs, "cumulative_train_flops", "cumulative training FLOPs", out / PLOTS[1][0])
    plot_cer_vs(runs, "cumulative_parameters", "cumulative parameters", out / PLOTS[2][0])
    plots = list(PLOTS)
    if plot_replay(runs, out / REPLAY_PLOT[0]):
        plots.append(REPLAY_PLOT)
    title = f"ALMA report: {Path(root).resolve().name}"
    body = [f"# {title}", "", markdown_table(runs)]
    body += [f"![{caption}]({name})\n" for name, caption in plots]
    (out / "report.md").write_text("\n".join(body))
    if not html:
        return out / "report.md"
    images = [(caption, (out / name).read_bytes()) for name, caption in plots]
    (out / "report.html").write_text(html_page(title, TABLE_HEADER, table_rows(runs), images))
    return out / "report.html"
