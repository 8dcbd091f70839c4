"""A binary task's decision: calibrated probabilities, and the threshold that turns them into a class.

A network trained with class weights (``task.class_weights: [1, 50]``) answers probabilities skewed
towards the weighted class, and the most probable class is the right answer only where a miss and a
false alarm cost alike. After every stage the engine fits a calibration on the pooled validation set
(:func:`fit_calibration`: Platt's scaling of the positive class's log-odds, the pool weighted back to
the stream's class mix) and chooses the threshold the task's decision asks for
(:func:`choose_threshold`, ``task.decision``):

- ``cost``: the expected cost's minimum, ``c_fp / (c_fp + c_fn)`` on calibrated probabilities;
- ``precision`` / ``recall``: the threshold at which the pool's precision (the lowest such) or recall
  (the highest such) meets ``task.decision_target``;
- ``threshold``: ``task.decision_target`` as it is.

Both go into the task (``TaskInfo.calibration``, ``TaskInfo.threshold``), so the version's spec, its
served answers and the engine's measures read the same decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: Decisions that read a threshold (``task.decision``); "" (argmax) reads none.
THRESHOLD_DECISIONS = ("cost", "precision", "recall", "threshold")
#: Positives and negatives a calibration is fitted on at least; with fewer, the class weights' prior
#: correction stands in (:func:`prior_calibration`).
MIN_CALIBRATION_EXAMPLES = 10
#: Log-odds are clipped here: a probability of exactly 0 or 1 has none.
_LOGIT_LIMIT = 30.0


@dataclass(frozen=True)
class ThresholdChoice:
    """The threshold chosen and, for a precision or recall target, whether the pool met it."""

    threshold: float
    met: bool = True
    #: The rate reached on the pool at that threshold (precision or recall target).
    reached: float | None = None


def log_odds(p: torch.Tensor) -> torch.Tensor:
    """The log-odds of probabilities, clipped to a finite range."""
    p = p.double()
    return (p.log() - (-p).log1p()).clamp(-_LOGIT_LIMIT, _LOGIT_LIMIT)


def calibrated(outputs: torch.Tensor, calibration: tuple[float, float], positive: int) -> torch.Tensor:
    """Binary probabilities (N x 2) with the positive class's log-odds mapped by ``(slope, intercept)``."""
    slope, intercept = calibration
    p = torch.sigmoid(slope * log_odds(outputs[:, positive]) + intercept).to(outputs.dtype)
    return torch.stack([1 - p, p] if positive == 1 else [p, 1 - p], dim=1)


def prior_calibration(class_weights: tuple[float, ...], positive: int) -> tuple[float, float]:
    """The calibration that undoes class weights' shift of the odds: a network trained with the positive
    class weighted w+ and the other w- answers odds w+ / w- times the true ones."""
    if not class_weights:
        return (1.0, 0.0)
    w_pos, w_neg = class_weights[positive], class_weights[1 - positive]
    return (1.0, -math.log(w_pos / w_neg)) if w_pos > 0 and w_neg > 0 else (1.0, 0.0)


def fit_calibration(
    outputs: torch.Tensor, positives: torch.Tensor, weights: torch.Tensor, positive: int, prior: tuple[float, float]
) -> tuple[float, float] | None:
    """Platt's scaling: the (slope, intercept) of a logistic regression of ``positives`` on the positive
    class's log-odds, each example weighted (the pool's mix back to the stream's), by Newton's method from
    ``prior``, with a weak pull towards it. Platt's smoothed targets ((n+ + 1) / (n+ + 2) for a positive,
    1 / (n- + 2) for a negative) keep the fit finite where the network separates the pool's few positives
    perfectly: with 0/1 targets the slope ran to thousands and served only 0 and 1. None where the pool
    holds fewer than :data:`MIN_CALIBRATION_EXAMPLES` of either class."""
    positives = positives.bool()
    if int(positives.sum()) < MIN_CALIBRATION_EXAMPLES or int((~positives).sum()) < MIN_CALIBRATION_EXAMPLES:
        return None
    z = log_odds(outputs[:, positive])
    features = torch.stack([z, torch.ones_like(z)], dim=1)
    w = weights.double() * len(weights) / float(weights.sum())
    n_pos, n_neg = float(w[positives].sum()), float(w[~positives].sum())
    target = torch.where(positives, (n_pos + 1) / (n_pos + 2), 1 / (n_neg + 2)).double()
    anchor = torch.tensor(prior, dtype=torch.float64)
    theta = anchor.clone()
    ridge = 1.0
    for _ in range(50):
        p = torch.sigmoid(features @ theta)
        gradient = features.T @ (w * (p - target)) + ridge * (theta - anchor)
        hessian = (features * (w * p * (1 - p)).unsqueeze(1)).T @ features + ridge * torch.eye(2, dtype=torch.float64)
        step = torch.linalg.solve(hessian, gradient)
        theta = theta - step
        if float(step.abs().max()) < 1e-9:
            break
    slope, intercept = (float(v) for v in theta)
    return (slope, intercept) if math.isfinite(slope) and math.isfinite(intercept) else None


def choose_threshold(
    decision: str,
    target: float | None,
    probabilities: torch.Tensor,
    positives: torch.Tensor,
    weights: torch.Tensor,
    false_negative_cost: float,
    false_positive_cost: float,
) -> ThresholdChoice:
    """The threshold on the positive class's (calibrated) ``probabilities`` that ``decision`` asks for."""
    if decision == "cost":
        return ThresholdChoice(false_positive_cost / (false_positive_cost + false_negative_cost))
    if decision == "threshold":
        assert target is not None  # the config requires it
        return ThresholdChoice(target)
    assert target is not None and decision in ("precision", "recall")
    order = probabilities.double().argsort(descending=True)
    p, is_pos, w = probabilities.double()[order], positives.bool()[order], weights.double()[order]
    true_pos = torch.cumsum(w * is_pos, 0)
    flagged = torch.cumsum(w, 0)
    total_pos = float(true_pos[-1]) if len(p) else 0.0
    if total_pos <= 0:
        return ThresholdChoice(0.5, met=False)
    # A threshold sits at an example's probability; examples of equal probability are flagged together.
    last_of_tie = torch.ones(len(p), dtype=torch.bool)
    last_of_tie[:-1] = p[1:] != p[:-1]
    precision, recall = true_pos / flagged, true_pos / total_pos
    candidates = last_of_tie.nonzero().flatten()
    if decision == "recall":
        # The highest threshold whose recall meets the target: the fewest alarms that catch that share.
        meeting = candidates[recall[candidates] >= target - 1e-12]
        i = int(meeting[0]) if len(meeting) else int(candidates[-1])
        return ThresholdChoice(float(p[i]), met=bool(len(meeting)), reached=float(recall[i]))
    # The lowest threshold whose precision meets the target: the most positives found at that precision.
    meeting = candidates[precision[candidates] >= target - 1e-12]
    i = int(meeting[-1]) if len(meeting) else int(candidates[int(precision[candidates].argmax())])
    return ThresholdChoice(float(p[i]), met=bool(len(meeting)), reached=float(precision[i]))


#: The bins of the reliability the engine records per step (:func:`reliability`), as edges over [0, 1]:
#: the tenths, with 1-2-5 steps towards 0 and 1 where a rare class's probabilities crowd (a 2 %-positive
#: task serves most examples below 0.05, and its cost threshold sits there too). A report merges them back
#: into tenths where the probabilities spread (observability/report_reliability.py).
RELIABILITY_EDGES = (
    (0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05)
    + tuple(round(0.1 * i, 1) for i in range(1, 10))
    + (0.95, 0.98, 0.99, 0.995, 0.998, 0.999, 1.0)
)


def reliability(
    probabilities: torch.Tensor, positives: torch.Tensor, bins: int = 10, *, edges: tuple[float, ...] | None = None
) -> list[list[float]]:
    """Per bin of the positive class's probability (``bins`` of equal widths over [0, 1], or those between
    ``edges``, from 0 to 1): [examples, sum of the probabilities, positives], what a reliability figure
    sums over chunks. A bin holds its lower edge (the last one 1 too); a non-finite probability (a
    diverged model's) is in none."""
    p = probabilities.double()
    finite = p.isfinite()
    p, hits_of = p[finite].clamp(0, 1), positives[finite].double()
    if edges is None:
        index = (p * bins).long().clamp(max=bins - 1)
    else:
        bins = len(edges) - 1
        inner = torch.tensor(edges[1:-1], dtype=torch.float64)
        index = torch.bucketize(p, inner, right=True)
    count = torch.bincount(index, minlength=bins).double()
    total = torch.bincount(index, weights=p, minlength=bins)
    hits = torch.bincount(index, weights=hits_of, minlength=bins)
    return [[float(c), float(t), float(h)] for c, t, h in zip(count, total, hits, strict=True)]
