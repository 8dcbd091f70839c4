"""Shared fixtures: tiny deterministic datasets, and real-server fixtures (the plugin tests/helpers/servers.py).

Helpers shared by several test modules live in ``tests/helpers/``; import them from there.
"""

from __future__ import annotations

from collections import Counter

import pytest

from alma_daemon.data.datasets import MNIST_TASK, TaskInfo
from alma_daemon.data.tensors import LabeledData
from tests.helpers.configs import learner_settings  # noqa: F401 (tests/test_config.py imports it from here)
from tests.helpers.data import separable_data
from tests.helpers.serving import good_and_bad  # noqa: F401 (a module-scoped fixture of the publishers' tests)

pytest_plugins = ["tests.helpers.servers"]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files with the most slow or integration tests first, each file's tests in their own order.

    pytest's addopts hand out whole files to the two workers (``--dist loadfile``) in this order
    (``--no-loadscope-reorder``; xdist would otherwise sort files by their number of tests, which
    leaves the files of a few long tests, a study or a torchrun, for last on one worker while the
    other waits): the longest work starts first and the short files even out the end.
    """

    def file_of(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    weight = Counter(
        file_of(item) for item in items if item.get_closest_marker("slow") or item.get_closest_marker("integration")
    )
    position: dict[str, int] = {}
    for index, item in enumerate(items):
        position.setdefault(file_of(item), index)
    items.sort(key=lambda item: (-weight[file_of(item)], position[file_of(item)]))


@pytest.fixture
def mnist_like() -> tuple[TaskInfo, LabeledData, LabeledData]:
    return MNIST_TASK, separable_data(MNIST_TASK, 600, seed=1), separable_data(MNIST_TASK, 200, seed=2)
