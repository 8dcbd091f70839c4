"""Growth steps of gEns, gMoE and Firefly (paper section 4.2) and their size caps; the shared contract covers the rest."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from alma_daemon.config import ConfigError, TrainConfig
from alma_daemon.data.datasets import MNIST_TASK
from alma_daemon.learners import build_learner, learner_from_spec
from alma_daemon.learners.firefly import Candidate, apply, propose, select, trace
from alma_daemon.learners.gmoe import routed_forward
from alma_daemon.learners.growing import AT_SIZE_CAP
from alma_daemon.models.firefly_net import parameter_count
from alma_daemon.training.loop import Trainer
from tests.helpers.configs import learner_settings
from tests.helpers.contract import CIFAR_LIKE, token_data
from tests.helpers.data import separable_data
from tests.helpers.switch_lm import tiny_learner
from tests.helpers.switch_lm import trainer as lm_trainer

TASKS = {"mlp": MNIST_TASK, "vgg": CIFAR_LIKE}


def make(name: str, task_name: str = "mlp", n: int = 128, **overrides):
    task = TASKS[task_name]
    learner = build_learner(name, task, learner_settings(name, {"width": 8}, overrides), seed=0)
    return learner, separable_data(task, n, seed=1), separable_data(task, n // 2, seed=2)


def trainer(task_name: str = "mlp", stage: int = 1) -> Trainer:
    config = TrainConfig(epochs=2, patience=1, batch_size=32)
    return Trainer(config, "adadelta" if task_name == "mlp" else "sgd", torch.device("cpu"), seed=stage)


def stage(learner, train, val, number: int, task_name: str = "mlp") -> dict:
    """One engine stage: grow (as the engine asks at every stage), then train."""
    t = trainer(task_name, number)
    torch.manual_seed(number)
    growth = learner.grow(val, t)
    learner.architecture_changed()
    learner.fit(train, val, t)
    return growth


def loss(learner, data) -> float:
    learner.model.eval()
    with torch.no_grad():
        return float(F.cross_entropy(learner.model(data.x), data.y))


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def assert_rebuilt_exactly(learner, data) -> None:
    rebuilt = learner_from_spec(json.loads(json.dumps(learner.spec())))
    rebuilt.load_state_dict(learner.state_dict())
    assert rebuilt.num_parameters() == learner.num_parameters()
    torch.testing.assert_close(rebuilt.predict_proba(data.x), learner.predict_proba(data.x), rtol=0, atol=0)


# -- gEns -------------------------------------------------------------------------------------------
def test_gens_trains_only_the_new_members():
    learner, train, val = make("gens", grow_members=2)
    assert stage(learner, train, val, 1).details["added"] == 0  # nothing trained yet to freeze
    first = snapshot(learner.model[0])
    growth = stage(learner, train, val, 2)
    assert growth.details["added"] == 2 and len(learner.model) == 3
    for key, value in learner.model[0].state_dict().items():
        assert torch.equal(value, first[key]), key
    initialized = learner_from_spec(learner.spec()).model[1]  # a new member as it was before training
    assert not torch.equal(initialized.layers[0][1].weight, learner.model[1].layers[0][1].weight)


@pytest.mark.slow
def test_gens_retrained_from_scratch_trains_every_member_again():
    """train.from_scratch re-draws every member, the frozen ones too: the next stage must train them all."""
    learner, train, val = make("gens")
    stage(learner, train, val, 1)
    stage(learner, train, val, 2)
    assert learner.arch["frozen"] == 1
    learner.reinitialize(1234)
    redrawn = [snapshot(member) for member in learner.model]
    growth = stage(learner, train, val, 3)
    assert growth.details["added"] == 0  # nothing trained since the re-draw: no growth
    for member, before in zip(learner.model, redrawn):
        assert any(not torch.equal(v, before[k]) for k, v in member.state_dict().items())


@pytest.mark.slow
def test_members_grown_after_a_restore_are_those_grown_without_it():
    """A checkpoint keeps the seed later members draw from, which a retraining from scratch changed."""
    learner, train, val = make("gens")
    stage(learner, train, val, 1)
    learner.reinitialize(1234)
    stage(learner, train, val, 2)
    restored = learner_from_spec(json.loads(json.dumps(learner.spec())))
    restored.load_state_dict(learner.state_dict())
    stage(learner, train, val, 3)
    stage(restored, train, val, 3)
    assert learner.arch["members"] == restored.arch["members"] == 2
    for key, value in learner.model[1].state_dict().items():
        assert torch.equal(value, restored.model[1].state_dict()[key]), key


def test_gens_inference_cost_grows_with_the_members():
    learner, train, val = make("gens")
    stage(learner, train, val, 1)
    one = learner.inference_flops_per_example()
    stage(learner, train, val, 2)
    stage(learner, train, val, 3)
    assert learner.arch["members"] == 3
    assert learner.inference_flops_per_example() == pytest.approx(3 * one, rel=0.01)


# -- gMoE -------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("task_name,gating", [("mlp", "soft"), ("mlp", "hard"), ("vgg", "soft")])
def test_gmoe_split_keeps_the_function(task_name, gating):
    learner, train, val = make("gmoe", task_name, n=64, gating=gating, width=4 if task_name == "vgg" else 8)
    stage(learner, train, val, 1, task_name)
    stage(learner, train, val, 2, task_name)  # a first split, so the second one splits a gated leaf
    before_loss, before = loss(learner, train), learner.predict_proba(train.x)
    growth = learner.grow(val, trainer(task_name, 3))
    assert [len(m.experts) for m in learner.mixtures()] == [3, 3]
    assert growth.details["experts"] == [3, 3]
    assert loss(learner, train) == pytest.approx(before_loss, rel=1e-5)
    torch.testing.assert_close(learner.predict_proba(train.x), before, rtol=0, atol=1e-5)
    assert_rebuilt_exactly(learner, val)


def test_gmoe_splits_the_expert_with_the_largest_validation_loss_not_the_most_used():
    learner, train, val = make("gmoe")
    stage(learner, train, val, 1)
    stage(learner, train, val, 2)
    mixture = learner.mixtures()[0]
    assert len(mixture.experts) == 2
    with torch.no_grad():
        # The gate sends class-0 examples (bright first region) to expert 1, all others to expert 0...
        gate = mixture.gates[0][1]
        gate.weight.zero_()
        gate.weight[1, : 784 // 10] = 1.0
        gate.bias.copy_(torch.tensor([60.0, 0.0]))
        # ...where they are mislabeled, and expert 1 makes the model very sure of its (wrong) answer.
        mixture.experts[1][1].weight.mul_(100.0)
    val = type(val)(val.x, torch.where(val.y == 0, 1, val.y))
    learner.model.eval()
    with torch.no_grad():
        logits, weights = routed_forward(learner.model, val.x)
    usage = weights[0].sum(0)
    cumulative = weights[0].T @ F.cross_entropy(logits, val.y, reduction="none")
    assert usage.argmax() == 0 and cumulative.argmax() == 1, "the case must tell the two rules apart"
    growth = learner.grow(val, trainer(stage=3))
    assert growth.details["split"][0]["losing_expert"] == 1
    torch.testing.assert_close(mixture.experts[2].state_dict(), mixture.experts[1].state_dict())


def test_hard_gates_sample_from_the_trainers_generator_not_the_global_rng():
    """The daemon's publisher thread reseeds the global RNG whenever it builds a model."""
    import copy

    learner, train, val = make("gmoe", gating="hard")
    stage(learner, train, val, 1)
    stage(learner, train, val, 2)  # grown: a gate now samples
    twin = copy.deepcopy(learner)
    for net, global_seed in ((learner, 1), (twin, 2)):
        torch.manual_seed(global_seed)
        net.fit(train, val, trainer(stage=3))
    for key, value in learner.model.state_dict().items():
        assert torch.equal(value, twin.model.state_dict()[key]), key


def test_gmoe_does_not_grow_before_training():
    learner, train, val = make("gmoe")
    assert stage(learner, train, val, 1).details["split"] == []
    assert learner.num_parameters() == build_learner("sm", MNIST_TASK, learner.config, 0).num_parameters()


# -- Firefly ----------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("task_name", ["mlp", "vgg"])
def test_firefly_step_barely_changes_the_loss_and_adds_the_configured_parameters(task_name):
    small = {"mlp": {"n": 64, "width": 8}, "vgg": {"n": 32, "width": 4}}[task_name]
    learner, train, val = make("firefly", task_name, growth_rate=0.5, **small)
    initial = learner.num_parameters()
    stage(learner, train, val, 1, task_name)
    before = loss(learner, train)
    growth = learner.grow(val, trainer(task_name, 2))
    added = learner.num_parameters() - initial
    assert added == growth.details["parameters_added"]
    assert parameter_count(learner.task, learner.arch) == learner.num_parameters()
    assert 0.9 * 0.5 * initial <= added <= 0.5 * initial
    assert abs(loss(learner, train) - before) <= 0.05 * before + 1e-3
    assert_rebuilt_exactly(learner, val)


def test_firefly_width_and_depth_growth_rebuilds_from_spec():
    learner, train, val = make("firefly", n=64)
    stage(learner, train, val, 1)
    net = learner.model
    traces, _ = trace(net, val.x, val.y, learner.training_loss)
    directions, candidates = propose(net, traces, budget=1000, g=torch.Generator().manual_seed(0))
    pick = {(c.kind, c.layer): c for c in candidates}
    chosen = [pick["split", 0], pick["new", 0], pick["new", 1], pick["layer", 1]]
    before = loss(learner, train)
    apply(net, chosen, directions, val.x)
    learner.arch = {**net.architecture(), "trained": True}
    assert learner.arch["widths"] == [10, 9, 9]
    assert abs(loss(learner, train) - before) <= 0.05 * before + 1e-3
    assert_rebuilt_exactly(learner, val)


def test_firefly_inserts_a_layer_only_when_it_beats_the_width_it_would_displace():
    width = [Candidate("new", 1, i, gain=1.0) for i in range(10)]

    def count(added, inserted_after):  # units cost 10 parameters, a new layer 30: as much as 3 units
        return 10 * sum(added.values()) + (30 if inserted_after is not None else 0)

    worth_it = Candidate("layer", 0, 0, gain=3.5)
    not_worth_it = Candidate("layer", 0, 0, gain=2.5)
    assert select(width + [worth_it], 100, count) == [worth_it, *width[:7]]
    assert select(width + [not_worth_it], 100, count) == width


# -- size caps --------------------------------------------------------------------------------------
def sizes(learner) -> tuple[int, float]:
    return learner.num_parameters(), learner.inference_flops_per_example()


def test_gens_grows_to_its_cap_and_no_further():
    learner, train, val = make("gens", grow_members=2, max_members=4)
    stage(learner, train, val, 1)
    assert stage(learner, train, val, 2).details["added"] == 2
    assert not learner.at_size_cap
    assert stage(learner, train, val, 3).details["added"] == 1  # one of the k = 2 fits
    assert learner.at_size_cap and learner.arch["members"] == 4
    capped = sizes(learner)
    growth = stage(learner, train, val, 4)
    assert growth.details["added"] == 0 and growth.skipped == f"{AT_SIZE_CAP} (learner.max_members: 4)"
    assert growth.as_row()["reason"] == growth.skipped  # what the stage's record shows
    assert sizes(learner) == capped
    assert learner.members_to_train() == range(3, 4)  # the stage fine-tunes the newest member
    rebuilt = learner_from_spec(json.loads(json.dumps(learner.spec())))
    assert rebuilt.config.max_members == 4 and rebuilt.at_size_cap


def test_gmoe_grows_to_its_cap_per_mixture_layer_and_no_further():
    learner, train, val = make("gmoe", max_experts=3)
    for number in (1, 2, 3):
        stage(learner, train, val, number)
    assert [len(m.experts) for m in learner.mixtures()] == [3, 3] and learner.at_size_cap
    capped = sizes(learner)
    growth = stage(learner, train, val, 4)
    assert not growth.grew and growth.skipped.startswith(AT_SIZE_CAP) and growth.flops is None
    assert sizes(learner) == capped


def test_firefly_spends_only_the_room_its_cap_leaves():
    learner, train, val = make("firefly", n=64, growth_rate=0.5)
    initial = learner.num_parameters()
    cap = initial + initial // 10  # a fifth of the step growth_rate asks for
    learner, train, val = make("firefly", n=64, growth_rate=0.5, max_parameters=cap)
    stage(learner, train, val, 1)
    growth = stage(learner, train, val, 2)
    assert growth.details["budget"] == cap - initial
    assert initial < learner.num_parameters() <= cap
    for number in range(3, 6):  # each step adds a unit at least (its best new unit gains), until none fits
        if learner.at_size_cap:
            break
        before = learner.num_parameters()
        stage(learner, train, val, number)
        assert before < learner.num_parameters() <= cap
    assert learner.at_size_cap and cap - learner.num_parameters() < learner.smallest_growth()
    capped = sizes(learner)
    assert stage(learner, train, val, 6).skipped == f"{AT_SIZE_CAP} (learner.max_parameters: {cap})"
    assert sizes(learner) == capped


def test_switch_lm_gmoe_copies_only_the_experts_that_fit_under_its_cap():
    learner = tiny_learner("switch-lm-gmoe", grow_experts=2, max_experts=4)  # starts at 3 experts per block
    train, val = token_data(64, seed=1), token_data(16, seed=2)
    learner.fit(train, val, lm_trainer())
    growth = learner.grow(val, lm_trainer(stage=2))
    assert [len(c) for c in growth.details["copied"]] == [1, 1] and growth.details["experts"] == [4, 4]
    assert learner.at_size_cap
    learner.architecture_changed()
    capped = sizes(learner)
    assert learner.grow(val, lm_trainer(stage=3)).skipped == f"{AT_SIZE_CAP} (learner.max_experts: 4)"
    assert sizes(learner) == capped


def test_without_a_cap_growing_learners_are_never_at_it():
    learner, train, val = make("gens")
    for number in (1, 2, 3):
        stage(learner, train, val, number)
    assert learner.arch["members"] == 3 and not learner.at_size_cap
    assert not build_learner("sm", MNIST_TASK, learner_settings("sm", {"width": 8}), seed=0).at_size_cap


@pytest.mark.parametrize(
    "name,keys,message",
    [
        ("gens", {"max_members": 1}, "learner.max_members: 1 is not above the 1 member"),
        ("gmoe", {"max_experts": 0}, "learner.max_experts: 0 is not above the 1 expert"),
        ("switch-lm-gens", {"max_members": -2}, "learner.max_members: -2 is not above the 1 member"),
        ("switch-lm-gmoe", {"experts": 4, "max_experts": 4}, "learner.max_experts: 4 is not above the 4 experts"),
        ("firefly", {"max_parameters": 0}, "learner.max_parameters: must be > 0"),
        ("gens", {"max_members": 2.5}, "learner.max_members: must be an integer"),
    ],
)
def test_a_cap_that_leaves_no_room_to_grow_is_refused_naming_the_key(name, keys, message):
    with pytest.raises(ConfigError, match=f"^{message}") as refused:
        learner_settings(name, {}, keys)
    assert "\n" not in str(refused.value)


def test_a_firefly_cap_at_its_initial_parameters_is_refused_when_built():
    initial = make("firefly")[0].num_parameters()
    with pytest.raises(ConfigError, match=f"^learner.max_parameters: {initial} is not above the {initial} parameters"):
        make("firefly", max_parameters=initial)
