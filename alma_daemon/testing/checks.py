"""A contract as named checks: what the learner and policy batteries yield, and what a failed one raises."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch


class ContractError(AssertionError):
    """A learner, a team's model or a policy breaks its contract; the message says which, and why."""


def expect(condition: bool, what: str) -> None:
    """Raise :class:`ContractError` saying ``what`` unless ``condition`` holds."""
    if not condition:
        raise ContractError(what)


def answers_alike(first: torch.Tensor, second: torch.Tensor, atol: float = 1e-6) -> bool:
    """Two models' answers equal but for float rounding: within ``atol`` of a probability, and within
    1e-5 relative of a regression's number, whose rounding grows with the target's units."""
    return first.shape == second.shape and torch.allclose(first, second, rtol=1e-5, atol=atol)


@dataclass(frozen=True)
class Check:
    """One check of a contract, named (``probabilities_sum_to_one``); calling it runs it and raises
    :class:`ContractError` naming what failed."""

    name: str
    run: Callable[[], None]
    #: True where the check trains a learner again from scratch: seconds on an image backbone, so the
    #: project's fast test tier leaves it out.
    slow: bool = False

    def __call__(self) -> None:
        self.run()


def run_checks(checks: Iterable[Check]) -> None:
    """Run every check, in order; the first that fails raises."""
    for check in checks:
        check()
