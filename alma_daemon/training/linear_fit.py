"""A linear model fit to its optimum, as a textbook logistic or linear regression is (``train.linear_candidate``).

A stage's epochs of the network's optimizer leave a linear model of a chunk's few thousand examples far from
its optimum, where a team's reference (scikit-learn's ``LogisticRegression``) reaches it with L-BFGS on the
whole set. So does this: full-batch L-BFGS on the task's loss (its class weights included) with scikit-learn's
default L2 penalty (C = 1: half the squared weights over the examples), until the gradient is flat or
:data:`MAX_ITERATIONS` iterations (torch's L-BFGS allows 1.25 evaluations an iteration). The problem is convex:
there is no epoch to choose, and no early stopping.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from alma_daemon.data.tensors import LabeledData
from alma_daemon.training.compile import Objective
from alma_daemon.training.flops import count_flops
from alma_daemon.training.loop import FitReport

#: L-BFGS iterations at most (scikit-learn's ``max_iter`` is 100).
MAX_ITERATIONS = 200


def fit_linear(net: nn.Module, train: LabeledData, objective: Objective, device: torch.device) -> FitReport:
    """Fit ``net`` (a linear layer after fixed preprocessing) to the minimum of ``objective`` on ``train``
    plus the L2 penalty; its FLOPs are one evaluation's, counted, times the evaluations made."""
    if len(train) == 0:
        return FitReport()
    start = time.perf_counter()
    x, y = train.x.to(device), train.y.to(device)
    weights = [p for p in net.parameters() if p.dim() > 1]
    optimizer = torch.optim.LBFGS(
        net.parameters(), lr=1.0, max_iter=MAX_ITERATIONS, tolerance_grad=1e-6, line_search_fn="strong_wolfe"
    )
    evaluations = 0

    def closure() -> torch.Tensor:
        nonlocal evaluations
        evaluations += 1
        optimizer.zero_grad()
        penalty = sum((w.pow(2).sum() for w in weights), torch.zeros((), device=device)) / (2 * len(train))
        loss = objective(net, x, y) + penalty
        loss.backward()
        return loss

    net.train()
    _, flops = count_flops(closure)
    optimizer.step(closure)
    net.eval()
    return FitReport(
        flops=flops * evaluations,
        seconds=time.perf_counter() - start,
        steps=evaluations,
        epochs=evaluations,
        best_epoch=evaluations,
    )
