"""Shared fixtures: tiny deterministic datasets, and real-server fixtures (the plugin tests/helpers/servers.py).

Helpers shared by several test modules live in ``tests/helpers/``; import them from there.
"""

from __future__ import annotations

import pytest

from alma_daemon.data.datasets import MNIST_TASK, TaskInfo
from alma_daemon.data.tensors import LabeledData
from tests.helpers.configs import learner_settings  # noqa: F401 (tests/test_config.py imports it from here)
from tests.helpers.data import separable_data
from tests.helpers.serving import good_and_bad  # noqa: F401 (a module-scoped fixture of the publishers' tests)

pytest_plugins = ["tests.helpers.servers"]


@pytest.fixture
def mnist_like() -> tuple[TaskInfo, LabeledData, LabeledData]:
    return MNIST_TASK, separable_data(MNIST_TASK, 600, seed=1), separable_data(MNIST_TASK, 200, seed=2)
