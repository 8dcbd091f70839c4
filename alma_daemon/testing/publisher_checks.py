"""The publisher contract as named checks (:func:`yield_publisher_checks`); :func:`check_publisher` runs
them all. tests/test_publisher_contract.py runs each as its own test on every serving backend: the
local pointer, TorchServe and KServe (each against its real server).

A backend comes as a :class:`Backend`: ``make(**serving)`` builds its publisher over a fresh model
store (``serving`` overrides keys of the ``serving`` section: ``promotion_margin``,
``keep_versions``), and ``served(publisher, x)`` asks the version its clients get by default about
examples ``x``, as a client would, and returns the probabilities. The checks publish a trained
classifier (``good``) and a far worse one (``bad``), with ``sample`` saved as their validation sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import Learner
from alma_daemon.testing.checks import Check, ContractError, answers_alike, expect, run_checks
from serving.publishing.publisher import Publisher, PublishError

#: Examples each check asks the served version about.
ASKED = 4
#: Served answers go through JSON and a server's float32: equal to in-process ones within this.
SERVED_TOLERANCE = 1e-5


@dataclass(frozen=True)
class Backend:
    """A serving backend as the contract drives it (module docstring)."""

    name: str
    make: Callable[..., Publisher]
    served: Callable[[Publisher, torch.Tensor], torch.Tensor]


def _save(publisher: Publisher, version: int, learner: Learner, sample: LabeledData) -> None:
    measure = learner.measure
    metrics = {f"val_{measure}": learner.evaluate(sample)[measure], "kind": "finetune"}
    publisher.store.save(learner, version, metrics, validation=sample)


def yield_publisher_checks(backend: Backend, good: Learner, bad: Learner, sample: LabeledData) -> Iterator[Check]:
    """The contract's checks for ``backend``, each on a publisher of its own."""
    x = sample.x[:ASKED]

    def serves(publisher: Publisher, learner: Learner, what: str) -> None:
        answered = backend.served(publisher, x)
        expect(
            answers_alike(answered, learner.predict_proba(x), atol=SERVED_TOLERANCE),
            f"{backend.name}: clients are not answered by {what}",
        )

    def first_version_is_promoted_unguarded_and_served() -> None:
        publisher = backend.make()
        _save(publisher, 1, bad, sample)
        outcome = publisher.publish(1)
        expect(outcome.action == "promoted", f"{backend.name}: the first version was {outcome.action}, not promoted")
        expect(
            publisher.live_version() == 1, f"{backend.name}: live version {publisher.live_version()} after the first"
        )
        serves(publisher, bad, "the first version")

    def a_worse_version_is_refused_and_never_served() -> None:
        publisher = backend.make(promotion_margin=0.05)
        _save(publisher, 1, good, sample)
        _save(publisher, 2, bad, sample)
        publisher.publish(1)
        outcome = publisher.publish(2)
        expect(outcome.action == "refused", f"{backend.name}: a far worse version was {outcome.action}")
        expect(publisher.live_version() == 1, f"{backend.name}: a refused version became live")
        served = publisher.served_versions()
        expect(served is None or 2 not in served, f"{backend.name}: a refused version is loaded ({served})")
        serves(publisher, good, "the live version after a refusal")

    def a_decided_version_is_skipped() -> None:
        publisher = backend.make()
        _save(publisher, 1, good, sample)
        publisher.publish(1)
        outcome = publisher.publish(1)
        expect(outcome.action == "skipped", f"{backend.name}: a version published twice was {outcome.action}")

    def a_better_version_replaces_the_live_one() -> None:
        publisher = backend.make()
        _save(publisher, 1, bad, sample)
        _save(publisher, 2, good, sample)
        publisher.publish(1)
        outcome = publisher.publish(2)
        expect(outcome.action == "promoted", f"{backend.name}: a better version was {outcome.action}")
        expect(outcome.promoted_at is not None, f"{backend.name}: a promotion without its time")
        serves(publisher, good, "the promoted version")

    def rollback_serves_the_earlier_version() -> None:
        publisher = backend.make(promotion_margin=1.0)
        _save(publisher, 1, good, sample)
        _save(publisher, 2, bad, sample)
        publisher.publish(1)
        publisher.publish(2)
        replaced = publisher.rollback(1)
        expect(replaced == 2, f"{backend.name}: rollback says it replaced {replaced}, not 2")
        expect(publisher.live_version() == 1, f"{backend.name}: live version {publisher.live_version()} after rollback")
        serves(publisher, good, "the version rolled back to")

    def versions_beyond_keep_versions_are_released() -> None:
        publisher = backend.make(promotion_margin=1.0, keep_versions=0)
        for version in (1, 2, 3):
            _save(publisher, version, good if version % 2 else bad, sample)
            publisher.publish(version)
        served = publisher.served_versions()
        expect(served is None or served == [3], f"{backend.name}: keep_versions 0 leaves {served} loaded, not [3]")
        serves(publisher, good, "the newest version")

    def a_version_not_on_disk_is_a_clear_error() -> None:
        publisher = backend.make()
        _save(publisher, 1, good, sample)
        publisher.publish(1)
        try:
            publisher.rollback(9)
        except (ValueError, PublishError) as err:
            expect("9" in str(err), f"{backend.name}: the error does not name the version: {err}")
        else:
            raise ContractError(f"{backend.name}: a rollback to a version not on disk did not fail")
        expect(publisher.live_version() == 1, f"{backend.name}: a failed rollback changed the live version")

    for check in (
        first_version_is_promoted_unguarded_and_served,
        a_worse_version_is_refused_and_never_served,
        a_decided_version_is_skipped,
        a_better_version_replaces_the_live_one,
        rollback_serves_the_earlier_version,
        versions_beyond_keep_versions_are_released,
        a_version_not_on_disk_is_a_clear_error,
    ):
        yield Check(check.__name__, check)


def check_publisher(backend: Backend, good: Learner, bad: Learner, sample: LabeledData) -> None:
    """Run every check of the publisher contract on ``backend``; the first that fails raises."""
    run_checks(yield_publisher_checks(backend, good, bad, sample))
