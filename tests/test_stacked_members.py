"""Ensemble members trained as one stacked model get what each gets trained alone, bit for bit."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from alma_daemon.config import TrainConfig
from alma_daemon.data.datasets import CIFAR10_TASK, MNIST_TASK
from alma_daemon.models.backbones import build_backbone
from alma_daemon.models.stacked import StackedMLP, stackable
from alma_daemon.training import compile as compile_module
from alma_daemon.training.loop import Trainer
from alma_daemon.training.losses import task_loss
from alma_daemon.training.members import fit_stacked, stacked_fitter
from tests.helpers.data import separable_data

#: Patience 0 over 8 epochs on noisy labels: members stop early at different epochs.
CONFIG = TrainConfig(epochs=8, patience=0, batch_size=32)
#: The paper's loss: unweighted cross-entropy, early stopping on the validation error.
LOSS = task_loss(MNIST_TASK)


def noisy_data(n: int, seed: int):
    data = separable_data(MNIST_TASK, n, seed)
    g = torch.Generator().manual_seed(seed + 100)
    flip = torch.rand(n, generator=g) < 0.3
    y = torch.where(flip, torch.randint(0, MNIST_TASK.num_classes, (n,), generator=g), data.y)
    return dataclasses.replace(data, y=y)


def members(count: int, width: int = 16) -> list[torch.nn.Module]:
    torch.manual_seed(7)
    return [build_backbone(MNIST_TASK, width) for _ in range(count)]


@pytest.mark.parametrize("optimizer", ["adadelta", "sgd", "adam"])
def test_stacked_members_get_the_weights_and_reports_of_training_each_alone(optimizer) -> None:
    train, val = noisy_data(200, seed=1), noisy_data(60, seed=2)
    stacked, alone = members(4), members(4)
    trainer = Trainer(CONFIG, optimizer, torch.device("cpu"), seed=3)
    # Members 5, 2, 9, 0: indices, not positions, pick each member's shuffling.
    indices = [5, 2, 9, 0]
    reports = fit_stacked(trainer, list(zip(indices, stacked)), train, val, LOSS)
    for index, net, twin in zip(indices, stacked, alone):
        expected = trainer.fit(twin, train, val, purpose=("member", index))
        got = reports[index]
        assert (got.flops, got.steps, got.epochs, got.best_epoch, got.val_error) == (
            expected.flops,
            expected.steps,
            expected.epochs,
            expected.best_epoch,
            expected.val_error,
        ), index
        for key, value in net.state_dict().items():
            assert_same_weights(value, twin.state_dict()[key], (index, key))
    assert len({r.epochs for r in reports.values()}) > 1, "no member stopped early: the test would not see it"


def assert_same_weights(a: torch.Tensor, b: torch.Tensor, what: object) -> None:
    """Equal up to float32 rounding: on AMD EPYC the batched and the single matmul kernels agree bit
    for bit, on some Intel Xeons they round differently in the last place (the same reports, epochs
    and validation errors, weights up to 6e-8 apart, seen here)."""
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}: {m}")


def test_a_member_gets_the_same_result_whatever_else_is_stacked_with_it() -> None:
    """What makes members on 2 torchrun ranks (2 + 1 stacked) equal to one process (3 stacked)."""
    train, val = noisy_data(200, seed=1), noisy_data(60, seed=2)
    trainer = Trainer(CONFIG, "adadelta", torch.device("cpu"), seed=3)
    three = members(3)
    fit_stacked(trainer, list(enumerate(three)), train, val, LOSS)
    one = members(3)[1:2]
    fit_stacked(trainer, [(1, one[0])], train, val, LOSS)
    for a, b in zip(three[1].parameters(), one[0].parameters()):
        assert_same_weights(a, b, "member 1")


def test_the_stacked_model_computes_each_members_forward() -> None:
    nets = members(3, width=8)
    x = separable_data(MNIST_TASK, 10, seed=0).x
    standardized = nets[0].normalize.standardize(x)
    with torch.inference_mode():
        out = StackedMLP(nets)(standardized.expand(3, *standardized.shape))
        for i, net in enumerate(nets):
            assert torch.equal(out[i], net(x))


def test_only_mlp_backbones_of_one_shape_are_stacked_and_augmented_tasks_train_alone() -> None:
    assert stackable(members(2))
    assert not stackable(members(1, width=8) + members(1, width=16))
    assert not stackable([build_backbone(CIFAR10_TASK, 4)])
    assert not stackable([])
    data = noisy_data(40, seed=1)
    augmenting = Trainer(CONFIG, "sgd", torch.device("cpu"), seed=0, augment=True)
    assert stacked_fitter(augmenting, data, data, LOSS)(list(enumerate(members(2)))) is None
    # One stacked optimizer steps every stacked weight, so a member with a frozen parameter trains alone.
    partly_frozen = members(2)
    next(partly_frozen[1].parameters()).requires_grad_(False)
    plain = Trainer(CONFIG, "sgd", torch.device("cpu"), seed=0)
    assert stacked_fitter(plain, data, data, LOSS)(list(enumerate(partly_frozen))) is None
    assert stacked_fitter(plain, data, data, LOSS)(list(enumerate(members(2)))) is not None


def test_stacked_fit_leaves_each_member_with_storage_of_its_own() -> None:
    """Checkpoints save members' tensors one by one (safetensors refuses tensors that share storage)."""
    nets = members(2, width=8)
    data = noisy_data(64, seed=1)
    fit_stacked(
        Trainer(dataclasses.replace(CONFIG, epochs=1), "adadelta", torch.device("cpu"), seed=0),
        list(enumerate(nets)),
        data,
        data,
        LOSS,
    )
    pointers = {p.untyped_storage().data_ptr() for net in nets for p in net.parameters()}
    assert len(pointers) == sum(1 for net in nets for _ in net.parameters())


def test_under_train_compile_stacked_members_train_eager_and_say_so(monkeypatch, caplog) -> None:
    monkeypatch.setattr(compile_module, "_said", set())  # each reason is said once per process
    train, val = noisy_data(200, seed=1), noisy_data(60, seed=2)
    nets = {flag: members(3) for flag in (False, True)}
    for flag, stacked in nets.items():
        trainer = Trainer(dataclasses.replace(CONFIG, compile=flag), "adadelta", torch.device("cpu"), seed=3)
        fit_stacked(trainer, list(enumerate(stacked)), train, val, LOSS)
    for eager, compiled in zip(nets[False], nets[True]):
        assert all(torch.equal(a, b) for a, b in zip(eager.state_dict().values(), compiled.state_dict().values()))
    assert any(getattr(r, "reason", "") == "ensemble members train stacked, which runs eager" for r in caplog.records)
