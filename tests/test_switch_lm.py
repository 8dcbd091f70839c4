"""Switch layer, Switch LM learners (SM, Ens, gEns, gMoE) and the loop's step-budget mode."""

from __future__ import annotations

import json
import math

import pytest
import torch

from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import learner_from_spec
from alma_daemon.learners.switch_lm_gmoe import expert_losses
from alma_daemon.models.switch import SwitchFFN, balance_loss
from alma_daemon.training.optim import LinearWarmupDecay
from tests.helpers.contract import token_data
from tests.helpers.switch_lm import tiny_learner, trainer


def random_router_layer(experts: int = 4, capacity_factor: float = 1.0) -> SwitchFFN:
    torch.manual_seed(0)
    layer = SwitchFFN(8, 16, experts, capacity_factor, dropout=0.0)
    torch.nn.init.normal_(layer.router.weight, std=1.0)  # peaked, uneven routing
    return layer


# -- the Switch layer ---------------------------------------------------------------------------------
def test_capacity_drops_tokens_beyond_it_in_training_and_none_at_evaluation():
    layer = random_router_layer()
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.bias.copy_(torch.tensor([5.0, 0.0, 0.0, 0.0]))  # every token prefers expert 0
    x = torch.randn(2, 8, 8)  # 16 tokens, 4 experts: capacity 4
    out, _, route = layer.train()(x)
    assert route.tolist() == [0] * 4 + [-1] * 12
    flat = out.reshape(16, 8)
    assert (flat[4:] == 0).all() and (flat[:4] != 0).any()  # dropped tokens only keep the residual
    _, _, route = layer.eval()(x)
    assert (route == 0).all()


@pytest.mark.parametrize("capacity_factor", [0.5, 1.0, 1.25])
def test_no_expert_exceeds_its_capacity(capacity_factor):
    layer = random_router_layer(capacity_factor=capacity_factor).train()
    _, _, route = layer(torch.randn(4, 16, 8))
    capacity = math.ceil(capacity_factor * 64 / 4)
    counts = torch.bincount(route[route >= 0], minlength=4)
    assert counts.max() <= capacity
    assert counts.max() == capacity  # the peaked router does fill an expert, so the limit was exercised


@pytest.mark.parametrize("capacity_factor", [0.5, 1.25])
@pytest.mark.parametrize("training", [True, False])
def test_slot_dispatch_computes_what_grouped_dispatch_does(capacity_factor, training):
    """The compiled step's dispatch (shapes fixed by the token count, padded slots) and the eager one agree."""
    layer = random_router_layer(capacity_factor=capacity_factor).train(training)
    x = torch.randn(64, 8)
    with torch.no_grad():
        gate, expert = layer.router(x).softmax(-1).max(-1)
        route = torch.where(layer.within_capacity(expert), expert, -1)
        assert bool((route < 0).any()) == training  # the peaked router overfills an expert: drops in training
        grouped = layer.dispatch_in_groups(x, route, gate)
        assert torch.allclose(layer.dispatch_in_slots(x, route, gate), grouped, atol=1e-6)
        assert (grouped[route < 0] == 0).all() and (grouped[route >= 0] != 0).any()


def test_balance_loss_is_one_for_uniform_routing_and_larger_when_skewed():
    experts, tokens = 4, 16
    choice = torch.arange(tokens) % experts
    probs = torch.full((tokens, experts), 0.1)
    probs[torch.arange(tokens), choice] = 0.7  # each expert gets 1/4 of tokens and 1/4 of the mass
    assert balance_loss(probs, choice).item() == pytest.approx(1.0)
    skewed = torch.full((tokens, experts), 0.1)
    skewed[:, 0] = 0.7
    assert balance_loss(skewed, torch.zeros(tokens, dtype=torch.long)).item() == pytest.approx(2.8)


def test_splitting_experts_leaves_the_layer_output_unchanged():
    layer = random_router_layer().eval()
    x = torch.randn(4, 16, 8)
    before, _, route_before = layer(x)
    probs = layer.router(x.reshape(-1, 8)).softmax(-1)
    top2 = probs.topk(2).values
    # Split experts holding tokens that halving their probability would re-route without gate_scale.
    chosen = route_before[top2[:, 0] / 2 < top2[:, 1]].unique()[:2].tolist()
    assert chosen
    layer.split_experts(chosen)
    after, _, route_after = layer(x)
    assert len(layer.experts) == layer.router.out_features == 4 + len(chosen)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-6)
    assert torch.equal(route_after, route_before)  # ties between original and copy go to the original
    split = layer.router(x.reshape(-1, 8)).softmax(-1)
    copies = list(range(4, 4 + len(chosen)))
    torch.testing.assert_close(split[:, chosen] + split[:, copies], probs[:, chosen])


# -- the learners -------------------------------------------------------------------------------------
def test_perplexity_of_a_uniform_model_is_the_vocabulary_size():
    learner = tiny_learner("switch-lm")
    with torch.no_grad():
        learner.model.wte.weight.zero_()  # tied output layer: every logit is 0
    assert learner.evaluate(token_data(8, seed=0))["perplexity"] == pytest.approx(50.0, rel=1e-5)


@pytest.mark.slow
def test_switch_lm_learns_the_pattern():
    learner = tiny_learner("switch-lm")
    train, val = token_data(256, seed=1), token_data(32, seed=2)
    before = learner.evaluate(val)["perplexity"]
    torch.manual_seed(0)
    report = learner.fit(train, val, trainer(steps=60))
    assert report.steps == 60 and report.epochs == 1
    assert learner.evaluate(val)["perplexity"] < before / 3
    assert report.val_error == pytest.approx(math.log(learner.evaluate(val)["perplexity"]), rel=1e-4)


def test_ensemble_averages_member_probabilities():
    learner = tiny_learner("switch-lm-ens", members=3)
    x = token_data(4, seed=0).x
    members = torch.stack([m(x).logits.softmax(-1) for m in learner.model.eval()])
    torch.testing.assert_close(learner.predict_proba(x), members.mean(0), rtol=0, atol=1e-6)


@pytest.mark.slow
def test_gens_starts_with_one_member_and_trains_only_new_ones():
    learner = tiny_learner("switch-lm-gens")
    train, val = token_data(64, seed=1), token_data(16, seed=2)
    assert learner.grow(val, trainer()).details["added"] == 0  # nothing to grow from before the first stage
    learner.fit(train, val, trainer())
    assert learner.grow(val, trainer(stage=2)).details == {"added": 1, "members": 2}
    first = {k: v.clone() for k, v in learner.model[0].state_dict().items()}
    report = learner.fit(train, val, trainer(stage=2))
    assert report.steps == 4  # one member's steps
    assert all(torch.equal(v, learner.model[0].state_dict()[k]) for k, v in first.items())
    assert learner.spec()["arch"] == {"members": 2, "frozen": 1, "trained": True}


@pytest.mark.parametrize(
    "saved,current",
    [
        # "trained" counted the trained members: all of them, or all but the newest.
        ({"members": 2, "trained": 2, "frozen": 1}, {"members": 2, "frozen": 1, "trained": True}),
        ({"members": 3, "trained": 1, "frozen": 1}, {"members": 3, "frozen": 1, "trained": False}),
        # Before "frozen" was kept, members grew one at a time: all but the newest were frozen.
        ({"members": 3, "trained": 3}, {"members": 3, "frozen": 2, "trained": True}),
        ({"members": 2, "trained": 0}, {"members": 2, "frozen": 1, "trained": False}),
    ],
)
def test_gens_loads_the_arch_that_older_checkpoints_saved(saved, current):
    spec = {**tiny_learner("switch-lm-gens").spec(), "arch": saved}
    restored = learner_from_spec(json.loads(json.dumps(spec)))
    assert restored.spec()["arch"] == current
    assert len(restored.model) == saved["members"]
    assert restored.members_to_train() == range(current["frozen"], saved["members"])
    val = token_data(16, seed=2)
    assert restored.grow(val, trainer()).details["added"] == (1 if current["trained"] else 0)


@pytest.mark.slow
def test_gens_stage_without_growth_fine_tunes_every_member_of_the_last_growth():
    learner = tiny_learner("switch-lm-gens", grow_members=2)
    train, val = token_data(64, seed=1), token_data(16, seed=2)
    learner.fit(train, val, trainer())
    learner.grow(val, trainer(stage=2))
    learner.fit(train, val, trainer(stage=2))
    first = {k: v.clone() for k, v in learner.model[0].state_dict().items()}
    report = learner.fit(train, val, trainer(stage=3))  # no growth: members 1 and 2 train on
    assert report.steps == 8
    assert all(torch.equal(v, learner.model[0].state_dict()[k]) for k, v in first.items())


@pytest.mark.slow
def test_gmoe_growth_copies_the_worst_experts_and_leaves_the_output_unchanged():
    learner = tiny_learner("switch-lm-gmoe", grow_experts=2)
    train, val = token_data(128, seed=1), token_data(32, seed=2)
    assert learner.grow(val, trainer()).details["copied"] == []  # not trained yet
    torch.manual_seed(0)
    learner.fit(train, val, trainer(steps=10))
    losses = expert_losses(learner.model, val, learner.device)
    before = learner.predict_proba(val.x)
    growth = learner.grow(val, trainer(stage=2))
    assert growth.details["experts"] == [5, 5]
    assert growth.details["copied"] == [loss.topk(2).indices.tolist() for loss in losses]
    torch.testing.assert_close(learner.predict_proba(val.x), before, rtol=0, atol=1e-5)


# -- the loop's step budget ---------------------------------------------------------------------------
def test_warmup_then_linear_decay():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = LinearWarmupDecay(optimizer, steps=5, warmup=2)
    rates = []
    for _ in range(5):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates == pytest.approx([0.5, 1.0, 1.0, 2 / 3, 1 / 3])


def test_step_budget_runs_exactly_that_many_full_batches():
    seen = []

    def objective(net, x, y):
        seen.append(len(x))
        return torch.nn.functional.cross_entropy(net(x), y)

    net = torch.nn.Linear(3, 2)
    data = LabeledData(torch.randn(40, 3), torch.randint(0, 2, (40,)))
    report = trainer(steps=7).fit(net, data, data, objective=objective, steps=7)
    assert report.steps == 7 and seen == [16] * 7  # 112 examples: three reshuffled passes, no short batch


@pytest.mark.slow
def test_dropout_masks_come_from_the_trainer_not_from_other_threads_building_models():
    """The daemon's publisher builds models (reseeding torch's global RNG) while the main thread trains."""
    import threading

    from alma_daemon.learners.base import seeded_build

    def train(with_builder: bool) -> dict:
        learner = tiny_learner("switch-lm", dropout=0.3)
        data = token_data(96, seed=1)
        stop = threading.Event()

        def build_models() -> None:
            while not stop.is_set():
                seeded_build(7, lambda: torch.nn.Linear(64, 64))

        builder = threading.Thread(target=build_models)
        if with_builder:
            builder.start()
        try:
            learner.fit(data, token_data(24, seed=2), trainer(steps=30))
        finally:
            stop.set()
            if with_builder:
                builder.join()
        return {k: v.clone() for k, v in learner.model.state_dict().items()}

    alone, beside_a_builder = train(False), train(True)
    assert all(torch.equal(alone[k], beside_a_builder[k]) for k in alone)
    repeated = train(False)
    assert all(torch.equal(alone[k], repeated[k]) for k in alone)
