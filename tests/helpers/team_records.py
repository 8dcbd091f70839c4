"""Step records of a team's tasks (a binary task judged by recall, a regression judged by MSE), made up
rather than trained: the observability tests check how they are shown, not what a model learns."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from alma_daemon import metrics
from alma_daemon.core.records import StepRecord
from alma_daemon.observability.exporter import MetricsObserver


def team_record(
    t: int = 1,
    *,
    measure: str = "recall",
    test: float | None = 0.7,
    prequential: float = 0.6,
    cumulative: float | None = 0.7,
    baseline: float | None = 0.0,
    test_measures: dict[str, float] | None = None,
    prequential_measures: dict[str, float] | None = None,
    **changes,
) -> StepRecord:
    """The record of chunk ``t`` of a binary fraud task (recall of the positive class, the majority
    class as baseline), its details those of :meth:`alma_daemon.measures.Measure.details`."""
    fields: dict[str, Any] = dict(
        t=t,
        chunk=t,
        examples_seen=1000 * t,
        decision="train",
        reason="1 chunk(s) pending >= wait 1",
        measure=measure,
        test=test,
        prequential=prequential,
        cumulative_prequential=prequential * t,
        cumulative=cumulative,
        test_measures={"error": 0.02, "precision": 0.5, "pr_auc": 0.45} if test_measures is None else test_measures,
        prequential_measures=(
            {"error": 0.03, "precision": 0.4, "pr_auc": 0.35} if prequential_measures is None else prequential_measures
        ),
        baseline=baseline,
        train_flops=100,
        cumulative_train_flops=100 * t,
        parameters=10,
        cumulative_parameters=10 * t,
        inference_flops_per_example=20.0,
        train_seconds=0.1,
        cumulative_train_seconds=0.1 * t,
        model_version=t,
        wall_seconds=0.2 * t,
    )
    return StepRecord(**(fields | changes))


def fraud_rows(chunks: int = 4, *, lift: float = 0.0, with_test: bool = True) -> list[dict]:
    """The rows of a fraud task judged by recall over ``chunks`` chunks: the recall climbs (``lift``
    above 0.2 per chunk), the majority class (never flags fraud) has recall 0; ``with_test`` False: a
    stream without a test set."""
    rows, cumulative = [], 0.0
    for t in range(1, chunks + 1):
        recall = min(1.0, 0.2 * t + lift)
        cumulative += recall
        details = {"error": 0.05 / t, "precision": 0.3 + 0.1 * t, "pr_auc": 0.25 + 0.1 * t}
        rows.append(
            team_record(
                t,
                test=recall if with_test else None,
                prequential=recall - 0.05,
                cumulative=cumulative if with_test else None,
                test_measures=details if with_test else {},
                prequential_measures={k: v * 0.9 for k, v in details.items()},
            ).as_row()
        )
    return rows


def forget_measures() -> None:
    """The metric families of the task's measure as a fresh process has them: no series yet."""
    for gauge in (
        metrics.TASK_MEASURE,
        metrics.CUMULATIVE_MEASURE,
        metrics.BASELINE_MEASURE,
        metrics.MEASURE_DETAIL,
        metrics.PREQUENTIAL_WINDOW_MEASURE,
        metrics.REFERENCE_PREQUENTIAL_MEASURE,
        metrics.REFERENCE_PREQUENTIAL_WINDOW_MEASURE,
    ):
        gauge.clear()


@contextlib.contextmanager
def metrics_of_a_team() -> Iterator[None]:
    """The registry as a team's stream leaves it: the families of the task's measure have series from a
    stream's first chunk on, a binary task's every one (its baseline, its other measures, the mean of
    its last chunks)."""
    MetricsObserver.show(team_record(prequential_window=0.6, model_age_chunks=0, model_age_seconds=0.0))
    try:
        yield
    finally:
        forget_measures()
