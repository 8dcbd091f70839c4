"""What users of an endless stream saw: the prequential measure over a stream's later part, and the
longest time between models.

On a finite stream the CER (the summed test measure) rewards leaving the stream's tail untrained: its
test set is the stream's end, and a stage near the end costs FLOPs whose benefit the sum barely sees.
On a stream that never ends, a policy is judged instead by the measure each chunk met when it arrived
(its prequential measure, taken before training on it), averaged over the second half of the stream,
so that the start, where every policy trains often, does not decide. ``alma report`` and
``benchmarks/bench_long_stream.py`` read their verdicts from here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

#: The share of a stream, from its end, whose prequential measure judges a policy.
JUDGED_SHARE = 0.5


def served_measure(rows: Sequence[Mapping[str, Any]], measure: str, share: float = JUDGED_SHARE) -> float | None:
    """The mean prequential ``measure`` over the last ``share`` of the steps ``rows`` (results rows),
    its non-finite values left out; None when none is finite."""
    return judged_mean([row.get(f"prequential_{measure}") for row in rows], share)


def served_reference(rows: Sequence[Mapping[str, Any]], measure: str, share: float = JUDGED_SHARE) -> float | None:
    """:func:`served_measure` of the reference learner that ran beside the network (``reference.kind``):
    its prequential ``measure`` on the same chunks; None where the rows recorded none."""
    return judged_mean([row.get(f"reference_{measure}") for row in rows], share)


def judged_mean(values: Sequence[float | None], share: float = JUDGED_SHARE) -> float | None:
    """The mean of the last ``share`` of ``values`` (one a step, in order), its missing and non-finite
    values left out; None when none is finite. :func:`served_measure` of values already read."""
    finite = [float(v) for v in judged_steps(values, share) if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def judged_steps(steps: Sequence[T], share: float = JUDGED_SHARE) -> Sequence[T]:
    """The last ``share`` of ``steps`` (one a step, in order): the served window that judges a stream, its
    middle step in it on an odd count (the served reliability of ``alma report`` sums its rows' bins)."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], not {share}")
    return steps[len(steps) - math.ceil(share * len(steps)) :] if steps else []


def longest_wait(rows: Sequence[Mapping[str, Any]]) -> int:
    """The most chunks that arrived in a row without a stage."""
    return longest_untrained([bool(row.get("trained")) for row in rows], [row.get("model_age_chunks") for row in rows])


def longest_untrained(trained: Sequence[bool], ages: Sequence[int | None] = ()) -> int:
    """:func:`longest_wait` of the steps' ``trained`` flags and model ages, in order. The ages, where
    every step recorded one, count a stage trained between chunks (which has no step of its own) as
    ending a wait; rows written before ages were recorded fall back on the flags."""
    if ages and all(age is not None for age in ages):
        return max(age for age in ages if age is not None)
    longest = current = 0
    for step_trained in trained:
        current = 0 if step_trained else current + 1
        longest = max(longest, current)
    return longest
