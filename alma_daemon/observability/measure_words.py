"""How summaries, reports and ``alma status`` name the task's measure (``task.measure``) and show its values.

One place for the words, so ``alma simulate``'s summary, the report's axes and table, and ``alma
status`` say the same thing: ``recall (higher is better)``, ``cumulative recall``, ``baseline
(majority class)``. The paper's error rate keeps its own words: its cumulative measure is the CER.
"""

from __future__ import annotations

import math
from typing import Any

from alma_daemon.config.measure_traits import measure_traits

#: The measure of a results file or row that names none (written before measures existed).
PAPER_MEASURE = "error"
#: What the input-blind model of :meth:`alma_daemon.measures.Measure.baseline` predicts, where it is
#: not the majority class.
_BASELINE_MODELS = {"mse": "mean target", "mae": "median target"}


def higher_is_better(measure: str) -> bool:
    traits = measure_traits().get(measure)
    return bool(traits and traits.higher_is_better)


def direction(measure: str) -> str:
    return "higher is better" if higher_is_better(measure) else "lower is better"


def named(measure: str) -> str:
    """``recall (higher is better)``: an axis label."""
    return f"{measure} ({direction(measure)})"


def shown(measure: str, value: float | None) -> str:
    """``value`` as a table or a status line shows it: a rate to 4 decimals, anything else to 4
    significant digits; empty for None."""
    if value is None:
        return ""
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    traits = measure_traits().get(measure)
    return f"{value:.4f}" if traits is None or traits.rate else f"{value:.4g}"


def baseline_model(measure: str) -> str:
    """``majority class``: the input-blind model the baseline measures."""
    return _BASELINE_MODELS.get(measure, "majority class")


def baseline_words(measure: str) -> str:
    """``baseline (majority class)``."""
    return f"baseline ({baseline_model(measure)})"


def cumulative_words(measure: str) -> str:
    """The sum of the test measure over chunks: the CER of the error rate."""
    return "CER" if measure == PAPER_MEASURE else f"cumulative {measure}"


def cumulative_key(measure: str) -> str:
    """The summary key of :func:`cumulative_words` (``cer`` for the error rate, as ever)."""
    return "cer" if measure == PAPER_MEASURE else f"cumulative_{measure}"


def loss_words(measure: str) -> str:
    """The cumulative measure on the lower-is-better scale runs are compared on: the CER, a cumulative
    cost or MSE, or the summed complement of a recall (``cumulative (1 - recall)``)."""
    return f"cumulative (1 - {measure})" if higher_is_better(measure) else cumulative_words(measure)


def served_words(measure: str) -> str:
    """``served error``: the mean prequential measure over a stream's second half, what its users saw
    (observability/served_measure.py)."""
    return f"served {measure}"


def served_loss_words(measure: str) -> str:
    """:func:`served_words` on the lower-is-better scale policies are compared on: ``served (1 - recall)``."""
    return f"served (1 - {measure})" if higher_is_better(measure) else served_words(measure)


#: Measures whose summary lines are the paper's (the CER; a language model's perplexities), as ever.
_PAPER_ROWS = {
    "error": [("CER", "cer", "{:.4f}"), ("final test error", "final_test_error", "{:.4f}")],
    "perplexity": [
        ("average test perplexity", "average_test_perplexity", "{:.2f}"),
        ("final test perplexity", "final_test_perplexity", "{:.2f}"),
    ],
}


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, object, str]]:
    """The lines of a run's summary (``alma simulate``) about its measure, as (name, value, format):
    the paper's for the error rate and a perplexity, the measure's by name for another; the baseline and
    the other measures (the test set's, else the last chunk's) where recorded; what users saw (the served
    measure, the reference learner's where one ran, and the longest wait between stages). A value None is
    not shown."""
    m = summary.get("measure", PAPER_MEASURE)
    fmt = "{:.4f}" if measure_traits()[m].rate else "{:.4g}"
    rows: list[tuple[str, object, str]]
    if m in _PAPER_ROWS:
        rows = [(name, summary.get(key), shape) for paper in _PAPER_ROWS.values() for name, key, shape in paper]
    else:
        cumulative = summary.get(f"cumulative_{m}")
        rows = [
            ("measure", named(m), "{}"),
            (cumulative_words(m), cumulative, fmt),
            (f"final test {m}", summary.get(f"final_test_{m}"), fmt),
            # Without a test set, the running sum of the chunks' measures is all there is.
            (
                f"cumulative prequential {m}",
                summary.get(f"cumulative_prequential_{m}") if cumulative is None else None,
                fmt,
            ),
        ]
    # A team's task, binary or judged by its own measure: the paper's tasks record neither.
    rows.append((baseline_words(m), summary.get(f"baseline_{m}"), fmt))
    details = summary.get("final_test_measures") or summary.get("final_prequential_measures") or {}
    on = "final test" if summary.get("final_test_measures") else "last chunk's"
    rows += [(f"{on} {name}", value, "{:.4f}") for name, value in details.items()]
    # What an endless stream's users saw: the measure of its later chunks, and the longest stretch without a new model.
    rows += [
        (f"{served_words(m)} (prequential, 2nd half)", summary.get(f"served_{m}"), fmt),
        # The reference learner's on the same chunks (reference.kind): a network no better is behind a linear model.
        (f"{served_words(m)}, reference (linear)", summary.get(f"served_reference_{m}"), fmt),
        ("longest wait (chunks)", summary.get("longest_wait_chunks"), "{}"),
    ]
    return rows
