"""``alma report``: plots and a markdown table over every run found under a folder.

- ``error_vs_time.png``: test error (or perplexity) vs mega-batches received (the paper's Fig. 3);
- ``cer_vs_flops.png`` and ``cer_vs_parameters.png``: one point per run (the paper's Fig. 2);
- ``report.md``: one row per run with the summary figures;
- ``report.html`` (``html=True``): the table and the plots in one self-contained page.

A stream without a test set (a production daemon) has no CER: its plots use the prequential error
and its running sum instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from alma_daemon.observability.report_html import html_page
from alma_daemon.observability.results import read_results

#: The plots of a report: file name, caption.
PLOTS = (
    ("error_vs_time.png", "error vs time"),
    ("cer_vs_flops.png", "CER vs FLOPs"),
    ("cer_vs_parameters.png", "CER vs parameters"),
)


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
    def config(self) -> dict:
        return self.results.get("config", {})


def find_runs(root: str | Path) -> list[Run]:
    root = Path(root)
    paths = sorted(root.rglob("results.json"))
    if not paths:
        raise FileNotFoundError(f"no results.json under {root}")
    return [Run(str(p.parent.relative_to(root)) if p.parent != root else root.name, read_results(p)) for p in paths]


def _measure(runs: list[Run]) -> str:
    if any(r.get("test_error") is not None for run in runs for r in run.series):
        return "test_error"
    if any(r.get("test_perplexity") is not None for run in runs for r in run.series):
        return "test_perplexity"
    return "prequential_error"


def plot_error_vs_time(runs: list[Run], path: Path) -> None:
    measure = _measure(runs)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        points = [(r["t"], r[measure]) for r in run.series if r.get(measure) is not None]
        if points:
            ax.plot(*zip(*points), marker=".", label=run.name)
    ax.set_xlabel("mega-batches received")
    ax.set_ylabel(measure.replace("_", " "))
    if measure == "test_perplexity":
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for run in runs:
        x, y = run.summary.get(key), run.summary.get(target)
        if x and y is not None:
            ax.scatter([x], [y], label=run.name)
            ax.annotate(run.name, (x, y), fontsize="x-small", xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel(label)
    ax.set_ylabel(target_label)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


TABLE_HEADER = [
    "run",
    "learner",
    "width",
    "wait",
    "replay",
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
    title = f"ALMA report: {Path(root).resolve().name}"
    body = [f"# {title}", "", markdown_table(runs)]
    body += [f"![{caption}]({name})\n" for name, caption in PLOTS]
    (out / "report.md").write_text("\n".join(body))
    if not html:
        return out / "report.md"
    images = [(caption, (out / name).read_bytes()) for name, caption in PLOTS]
    (out / "report.html").write_text(html_page(title, TABLE_HEADER, table_rows(runs), images))
    return out / "report.html"
