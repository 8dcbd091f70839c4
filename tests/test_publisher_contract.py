"""The shipped publisher contract (``alma_daemon.testing.yield_publisher_checks``), run on every serving
backend: the local pointer here, TorchServe and KServe against their real servers
(tests/test_publisher_contract_servers.py). A new backend gets this battery by adding its
:class:`~alma_daemon.testing.Backend`; its own behaviour goes in its own test file.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest
import torch

from alma_daemon.config import build_config
from alma_daemon.core.checkpoints import CheckpointStore, load_checkpoint
from alma_daemon.testing import Backend, ContractError, yield_publisher_checks
from serving.publishing import make_publisher
from serving.publishing.local import LocalPublisher
from serving.publishing.publisher import Publisher, guard_settings
from tests.helpers.serving import CHECKS


def local_backend(root: Path, publisher_class: type[LocalPublisher] = LocalPublisher) -> Backend:
    stores = itertools.count()

    def make(**serving) -> Publisher:
        config = build_config(
            {"daemon": {"checkpoint_dir": str(root / f"store{next(stores)}")}, "serving": {"kind": "local", **serving}}
        )
        if publisher_class is LocalPublisher:  # the product's own factory
            publisher = make_publisher(config)
            assert isinstance(publisher, LocalPublisher)
            return publisher
        store = CheckpointStore(config.daemon.checkpoint_dir, config.serving.model_name)
        return publisher_class(store, config.serving.promotion_margin, **guard_settings(config.serving))

    def served(publisher: Publisher, x: torch.Tensor) -> torch.Tensor:
        # What a process serving the local pointer does: load the version it names.
        live = publisher.live_version()
        assert live is not None
        return load_checkpoint(publisher.store.path(live)).predict_proba(x)

    return Backend("local", make, served)


def test_the_battery_is_the_named_checks(tmp_path, good_and_bad):
    names = [check.name for check in yield_publisher_checks(local_backend(tmp_path), *good_and_bad)]
    assert names == CHECKS


@pytest.mark.parametrize("name", CHECKS)
def test_local_publisher_contract(tmp_path, good_and_bad, name):
    (check,) = [c for c in yield_publisher_checks(local_backend(tmp_path), *good_and_bad) if c.name == name]
    check()


class Unguarded(LocalPublisher):
    def guard(self, candidate, live):
        return dataclasses.replace(super().guard(candidate, live), action="promoted")


class HoldsEveryVersion(LocalPublisher):
    def served_versions(self):
        return self.store.versions()


class ForgetsRollbacks(LocalPublisher):
    def rollback(self, version):
        return self.live_version()


#: (a publisher that breaks the contract, the check that must catch it): every check can fail.
BREAKAGES = [
    (Unguarded, "a_worse_version_is_refused_and_never_served"),
    (HoldsEveryVersion, "versions_beyond_keep_versions_are_released"),
    (ForgetsRollbacks, "rollback_serves_the_earlier_version"),
]


@pytest.mark.parametrize("broken,name", BREAKAGES, ids=[b[1] for b in BREAKAGES])
def test_a_check_fails_on_a_publisher_that_breaks_it(tmp_path, good_and_bad, broken, name):
    (check,) = [c for c in yield_publisher_checks(local_backend(tmp_path, broken), *good_and_bad) if c.name == name]
    with pytest.raises(ContractError):
        check()


def test_a_backend_that_serves_another_version_fails_the_contract(tmp_path, good_and_bad):
    backend = local_backend(tmp_path)
    first_only = Backend("first-only", backend.make, lambda p, x: load_checkpoint(p.store.path(1)).predict_proba(x))
    (check,) = [
        c
        for c in yield_publisher_checks(first_only, *good_and_bad)
        if c.name == "a_better_version_replaces_the_live_one"
    ]
    with pytest.raises(ContractError, match="not answered by the promoted version"):
        check()
