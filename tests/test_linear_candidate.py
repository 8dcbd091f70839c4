"""``train.linear_candidate``: each stage also trains the learner's linear form (a logistic regression of the
inputs) on the same examples and keeps it where it validates better; while it is kept, the network from fresh
weights is the candidate (alma_daemon/core/engine.py)."""

from __future__ import annotations

import pytest
import torch

from alma_daemon.config import ConfigError, build_config
from alma_daemon.learners import build_learner, learner_from_spec
from alma_daemon.research.simulate import run_simulation
from tests.helpers.configs import sea_stream_config
from tests.helpers.contract import FEATURES

pytest.importorskip("river")


def stream_config(linear: bool, learner: dict | None = None, **train):
    return sea_stream_config({"linear_candidate": linear, **train}, learner)


@pytest.fixture(scope="module")
def runs() -> tuple[list[dict], list[dict]]:
    with_candidate = run_simulation(stream_config(True), progress=False)["series"]
    without = run_simulation(stream_config(False), progress=False)["series"]
    return with_candidate, without


def test_every_stage_pays_for_its_candidate_from_the_first_on(runs) -> None:
    with_candidate, without = runs
    # Stage 1 starts from the same untrained network in both runs: with a candidate it trains twice.
    assert with_candidate[0]["train_flops"] > without[0]["train_flops"]
    assert {row["kind"] for row in with_candidate if row["trained"]} <= {"finetune", "linear", "scratch"}


def test_on_a_linear_rule_a_linear_model_is_kept_and_the_network_stays_a_candidate(runs) -> None:
    with_candidate, without = runs
    kinds = [row["kind"] for row in with_candidate]
    assert "linear" in kinds, kinds  # SEA's concept is a threshold on a sum of two features
    kept = kinds.index("linear")
    # The linear model kept has two parameters per class and a bias, not the network's thousands.
    assert with_candidate[kept]["parameters"] < without[kept]["parameters"] / 100
    # It is kept for what it validates, and what it serves is measured on the next chunk.
    assert with_candidate[kept + 1]["prequential_error"] != without[kept + 1]["prequential_error"]


def test_before_a_linear_model_is_kept_the_network_served_is_the_one_a_run_without_candidate_trains() -> None:
    # Where the network validates better, the linear candidate's training leaves no trace on it.
    with_candidate = run_simulation(stream_config(True, epochs=4), progress=False)["series"]
    without = run_simulation(stream_config(False, epochs=4), progress=False)["series"]
    kinds = [row["kind"] for row in with_candidate]
    kept = kinds.index("linear") if "linear" in kinds else len(kinds)
    for row, plain in zip(with_candidate[:kept], without[:kept], strict=True):
        assert row["test_error"] == plain["test_error"]


def test_a_linear_version_is_rebuilt_from_its_spec_as_every_server_rebuilds_it() -> None:
    config = build_config({"learner": {"name": "sm", "width": 8}}).learner
    learner = build_learner("sm", FEATURES, config, seed=0)
    learner.rebuild(learner.linear_architecture, seed=5)
    assert learner.is_linear and learner.num_parameters() == FEATURES.input_shape[0] + 1
    rebuilt = learner_from_spec(learner.spec())
    rebuilt.load_state_dict(learner.state_dict())
    x = torch.randn(4, *FEATURES.input_shape)
    assert rebuilt.is_linear and torch.equal(rebuilt.model(x), learner.model(x))


def test_a_learner_without_a_linear_form_is_refused_at_start_up() -> None:
    config = stream_config(True, learner={"name": "ens", "members": 2, "width": 8})
    with pytest.raises(ConfigError, match=r"^train.linear_candidate: learner 'ens' has no linear form"):
        run_simulation(config, progress=False)


def test_a_linear_candidate_under_from_scratch_stages_is_refused_at_start_up() -> None:
    with pytest.raises(
        ConfigError, match=r"^train.linear_candidate: a stage of train.from_scratch trains no candidate"
    ):
        run_simulation(stream_config(True, from_scratch=True), progress=False)
