"""``alma report``: plots and a markdown table over every run found under a folder.

- ``error_vs_time.png``: the task's measure (the test error, a perplexity, a recall...) vs
  mega-batches received (the paper's Fig. 3), beside the prequential one (each chunk's, before it
  trains) and its mean over the prequential window (named by what it holds), with the input-blind
  baseline dashed on every panel where the runs recorded one, and the reference learner (a linear
  model learnt on the same stream, ``reference.kind``) dotted on the prequential panels;
- ``model_age.png``: chunks since the last training stage, and the time since: a backtest's in its
  history's time where its rows carry their chunk's (``chunk_time``: a table with a time column), a
  daemon's as its chunks arrived (a backtest's seconds without it are how fast the machine trained:
  not drawn);
- ``measures_vs_time.png``, for a binary task: recall, precision and PR-AUC of the positive class
  (observability/report_measures.py);
- ``reliability.png``, for a binary task: the share of positives observed against the probability
  served, per bin, over the stream's second half, beside the diagonal (observability/report_reliability.py);
- ``cer_vs_flops.png`` and ``cer_vs_parameters.png``: the CER (the cumulative measure) of one line
  per configuration and policy, joining a schedule's waiting times (the paper's Fig. 2); left out
  where there is a single point (one run);
- ``replay.png``, when runs differ in ``stream.replay``: arrows from without to with (Fig. 4);
- ``policies.png`` and ``policies-served.png``, when runs of schedules and of policies share a
  configuration and seeds: CER, and the served measure (what users saw), against FLOPs with the
  schedules' Pareto front, a table of both with the longest wait, and each policy's regret against
  the best schedule in hindsight on each (observability/report_policies.py);
- ``report.md``: one row per run with the summary figures and the chunks it processed of B (and,
  for a team's measure, its columns, baseline and other measures, with a note on what each means);
- ``report.html`` (``html=True``): the table and the plots in one self-contained page.

A stream without a test set (a production daemon) has no CER: its plots use the prequential measure
and its running sum instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alma_daemon.core.records import CUMULATIVE_MEASURES, StepRecord, read_rows
from alma_daemon.observability.figures import (
    plot_cer_lines,
    plot_error_curves,
    plot_model_age,
    plot_replay_arrows,
    processed,
    stream_length,
)
from alma_daemon.observability.measure_words import (
    PAPER_MEASURE,
    baseline_words,
    cumulative_key,
    cumulative_words,
    higher_is_better,
    named,
)
from alma_daemon.observability.report_html import html_page
from alma_daemon.observability.report_measures import (
    DETAILS_PLOT,
    PAPER_COLUMNS,
    folder_measure,
    has_baseline,
    measure_columns,
    measure_notes,
    measured_sets,
    plot_details,
    run_measure,
)
from alma_daemon.observability.report_policies import PICK_BY_SERVED, policy_section, stale_figures
from alma_daemon.observability.report_reliability import RELIABILITY_PLOT, plot_reliability
from alma_daemon.observability.results import HISTORY_FILE, read_results

#: The plots of a report: file name, caption (the paper's: a report of another measure names it instead).
PLOTS = (
    ("error_vs_time.png", "error vs time"),
    ("cer_vs_flops.png", "CER vs FLOPs"),
    ("cer_vs_parameters.png", "CER vs parameters"),
)
#: Drawn when some runs differ only in ``stream.replay``.
REPLAY_PLOT = ("replay.png", "replay: CER vs FLOPs without and with")
#: Drawn where the runs recorded the model's age (in time where the chunks arrived in time: a daemon's).
AGE_PLOT = (
    "model_age.png",
    "model age: chunks since the last training stage (and time: a backtest's history's, a daemon's stream's)",
)


@dataclass
class Run:
    """One run's results, named by its folder relative to the report root. ``arrival_times``: whether
    its chunks arrived in time (a daemon's, which keeps the history file), so that its model's age in
    seconds is the stream's; a backtest's is how fast the machine trained."""

    name: str
    results: dict[str, Any]
    arrival_times: bool = False

    @property
    def summary(self) -> dict[str, Any]:
        return self.results.get("summary", {})

    @property
    def series(self) -> list[dict[str, Any]]:
        return self.results.get("series", [])

    @property
    def records(self) -> list[StepRecord]:
        return read_rows(self.series)

    @property
    def config(self) -> dict[str, Any]:
        return self.results.get("config", {})


def find_runs(root: str | Path) -> list[Run]:
    root = Path(root)
    paths = sorted(root.rglob("results.json"))
    if not paths:
        raise FileNotFoundError(f"no results.json under {root}")
    return [
        Run(
            str(p.parent.relative_to(root)) if p.parent != root else root.resolve().name,
            read_results(p),
            arrival_times=(p.parent / HISTORY_FILE).exists(),
        )
        for p in paths
    ]


_PANELS = {
    "test": "test {measure}: the model after chunk t, on the test set",
    "prequential": "prequential {measure}: the model before chunk t, on chunk t",
    "prequential_window": "prequential {measure}, {window}: what users saw lately",
}


def captions(measure: str) -> dict[str, str]:
    """The caption of each plot of a report of ``measure``: :data:`PLOTS`' for the error rate."""
    cumulative = cumulative_words(measure)
    return {
        PLOTS[0][0]: f"{measure} vs time",
        PLOTS[1][0]: f"{cumulative} vs FLOPs",
        PLOTS[2][0]: f"{cumulative} vs parameters",
        REPLAY_PLOT[0]: f"replay: {cumulative} vs FLOPs without and with",
    }


def plot_error_vs_time(runs: list[Run], path: Path) -> None:
    """The runs' measure after each chunk (:func:`folder_measure`), its axis saying which way is better,
    with the input-blind baseline where the runs recorded one."""
    measure = folder_measure(runs)
    sets = measured_sets(runs, measure)
    if any(row.get(f"prequential_window_{measure}") is not None for run in runs for row in run.series):
        sets.append("prequential_window")
    panels = [(f"{on}_{measure}", _PANELS[on].format(measure=measure, window=_window_words(runs))) for on in sets]
    # Recorded on the test set where there is one (every panel shows it: it is what a model must beat).
    on = "on the test set" if "test" in sets else "on each chunk"
    baseline = (f"baseline_{measure}", f"{baseline_words(measure)} {on}") if has_baseline(runs, measure) else None
    # The reference learner's (reference.kind) beside the network's, on the panels of the same chunks.
    references = {
        f"prequential_{measure}": f"reference_{measure}",
        f"prequential_window_{measure}": f"reference_window_{measure}",
    }
    plot_error_curves(
        runs,
        panels,
        measure,
        path,
        log=measure == "perplexity",
        axis_label=named(measure),
        baseline=baseline,
        references=references,
    )


def _window_words(runs: list[Run]) -> str:
    """What the prequential window's mean holds, in words: ``mean over the last 50 chunks`` (the runs'
    ``stream.prequential_window``, where they share one), or, on a stream no longer than it, ``mean over
    every chunk so far``, which is all it ever held (not "the last 50 chunks" of a 10-chunk stream)."""
    windows = {run.config.get("stream", {}).get("prequential_window") for run in runs}
    if len(windows) != 1 or None in windows:
        return "mean over the last stream.prequential_window chunks"
    window = int(next(iter(windows)))
    longest = max((len(run.series) for run in runs), default=0)
    if longest <= window:
        return "mean over every chunk so far"
    return f"mean over the last {window} chunks"


def cer_target(runs: list[Run]) -> tuple[str, str]:
    """The summary key a CER plot shows, and its axis label: the CER (the cumulative measure), else the
    prequential sum (a stream without a test set); a language model's average perplexity."""
    measure = folder_measure(runs)
    first = (
        (cumulative_key(measure), cumulative_words(measure))
        if measure in CUMULATIVE_MEASURES
        else ("average_test_perplexity", "average test perplexity")
    )
    # A larger cumulative recall is better: an axis of one says so.
    better = " (higher is better)" if higher_is_better(measure) else ""
    targets = [first, (f"cumulative_prequential_{measure}", f"cumulative prequential {measure}")]
    for key, label in targets:
        if any(run.summary.get(key) is not None for run in runs):
            return key, label + better
    return first[0], first[1] + better


def plot_cer_vs(runs: list[Run], key: str, label: str, path: Path) -> bool:
    """False, and nothing drawn, where the runs give a single point (see :func:`plot_cer_lines`)."""
    target, target_label = cer_target(runs)
    return plot_cer_lines(runs, key, label, target, target_label, path)


def plot_replay(runs: list[Run], path: Path) -> bool:
    """CER vs training FLOPs with an arrow from each run without replay to its twin with replay;
    False when no configuration was run both ways."""
    target, target_label = cer_target(runs)
    return plot_replay_arrows(runs, "cumulative_train_flops", "cumulative training FLOPs", target, target_label, path)


#: The costs the CER plots are drawn against: (summary key, axis label), in :data:`PLOTS` order.
_CER_COSTS = (
    ("cumulative_train_flops", "cumulative training FLOPs"),
    ("cumulative_parameters", "cumulative parameters"),
)


def draw_plots(runs: list[Run], folder: Path, prefix: str = "") -> list[tuple[str, str]]:
    """Draw the report's plots into ``folder`` (each file name after ``prefix``); return the
    (file name, caption) of those drawn: the CER plots are left out for a single point, the
    replay plot where no configuration ran both ways, the details and reliability plots but for a binary task."""
    caption = captions(folder_measure(runs))
    plot_error_vs_time(runs, folder / f"{prefix}{PLOTS[0][0]}")
    drawn = [(f"{prefix}{PLOTS[0][0]}", caption[PLOTS[0][0]])]
    if plot_details(runs, folder / f"{prefix}{DETAILS_PLOT[0]}"):
        drawn.append((f"{prefix}{DETAILS_PLOT[0]}", DETAILS_PLOT[1]))
    if plot_reliability(runs, folder / f"{prefix}{RELIABILITY_PLOT[0]}"):
        drawn.append((f"{prefix}{RELIABILITY_PLOT[0]}", RELIABILITY_PLOT[1]))
    for (name, _), (key, label) in zip(PLOTS[1:], _CER_COSTS, strict=True):
        if plot_cer_vs(runs, key, label, folder / f"{prefix}{name}"):
            drawn.append((f"{prefix}{name}", caption[name]))
    if plot_replay(runs, folder / f"{prefix}{REPLAY_PLOT[0]}"):
        drawn.append((f"{prefix}{REPLAY_PLOT[0]}", caption[REPLAY_PLOT[0]]))
    return drawn


def left_out(drawn: list[tuple[str, str]], prefix: str = "", measure: str = PAPER_MEASURE) -> list[str]:
    """What the report says of the CER plots it left out (none or one sentence)."""
    names = {name for name, _ in drawn}
    caption = captions(measure)
    missing = [caption[name] for name, _ in PLOTS[1:] if f"{prefix}{name}" not in names]
    if not missing:
        return []
    return [
        f"{' and '.join(missing)}: left out, the runs give a single point (one configuration, one "
        f"waiting time); its {cumulative_words(measure)}, FLOPs and parameters are in the table."
    ]


def _fmt(value: object, spec: str) -> str:
    return "" if value is None else format(value, spec)


def chunks_cell(run: Run) -> str:
    """The chunks a run processed of its stream's B (``5 of 10``); the count alone for an event
    stream, whose chunks are cut from events and have no B, or a live stream gone past B."""
    done, total = processed(run), stream_length(run)
    return f"{done} of {total}" if total is not None and done <= total else str(done)


TABLE_HEADER = [
    "run",
    "chunks",
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


#: The columns of the paper's measures, where the columns of another measure go instead (or after them,
#: in a table that also has runs of the paper's measures).
_PAPER_MEASURE_COLUMNS = slice(TABLE_HEADER.index("CER"), TABLE_HEADER.index("avg test ppl") + 1)


def _has_paper_measure(runs: list[Run]) -> bool:
    return any(run_measure(run) in PAPER_COLUMNS for run in runs)


def _with_measures(paper_measure: bool, paper: list[str], others: list[str]) -> list[str]:
    """A row of :data:`TABLE_HEADER`'s cells (``paper``) with the cells of the runs' other measures,
    without the paper's measures' where no run has one (``paper_measure`` False)."""
    at = _PAPER_MEASURE_COLUMNS
    kept = paper[at] if paper_measure else []
    return [*paper[: at.start], *kept, *others, *paper[at.stop :]]


def table_header(runs: list[Run]) -> list[str]:
    """:data:`TABLE_HEADER` (a paper's run's), with the columns of the runs' other measures instead of
    or after the paper's measures' (report_measures.py)."""
    return _with_measures(_has_paper_measure(runs), TABLE_HEADER, [header for header, _ in measure_columns(runs)])


def table_rows(runs: list[Run]) -> list[list[str]]:
    """One row of :func:`table_header` cells per run (of :data:`TABLE_HEADER` for the paper's runs)."""
    extra, paper_measure = measure_columns(runs), _has_paper_measure(runs)
    rows = []
    for run in runs:
        c, s = run.config, run.summary
        paper = [
            run.name,
            chunks_cell(run),
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
        rows.append(_with_measures(paper_measure, paper, [cell(run) for _, cell in extra]))
    return rows


def markdown_table(runs: list[Run]) -> str:
    header = table_header(runs)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
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
    drawn = draw_plots(runs, out)
    # A stream's freshness is a report's concern, not a study's of the paper's finite streams.
    if plot_model_age(runs, out / AGE_PLOT[0], in_time=any(run.arrival_times for run in runs)):
        drawn.append(AGE_PLOT)
    names = {name for name, _ in drawn}
    for name, _ in (
        *PLOTS,
        REPLAY_PLOT,
        DETAILS_PLOT,
        RELIABILITY_PLOT,
        AGE_PLOT,
    ):  # a figure an earlier report of this folder drew, now untrue
        if name not in names:
            (out / name).unlink(missing_ok=True)
    judged = policy_section(runs, out)
    policy_plots = [figure for section in judged for figure in section.figures]
    for path in stale_figures(out, policy_plots):
        path.unlink()
    notes = [*measure_notes(runs), *left_out(drawn, measure=folder_measure(runs))]
    title = f"ALMA report: {Path(root).resolve().name}"
    body = [f"# {title}", "", markdown_table(runs), *(f"{note}\n" for note in notes)]
    body += [f"![{caption}]({name})\n" for name, caption in drawn]
    body += [line for section in judged for line in section.markdown()]
    body += [f"![{caption}]({name})\n" for name, caption in policy_plots]
    drawn += policy_plots
    (out / "report.md").write_text("\n".join(body))
    if not html:
        return out / "report.md"
    images = [(caption, (out / name).read_bytes()) for name, caption in drawn]
    tables = [(s.title, s.header, s.rows, [PICK_BY_SERVED, *s.verdicts]) for s in judged]
    (out / "report.html").write_text(
        html_page(title, table_header(runs), table_rows(runs), images, notes, tables=tables)
    )
    return out / "report.html"
